"""A handout (course/handout.py, course/source.py): its blank functions (signature, docstring and
door kept), its tests replaying the loops' recorded outputs, the hidden set it carries (the one
the official grade runs), and each set's handout holding no solution and grading in order.
"""

import ast
import json
import os
import subprocess

import pytest
import torch

from course import grading, source
from course.exercises import EXERCISES, SETS, names
from submissions import PY, REFERENCE, ROOT

pytestmark = pytest.mark.slow  # python -m pytest -m slow


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


def test_a_handout_carries_the_hidden_set_the_official_grade_runs(tmp_path):
    """One hidden set: a handout's tests/course/test_hidden.py is the repository's, byte for byte
    (what is hidden is the seed), and the handout's map grades the tests the official map does,
    test_inputs_unchanged among them."""
    out = tmp_path / "h"
    done = subprocess.run([PY, "-m", "course", "handout", str(out), "--set", "grpo"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    held = (out / grading.HIDDEN).read_bytes()
    assert held == open(os.path.join(ROOT, grading.HIDDEN), "rb").read()
    tests = json.loads((out / grading.MAP_FILE).read_text())["tests"]
    assert tests == grading.test_map(REFERENCE)["tests"]
    assert "test_inputs_unchanged[group_advantages]" in tests


def test_each_handout_of_a_set_scans_clean_and_grades_in_order():
    """selfcheck's handout part on the grpo set: nothing in it solves an exercise, and written in
    order (none, 1, 1 and 3, all three) it gets full marks for those and 0 for the rest."""
    from course.selfcheck import check_handouts
    assert check_handouts(REFERENCE, {"grpo": SETS["grpo"]}) == []
