"""selfcheck: the grader's checks on itself, for an instructor (tests/test_course.py runs its
handout part on one set).

The reference passes every test through the grader; a blank file fails every graded test with
NotImplementedError; each planted mistake costs its own exercise only, in the official grade and
in a handout's; each other correct solution gets full marks; an endless loop costs its own
exercise, named as a time limit; each set's handout holds no solution, loop or answer, and, its
exercises written in order, gets full marks for those and 0 for the rest.
"""

import os
import re
import tempfile
import time

from .exercises import CORRECT, ENDLESS, EXERCISES, MISTAKES, SETS
from .grading import MAP_FILE, ROOT, Grader, read, scheme, test_files, test_map
from .handout import all_answers, handout_map, new_folder, scan_handout, write_handout
from .source import apply_edits, blank


def plants():
    return ([p + ("mistake",) for p in MISTAKES] + [p + ("correct",) for p in CORRECT]
            + [ENDLESS + ("endless",)])


def write_plants(out: str) -> int:
    """selfcheck's plants as a class to grade, each the reference with one edit."""
    new_folder(out)
    os.makedirs(out, exist_ok=True)
    reference = read(os.path.join(ROOT, "tokencredit.py"))
    for i, (k, what, edits, _) in enumerate(plants(), 1):
        slug = re.sub(r"[^a-z0-9]+", "-", what.lower().replace(">", "above")).strip("-")
        with open(os.path.join(out, f"{i:02d}-ex{k}-{slug[:40]}.py"), "w") as f:
            f.write(apply_edits(reference, edits))
    return len(plants())


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
    seed = 0  # the handouts' seed: a plant is compared with its handout grade on the same inputs
    grader = Grader(reference, mapping, list(EXERCISES), seed)
    grader.start()
    official = {}
    try:
        rows = grader.grade(blank(reference, EXERCISES))
        if any(r["points"] for r in rows) or any(r["passed"] for r in rows):
            problems.append(f"the blank file scores {[r['points'] for r in rows]}")
        print(f"blank file: {sum(r['points'] for r in rows):g} points, "
              f"{sum(r['passed'] for r in rows)} tests passed")
        print(f"points lost in the official grade (seed {seed}), one exercise at a time:")
        for k, what, edits, kind in plants()[:-1]:
            try:
                text = apply_edits(reference, edits)
            except ValueError as error:
                problems.append(f"{kind} {what!r}: {error}")
                continue
            official[what] = rows = grader.grade(text, f"{what}.py")
            cost = lost(rows)
            print(f"  {kind} {what!r:50} (exercise {k}): "
                  + (", ".join(f"exercise {j} -{p:g}" for j, p in cost.items()) or "none"))
            if kind == "mistake" and list(cost) != [k]:
                problems.append(f"mistake {what!r} should cost exercise {k} only, cost {cost}")
            if kind == "correct" and cost:
                problems.append(f"the correct {what!r} loses points: {cost}")
        for set_name in ("grpo", "cscr"):
            rows = grader.grade(blank(reference, SETS[set_name]), only=SETS[set_name])
            if any(r["points"] for r in rows):
                problems.append(f"set {set_name}: a blank submission scores {rows}")
    finally:
        grader.close()
    k, what, edits = ENDLESS
    slow = Grader(reference, mapping, list(EXERCISES), seed, dict(test_s=2, time_s=30))
    try:
        rows = slow.grade(apply_edits(reference, edits))
    finally:
        slow.close()
    cost = lost(rows)
    said = [r.get("error") or "" for r in rows if r["k"] == k]
    print(f"  {what}: costs exercise(s) {sorted(cost)}; the report says {said}")
    if list(cost) != [k] or "time limit (2 s per test)" not in said[0]:
        problems.append(f"{what} should cost exercise {k} only, named as a time limit: {rows}")
    problems += check_handouts(reference, official)
    for problem in problems:
        print("FAILED:", problem)
    print(f"selfcheck: {'FAILED' if problems else 'OK'} in {time.monotonic() - started:.0f} s")
    raise SystemExit(1 if problems else 0)


def check_handouts(reference: str, official: dict, sets=SETS) -> list:
    """Each set's handout: nothing that solves it; in order, full marks for what is written;
    and each plant's own exercise graded as the official grade grades it."""
    problems = []
    answers, mapping = all_answers(), handout_map(reference)
    with tempfile.TemporaryDirectory(prefix="handout-") as tmp:
        for set_name, exercises in sets.items():
            out = os.path.join(tmp, set_name)
            write_handout(out, set_name, False, reference)
            found = scan_handout(out, reference, exercises, answers)
            problems += [f"handout {set_name}: {p}" for p in found]
            problems += few_tests(scheme(mapping, exercises, True), f"handout {set_name}")
            saved = __import__("json").loads(read(os.path.join(out, MAP_FILE)))
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
                if set_name == "all":
                    problems += agree(grader, reference, official)
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


def agree(grader, reference: str, official: dict) -> list:
    """Each plant's own exercise: a mistake costs points in a handout and officially, a correct
    variant none in either. The points themselves may differ: the official set
    (tests/test_official.py) counts more tests and finds mistakes at every seed that the
    students' tests/test_hidden.py finds only partly at seed 0 (test_score's table)."""
    problems = []
    print("each plant's own exercise, official grade against a handout's (set all):")
    for k, what, edits, kind in plants()[:-1]:
        if what not in official:
            continue
        row, = grader.grade(apply_edits(reference, edits), f"{what}.py", only=[k])
        mine = next(r for r in official[what] if r["k"] == k)
        print(f"  {what!r:50} exercise {k}: official {mine['points']:g} "
              f"({mine['passed']}/{mine['total']}), handout {row['points']:g} "
              f"({row['passed']}/{row['total']})")
        if (row["points"] < row["max"]) != (mine["points"] < mine["max"]):
            problems.append(f"{what!r}: exercise {k} gets {row['points']} in a handout and "
                            f"{mine['points']} officially")
    return problems
