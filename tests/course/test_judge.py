"""The student's code computes; the grader judges (docs/course.md): the expected values, the test
runner and the results stay where a submission cannot reach them, and what crosses is values.
The protocol; the attacks of issue 34 (classes.attack_sources: the grader's files read, pytest
patched, results written, torch.allclose replaced, a handout's outputs replayed), each getting
no more than its base from grade-all (twice, in two orders) and from the bundle; and the answers
and writes into inputs the judge must see through.
"""

import csv
import json
import os
import shutil
import subprocess
import time

import pytest
import torch

from classes import UNFLAGGED
from course import protocol, source
from course.exercises import CORRECT as OTHER_CORRECT
from submissions import (BASE, CORRECT, PY, REFERENCE, ROOT, SEED, code_tests, grade, needs_bwrap,
                         run_bundle)

pytestmark = pytest.mark.slow  # python -m pytest -m slow


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


@needs_bwrap
def test_a_class_with_every_attack_graded_twice_in_two_orders_gives_one_csv(cheats):
    tmp, sources = cheats
    folder = tmp / "class"
    folder.mkdir()
    for i, (name, (text, _)) in enumerate(sources.items()):
        (folder / f"attack{i}.py").write_text(text)
    (folder / "blank.py").write_text(BASE)
    (folder / "correct.py").write_text(REFERENCE)
    (folder / "zz-correct-too.py").write_text(source.apply_edits(REFERENCE, OTHER_CORRECT[3][2]))
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


@needs_bwrap
def test_every_attack_gets_no_more_than_its_base_from_the_bundle(bundle, cheats):
    tmp, root, _ = bundle
    aimed, sources = cheats  # the attacks aim at aimed/bundle/results: here, at each root's
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


# each function answers an empty tensor, (0, ..., 1): torch.allclose broadcasts it against any
# expected value to an empty comparison, which is "all close"
EMPTY = '''
def _empty(x):
    return torch.empty((0,) + tuple(x.shape[:-1]) + (1,), dtype=torch.float64)


def group_advantages(rewards, scale="std", eps=1e-6, baseline="mean"):
    return _empty(rewards)


def overlong_penalty(lengths, max_len, cache_len):
    return _empty(lengths)
'''


@needs_bwrap
def test_an_empty_answer_is_not_all_close_to_every_expected_value(tmp_path):
    """An answer with no elements computes nothing; the judge's torch.allclose(got, expected)
    broadcast it to an empty comparison (True): 12 of 17 tests passed, group_advantages' hidden
    test among them, and it got 1.8 of 10 points."""
    said = grade(tmp_path, BASE + EMPTY, "-e", "1")
    assert "total 0.0/10" in said, said


RETURN = "    return torch.where(all_equal, torch.zeros_like(centred), centred)\n"


def group_advantages_then(statement: str) -> str:
    """CORRECT with `statement` run in group_advantages after its answer is made."""
    assert CORRECT.count(RETURN) == 1
    return CORRECT.replace(RETURN, "    _out = torch.where(all_equal, torch.zeros_like(centred), "
                                   f"centred)\n    {statement}\n    return _out\n")


@needs_bwrap
def test_a_write_into_an_input_through_data_is_seen(tmp_path):
    """The child reports an input as changed when its version counter moved; `rewards.data` is a
    tensor of the same memory with a counter of its own. group_advantages, right, then zeroing its
    rewards through .data passed test_inputs_unchanged: 10/10, where the same write made the
    ordinary way (`rewards.zero_()`) fails that test (9.4/10)."""
    said = grade(tmp_path, group_advantages_then("rewards.data.zero_()"), "-e", "1", "-v")
    assert "FAILED test_inputs_unchanged[group_advantages]" in said, said


# torch.equal, which the child's before-and-after comparison of the inputs calls, replaced in
# the student's own process: through an alias of the module, or as a for loop's target
EQUAL_ALWAYS = {"alias": "_t = torch\n_t.equal = lambda *a, **k: True\n",
                "class": "_T = torch.Tensor\n_T.contiguous = lambda self: self\n",
                "__class__": "_x = torch.zeros(1)\n_x.__class__ = torch.nn.Parameter\n",
                "for target": "for torch.equal in [lambda *a, **k: True]:\n    pass\n"}


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
