"""Tests for the course kit (course/): its source surgery, its protocol, and the attacks of issue
34, each graded in a class by `grade-all` (twice, in two orders) and by the Gradescope bundle run
locally (`grade PATH` grades the same way in one process as `grade-all`: it is tried on the memory
bomb, on issue 42's attacks in tests/course/test_sandbox.py, and against the other routes below). The
plants' points are tests/course/test_score.py's; selfcheck's handout part runs here on one set.

The attacks run in bubblewrap sandboxes (course/grading.py), as root or not; where bwrap cannot run
(docs/instructors.md says what is then unprotected) the attacks that read the grader's files are
left out, and grade-all is told --no-sandbox-ok. tests/course/test_sandbox.py holds issue 42's attacks.
"""

import ast
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile

import pytest
import torch

from course import flags, grading, protocol, report, source
from course.exercises import CORRECT, ENDLESS, EXERCISES, MISTAKES, SETS, names

pytestmark = pytest.mark.slow  # python -m pytest -m slow

ROOT = grading.ROOT
REFERENCE = grading.read(os.path.join(ROOT, "tokencredit.py"))
PY = sys.executable
SEED = 20270
GRPO = SETS["grpo"]
BASE = source.blank(REFERENCE, GRPO)  # what most attacks are built on: a grpo handout's file
SANDBOXED = grading.find_sandbox() is not None
UNBOXED = [] if SANDBOXED else ["--no-sandbox-ok"]
needs_sandbox = pytest.mark.skipif(not SANDBOXED, reason="bwrap cannot run here: the attacks "
                                   "would reach the grader (docs/instructors.md)")


# -----------------------------------------------------------------------------
# source surgery

def test_a_blank_keeps_signature_docstring_and_leading_checks_only():
    blank = source.blank(REFERENCE, EXERCISES)
    defs, ref = source.functions(blank), source.functions(REFERENCE)
    for k in EXERCISES:
        for name in names(k):
            body, ref_body = defs[name].body, ref[name].body
            assert ast.dump(defs[name].args) == ast.dump(ref[name].args)
            assert ast.get_docstring(defs[name]) == ast.get_docstring(ref[name])
            kept = source.kept_statements(ref[name])
            assert [ast.unparse(s) for s in body[1:-1]] == [
                ast.unparse(s) for s in ref_body[1:kept]]
            assert ast.unparse(body[-1]) == f"raise NotImplementedError('exercise {k}: {name}')"
    given = set(ref) - {n for k in EXERCISES for n in names(k)}
    assert all(ast.dump(defs[n]) == ast.dump(ref[n]) for n in given)  # the rest is untouched
    assert sorted(grading.not_written(blank, [n for k in EXERCISES for n in names(k)])) == \
        sorted(n for k in EXERCISES for n in names(k))
    assert grading.not_written(REFERENCE, names(1)) == []


def test_the_reference_s_constants_are_read_without_running_it():
    consts = source.constants(REFERENCE)
    assert consts["AGGREGATION_MODES"] == ("sample", "token", "group_token", "constant")


def test_blocker_reads_the_exercise_number_from_the_failure():
    assert grading.blocker("NotImplementedError: exercise 3: clipped_surrogate\n...") == 3
    assert grading.blocker("AssertionError: 1 != 2") is None


def test_a_handouts_tests_replay_the_loops_with_their_gradient(tmp_path):
    tests = ("import torch\n\n\ndef ref_twice(x, k=1):\n    return sum(2 * v for v in x) * k\n\n\n"
             "def test_it():\n    x = torch.ones(3, requires_grad=True)\n"
             "    out = ref_twice(x)\n    out.backward()\n    assert out.item() == 6\n"
             "    assert x.grad.tolist() == [2.0, 2.0, 2.0]\n")
    replay = source.snapshot_tests(tests, "snap.json")
    assert "sum(2 * v" not in replay and "def ref_twice(*args, **kwargs):" in replay
    x = torch.ones(3, dtype=torch.float64)
    (tmp_path / "snap.json").write_text(json.dumps({"test_it::ref_twice::0": dict(
        value=source.snapshot_value(torch.tensor(6.0)),
        grads={"0": source.snapshot_value(2 * x)})}))
    (tmp_path / "test_replay.py").write_text(replay)
    done = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_replay.py"], cwd=tmp_path, capture_output=True, text=True)
    assert "1 passed" in done.stdout, done.stdout


# -----------------------------------------------------------------------------
# the protocol: values only

def test_the_protocol_sends_values_and_refuses_code():
    a = torch.arange(6.0).reshape(2, 3).requires_grad_()
    value, table, blobs, _ = protocol.encode([(a, a, torch.bfloat16), {"x": float("nan")}])
    assert len(table) == 1  # the same tensor once: policy_loss(logp, logp) stays one tensor
    tensors = protocol.decode_tensors(table, blobs)
    out = protocol.decode(value, tensors)
    assert out[0][0] is out[0][1] and torch.equal(out[0][0], a.detach())
    assert out[0][0].requires_grad and out[0][2] == torch.bfloat16 and out[1]["x"] != out[1]["x"]
    with pytest.raises(TypeError):
        protocol.encode(lambda: 1)  # a callable goes only as a number to call back
    with pytest.raises(protocol.Malformed):
        protocol.decode({"t": "pickle", "v": "gASVAAAA"}, [])
    with pytest.raises(protocol.Malformed):
        protocol.decode_tensors([dict(dtype="float32", shape=[4], blob=0)], [b"\0" * 3])


def test_points_weigh_the_mistake():
    plan = dict(functions={"group_advantages": ["h", "l", "a", "f"], "overlong_penalty": ["o"]},
                later={})
    kinds = dict(h="hand", l="loop", a="other", f="fresh", o="other")

    def points(failed):
        result = dict(results={t: ("boom" if t in failed else None) for t in "hlafo"})
        return grading.score(plan, 1, result, kinds, grading.LIMITS)["points"]
    assert points("") == 10
    assert points("a") == pytest.approx(3 + 7 * 3 / 4)  # an invariant: its share of the tests
    assert points("h") == pytest.approx(3 + 7 / 4)  # the hand-worked case: a quarter at most
    assert points("f") == 3  # fresh inputs: nothing of its share
    limited = grading.score(plan, 1, dict(results={}, limit="memory", stopped="x"), kinds,
                            grading.LIMITS)
    assert limited["points"] == 0 and "memory limit" in limited["error"]


def test_a_failing_test_through_a_blank_exercise_not_graded_here_says_so():
    """grade -e 2 in a dapo handout: exercise 1 is not graded, but blank, and the failing test
    goes through it; the test that uses exercise 2 alone gets no note."""
    mapping = dict(fails={"overlong_penalty": ["t_door"], "_clipped_surrogate": ["t_door"],
                          "informative_groups": ["t_door", "t_own"]})
    row = dict(k=2, failed={"t_door": "NotImplementedError: exercise 1: overlong_penalty",
                            "t_own": "AssertionError"}, blank=[], waiting={}, notes=[])
    grading.cross_notes([row], mapping)  # nothing says exercise 1 fails: no note
    assert "may_come_from" not in row
    grading.cross_notes([row], mapping, [1, 3])
    assert row["may_come_from"] == {"t_door": [1, 3]}
    assert report.notes(row) == ["1 failing test may come from exercise 1, 3; the official grade "
                                 "grades 2 alone"]


def test_a_cut_list_of_waiting_tests_says_how_many_it_leaves_out():
    row = dict(k=3, failed={}, per_function={}, waiting={f"t{i}": 5 for i in range(14)})
    lines = report.details(row, shown=12)
    assert lines[-2:] == ["    t11: waiting on exercise 5", "    ... and 2 more waiting tests"]
    assert report.details(dict(row, waiting={"t0": 5}), shown=12) == \
        ["    t0: waiting on exercise 5"]


# -----------------------------------------------------------------------------
# the attacks of issue 34, as submissions

NAMES = [n for k in GRPO for n in names(k)]


def attack_sources(tmp_path) -> dict:
    """{name: (source, the file it was built on, files beside it)}."""
    sign_flip = source.apply_edits(REFERENCE, MISTAKES[0][2])
    targets = [str(tmp_path / "grades.csv"), str(tmp_path / "bundle" / "results" /
                                                 "results.json"), "/autograder/results/results.json"]
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
    if not SANDBOXED:  # without a sandbox the student's code can read the grader's files
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


@pytest.fixture(scope="module")
def attacks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attacks")
    return tmp, attack_sources(tmp)


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


@needs_sandbox
def test_a_memory_bomb_from_grade_path_is_cut_by_the_memory_limit(attacks):
    tmp, sources = attacks
    text, _ = sources["a memory bomb"]
    (tmp / "a.py").write_text(text)
    got = grade_path(tmp / "a.py", tmp / "a.json", "--set", "grpo")
    assert all("memory limit" in t["output"] for t in code_tests(got)), got


def test_a_submitted_course_map_does_not_choose_the_set(tmp_path):
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "tokencredit.py").write_text(BASE)
    (folder / "course_map.json").write_text(json.dumps(dict(set="dapo", exercises=[2])))
    got = grade_path(folder, tmp_path / "out.json")
    assert [t["name"][:10] for t in code_tests(got)] == [f"exercise {k}" for k in EXERCISES]
    assert "course_map.json" in got["output"]  # and it is flagged


@needs_sandbox
def test_a_class_with_every_attack_graded_twice_in_two_orders_gives_one_csv(attacks):
    tmp, sources = attacks
    folder = tmp / "class"
    folder.mkdir()
    for i, (name, (text, _)) in enumerate(sources.items()):
        (folder / f"attack{i}.py").write_text(text)
    (folder / "blank.py").write_text(BASE)
    (folder / "correct.py").write_text(REFERENCE)
    (folder / "zz-correct-too.py").write_text(source.apply_edits(REFERENCE, CORRECT[3][2]))
    cache = sorted(os.listdir(os.path.join(ROOT, ".course-cache")))
    before = {n: open(os.path.join(ROOT, ".course-cache", n), "rb").read() for n in cache}
    said = []
    for order in ("name", "reverse"):
        done = subprocess.run([PY, "-m", "course", "grade-all", str(folder), "--set", "grpo",
                               "--seed", str(SEED), "--order", order, "--csv",
                               str(tmp / "grades.csv")], cwd=ROOT, capture_output=True,
                              text=True, timeout=1200)
        assert done.returncode == 0, done.stdout + done.stderr
        time.sleep(2)  # a detached child would rewrite the CSV now
        said.append((tmp / "grades.csv").read_text())
    assert said[0] == said[1]
    rows = {r["student"]: r for r in csv.DictReader(said[0].splitlines())}
    assert rows["blank"]["total"] == "0.00" and rows["correct"]["total"] == "30.00"
    assert rows["zz-correct-too"]["total"] == "30.00"
    sign = list(sources).index("torch.allclose that always says True (on the sign flip)")
    for i in range(len(sources)):
        limit = 30 - 7 if i == sign else 0  # the sign flip loses group_advantages' 7
        assert float(rows[f"attack{i}"]["total"]) <= limit, (list(sources)[i], rows[f"attack{i}"])
        assert bool(rows[f"attack{i}"]["flags"]) == (list(sources)[i] not in UNFLAGGED), \
            list(sources)[i]
    after = {n: open(os.path.join(ROOT, ".course-cache", n), "rb").read() for n in cache}
    assert after == before


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bundle")
    done = subprocess.run([PY, "-m", "course", "gradescope", str(tmp / "ag.zip"), "--set",
                           "grpo", "--seed", str(SEED)] + UNBOXED, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    root = tmp / "root"
    with zipfile.ZipFile(tmp / "ag.zip") as z:
        z.extractall(root / "source")
    return tmp, root, set(z.namelist())


def run_bundle(root, text) -> dict:
    sub = root / "submission"
    if sub.exists():
        for p in sub.iterdir():
            p.unlink()
    sub.mkdir(exist_ok=True)
    (sub / "tokencredit.py").write_text(text)
    env = dict(os.environ, AUTOGRADER_ROOT=root.name, PYTHON=PY)  # relative, as a user may give
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env,
                          cwd=root.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text())


def test_the_bundle_carries_no_plants_and_installs_only_what_grading_imports(bundle):
    tmp, root, files = bundle
    assert "course/selfcheck.py" not in files and "course/handout.py" not in files
    assert grading.OFFICIAL in files and grading.HIDDEN not in files  # it grades as the repository
    text = (root / "source" / "course" / "exercises.py").read_text()
    assert "MISTAKES = ()" in text and "sign flip" not in text
    assert "QUESTIONS = ()" not in (root / "source" / "course" / "written.py").read_text()
    setup = (root / "source" / "setup.sh").read_text()
    assert "download.pytorch.org/whl/cpu" in setup and "transformers" not in setup
    assert "apt-get install -y bubblewrap" in setup
    assert (root / "source" / "requirements.txt").read_text().split() == ["numpy>=1.24,<3",
                                                                          "pytest>=8,<10"]


@needs_sandbox
def test_every_attack_gets_no_more_than_its_base_from_the_bundle(bundle, attacks):
    tmp, root, _ = bundle
    aimed, sources = attacks  # the attacks aim at aimed/bundle/results: here, at each root's
    blank = run_bundle(root, BASE)
    assert blank["score"] == 0 and len(code_tests(blank)) == 3
    assert sum("not written yet" in t["output"] for t in blank["tests"]) == 3
    assert len(json.dumps(blank)) < 6000  # one line per blank function, not a traceback each
    assert run_bundle(root, REFERENCE)["score"] == 30
    got, detached_last = {}, sorted(sources, key=lambda name: "detached" in name)
    for i, name in enumerate(detached_last):  # each in a root of its own, read again at the end
        text, base = sources[name]
        text = text.replace(str(aimed / "bundle" / "results"), str(tmp / f"root{i}" / "results"))
        shutil.copytree(root / "source", tmp / f"root{i}" / "source")
        got[name] = run_bundle(tmp / f"root{i}", text)
        want = 0 if base == BASE else run_bundle(root, base)["score"]
        assert got[name]["score"] <= want, (name, got[name]["score"], want)
        assert ("FLAGGED" in got[name].get("output", "")) == (name not in UNFLAGGED), name
    time.sleep(3)  # one wait for all: the detached child, graded last, rewrites for up to 6 s
    for i, name in enumerate(detached_last):
        again = json.loads((tmp / f"root{i}" / "results" / "results.json").read_text())
        assert again == got[name], name  # nothing rewrote it afterwards


def test_grade_path_grade_all_and_the_bundle_give_one_score(bundle, tmp_path):
    """The same files, the same points and test counts per exercise, three ways."""
    _, root, _ = bundle
    files = {"blank35": source.blank(REFERENCE, [3, 5]),
             "clip": source.apply_edits(REFERENCE, MISTAKES[4][2]),
             "kl-reversed": source.apply_edits(REFERENCE, MISTAKES[7][2])}
    (tmp_path / "class").mkdir()
    for name, text in files.items():
        (tmp_path / "class" / f"{name}.py").write_text(text)
    done = subprocess.run([PY, "-m", "course", "grade-all", str(tmp_path / "class"), "--set",
                           "grpo", "--seed", str(SEED), "--csv", str(tmp_path / "g.csv"),
                           "--gradescope-dir", str(tmp_path / "gs"), *UNBOXED], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for name, text in files.items():
        ways = [grade_path(tmp_path / "class" / f"{name}.py", tmp_path / "one.json",
                           "--set", "grpo"),
                json.loads((tmp_path / "gs" / name / "results.json").read_text()),
                run_bundle(root, text)]
        said = [[(t.get("score"), t["output"].splitlines()[0]) for t in way["tests"]]
                for way in ways]
        assert said[0] == said[1] == said[2], (name, said)


def test_each_handout_of_a_set_scans_clean_and_grades_in_order():
    """selfcheck's handout part on the grpo set: nothing in it solves an exercise, and written in
    order (none, 1, 1 and 3, all three) it gets full marks for those and 0 for the rest."""
    from course.selfcheck import check_handouts
    assert check_handouts(REFERENCE, {"grpo": SETS["grpo"]}) == []


# -----------------------------------------------------------------------------
# the flag scan, the plants, the setup

def test_the_flag_scan_flags_every_attack_and_no_plant(attacks):
    _, sources = attacks
    for name, (text, _) in sources.items():
        assert bool(flags.scan(text)) == (name not in UNFLAGGED), name
    for _, what, edits in MISTAKES + CORRECT + (ENDLESS,):
        assert flags.scan(source.apply_edits(REFERENCE, edits)) == [], what
    assert flags.scan(REFERENCE) == [] and flags.scan(BASE) == []
    assert flags.scan(BASE, ["course_map.json", "notes.md"]) == [
        "the submission also holds course_map.json, which grading ignores"]


def test_plants_writes_one_submission_per_plant_named_by_its_exercise(tmp_path):
    from course.__main__ import main
    main(["plants", str(tmp_path / "class")])
    files = sorted((tmp_path / "class").iterdir())
    plants = MISTAKES + CORRECT + (ENDLESS,)
    assert len(files) == len(plants)
    for path, (k, _, edits) in zip(files, plants):
        assert f"-ex{k}-" in path.name and path.read_text() == source.apply_edits(REFERENCE, edits)


def test_setup_resolves_on_python_3_10_to_3_12(tmp_path, package_index):
    """setup.sh's packages resolve for Python 3.10 (Gradescope's Ubuntu 22.04), 3.11 and 3.12:
    numpy and pytest from PyPI, and a torch in setup.sh's range with a wheel for each. Where the
    CPU index (download.pytorch.org) cannot be reached, as here, PyPI's list of torch wheels
    stands in for it (the same releases; PyPI's are CUDA builds, several GB, so not fetched)."""
    import concurrent.futures
    import urllib.request
    from packaging.specifiers import SpecifierSet
    from course.bundle import REQUIREMENTS, TORCH
    def resolve(version):
        return subprocess.run([PY, "-m", "pip", "install", "--dry-run", "--quiet",
                               "--ignore-installed", "--python-version", version,
                               "--only-binary=:all:", "--target", str(tmp_path / version),
                               "--report", str(tmp_path / f"{version}.json"),
                               *REQUIREMENTS.split()], capture_output=True, text=True,
                              timeout=600)
    versions = ("3.10", "3.11", "3.12")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        done = dict(zip(versions, pool.map(resolve, versions)))
    with urllib.request.urlopen("https://pypi.org/pypi/torch/json", timeout=60) as answer:
        releases = json.load(answer)["releases"]
    wanted = SpecifierSet(TORCH[len("torch"):])
    for version in versions:
        assert done[version].returncode == 0, (version, done[version].stderr[-2000:])
        with open(tmp_path / f"{version}.json") as f:
            names = {i["metadata"]["name"].lower() for i in json.load(f)["install"]}
        assert {"numpy", "pytest"} <= names, (version, names)
        tag = "cp" + version.replace(".", "")
        assert any(release in wanted and any(f"-{tag}-{tag}-" in w["filename"] and "linux" in
                                             w["filename"] for w in wheels)
                   for release, wheels in releases.items()), (version, TORCH)


def test_the_sheet_prints_the_points_table():
    sheet = grading.read(os.path.join(ROOT, "docs", "course.md"))
    for k, (title, points) in EXERCISES.items():
        assert f"| {k} {title} | " + ", ".join(f"`{n}` {p}" for n, p in points.items()) + " |" \
            in sheet


def test_the_copy_note_names_the_functions_that_are_the_reference_s_alone():
    """copies(): the exercises' functions a file holds as the reference has them, statement for
    statement, whatever its comments and layout; a plant's and a blank's are not."""
    every = {n for k in EXERCISES for n in names(k)}
    flipped = source.apply_edits(REFERENCE, MISTAKES[0][2])  # exercise 1's group_advantages
    assert grading.copies(flipped, REFERENCE) == every - {"group_advantages"}
    assert grading.copies(source.blank(REFERENCE, [3]), REFERENCE) == every - set(names(3))
    laid_out = REFERENCE.replace("\ndef group_advantages(", "\n# mine\n\n\ndef group_advantages(")
    assert laid_out != REFERENCE and grading.copies(laid_out, REFERENCE) == every


def test_the_reference_copied_is_said_and_grade_all_needs_a_set(tmp_path):
    """A copy of the public reference gets its marks, and a line for the instructor; a class is
    never graded on the set 'all' by default (its files hold the reference outside their set)."""
    (tmp_path / "copy.py").write_text(REFERENCE)
    done = subprocess.run([PY, "-m", "course", "grade", str(tmp_path / "copy.py"), "--set", "grpo"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "total 30.0/30 points" in done.stdout, done.stderr
    assert done.stdout.count(grading.SAME_NOTE) == 3  # exercises 1, 3 and 5
    (tmp_path / "class").mkdir()
    done = subprocess.run([PY, "-m", "course", "grade-all", str(tmp_path / "class")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "grade-all needs --set" in done.stderr
