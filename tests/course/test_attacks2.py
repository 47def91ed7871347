"""A third round of attacks on the grader (course/), each a kind that tests/course/test_sandbox.py and
tests/course/test_attacks.py do not try: each test is written from its attack's description, and a test
here that fails is an attack that falls (the grader gives what it should not). A student's code is
BASE (the grpo handout's blank file) plus the attack, unless said; most run through
`grade PATH` (the same driver as grade-all and the bundle). Run alone: about 50 s under load.

Needs bubblewrap (bwrap) that can run here.
"""

import os
import platform
import signal
import time

import pytest

from course import grading, source
from test_sandbox import BASE, CORRECT, REFERENCE, SEED, rows_of, run

SANDBOX = grading.find_sandbox()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(SANDBOX is None, reason="bwrap cannot run here")]


def grade(tmp_path, text: str, *extra, name="a.py"):
    """grade PATH's stdout (set grpo, the fixed seed) for a file of this text."""
    (tmp_path / name).write_text(text)
    done = run("grade", tmp_path / name, "--set", "grpo", "--seed", SEED, *extra, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.decode()


# each function answers an empty tensor, (0, ..., 1): torch.allclose broadcasts it against any
# expected value to an empty comparison, which is "all close"
EMPTY = '''
def _empty(x):
    return torch.empty((0,) + tuple(x.shape[:-1]) + (1,), dtype=torch.float64)


def group_advantages(rewards, scale="std", eps=1e-6, baseline="mean"):
    return _empty(rewards)


def overlong_penalty(lengths, max_len, cache_len):
    return _empty(lengths)
'''


def test_an_empty_answer_is_not_all_close_to_every_expected_value(tmp_path):
    """An answer with no elements computes nothing; the judge's torch.allclose(got, expected)
    broadcast it to an empty comparison (True): 12 of 17 tests passed, group_advantages' hidden
    test among them, and it got 1.8 of 10 points."""
    said = grade(tmp_path, BASE + EMPTY, "-e", "1")
    assert "total 0.0/10" in said, said


HIDDEN_OS = {  # each reaches os (a flagged module) with no name, attribute or string the scan
    # flags: typing evaluates a string annotation with eval(), whatever code it holds; getattr
    # passed as a value, not called
    "hints": '''
import typing
def _f(x: "__import__('os').getcwd()"):
    pass
try:
    typing.get_type_hints(_f)
except (TypeError, SyntaxError) as _e:  # its message quotes what the code returned
    _said = str(_e)
def overlong_penalty(*args, **kwargs):
    raise ValueError("ran: " + _said)
''',
    "reduce": '''
import functools
_os = functools.reduce(getattr, ["o" + "s"], torch)
def overlong_penalty(*args, **kwargs):
    raise ValueError("ran: " + _os.getcwd())
''',
}


@pytest.mark.parametrize("how", sorted(HIDDEN_OS))
def test_code_that_reaches_os_is_flagged_however_it_is_spelt(tmp_path, how):
    """docs/instructors.md: code that reaches past the exercise (os, eval, ...) is flagged, and
    --strict gives it 0. These files ran os.getcwd() in the grader (their message says so) and
    were not flagged: graded as clean under --strict."""
    said = grade(tmp_path, BASE + HIDDEN_OS[how], "-e", "1", "--strict", "-v")
    assert "ran: " in said and "/tmp/" in said, said  # the attack ran
    assert "FLAGGED" in said, said


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


def test_a_hard_link_to_a_classmate_s_file_is_flagged_and_costs_the_classmate_nothing(tmp_path):
    """A symbolic link to a classmate's file is refused; a hard link (a tar can hold one) was
    read as the student's own: 10 of 10 for a folder that holds nothing of its own. Which of two
    names of one file is the owner's nothing says: both rows are flagged, and the classmate's
    keeps its points (with --strict both wait for review)."""
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "zz-correct.py").write_text(CORRECT)
    (tmp_path / "class" / "b-hard").mkdir()
    os.link(tmp_path / "class" / "zz-correct.py", tmp_path / "class" / "b-hard" / "tokencredit.py")
    done = run("grade-all", tmp_path / "class", "--set", "grpo", "--seed", SEED, "--csv",
               tmp_path / "g.csv", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = rows_of(tmp_path / "g.csv")
    assert rows["zz-correct"]["total"] == "30.00", rows
    assert "the same file as b-hard (a hard link)" in rows["zz-correct"]["flags"], rows
    assert "the same file as zz-correct (a hard link)" in rows["b-hard"]["flags"], rows


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


FORM = "1.std: 0.866\n1.none: 0.5\n1.loo: 0.667\n"


@pytest.mark.parametrize("saved", ["utf-8", "utf-8-sig", "utf-16"])
def test_a_written_form_saved_with_a_bom_keeps_its_answers(tmp_path, saved):
    """Windows Notepad saves UTF-8 with a byte order mark, or UTF-16 ("Unicode"): read_form
    kept the mark, the first line read as "\\ufeff1.std: 0.866", "not `id: answer`", and its
    right answer got 0 (2 of 3); in UTF-16 every answer got 0."""
    from course import written
    (tmp_path / "written.txt").write_bytes(FORM.encode(saved))
    rows, problems = written.grade(written.form_of(str(tmp_path)), [1])
    assert sum(r["points"] or 0 for r in rows if r["id"] in ("1.std", "1.none", "1.loo")) == 3, (
        problems)


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


# exercise 1's child (one sandbox) holds the reference's exercise 3; exercise 3's child (the
# other sandbox, graded at the same time) reads it through POSIX record locks on a read-only file
# both see (torch's __init__.py, one inode): each lock's start offset carries 5 bytes, and F_GETLK
# answers the first lock of another process from any namespace
LOCKS = r'''
import ast as _ast, fcntl as _fcntl, linecache as _lc, os as _os, struct as _st, time as _time
_NAMES = ("_policy_gradient_surrogate", "_importance_ratio", "_clipped_surrogate")
_FLOCK = "hhqqi4x"  # struct flock, x86_64


def _lock(fd, cmd, kind, start):
    got = _fcntl.fcntl(fd, cmd, _st.pack(_FLOCK, kind, 0, start, 1 if cmd != _fcntl.F_GETLK
                                         else 0, 0))
    return _st.unpack(_FLOCK, got)


def _send(text):
    tree = _ast.parse(text)
    code = "\n\n".join(_ast.get_source_segment(text, n) for n in tree.body
                       if isinstance(n, _ast.FunctionDef) and n.name in _NAMES).encode()
    data = _st.pack("!I", len(code)) + code
    data += b"\0" * (-len(data) % 5)
    if _os.fork() == 0:
        _os.setsid()
        fd = _os.open(torch.__file__, _os.O_RDONLY)
        for i in range(len(data) // 5):
            _lock(fd, _fcntl.F_SETLK, _fcntl.F_RDLCK,
                  (i << 41) | int.from_bytes(data[5 * i:5 * i + 5], "big"))
        _time.sleep(15)
        _os._exit(0)


def _receive():
    fd = _os.open(torch.__file__, _os.O_RDONLY)
    end = _time.time() + 10  # the jobs run side by side: it comes within a second, or not
    while _time.time() < end:
        chunks, start = {}, 0
        while True:
            kind, _, at, _, _ = _lock(fd, _fcntl.F_GETLK, _fcntl.F_WRLCK, start)
            if kind == _fcntl.F_UNLCK:
                break
            chunks[at >> 41] = (at & (2 ** 40 - 1)).to_bytes(5, "big")
            start = at + 1
        data = b"".join(chunks[i] for i in range(len(chunks)) if i in chunks)
        if len(data) >= 4 and len(data) >= 4 + _st.unpack("!I", data[:4])[0]:
            return data[4:4 + _st.unpack("!I", data[:4])[0]].decode()
        _time.sleep(0.2)
    return None


_text = "".join((_lc.cache.get("reference.py") or (0, 0, []))[2])
if 'NotImplementedError("exercise 1:' in _text:  # exercise 1's child: the answer to 3 is here
    _send(_text)
elif 'NotImplementedError("exercise 3:' in _text:  # exercise 3's, in the other sandbox
    _got = _receive()
    if _got:
        exec(_got, globals())
'''


@pytest.mark.skipif(platform.machine() != "x86_64", reason="struct flock's layout is x86_64's")
def test_a_side_channel_between_two_jobs_is_flagged(tmp_path):
    """A sandbox per job, but a submission's jobs run two at once, on one machine, and each holds
    the reference's other exercises (it runs beside them): a lock's byte range on a file both
    read is seen from the other. Exercise 3, blank, ran the reference's exercise 3 sent by
    exercise 1's child: 10 of 10. Such channels (locks, the page cache, timing) are not closed
    (docs/instructors.md); what they need is flagged, and --strict gives 0."""
    said = grade(tmp_path, BASE + LOCKS, "--strict")
    assert "FLAGGED" in said and "total 0.0/30" in said, said


DRAW = '''
import random as _random, numpy as _np
def overlong_penalty(*args, **kwargs):
    raise ValueError(f"drew {_random.random()} {hash('tokencredit')} {torch.rand(1).item()} "
                     f"{_np.random.rand()}")
'''


def test_a_file_that_draws_draws_the_same_on_every_grade(tmp_path):
    """A child's random, numpy's and torch's generators and str's hash were seeded afresh by each
    process: a file whose answers depend on a draw, or on a set's order, could get other points
    on a regrade."""
    drawn = [grade(tmp_path, BASE + DRAW, "-e", "1").split("drew ")[1].split("\n")[0]
             for _ in range(2)]
    assert drawn[0] == drawn[1], drawn


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


def test_code_kept_in_a_string_statement_is_not_flagged():
    """Strings are scanned as code when they parse (an annotation typing would run), but a string
    that is a statement, as a docstring is, runs nothing: old code kept in one is no flag."""
    from course.flags import scan
    kept = '\n"""\nimport matplotlib.pyplot as plt\nprint(locals())\n"""\n'
    assert scan(CORRECT + kept) == []
