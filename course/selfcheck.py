"""selfcheck: the grader's checks on itself, for an instructor (tests/test_course.py runs its
handout part on one set).

The reference passes every test through the grader; a blank file fails every graded test with
NotImplementedError; each planted mistake costs its own exercise only; each other correct
solution gets full marks; an endless loop costs its own exercise, named as a time limit; each
set's handout holds no solution, loop or answer, and, its exercises written in order, gets full
marks for those and 0 for the rest. Each plant's points over many seeds beside its handout
grade: `python tests/test_score.py 20`.
"""

import json
import os
import tempfile
import time

from .exercises import CORRECT, ENDLESS, EXERCISES, MISTAKES, SETS
from .grading import MAP_FILE, ROOT, Grader, read, scheme, test_files, test_map
from .handout import all_answers, scan_handout, write_handout
from .source import apply_edits, blank


def few_tests(plan: dict, where: str) -> list:
    """No function's share all or nothing: each is graded by >= 3 tests (in a handout, >= 3
    that need no later exercise)."""
    return [f"{where}: {name} (exercise {k}) is graded by {len(counted)} tests, not >= 3"
            for k, p in plan.items() for name, tests in p["functions"].items()
            for counted in [[t for t in tests if t not in p["later"]]] if len(counted) < 3]


def lost(rows) -> dict:
    return {r["k"]: round(r["max"] - r["points"], 2) for r in rows if r["points"] < r["max"]}


def cmd_selfcheck() -> None:
    started = time.monotonic()
    reference = read(os.path.join(ROOT, "tokencredit.py"))
    mapping = test_map(reference)  # the reference passes every test, or this stops
    problems = []
    full = scheme(mapping, EXERCISES, in_order=False)
    graded = sorted({t for p in full.values() for ts in p["functions"].values() for t in ts})
    print(f"{len(graded)} of {len(mapping['tests'])} tests grade an exercise; per exercise: "
          + ", ".join(f"{k}: {len({t for ts in p['functions'].values() for t in ts})}"
                      for k, p in full.items()))
    problems += few_tests(full, "the official grade")
    grader = Grader(reference, mapping, list(EXERCISES), 0)
    grader.start()
    try:
        rows = grader.grade(blank(reference, EXERCISES))
        if any(r["points"] for r in rows) or any(r["passed"] for r in rows):
            problems.append(f"the blank file scores {[r['points'] for r in rows]}")
        print(f"blank file: {sum(r['points'] for r in rows):g} points, "
              f"{sum(r['passed'] for r in rows)} tests passed")
        print("points lost in the official grade (seed 0), one exercise at a time:")
        for k, what, edits in MISTAKES + CORRECT:
            kind = "mistake" if (k, what, edits) in MISTAKES else "correct"
            try:
                text = apply_edits(reference, edits)
            except ValueError as error:
                problems.append(f"{kind} {what!r}: {error}")
                continue
            rows = grader.grade(text, f"{what}.py")
            cost = lost(rows)
            print(f"  {kind} {what!r:50} (exercise {k}): "
                  + (", ".join(f"exercise {j} -{p:g}" for j, p in cost.items()) or "none"))
            if kind == "mistake" and list(cost) != [k]:
                problems.append(f"mistake {what!r} should cost exercise {k} only, cost {cost}")
            if kind == "correct" and cost:
                problems.append(f"the correct {what!r} loses points: {cost}")
    finally:
        grader.close()
    k, what, edits = ENDLESS
    slow = Grader(reference, mapping, list(EXERCISES), 0, dict(test_s=2, time_s=30))
    try:
        rows = slow.grade(apply_edits(reference, edits))
    finally:
        slow.close()
    cost = lost(rows)
    said = [r.get("error") or "" for r in rows if r["k"] == k]
    print(f"  {what}: costs exercise(s) {sorted(cost)}; the report says {said}")
    if list(cost) != [k] or "time limit (2 s per test)" not in said[0]:
        problems.append(f"{what} should cost exercise {k} only, named as a time limit: {rows}")
    problems += check_handouts(reference)
    for problem in problems:
        print("FAILED:", problem)
    print(f"selfcheck: {'FAILED' if problems else 'OK'} in {time.monotonic() - started:.0f} s")
    raise SystemExit(1 if problems else 0)


def check_handouts(reference: str, sets=SETS) -> list:
    """Each set's handout: nothing that solves it; in order, full marks for what is written."""
    problems = []
    answers = all_answers()
    with tempfile.TemporaryDirectory(prefix="handout-") as tmp:
        for set_name, exercises in sets.items():
            out = os.path.join(tmp, set_name)
            write_handout(out, set_name, False, reference)
            found = scan_handout(out, reference, exercises, answers)
            problems += [f"handout {set_name}: {p}" for p in found]
            saved = json.loads(read(os.path.join(out, MAP_FILE)))
            problems += few_tests(scheme(saved, exercises, True), f"handout {set_name}")
            grader = Grader(None, saved, exercises, 0, tests=test_files(out))
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
