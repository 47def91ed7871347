"""Kinds of attack that issue 42 does not name, tried against the grader that landed for it: each
test is written from its attack's description, and was red on the grader it was written against
(commit 8ac218e). One class run (`attacked`) holds most of them, the four that stopped a whole
grade-all among them; `grade PATH` runs, a bundle without a sandbox and a run as the ordinary user
`tester` check the rest. A student's code is BASE (the grpo handout's blank
file) plus the attack, unless said.

Needs bubblewrap (bwrap) that can run here; the run as `tester` needs root and is skipped
otherwise.
"""

import csv
import json
import os
import pathlib
import pwd
import shutil
import subprocess
import tempfile
import time
import unicodedata
import zipfile

import pytest

from course import grading
from course.flags import scan
from test_sandbox import (BASE, CORRECT, JUDGE, PY, ROOT, SEED, descendants, fill,
                          graded_as_tester, in_exercise_1, rows_of, run)

SANDBOX = grading.find_sandbox()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(SANDBOX is None, reason="bwrap cannot run here")]

MEMORY_MB = 512  # the class's --memory-limit
JUDGE_MB = 640  # the most RSS a judge may reach (it starts at ~180 MB, peaks at ~330)
ATTACKS = {  # name: what is added to BASE
    # /dev (bwrap's --dev: a tmpfs of half the host's memory) and /dev/shm written past the
    # disk limit, in files under the per-file limit; says how much it wrote
    "a-devshm": fill("/dev/shm/big{_i}", 20),
    # memory held in memfd files (written, never mapped: RLIMIT_AS does not see it), past the
    # memory limit; says how much it held
    "a-memfd": '''
import os as _os
_n, _fds = 0, []
for _i in range(48):
    try:
        _fd = _os.memfd_create(f"m{_i}")
        _os.write(_fd, b"0" * (15 << 20))
        _fds.append(_fd)
        _n += 15 << 20
    except OSError:
        break
raise ValueError(f"held {_n} bytes")
''',
    # 4 forked processes, each writing 300 MB (RLIMIT_AS is per process; 64 processes are
    # allowed), held at once; says how much once each has written its 300 MB or died (it waited
    # 10 s for a process the limit had killed)
    "a-forkmem": '''
import os as _os, select as _select, time as _time
_r, _w = _os.pipe()
_kids = []
for _i in range(4):
    _pid = _os.fork()
    if _pid == 0:
        try:
            _x = b"1" * (300 << 20)
            _os.write(_w, bytes([_i]))
            _time.sleep(5)
        finally:
            _os._exit(0)
    _kids.append(_pid)
_wrote, _dead, _end = set(), set(), _time.time() + 10  # each child once: wrote, or died
while len(_wrote | _dead) < len(_kids) and _time.time() < _end:
    if _select.select([_r], [], [], 0.1)[0]:
        _wrote |= {_kids[_b] for _b in _os.read(_r, len(_kids))}
    _dead |= {_p for _p in _kids if _p not in _dead and _os.waitpid(_p, _os.WNOHANG) != (0, 0)}
_alive = len(_kids) - len(_dead)  # none of them killed since: each writes, then sleeps 5 s
raise ValueError(f"held {_alive * (300 << 20)} bytes in {_alive} processes")
''',
    # empty files in /tmp (the size limit counts bytes, not files: each costs the kernel ~1 KB),
    # 2 M of them or 60 s, whichever comes first; says how many it made
    "a-inodes": '''
import os as _os, time as _time
_os.makedirs("/tmp/ino", exist_ok=True)
_n, _end = 0, _time.time() + 60
while _n < 1 << 21 and _time.time() < _end:
    _os.close(_os.open(f"/tmp/ino/{_os.getpid()}-{_n}", _os.O_CREAT | _os.O_WRONLY))
    _n += 1
raise ValueError(f"made {_n} files")
''',
    # an answer of shape (2**21, 1) that broadcasts against the expected (n,) in the judge's
    # comparison: 8 MB sent, the judge allocates ~1 GB
    "a-broadcast": '''
def overlong_penalty(lengths, max_len, cache_len):
    return torch.zeros(2 ** 21, 1)
''',
    # every exception reported with a message just under the 2 MB header limit
    "a-bigmsg": '''
import sys as _sys
def _raised(self, error):
    self.send(dict(op="raise", type="ValueError", message="x" * 1_900_000, where=[]))
_sys.modules["__main__"].Child.raised = _raised
''',
    # terminal escapes in an exception message (the row redrawn as full marks, the rest hidden)
    # and in a string the flag scan quotes (a "dunder" that is an escape)
    "g-esc": '''
_hidden = "__\\x1b[8m__"
_note = "sys.\\ntotal\\u280030.0/30\\u2800points"  # a flag's quoted string: a line of its own?
raise ValueError("\\x1b[2K\\x1b[1Gexercise 1  advantages  18/18 tests  10.0/10 points\\x1b[8m"
                 "\\u202e stniop 01/01")  # a right-to-left override: "10/10 points " in a sheet
''',
}
ROUTE = '''
if __file__ != "tokencredit.py":  # the name the bundle gives it
    raise ValueError("not graded as tokencredit.py")
'''
CRASHES = {  # each stopped a whole grade-all
    # a module-level expression 100,000 operators deep (200 KB): Python's parser raises
    # RecursionError
    "c-deep": "\n_x = 1" + "+1" * 100_000 + "\n",
    # a string of 1,500 additions: Python compiles it, but the flag scan's text_of and
    # ast.dump recurse past Python's limit (RecursionError)
    "c-walk": '\n_x = getattr(torch, "a"' + ' + "a"' * 1500 + ')\n',
    # the child reports a "limit" whose name is a format string
    "c-format": JUDGE + '''
import json as _json
_h = _json.dumps({"h": {"op": "limit", "which": "{grader}"}, "sizes": []}).encode()
_judge().sendall(_struct.pack("!II", len(_h), 0) + _h)
''',
}


LONG = "\u5f20\u4f1f" * 15  # a student's name of 30 CJK characters (90 bytes): 270 when quoted


ONCE = ("a-devshm", "a-memfd", "a-forkmem", "a-inodes")  # in exercise 1's job only: 3 runs of
# each, one per exercise, tried nothing more and took a minute


def attack_text(name: str) -> str:
    code = {**ATTACKS, **CRASHES}[name]
    return BASE + (in_exercise_1(code) if name in ONCE else code)


def write_attacks(folder, names) -> None:
    folder.mkdir()
    for name in names:
        (folder / f"{name}.py").write_text(attack_text(name))
    (folder / "zz-correct.py").write_text(CORRECT)
    (folder / "zz-blank.py").write_text(BASE)


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) >> 10


def judges(pid: int) -> list:
    """pid's descendants that run course.judge."""
    return [child for child, args in descendants(pid) if b"course.judge" in args]


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """One grade-all of the attacks, the crashes and two classmates, as root (or whoever runs the
    tests), with --memory-limit MEMORY_MB; the most RSS (MB) of each judge and of the driver."""
    tmp = tmp_path_factory.mktemp("attacked")
    write_attacks(tmp / "class", {**ATTACKS, **CRASHES})
    (tmp / "class" / f"{LONG}.py").write_text(BASE)
    for name in ("d-route-file.py", "d-route-dir/tokencredit.py"):  # the same bytes, twice
        (tmp / "class" / name).parent.mkdir(exist_ok=True)
        (tmp / "class" / name).write_text(CORRECT + ROUTE)
    (tmp / "class" / "g-written").mkdir()  # a hand-graded answer that reads reversed in a sheet
    (tmp / "class" / "g-written" / "tokencredit.py").write_text(BASE)
    (tmp / "class" / "g-written" / "written.txt").write_text(
        "lab4.what: \u202e.gnorw era srewsna lla\x1b[8m\n")
    (tmp / "class" / "g-jos\u00e9.py").write_text(BASE)  # NFC
    (tmp / "class" / "g-jose\u0301.py").write_text(CORRECT)  # NFD: looks the same
    most, driver = {}, 0
    with open(tmp / "said", "wb") as said:
        grading_all = subprocess.Popen(
            [PY, "-m", "course", "grade-all", tmp / "class", "--set", "grpo", "--seed",
             str(SEED), "--memory-limit", str(MEMORY_MB), "--csv", tmp / "g.csv",
             "--gradescope-dir", tmp / "gs"], cwd=ROOT, stdout=said, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 900
            while grading_all.poll() is None and time.monotonic() < deadline:
                try:
                    driver = max(driver, rss_mb(grading_all.pid))
                    for pid in judges(grading_all.pid):
                        most[pid] = max(most.get(pid, 0), rss_mb(pid))
                except (OSError, StopIteration):
                    pass
                time.sleep(0.1)
        finally:
            grading_all.kill()
            grading_all.wait()
    assert grading_all.returncode == 0, (tmp / "said").read_text()
    yield dict(tmp=tmp, rows=rows_of(tmp / "g.csv"), said=(tmp / "said").read_bytes(),
               most=most, driver=driver, pid=grading_all.pid)


def number_in(notes: str, word: str) -> int:
    """The largest number the attack said (`wrote N bytes`, `held N bytes`, `made N files`)."""
    found = [int(x.split()[0]) for x in notes.split(f"{word} ")[1:]]
    assert found, notes
    return max(found)


def test_classmates_keep_their_grades(attacked):
    rows = attacked["rows"]
    assert rows["zz-correct"]["total"] == "30.00" and rows["zz-blank"]["total"] == "0.00"
    assert all(rows[name]["total"] == "0.00" for name in ATTACKS)


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


def test_the_judge_does_bounded_work_on_an_answer(attacked):
    """An 8 MB answer that broadcasts took a judge's fork from ~180 MB to ~1 GB (a 128 MB one:
    ~14 GB by extrapolation, not run), in a process with no limit. Without it the judges here
    peaked at 260-330 MB (530 with a-bigmsg's texts)."""
    assert attacked["most"] and max(attacked["most"].values()) < JUDGE_MB, attacked["most"]


def test_the_driver_keeps_a_bounded_text_per_student(attacked):
    """1.9 MB messages: the driver kept each whole in each failing test's text (443 MB for one
    student's `grade PATH`, kept to the end of a class)."""
    assert attacked["driver"] < 200, attacked["driver"]


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


def test_grade_path_prints_no_control_character(tmp_path):
    (tmp_path / "g.py").write_text(BASE + ATTACKS["g-esc"])
    done = run("grade", tmp_path / "g.py", "--set", "grpo", "-e", "1", "--seed", SEED,
               timeout=120)
    assert done.returncode == 0 and b"0.0/10" in done.stdout, done
    assert b"\x1b" not in done.stdout and "\u202e".encode() not in done.stdout, done.stdout
    assert "\ntotal\u2800".encode() not in done.stdout, done.stdout


def test_a_file_gets_one_score_whatever_its_name(attacked):
    """The module sees its label as __file__: its own name in grade-all (and grade PATH), but
    tokencredit.py in a folder and in the bundle; the same bytes got 0 and 30."""
    rows = attacked["rows"]
    assert rows["d-route-file"]["total"] == rows["d-route-dir"]["total"], (
        rows["d-route-file"]["notes"])


def test_names_that_look_the_same_get_rows_that_do_not(attacked):
    """`jos\\u00e9` and `jose\\u0301` printed the same in two rows, one 30 and one 0."""
    shown = [name for name in attacked["rows"] if name.startswith("g-jos")]
    assert len(shown) == 2
    assert len({unicodedata.normalize("NFC", name) for name in shown}) == 2, shown


# without a sandbox (a Gradescope image where bwrap cannot run): the grader is an ancestor of the
# student's process; write its results.json as full marks, then kill it before it writes its own
FORGE = '''
import os as _os, json as _json, signal as _signal
_p = _os.getpid()
while _p > 1:
    with open(f"/proc/{_p}/stat") as _f:
        _p = int(_f.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{_p}/cmdline", "rb") as _f:
        _cmd = _f.read().split(b"\\0")
    if b"autograde" in _cmd:
        _out = _cmd[_cmd.index(b"--root") + 1].decode() + "/results"
        _os.makedirs(_out, exist_ok=True)
        with open(_out + "/results.json", "w") as _f:
            _json.dump(dict(score=30.0, tests=[dict(name=f"exercise {_k}", score=10.0,
                                                    max_score=10.0) for _k in (1, 3, 5)]), _f)
        _os.kill(_p, _signal.SIGKILL)
'''


def test_the_bundle_grades_no_code_without_a_sandbox(tmp_path):
    """The bundle on an image where bwrap cannot run grades anyway (cmd_autograde), as the
    grader's user: a blank file wrote its own 30/30 results.json, without the "NO SANDBOX"
    line results.json is said to carry, and killed the grader."""
    assert run("gradescope", tmp_path / "ag.zip", "--set", "grpo", "--seed", SEED).returncode == 0
    root = tmp_path / "ag"
    with zipfile.ZipFile(tmp_path / "ag.zip") as z:
        z.extractall(root / "source")
    (root / "submission").mkdir()
    (root / "submission" / "tokencredit.py").write_text(BASE + FORGE)
    (tmp_path / "bin").mkdir()  # no bwrap on this PATH
    subprocess.run(["/bin/bash", root / "source" / "run_autograder"], capture_output=True,
                   env=dict(os.environ, AUTOGRADER_ROOT=root, PYTHON=PY,
                            PATH=str(tmp_path / "bin")), timeout=600)
    got = json.loads((root / "results" / "results.json").read_text())
    assert got["score"] == 0 and "NO SANDBOX" in got.get("output", ""), got


ENCODED = {  # a correct file as an editor may save it; Python imports each as it is
    "bom": b"\xef\xbb\xbf" + CORRECT.encode(),  # UTF-8 with a BOM (Windows Notepad)
    "latin-1": ("# -*- coding: latin-1 -*-\n# \u00e9tudiante: Ren\u00e9e\n"
                + CORRECT).encode("latin-1"),  # a coding cookie (PEP 263)
}


@pytest.mark.parametrize("how", sorted(ENCODED))
def test_a_file_python_reads_is_read_as_python_reads_it(tmp_path, how):
    """read_submission decodes UTF-8 strictly: a BOM stays and compile() refuses U+FEFF; a
    PEP 263 cookie is ignored and the bytes are refused. Python and pytest run both files."""
    (tmp_path / "tokencredit.py").write_bytes(ENCODED[how])
    python = subprocess.run([PY, "-c", "import tokencredit"], cwd=tmp_path, capture_output=True)
    assert python.returncode == 0, python.stderr
    done = run("grade", tmp_path / "tokencredit.py", "--set", "grpo", "-e", "1", "--seed", SEED,
               timeout=120)
    assert done.returncode == 0 and b"total 10.0/10" in done.stdout, done.stdout[-1500:]


def test_no_submission_stops_the_class(attacked):
    """RecursionError from the parser (flags.scan and Grader.grade's compile catch SyntaxError
    and ValueError only) or from the grader's own recursion over a tree that compiles
    (flags.text_of, ast.dump), a KeyError from score's LIMIT_NAMES str.format, and a name whose
    percent-quoted folder is over 255 bytes (ENAMETOOLONG, after every grade: only g.csv.tmp is
    left) each stopped grade-all: no CSV for anyone. (They were a class of their own: the class
    of the attacks grades them now, one grade-all and one pair of classmates fewer.)"""
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


def test_the_flag_scan_sees_native_code_and_files_reached_through_torch_and_numpy():
    """Unflagged today: native code loaded (torch.ops.load_library, numpy.ctypeslib: libc by
    ctypes), files read and written (torch.from_file, numpy.fromfile, torch.save, torch.load's
    pickle), the module's own name (__file__, route detection above)."""
    for line in ('torch.ops.load_library("/tmp/x.so")',
                 'numpy.ctypeslib.load_library("libc.so.6", "/lib")',
                 'torch.from_file("/proc/1/cmdline", size=10)',
                 'numpy.fromfile("/course/child.py", dtype=numpy.uint8)',
                 'torch.save(1, "/dev/shm/x")', 'torch.load("/tmp/x", weights_only=False)',
                 'x = __file__', 'import torch.utils.cpp_extension as ce',
                 'import numpy.ctypeslib as nc', 'numpy.lib.npyio.DataSource(None)',
                 'numpy.fromregex("/etc/hostname", "(.*)", [("x", "U9")])',
                 'numpy.lib.format.open_memmap("/tmp/x")', 'numpy.zeros(1).dump("/tmp/x")'):
        assert scan(f"import torch\nimport numpy\n{line}\n"), line


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare")
                    or not shutil.which("setpriv"), reason="needs root to become tester")
def test_as_an_ordinary_user_too():
    """As `tester`, in one class with test_sandbox's (graded_as_tester: issue 42's attacks, grade
    PATH and the bundle): /dev (a sandbox under the grader's own uid), beside memfd and forked
    memory (not limited: PER_PROCESS) and the format-string limit."""
    try:
        tester = pwd.getpwnam("tester")
    except KeyError:
        pytest.skip("no user tester")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="course-tester-"))  # pytest's is root's
    try:
        more = {f"{name}.py": attack_text(name)
                for name in ("a-devshm", "a-memfd", "a-forkmem", "c-format")}
        rows = graded_as_tester(tmp, tester, more, ["--memory-limit", str(MEMORY_MB)])
        assert number_in(rows["a-devshm"]["notes"], "wrote") <= grading.LIMITS["disk_mb"] << 20
    finally:
        shutil.rmtree(tmp)
