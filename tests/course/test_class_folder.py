"""What grade-all's walk of a class folder meets, and grade PATH's and the bundle's of one
submission: names (bytes not UTF-8, names that look alike, a formula, one too long, capitals, a
student with both a file and a folder), entries that are not regular files (a FIFO, a symbolic
link to a classmate's file, a hard link to it), trees too deep or closed to the grader. Each gets
one safe row and never a classmate's points, and the class gets its CSV.
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
import unicodedata
import zipfile

import pytest

from classes import SANDBOX_ATTACKS, tricks
from submissions import (BASE, CORRECT, PY, REFERENCE, ROOT, SEED, needs_bwrap, rows_of, run)

pytestmark = pytest.mark.slow  # python -m pytest -m slow


@needs_bwrap
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


@needs_bwrap
def test_names_that_look_the_same_get_rows_that_do_not(attacked):
    """`jos\\u00e9` and `jose\\u0301` printed the same in two rows, one 30 and one 0."""
    shown = [name for name in attacked["rows"] if name.startswith("g-jos")]
    assert len(shown) == 2
    assert len({unicodedata.normalize("NFC", name) for name in shown}) == 2, shown


@needs_bwrap
def test_a_long_name_not_in_utf_8_leaves_the_class_its_csv(tmp_path):
    """folder_of cuts a name that quotes past 200 characters and tells it apart by a hash of
    os.fsdecode(name), which holds surrogates where the bytes are not UTF-8: encoding it raised
    UnicodeEncodeError while the CSV was written, after every grade. 70 bytes of Latin-1 (a name
    from an old archiver, or a student's file name kept by the course's upload) and
    --gradescope-dir: no CSV for the class, only its .tmp."""
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "zz-correct.py").write_text(CORRECT)
    with open(os.path.join(os.fsencode(folder), b"\xe9" * 70 + b".py"), "w") as f:
        f.write(BASE)
    done = run("grade-all", folder, "--set", "grpo", "--seed", SEED, "--csv", tmp_path / "g.csv",
               "--gradescope-dir", tmp_path / "gs", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = rows_of(tmp_path / "g.csv")
    assert rows["zz-correct"]["total"] == "30.00", rows
    assert len(os.listdir(tmp_path / "gs")) == 2


def test_a_file_whose_extension_is_in_capitals_gets_a_row(tmp_path):
    """`carol.PY` (a name kept from another system) got no row at all: left out silently."""
    from course.submission import students_of
    (tmp_path / "carol.PY").write_text(CORRECT)
    (tmp_path / "notes.txt").write_text("not a submission")
    top = os.open(tmp_path, os.O_RDONLY)
    assert [(name, why) for name, _, why in students_of(top)] == [(b"carol", None)]
    os.close(top)


@needs_bwrap
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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become tester")
def test_a_folder_with_a_closed_subfolder_is_graded_or_refused_with_a_reason():
    """As an ordinary user, a folder that holds a correct tokencredit.py and a subfolder of mode
    000 (a tar keeps modes): reading it raised PermissionError, which grade PATH did not catch
    (a traceback), where grade-all and the bundle gave the file 0, and root grades it 30. Here
    read_student as `tester`: the file, or why it is not read."""
    from course.submission import read_student
    import pwd
    import shutil
    import tempfile
    try:
        tester = pwd.getpwnam("tester")
    except KeyError:
        pytest.skip("no user tester")
    folder = tempfile.mkdtemp(prefix="course-closed-")  # pytest's tmp_path is root's alone
    try:
        os.chmod(folder, 0o755)
        with open(os.path.join(folder, "tokencredit.py"), "w") as f:
            f.write(CORRECT)
        os.mkdir(os.path.join(folder, "closed"), 0o000)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: tester, then read_student; says how it ended
            said = b"?"
            try:
                os.setgroups([])
                os.setgid(tester.pw_gid)
                os.setuid(tester.pw_uid)
                student = read_student(None, folder)
                said = b"found " + student["label"].encode() if "source" in student else \
                    b"refused: " + student["why"].encode()
            except BaseException as error:  # noqa: B902 -- what the test reports
                said = type(error).__name__.encode()
            finally:
                os.write(write, said)
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        said = os.read(read, 4096).decode()
        assert said.startswith(("found", "refused")), said
    finally:
        os.chmod(os.path.join(folder, "closed"), 0o755)
        shutil.rmtree(folder)


@needs_bwrap
def test_grade_path_refuses_or_cuts_each_file_attack(tmp_path):
    (tmp_path / "zz-correct.py").write_text(REFERENCE)
    tricks(tmp_path)
    for name in ("b-fifo.py", "b-deep", "b-link.py"):
        done = run("grade", tmp_path / name, "--set", "grpo", timeout=60)
        assert done.returncode == 0 and b"total 0.0/30" in done.stdout, (name, done)
    subprocess.run(["rm", "-rf", str(tmp_path / "b-deep")])
    (tmp_path / "s.py").write_text(BASE + SANDBOX_ATTACKS["a-surrogate"])
    done = run("grade", tmp_path / "s.py", "--set", "grpo", "-e", "1", "--seed", SEED)
    assert done.returncode == 0 and b"0.0/10" in done.stdout and b"\\udc80" in done.stdout, done
    assert b"\\r\\x1b[1A" in done.stdout and not re.search(b"[\r\x1b]", done.stdout), done
    (tmp_path / "d.py").write_text(BASE + SANDBOX_ATTACKS["a-dribble"])
    started = time.monotonic()
    done = run("grade", tmp_path / "d.py", "--set", "grpo", "-e", "1", "--time-limit", 20)
    assert done.returncode == 0 and b"0.0/10" in done.stdout, done
    assert time.monotonic() - started < 80  # cut at the exercise's 20 s, not one byte per 5 s


@needs_bwrap
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
    got = bundle(lambda p: p.write_text(BASE + SANDBOX_ATTACKS["a-surrogate"]))
    assert got["score"] == 0 and "\\udc80" in json.dumps(got)


# -----------------------------------------------------------------------------
# a class raced by its students: each can write in their own folder while grade-all runs. Each race
# is made deterministic by a hook on a call the reading makes (os.scandir, decode_source, a stat),
# which runs the student's swap right after that call returns

class Listing(list):
    """os.scandir's answer, read whole: a context manager, as scandir's iterator is."""

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def close(self):
        pass


def hooked(monkeypatch, owner, name: str, match, swap, before=False) -> list:
    """owner.name(...) runs as before, and the first time match(its arguments, its keywords, its
    answer) holds, swap() runs right after it returns (before: right before it is called, with
    no answer yet); the list it returns says whether it ran."""
    real, done = getattr(owner, name), []

    def hook(*args, **kwargs):
        if before and not done and match(args, kwargs, None):
            done.append(name)
            swap()
        out = real(*args, **kwargs)
        if name == "scandir":
            with out:
                out = Listing(out)
        if not before and not done and match(args, kwargs, out):
            done.append(name)
            swap()
        return out
    monkeypatch.setattr(owner, name, hook)
    return done


class Hung(BaseException):
    """The grader blocked: SIGALRM's, past the test's wait."""


CCC = BASE + "\n_mine = 1\n"  # a blank, told apart by its bytes


def raced_class(tmp_path, monkeypatch) -> tuple:
    """The class of the races, hooked: aaa (a blank) swaps its folder for a link to bbb's (correct,
    with a correct form) once the walk has listed it, right before its file is opened; ccc (a
    blank) does the same once its file is read; ddd (a blank with a correct form) swaps
    written.txt for a FIFO right after its check. (The class, a
    function that grades it in this process and returns {student: results.json}, and one that
    says which hooks ran.) A grade that blocks raises Hung after 240 s."""
    from course.__main__ import main
    from test_written import filled
    klass = tmp_path / "class"
    for name, text in (("aaa", BASE), ("bbb", CORRECT), ("ccc", CCC), ("ddd", BASE)):
        (klass / name).mkdir(parents=True)
        (klass / name / "tokencredit.py").write_text(text)
    for name in ("bbb", "ddd"):
        (klass / name / "written.txt").write_text(filled([1, 3, 5]))
    os.mkfifo(tmp_path / "fifo")

    def to_bbb(name):
        return lambda: (os.rename(klass / name, tmp_path / f"{name}-was"),
                        os.symlink("bbb", klass / name))
    aaa, form = os.stat(klass / "aaa").st_ino, os.stat(klass / "ddd" / "written.txt").st_ino

    def opens_aaa_s_file(args, kwargs, _):  # by its path, or by its name in aaa's descriptor
        named, at = str(args[0]), kwargs.get("dir_fd")
        return named.endswith("tokencredit.py") and (
            str(klass / "aaa") in named if at is None else os.fstat(at).st_ino == aaa)
    ran = [hooked(monkeypatch, os, "open", opens_aaa_s_file, to_bbb("aaa"), before=True),
           hooked(monkeypatch, importlib.util, "decode_source",
                  lambda args, *_: args[0] == CCC.encode(), to_bbb("ccc"))]
    swap_form = lambda: (tmp_path / "fifo").exists() and os.rename(  # noqa: E731 -- once:
        tmp_path / "fifo", klass / "ddd" / "written.txt")  # the form's inode may be reused later
    for name in ("lstat", "fstat"):
        ran.append(hooked(monkeypatch, os, name,
                          lambda _, __, out: getattr(out, "st_ino", 0) == form, swap_form))

    def graded(*argv) -> dict:
        def hung(*_):
            raise Hung("the grader blocked on the form swapped for a FIFO")
        was = signal.signal(signal.SIGALRM, hung)
        signal.alarm(240)
        try:
            main([*argv, "--set", "grpo", "--seed", str(SEED)])
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, was)
        out = tmp_path / "out"
        return {p.name: json.loads((p / "results.json").read_text()) for p in out.iterdir()} \
            if out.is_dir() else json.loads(out.read_text())
    return klass, graded, lambda: [name for done in ran for name in done]


@needs_bwrap
def test_a_class_raced_by_its_students_keeps_every_grade(tmp_path, monkeypatch):
    """Three races of grade-all, each red on the grader it was written against. aaa's folder
    swapped for a link to bbb's once listed: the walk's later reads went by path through the
    link (only the last component was protected), and a blank got bbb's 30.00, unflagged. The
    same swap by ccc once its file was read: the hard-link test stat-ed the path again, found
    bbb's inode, flagged bbb "the same file as ccc (a hard link)", and --strict gave him 0.00.
    ddd's form checked (lstat) then opened again by its name: swapped between the two for a
    FIFO, the open blocked, and grade-all for ever. Read as each stands: 0, 30, 0, and ddd's form
    its 20 points, no flag, nothing blocked."""
    klass, graded, ran = raced_class(tmp_path, monkeypatch)
    got = graded("grade-all", str(klass), "--strict", "--csv", str(tmp_path / "g.csv"),
                 "--gradescope-dir", str(tmp_path / "out"))
    rows = rows_of(tmp_path / "g.csv")
    assert {name: got[name]["score"] for name in got} == dict(aaa=0, bbb=50, ccc=0, ddd=20), rows
    assert not [row["flags"] for row in rows.values() if row["flags"]], rows
    hooks = set(ran())
    assert {"open", "decode_source"} <= hooks and hooks & {"lstat", "fstat"}, hooks


@needs_bwrap
def test_a_folder_raced_under_grade_path_is_read_as_it_stands(tmp_path, monkeypatch):
    """grade PATH of a folder: aaa's swap once listed got bbb's 30, ddd's form swapped for a FIFO
    after its check blocked the grade. Each keeps its own: 0, and the form's 20."""
    klass, graded, ran = raced_class(tmp_path, monkeypatch)
    got = [graded("grade", str(klass / name), "--gradescope", str(tmp_path / "out"))["score"]
           for name in ("aaa", "ddd")]
    hooks = set(ran())
    assert got == [0, 20] and "open" in hooks and hooks & {"lstat", "fstat"}, hooks


def swapped(kind: str):
    """What a student puts in the place of a path (a link, a folder, a socket, a FIFO, a device)."""
    def put(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        if kind == "link":
            os.symlink("../bbb", path)
        elif kind == "folder":
            os.mkdir(path)
        elif kind == "socket":
            socket.socket(socket.AF_UNIX).bind(str(path))
        elif kind == "fifo":
            os.mkfifo(path)
        else:  # a device: /dev/null's numbers, where the tests run as root
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return put


SWAPS = {  # what is swapped, after which call, for what: read_student's answer must say why
    "the file for a folder": ("aaa/tokencredit.py", "folder", "not a regular file"),
    "the file for a socket": ("aaa/tokencredit.py", "socket", "not a regular file"),
    "the file for a link to a classmate's": ("aaa/tokencredit.py", "link", "a symbolic link"),
    "a folder on the way for a link": ("aaa/sub", "link", "sub is not read: not a folder"),
    "the form for a FIFO": ("aaa/written.txt", "fifo", "not a regular file"),
    "the form for a device": ("aaa/written.txt", "device", "not a regular file"),
}


@pytest.mark.parametrize("what", sorted(SWAPS))
def test_a_swap_met_by_the_walk_is_refused_never_followed(tmp_path, monkeypatch, what):
    """Kinds of swap the issue does not name, each right after the walk listed the student's
    folder (the hook of the races above; reading only, no grade): the file, or a folder on the
    way to it, for a folder, a socket, a link; the form for a FIFO or a device. Each is refused
    with a reason, nothing is opened but a regular file, and nothing of bbb's is read."""
    from course.submission import read_student
    where, kind, said = SWAPS[what]
    if kind == "device" and os.geteuid() != 0:
        pytest.skip("only root makes a device")
    klass = tmp_path / "class"
    (klass / "aaa" / "sub").mkdir(parents=True)
    (klass / "bbb").mkdir()
    (klass / "bbb" / "tokencredit.py").write_text(CORRECT)
    (klass / "bbb" / "written.txt").write_text("1.std: 0.866\n")
    at = "aaa/sub" if where == "aaa/sub" else "aaa"
    (klass / at / "tokencredit.py").write_text(BASE)
    (klass / "aaa" / "written.txt").write_text("1.std: 0.5\n")
    listed = os.stat(klass / "aaa").st_ino
    ran = hooked(monkeypatch, os, "scandir", lambda args, *_: bool(args) and os.stat(
        args[0]).st_ino == listed, lambda: swapped(kind)(klass / where))
    top = os.open(klass, os.O_RDONLY)
    try:
        student = read_student(top, "aaa")
    finally:
        os.close(top)
    text, why = student["form"]
    told = student.get("why", "") if "form" not in what else why or ""
    assert ran and said in told, student
    assert CORRECT not in student.get("source", "") and "0.866" not in (text or ""), student


def test_the_class_itself_names_odd_bytes_and_many_entries_and_each_is_read_or_refused(
        tmp_path, monkeypatch):
    """More kinds: a link to the class folder itself, and to its parent; a folder named in bytes
    that are not UTF-8, with a form that is not UTF-8 either; a folder of 5,001 files. The links
    are refused, the odd bytes read (names escaped), the crowd refused whole, once the limit's
    worth of it is read (the walk read every entry of a folder first: 300,000 empty files cost
    the grader 1 s and 90 MB)."""
    from course.submission import read_student, students_of
    klass = tmp_path / "class"
    klass.mkdir()
    os.symlink(".", klass / "dot")
    os.symlink("..", klass / "up")
    odd = os.path.join(os.fsencode(klass), b"\xff\xfe-name")
    os.mkdir(odd)
    with open(os.path.join(odd, b"tokencredit.py"), "w") as f:
        f.write(BASE)
    with open(os.path.join(odd, b"written.txt"), "wb") as f:
        f.write(b"1.std: 0.866\n\xff\xfe\xfd\n")
    (klass / "crowd").mkdir()
    (klass / "crowd" / "tokencredit.py").write_text(BASE)
    for i in range(5000):
        (klass / "crowd" / f"f{i}").write_text("")
    listed, scandir = [], os.scandir

    class Counted(Listing):  # the entries the walk took from a folder's listing
        def __iter__(self):
            return (listed.append(e) or e for e in super().__iter__())
    monkeypatch.setattr(os, "scandir", lambda *args: Counted(scandir(*args)))
    top = os.open(klass, os.O_RDONLY)
    try:
        got = {name: read_student(top, entry) for name, entry, _ in students_of(top)}
    finally:
        os.close(top)
    assert len(listed) < 2010, len(listed)  # a crowd of 10 million: no more of it read
    assert set(got) == {b"dot", b"up", b"\xff\xfe-name", b"crowd"}, list(got)
    assert all("symbolic link" in got[link]["why"] for link in (b"dot", b"up")), got
    assert got[b"\xff\xfe-name"]["source"] == BASE, got[b"\xff\xfe-name"]
    assert got[b"\xff\xfe-name"]["form"][0].startswith("1.std: 0.866\n"), got[b"\xff\xfe-name"]
    assert "more than 2000 entries" in got[b"crowd"]["why"], got[b"crowd"]["why"]


def test_a_file_swapped_right_after_its_check_is_read_as_checked(tmp_path, monkeypatch):
    """The inode looked at is the inode read: a classmate's file renamed over the student's right
    after the check (its fstat: a regular file) is not what is graded, nor its inode the one the
    hard-link test sees (reading only, no grade)."""
    from course.submission import read_student
    (tmp_path / "class" / "aaa").mkdir(parents=True)
    (tmp_path / "class" / "aaa" / "tokencredit.py").write_text(BASE)
    (tmp_path / "theirs.py").write_text(CORRECT)
    checked = os.stat(tmp_path / "class" / "aaa" / "tokencredit.py").st_ino
    ran = hooked(monkeypatch, os, "fstat", lambda _, __, out: getattr(out, "st_ino", 0) == checked,
                 lambda: os.rename(tmp_path / "theirs.py", tmp_path / "class" / "aaa" /
                                   "tokencredit.py"))
    top = os.open(tmp_path / "class", os.O_RDONLY)
    try:
        student = read_student(top, "aaa")
    finally:
        os.close(top)
    assert ran and student["source"] == BASE and student["inode"][1] == checked, student.keys()


LEASE = """import fcntl, os, signal, sys, time
fds = [os.open(path, os.O_RDWR) for path in sys.argv[2:]]
def let_go(*_):
    for fd in fds:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
# asked to let go (SIGIO): a file server lets go; a student need not, and the kernel waits 45 s
signal.signal(signal.SIGIO, let_go if sys.argv[1] == "polite" else signal.SIG_IGN)
for fd in fds:
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("held", flush=True)
time.sleep(300)
"""


def held(paths, how: str) -> subprocess.Popen:
    """A process holding a write lease on each path, letting go when asked (polite) or not."""
    holder = subprocess.Popen([PY, "-c", LEASE, how, *map(str, paths)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    if holder.stdout.readline() != "held\n":
        pytest.skip(f"no write lease here: {holder.communicate(timeout=60)[1][-300:]}")
    return holder


@pytest.mark.parametrize("how", ["hostile", "polite"])
def test_a_file_held_by_a_lease_is_read_or_refused_without_waiting(tmp_path, how):
    """A student's own process holds a write lease on their file and on their form: any other
    open of either waits until the lease is let go, or the kernel breaks it (lease-break-time,
    45 s): grade PATH took 52 s for one file, and grade-all as much per student. Read as each
    route reads it (grade-all's folder, grade PATH's file and the form beside it, the bundle's
    folder), each is refused within a second or so, and says why; and a holder that lets go when
    asked, as a file server does, costs its student nothing."""
    from course.submission import read_student
    (tmp_path / "aaa").mkdir()
    paths = [tmp_path / "aaa" / "tokencredit.py", tmp_path / "aaa" / "written.txt"]
    paths[0].write_text(BASE)
    paths[1].write_text("1.std: 0.866\n")
    got, top = [], os.open(tmp_path, os.O_RDONLY)
    try:
        for read in (lambda: read_student(top, "aaa"),
                     lambda: read_student(None, str(paths[0]), form_beside=True),
                     lambda: read_student(None, str(tmp_path / "aaa"))):
            holder = held(paths, how)  # again for each: a lease broken is gone
            try:
                started = time.monotonic()
                got.append(read())
                assert time.monotonic() - started < 10
            finally:
                holder.kill()
                holder.wait()
    finally:
        os.close(top)
    for student in got:
        if how == "hostile":
            assert "held by another process" in student["why"], student
            assert "held by another process" in student["form"][1], student
        else:
            assert student["source"] == BASE and student["form"] == ("1.std: 0.866\n", None)
