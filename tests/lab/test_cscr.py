"""lab/cscr.py: CSCR's sweep read in pairs, on hand-made runs whose differences are worked here."""

import dataclasses
import json

import pytest

from lab import cscr, records
import train_tiny as tt


def cscr_run(name, strength, tau, entropy, sampled, warmup_seed=1234):
    """Two seeds (0, 1), four updates, evaluations at updates 2 and 4: entropy[seed] per update,
    sampled[seed] the held-out sampled accuracy at (2, 4)."""
    config = dataclasses.asdict(tt.Args(name=name, methods="cscr", seeds="0,1", steps=4,
                                        cscr_strength=strength, cscr_threshold=tau,
                                        warmup_seed=warmup_seed))
    evals = dict(accuracy=0.9, length=20.0, accuracy_misconception=0.5, accuracy_other=0.95,
                 sampled_accuracy_misconception=0.4)
    runs = [dict(method="cscr", seed=s, wall_s=1.0,
                 updates={**{k: [0.1] * 4 for k in records.UPDATE_KEYS}, "step": [1, 2, 3, 4],
                          "entropy": entropy[s]},
                 evals={"2": dict(evals, sampled_accuracy=sampled[s][0]),
                        "4": dict(evals, sampled_accuracy=sampled[s][1], accuracy=0.9 + s / 10)})
            for s in (0, 1)]
    return dict(name=name, config=config, methods={"cscr": {}}, runs=runs,
                start=dict(evals, sampled_accuracy=0.5))


def save(tmp_path, *runs):
    paths = []
    for run in runs:
        paths.append(str(tmp_path / f"{run['name']}.json"))
        with open(paths[-1], "w") as f:
            json.dump(run, f)
    return paths


def test_sweep_against_strength_0_hand_worked(tmp_path, capsys):
    base = cscr_run("s0", 0.0, 0.0, {0: [0.1, 0.1, 0.1, 0.1], 1: [0.3, 0.3, 0.3, 0.3]},
                    {0: (0.6, 0.7), 1: (0.6, 0.4)})
    strong = cscr_run("s4", 4.0, 0.0, {0: [0.2, 0.3, 0.25, 0.1], 1: [0.3, 0.3, 0.9, 0.7]},
                      {0: (0.4, 0.6), 1: (0.3, 0.2)})
    tau = cscr_run("s4-tau", 4.0, 0.1, {0: [0.2, 0.1, 0.1, 0.1], 1: [0.3, 0.3, 0.3, 0.3]},
                   {0: (0.6, 0.7), 1: (0.6, 0.4)})
    rows = cscr.sweep(save(tmp_path, base, strong, tau) + ["--plot", str(tmp_path / "s.png")])
    got = {(r["tau"], r["measure"]): r["diffs"] for r in rows if r["strength"] == 4.0}
    end, stable, drop = cscr.MEASURES[0][0], cscr.MEASURES[5][0], cscr.MEASURES[6][0]
    assert got[0.0, end] == pytest.approx([0.6 - 0.7, 0.2 - 0.4])
    # entropy > 2 x strength 0's: seed 0 at updates 2 and 3 (0.3 and 0.25 > 0.2; update 1's 0.2
    # is equal, not more); seed 1 at updates 3 and 4 (0.9 and 0.7 > 0.6)
    assert got[0.0, stable] == [2.0, 2.0]
    # largest drop from the start 0.5: strength 0 seed 0 none, seed 1 0.6 -> 0.4; strength 4
    # seed 0 0.5 -> 0.4, seed 1 0.5 -> 0.3
    assert got[0.0, drop] == pytest.approx([0.1 - 0.0, 0.2 - 0.2])
    # tau > 0 pairs with the one strength-0 run, which never reads tau
    assert got[0.1, end] == [0.0, 0.0] and got[0.1, stable] == [0.0, 0.0]
    out = capsys.readouterr().out
    assert "| 4 | 0 | -0.100 -0.200 | -0.150 [" in out and (tmp_path / "s.png").exists()


def test_sweep_refuses_what_it_cannot_pair(tmp_path):
    run = cscr_run("s1", 1.0, 0.0, {0: [0.1] * 4, 1: [0.1] * 4}, {0: (0.5, 0.5), 1: (0.5, 0.5)})
    with pytest.raises(ValueError, match="no strength-0 run"):
        cscr.sweep(save(tmp_path, run))
    base = cscr_run("s0", 0.0, 0.0, {0: [0.1] * 4, 1: [0.1] * 4}, {0: (0.5, 0.5), 1: (0.5, 0.5)})
    other_task = dict(run, name="s1-other", config=dict(run["config"], misconception_rate=0.5))
    with pytest.raises(ValueError, match="differ in misconception_rate"):
        cscr.sweep(save(tmp_path, base, other_task))
    with pytest.raises(ValueError, match="both strength 1"):
        cscr.sweep(save(tmp_path, base, run, dict(run, name="again")))
