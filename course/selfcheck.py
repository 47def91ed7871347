"""selfcheck: the grader's checks on itself, an instructor's (tests/course/test_handout.py runs its
handout part on one set). The reference passes every test through the grader; a blank file fails
every graded test with NotImplementedError; an endless loop costs its own exercise, named as a
time limit; each set's handout holds no solution, loop or answer, and, its exercises written in
order, gets full marks for those and 0 for the rest; in a handout, each planted mistake costs its
own exercise points and each other correct solution none. The official grade's plants:
docs/course.md, "One file, one score".
"""

import json
import os
import tempfile
import time

from .exercises import CORRECT, ENDLESS, EXERCISES, MISTAKES, SETS
from .grading import MAP_FILE, ROOT, Grader, read, test_files, test_map
from .handout import all_answers, scan_handout, write_handout
from .source import apply_edits, blank


def few_tests(plan: dict, where: str) -> list:
    """No function's share all or nothing: each is graded by >= 3 tests (in a handout, >= 3
    that need no later exercise)."""
    return [f"{where}: {name} (exercise {k}) is graded by {len(counted)} tests, not >= 3"
            for k, p in plan.items() for name, tests in p["functions"].items()
            for counted in [[t for t in tests if t not in p["later"]]] if len(counted) < 3]


def cmd_selfcheck() -> None:
    started = time.monotonic()
    reference = read(os.path.join(ROOT, "tokencredit.py"))
    mapping = test_map(reference)  # the reference passes every test, or this stops
    k, what, edits = ENDLESS  # graded with 2 s per test, as the blank (it fails at once)
    grader = Grader(reference, mapping, list(EXERCISES), 0, dict(test_s=2, time_s=30))
    graded = {t for j in EXERCISES for t in grader.tests_of(j)}
    print(f"{len(graded)} of {len(mapping['tests'])} tests grade an exercise; per exercise: "
          + ", ".join(f"{j}: {len(grader.tests_of(j))}" for j in EXERCISES))
    problems = few_tests(grader.plan, "the official grade")
    try:
        rows = grader.grade(blank(reference, EXERCISES))
        endless = grader.grade(apply_edits(reference, edits))
    finally:
        grader.close()
    if any(r["points"] or r["passed"] for r in rows):
        problems.append(f"the blank file scores {[r['points'] for r in rows]}")
    print(f"blank file: {sum(r['points'] for r in rows):g} points, "
          f"{sum(r['passed'] for r in rows)} tests passed")
    cost = sorted(r["k"] for r in endless if r["points"] < r["max"])
    said = [r.get("error") or "" for r in endless if r["k"] == k]
    print(f"  {what}: costs exercise(s) {cost}; the report says {said}")
    if cost != [k] or "time limit (2 s per test)" not in said[0]:
        problems.append(f"{what} should cost exercise {k} only, named as a time limit: {endless}")
    problems += check_handouts(reference)
    for problem in problems:
        print("FAILED:", problem)
    print(f"selfcheck: {'FAILED' if problems else 'OK'} in {time.monotonic() - started:.0f} s")
    raise SystemExit(1 if problems else 0)


def check_handouts(reference: str, sets=SETS) -> list:
    """Each set's handout: nothing that solves it; in order, full marks for what is written; in
    the `all` set's, each plant (plants_in)."""
    problems = []
    answers = all_answers()
    with tempfile.TemporaryDirectory(prefix="handout-") as tmp:
        for set_name, exercises in sets.items():
            out = os.path.join(tmp, set_name)
            write_handout(out, set_name, False, reference)
            found = scan_handout(out, reference, exercises, answers)
            problems += [f"handout {set_name}: {p}" for p in found]
            saved = json.loads(read(os.path.join(out, MAP_FILE)))
            grader = Grader(None, saved, exercises, 0, tests=test_files(out))  # graded in order
            problems += few_tests(grader.plan, f"handout {set_name}")
            said = []
            try:
                for i in range(len(exercises) + 1):  # the first i exercises written, in order
                    rows = grader.grade(blank(reference, exercises[i:]))
                    points = [r["points"] for r in rows]
                    want = [r["max"] if j < i else 0 for j, r in enumerate(rows)]
                    said.append(f"{sum(points):g}")
                    if points != want:
                        problems.append(f"handout {set_name}, exercises {exercises[:i]} "
                                        f"written: points {points}, not {want}")
                if set_name == "all":
                    problems += plants_in(grader, reference)
            finally:
                grader.close()
            print(f"handout {set_name}: {len(found)} solution lines, loops, answers or pointers "
                  f"found; written in order, the totals are " + " -> ".join(said))
        out = os.path.join(tmp, "answers")
        write_handout(out, "grpo", True, reference)
        sheet = read(os.path.join(out, "docs", "course.md"))
        if "<details>" not in sheet:
            problems.append("handout --answers: the sheet lacks answers")
    return problems


def plants_in(grader, reference: str) -> list:
    """Each plant's own exercise in a handout's grade: a mistake loses points, a variant none."""
    problems = []
    print("points each plant loses in its own exercise, in the handout (set all, seed 0):")
    for k, what, edits in MISTAKES + CORRECT:
        row, = grader.grade(apply_edits(reference, edits), f"{what}.py", only=[k])
        print(f"  {what!r:50} exercise {k}: loses {row['max'] - row['points']:g} "
              f"({row['passed']}/{row['total']} tests passed)")
        if (row["points"] < row["max"]) != ((k, what, edits) in MISTAKES):
            problems.append(f"{what!r}: exercise {k} gets {row['points']}/{row['max']} in a "
                            "handout")
    return problems
