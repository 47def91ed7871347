"""The grader's failure is never a student's points (issue 53): an exercise whose sandbox dies
before the student's code is called is graded again in a fresh one; a second failure is a
"grader error", and the file gets no total until it is graded again. A student's own crash
still scores 0 as before. A grader's own exception on one file costs no other file anything.
"""

import json
import shutil

import pytest

from course import __main__ as course_main
from course import bundle, grading
from submissions import BASE, CORRECT, ROOT, SEED, needs_bwrap, rows_of

pytestmark = [pytest.mark.slow, needs_bwrap]

DOOMED = "\n# the test kills this file's sandboxes\n"
RAISES = "\n# the test raises a grader's own exception on this file\n"


class Killer:
    """Sandboxes killed once warm, before their job starts (the zygote gone, as the kernel's
    OOM killer or a refused fork would leave it): the first `first` of them, and every one of
    a file that holds DOOMED; `killed`: their pids."""

    def __init__(self, monkeypatch):
        self.first, self.killed = 0, []
        warm, run = grading.Driver.warm, grading.Driver.run

        def marked(driver, jobs):
            driver.doomed = any(DOOMED in job["student"] for job in jobs)
            return run(driver, jobs)

        def warm_then_kill(driver, box):
            warm(driver, box)
            if driver.doomed or len(self.killed) < self.first:
                self.killed.append(box["process"].pid)
                box["process"].kill()
                box["process"].wait()
        monkeypatch.setattr(grading.Driver, "run", marked)
        monkeypatch.setattr(grading.Driver, "warm", warm_then_kill)


def test_a_sandbox_that_dies_before_the_student_s_code_runs_is_graded_again(tmp_path, monkeypatch,
                                                                             capsys):
    """Each of the first two sandboxes dies before its zygote forks: both exercises run again
    in fresh sandboxes, and the file keeps its full marks."""
    (tmp_path / "a.py").write_text(CORRECT)
    killing = Killer(monkeypatch)
    killing.first = 2
    course_main.main(["grade", str(tmp_path / "a.py"), "--set", "grpo", "--seed", str(SEED)])
    said = capsys.readouterr().out
    assert len(killing.killed) == 2 and "total 30.0/30 points" in said, said


def test_a_second_failure_is_a_grader_error_and_the_file_gets_no_total(tmp_path, monkeypatch,
                                                                        capsys):
    """Every sandbox of b dies before its zygote forks, and handing out d's first sandbox raises
    (a grader's own exception in the middle of a file's batch left its jobs in the driver, once:
    the next classmates read them and got 0). Each of b's and d's exercises says "grader error"
    in the CSV, so do their totals; grade-all names them and fails; their classmates keep their
    grades; `grade PATH` prints no total either."""
    killing, give_box = Killer(monkeypatch), grading.Driver.give_box

    def raising(driver, worker):
        if RAISES in worker["job"]["student"]:
            raise KeyError("a grader's own failure")
        return give_box(driver, worker)
    monkeypatch.setattr(grading.Driver, "give_box", raising)
    (tmp_path / "class").mkdir()
    for name, text in (("a", CORRECT), ("b", CORRECT + DOOMED), ("c", BASE),
                       ("d", CORRECT + RAISES), ("e", CORRECT)):
        (tmp_path / "class" / f"{name}.py").write_text(text)
    with pytest.raises(SystemExit, match="a grader error on 2 files.*: b, d$"):
        course_main.main(["grade-all", str(tmp_path / "class"), "--set", "grpo", "--seed",
                          str(SEED), "--csv", str(tmp_path / "g.csv")])
    rows = rows_of(tmp_path / "g.csv")
    assert len(killing.killed) == 6  # b's three exercises, twice each
    assert {n: rows[n]["total"] for n in rows} == dict(
        a="30.00", b="grader error", c="0.00", d="grader error", e="30.00"), rows
    assert [rows["b"][f"exercise {k}"] for k in (1, 3, 5)] == ["grader error"] * 3
    assert rows["b"]["notes"].count("the zygote did not fork a child") == 3, rows["b"]["notes"]
    assert rows["d"]["notes"].count("grader error (KeyError") == 3, rows["d"]["notes"]
    capsys.readouterr()
    course_main.main(["grade", str(tmp_path / "class" / "b.py"), "--set", "grpo", "-e", "1"])
    said = capsys.readouterr().out
    assert "total: none, a grader error (exercise 1): grade the file again" in said, said


def test_the_bundle_writes_no_results_for_a_grader_error(tmp_path, monkeypatch):
    """The bundle's route (run_autograder's command, in this process, as a bundle of set grpo
    here): every sandbox of the file dies before its zygote forks; no results.json (Gradescope
    then says the autograder failed: regrade), and the command fails."""
    Killer(monkeypatch)
    (tmp_path / "kit").mkdir()
    (tmp_path / "kit" / grading.BUNDLE_FILE).write_text(json.dumps(dict(set="grpo", seed=SEED)))
    shutil.copy(f"{ROOT}/tokencredit.py", tmp_path / "kit")
    monkeypatch.setattr(bundle, "ROOT", str(tmp_path / "kit"))
    (tmp_path / "ag" / "submission").mkdir(parents=True)
    (tmp_path / "ag" / "submission" / "tokencredit.py").write_text(CORRECT + DOOMED)
    with pytest.raises(SystemExit, match="a grader error: no results.json"):
        bundle.cmd_autograde(str(tmp_path / "ag"))
    assert not (tmp_path / "ag" / "results" / "results.json").exists()

SIGNALS = """
import os as _os
for _n in range(1, 32):  # every signal to its zygote, the sandbox's pid 1
    try:
        _os.kill(1, _n)
    except OSError:
        pass
"""
SELF_KILL = """
import os as _os
_os.kill(_os.getpid(), 9)
"""


def test_a_student_s_own_crash_is_its_0_and_its_sandbox_ends_by_no_signal_of_its_own(tmp_path):
    """A sandbox that ends for no memory of its own is a grader error (its pid 1, the zygote,
    takes no signal from inside): a file that sends pid 1 every signal keeps its correct
    code's 30, with no grader error; one that kills its own process gets 0, as before."""
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "signals.py").write_text(CORRECT + SIGNALS)
    (tmp_path / "class" / "suicide.py").write_text(CORRECT + SELF_KILL)
    course_main.main(["grade-all", str(tmp_path / "class"), "--set", "grpo", "--seed",
                      str(SEED), "--csv", str(tmp_path / "g.csv")])
    rows = rows_of(tmp_path / "g.csv")
    assert rows["signals"]["total"] == "30.00", rows["signals"]
    assert rows["suicide"]["total"] == "0.00", rows["suicide"]
    assert rows["suicide"]["notes"].count("its process died (it was killed (SIGKILL))") == 3
