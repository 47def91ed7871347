"""What the course's tests share (not a test file; they import it by name): the files they hand
the grader (the reference, a grpo handout's blank file, a correct file, a planted mistake), the
attack helpers most of them build on, and the ways they grade a file: grade PATH, grade-all and
the Gradescope bundle, each run as an instructor runs it.
"""

import csv
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from course import grading, source
from course.exercises import MISTAKES, SETS

ROOT = grading.ROOT
REFERENCE = grading.read(os.path.join(ROOT, "tokencredit.py"))
BASE = source.blank(REFERENCE, SETS["grpo"])  # a grpo handout's file: every attack's base
CORRECT = REFERENCE.replace(  # correct, and not the reference's file byte for byte
    "\ndef group_advantages(", "\n_differs = 1\n\n\ndef group_advantages(")
PLANT = next(m for m in MISTAKES if m[0] == 1)  # a planted mistake of exercise 1
PY = sys.executable
SEED = 20271
SANDBOX = grading.find_sandbox()  # bwrap runs here (as root, or as whoever runs the tests)
needs_bwrap = pytest.mark.skipif(SANDBOX is None, reason="bwrap cannot run here: the attacks "
                                 "would reach the grader (docs/instructors.md)")
UNBOXED = [] if SANDBOX else ["--no-sandbox-ok"]  # for the tests that grade only honest files


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


IN_EXERCISE_1 = """
import linecache as _lc
if 'NotImplementedError("exercise 1:' in "".join((_lc.cache.get("reference.py") or (0, 0, []))[2]):
"""


def in_exercise_1(code: str) -> str:
    """code run in exercise 1's job only (its copy of the reference has exercise 1 blank): each
    sandbox has its own limits, so the same attack in the other exercises' jobs tries nothing
    more, and takes their time."""
    return IN_EXERCISE_1 + textwrap.indent(code, "    ")


def run(*args, timeout=900, **kwargs):
    return subprocess.run([PY, "-m", "course", *map(str, args)], cwd=kwargs.pop("cwd", ROOT),
                          capture_output=True, timeout=timeout, **kwargs)


def unquoted(report: str) -> str:
    """A report with each student's text (written.quoted: lines of its own, `> `, cut to fit a
    terminal) joined back onto the line above, as it came: what a test searches."""
    return re.sub(r"\n *> ", "", report)


def grade(tmp_path, text: str, *extra, name="a.py"):
    """grade PATH's stdout (set grpo, the fixed seed) for a file of this text, unquoted."""
    (tmp_path / name).write_text(text)
    done = run("grade", tmp_path / name, "--set", "grpo", "--seed", SEED, *extra, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return unquoted(done.stdout.decode())


def grade_path(path, out, *extra) -> dict:
    key = (open(path).read() if os.path.isfile(path) else str(path), extra)
    if key in GRADED:
        return GRADED[key]
    done = subprocess.run([PY, "-m", "course", "grade", str(path), "--seed", str(SEED),
                           "--gradescope", str(out), *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    GRADED[key] = json.loads(open(out).read())
    return GRADED[key]


GRADED = {}


def code_tests(results: dict) -> list:
    """Gradescope's tests of the exercises (the written form's follow them)."""
    return [t for t in results["tests"] if t["name"].startswith("exercise ")]


def run_bundle(root, text, form=None) -> dict:
    """The bundle unzipped at root, run on tokencredit.py of this text (and written.txt of these
    bytes): its results.json."""
    sub = root / "submission"
    if sub.exists():
        for p in sub.iterdir():
            p.unlink()
    sub.mkdir(exist_ok=True)
    (sub / "tokencredit.py").write_text(text)
    if form is not None:
        (sub / "written.txt").write_bytes(form)
    env = dict(os.environ, AUTOGRADER_ROOT=root.name, PYTHON=PY)  # relative, as a user may give
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env,
                          cwd=root.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text())


def rows_of(csv_path) -> dict:
    with open(csv_path, encoding="utf-8") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


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
