"""Course mode: tokencredit.py's equations as exercises, and a grader that checks itself.

  python course.py handout DIR [--set grpo|dapo|cscr|all]  a student copy with the exercises blank
  python course.py grade [PATH] [-e K] [--gradescope FILE]   one line per exercise: tests, points
  python course.py list                                      each exercise's functions and tests
  python course.py selfcheck                                 the grader's own checks (CI runs it)

The sheet is docs/course.md. A blank keeps the function's signature, docstring and leading input
checks (`_check_*`); the rest of the body becomes raise NotImplementedError("exercise k: name").
The tests are test_tokencredit.py's, unchanged. An exercise's tests are computed, not listed by
hand: those that fail when only that exercise is blank. Where this file sits beside the complete
tokencredit.py (the repository), `grade PATH` grades each exercise with the reference for every
other function, so one mistake costs one exercise. In a handout there is no reference: the
student's own file runs whole, and a test that stops on another exercise's NotImplementedError is
reported as blocked by it.
"""

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = "test_tokencredit.py"
MAP_FILE = "course_map.json"  # written into a handout: its exercises and their tests

EXERCISES = {  # k: (title, the functions to write, points), in the README's order
    1: ("advantages", ("group_advantages", "overlong_penalty"), 10),
    2: ("dynamic sampling", ("informative_groups", "fill_batch"), 10),
    3: ("surrogate and clip", ("policy_gradient_surrogate", "importance_ratio",
                               "clipped_surrogate"), 10),
    4: ("KL", ("kl_k3",), 10),
    5: ("aggregation", ("loss_denominators", "token_weights", "aggregate", "policy_loss"), 10),
    6: ("GSPO", ("sequence_ratio",), 10),
    7: ("CSCR", ("counterfactual_shifts", "counterfactual_sensitivity", "cscr_weights",
                 "token_advantages"), 10),
    8: ("entropy mask", ("high_entropy_mask",), 10),
}
SETS = {"grpo": (1, 3, 5), "dapo": (1, 2, 3, 5), "cscr": (1, 3, 5, 7), "all": tuple(EXERCISES)}

MISTAKES = (  # plausible wrong answers that selfcheck plants: (exercise, what, right, wrong)
    (1, "sign flip", "centred = rewards - rewards.mean(dim=1, keepdim=True)",
     "centred = rewards.mean(dim=1, keepdim=True) - rewards"),
    (1, "population std", "rewards.std(dim=1, keepdim=True)",
     "rewards.std(dim=1, keepdim=True, correction=0)"),
    (1, "RLOO without G / (G - 1)", "centred = centred * (G / (G - 1))", "centred = centred"),
    (2, "keeps the surplus", "keep.nonzero().squeeze(1)[: batch_size - n_kept]",
     "keep.nonzero().squeeze(1)"),
    (3, "clip bounds swapped", "torch.clamp(ratio, 1 - eps_low, 1 + eps_high)",
     "torch.clamp(ratio, 1 - eps_high, 1 + eps_low)"),
    (4, "k1 instead of k3", "return torch.expm1(log_ratio) - log_ratio", "return -log_ratio"),
    (5, '"sample" without N', "return N * lengths.clamp(min=1)", "return lengths.clamp(min=1)"),
    (5, "KL subtracted", "per_token = per_token + beta * kl", "per_token = per_token - beta * kl"),
    (6, "GSPO sum, not mean", "log_s = log_ratio.sum(dim=-1, keepdim=True) / lengths",
     "log_s = log_ratio.sum(dim=-1, keepdim=True)"),
    (7, "CSCR without renormalisation", "weights = lengths * w / w.sum(dim=-1, keepdim=True)",
     "weights = torch.exp(-strength * torch.clamp(sensitivity.float() - threshold, min=0))"),
    (7, "sensitivity without abs", "torch.maximum(d_pos.abs(), d_neg.abs())",
     "torch.maximum(d_pos, d_neg)"),
    (8, "keeps the lowest entropies", "torch.quantile(real, 1 - top_fraction)",
     "torch.quantile(real, top_fraction)"),
)

HANDOUT = ("tokencredit.py", TESTS, "train_tiny.py", "tiny_task.py", "lab.py", "course.py",
           "requirements.txt", "LICENSE", "docs/course.md", "docs/lab.md", "docs/onestep.md",
           "docs/onestep.png", "docs/credit.png", "results")  # not the other solutions: below
HANDOUT_README = """# tokencredit: course handout ({set_name}: exercises {exercises})

The exercise sheet is docs/course.md. Write the functions of your exercises in tokencredit.py:
each keeps its signature, docstring and input checks, and raises NotImplementedError until you
write its body. The other functions are complete; read them, they use the same helpers.

    pip install -r requirements.txt
    python course.py grade           # one line per exercise: tests passed, points
    python course.py grade -e 1      # one exercise, with the failing tests
    python train_tiny.py --quick     # your equations train the tiny model (exercises 1, 3, 5)

At first every test of your exercises fails: that is the grader working. A test that stops on
another exercise you have not written yet is reported as "blocked by exercise k".

Left out of this copy, because they hold solutions: test_translation.py (the same functions
checked against verl's and TRL's formulas: your instructor may run it as a hidden set),
trl_tokencredit.py and its tests, bench.py (they call the complete functions), the project's
README and other docs (they quote the code), and the git history. MIT licence: LICENSE.
"""


# -----------------------------------------------------------------------------
# blanks and substitutions, by ast: tokencredit.py carries no markers

def functions(source: str) -> dict:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def is_check(statement) -> bool:
    """`_check_x(...)`, `y = _check_x(...)`, or an `if` that holds only checks: kept in a blank."""
    if isinstance(statement, ast.If):
        return not statement.orelse and all(is_check(s) for s in statement.body)
    value = getattr(statement, "value", None)
    return (isinstance(statement, (ast.Expr, ast.Assign)) and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name) and value.func.id.startswith("_check"))


def blank(source: str, exercises) -> str:
    """source with each exercise function's body, after its docstring and leading checks,
    replaced by raise NotImplementedError("exercise k: name")."""
    lines, defs, edits = source.splitlines(keepends=True), functions(source), []
    for k in exercises:
        for name in EXERCISES[k][1]:
            body = defs[name].body
            keep = int(isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant))
            while keep < len(body) - 1 and is_check(body[keep]):
                keep += 1
            indent = " " * body[keep].col_offset
            edits.append((body[keep - 1].end_lineno if keep else body[0].lineno - 1,
                          body[-1].end_lineno,
                          f'{indent}raise NotImplementedError("exercise {k}: {name}")\n'))
    for after, last, text in sorted(edits, reverse=True):
        lines[after:last] = [text]
    return "".join(lines)


def substitute(reference: str, student: str, names) -> str:
    """The reference with the functions `names` (and any names the reference lacks) taken from
    the student's file: one exercise graded on its own."""
    ref, stu = functions(reference), functions(student)
    missing = [name for name in names if name not in stu]
    if missing:
        raise ValueError(f"the student's file defines no {', '.join(missing)}")
    lines, stu_lines = reference.splitlines(keepends=True), student.splitlines(keepends=True)

    def span(node):
        return min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1, node.end_lineno

    for name in sorted(names, key=lambda n: ref[n].lineno, reverse=True):
        (a, b), (c, d) = span(ref[name]), span(stu[name])
        lines[a:b] = stu_lines[c:d]
    known = set(ref) | {target.id for node in ast.parse(reference).body
                        if isinstance(node, ast.Assign) for target in node.targets
                        if isinstance(target, ast.Name)}
    imports = {ast.dump(node) for node in ast.parse(reference).body
               if isinstance(node, (ast.Import, ast.ImportFrom))}
    extra = [ast.get_source_segment(student, node) for node in ast.parse(student).body
             if (isinstance(node, (ast.Import, ast.ImportFrom)) and ast.dump(node) not in imports)
             or (isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name not in known)]
    return "".join(lines) + "".join(f"\n\n{segment}\n" for segment in extra)


# -----------------------------------------------------------------------------
# running the tests

_results = {}  # source hash -> results: the same file is tested once


def run_tests(source: str) -> dict:
    """test_tokencredit.py against `source` as tokencredit.py, in a fresh folder and process.
    Returns {test name: None if it passed, else the failure's text}."""
    key = hashlib.sha256(source.encode()).hexdigest()
    if key not in _results:
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "tokencredit.py"), "w") as f:
                f.write(source)
            shutil.copy(os.path.join(HERE, TESTS), tmp)
            xml = os.path.join(tmp, "results.xml")
            try:
                done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                                       "no:cacheprovider", f"--junitxml={xml}", TESTS], cwd=tmp,
                                      capture_output=True, text=True, timeout=600)
            except subprocess.TimeoutExpired:
                raise SystemExit("the tests ran past 10 minutes: is a loop in your file endless?")
            cases = ET.parse(xml).getroot().iter("testcase") if os.path.exists(xml) else []
            results = {}
            for case in cases:
                bad = case.find("failure")
                bad = case.find("error") if bad is None else bad
                results[case.get("name")] = (None if bad is None else
                                             f"{bad.get('message', '')}\n\n{bad.text or ''}")
            if done.returncode not in (0, 1) or not results:  # 1: some failed; else broken
                raise SystemExit(f"the tests did not run against this tokencredit.py:\n"
                                 f"{done.stdout[-3000:]}{done.stderr[-2000:]}")
            _results[key] = results
    return _results[key]


def blocker(failure: str):
    """The exercise whose NotImplementedError stopped a test, if one did."""
    found = re.search(r"NotImplementedError: exercise (\d+):", failure or "")
    return int(found.group(1)) if found else None


def test_map(reference: str) -> dict:
    """{k: the tests that fail when only exercise k is blank}."""
    failing = [name for name, failure in run_tests(reference).items() if failure]
    if failing:
        raise SystemExit(f"the reference fails {len(failing)} tests: {failing[:5]}")
    return {k: sorted(name for name, failure in run_tests(blank(reference, [k])).items()
                      if failure) for k in EXERCISES}


# -----------------------------------------------------------------------------
# grading

def grade(student: str, mapping: dict, exercises, reference=None) -> list:
    """One row per exercise: (k, passed, total, points, max points, blocked by, failures).
    With a reference, exercise k runs as the reference with the student's exercise k."""
    rows = []
    for k in exercises:
        results = run_tests(substitute(reference, student, EXERCISES[k][1]) if reference
                            else student)
        tests = mapping[k]
        failed = {name: results[name] for name in tests if results.get(name, "missing")}
        blocked = sorted({blocker(f) for f in failed.values()} - {None, k})
        passed, points = len(tests) - len(failed), EXERCISES[k][2]
        rows.append((k, passed, len(tests), round(points * passed / len(tests), 1), points,
                     blocked, failed))
    return rows


def format_rows(rows, verbose: bool) -> str:
    lines = []
    for k, passed, total, points, max_points, blocked, failed in rows:
        own = any(blocker(f) == k for f in failed.values())
        waiting = sum(blocker(f) not in (None, k) for f in failed.values())
        note = "  not written yet" if own else ""
        if blocked:
            note += (";" if own else " ") + (f" {waiting} blocked by exercise "
                                             + ", ".join(map(str, blocked)))
        lines.append(f"exercise {k}  {EXERCISES[k][0]:<20} {passed:3d}/{total:<3d} tests "
                     f"{points:5.1f}/{max_points} points{note}")
        for name, failure in list(failed.items())[:12] if verbose else []:
            said = [ln.strip()[:110] for ln in failure.split("\n\n")[0].splitlines()
                    if ln.strip() and not ln.strip().startswith(("+", "[+"))]  # pytest's asides
            lines.append(f"    FAILED {name}: " + "\n        ".join(said[:3]))
    score, top = sum(r[3] for r in rows), sum(r[4] for r in rows)
    lines.append(f"total {score:.1f}/{top} points")
    if any(r[5] for r in rows):
        lines.append("A blocked test counts as failed until the exercise it waits for is written. "
                     "The instructor's\ngrade runs each exercise with the complete functions for "
                     "the rest, so nothing is blocked there.")
    return "\n".join(lines)


def gradescope(rows) -> dict:
    """Gradescope's results.json: one entry per exercise."""
    tests = [dict(name=f"exercise {k}: {EXERCISES[k][0]}", score=points, max_score=max_points,
                  visibility="visible",
                  output=f"{passed}/{total} tests passed" + "".join(f"\nFAILED {name}"
                                                                   for name in failed))
             for k, passed, total, points, max_points, _, failed in rows]
    return dict(score=round(sum(t["score"] for t in tests), 1), tests=tests)


def setting():
    """(reference source or None, mapping, exercises) for where this file sits."""
    reference = read(os.path.join(HERE, "tokencredit.py"))
    if os.path.exists(os.path.join(HERE, MAP_FILE)):  # a handout: no reference here
        with open(os.path.join(HERE, MAP_FILE)) as f:
            saved = json.load(f)
        return None, {int(k): v for k, v in saved["tests"].items()}, saved["exercises"]
    return reference, test_map(reference), list(EXERCISES)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


# -----------------------------------------------------------------------------
# the commands

def cmd_handout(out: str, set_name: str) -> None:
    if os.path.exists(out) and os.listdir(out):
        raise SystemExit(f"course.py: {out} exists and is not empty; name a new folder")
    reference, mapping, _ = setting()
    if reference is None:
        raise SystemExit("course.py: make a handout from the repository, not from a handout")
    exercises = SETS[set_name]
    for name in HANDOUT:
        source, target = os.path.join(HERE, name), os.path.join(out, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, target)
    with open(os.path.join(out, "tokencredit.py"), "w") as f:
        f.write(blank(reference, exercises))
    with open(os.path.join(out, MAP_FILE), "w") as f:
        json.dump(dict(set=set_name, exercises=list(exercises),
                       tests={k: mapping[k] for k in exercises}), f, indent=1)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(HANDOUT_README.format(set_name=set_name,
                                      exercises=", ".join(map(str, exercises))))
    print(f"wrote {out}: exercises {', '.join(map(str, exercises))} blank in tokencredit.py; "
          f"{sum(len(mapping[k]) for k in exercises)} graded tests")


def cmd_grade(path, only, gradescope_file, verbose) -> None:
    reference, mapping, exercises = setting()
    path = path or os.path.join(HERE, "tokencredit.py")
    student = read(path)
    if reference is not None and os.path.samefile(path, os.path.join(HERE, "tokencredit.py")):
        reference = None  # the reference graded as itself
    if only:
        if not set(only) <= set(exercises):
            raise SystemExit(f"course.py: exercises {only} asked for, this set has {exercises}")
        exercises = only
    rows = grade(student, mapping, exercises, reference)
    print(f"grading {os.path.abspath(path)}"
          + (" against the reference, one exercise at a time" if reference else ""))
    print(format_rows(rows, verbose or bool(only)))
    if gradescope_file:
        with open(gradescope_file, "w") as f:
            json.dump(gradescope(rows), f, indent=1)
        print(f"wrote {gradescope_file}")


def cmd_list() -> None:
    _, mapping, exercises = setting()
    for k in exercises:
        print(f"exercise {k}: {EXERCISES[k][0]} ({', '.join(EXERCISES[k][1])}), "
              f"{len(mapping[k])} tests")
        for name in mapping[k]:
            print(f"    {name}")


def cmd_selfcheck() -> None:
    """The grader's checks on itself; exit 1 if one fails."""
    reference = read(os.path.join(HERE, "tokencredit.py"))
    mapping = test_map(reference)  # the reference passes every test, or this stops
    graded = sorted(set().union(*mapping.values()))
    print(f"{len(graded)} of {len(run_tests(reference))} tests grade an exercise; per exercise: "
          + ", ".join(f"{k}: {len(mapping[k])}" for k in EXERCISES))
    problems = [f"exercise {k} is caught by {len(mapping[k])} tests, not >= 2"
                for k in EXERCISES if len(mapping[k]) < 2]
    full = grade(reference, mapping, EXERCISES, reference)
    problems += [f"the reference loses points in exercise {r[0]}" for r in full if r[3] != r[4]]
    empty = run_tests(blank(reference, EXERCISES))
    passing = [name for name in graded if not empty[name]]
    other = [name for name in graded if empty[name] and "NotImplementedError" not in empty[name]]
    problems += [f"{name} passes on the blank file" for name in passing]
    problems += [f"{name} fails on the blank file without NotImplementedError" for name in other]
    print(f"blank file: {len(graded) - len(passing) - len(other)} of {len(graded)} graded tests "
          f"fail with NotImplementedError")
    for k, what, right, wrong in MISTAKES:
        if reference.count(right) != 1:
            problems.append(f"mistake {what!r}: {right!r} is not once in tokencredit.py")
            continue
        rows = grade(reference.replace(right, wrong), mapping, EXERCISES, reference)
        lost = [r[0] for r in rows if r[3] < r[4]]
        print(f"mistake {what!r:34} loses points in exercise(s) {lost or 'none'}")
        if lost != [k]:
            problems.append(f"mistake {what!r} should cost exercise {k} only, cost {lost}")
    for problem in problems:
        print("FAILED:", problem)
    print("selfcheck:", "FAILED" if problems else "OK")
    sys.exit(1 if problems else 0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="The exercise sheet: docs/course.md")
    commands = parser.add_subparsers(dest="command", required=True)
    handout = commands.add_parser("handout", help="write a student copy with the exercises blank")
    handout.add_argument("dir", help="a new or empty folder")
    handout.add_argument("--set", default="all", choices=SETS,
                         help="which exercises: " + "; ".join(f"{name} = {', '.join(map(str, ks))}"
                                                             for name, ks in SETS.items()))
    grade_ = commands.add_parser("grade", help="grade a tokencredit.py, one line per exercise")
    grade_.add_argument("path", nargs="?", help="the student's tokencredit.py (default: the one "
                        "beside course.py)")
    grade_.add_argument("-e", "--exercise", type=int, action="append", dest="only",
                        help="only this exercise, with its failing tests (repeatable)")
    grade_.add_argument("-v", "--verbose", action="store_true", help="list the failing tests")
    grade_.add_argument("--gradescope", metavar="FILE", help="also write Gradescope's results.json")
    commands.add_parser("list", help="each exercise's functions and the tests that grade it")
    commands.add_parser("selfcheck", help="check the grader: reference, blank, planted mistakes")
    args = parser.parse_args(argv)
    if args.command == "handout":
        cmd_handout(args.dir, args.set)
    elif args.command == "grade":
        cmd_grade(args.path, args.only, args.gradescope, args.verbose)
    elif args.command == "list":
        cmd_list()
    else:
        cmd_selfcheck()


if __name__ == "__main__":
    main()
