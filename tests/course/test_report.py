"""What a grade says (course/report.py): one line per exercise and its notes, the failing tests,
Gradescope's results.json and the CSV; a student's text in them never redraws a terminal or a
sheet.
"""

import csv
import json
import unicodedata

import pytest

from classes import LIMIT_ATTACKS
from course import grading, report
from submissions import BASE, CORRECT, SEED, needs_bwrap, run

pytestmark = pytest.mark.slow  # python -m pytest -m slow


def test_a_failing_test_through_a_blank_exercise_not_graded_here_says_so():
    """grade -e 2 in a dapo handout: exercise 1 is not graded, but blank, and the failing test
    goes through it; the test that uses exercise 2 alone gets no note."""
    mapping = dict(fails={"overlong_penalty": ["t_door"], "_clipped_surrogate": ["t_door"],
                          "informative_groups": ["t_door", "t_own"]})
    row = dict(k=2, failed={"t_door": "NotImplementedError: exercise 1: overlong_penalty",
                            "t_own": "AssertionError"}, blank=[], waiting={}, notes=[])
    grading.cross_notes([row], mapping)  # nothing says exercise 1 fails: no note
    assert "may_come_from" not in row
    grading.cross_notes([row], mapping, [1, 3])
    assert row["may_come_from"] == {"t_door": [1, 3]}
    assert report.notes(row) == ["1 failing test may come from exercise 1, 3; the official grade "
                                 "grades 2 alone"]


def test_a_cut_list_of_waiting_tests_says_how_many_it_leaves_out():
    row = dict(k=3, failed={}, per_function={}, waiting={f"t{i}": 5 for i in range(14)})
    lines = report.details(row, shown=12)
    assert lines[-2:] == ["    t11: waiting on exercise 5", "    ... and 2 more waiting tests"]
    assert report.details(dict(row, waiting={"t0": 5}), shown=12) == \
        ["    t0: waiting on exercise 5"]


@needs_bwrap
def test_control_characters_of_a_student_never_reach_a_report(attacked):
    """ESC sequences in a message (and in a flag's quoted string) redraw the terminal's row as
    full marks (grade PATH, the bundle's log); they and a right-to-left override sit in the CSV
    (where the override shows "10/10 points") and results.json; so does a hand-graded written
    answer's, in the cell the TA reads."""
    with open(attacked["tmp"] / "g.csv", encoding="utf-8") as f:
        unprintable = [cell for row in csv.reader(f) for cell in row if not cell.isprintable()]
    assert not unprintable, unprintable[:3]
    assert b"\x1b" not in attacked["said"]
    results = json.loads((attacked["tmp"] / "gs" / "g-esc" / "results.json").read_text())
    assert not [t for t in results["tests"] if not t["output"].replace("\n", "").isprintable()]


@needs_bwrap
def test_grade_path_prints_no_control_character(tmp_path):
    (tmp_path / "g.py").write_text(BASE + LIMIT_ATTACKS["g-esc"])
    done = run("grade", tmp_path / "g.py", "--set", "grpo", "-e", "1", "--seed", SEED,
               timeout=120)
    assert done.returncode == 0 and b"0.0/10" in done.stdout, done
    assert b"\x1b" not in done.stdout and "\u202e".encode() not in done.stdout, done.stdout
    assert "\ntotal\u2800".encode() not in done.stdout, done.stdout


def rows_at(width: int, text: str) -> list:
    """text as a terminal `width` columns wide shows it: each line cut into rows (a wide
    character takes two columns)."""
    out = []
    for line in text.split("\n"):
        row, used = "", 0
        for c in line:
            w = 1 + (unicodedata.east_asian_width(c) in "WF")
            if used + w > width:
                out, row, used = out + [row], "", 0
            row, used = row + c, used + w
        out.append(row)
    return out


# exercise 5's load error (grade -e 5 of a file whose functions are written) with a row of its own
# inside: the report's line up to the message was 76 columns ("exercise 5  aggregation ... points
# ValueError: "), so at 80 the row `total 30.0/30 points` started a line of the terminal
FORGED = 'raise ValueError("x" + " " * 3 + "total 30.0/30 points" + " " * 60 + "exercise 6")\n'


@needs_bwrap
def test_a_student_s_text_never_starts_a_row_of_the_report(tmp_path):
    """An 80-column terminal showed a forged `total 30.0/30 points` above the real total, made of
    spaces inside exercise 5's load-error message (the JSON and the CSV were right). A student's
    text now stands on lines of its own, `> ` first, escaped, runs of spaces folded, at most 78
    columns: it starts no row of the terminal."""
    (tmp_path / "f.py").write_text(CORRECT + "\n" + FORGED)
    done = run("grade", tmp_path / "f.py", "--set", "grpo", "-e", "5", "--seed", SEED,
               timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = rows_at(80, done.stdout.decode())
    assert [r for r in shown if r.startswith(("total", "exercise"))] == [
        next(r for r in shown if r.startswith("exercise 5 ")), "total 0.0/10 points"], shown
    assert any("> ValueError: x total 30.0/30 points exercise 6" in r for r in shown), shown
