"""lab/stats.py and lab/compare.py: the paired comparison of two runs, seed by seed, and the report."""

import dataclasses
import json
import math

import pytest

from lab import cli, compare, records, stats
import train_tiny as tt


# -----------------------------------------------------------------------------
# the lab's paired comparison: two runs, seed by seed

def test_t_quantile_and_the_sign_test_against_closed_forms():
    # df 1 and 2 have closed forms: tan(pi (p - 1/2)) and (2p - 1) / sqrt(2 p (1 - p))
    assert stats.t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-9)
    assert stats.t_quantile(0.975, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-9)
    assert stats.t_quantile(0.975, 9) == pytest.approx(2.262157, abs=1e-6)  # the printed tables'
    assert stats.t_quantile(0.5, 5) == pytest.approx(0.0, abs=1e-9)
    # two-sided: 2 P(Binomial(n, 1/2) <= smaller count); 7 of 7 is 2/128, 3 of 3 is 2/8
    assert stats.sign_test_p(0, 7) == 2 / 128 and stats.sign_test_p(3, 0) == 0.25
    assert stats.sign_test_p(2, 8) == 2 * (1 + 10 + 45) / 1024 and stats.sign_test_p(5, 5) == 1.0
    assert stats.sign_test_p(0, 0) == 1.0  # every seed tied: no evidence either way
    with pytest.raises(ValueError, match="0.5 <= p < 1 and df >= 1, got p=0.3"):
        stats.t_quantile(0.3, 4)


def test_paired_stats_hand_worked():
    # differences -1, -2, -3, +0.5: mean -1.375; Bessel sd sqrt(6.6875 / 3) = 1.49304; the 95 %
    # half-width t(0.975, 3) sd / sqrt(4) = 3.182446 x 0.746520 = 2.375759
    s = stats.paired_stats([-1.0, -2.0, -3.0, 0.5])
    assert s["mean"] == -1.375 and (s["plus"], s["minus"], s["zero"]) == (1, 3, 0)
    assert s["low"] == pytest.approx(-1.375 - 2.375759, abs=1e-5)
    assert s["high"] == pytest.approx(-1.375 + 2.375759, abs=1e-5)
    assert s["p"] == 2 * (1 + 4) / 16  # 1 of 4 positive
    tied = stats.paired_stats([5e-8, -1.0, -1.0], digits=4)  # +0.0000 as printed: a tie, counted
    assert (tied["plus"], tied["minus"], tied["zero"], tied["p"]) == (0, 2, 1, 0.5)  # apart
    assert stats.paired_stats([5e-8, -1.0, -1.0], digits=8)["plus"] == 1


def fake_run(name, seeds, truncated, wrong, sampled, **config):
    """A saved run as records.load_run returns it: grpo, 12 updates; truncated[s] and wrong[s] are
    seed s's per-update series (None: no wrong answer in that batch), sampled[s] its last
    held-out sampled accuracy."""
    cfg = {**dataclasses.asdict(tt.Args()), "methods": "grpo", "name": name, "steps": 12,
           "seeds": ",".join(map(str, seeds)), **config}
    evals = dict(accuracy=0.9, length=20.0, accuracy_misconception=0.8, accuracy_other=0.95,
                 sampled_accuracy_misconception=0.5)
    runs = [dict(method="grpo", seed=s, wall_s=1.0, evals={"12": dict(evals, sampled_accuracy=sampled[s])},
                 updates={**{k: [0.5] * 12 for k in records.UPDATE_KEYS}, "step": list(range(1, 13)),
                          "truncated_frac": truncated[s], "length_wrong": wrong[s]})
            for s in seeds]
    start = dict(evals, sampled_accuracy=0.4)
    return dict(name=name, config=cfg, methods={"grpo": {}}, start=start, runs=runs)


def test_compare_pairs_seeds_hand_worked(tmp_path, capsys):
    """Seeds 1 and 2 are in both runs (0 and 3 are not); updates 1-10 and 1-12 are averaged per
    seed before the difference, and a batch with no wrong answer (None) is left out."""
    flat = lambda x: [x] * 12  # noqa: E731
    base = fake_run("base", [0, 1, 2], {0: flat(0.9), 1: flat(0.10), 2: [0.2] * 10 + [0.0, 0.0]},
                    {0: flat(9.0), 1: flat(30.0), 2: flat(40.0)}, {0: 0.0, 1: 0.80, 2: 0.70})
    other = fake_run("other", [1, 2, 3], {1: flat(0.05), 2: [0.2] + [0.1] * 9 + [0.3, 0.3],
                                            3: flat(0.0)},
                     {1: [None] * 6 + [24.0] * 6, 2: flat(41.0), 3: flat(0.0)},
                     {1: 0.85, 2: 0.69, 3: 1.0}, loss_mode="token")
    paths = []
    for run in (base, other):
        paths.append(str(tmp_path / f"{run['name']}.json"))
        with open(paths[-1], "w") as f:
            json.dump(run, f)
    [p] = cli.main(["compare", *paths, "--plot", str(tmp_path / "pair.png")])
    out = capsys.readouterr().out
    assert p["seeds"] == [1, 2] and p["changed"] == {"loss_mode": ("sample", "token")}
    rows = {row["label"]: (row["diffs"], row) for row in p["rows"]}
    # truncated, seed 1: 0.05 - 0.10; seed 2, updates 1-10: 1.1 / 10 - 0.2; all 12: (1.7 - 2) / 12
    assert rows["truncated fraction, updates 1-10"][0] == pytest.approx([-0.05, -0.09])
    assert rows["truncated fraction, updates 1-12"][0] == pytest.approx([-0.05, -0.3 / 12])
    assert rows["wrong-answer length, updates 1-12"][0] == pytest.approx([24.0 - 30.0, 1.0])
    assert rows["wrong-answer length, updates 1-10"][0] == pytest.approx([-6.0, 1.0])  # 24 x 4 / 4
    diffs, s = rows["held-out sampled accuracy, at the end"]
    assert diffs == pytest.approx([0.05, -0.01]) and (s["plus"], s["minus"]) == (1, 1)
    assert s["mean"] == pytest.approx(0.02) and s["p"] == 1.0
    assert rows["response length, updates 1-12"][0] == [0.0, 0.0]  # the same series: ties
    assert out.startswith("paired comparison, other:grpo - base:grpo, loss_mode 'sample' -> "
                          "'token': seeds 1, 2 (2 in common; update 1's rollouts identical in 1")
    assert "| truncated fraction, updates 1-10 | -0.0500 -0.0900 | -0.0700 [" in out
    assert (tmp_path / "pair.png").stat().st_size > 0
    cli.main(["compare", *paths, *paths, "--primary"])  # two pairs, the two primary rows of each
    primary = capsys.readouterr().out.splitlines()
    assert primary[1] == compare.PRIMARY_HEADER and len(primary) == 3 + 2 * 2
    assert primary[3].startswith("| other - base | loss_mode 'sample' -> 'token' | truncated "
                                 "fraction, updates 1-10 | -0.0500 -0.0900 |")
    assert primary[4].startswith("| other - base | loss_mode 'sample' -> 'token' | wrong-answer "
                                 "length, updates 1-12 | -6.00 +1.00 |")
    with pytest.raises(ValueError, match="expected BASE OTHER pairs"):
        cli.main(["compare", *paths, paths[0]])


def test_compare_refuses_runs_it_cannot_pair(tmp_path):
    series = {s: [0.1] * 12 for s in range(3)}
    sampled = {s: 0.5 for s in range(3)}

    def side(name, seeds=(0, 1), **config):
        run = fake_run(name, list(seeds), series, series, sampled, **config)
        with open(tmp_path / f"{name}.json", "w") as f:
            json.dump(run, f)
        return records.load_side(str(tmp_path / f"{name}.json"))
    base = side("base")
    with pytest.raises(ValueError, match="no seed in common"):
        compare.pair_up(base, side("later", seeds=(2,), loss_mode="token"))
    with pytest.raises(ValueError, match="differ in loop_rate 0.12 -> 0.3, so one seed no longer"):
        compare.pair_up(base, side("loops", loop_rate=0.3, loss_mode="token"))
    with pytest.raises(ValueError, match="warmup_seed 1234 -> 7"):
        compare.pair_up(base, side("start", warmup_seed=7))
    with pytest.raises(ValueError, match="more than one knob, eps_high 0.2 -> 0.28, loss_mode"):
        compare.pair_up(base, side("two", eps_high=0.28, loss_mode="token"))
    with pytest.raises(ValueError, match="the same arguments"):
        compare.pair_up(base, side("twin"))
    elsewhere = side("elsewhere", loss_mode="token")
    elsewhere[0]["start"]["accuracy"] = 0.79  # the same arguments, another machine's warm-up
    with pytest.raises(ValueError, match=r"different policies .*\(0.9, 0.4, 20.0\) and \(0.79, "):
        compare.pair_up(base, elsewhere)
    with pytest.raises(ValueError, match="no saved run at"):
        records.load_side(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="name one, as .*:grpo, got 'dapo'"):
        records.load_side(str(tmp_path / "base.json") + ":dapo")
    assert compare.pair_up(base, side("token", loss_mode="token")) == ([0, 1], {"loss_mode": ("sample", "token")})


def test_the_report_prints_nan_where_no_held_out_problem_meets_the_misconception(tmp_path, capsys):
    """A held-out set too small to draw such a problem (--eval-size 4) has NaN accuracy there,
    stored as None; the report prints it as it prints any NaN, never a TypeError."""
    series = {s: [0.1] * 12 for s in (0, 1)}
    run = fake_run("few", [0, 1], series, {s: [20.0] * 12 for s in (0, 1)}, {0: 0.5, 1: 0.75})
    for evals in [run["start"]] + [r["evals"]["12"] for r in run["runs"]]:
        evals.update(accuracy_misconception=None, sampled_accuracy_misconception=None)
    with open(tmp_path / "few.json", "w") as f:
        json.dump(run, f)
    cli.report([str(tmp_path / "few.json")])
    out = capsys.readouterr().out
    assert "from 0.900 greedy (nan where the misconception applies) and 0.400 sampled (nan):" in out
    assert "| grpo | 0.900 +- 0.000 | 0.625 +- 0.177 | nan +- nan | 20.0 +- 0.0 | 0.100 -> 0.100 " \
           "| 20.0 +- 0.0 | 0.500 |" in out  # sampled: (0.5 + 0.75) / 2, std 0.25 / sqrt(2)


def test_the_report_names_a_table_it_does_not_print_again(tmp_path, capsys):
    """Two runs with the same results table (here: the same numbers): the second run's section
    gives its title and says it is the same, so that a reader does not think it missing."""
    series = {0: [0.1] * 12}
    for name in ("ours", "mine"):
        with open(tmp_path / f"{name}.json", "w") as f:
            json.dump(fake_run(name, [0], series, series, {0: 0.5}), f)
    cli.report([str(tmp_path / "ours.json"), str(tmp_path / "mine.json")])
    mine = capsys.readouterr().out.split("## mine\n")[1].split("\n")
    assert mine[1].startswith("held-out accuracy after 12 policy updates") and \
        mine[2] == "(the same table as above)" and mine[4].startswith("rollout statistics")


