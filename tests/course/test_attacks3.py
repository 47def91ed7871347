"""A fourth round of attacks on the grader (course/), each a kind that tests/course/test_attacks.py,
tests/course/test_attacks2.py, tests/course/test_sandbox.py, tests/course/test_course.py and tests/course/test_score.py do not
try: each test is written from its attack's description, and was red on the grader it was written
against (commit d41ea19): a test here that fails is an attack that falls. A student's code is BASE
(the grpo handout's blank file) or CORRECT (the reference, run) plus the attack, as said. Run
alone: about 60 s under load.

Needs bubblewrap (bwrap) that can run here.
"""

import os
import site
import subprocess
import sys

import pytest

from course import grading
from course.flags import scan
from test_attacks2 import grade
from test_sandbox import BASE, CORRECT, REFERENCE, ROOT, SEED, rows_of, run

SANDBOX = grading.find_sandbox()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(SANDBOX is None, reason="bwrap cannot run here")]

RETURN = "    return torch.where(all_equal, torch.zeros_like(centred), centred)\n"


def group_advantages_then(statement: str) -> str:
    """CORRECT with `statement` run in group_advantages after its answer is made."""
    assert CORRECT.count(RETURN) == 1
    return CORRECT.replace(RETURN, "    _out = torch.where(all_equal, torch.zeros_like(centred), "
                                   f"centred)\n    {statement}\n    return _out\n")


def test_a_write_into_an_input_through_data_is_seen(tmp_path):
    """The child reports an input as changed when its version counter moved; `rewards.data` is a
    tensor of the same memory with a counter of its own. group_advantages, right, then zeroing its
    rewards through .data passed test_inputs_unchanged: 10/10, where the same write made the
    ordinary way (`rewards.zero_()`) fails that test (9.4/10)."""
    said = grade(tmp_path, group_advantages_then("rewards.data.zero_()"), "-e", "1", "-v")
    assert "FAILED test_inputs_unchanged[group_advantages]" in said, said


# a class pattern looks attributes up by the names of its keywords: os, sys and ctypes through
# torch, with no Name, Attribute or string the flag scan reads
MATCH = '''
match torch:
    case object(os=_o, sys=_s, ctypes=_c):
        pass


def overlong_penalty(*args, **kwargs):
    raise ValueError(f"ran: cwd {_o.getcwd()} pid {_c.CDLL(None).getpid()} argv {_s.argv}")
'''


def test_a_class_pattern_that_reaches_os_is_flagged(tmp_path):
    """`case object(os=_o)` is getattr(torch, "os") spelt as a pattern: the file ran
    os.getcwd(), libc's getpid through ctypes and read sys.argv, unflagged (graded as clean
    under --strict)."""
    said = grade(tmp_path, BASE + MATCH, "-e", "1", "--strict", "-v")
    assert "ran: cwd /tmp/" in said, said  # the attack ran
    assert "FLAGGED" in said, said


@pytest.mark.parametrize("code", [
    'x = "{0.sys.modules} ".format(torch)',  # a format field walks attributes: sys.modules' text
    'x = "{0.os.environ} ".format(torch)',
    "match torch:\n    case object(os=o):\n        pass\n",
])
def test_attributes_reached_in_a_pattern_or_a_format_field_are_flagged(code):
    """A format string's fields ("{0.os.environ}") and a class pattern's keywords name
    attributes the scan never reads (a string with a space is not read as a dotted name)."""
    assert scan(code), code


# draws no seed fixes: torch.seed() and numpy's default_rng() seed from the operating system; id()
# and hash() of a new object are its address, which ASLR moves
DRAWS = '''
import numpy as _np
_a = (torch.seed(), int(_np.random.default_rng().integers(1000)))
_b = id(object())
_c = hash(object())


def overlong_penalty(*args, **kwargs):
    raise ValueError(f"drew {_a} {_b} {_c};")
'''


def test_a_file_whose_draws_no_seed_fixes_is_flagged_or_draws_the_same(tmp_path):
    """docs/instructors.md: a student's own draws are the same on every grade of a file. These
    were not, and no flag said so: a file right when `torch.seed() & 1` got 10, 3, 10, 3 points
    on four grades of exercise 1 (the same bytes, the same seed)."""
    said = [grade(tmp_path, BASE + DRAWS, "-e", "1", "-v") for _ in range(2)]
    drawn = [s.split("drew ")[1].split(";")[0] for s in said]
    assert drawn[0] == drawn[1] or all("FLAGGED" in s for s in said), drawn


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


def test_a_file_whose_extension_is_in_capitals_gets_a_row(tmp_path):
    """`carol.PY` (a name kept from another system) got no row at all: left out silently."""
    from course.__main__ import students_of
    (tmp_path / "carol.PY").write_text(CORRECT)
    (tmp_path / "notes.txt").write_text("not a submission")
    assert [(name, why) for name, _, why in students_of(str(tmp_path))] == [(b"carol", None)]
