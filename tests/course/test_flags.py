"""The flag scan (course/flags.py; docs/course.md, "Flags"): what in a submission reaches past the
exercises however it is spelt (a name, an attribute, getattr, a class pattern, a format field, a
string that parses, a module's private name, text run as code by another name), what draws what
no seed fixes, and ordinary correct code, never flagged. Most read scan()'s answer; those that
need bwrap grade the attack by grade PATH (-v: it ran; --strict: a flag is 0).
"""

import platform

import pytest

from classes import UNFLAGGED
from course import flags, source
from course.exercises import CORRECT as OTHER_CORRECT, ENDLESS, EXERCISES, MISTAKES
from course.flags import scan
from submissions import BASE, CORRECT, REFERENCE, grade, needs_bwrap
from test_judge import EQUAL_ALWAYS

pytestmark = pytest.mark.slow  # python -m pytest -m slow


def test_the_flag_scan_flags_every_attack_and_no_plant(cheats):
    _, sources = cheats
    for name, (text, _) in sources.items():
        assert bool(flags.scan(text)) == (name not in UNFLAGGED), name
    for _, what, edits in MISTAKES + OTHER_CORRECT + (ENDLESS,):
        assert flags.scan(source.apply_edits(REFERENCE, edits)) == [], what
    assert flags.scan(REFERENCE) == [] and flags.scan(BASE) == []
    assert flags.scan(BASE, ["course_map.json", "notes.md"]) == [
        "the submission also holds course_map.json, which grading ignores"]


HOSTILE = {
    'getattr(torch, "os").system("true")': "reaches os",
    'getattr(torch, "sys").modules': "reaches sys",
    'getattr(torch, "ctypes")': "reaches ctypes",
    'getattr(torch.nn, "threading")': "reaches threading",
    'getattr(torch, "o" + "s")': "reaches os",
    'getattr(torch, "".join(["o", "s"]))': "computed at run time",
    '__import__("operator").attrgetter("os.system")(torch)': "reaches os.system",
    'torch.__dict__["os"]': "__dict__",
    'vars(torch)["sys"]': "uses vars",
    'torch.functional.__dict__.get("ctypes")': "__dict__",
    'torch.utils.importlib': "reaches importlib",
    'hasattr(torch, "threading")': "reaches threading",
}


def test_the_flag_scan_catches_modules_reached_through_attributes():
    for line, said in HOSTILE.items():
        found = flags.scan(f"import torch\n\n\ndef f(x):\n    return {line}\n")
        assert any(said in f for f in found), (line, found)
    for text in [REFERENCE, source.blank(REFERENCE, EXERCISES)] + [
            source.apply_edits(REFERENCE, edits) for _, _, edits in MISTAKES + OTHER_CORRECT]:
        assert flags.scan(text) == []


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


@needs_bwrap
@pytest.mark.parametrize("how", sorted(HIDDEN_OS))
def test_code_that_reaches_os_is_flagged_however_it_is_spelt(tmp_path, how):
    """docs/instructors.md: code that reaches past the exercise (os, eval, ...) is flagged, and
    --strict gives it 0. These files ran os.getcwd() in the grader (their message says so) and
    were not flagged: graded as clean under --strict."""
    said = grade(tmp_path, BASE + HIDDEN_OS[how], "-e", "1", "--strict", "-v")
    assert "ran: " in said and "/tmp/" in said, said  # the attack ran
    assert "FLAGGED" in said, said


# a class pattern looks attributes up by the names of its keywords: os, sys and ctypes through
# torch, with no Name, Attribute or string the flag scan reads
MATCH = '''
match torch:
    case object(os=_o, sys=_s, ctypes=_c):
        pass


def overlong_penalty(*args, **kwargs):
    raise ValueError(f"ran: cwd {_o.getcwd()} pid {_c.CDLL(None).getpid()} argv {_s.argv}")
'''


@needs_bwrap
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


def test_a_format_field_split_across_strings_is_flagged():
    """A format field ('{0.os.environ}'.format(torch)) is flagged one string at a time
    (above): the same field made of two strings joined by + read the environment's text,
    scan() = []. (getattr's name joined by + is read whole: text_of.)"""
    assert scan('import torch\n_env = ("{0.o" + "s.environ}").format(torch)\n')


@pytest.mark.parametrize("how", sorted(EQUAL_ALWAYS))
def test_module_writes_through_an_alias_or_a_for_target_are_flagged(how):
    """The scan reads writes to an imported module's attributes in assignments whose target
    starts at the module's own name; `_t = torch; _t.equal = ...` and `for torch.equal in [...]`
    wrote torch.equal with no flag."""
    assert scan("import torch\n" + EQUAL_ALWAYS[how]), how  # a file imports torch


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


def test_a_file_read_through_numpy_s_datasource_is_flagged():
    """The scan flags numpy's and torch's file readers by name (fromfile, loadtxt, DataSource,
    ...); `numpy.lib._datasource.open(path)` is Python's open by another door (an attribute
    named open, which the scan reads only as a bare name): it read /proc/self/maps and any
    file the sandbox sees, scan() = []."""
    assert scan("import numpy.lib._datasource\n"
                "_maps = numpy.lib._datasource.open('/proc/self/maps').read()\n")


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


@needs_bwrap
@pytest.mark.skipif(platform.machine() != "x86_64", reason="struct flock's layout is x86_64's")
def test_a_side_channel_between_two_jobs_is_flagged(tmp_path):
    """A sandbox per job, but a submission's jobs run two at once, on one machine, and each holds
    the reference's other exercises (it runs beside them): a lock's byte range on a file both
    read is seen from the other. Exercise 3, blank, ran the reference's exercise 3 sent by
    exercise 1's child: 10 of 10. Such channels (locks, the page cache, timing) are not closed
    (docs/instructors.md); what they need is flagged, and --strict gives 0."""
    said = grade(tmp_path, BASE + LOCKS, "--strict")
    assert "FLAGGED" in said and "total 0.0/30" in said, said


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
    need (os, fcntl, ctypes, ...) is flagged, and --strict gives 0. The lock channel above
    (LOCKS; its sender holding the locks 8 s, and the answer run in the
    student's module) run through dataclasses._create_fn: exercise 3, blank, 53/53 tests,
    10.0/10 under --strict, no flag (total 10.0/30)."""
    code = LOCKS.replace("    _send(_text)\n", "    _send(_text)\n    _time.sleep(8)\n").replace(
        "exec(_got, globals())",
        "exec(_got, __import__('sys').modules['student_tokencredit'].__dict__)")
    said = grade(tmp_path, BASE + hidden(code), "--strict")
    assert "total 0.0/30" in said, said


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


@needs_bwrap
def test_a_file_whose_draws_no_seed_fixes_is_flagged_or_draws_the_same(tmp_path):
    """docs/instructors.md: a student's own draws are the same on every grade of a file. These
    were not, and no flag said so: a file right when `torch.seed() & 1` got 10, 3, 10, 3 points
    on four grades of exercise 1 (the same bytes, the same seed)."""
    said = [grade(tmp_path, BASE + DRAWS, "-e", "1", "-v") for _ in range(2)]
    drawn = [s.split("drew ")[1].split(";")[0] for s in said]
    assert drawn[0] == drawn[1] or all("FLAGGED" in s for s in said), drawn


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


def test_code_kept_in_a_string_statement_is_not_flagged():
    """Strings are scanned as code when they parse (an annotation typing would run), but a string
    that is a statement, as a docstring is, runs nothing: old code kept in one is no flag."""
    kept = '\n"""\nimport matplotlib.pyplot as plt\nprint(locals())\n"""\n'
    assert scan(CORRECT + kept) == []
