"""The lab's failure-1 case (--long-misconception-rate) and lab/failures.py: the flag's default
changes nothing, its misconception and measures worked by hand, the two failures read in pairs on
made runs, and docs/lab.md's tables are what the command prints from the committed results."""

import dataclasses
import glob
import hashlib
import json
import os
import random
import re

import pytest
import torch

import tiny_task
import train_tiny as tt
from lab import cli, failures, records

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project root


def test_the_flags_default_changes_nothing():
    """The demonstrator and the warm-up's cache key are what they were before the flag: 500
    demonstrations pinned with the code of the commit before it (441 finished, 12,163 characters,
    333 right), and a key without the new field."""
    task, rng = tiny_task.Task(), random.Random(1)
    problems = tiny_task.ProblemStream(task, 2).next(500)
    out = [tiny_task.demonstrate(p, task, rng) for p in problems]
    assert sum(f for _, f in out) == 441 and sum(len(t) for t, _ in out) == 12163
    assert sum(tiny_task.verify(p, t, f) for p, (t, f) in zip(problems, out)) == 333
    assert hashlib.sha1("\n".join(t for t, _ in out).encode()).hexdigest() == \
        "fd5dc9653dd44f3d805230e9a270b44edb3d1a24"
    old = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)
           if f.name != "long_misconception_rate"}
    key = json.dumps(dict(old, threads=torch.get_num_threads()), sort_keys=True)
    assert tiny_task.warmup_path(task, "runs") == \
        os.path.join("runs", f"warmup-{hashlib.sha1(key.encode()).hexdigest()[:10]}")
    assert tiny_task.warmup_path(tiny_task.Task(long_misconception_rate=0.6), "runs") != \
        tiny_task.warmup_path(task, "runs")
    assert not tiny_task.meets_long_misconception([6, 7, 8], task)
    assert tiny_task.carry_steps("6+7=13,13+8=21>21", task) == (0, 0, 0, 0)


def test_the_second_misconception_hand_worked():
    only = dict(misconception_rate=0.0, slip_rate=0.0, recheck_rate=0.0, loop_rate=0.0)
    task = tiny_task.Task(long_misconception_rate=1.0, **only)
    # 6+7=13 is the first carry (one-digit sum): kept; 13+8 carries into a two-digit sum: lost
    assert tiny_task.demonstrate([6, 7, 8], task, random.Random(0)) == ("6+7=13,13+8=11>11", True)
    assert tiny_task.demonstrate([6, 7, 2], task, random.Random(0)) == ("6+7=13,13+2=15>15", True)
    # 15+9 is the first misconception's step (a 9), kept at its rate 0: the second never takes it
    assert tiny_task.demonstrate([6, 9, 9], task, random.Random(0)) == ("6+9=15,15+9=24>24", True)
    assert tiny_task.meets_long_misconception([6, 7, 8], task)
    assert not tiny_task.meets_long_misconception([6, 7, 2], task)  # no carry at 13+2
    assert not tiny_task.meets_long_misconception([8, 9], task)  # 8+9: a one-digit start
    assert not tiny_task.meets_long_misconception([6, 9, 9], task)  # 15+9: the first's (a 9)
    # (first met, first right, second met, second right), on the response's own sums
    assert tiny_task.carry_steps("6+7=13,13+8=21>21", task) == (0, 0, 1, 1)
    assert tiny_task.carry_steps("6+7=13,13+8=11,13+8=11>11", task) == (0, 0, 2, 0)
    assert tiny_task.carry_steps("6+9=15,15+9=24>24", task) == (2, 2, 0, 0)
    assert tiny_task.carry_steps("6+9=15,15+9=14,14+8=2", task) == (2, 1, 0, 0)  # cut: not counted
    with pytest.raises(ValueError, match="--long-misconception-rate must be in"):
        tiny_task.check_task(tiny_task.Task(long_misconception_rate=1.5))


def test_rollout_fix_fractions_hand_worked():
    """Two groups of two answers: a 2-number problem (short) and a 5-number one (long)."""
    args = tt.Args(long_misconception_rate=0.6)
    batch = dict(terms=torch.tensor([[6, 9, -1, -1, -1], [6, 7, 8, 9, 1]]),
                 correct=torch.tensor([[True, False], [True, False]]))
    texts = ["6+9=15>15", "6+9=5>5", "6+7=13,13+8=21,13+8=21,21+9=30,30+1=31>31",
             "6+7=13,13+8=11,13+8=11,11+9=20,20+1=21>21"]
    assert [tiny_task.carry_steps(text, args) for text in texts] == [
        (1, 1, 0, 0), (1, 0, 0, 0),   # short: 1 of 2 right
        (1, 1, 2, 2), (1, 1, 2, 0)]   # long: 2 of 2; 2 of 4
    stats = failures.fix_fractions(args, batch, texts)
    assert (stats["fix_short"], stats["fix_long"], stats["fix_long_misconception"]) == (0.5, 1.0, 0.5)
    assert failures.is_long((batch["terms"] >= 0).sum(dim=1), args).tolist() == [False, True]  # 4-5 of 2-5
    assert [failures.is_long(n, args) for n in (2, 3, 4, 5)] == [False, False, True, True]


def test_held_out_accuracy_by_length_hand_worked():
    """Four problems: short (2 numbers) or long (4-5), and whether the second misconception applies
    (13+8 in 6+7+8+... is a carry into a two-digit sum; 6+9+9's 15+9 is the first's)."""
    args = tt.Args(long_misconception_rate=0.6)
    problems = [[6, 9], [1, 2], [6, 7, 8, 1], [6, 9, 9, 1, 1]]
    assert [tiny_task.meets_long_misconception(t, args) for t in problems] == [False, False, True, False]
    got = failures.accuracy_by_length(args, problems, [True, False, True, False], [1.0, 0.5, 0.25, 0.75])
    assert got == dict(sampled_accuracy_short=0.75, accuracy_long=0.5, sampled_accuracy_long=0.5,
                       accuracy_long_misconception=1.0, sampled_accuracy_long_misconception=0.25)


def made_run(name, loss_mode, late, entropy, wrong_length, seeds=(0, 1, 2)):
    """A saved run of 30 updates, evaluations at 10, 20 and 30: the second misconception's held-out
    sampled accuracy is late[seed] at each, entropy and wrong-answer length per seed."""
    config = dataclasses.asdict(tt.Args(name=name, methods="grpo", steps=30, eval_every=10,
                                        loss_mode=loss_mode, long_misconception_rate=0.6,
                                        seeds=",".join(map(str, seeds))))
    evals = dict(accuracy=0.9, sampled_accuracy=0.8, length=20.0, accuracy_misconception=0.5,
                 accuracy_other=0.95, sampled_accuracy_misconception=0.4, accuracy_long=0.8,
                 sampled_accuracy_long=0.7, sampled_accuracy_short=0.9, accuracy_long_misconception=0.6)
    runs = [dict(method="grpo", seed=s, wall_s=1.0,
                 updates={**{k: [0.1] * 30 for k in records.UPDATE_KEYS}, "step": list(range(1, 31)),
                          "entropy": [entropy[s]] * 30, "length_wrong": [wrong_length[s]] * 30},
                 evals={k: dict(evals, sampled_accuracy_long_misconception=late[s])
                        for k in ("10", "20", "30")}) for s in seeds]
    start = dict(evals, sampled_accuracy_long_misconception=0.1)
    return dict(name=name, config=config, methods={"grpo": {}}, runs=runs, start=start)


def test_failures_hand_worked_and_merge(tmp_path, capsys):
    base = made_run("long-sample", "sample", [0.3, 0.4, 0.5], [0.05, 0.06, 0.07], [30, 30, 30])
    other = made_run("long-token", "token", [0.4, 0.5, 0.7], [0.04, 0.06, 0.05], [29, 30, 28])
    paths = []
    for run in (base, other):
        paths.append(str(tmp_path / f"{run['name']}.json"))
        with open(paths[-1], "w") as f:
            json.dump(run, f)
    rows = cli.main(["failures", *paths, "--plot", str(tmp_path / "f.png")])
    got = {r["label"]: r for r in rows}
    early = got[failures.SIDE_BY_SIDE[0][1]]
    assert early["diffs"] == pytest.approx([0.1, 0.1, 0.2]) and early["plus"] == 3
    assert got["wrong-answer length, the whole run"]["diffs"] == pytest.approx([-1, 0, -2])
    assert got["entropy, the whole run"]["diffs"] == pytest.approx([-0.01, 0.0, -0.02])
    # 3 of 3 up gives p = 0.25 > 0.05: too small to tell, whatever the interval
    assert failures.verdict(early) == "too small to tell here"
    assert failures.verdict(dict(low=0.01, high=0.1, p=0.002)) == "holds here"
    assert failures.verdict(dict(low=-0.1, high=-0.01, p=0.002)) == "the reverse holds here"
    assert failures.verdict(dict(low=-0.015, high=0.019, p=0.75)) == "does not hold here"
    out = capsys.readouterr().out
    assert "| 1: long right answers learned? | " + failures.SIDE_BY_SIDE[0][1] in out
    assert "correlation of its difference with the wrong-answer length's -0.87" in out
    assert (tmp_path / "f.png").exists()
    # seeds 0-2 split over two files, merged: the same run as one file holds it
    halves = [dict(other, runs=other["runs"][:1]), dict(other, runs=other["runs"][1:])]
    for k, half in enumerate(halves):
        with open(tmp_path / f"half{k}.json", "w") as f:
            json.dump(half, f)
    merged = cli.main(["merge", str(tmp_path / "long-token.json"),
                       str(tmp_path / "half1.json"), str(tmp_path / "half0.json")])
    assert merged["runs"] == other["runs"] and merged["config"]["seeds"] == "0,1,2"
    with pytest.raises(ValueError, match="differ in loss_mode"):
        cli.main(["merge", str(tmp_path / "x.json"), paths[0], str(tmp_path / "half0.json")])


def test_the_failures_tables_are_what_the_command_prints(capsys):
    """Every `python -m lab failures ...` command README.md or docs/lab.md quotes is run on the
    committed runs; their failures tables, and the verdict lines they quote, are what it prints."""
    texts = [open(os.path.join(HERE, page)).read() for page in ("README.md", "docs/lab.md")]
    commands = {c.strip() for text in texts
                for c in re.findall(r"python -m lab failures ((?:results/\S+\.json ?)+)", text)}
    assert commands and glob.glob(os.path.join(HERE, "results", "paired-long-*.json"))
    printed = []
    for command in sorted(commands):
        cli.main(["failures", *[os.path.join(HERE, p) for p in command.split()]])
        printed += capsys.readouterr().out.splitlines()
    quoted = [line for text in texts for line in text.splitlines()
              if line.startswith(("| 1: ", "| 2: ", "| stability", "failure 1, ", "| first mis",
                                  "| held-out sampled accuracy, long p", "| held-out sampled accuracy, short",
                                  "| held-out greedy where the s"))]
    assert len(quoted) >= 11 + 1 + 7 and not [q for q in quoted if q not in printed], \
        [q for q in quoted if q not in printed][:2]
