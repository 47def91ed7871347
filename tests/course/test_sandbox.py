"""The grader's isolation and limits (issue 42): each attack, written from its description, gets
no more than its base (a blank: 0) from `grade-all`, `grade PATH` and the bundle; classmates keep
their grades; nothing crashes or hangs. One class run holds most of the attacks.

Needs bubblewrap (bwrap) that can run here. The run as an ordinary user (`tester`: grade-all,
grade PATH and the bundle; graded_as_tester) runs in tests/course/test_attacks.py, its class shared with
that file's attacks; it needs root and is skipped otherwise.
"""

import csv
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

from course import grading, source
from course.exercises import MISTAKES, SETS

ROOT = grading.ROOT
REFERENCE = grading.read(os.path.join(ROOT, "tokencredit.py"))
BASE = source.blank(REFERENCE, SETS["grpo"])  # a grpo handout's file: every attack's base
PLANT = next(m for m in MISTAKES if m[0] == 1)  # a planted mistake of exercise 1
PY = sys.executable
SEED = 20271
pytestmark = [pytest.mark.slow, pytest.mark.skipif(grading.find_sandbox() is None, reason="bwrap cannot run here")]

JUDGE = '''
import os as _os, stat as _stat, socket as _socket, struct as _struct, time as _time
def _judge():  # the child's line to the judge
    for _fd in range(3, 256):
        try:
            if _stat.S_ISSOCK(_os.fstat(_fd).st_mode):
                return _socket.socket(fileno=_fd)
        except OSError:
            pass
'''


def fill(path: str, n: int) -> str:
    """An attack that writes n files of 15 MB (under the per-file limit) at path.format(i) and
    says how much it wrote."""
    return f'''
_n = 0
for _i in range({n}):
    try:
        with open(f"{path}", "wb") as _f:
            _f.write(b"0" * (15 << 20))
        _n += 15 << 20
    except OSError:
        break
raise ValueError(f"wrote {{_n}} bytes")
'''


SYS_EXIT = {"x86_64": 60, "aarch64": 93}.get(platform.machine(), 60)
ATTACKS = {  # name: what is added to BASE
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


IN_EXERCISE_1 = """
import linecache as _lc
if 'NotImplementedError("exercise 1:' in "".join((_lc.cache.get("reference.py") or (0, 0, []))[2]):
"""


def in_exercise_1(code: str) -> str:
    """code run in exercise 1's job only (its copy of the reference has exercise 1 blank): each
    sandbox has its own limits, so the same attack in the other exercises' jobs tries nothing
    more, and takes their time."""
    return IN_EXERCISE_1 + textwrap.indent(code, "    ")


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
CORRECT = REFERENCE.replace(  # correct, and not the reference's file byte for byte
    "\ndef group_advantages(", "\n_differs = 1\n\n\ndef group_advantages(")


def run(*args, timeout=900, **kwargs):
    return subprocess.run([PY, "-m", "course", *map(str, args)], cwd=kwargs.pop("cwd", ROOT),
                          capture_output=True, timeout=timeout, **kwargs)


def write_class(folder, classmates=True, attacks=tuple(ATTACKS)) -> dict:
    """The class: the attacks, the file-name tricks, and classmates graded after them."""
    folder.mkdir()
    for name in attacks:
        (folder / f"{name}.py").write_text(BASE + ATTACKS[name])
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


def rows_of(csv_path) -> dict:
    with open(csv_path, encoding="utf-8") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    """One grade-all of the whole class, as root (or as whoever runs the tests)."""
    tmp = tmp_path_factory.mktemp("class")
    before = write_class(tmp / "class")
    started = time.monotonic()
    done = run("grade-all", tmp / "class", "--set", "grpo", "--seed", SEED,
               "--csv", tmp / "grades.csv", "--gradescope-dir", tmp / "out" / "gs")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    time.sleep(1)  # a leftover would act now
    yield tmp, before, rows_of(tmp / "grades.csv"), took, done.stdout.decode()
    subprocess.run(["rm", "-rf", str(tmp / "class" / "b-deep")])  # too deep for shutil.rmtree


def test_classmates_keep_their_grades_and_every_attack_gets_nothing(klass):
    tmp, before, rows, _, said = klass
    assert "sandbox: bubblewrap" in said
    after = {p.name: p.read_bytes() for p in (tmp / "class").iterdir() if p.name in before}
    assert after == before  # no classmate's file blanked
    assert rows["zz-correct"]["total"] == "30.00", rows["zz-correct"]
    assert rows["zz-blank"]["total"] == "0.00"
    assert rows["zz-plant"]["total"] == "23.00"  # the plant costs its own exercise, no more
    for name in ATTACKS:
        assert rows[name]["total"] == "0.00", rows[name]
        assert rows[name]["sandbox"] == "bubblewrap"


def test_answers_that_dribble_balloon_or_fill_the_disk_are_cut(klass):
    tmp, _, rows, took, _ = klass
    assert "time limit" in rows["a-dribble"]["notes"], rows["a-dribble"]["notes"]
    assert "output size limit" in rows["a-json"]["notes"], rows["a-json"]["notes"]
    wrote = int(rows["a-files"]["notes"].split("wrote ")[1].split(" bytes")[0])
    assert wrote <= grading.LIMITS["disk_mb"] << 20, wrote  # not 64 x 15 MB
    assert "\\udc80" in open(tmp / "out" / "gs" / "a-surrogate" / "results.json").read()
    assert took < 600


def test_file_names_in_a_class_give_one_safe_row_each(klass):
    tmp, _, rows, _, _ = klass
    assert "not a regular file" in rows["b-fifo"]["notes"]
    assert "folders deep" in rows["b-deep"]["notes"]
    assert [n for n in rows if "bob" in n] == ["b-bob"]  # one row, refused whole
    assert rows["b-bob"]["total"] == "0.00" and "both handed in" in rows["b-bob"]["notes"]
    assert rows["b-caf\\udce9"]["total"] == "0.00"  # its bytes, escaped
    assert rows["'=2+3"]["total"] == "0.00"  # a name, not a formula
    for link in ("b-link", "b-linkdir"):  # a link to a classmate's correct file
        assert rows[link]["total"] == "0.00" and "symbolic link" in rows[link]["notes"], link
    assert not (tmp / "out" / "results.json").exists()  # `...py` stays inside OUT
    assert (tmp / "out" / "gs" / "%2E.." / "results.json").exists()
    assert (tmp / "out" / "gs" / "b-caf%E9" / "results.json").exists()


def test_grade_path_refuses_or_cuts_each_file_attack(tmp_path):
    (tmp_path / "zz-correct.py").write_text(REFERENCE)
    tricks(tmp_path)
    for name in ("b-fifo.py", "b-deep", "b-link.py"):
        done = run("grade", tmp_path / name, "--set", "grpo", timeout=60)
        assert done.returncode == 0 and b"total 0.0/30" in done.stdout, (name, done)
    subprocess.run(["rm", "-rf", str(tmp_path / "b-deep")])
    (tmp_path / "s.py").write_text(BASE + ATTACKS["a-surrogate"])
    done = run("grade", tmp_path / "s.py", "--set", "grpo", "-e", "1", "--seed", SEED)
    assert done.returncode == 0 and b"0.0/10" in done.stdout and b"\\udc80" in done.stdout, done
    assert b"\\r\\x1b[1A" in done.stdout and not re.search(b"[\r\x1b]", done.stdout), done
    (tmp_path / "d.py").write_text(BASE + ATTACKS["a-dribble"])
    started = time.monotonic()
    done = run("grade", tmp_path / "d.py", "--set", "grpo", "-e", "1", "--time-limit", 20)
    assert done.returncode == 0 and b"0.0/10" in done.stdout, done
    assert time.monotonic() - started < 80  # cut at the exercise's 20 s, not one byte per 5 s


def test_the_bundle_refuses_or_cuts_each_file_attack(tmp_path):
    assert run("gradescope", tmp_path / "ag.zip", "--set", "grpo", "--seed", SEED).returncode == 0
    root = tmp_path / "ag"
    with zipfile.ZipFile(tmp_path / "ag.zip") as z:
        z.extractall(root / "source")
    assert "bubblewrap" in (root / "source" / "setup.sh").read_text()

    def bundle(make) -> dict:
        shutil.rmtree(root / "submission", ignore_errors=True)
        (root / "submission").mkdir()
        make(root / "submission" / "tokencredit.py")
        done = subprocess.run(["bash", root / "source" / "run_autograder"], capture_output=True,
                              env=dict(os.environ, AUTOGRADER_ROOT=root, PYTHON=PY), timeout=600)
        assert done.returncode == 0, done
        return json.loads((root / "results" / "results.json").read_text())
    assert bundle(os.mkfifo)["score"] == 0
    assert bundle(lambda p: p.symlink_to(os.path.join(ROOT, "tokencredit.py")))["score"] == 0
    got = bundle(lambda p: p.write_text(BASE + ATTACKS["a-surrogate"]))
    assert got["score"] == 0 and "\\udc80" in json.dumps(got)


def descendants(pid: int) -> list:
    """pid's descendants now, with their command lines, as the host sees them."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            with open(f"/proc/{parent}/cmdline", "rb") as f:
                out += [(parent, f.read().split(b"\0"))] if parent != pid else []
        except OSError:
            continue  # gone meanwhile
    return out


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
    (root to become it). tests/course/test_attacks.py's test_as_an_ordinary_user_too runs this, with its
    own attacks in the same class (more: {file name: text}; options: grade-all's, its memory
    limit): one grade-all as tester for both files. The class's rows."""
    kit = tmp_path / "kit"  # the course kit where tester can read it, with its cached map
    (kit / "tests" / "course").mkdir(parents=True)
    for name in ("course", ".course-cache"):
        shutil.copytree(os.path.join(ROOT, name), kit / name)
    for name in (grading.OFFICIAL, "tokencredit.py", "test_tokencredit.py"):
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
    (root / "submission" / "tokencredit.py").write_text(BASE + ATTACKS["a-zombie"])
    for path in [root, *root.rglob("*")]:
        os.lchown(path, tester.pw_uid, tester.pw_gid)
    done = as_tester(["/usr/bin/env", f"AUTOGRADER_ROOT={root}", f"PYTHON={PY}", "bash",
                      str(root / "source" / "run_autograder")], kit)
    assert done.returncode == 0 and b"sandbox: bubblewrap" in done.stdout, done
    assert json.loads((root / "results" / "results.json").read_text())["score"] == 0, done
    return rows


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
