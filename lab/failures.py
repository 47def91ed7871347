"""6. The two length failures of sample-level averaging, read in pairs ("token" minus "sample").

Failure 1, useful long reasoning diluted: are long right answers underlearned? It can act only
where long right answers carry decisions RL must reinforce: --long-misconception-rate gives the
warm-up a second misconception that only answers of 3+ numbers meet (tiny_task.py), and the
primary measure, fixed before the runs, is the held-out sampled accuracy where it applies, early
(the evaluations at updates 10, 20 and 30) and at the end.
Failure 2, long detours under-penalised: are long wrong answers pushed down? The truncated
fraction over updates 1-10 and the wrong-answer length over the run (question 4's measures).
Stability, not verbosity: the entropy and the right-answer length over the run.
Failure 1's measures are taken during training: MEASURES, which every python -m lab run hands to
train_tiny's loop, adds them to each update's record and each held-out evaluation.

    python -m lab failures BASE OTHER [BASE OTHER ...] [--plot PATH]   # the table, the picture
    python -m lab merge results/NAME.json runs/NAME-s0 runs/NAME-s1 ...  # one run from its seeds
"""

import argparse
import json
import math
import os
from typing import List

import torch

import tiny_task
import train_tiny as tt
from lab import compare, plots
from lab.records import load_run, seed_run
from lab.stats import mean_of, paired_stats

EARLY_EVALS = ("10", "20", "30")  # "early": the mean of these held-out evaluations
SPREAD = 20  # "updates 1-20": how fast a misconception's fix spreads in the rollouts
NEGLIGIBLE = 0.02  # failure 1 does not hold if its interval lies within +- this (fixed in advance)


# -----------------------------------------------------------------------------
# failure 1's measures, taken while train_tiny trains

def is_long(num_terms, args) -> bool:
    """More numbers than the middle of the task's range (4 or 5 of 2-5): a problem whose answer
    is long. num_terms: an int, or a tensor of them."""
    return num_terms * 2 > args.min_terms + args.max_terms


def fix_fractions(args, batch: dict, texts: List[str]) -> dict:
    """Of the steps where a misconception applies in the update's rollouts, the fraction written
    right: the first's in answers to short and to long problems (is_long), the second's
    (--long-misconception-rate), all in long answers."""
    carries = torch.tensor([tiny_task.carry_steps(text, args) for text in texts]).float()  # (N, 4)
    long = is_long((batch["terms"] >= 0).sum(dim=1), args)  # (B,)
    long = long[:, None].expand(batch["correct"].shape).flatten()  # (N,)

    def done_right(rows, k):  # carries: met, right for the first; met, right for the second
        met = carries[rows, 2 * k].sum()
        return float(carries[rows, 2 * k + 1].sum() / met) if met else float("nan")
    return dict(fix_short=done_right(~long, 0), fix_long=done_right(long, 0),
                fix_long_misconception=done_right(slice(None), 1))


def accuracy_by_length(args, problems, greedy, sampled) -> dict:
    """Held-out accuracy on short problems (sampled), on long ones, and where the second
    misconception applies (greedy and sampled)."""
    groups = dict(long=[is_long(len(t), args) for t in problems],
                  long_misconception=[tiny_task.meets_long_misconception(t, args)
                                      for t in problems])

    def mean(xs, among, where=True):  # where `among` is `where`
        xs = [x for x, m in zip(xs, among) if m == where]
        return sum(xs) / len(xs) if xs else float("nan")
    return dict(sampled_accuracy_short=mean(sampled, groups["long"], False),
                **{f"{what}_{name}": mean(xs, among) for name, among in groups.items()
                   for what, xs in (("accuracy", greedy), ("sampled_accuracy", sampled))})


MEASURES = tt.Measures(rollouts=fix_fractions, evaluation=accuracy_by_length)


# -----------------------------------------------------------------------------
# the failures, read in pairs

def evals_mean(key: str, steps):  # (run record) -> the mean of a held-out measure at steps
    return lambda r: mean_of([r["evals"].get(s, {}).get(key) for s in steps])


def at_end(key: str):
    return lambda r: r["evals"][max(r["evals"], key=int)].get(key)


def updates_mean(key: str, first: int = 0, last=None):  # over updates first+1 .. last
    return lambda r: mean_of(r["updates"][key][first:last])


# (failure, measure, digits, per-seed value of a run record); failure 1's rows only for runs that
# have the second misconception. The first row is failure 1's primary measure.
LONG = "held-out sampled accuracy where the second misconception applies"
SIDE_BY_SIDE = (
    ("1: long right answers learned?", f"{LONG}, updates 10-30", 3,
     evals_mean("sampled_accuracy_long_misconception", EARLY_EVALS)),
    ("1: long right answers learned?", f"{LONG}, at the end", 3,
     at_end("sampled_accuracy_long_misconception")),
    ("1: long right answers learned?", f"its steps written right in the rollouts, updates "
     f"1-{SPREAD}", 3, updates_mean("fix_long_misconception", 0, SPREAD)),
    ("2: long wrong answers pushed down?", f"truncated fraction, updates 1-{compare.EARLY}", 4,
     updates_mean("truncated_frac", 0, compare.EARLY)),
    ("2: long wrong answers pushed down?", "wrong-answer length, the whole run", 2,
     updates_mean("length_wrong")),
    ("stability, not verbosity", "entropy, the whole run", 4, updates_mean("entropy")),
    ("stability, not verbosity", "right-answer length, the whole run", 2,
     updates_mean("length_correct")),
)
DETAIL = (  # failure 1's described measures, beside the primary ones
    (f"first misconception's steps written right, short problems, updates 1-{SPREAD}", 3,
     updates_mean("fix_short", 0, SPREAD)),
    (f"first misconception's steps written right, long problems, updates 1-{SPREAD}", 3,
     updates_mean("fix_long", 0, SPREAD)),
    ("held-out sampled accuracy, long problems (4-5 numbers), updates 10-30", 3,
     evals_mean("sampled_accuracy_long", EARLY_EVALS)),
    ("held-out sampled accuracy, short problems (2-3 numbers), updates 10-30", 3,
     evals_mean("sampled_accuracy_short", EARLY_EVALS)),
    ("held-out sampled accuracy, long problems (4-5 numbers), at the end", 3,
     at_end("sampled_accuracy_long")),
    ("held-out sampled accuracy, short problems (2-3 numbers), at the end", 3,
     at_end("sampled_accuracy_short")),
    ("held-out greedy where the second misconception applies, at the end", 3,
     at_end("accuracy_long_misconception")),
)
HEADER = ("| failure | measure | pair: token - sample | per seed, in seed order | mean [95 % "
          "t-interval] | seeds + / - / 0 | sign test p |")
DETAIL_HEADER = ("| measure | per seed, in seed order | mean [95 % t-interval] | seeds + / - / 0 | "
                 "sign test p |")


def has_long_misconception(p: dict) -> bool:
    return bool(p["base"][0]["config"].get("long_misconception_rate"))


def paired_measure(p: dict, label: str, digits: int, value) -> dict:
    """One measure of one pair: each seed's OTHER - BASE and its paired_stats."""
    diffs = [value(seed_run(p["other"], s)) - value(seed_run(p["base"], s)) for s in p["seeds"]]
    return dict(label=label, digits=digits, diffs=diffs, **paired_stats(diffs, digits))


def side_by_side(pairs: List[dict]) -> list:
    """The table's rows: each measure of SIDE_BY_SIDE for each pair that has it."""
    rows = []
    for failure, label, digits, value in SIDE_BY_SIDE:
        for p in pairs:
            if failure.startswith("1") and not has_long_misconception(p):
                continue
            rows.append(dict(paired_measure(p, label, digits, value), failure=failure,
                             pair=f"{p['other'][0]['name']} - {p['base'][0]['name']}"))
    return rows


def verdict(row: dict) -> str:
    """The reading fixed before the runs, of failure 1's primary measure."""
    if row["low"] > 0 and row["p"] <= 0.05:
        return "holds here"
    if row["high"] < 0 and row["p"] <= 0.05:
        return "the reverse holds here"
    if -NEGLIGIBLE <= row["low"] and row["high"] <= NEGLIGIBLE:
        return "does not hold here"
    return "too small to tell here"


def correlation(xs: List[float], ys: List[float]) -> float:
    """Pearson's correlation over seeds (nan if either is constant)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else float("nan")


def format_failures(pairs: List[dict], rows: list) -> str:
    """The two failures side by side, then failure 1's verdict and its details for each pair that
    has the second misconception, and whether the two failures move together seed by seed."""
    lines = ["the two length failures, \"token\" against \"sample\" seed by seed (OTHER - BASE; "
             "failure 1 above 0 and failure 2 below 0 are the chapter's direction):",
             HEADER, "|---" * 7 + "|"]
    lines += [f"| {r['failure']} | {r['label']} | {r['pair']} | {compare.format_paired(r)} |"
              for r in rows]
    for p in filter(has_long_misconception, pairs):
        name = f"{p['other'][0]['name']} - {p['base'][0]['name']}"
        mine = [r for r in rows if r["pair"] == name]
        primary, wrong = mine[0], next(r for r in mine if r["label"].startswith("wrong-answer"))
        lines += ["", f"failure 1, {name}: {verdict(primary)} (primary: {primary['label']}, "
                  f"{primary['mean']:+.3f} [{primary['low']:+.3f}, {primary['high']:+.3f}], "
                  f"{primary['plus']} of {primary['n']} seeds up, p = {primary['p']:.3f}); "
                  f"the two failures seed by seed: correlation of its difference with the "
                  f"wrong-answer length's {correlation(primary['diffs'], wrong['diffs']):+.2f}",
                  f"failure 1's described measures, {name}:", DETAIL_HEADER, "|---" * 5 + "|"]
        lines += [f"| {label} | {compare.format_paired(paired_measure(p, label, d, value))} |"
                  for label, d, value in DETAIL]
    return "\n".join(lines)


def failures(argv: List[str]) -> list:
    """python -m lab failures BASE OTHER [BASE OTHER ...] [--plot PATH]"""
    parser = argparse.ArgumentParser(
        prog="python -m lab failures", description="The two length failures of sample-level "
        "averaging, seed by seed: long right answers learned (failure 1, on runs with "
        "--long-misconception-rate), long wrong answers pushed down (failure 2), entropy and "
        "right-answer length; each pair's OTHER - BASE per seed, the mean with a 95 % "
        "t-interval, the sign counts and the exact two-sided sign test.")
    parser.add_argument("runs", nargs="+", metavar="BASE OTHER", help="pairs of saved runs, "
                        "\"sample\" then \"token\": runs/NAME or results/NAME.json")
    parser.add_argument("--plot", metavar="PATH", help="draw the picture there")
    a = parser.parse_args(argv)
    pairs = compare.load_pairs("failures", a.runs)
    rows = side_by_side(pairs)
    print(format_failures(pairs, rows))
    if a.plot:
        plots.plot_failures(pairs, rows, a.plot)
        print(f"wrote {a.plot}")
    return rows


def merge(argv: List[str]) -> dict:
    """python -m lab merge OUT.json RUN...: the compact copy of runs made seed by seed (one
    train_tiny.py call per seed, as failure 1's were) as if one call had made them all."""
    parser = argparse.ArgumentParser(
        prog="python -m lab merge", description="Merge saved runs that differ only in their "
        "seeds (runs/NAME folders or results/NAME.json) into one compact copy OUT.json, named "
        "after it, its seeds in order.")
    parser.add_argument("out", metavar="OUT.json")
    parser.add_argument("paths", nargs="+", metavar="RUN")
    a = parser.parse_args(argv)
    runs = [load_run(path) for path in a.paths]
    first = runs[0]
    for run in runs[1:]:
        differ = sorted(k for k in set(first["config"]) | set(run["config"])
                        if k not in ("seeds", "name")
                        and first["config"].get(k) != run["config"].get(k))
        if differ or run["start"] != first["start"] or run["methods"] != first["methods"]:
            raise ValueError(f"merge: {run['name']} and {first['name']} differ in "
                             f"{', '.join(differ) or 'their starting policy or presets'}; "
                             "merge only the seeds of one configuration")
    records = sorted((r for run in runs for r in run["runs"]), key=lambda r: (r["seed"],
                                                                            r["method"]))
    seeds = [r["seed"] for r in records]
    if len(set(zip(seeds, (r["method"] for r in records)))) != len(records):
        raise ValueError(f"merge: a seed comes twice in {' '.join(a.paths)}")
    name = os.path.splitext(os.path.basename(a.out))[0]
    merged = dict(first, name=name, runs=records, config=dict(
        first["config"], name=name, seeds=",".join(map(str, dict.fromkeys(seeds)))))
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(merged, f, separators=(",", ":"))
    print(f"wrote {a.out}: {len(records)} runs, seeds {merged['config']['seeds']}")
    return merged
