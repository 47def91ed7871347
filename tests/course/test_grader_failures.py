"""The grader's own failures: one on a file costs no other file anything, and says it is the
grader's.
"""

import pytest

from course import grading
from submissions import CORRECT, SEED, needs_bwrap, rows_of

pytestmark = [pytest.mark.slow, needs_bwrap]


def test_a_failure_of_the_grader_on_one_file_costs_no_other(tmp_path, monkeypatch):
    """A grader's own exception in the middle of a file's batch (here: handing out a sandbox)
    left its jobs in the driver: the next classmates' batches read them and got 0 (KeyError).
    The file gets 0 with a note, the others their points, and grade-all says so and fails."""
    from course import __main__ as course_main
    (tmp_path / "class").mkdir()
    for name in "abcd":
        (tmp_path / "class" / f"{name}.py").write_text(CORRECT)
    handed, give_box = [], grading.Driver.give_box

    def failing_once(self, worker):
        handed.append(worker)
        if len(handed) == 4:  # b's first job (a has three)
            raise RuntimeError("a grader's own failure")
        return give_box(self, worker)
    monkeypatch.setattr(grading.Driver, "give_box", failing_once)
    with pytest.raises(SystemExit, match="failed on 1 files"):
        course_main.main(["grade-all", str(tmp_path / "class"), "--set", "grpo", "--seed",
                          str(SEED), "--csv", str(tmp_path / "g.csv")])
    rows = rows_of(tmp_path / "g.csv")
    assert {name: rows[name]["total"] for name in "abcd"} == {
        "a": "30.00", "b": "0.00", "c": "30.00", "d": "30.00"}, rows
    assert "the grader failed on this file" in rows["b"]["notes"]
