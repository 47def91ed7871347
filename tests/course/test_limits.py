"""Limits: what a submission may use (time, memory, disk, files, processes, the size of what it
sends) and what the grader's own work on it may cost (the judge's, the driver's). A submission
past one gets 0 for the exercise and its row names the limit; no submission stops the class or
costs a classmate anything. Most attacks sit in the class `attacked` (classes.py), graded once
with --memory-limit MEMORY_MB.

Needs bubblewrap (bwrap) that can run here.
"""

import json
import pathlib
import time

import pytest

from classes import CRASHES, DRIVER_ATTACKS, LIMIT_ATTACKS, LONG, MEMORY_MB, ONCE, number_in
from course import grading
from course.flags import scan
from submissions import (BASE, SANDBOX, SEED, code_tests, grade, grade_path, needs_bwrap, run,
                         run_bundle)

pytestmark = [pytest.mark.slow, needs_bwrap]
JUDGE_MB = 640  # the most RSS a judge may reach (it starts at ~180 MB, peaks at ~330)


def test_answers_that_dribble_balloon_or_fill_the_disk_are_cut(klass):
    tmp, _, rows, took, _ = klass
    assert "time limit" in rows["a-dribble"]["notes"], rows["a-dribble"]["notes"]
    assert "output size limit" in rows["a-json"]["notes"], rows["a-json"]["notes"]
    wrote = int(rows["a-files"]["notes"].split("wrote ")[1].split(" bytes")[0])
    assert wrote <= grading.LIMITS["disk_mb"] << 20, wrote  # not 64 x 15 MB
    assert "\\udc80" in open(tmp / "out" / "gs" / "a-surrogate" / "results.json").read()
    assert took < 600


def test_classmates_keep_their_grades(attacked):
    rows = attacked["rows"]
    assert rows["zz-correct"]["total"] == "30.00" and rows["zz-blank"]["total"] == "0.00"
    assert all(rows[name]["total"] == "0.00" for name in LIMIT_ATTACKS)


def test_each_attack_run_once_ran_in_exercise_1(attacked):
    """ONCE's attacks ran (in exercise 1, and there only): the tests on their rows see them."""
    for name in ONCE:
        said = attacked["rows"][name]["notes"].split("; exercise 3:")[0]
        assert said.startswith("exercise 1:") and any(
            word in said for word in ("memory limit", "wrote", "held", "made")), (name, said)
        assert "limit" not in attacked["rows"][name]["notes"].split("; exercise 3:", 1)[-1]


def test_dev_is_not_a_second_disk_past_the_disk_limit(attacked):
    """bwrap's --dev is a writable tmpfs (half the host's RAM): 300 MB were written there."""
    wrote = number_in(attacked["rows"]["a-devshm"]["notes"], "wrote")
    assert wrote <= grading.LIMITS["disk_mb"] << 20, wrote


PER_PROCESS = pytest.mark.xfail(not SANDBOX["cgroup"], strict=True, reason=(
    "no memory cgroup can be made here (an ordinary user, a read-only /sys/fs/cgroup): memory is "
    "limited per process (RLIMIT_AS) only; docs/instructors.md says so"))


def held(row) -> int:
    """What the attack said it held (`held N bytes`), 0 where the memory limit stopped it."""
    return 0 if "memory limit" in row["notes"] else number_in(row["notes"], "held")


@PER_PROCESS
def test_memory_in_memfd_files_counts_against_the_memory_limit(attacked):
    """RLIMIT_AS counts mappings only: 720 MB held in memfds past a 512 MB limit."""
    assert held(attacked["rows"]["a-memfd"]) <= MEMORY_MB << 20, attacked["rows"]["a-memfd"]


@PER_PROCESS
def test_memory_of_a_submission_s_processes_counts_together(attacked):
    """4 processes of 300 MB each held 1.2 GB past a 512 MB limit (64 x 2 GB by default)."""
    assert held(attacked["rows"]["a-forkmem"]) <= MEMORY_MB << 20, attacked["rows"]["a-forkmem"]


@PER_PROCESS
def test_files_in_the_sandbox_count_against_the_memory_limit(attacked):
    """--size bounds a tmpfs's bytes, not its files: 483,000 empty files in 10 s, ~1 KB of kernel
    memory each, no end but the time. Counted in the sandbox's memory, they stop it."""
    assert "made" not in attacked["rows"]["a-inodes"]["notes"], attacked["rows"]["a-inodes"]


@pytest.mark.skipif(not SANDBOX["cgroup"], reason="no memory cgroup can be made here")
def test_each_sandbox_s_cgroup_goes_with_it(attacked):
    """grade-all made one cgroup per sandbox and left none behind."""
    assert b"its memory counted whole" in attacked["said"]
    left = pathlib.Path(SANDBOX["cgroup"]["folder"]).glob(f"course-{attacked['pid']}-*")
    assert not list(left)


def test_a_memory_bomb_from_grade_path_is_cut_by_the_memory_limit(cheats):
    tmp, sources = cheats
    text, _ = sources["a memory bomb"]
    (tmp / "a.py").write_text(text)
    got = grade_path(tmp / "a.py", tmp / "a.json", "--set", "grpo")
    assert all("memory limit" in t["output"] for t in code_tests(got)), got


OOM_ADJ = '''
def overlong_penalty(*args, **kwargs):
    raise ValueError("oom_score_adj=" + open("/proc/self/oom_score_adj").read().strip() + ";")
'''


def test_out_of_memory_the_kernel_kills_a_student_s_process_first(tmp_path):
    """The zygote made itself not dumpable, then wrote its oom_score_adj: a process not dumpable
    may not write its own /proc files, so the write failed, silently, and a student's process
    had 0, like the grader's."""
    said = grade(tmp_path, BASE + OOM_ADJ, "-e", "1")
    assert "oom_score_adj=1000;" in said, said


def test_the_judge_does_bounded_work_on_an_answer(attacked):
    """An 8 MB answer that broadcasts took a judge's fork from ~180 MB to ~1 GB (a 128 MB one:
    ~14 GB by extrapolation, not run), in a process with no limit. Without it the judges here
    peaked at 260-330 MB (530 with a-bigmsg's texts)."""
    assert attacked["most"] and max(attacked["most"].values()) < JUDGE_MB, attacked["most"]


def test_the_driver_keeps_a_bounded_text_per_student(attacked):
    """1.9 MB messages: the driver kept each whole in each failing test's text (443 MB for one
    student's `grade PATH`, kept to the end of a class)."""
    assert attacked["driver"] < 200, attacked["driver"]


def test_no_submission_stops_the_class(attacked):
    """RecursionError from the parser (flags.scan and Grader.grade's compile catch SyntaxError
    and ValueError only) or from the grader's own recursion over a tree that compiles
    (flags.text_of, ast.dump), a KeyError from score's LIMIT_NAMES str.format, and a name whose
    percent-quoted folder is over 255 bytes (ENAMETOOLONG, after every grade: only g.csv.tmp is
    left) each stopped grade-all: no CSV for anyone."""
    rows = attacked["rows"]  # the fixture asserts that grade-all ended well
    assert rows["zz-correct"]["total"] == "30.00" and rows["zz-blank"]["total"] == "0.00"
    assert all(rows[name]["total"] == "0.00" for name in CRASHES), rows
    assert rows[LONG]["total"] == "0.00"
    assert len(list((attacked["tmp"] / "gs").glob("*/results.json"))) == len(rows)


@pytest.mark.parametrize("name", sorted(CRASHES))
def test_grade_path_reports_a_crash_attack_as_a_row(tmp_path, name):
    (tmp_path / "c.py").write_text(BASE + CRASHES[name])
    done = run("grade", tmp_path / "c.py", "--set", "grpo", "-e", "1", "--seed", SEED,
               timeout=120)
    assert done.returncode == 0 and b"0.0/10" in done.stdout, done.stderr[-2000:]


def test_the_flag_scan_is_linear_in_a_chain_of_aliases():
    """Each alias of a module (`_t1 = _t0`) made the scan go over every assignment again: the
    chain of DRIVER_ATTACKS, 17,000 long, hung every route past 75 s. Half of it, then all of it:
    linear, the whole in seconds, and its last link's write is still the module's."""
    took = []
    for n in (8_500, 17_000):
        text = "import torch\n_t0 = torch\n" + "".join(f"_t{i + 1} = _t{i}\n" for i in range(n))
        started = time.process_time()
        flags = scan(text + f"_t{n}.equal = None\n")
        took.append(time.process_time() - started)
        assert flags == [f"line {n + 3}: writes an attribute of the module _t{n}"], flags
    assert took[1] < 10 and took[1] < 4 * took[0] + 1, took


@pytest.mark.parametrize("name", sorted(DRIVER_ATTACKS))
def test_the_driver_s_own_work_on_a_file_is_bounded_on_every_route(attacked, bundle, tmp_path,
                                                                   name):
    """The driver parsed, compiled and scanned a file before any sandbox, with no limit: each of
    DRIVER_ATTACKS hung grade PATH, grade-all and the bundle past 75 s (the driver at 452 MB).
    Now that work runs in a process of its own under grading.WORK, and each route ends: the file
    gets its base (0), and where a limit stopped the work, a line that says so."""
    _, root, _ = bundle
    said = "the grader's own work on it (parse, compile, flag scan) passed its limits"
    started = time.monotonic()
    printed = grade(tmp_path, BASE + DRIVER_ATTACKS[name], "--time-limit", 20)
    assert time.monotonic() - started < 75 and "total 0.0/30" in printed, printed[-3000:]
    row, got = attacked["rows"][name], run_bundle(root, BASE + DRIVER_ATTACKS[name])
    assert row["total"] == "0.00" and got["score"] == 0, (row, got)
    assert (said in printed) == (said in row["notes"]) == (said in json.dumps(got)) == (
        name == "w-finally"), (row["notes"], printed[-2000:])
