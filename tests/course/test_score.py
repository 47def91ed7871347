"""Points (docs/course.md, "Points" and "One file, one score"): each function's share by its
tests, a mistake costing its own exercise and a second one never giving points back; expected
values the student cannot touch; correct code that does not lose for where it puts a line; and
one score for one file on every regrade, every route and every seed.

    python tests/course/test_score.py [SEEDS]    the note's table: each plant's points over SEEDS
                                                 seeds (default 20), officially and in a handout

One grader (module scope, each file's seed from SECRET) serves the in-process cases; the routes
(`grade PATH`, `grade-all`, the bundle) run as the instructor runs them. REPEATS (default 2) is
how many times each route grades the same file.
"""

import ast
import csv
import importlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

import pytest
import torch

# run as a script: the project's folder, for course
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from course import flags, grading, source  # noqa: E402
from course.exercises import CORRECT, EXERCISES, MISTAKES, SETS, ENDLESS, names  # noqa: E402
from submissions import BASE, grade, needs_bwrap  # noqa: E402

pytestmark = pytest.mark.slow  # python -m pytest -m slow


ROOT = grading.ROOT


REFERENCE = grading.read(os.path.join(ROOT, "tokencredit.py"))


PY = sys.executable


SECRET = "test_score's course secret"


GRPO = SETS["grpo"]


REPEATS = int(os.environ.get("REPEATS", "2"))


SLOW = dict(time_s=10 * grading.LIMITS["time_s"], test_s=10 * grading.LIMITS["test_s"])  # the


# in-process grades measure the draw, not how busy the machine is
ZERO = '''

def _zero(*given):
    """Every tensor given, zeroed in place (and every tensor inside a tuple, list or dict)."""
    with torch.no_grad():
        for x in given:
            if isinstance(x, torch.Tensor):
                x.zero_()
            elif isinstance(x, (tuple, list, dict)):
                _zero(*(x.values() if isinstance(x, dict) else x))
'''


def insert(text: str, statement: str, exercises, after_door: bool) -> str:
    """text with `statement` in each function of the exercises: first in its body (after the
    docstring), or right after its door."""
    defs, lines = source.functions(text), text.splitlines(keepends=True)
    at = []
    for name in [n for k in exercises for n in names(k)]:
        body = defs[name].body
        keep = source.kept_statements(defs[name]) if after_door else int(
            isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant))
        at.append((body[keep].lineno - 1, body[keep].col_offset))
    for line, indent in sorted(at, reverse=True):
        lines[line:line] = [" " * indent + part + "\n" for part in statement.splitlines()]
    return "".join(lines)


@pytest.fixture(scope="module")
def grader():
    mapping = grading.test_map(REFERENCE)
    one = grading.Grader(REFERENCE, mapping, list(EXERCISES), None, SLOW, secret=SECRET)
    one.start()
    yield one
    one.close()


def total(rows) -> float:
    return round(sum(r["points"] for r in rows), 2)


# -----------------------------------------------------------------------------
# points


def test_points_weigh_the_mistake():
    plan = dict(functions={"group_advantages": ["h", "l", "a", "f"], "overlong_penalty": ["o"]},
                later={})
    kinds = dict(h="hand", l="loop", a="other", f="fresh", o="other")

    def points(failed):
        result = dict(results={t: ("boom" if t in failed else None) for t in "hlafo"})
        return grading.score(plan, 1, result, kinds, grading.LIMITS)["points"]
    assert points("") == 10
    assert points("a") == pytest.approx(3 + 7 * 3 / 4)  # an invariant: its share of the tests
    assert points("h") == pytest.approx(3 + 7 / 4)  # the hand-worked case: a quarter at most
    assert points("f") == 3  # fresh inputs: nothing of its share
    limited = grading.score(plan, 1, dict(results={}, limit="memory", stopped="x"), kinds,
                            grading.LIMITS)
    assert limited["points"] == 0 and "memory limit" in limited["error"]


def test_blocker_reads_the_exercise_number_from_the_failure():
    assert grading.blocker("NotImplementedError: exercise 3: clipped_surrogate\n...") == 3
    assert grading.blocker("AssertionError: 1 != 2") is None


def test_a_test_charged_to_the_function_it_is_named_after_costs_no_other():
    """fill_batch keeps its surplus: its tests all call informative_groups too, and none fails
    alone; each is charged to fill_batch, after whom it is named, and informative_groups keeps
    its share (it lost it all before)."""
    both = ["test_fill_batch", "test_h_fill_batch"]
    plan = dict(functions={"informative_groups": ["test_ig"] + both, "fill_batch": both},
                later={})
    kinds = dict(test_ig="loop", test_fill_batch="loop", test_h_fill_batch="fresh")
    result = dict(results=dict(test_ig=None, test_fill_batch="boom", test_h_fill_batch="boom"))
    row = grading.score(plan, 2, result, kinds, grading.LIMITS)
    assert row["per_function"] == {"informative_groups": (1, 1, 3.0, 3),
                                   "fill_batch": (0, 2, 0.0, 7)}


# a mistake that exercise 3's own tests of _clipped_surrogate miss (the clip forgotten when the
# ratio comes from policy_loss) and, in the second file, one more: _importance_ratio writes into
# its input's padding, which fails test_inputs_unchanged[importance_ratio] alone
FORGOT_CLIP = (("    unclipped = ratio * A  # (N, T)\n",
                "    if ratio.grad_fn is not None:  # inside policy_loss: the clip forgotten\n"
                "        return -ratio * A\n    unclipped = ratio * A  # (N, T)\n"),)


WRITES_INPUT = (("    if level != \"token\":\n        return _sequence_ratio(",
                 "    with torch.no_grad():  # writes into its input's padding\n"
                 "        old_logp.masked_fill_(~mask, 0.0)\n"
                 "    if level != \"token\":\n        return _sequence_ratio("),)


@needs_bwrap
def test_a_second_mistake_never_raises_the_points(tmp_path):
    """score() charges a failing test that needs several functions to those that fail a test of
    their own: one failing test of _importance_ratio (an input written) moved every policy_loss
    failure off _clipped_surrogate and _policy_gradient_surrogate. The file with one mistake got
    0 of 10, the same file with one mistake more 7 of 10."""
    one = grade(tmp_path, source.apply_edits(REFERENCE, FORGOT_CLIP), "-e", "3", name="one.py")
    two = grade(tmp_path, source.apply_edits(REFERENCE, FORGOT_CLIP + WRITES_INPUT), "-e", "3",
                name="two.py")
    points = [float(s.split("total ")[1].split("/")[0]) for s in (one, two)]
    assert points[1] <= points[0], points


def test_the_sheet_prints_the_points_table():
    sheet = grading.read(os.path.join(ROOT, "docs", "course.md"))
    for k, (title, points) in EXERCISES.items():
        assert f"| {k} {title} | " + ", ".join(f"`{n}` {p}" for n, p in points.items()) + " |" \
            in sheet


def test_the_copy_note_names_the_functions_that_are_the_reference_s_alone():
    """copies(): the exercises' functions a file holds as the reference has them, statement for
    statement, whatever its comments and layout; a plant's and a blank's are not."""
    every = {n for k in EXERCISES for n in names(k)}
    flipped = source.apply_edits(REFERENCE, MISTAKES[0][2])  # exercise 1's group_advantages
    assert grading.copies(flipped, REFERENCE) == every - {"group_advantages"}
    assert grading.copies(source.blank(REFERENCE, [3]), REFERENCE) == every - set(names(3))
    laid_out = REFERENCE.replace("\ndef group_advantages(", "\n# mine\n\n\ndef group_advantages(")
    assert laid_out != REFERENCE and grading.copies(laid_out, REFERENCE) == every


def test_the_reference_copied_is_said_and_grade_all_needs_a_set(tmp_path):
    """A copy of the public reference gets its marks, and a line for the instructor; a class is
    never graded on the set 'all' by default (its files hold the reference outside their set)."""
    (tmp_path / "copy.py").write_text(REFERENCE)
    done = subprocess.run([PY, "-m", "course", "grade", str(tmp_path / "copy.py"), "--set", "grpo"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "total 30.0/30 points" in done.stdout, done.stderr
    assert done.stdout.count(grading.SAME_NOTE) == 3  # exercises 1, 3 and 5
    (tmp_path / "class").mkdir()
    done = subprocess.run([PY, "-m", "course", "grade-all", str(tmp_path / "class")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "grade-all needs --set" in done.stderr


def test_plants_writes_one_submission_per_plant_named_by_its_exercise(tmp_path):
    from course.__main__ import main
    main(["plants", str(tmp_path / "class")])
    files = sorted((tmp_path / "class").iterdir())
    plants = MISTAKES + CORRECT + (ENDLESS,)
    assert len(files) == len(plants)
    for path, (k, _, edits) in zip(files, plants):
        assert f"-ex{k}-" in path.name and path.read_text() == source.apply_edits(REFERENCE, edits)


# -----------------------------------------------------------------------------
# expected values the student cannot touch


def test_a_blank_that_zeroes_its_inputs_in_place_gets_0(grader):
    """Before: its writes were copied into the judge's tensors, whose loops then met zeros."""
    text = insert(REFERENCE, "_zero(*locals().values())", GRPO, after_door=True) + ZERO
    assert total(grader.grade(text, only=GRPO)) == 0


def test_the_same_with_the_public_snapshots_gets_0(grader, tmp_path):
    """The public tests' inputs answered from a table of their outputs, any other input zeroed
    in place and answered on zeros: the fresh inputs fail, and with them each function."""
    from classes import replay_attack
    text = replay_attack(tmp_path)
    said = 'raise NotImplementedError("no stored output for these inputs")'
    assert text.count(said) == 1
    text = text.replace(said, "_zero(*a, *k.values())") + ZERO
    rows = grader.grade(text, only=GRPO)
    assert total(rows) == 0, [(r["k"], r["points"], list(r["failed"])[:3]) for r in rows]


def test_a_correct_function_that_changes_its_input_loses_that_test_only(grader):
    """Whether a function may change its inputs is its own test: the reference changes none."""
    text = REFERENCE + ZERO + '''
_right = group_advantages


def group_advantages(rewards, *args, **kwargs):
    out = _right(rewards, *args, **kwargs)
    _zero(rewards)
    return out
'''
    row, = grader.grade(text, only=[1])
    assert list(row["failed"]) == ["test_inputs_unchanged[group_advantages]"], row["failed"]
    assert 9 < row["points"] < 10  # a share of one "other" test of group_advantages' 7 points


# -----------------------------------------------------------------------------
# correct code that loses: the door


def test_the_door_checks_the_parameters_wherever_it_stands():
    import tokencredit as tc

    def door(logp, mask, mode):
        """A door with locals made before it; `mode` a local with a rule of its own."""
        x, mask_count = 1, 2
        return tc._check_inputs(locals())
    logp = torch.zeros(2, 3)
    assert door(logp, torch.ones(2, 3), "token").dtype == torch.bool
    with pytest.raises(ValueError, match=r"mask must be a torch.Tensor"):
        door(logp, torch.ones(2, 4), "token")  # a parameter is still checked
    with pytest.raises(ValueError, match=r"mode must be one of"):
        door(logp, torch.ones(2, 3), "tokens")


def test_a_correct_file_with_a_harmless_first_line_gets_full_marks(grader):
    text = insert(REFERENCE, "x = 1", EXERCISES, after_door=False)
    assert "    x = 1\n    _check_inputs(locals())" in text
    rows = grader.grade(text)
    assert total(rows) == 80, [(r["k"], r["points"], list(r["failed"])[:2]) for r in rows]
    assert flags.scan(text) == []


# -----------------------------------------------------------------------------
# one file, one score: every route, every regrade; every plant, every seed


def test_a_mistake_found_on_some_draws_only_still_gets_one_score_on_every_route(grader, tmp_path):
    """overlong_penalty wrong past max_len 35: a fresh draw finds it on about half the seeds.
    Graded REPEATS times by grade PATH, in a class of copies by grade-all and by the bundle."""
    door = "_check_inputs(locals(), max_len=_POSITIVE_INT)  # here a count of tokens\n"
    text = source.apply_edits(REFERENCE, [(door, door + "    if max_len > 35:\n"
                                           "        return torch.zeros(lengths.shape)\n")])
    seen = set()
    for seed in range(6):  # the draw decides, for this file: which seed is used matters
        grader.seed = seed
        seen.add(grader.grade(text, only=[1])[0]["points"])
    grader.seed = None
    assert seen == {7.0, 10.0}
    env = dict(os.environ, COURSE_SECRET=SECRET)
    (tmp_path / "class").mkdir()
    for i in range(REPEATS):
        (tmp_path / "class" / f"copy{i}.py").write_text(text)
    (tmp_path / "class" / "correct.py").write_text(REFERENCE)
    points = []

    def run(*args):
        done = subprocess.run([PY, "-m", "course", *args], cwd=ROOT, env=env, text=True,
                              capture_output=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    for i in range(REPEATS):
        run("grade", str(tmp_path / "class" / "copy0.py"), "--set", "grpo", "--gradescope",
            str(tmp_path / "one.json"))
        points.append(json.loads((tmp_path / "one.json").read_text())["score"])
    run("grade-all", str(tmp_path / "class"), "--set", "grpo", "--csv", str(tmp_path / "g.csv"))
    rows = list(csv.DictReader((tmp_path / "g.csv").open()))
    assert {r["student"]: r["total"] for r in rows}["correct"] == "30.00"
    points += [float(r["total"]) for r in rows if r["student"].startswith("copy")]
    assert len({r["seed"] for r in rows if r["student"].startswith("copy")}) == 1
    run("gradescope", str(tmp_path / "ag.zip"), "--set", "grpo")
    root = tmp_path / "root"
    with zipfile.ZipFile(tmp_path / "ag.zip") as z:
        z.extractall(root / "source")
        assert SECRET in z.read(grading.BUNDLE_FILE).decode()
    (root / "submission").mkdir()
    (root / "submission" / "tokencredit.py").write_text(text)
    for _ in range(REPEATS):
        done = subprocess.run(["bash", str(root / "source" / "run_autograder")], text=True,
                              env=dict(os.environ, AUTOGRADER_ROOT=str(root), PYTHON=PY),
                              capture_output=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        points.append(json.loads((root / "results" / "results.json").read_text())["score"])
    mine = total(grader.grade(text, only=GRPO))  # this grader's secret is the routes'
    assert points == [mine] * len(points), points


DRAW = '''
import random as _random, numpy as _np
def overlong_penalty(*args, **kwargs):
    raise ValueError(f"drew {_random.random()} {hash('tokencredit')} {torch.rand(1).item()} "
                     f"{_np.random.rand()}")
'''


@needs_bwrap
def test_a_file_that_draws_draws_the_same_on_every_grade(tmp_path):
    """A child's random, numpy's and torch's generators and str's hash were seeded afresh by each
    process: a file whose answers depend on a draw, or on a set's order, could get other points
    on a regrade."""
    drawn = [grade(tmp_path, BASE + DRAW, "-e", "1").split("drew ")[1].split("\n")[0]
             for _ in range(2)]
    assert drawn[0] == drawn[1], drawn


def official_tests() -> dict:
    """{test as the judge names it: (its function, its parameters)}: tests/course/test_hidden.py's,
    each parametrized case by pytest's id (the closest decorator's value first)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    official, out = importlib.import_module("test_hidden"), {}
    for name, test in vars(official).items():
        if name.startswith("test_") and callable(test):
            cases = [{}]
            for mark in getattr(test, "pytestmark", []):
                if mark.name == "parametrize":
                    arg, values = mark.args
                    cases = [dict(c, **{arg: v}) for c in cases for v in values]
            for case in cases:
                out[name + (f"[{'-'.join(map(str, case.values()))}]" if case else "")] = (
                    test, case)
    return out


def failures_in_process(tests: dict, text, seed: int) -> dict:
    """{test: None, or why it failed}: the official set on `text` (None: the reference) in this
    process, at `seed`: no grader, no judge."""
    import types
    module = next(iter(tests.values()))[0].__globals__  # test_hidden's: its `tc`
    keep, was = module["tc"], os.environ.get("TOKENCREDIT_SEED")
    plant = keep
    if text is not None:
        plant = types.ModuleType("tokencredit")
        exec(compile(text, "tokencredit.py", "exec"), plant.__dict__)
    out = {}
    try:
        os.environ["TOKENCREDIT_SEED"], module["tc"] = str(seed), plant
        for name, (test, case) in tests.items():
            try:
                test(**case)
                out[name] = None
            except Exception as error:  # noqa: BLE001 -- a failure, said in the value
                out[name] = repr(error)[:300]
    finally:
        module["tc"] = keep
        if was is None:
            os.environ.pop("TOKENCREDIT_SEED", None)
        else:
            os.environ["TOKENCREDIT_SEED"] = was
    return out


def test_the_reference_passes_the_official_hidden_set_on_every_seed():
    """In-process, no grader: every test of tests/course/test_hidden.py on the reference at seeds
    1 to 5 (CI's pytest runs seed 0; 1,000 seeds passed when it was written). There is no
    second chance: a fresh test the reference failed would count against the student."""
    tests = official_tests()
    assert len(tests) > 40 and set(tests) <= set(grading.test_map(REFERENCE)["tests"])
    failed = {(seed, t): why for seed in range(1, 6)
              for t, why in failures_in_process(tests, None, seed).items() if why}
    assert failed == {}


def points_on_seeds(grader, k: int, text: str, tests: dict, seeds) -> list:
    """Exercise k's official points on each seed: the grader at the first (bubblewrap, the
    judge), the others with only tests/course/test_hidden.py run again in this process and scored by
    score() (the other tests draw nothing from the seed). At the first seed the in-process run
    must fail the same tests as the grader, or this stops."""
    grader.seed = seeds[0]
    try:
        row, = grader.grade(text, only=[k])
    finally:
        grader.seed = None
    base = {t: row["failed"].get(t) for t in grader.tests_of(k)}
    mine = failures_in_process(tests, text, seeds[0])
    differ = [t for t in base if t in mine and bool(mine[t]) != bool(base[t])]
    assert not differ and not row["limit"], (k, differ, row["limit"])
    got = [row["points"]]
    for seed in seeds[1:]:
        mine = failures_in_process(tests, text, seed)
        results = {t: mine[t] if t in mine else why for t, why in base.items()}
        got.append(grading.score(grader.plan[k], k, dict(results=results, error=None),
                                 grader.mapping["kinds"], grader.limits)["points"])
    return got


def test_every_plant_costs_the_same_on_every_seed(grader):
    """Each plant and correct variant at seeds 0, 1 and 2 (points_on_seeds: one graded run, the
    other seeds in this process); `python tests/course/test_score.py 20` gives the note's twenty."""
    mistakes, tests = {what for _, what, _ in MISTAKES}, official_tests()
    for k, what, edits in MISTAKES + CORRECT:
        got = points_on_seeds(grader, k, source.apply_edits(REFERENCE, edits), tests, (0, 1, 2))
        assert len(set(got)) == 1, (what, got)
        assert (got[0] < sum(EXERCISES[k][1].values())) == (what in mistakes), (what, got)


def main(n: int) -> None:
    """The note's table: each plant's own exercise over n seeds, officially (min, max, the
    distinct values; points_on_seeds: the grader at seed 0, seeds 1 to n - 1 in this process) and
    in a handout (set all, its seed 0)."""
    import time
    from course.handout import write_handout
    started = time.monotonic()
    official = grading.Grader(REFERENCE, grading.test_map(REFERENCE), list(EXERCISES), None,
                              SLOW)
    tests = official_tests()
    try:
        table = {what: (k, points_on_seeds(official, k, source.apply_edits(REFERENCE, edits),
                                           tests, list(range(n))))
                 for k, what, edits in MISTAKES + CORRECT}
    finally:
        official.close()
    with tempfile.TemporaryDirectory() as tmp:
        write_handout(os.path.join(tmp, "h"), "all", False, REFERENCE)
        saved = json.loads(grading.read(os.path.join(tmp, "h", grading.MAP_FILE)))
        handout = grading.Grader(None, saved, list(EXERCISES), 0, SLOW,
                                 tests=grading.test_files(os.path.join(tmp, "h")))
        try:
            theirs = {what: handout.grade(source.apply_edits(REFERENCE, edits), f"{what}.py",
                                          only=[k])[0]["points"]
                      for k, what, edits in MISTAKES + CORRECT}
        finally:
            handout.close()
    print(f"| plant | exercise | official, {n} seeds: min | max | distinct | handout | both "
          "below full | the same points |")
    print("|---|---|---|---|---|---|---|---|")
    for what, (k, got) in table.items():
        full = sum(EXERCISES[k][1].values())
        print(f"| {what} | {k} | {min(got):g} | {max(got):g} | {len(set(got))} | "
              f"{theirs[what]:g} | {'yes' if max(got + [theirs[what]]) < full else 'no'} | "
              f"{'yes' if set(got) == {theirs[what]} else 'NO'} |")
    print(f"{len(table)} plants and correct variants in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
