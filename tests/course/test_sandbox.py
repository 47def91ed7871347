"""Isolation (docs/instructors.md, "What the grader protects against"): what a submission's code
can reach from its sandbox. Classmates' files and processes, the grader and its judges, the
reference (installed where the grader's Python finds it, or beside another exercise), processes
that outlive the sandbox, the uid it runs as; and a run without a sandbox, refused unless told.
Each attack, written from its description, gets no more than its base (a blank: 0) from
grade-all, grade PATH and the bundle, as root and as the ordinary user `tester` (root to become
it, else skipped); classmates keep their grades; nothing crashes or hangs.

Needs bubblewrap (bwrap) that can run here.
"""

import json
import os
import pathlib
import platform
import pwd
import re
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
import zipfile

import pytest

from classes import (BESIDE_ATTACKS, FORK_BOMB, MEMORY_MB, SANDBOX_ATTACKS, attack_text,
                     graded_as_tester, number_in)
from course import grading
from submissions import (BASE, CORRECT, PY, REFERENCE, ROOT, SEED, descendants, grade,
                         needs_bwrap, rows_of, run)

pytestmark = [pytest.mark.slow, needs_bwrap]


def test_classmates_keep_their_grades_and_every_attack_gets_nothing(klass):
    tmp, before, rows, _, said = klass
    assert "sandbox: bubblewrap" in said
    after = {p.name: p.read_bytes() for p in (tmp / "class").iterdir() if p.name in before}
    assert after == before  # no classmate's file blanked
    assert rows["zz-correct"]["total"] == "30.00", rows["zz-correct"]
    assert rows["zz-blank"]["total"] == "0.00"
    assert rows["zz-plant"]["total"] == "23.00"  # the plant costs its own exercise, no more
    for name in SANDBOX_ATTACKS:
        assert rows[name]["total"] == "0.00", rows[name]
        assert rows[name]["sandbox"] == "bubblewrap"


def students_processes(pid: int) -> dict:
    """{(pid, start time): real uid} of pid's descendants that run the student's side (the
    zygotes, their children and all they fork: child.py's command line, not bwrap's or the one
    that starts it), as the host sees them."""
    out = {}
    for parent, args in descendants(pid):
        try:
            if b"/course/child.py" not in args or b"bwrap" in args:  # bwrap, and root's ENTER
                continue
            with open(f"/proc/{parent}/stat") as f:
                start = f.read().rsplit(")", 1)[1].split()[19]
            with open(f"/proc/{parent}/status") as f:
                uid = next(int(ln.split()[1]) for ln in f if ln.startswith("Uid:"))
            out[(parent, start)] = uid
        except (OSError, StopIteration, IndexError):
            continue  # gone meanwhile
    return out


def alive(process) -> bool:
    pid, start = process
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19] == start
    except OSError:
        return False


def test_a_fork_bomb_is_held_to_the_process_limit_and_its_uid_is_not_root(tmp_path):
    """A submission that forks without end stays within the process limit (RLIMIT_NPROC binds:
    its sandbox's user is not root outside), a correct classmate graded after it in the same
    grade-all keeps full marks, and none of its processes outlives the grade."""
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "a-bomb.py").write_text(BASE + FORK_BOMB)
    (tmp_path / "class" / "zz-correct.py").write_text(CORRECT)
    seen, most = {}, 0  # every student-side process seen; the most of one uid at once
    with open(tmp_path / "said", "wb") as said:
        grading_all = subprocess.Popen(
            [PY, "-m", "course", "grade-all", tmp_path / "class", "--set", "grpo", "--seed",
             str(SEED), "--csv", tmp_path / "g.csv"], cwd=ROOT, stdout=said,
            stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 900
            while grading_all.poll() is None and time.monotonic() < deadline:
                now = students_processes(grading_all.pid)
                seen.update(now)
                uids = list(now.values())
                most = max([most] + [uids.count(u) for u in set(uids)])
                time.sleep(0.25)
        finally:
            grading_all.kill()
            grading_all.wait()
    assert grading_all.returncode == 0, (tmp_path / "said").read_text()
    gone = time.monotonic() + 10  # killed with their sandboxes; a few seconds to exit, reaped
    while [p for p in seen if alive(p)] and time.monotonic() < gone:
        time.sleep(0.5)
    assert not [p for p in seen if alive(p)]
    rows = rows_of(tmp_path / "g.csv")
    assert rows["zz-correct"]["total"] == "30.00", rows["zz-correct"]
    assert rows["a-bomb"]["total"] == "0.00"
    inside = [int(n) for n in re.findall(r"saw (\d+) processes", rows["a-bomb"]["notes"])]
    # the limit binds the student's forks; the zygote's (one child per exercise, 3) do not count
    limit = grading.LIMITS["processes"] + 3
    assert inside and max(inside) <= limit, rows["a-bomb"]["notes"]  # its own cap is 100
    assert 40 <= most <= limit, most  # the host's count agrees: it forked, up to the limit
    uids = set(seen.values())
    assert uids and 0 not in uids, uids  # os.getuid() in the sandbox, seen from outside
    if os.geteuid() == 0:
        assert min(uids) >= grading.SANDBOX_UID, uids


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare")
                    or not shutil.which("setpriv"), reason="needs root to become tester")
def test_as_an_ordinary_user_too():
    """As `tester`, in one class with SANDBOX_ATTACKS' (graded_as_tester: those that reach past
    their own process, grade PATH and the bundle): /dev (a sandbox under the grader's own uid),
    beside memfd and forked memory (not limited: test_limits.PER_PROCESS), the format-string
    limit, the driver's own work (DRIVER_ATTACKS), and the root and every mount written
    (BESIDE_ATTACKS: / takes nothing, all the mounts together no more than the disk limit)."""
    try:
        tester = pwd.getpwnam("tester")
    except KeyError:
        pytest.skip("no user tester")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="course-tester-"))  # pytest's is root's
    try:
        more = {f"{name}.py": attack_text(name) for name in (
            "a-devshm", "a-memfd", "a-forkmem", "c-format", "w-aliases", "w-finally")}
        more |= {f"{name}.py": BASE + BESIDE_ATTACKS[name] for name in ("a-root", "a-mounts")}
        rows = graded_as_tester(tmp, tester, more, ["--memory-limit", str(MEMORY_MB)])
        assert number_in(rows["a-devshm"]["notes"], "wrote") <= grading.LIMITS["disk_mb"] << 20
        assert rows["w-aliases"]["total"] == rows["w-finally"]["total"] == "0.00", rows
        assert number_in(rows["a-root"]["notes"], "wrote") == 0, rows["a-root"]["notes"]
        assert 0 < number_in(rows["a-mounts"]["notes"], "wrote") <= grading.LIMITS["disk_mb"] << 20
    finally:
        shutil.rmtree(tmp)


# exercise 1's child holds the reference's code of every other exercise (linecache keeps
# reference.py's text); it leaves it in /tmp, which exercise 5's child, in the same sandbox,
# runs in place of the student's blank exercise 5. Written so that the flag scan sees nothing:
# the code is a string with spaces, run by typing's eval of an annotation
CARRY = '''
import typing
_CODE = """
import linecache, os
_text = linecache.cache.get("reference.py")
if _text and not os.path.exists("/tmp/r.py"):
    with open("/tmp/r.py", "w") as f:
        f.write("".join(_text[2]))
if os.path.exists("/tmp/r.py"):
    _g = {"__name__": "r"}
    exec(open("/tmp/r.py").read(), _g)
    for _n in ("_loss_denominators", "token_weights", "_aggregate", "policy_loss"):
        globals()[_n] = _g[_n]
"""
def _f(x: "exec(_CODE) or int"):
    pass
typing.get_type_hints(_f)
'''


def test_an_exercise_never_runs_the_reference_s_code_of_itself(tmp_path):
    """The child of exercise k gets the reference with exercise k blank, so that it cannot run
    the answer. Exercise 1's child saw exercise 5's answer and left it in its sandbox's /tmp;
    exercise 5's child, in the same sandbox, ran it: 10 of 10 for a blank exercise 5 (and 0 when
    graded alone, -e 5), with no flag."""
    said = grade(tmp_path, BASE + CARRY)
    assert "total 0.0/30" in said, said


# the sandbox's user may ptrace its own pid 1 (bwrap's init: same uid, dumpable, no seccomp): the
# child clears pid 1's parent-death signal (prctl(PR_SET_PDEATHSIG, 0), injected by ptrace),
# stops its zygote (which exits when its line closes) and leaves a process behind; killing bwrap
# then kills nothing inside. x86_64's registers.
SURVIVE = r'''
import ctypes as _ct, os as _os, signal as _sig
def _survive():
    libc = _ct.CDLL(None, use_errno=True)
    libc.ptrace.restype = _ct.c_long
    libc.ptrace.argtypes = [_ct.c_long, _ct.c_long, _ct.c_void_p, _ct.c_void_p]
    if libc.ptrace(16, 1, None, None) != 0:  # PTRACE_ATTACH to bwrap's init, pid 1
        return "no attach"
    _os.waitpid(1, 0x40000000)  # __WALL
    regs = (_ct.c_ulong * 27)()
    libc.ptrace(12, 1, None, _ct.byref(regs))  # GETREGS
    saved = (_ct.c_ulong * 27)(*regs)
    with open("/proc/1/mem", "rb", buffering=0) as f:
        f.seek(regs[16] - 2)
        at = f.read(2)
    if at != b"\x0f\x05":
        libc.ptrace(17, 1, None, None)
        return f"not in a syscall: {at!r}"
    regs[16] -= 2                     # rip: the syscall instruction
    regs[10], regs[14], regs[13] = 157, 1, 0  # prctl(PR_SET_PDEATHSIG, 0)
    regs[15] = 2 ** 64 - 1            # orig_rax -1: no restart
    libc.ptrace(13, 1, None, _ct.byref(regs))  # SETREGS
    libc.ptrace(9, 1, None, None)     # SINGLESTEP
    _os.waitpid(1, 0x40000000)
    libc.ptrace(12, 1, None, _ct.byref(regs))
    result = regs[10]
    libc.ptrace(13, 1, None, _ct.byref(saved))
    libc.ptrace(17, 1, None, None)    # DETACH
    if _os.fork() == 0:
        _os.setsid()
        if _os.fork() == 0:
            _os.execv("/usr/bin/sleep", ["sleep", "61.2345"])
        _os._exit(0)
    _os.kill(_os.getppid(), _sig.SIGSTOP)  # the zygote: it would exit when its line closes
    return f"prctl gave {result}"
_said = _survive()
def overlong_penalty(*args, **kwargs):
    raise ValueError(_said)
'''


LEFT = ["sleep", "61.2345"]  # the process it leaves, by its command line


def left_behind() -> list:
    """(pid, its parent) of each process SURVIVE left, as the host sees them."""
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] != [x.encode() for x in LEFT]:
                    continue
            with open(f"/proc/{p}/stat") as f:
                out.append((int(p), int(f.read().rsplit(")", 1)[1].split()[1])))
        except OSError:
            continue
    return out


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the attack's registers are x86_64's")
def test_no_process_of_a_submission_outlives_its_sandbox(tmp_path):
    """A sandbox is killed by killing bwrap: its init dies of its parent-death signal, and the
    PID namespace with it. The child ptraced that init (allowed: same uid, no Yama, no seccomp)
    and cleared the signal: its process was alive after grade PATH returned, its init and its
    stopped zygote too, outside any sandbox's kill (a CPU hog there slows every classmate after
    it: each test has 10 s of wall time)."""
    before = {pid for pid, _ in left_behind()}
    try:
        said = grade(tmp_path, BASE + SURVIVE, "-e", "1", "-v")  # "prctl gave 0": it ran
        time.sleep(3)
        assert not [p for p in left_behind() if p[0] not in before], said
    finally:
        for pid, parent in left_behind():
            if pid in before:
                continue
            try:  # this test's: its init (bwrap's) first, the PID namespace with it
                with open(f"/proc/{parent}/cmdline", "rb") as f:
                    victims = [parent, pid] if f.read().startswith(b"bwrap\0") else [pid]
                for victim in victims:
                    os.kill(victim, signal.SIGKILL)
            except OSError:
                pass


# the reference, read from wherever sys.path finds a tokencredit.py, and run: unflagged (the
# class patterns reach os, sys and exec)
FOUND = '''
match torch:
    case object(os=_o, sys=_s):
        pass
match _s.modules["built" + "ins"]:
    case object(exec=_run):
        pass
_g = {"__name__": "found"}
for _p in _s.path:
    if _o.path.isfile(_p + "/tokencredit.py"):
        _fd = _o.open(_p + "/tokencredit.py", 0)
        _run(_o.read(_fd, 1 << 20).decode(), _g)
        break
group_advantages, overlong_penalty = _g["group_advantages"], _g["overlong_penalty"]
_policy_gradient_surrogate = _g["_policy_gradient_surrogate"]
_importance_ratio, _clipped_surrogate = _g["_importance_ratio"], _g["_clipped_surrogate"]
_loss_denominators, token_weights = _g["_loss_denominators"], _g["token_weights"]
_aggregate, policy_loss = _g["_aggregate"], _g["policy_loss"]
'''


def test_the_reference_installed_in_the_grader_s_python_is_not_in_the_sandbox(tmp_path):
    """Each sandbox binds the grader's site-packages whole. Where tokencredit is installed there
    (`pip install .`, which docs/verl.md gives), a blank file read it and ran it: 30/30 under
    --strict, unflagged. Here a venv whose site-packages holds the reference (as pip installs
    it) and reaches this Python's packages by a .pth."""
    venv = tmp_path / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv",
                    "--without-pip", str(venv)], check=True, timeout=120)
    packages = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / \
        "site-packages"
    (packages / "tokencredit.py").write_text(REFERENCE)
    (packages / "zz-grader.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    (tmp_path / "a.py").write_text(BASE + FOUND)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "course", "grade",
                           str(tmp_path / "a.py"), "--set", "grpo", "--seed", str(SEED),
                           "--strict"], cwd=ROOT, capture_output=True, timeout=600)
    said = done.stdout.decode()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "total 0.0/30" in said, said


@needs_bwrap
def test_the_reference_installed_in_the_base_python_is_not_in_the_sandbox(tmp_path, monkeypatch):
    """sandbox_argv binds sys.base_prefix whole (the Python a venv was made from) and hides
    tokencredit* only in the site-packages this Python reads. A venv made from a Python where
    `pip install .` was run (the base's own site-packages, which the venv does not read) left
    the reference readable in every sandbox: `cat` printed it."""
    base = tmp_path / "base"
    site_dir = base / "lib" / "python3.11" / "site-packages"
    site_dir.mkdir(parents=True)
    (site_dir / "tokencredit.py").write_text("ANSWERS = 42\n")
    monkeypatch.setattr(sys, "base_prefix", str(base))
    code = tmp_path / "code"
    code.mkdir()
    argv = grading.sandbox_argv(str(code), 64)
    done = subprocess.run(argv + ["/bin/sh", "-c", f"cat {site_dir}/tokencredit.py"],
                          capture_output=True, text=True, timeout=60)
    assert "bwrap:" not in done.stderr, done.stderr  # the sandbox ran (the file reads as denied)
    assert "ANSWERS" not in done.stdout, done.stdout


def test_without_a_sandbox_grade_all_refuses_unless_told_and_says_so(tmp_path):
    (tmp_path / "bin").mkdir()  # no bwrap on the PATH
    bare = dict(os.environ, PATH=str(tmp_path / "bin"))
    small = tmp_path / "small"
    small.mkdir()
    (small / "blank.py").write_text(BASE)
    (small / "copy.py").write_text(REFERENCE)
    refused = run("grade-all", small, "--set", "grpo", "--csv", tmp_path / "g.csv", env=bare)
    assert refused.returncode != 0 and b"--no-sandbox-ok" in refused.stderr, refused
    done = run("grade-all", small, "--set", "grpo", "--csv", tmp_path / "g.csv",
               "--no-sandbox-ok", env=bare)
    assert done.returncode == 0 and b"NO SANDBOX" in done.stdout, done
    rows = rows_of(tmp_path / "g.csv")
    assert rows["blank"]["sandbox"] == "none" and rows["copy"]["total"] == "30.00"


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
