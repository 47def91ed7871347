"""The classes of attacks that several of the course's test files read (not a test file:
conftest.py grades each once per session, and the test files import what each holds by name):

- `klass` (SANDBOX_ATTACKS, with file-name tricks and classmates): processes that reach past their
  own, answers that dribble or balloon, the disk filled, surrogates in a message;
- `attacked` (LIMIT_ATTACKS and CRASHES, with names that look alike, a long name, a file that
  reads its own name, a hand-graded answer that reads reversed): memory and disk past the limits,
  work the judge and the driver must bound, escapes in a report, files that stopped a whole class;
- BESIDE_ATTACKS, graded by a second run beside a class (test_concurrent_runs.py): processes
  that spin, the root and every mount written, kernel buffers filled, SIGSTOP, a sleeper whose
  processes keep each other waiting;
- `cheats` (attack_sources): submissions that try to write their own grade, the replay of a
  handout's stored outputs among them.

A student's code is BASE (the grpo handout's blank file) plus the attack, unless said.
"""

import json
import os
import platform
import re
import shutil
import subprocess
import zipfile

from course import grading, source
from course.exercises import MISTAKES, SETS, names
from submissions import (BASE, CORRECT, JUDGE, PLANT, PY, REFERENCE, ROOT, SANDBOX, SEED,
                         descendants, fill, in_exercise_1, rows_of, run)

# -----------------------------------------------------------------------------
# klass: processes that reach past their own, the protocol, the disk; file-name tricks


SYS_EXIT = {"x86_64": 60, "aarch64": 93}.get(platform.machine(), 60)


SANDBOX_ATTACKS = {  # name: what is added to BASE
    # a process that looks like a zombie (its main thread has exited) and kills every process
    # of its user it can, for 90 s
    "a-zombie": f'''
import os as _os, threading as _th, time as _time, ctypes as _ct, signal as _sig
if _os.fork() == 0:
    _os.setsid()
    def _killer():
        _end = _time.time() + 90
        while _time.time() < _end:
            try:
                _os.kill(-1, _sig.SIGKILL)
            except OSError:
                pass
            _time.sleep(0.02)
        _os._exit(0)
    _th.Thread(target=_killer).start()
    _ct.CDLL(None).syscall({SYS_EXIT}, 0)  # SYS_exit: this thread only
''',
    # a process left behind that kills every other Python it sees (the reference's check run)
    "a-leftover": '''
import os as _os, time as _time, signal as _sig
if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        _end = _time.time() + 90
        while _time.time() < _end:
            for _p in _os.listdir("/proc"):
                try:
                    if _p.isdigit() and int(_p) != _os.getpid() and \\
                            b"python" in open(f"/proc/{_p}/cmdline", "rb").read():
                        _os.kill(int(_p), _sig.SIGKILL)
                except OSError:
                    pass
            _time.sleep(0.05)
    _os._exit(0)
''',
    # grade-all's command line from /proc, then every classmate's file blanked
    "a-proc": '''
import os as _os
for _p in _os.listdir("/proc"):
    try:
        _args = open(f"/proc/{_p}/cmdline", "rb").read().split(b"\\0")
        _d = _args[_args.index(b"grade-all") + 1]
        for _n in _os.listdir(_d):
            with open(_os.path.join(_d, _n), "w") as _f:
                _f.write("")
    except (OSError, ValueError, IndexError):
        pass
''',
    # an answer announced as 4,000 bytes, then one byte every 5 s
    "a-dribble": JUDGE + '''
def group_advantages(*args, **kwargs):
    _s = _judge()
    _s.sendall(_struct.pack("!II", 4000, 0))
    for _ in range(200):
        _time.sleep(5)
        _s.sendall(b" ")
''',
    # 64 MB of JSON as one header
    "a-json": JUDGE + '''
_s = _judge()
_s.sendall(_struct.pack("!II", 64 << 20, 0) + b"[" + b"0," * (32 << 20 - 1) + b"0]")
''',
    # 64 files just under the 16 MB per-file limit; says how much it wrote
    "a-files": fill("big{_i}", 64),
    # an exception message with lone surrogates
    "a-surrogate": '''
def group_advantages(*args, **kwargs):
    raise ValueError("lone \\udc80 surrogate \\ud800\\r\\x1b[1A\\x1b[2Ktotal 30.0/30 points")
print("at load \\udcff")
''',
}


# forks without end (each process forks again at once) for 30 s; its own cap of 100 processes,
# should the process limit fail, keeps it from hurting the machine (a check and a fork race, so up
# to twice that); then says the most processes its sandbox's /proc showed; in exercise 1
FORK_BOMB = in_exercise_1('''
import os as _os, time as _time
def _count():
    return len([_p for _p in _os.listdir("/proc") if _p.isdigit()])
try:
    _leader = _os.fork()
except OSError:  # a later exercise in the same sandbox: the first one's bomb is still there
    _leader = 1
if _leader == 0:
    _os.setsid()  # out of the child's process group, which the judge kills
    _end = _time.time() + 30
    while _time.time() < _end:
        try:
            if _count() < 100:
                _os.fork()
                continue
        except OSError:
            pass
        _time.sleep(0.2)
    _os._exit(0)
_time.sleep(4)
_seen = max(_count() for _ in range(5) if not _time.sleep(0.2))
raise ValueError(f"saw {_seen} processes")
''')


def write_class(folder, classmates=True, attacks=tuple(SANDBOX_ATTACKS)) -> dict:
    """The class: the attacks, the file-name tricks, and classmates graded after them."""
    folder.mkdir()
    for name in attacks:
        (folder / f"{name}.py").write_text(BASE + SANDBOX_ATTACKS[name])
    if classmates:
        tricks(folder)
        (folder / "b-bob.py").write_text(REFERENCE)
        (folder / "b-bob").mkdir()
        (folder / "b-bob" / "tokencredit.py").write_text(REFERENCE)
        with open(os.path.join(os.fsencode(folder), b"b-caf\xe9.py"), "w") as f:
            f.write(BASE)
        (folder / "=2+3.py").write_text(BASE)
        (folder / "....py").write_text(BASE)
        (folder / "b-linkdir").mkdir()
        (folder / "b-linkdir" / "tokencredit.py").symlink_to(folder / "zz-correct.py")
    (folder / "zz-correct.py").write_text(CORRECT)
    (folder / "zz-blank.py").write_text(BASE)
    (folder / "zz-plant.py").write_text(source.apply_edits(REFERENCE, PLANT[2]))
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and
            not p.is_symlink() and p.name != "b-fifo.py"}


def tricks(folder) -> None:
    """A FIFO, a tree 1,100 levels deep and a link to a classmate's correct file."""
    os.mkfifo(folder / "b-fifo.py")
    deep = os.open(folder, os.O_RDONLY)
    for name in ["b-deep"] + ["d"] * 1100:  # tokencredit.py at its bottom
        os.mkdir(name, dir_fd=deep)
        inner = os.open(name, os.O_RDONLY, dir_fd=deep)
        os.close(deep)
        deep = inner
    with open(os.open("tokencredit.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=deep), "w") as f:
        f.write(REFERENCE)
    os.close(deep)
    (folder / "b-link.py").symlink_to(folder / "zz-correct.py")


def as_tester(command: list, home) -> subprocess.CompletedProcess:
    """command as the ordinary user `tester`, in a mount namespace where this Python (under
    /root here) is visible to it."""
    real = os.path.realpath(PY)
    script = ""
    if real.startswith("/root/"):
        keep = "/".join(real.split("/")[:3])  # /root/.pyenv, say
        script = (f"mkdir -p {home}/keep && mount --bind {keep} {home}/keep && "
                  f"mount -t tmpfs -o mode=755 tmpfs /root && mkdir -p {keep} && "
                  f"mount --move {home}/keep {keep} && ")
    script += "exec setpriv --reuid tester --regid tester --clear-groups " + " ".join(
        f"'{c}'" for c in command)
    return subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=home, capture_output=True,
                          timeout=900)


def graded_as_tester(tmp_path, tester, more: dict, options: list) -> dict:
    """An ordinary user grades in sandboxes too: grade-all, grade PATH and the bundle, as `tester`
    (root to become it). test_sandbox.py's test_as_an_ordinary_user_too runs this, with attacks of
    `attacked` in the same class (more: {file name: text}; options: grade-all's, its memory
    limit): one grade-all as tester for both. The class's rows."""
    kit = tmp_path / "kit"  # the course kit where tester can read it, with its cached map
    (kit / "tests" / "course").mkdir(parents=True)
    for name in ("course", ".course-cache"):
        shutil.copytree(os.path.join(ROOT, name), kit / name)
    for name in (grading.HIDDEN, "tokencredit.py", "test_tokencredit.py"):
        shutil.copy(os.path.join(ROOT, name), kit / name)
    attacks = ("a-zombie", "a-leftover", "a-proc")  # those that reach past their own process
    write_class(tmp_path / "class", classmates=False, attacks=attacks)
    (tmp_path / "class" / "a-bomb.py").write_text(BASE + FORK_BOMB)  # tester's uid, not root's
    for name, text in more.items():
        (tmp_path / "class" / name).write_text(text)
    before = {p.name: p.read_bytes() for p in (tmp_path / "class").iterdir() if p.is_file()}
    (tmp_path / "bin").mkdir()  # no bwrap on this PATH
    for path in [tmp_path, *tmp_path.rglob("*")]:
        os.lchown(path, tester.pw_uid, tester.pw_gid)
    grade_all = [PY, "-m", "course", "grade-all", str(tmp_path / "class"), "--set", "grpo",
                 "--seed", str(SEED), "--csv", str(tmp_path / "grades.csv"), *options]
    refused = as_tester(["/usr/bin/env", f"PATH={tmp_path / 'bin'}"] + grade_all, kit)
    assert refused.returncode != 0 and b"--no-sandbox-ok" in refused.stderr, refused
    done = as_tester(grade_all, kit)
    assert done.returncode == 0 and b"sandbox: bubblewrap" in done.stdout, done
    rows = rows_of(tmp_path / "grades.csv")
    assert rows["zz-correct"]["total"] == "30.00" and rows["zz-blank"]["total"] == "0.00"
    assert rows["zz-plant"]["total"] == "23.00"
    assert all(rows[name]["total"] == "0.00" for name in attacks + ("a-bomb",)), rows
    inside = [int(n) for n in re.findall(r"saw (\d+) processes", rows["a-bomb"]["notes"])]
    assert inside and max(inside) <= grading.LIMITS["processes"] + 3, rows["a-bomb"]["notes"]
    after = {p.name: p.read_bytes() for p in (tmp_path / "class").iterdir() if p.is_file()}
    assert after == before
    # grade PATH and the bundle, as tester: the bomb and the zombie get 0, the bomb held
    done = as_tester([PY, "-m", "course", "grade", str(tmp_path / "class" / "a-bomb.py"),
                      "--set", "grpo", "-e", "1"], kit)
    assert done.returncode == 0 and b"0.0/10" in done.stdout, done
    assert b"its own uid" not in done.stdout and b"sandbox: bubblewrap" in done.stdout, done
    inside = [int(n) for n in re.findall(rb"saw (\d+) processes", done.stdout)]
    assert inside and max(inside) <= grading.LIMITS["processes"] + 3, done.stdout
    assert run("gradescope", tmp_path / "ag.zip", "--set", "grpo").returncode == 0
    root = tmp_path / "ag"
    with zipfile.ZipFile(tmp_path / "ag.zip") as z:
        z.extractall(root / "source")
    (root / "submission").mkdir()
    (root / "submission" / "tokencredit.py").write_text(BASE + SANDBOX_ATTACKS["a-zombie"])
    for path in [root, *root.rglob("*")]:
        os.lchown(path, tester.pw_uid, tester.pw_gid)
    done = as_tester(["/usr/bin/env", f"AUTOGRADER_ROOT={root}", f"PYTHON={PY}", "bash",
                      str(root / "source" / "run_autograder")], kit)
    assert done.returncode == 0 and b"sandbox: bubblewrap" in done.stdout, done
    assert json.loads((root / "results" / "results.json").read_text())["score"] == 0, done
    return rows


# -----------------------------------------------------------------------------
# attacked: the limits, the judge's and the driver's work, escapes, crashes


MEMORY_MB = 512  # the class's --memory-limit


LIMIT_ATTACKS = {  # name: what is added to BASE
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


def nested_finally(functions: int, depth: int) -> str:
    """functions functions, each of depth try/finally, each in the finally of the one above:
    CPython compiles a finally body twice (on leaving normally, and on an exception), so the code
    of one function grows as 2 ** depth."""
    out = []
    for f in range(functions):
        out.append(f"def _f{f}():\n" + "".join(
            f"{'    ' * (d + 1)}try:\n{'    ' * (d + 2)}_x = {d}\n{'    ' * (d + 1)}finally:\n"
            for d in range(depth)) + f"{'    ' * (depth + 1)}_x = -1\n")
    return "\n\n" + "\n\n".join(out)


DRIVER_ATTACKS = {  # the driver's own work on a file, before any sandbox: each hung every route
    # past 75 s under --time-limit 20. 300 KB of chained aliases: the flag scan's alias loop
    # went over every assignment for each alias it found
    "w-aliases": "\n_t0 = torch\n" + "".join(f"_t{i + 1} = _t{i}\n" for i in range(17_000)),
    # 200 functions of 16 nested try/finally (430 KB): the driver's compile() grew per level
    "w-finally": nested_finally(200, 16),
}
LONG = "\u5f20\u4f1f" * 15  # a student's name of 30 CJK characters (90 bytes): 270 when quoted


ONCE = ("a-devshm", "a-memfd", "a-forkmem", "a-inodes")  # in exercise 1's job only: 3 runs of


def attack_text(name: str) -> str:
    code = {**LIMIT_ATTACKS, **CRASHES, **DRIVER_ATTACKS}[name]
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


def number_in(notes: str, word: str) -> int:
    """The largest number the attack said (`wrote N bytes`, `held N bytes`, `made N files`)."""
    found = [int(x.split()[0]) for x in notes.split(f"{word} ")[1:]]
    assert found, notes
    return max(found)


# -----------------------------------------------------------------------------
# beside: issue 53's five attacks and a-wait, graded by a second run beside a class

SPIN = '''
import os as _os
for _i in range(59):
    try:
        if _os.fork() == 0:
            _os.setsid()
            while True:
                pass
    except OSError:
        break
'''
BESIDE_ATTACKS = {  # name: what is added to BASE
    # 60 spinning processes per exercise, each a session of its own (an autogroup each)
    "a-spin": SPIN,
    # asleep while 59 processes of its own keep each other waiting for a CPU, as another run
    # would: the time limit counts their CPU time then (judge.Session.clock), not nothing
    "a-wait": SPIN + "import time as _t\n_t.sleep(10 ** 6)\n",
    # 300 MB written to the sandbox's root (bwrap's own tmpfs, before)
    "a-root": fill("/x{_i}", 20),
    # socket and pipe buffers up to the memory limit, kept by a process that stays
    "a-buffers": '''
import os as _os, socket as _so, fcntl as _fc, time as _t
_keep = []
try:
    for _i in range(100000):
        if _i % 2:
            _r, _w = _os.pipe()
            _fc.fcntl(_w, 1031, 1 << 20)  # F_SETPIPE_SZ: 1 MB
        else:
            _r, _w = (_s.detach() for _s in _so.socketpair())
        _keep += [_r, _w]
        _os.set_blocking(_w, False)
        try:
            while True:
                _os.write(_w, b"x" * 65536)
        except BlockingIOError:  # full
            pass
except OSError:  # out of descriptors, or of memory
    pass
if _os.fork() == 0:
    _t.sleep(600)
''',
    # writes to every mount it sees, past the disk limit
    "a-mounts": '''
_n = 0
for _m in [_l.split()[1] for _l in open("/proc/self/mounts")]:
    for _i in range(5):  # 75 MB a mount, in files under the file size limit
        try:
            with open(_m.rstrip("/") + f"/x{_i}", "wb") as _f:
                _f.write(b"0" * (15 << 20))
            _n += 15 << 20
        except OSError:
            break
raise ValueError(f"wrote {_n} bytes")
''',
    # SIGSTOP to every process it may signal, itself last
    "a-sigstop": '''
import os as _os, signal as _sig
try:
    _os.kill(-1, _sig.SIGSTOP)
except OSError:
    pass
_os.kill(_os.getpid(), _sig.SIGSTOP)
''',
}


# -----------------------------------------------------------------------------
# cheats: the attacks of issue 34, submissions that try to write their own grade


NAMES = [n for k in SETS["grpo"] for n in names(k)]


def attack_sources(tmp_path) -> dict:
    """{name: (source, the file it was built on, files beside it)}."""
    sign_flip = source.apply_edits(REFERENCE, MISTAKES[0][2])
    targets = [str(tmp_path / "grades.csv"), str(tmp_path / "bundle" / "results" / "results.json"),
               "/autograder/results/results.json"]
    cache = os.path.join(ROOT, ".course-cache")
    out = {
        "reference through sys.argv[0] and the grader's folder": (BASE + f'''
import os as _os, sys as _sys
_places = [_os.path.dirname(_os.path.abspath(_sys.argv[0])), _os.getcwd(),
           "/autograder/source", {ROOT!r}]
for _m in list(_sys.modules.values()):
    _places.append(_os.path.dirname(_os.path.dirname(getattr(_m, "__file__", None) or "/")))
for _p in _places:
    _c = _os.path.join(_p, "tokencredit.py")
    if _os.path.exists(_c):
        _s = open(_c).read()
        if "NotImplementedError(\\"exercise 1" not in _s:
            _ns = {{}}
            exec(compile(_s, _c, "exec"), _ns)
            for _n in {NAMES!r}:
                globals()[_n] = _ns[_n]
            break
''', BASE),
        "pytest's runtest replaced by a no-op": (BASE + '''
try:
    import _pytest.python
    _pytest.python.Function.runtest = lambda self: None
except Exception:
    pass
''', BASE),
        "the worker's result file written, then os._exit(0)": (BASE + f'''
import os, json
for _p in {targets!r} + ["out.json", "results.json"]:
    try:
        os.makedirs(os.path.dirname(_p) or ".", exist_ok=True)
        with open(_p, "w") as _f:
            json.dump(dict(score=80.0, tests=[]), _f)
    except Exception:
        pass
os._exit(0)
''', BASE),
        "a pytest plugin that marks every report passed": (BASE + '''
import gc, sys
class _Pass:
    def pytest_runtest_logreport(self, report):
        report.outcome = "passed"
for _o in gc.get_objects():
    if type(_o).__name__ == "PytestPluginManager":
        _o.register(_Pass())
_f = sys._getframe()
while _f is not None:
    _c = _f.f_locals.get("config")
    if _c is not None and hasattr(_c, "pluginmanager"):
        _c.pluginmanager.register(_Pass())
    _f = _f.f_back
''', BASE),
        "a detached child that rewrites the results afterwards": (BASE + f'''
import os, time, json
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for _ in range(300):
            time.sleep(0.02)
            for _p in {targets!r}:
                try:
                    with open(_p, "w") as _f:
                        _f.write(json.dumps(dict(score=80.0, tests=[])))
                except Exception:
                    pass
    os._exit(0)
''', BASE),
        "torch.allclose that always says True (on the sign flip)": (sign_flip + '''
import torch
torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
''', sign_flip),
        "the cached test map rewritten": (BASE + f'''
import os, json
try:
    for _n in os.listdir({cache!r}):
        _p = os.path.join({cache!r}, _n)
        os.chmod(_p, 0o600)
        with open(_p) as _f:
            _d = json.load(_f)
        _d["map"]["fails"] = {{k: [] for k in _d["map"]["fails"]}}
        with open(_p, "w") as _f:
            json.dump(_d, _f)
except Exception:
    pass
''', BASE),
        "a memory bomb": (BASE + '''
_hog = []
for _ in range(60):  # 6 GB at most, should the limit fail
    _hog.append(bytearray(10 ** 8))
''', BASE),
    }
    out["replayed handout outputs"] = (replay_attack(tmp_path), BASE)
    if SANDBOX is None:  # without a sandbox the student's code can read the grader's files
        for name in ("reference through sys.argv[0] and the grader's folder",
                     "the cached test map rewritten"):
            del out[name]
    return out


UNFLAGGED = {"a memory bomb"}  # every attack is flagged but this one: the memory limit stops it


RECORDER = '''
import atexit as _atexit, hashlib as _hashlib, json as _json
def _key(name, args, kwargs):
    def walk(x):
        if isinstance(x, torch.Tensor):
            d = x.detach().contiguous()
            return [str(d.dtype), list(d.shape), _hashlib.sha256(
                d.reshape(-1).view(torch.uint8).numpy().tobytes() if d.numel() else b"").hexdigest()]
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            return sorted([str(k), walk(v)] for k, v in x.items())
        return "callable" if callable(x) else repr(x)
    return _hashlib.sha256(_json.dumps([name, walk(list(args)), walk(kwargs)]).encode()).hexdigest()
'''


def replay_attack(tmp_path) -> str:
    """A perfect replay of a grpo handout's stored outputs: the reference's answer on exactly
    the inputs a handout's tests (fixed, and the hidden set at seed 0) pass, NotImplementedError
    on any other input. Recorded by running those tests on the reference."""
    work = tmp_path / "record"
    (work / "tests" / "course").mkdir(parents=True)
    record = RECORDER + f'''
_SEEN = set()
for _n in {NAMES!r}:
    def _wrapped(*a, _f=globals()[_n], _n=_n, **k):
        _SEEN.add(_key(_n, a, k))
        return _f(*a, **k)
    globals()[_n] = _wrapped
_atexit.register(lambda: _json.dump(sorted(_SEEN), open({str(work / "seen.json")!r}, "w")))
'''
    (work / "tokencredit.py").write_text(REFERENCE + record)
    for name in (grading.TESTS, grading.HIDDEN):
        (work / name).write_bytes(open(os.path.join(ROOT, name), "rb").read())
    subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", grading.TESTS,
                    grading.HIDDEN], cwd=work, capture_output=True,
                   env=dict(os.environ, TOKENCREDIT_SEED="0", PYTHONPATH=str(work)), timeout=600)
    seen = json.loads((work / "seen.json").read_text())
    assert len(seen) > 100
    return REFERENCE + RECORDER + f'''
_TABLE = set({seen!r})
for _n in {NAMES!r}:
    def _replayed(*a, _f=globals()[_n], _n=_n, **k):
        if _key(_n, a, k) not in _TABLE:
            raise NotImplementedError("no stored output for these inputs")
        return _f(*a, **k)
    globals()[_n] = _replayed
'''
