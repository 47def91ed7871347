"""What grade-all's walk of a class folder meets, and grade PATH's and the bundle's of one
submission: names (bytes not UTF-8, names that look alike, a formula, one too long, capitals, a
student with both a file and a folder), entries that are not regular files (a FIFO, a symbolic
link to a classmate's file, a hard link to it), trees too deep or closed to the grader. Each gets
one safe row and never a classmate's points, and the class gets its CSV.
"""

import json
import os
import re
import shutil
import subprocess
import time
import unicodedata
import zipfile

import pytest

from classes import SANDBOX_ATTACKS, tricks
from course import grading
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
    from course.__main__ import students_of
    (tmp_path / "carol.PY").write_text(CORRECT)
    (tmp_path / "notes.txt").write_text("not a submission")
    assert [(name, why) for name, _, why in students_of(str(tmp_path))] == [(b"carol", None)]


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
    000 (a tar keeps modes): find_student raised PermissionError, which grade PATH does not catch
    (a traceback), where grade-all and the bundle give the file 0, and root grades it 30. Here
    find_student as `tester`: the file, or a ValueError that says why."""
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
        if pid == 0:  # the child: tester, then find_student; says how it ended
            said = b"?"
            try:
                os.setgroups([])
                os.setgid(tester.pw_gid)
                os.setuid(tester.pw_uid)
                path, _, _ = grading.find_student(folder)
                said = b"found " + path.encode()
            except ValueError:
                said = b"refused"
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
