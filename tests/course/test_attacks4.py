"""A fifth round of attacks on the grader (course/), each a kind that tests/course/test_attacks.py,
tests/course/test_attacks2.py, tests/course/test_attacks3.py, tests/course/test_sandbox.py, tests/course/test_course.py and
tests/course/test_score.py do not try: each test is written from its attack's description, and was red
on the grader it was written against (commit c57e205): a test here that fails is an attack that
falls. A student's code is BASE (the grpo handout's blank file) or CORRECT (the reference, run)
plus the attack, as said.

Needs bubblewrap (bwrap) that can run here.
"""

import platform
import subprocess
import sys

import pytest

from course import grading
from course.flags import scan
from test_attacks2 import grade
from test_attacks3 import group_advantages_then
from test_sandbox import BASE

pytestmark = pytest.mark.slow  # python -m pytest -m slow
SANDBOX = grading.find_sandbox()
needs_bwrap = pytest.mark.skipif(SANDBOX is None, reason="bwrap cannot run here")

# torch.equal, which the child's before-and-after comparison of the inputs calls, replaced in
# the student's own process: through an alias of the module, or as a for loop's target
EQUAL_ALWAYS = {"alias": "_t = torch\n_t.equal = lambda *a, **k: True\n",
                "class": "_T = torch.Tensor\n_T.contiguous = lambda self: self\n",
                "__class__": "_x = torch.zeros(1)\n_x.__class__ = torch.nn.Parameter\n",
                "for target": "for torch.equal in [lambda *a, **k: True]:\n    pass\n"}


@pytest.mark.parametrize("how", sorted(EQUAL_ALWAYS))
def test_module_writes_through_an_alias_or_a_for_target_are_flagged(how):
    """The scan reads writes to an imported module's attributes in assignments whose target
    starts at the module's own name; `_t = torch; _t.equal = ...` and `for torch.equal in [...]`
    wrote torch.equal with no flag."""
    assert scan("import torch\n" + EQUAL_ALWAYS[how]), how  # a file imports torch


@needs_bwrap
@pytest.mark.parametrize("how", sorted(EQUAL_ALWAYS))
def test_an_input_write_is_seen_when_torch_equal_is_replaced(tmp_path, how):
    """The child compares each input before and after a call with torch.equal, in the process
    that runs the student's code. group_advantages right, then `rewards.zero_()` (an ordinary
    in-place write, which fails test_inputs_unchanged: 9.4/10), with torch.equal replaced by
    `lambda *a, **k: True` at the file's top: 10.0/10 under --strict, 17/17 tests, no flag."""
    text = group_advantages_then("rewards.zero_()") + "\n" + EQUAL_ALWAYS[how]
    said = grade(tmp_path, text, "-e", "1", "-v")  # not --strict: its flag alone would give 0
    assert "FAILED test_inputs_unchanged[group_advantages]" in said, said


# draws no seed fixes, by names the DRAWS list does not hold: a numpy bit generator made with no
# seed (the operating system's entropy), and the clock read through numpy.datetime64
UNSEEDED = '''
import numpy as _np
_a = int(_np.random.PCG64().random_raw())
_b = int(_np.datetime64("now", "ns").astype("int64"))


def overlong_penalty(*args, **kwargs):
    raise ValueError(f"drew {_a} {_b};")
'''


@needs_bwrap
def test_a_bit_generator_or_the_clock_draws_the_same_or_is_flagged(tmp_path):
    """A correct file that negates group_advantages when `PCG64().random_raw() & 1` got 3.0, 10.0,
    3.0, 10.0 on four grades of exercise 1 under --strict (the same bytes, the same seed), no
    flag; numpy.datetime64("now") reads the clock, as unflagged."""
    said = [grade(tmp_path, BASE + UNSEEDED, "-e", "1", "-v") for _ in range(2)]
    drawn = [s.split("drew ")[1].split(";")[0] for s in said]
    assert drawn[0] == drawn[1] or all("FLAGGED" in s for s in said), drawn


# exec by another name: dataclasses (an import the scan allows) makes functions from text with
# exec; the text is made at run time (strings shifted by one: none parses as code)
CREATE_FN = '''
import dataclasses


def _plain(text):
    return "".join(chr(ord(c) - 1) for c in text)


_run = dataclasses._create_fn("_run", [], [_plain("jnqpsu!pt-!tzt-!duzqft"), _plain(
    "sfuvso!pt/hfudxe)*-!duzqft/DEMM)Opof*/hfuqje)*-!tzt/bshw")], globals={})


def overlong_penalty(*args, **kwargs):
    raise ValueError("ran: cwd %s pid %s argv %s" % _run())
'''


# eval by a public name: typing.get_type_hints evaluates a string annotation, here one made at run
# time (`_box.append(__import__('os').getcwd())`, shifted by one)
TYPE_HINTS = '''
import typing

_box = []
_expr = "".join(chr(ord(c) - 1) for c in "`cpy/bqqfoe)``jnqpsu``)(pt(*/hfudxe)**")


def _h(x: _expr):
    pass


typing.get_type_hints(_h)
'''


# exec by a public name of torch: a benchmark Timer runs its statement (timeit compiles it)
TIMER = '''
import torch.utils.benchmark

_box = []
_stmt = "".join(chr(ord(c) - 1) for c in "jnqpsu!pt<!cpy/bqqfoe)pt/hfudxe)**")
torch.utils.benchmark.Timer(stmt=_stmt, globals={"box": _box}).timeit(1)
'''
DOORS = {"dataclasses._create_fn": CREATE_FN, "typing.get_type_hints": TYPE_HINTS,
         "torch.utils.benchmark.Timer": TIMER}


@pytest.mark.parametrize("door", sorted(DOORS))
def test_code_run_by_another_name_is_flagged(door):
    """exec and eval are flagged by name; these run text made at run time by other names.
    `dataclasses._create_fn(name, args, body_lines)` execs its lines: a blank file ran `import
    os, sys, ctypes`, os.getcwd(), libc's getpid and read sys.argv (`ran: cwd /tmp/tmp0jfxfx5s
    pid 2 argv ['tokencredit']` in its report under --strict); typing.get_type_hints evaluated
    an annotation that imported os (the cwd came back in a list); torch.utils.benchmark.Timer
    ran `import os; box.append(os.getcwd())`. scan() = [] for each."""
    assert scan(DOORS[door]), door


# correct code, written an ordinary way, that the flags on draws and format fields now name:
# numpy seeded by hand or its generator made with a seed (what makes draws repeat), a loop
# variable or a record's field called id, a message that names the type it got; Tensor.select
# (flagged before: select is also a module). (hash stays flagged: of a string it is fixed by the
# child's PYTHONHASHSEED, of an object it is an address, and the scan cannot tell them apart.)
ORDINARY = {
    "numpy seeded": "import numpy\nnumpy.random.seed(0)\n",
    "numpy's generator seeded": "import numpy\n_rng = numpy.random.default_rng(0)\n",
    "a loop's id": "def _ids(groups):\n    return {id: g for id, g in enumerate(groups)}\n",
    "a field id": "def _key(sample):\n    return sample.id\n",
    "a tensor's select": "def _first(x):\n    return x.select(-1, 0)\n",
    "a message's type": "def _check(x):\n    raise ValueError('expected a tensor, got "
                        "{0.__class__.__name__}'.format(x))\n",
    "two objects compared by id": "def _same(a, b):\n    return id(a) == id(b)\n",
    "a helper named hash": "def hash(x):\n    return 1\n\n\n_h = hash(2)\n",
}


@pytest.mark.parametrize("what", sorted(ORDINARY))
def test_ordinary_correct_code_is_not_flagged(what):
    """Under --strict a flag is 0 points until reviewed. Each of these is deterministic and
    reaches nothing past the exercises; each was flagged ("uses seed, which no seed fixes",
    "uses id ...", "uses hash ...", "names '0.__class__.__name__' in a string")."""
    assert scan(ORDINARY[what]) == [], what


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


def test_a_file_read_through_numpy_s_datasource_is_flagged():
    """The scan flags numpy's and torch's file readers by name (fromfile, loadtxt, DataSource,
    ...); `numpy.lib._datasource.open(path)` is Python's open by another door (an attribute
    named open, which the scan reads only as a bare name): it read /proc/self/maps and any
    file the sandbox sees, scan() = []."""
    assert scan("import numpy.lib._datasource\n"
                "_maps = numpy.lib._datasource.open('/proc/self/maps').read()\n")


def hidden(code: str) -> str:
    """BASE-ready text that runs `code` through dataclasses._create_fn, its text shifted by one
    character in chunks under the scan's literal size: nothing the scan reads names a module."""
    shift = lambda t: "".join(chr(ord(c) + 1) for c in t)  # noqa: E731
    chunks = "".join(f"    {shift(code[i:i + 1500])!r},\n" for i in range(0, len(code), 1500))
    return ("\nimport dataclasses\n\n\ndef _plain(text):\n"
            "    return \"\".join(chr(ord(c) - 1) for c in text)\n\n\n"
            f"_src = _plain(\"\".join([\n{chunks}]))\n_g = {{\"torch\": torch}}\n"
            f"dataclasses._create_fn(\"_run\", [], [_plain({shift('exec(_src, _g)')!r})], "
            "globals=dict(_src=_src, _g=_g))()\n")


@needs_bwrap
@pytest.mark.skipif(platform.machine() != "x86_64", reason="struct flock's layout is x86_64's")
def test_the_lock_channel_run_by_another_name_is_flagged(tmp_path):
    """docs/instructors.md leaves side channels between a submission's exercises open: what they
    need (os, fcntl, ctypes, ...) is flagged, and --strict gives 0. Round 2's lock channel
    (tests/course/test_attacks2.py LOCKS; its sender holding the locks 8 s, and the answer run in the
    student's module) run through dataclasses._create_fn: exercise 3, blank, 53/53 tests,
    10.0/10 under --strict, no flag (total 10.0/30)."""
    from test_attacks2 import LOCKS
    code = LOCKS.replace("    _send(_text)\n", "    _send(_text)\n    _time.sleep(8)\n").replace(
        "exec(_got, globals())",
        "exec(_got, __import__('sys').modules['student_tokencredit'].__dict__)")
    said = grade(tmp_path, BASE + hidden(code), "--strict")
    assert "total 0.0/30" in said, said


def test_a_format_field_split_across_strings_is_flagged():
    """Round 4's format field ('{0.os.environ}'.format(torch)) is flagged now, one string at a
    time: the same field made of two strings joined by + read the environment's text,
    scan() = []. (getattr's name joined by + is read whole: text_of.)"""
    assert scan('import torch\n_env = ("{0.o" + "s.environ}").format(torch)\n')
