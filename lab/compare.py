"""4. Does one knob change what happens, seed by seed? Two saved runs compared in pairs.

Two runs with the same seed start from the same warm-up, see the same problems and the same first
rollout batch; they differ only in the knob. The difference within a seed is therefore free of
most of what a seed changes, and it is the difference a paired comparison reads.
"""

import argparse
import dataclasses
import os
from typing import Dict, List, Optional

import tiny_task
from lab import plots
from lab.records import load_side, method_args, seed_run, summarise_run
from lab.stats import mean_of, paired_stats

PAIRED_SERIES = (("truncated_frac", "truncated fraction", 4), ("length_wrong",
                 "wrong-answer length", 2), ("length", "response length", 2),
                 ("accuracy", "rollout accuracy", 3), ("entropy", "entropy", 4))  # per update
PAIRED_EVALS = (("accuracy", "held-out greedy accuracy", 3),
                ("sampled_accuracy", "held-out sampled accuracy", 3),
                ("accuracy_misconception", "held-out greedy where the misconception applies", 3),
                ("length", "held-out length", 2))  # at the last evaluation
EARLY = 10  # "updates 1-10": while the warm-up's loops are still there to remove
BOOKKEEPING = {"name", "seeds", "methods", "device", "impl", "quick", "log_every", "one_step_lr"}
PAIRING = ({f.name for f in dataclasses.fields(tiny_task.Task)}  # the warm-up and the problems
           | {"steps", "prompts_per_step", "group_size", "eval_size", "eval_every", "eval_samples"})
PRIMARY = (("truncated fraction", "early"), ("wrong-answer length", "whole"))  # named in advance
PRIMARY_HEADER = ("| OTHER - BASE | knob | measure | per seed, in seed order | mean [95 % "
                  "t-interval] | seeds + / - / 0 | sign test p |")
COMPARE_HEADER = ("| OTHER - BASE | per seed, in seed order | mean [95 % t-interval] | "
                  "seeds + / - / 0 | sign test p |")


def pair_up(base: tuple, other: tuple) -> tuple:
    """The seeds both runs have and the knob that tells them apart, {arg: (base, other)}; a
    ValueError for runs that cannot be paired: no seed in common, another task, schedule or
    warm-up (then one seed no longer means the same start, problems and first batch), the same
    arguments, or more than one argument changed within one preset."""
    (b_run, b_method), (o_run, o_method) = base, other
    b_args, o_args = method_args(*base), method_args(*other)
    seeds = sorted({r["seed"] for r in b_run["runs"] if r["method"] == b_method}
                   & {r["seed"] for r in o_run["runs"] if r["method"] == o_method})
    if not seeds:
        raise ValueError(f"compare: {b_run['name']} has seeds {b_args['seeds']} and "
                         f"{o_run['name']} has {o_args['seeds']}: no seed in common to pair")
    changed = {k: (b_args.get(k), o_args.get(k)) for k in sorted(set(b_args) | set(o_args))
               if k not in BOOKKEEPING and b_args.get(k) != o_args.get(k)}
    unpaired = {k: v for k, v in changed.items() if k in PAIRING}
    if unpaired:
        raise ValueError(f"compare: the runs differ in {describe_knob(unpaired)}, so one seed "
                         "no longer gives the same starting policy, problems and first batch; "
                         "pair runs that differ only in how they train")
    starts = [tuple(run["start"][k] for k in ("accuracy", "sampled_accuracy", "length"))
              for run in (b_run, o_run)]
    if starts[0] != starts[1]:
        raise ValueError(f"compare: the runs start from different policies (held-out greedy "
                         f"accuracy, sampled accuracy, length {starts[0]} and {starts[1]}): "
                         "another machine or thread count made another warm-up; pair runs made "
                         "on one machine")
    if not changed:
        raise ValueError(f"compare: {b_run['name']}:{b_method} and {o_run['name']}:{o_method} "
                         "trained with the same arguments; there is no knob to compare")
    if len(changed) > 1 and b_method == o_method:
        raise ValueError(f"compare: the runs differ in more than one knob, "
                         f"{describe_knob(changed)}; change one at a time (or compare presets)")
    return seeds, changed


def describe_knob(changed: dict) -> str:
    return ", ".join(f"{k} {b!r} -> {o!r}" for k, (b, o) in changed.items())


def seed_measures(r: dict, start: dict) -> Dict[tuple, float]:
    """One method and seed: each compared measure, keyed (measure, "early", "whole" or "end")."""
    u, out = r["updates"], {}
    for key, label, _ in PAIRED_SERIES:
        out[label, "early"], out[label, "whole"] = mean_of(u[key][:EARLY]), mean_of(u[key])
    final = summarise_run(r, start)
    out.update({(label, "end"): final[key] for key, label, _ in PAIRED_EVALS})
    return out


def paired_rows(base: tuple, other: tuple, seeds: List[int]) -> list:
    """One dict per measure, in table order: its label, digits, the per-seed differences
    OTHER - BASE and their paired_stats."""
    def measures(side):
        return [seed_measures(seed_run(side, s), side[0]["start"]) for s in seeds]
    b, o = measures(base), measures(other)
    steps = len(base[0]["runs"][0]["updates"]["step"])
    windows = dict(early=f"updates 1-{EARLY}", whole=f"updates 1-{steps}", end="at the end")
    digits = {label: d for _, label, d in PAIRED_SERIES + PAIRED_EVALS}
    rows = []
    for measure, window in b[0]:
        diffs = [y[measure, window] - x[measure, window] for x, y in zip(b, o)]
        rows.append(dict(key=(measure, window), label=f"{measure}, {windows[window]}",
                         digits=digits[measure], diffs=diffs,
                         **paired_stats(diffs, digits[measure])))
    return rows


def paired(base: tuple, other: tuple) -> dict:
    """Everything the table and the picture need: seeds, knob, rows, and in how many seeds update
    1's rollouts look the same (accuracy, length, truncation), the check that the pairing holds
    (dynamic sampling, say, changes them)."""
    seeds, changed = pair_up(base, other)

    def first(side, seed):
        u = seed_run(side, seed)["updates"]
        return [u[k][0] for k in ("accuracy", "length", "truncated_frac")]
    return dict(base=base, other=other, seeds=seeds, changed=changed,
                same_first_batch=sum(first(base, s) == first(other, s) for s in seeds),
                rows=paired_rows(base, other, seeds))


def format_compare(p: dict) -> str:
    """The paired table: one row per measure, OTHER - BASE per seed, mean, interval, signs, p."""
    (b_run, b_method), (o_run, o_method) = p["base"], p["other"]
    lines = [f"paired comparison, {o_run['name']}:{o_method} - {b_run['name']}:{b_method}, "
             f"{describe_knob(p['changed'])}: seeds {', '.join(map(str, p['seeds']))} "
             f"({len(p['seeds'])} in common; update 1's rollouts identical in "
             f"{p['same_first_batch']} of them)", COMPARE_HEADER, "|---" * 5 + "|"]
    lines += [f"| {row['label']} | {format_paired(row)} |" for row in p["rows"]]
    return "\n".join(lines)


def format_paired(row: dict) -> str:
    """A row's last four cells: per seed | mean [interval] | signs | p."""
    d = row["digits"]
    return (f"{' '.join(f'{x:+.{d}f}' for x in row['diffs'])} | {row['mean']:+.{d}f} "
            f"[{row['low']:+.{d}f}, {row['high']:+.{d}f}] | {row['plus']} / {row['minus']} / "
            f"{row['zero']} | {row['p']:.3f}")


def format_primary(pairs: List[dict]) -> str:
    """The primary measures of several paired comparisons, one table."""
    lines = ["paired comparisons, the primary measures (truncated fraction over updates 1-"
             f"{EARLY}, wrong-answer length over the whole run), OTHER - BASE per seed:",
             PRIMARY_HEADER, "|---" * 7 + "|"]
    for p in pairs:
        (b_run, b_method), (o_run, o_method) = p["base"], p["other"]
        for row in p["rows"]:
            if row["key"] in PRIMARY:
                lines.append(f"| {o_run['name']} - {b_run['name']} | "
                             f"{describe_knob(p['changed'])} | {row['label']} | "
                             f"{format_paired(row)} |")
    return "\n".join(lines)


def load_pairs(command: str, specs: List[str], plot: Optional[bool] = None) -> list:
    """BASE OTHER [BASE OTHER ...] as saved runs, paired seed by seed. plot: for compare, whether
    --plot was given, which draws a single pair."""
    if len(specs) % 2 or (plot and len(specs) > 2):
        raise ValueError(f"{command}: expected BASE OTHER pairs"
                         f"{'' if plot is None else ' (and --plot with one pair)'}, got "
                         f"{len(specs)} runs: {' '.join(specs)}")
    sides = [load_side(spec) for spec in specs]
    return [paired(base, other) for base, other in zip(sides[::2], sides[1::2])]


def compare(argv: List[str]):
    """python -m lab compare BASE OTHER [BASE OTHER ...] [--primary] [--plot PATH]"""
    parser = argparse.ArgumentParser(
        prog="python -m lab compare", description="Compare two saved runs seed by seed: for each "
        "measure, each seed's difference OTHER - BASE, their mean with a 95 % t-interval, the "
        "sign counts and the exact two-sided sign test; and a picture of each seed's difference "
        "per update. The runs must share seeds and differ only in how they train (one argument, "
        "or the preset).")
    parser.add_argument("runs", nargs="+", metavar="BASE OTHER", help="pairs of saved runs: "
                        "runs/NAME or results/NAME.json, with :METHOD when a run holds several")
    parser.add_argument("--primary", action="store_true", help="one table of every pair's "
                        "primary measures instead of each pair's whole table")
    parser.add_argument("--plot", metavar="PATH", help="where to draw the picture of a single "
                        "pair (default: runs/compare/OTHER-minus-BASE.png)")
    a = parser.parse_args(argv)
    pairs = load_pairs("compare", a.runs, plot=bool(a.plot))
    if a.primary:
        print(format_primary(pairs))
        return pairs
    for p in pairs:
        print(format_compare(p))
        (b_run, b_method), (o_run, o_method) = p["base"], p["other"]
        path = a.plot or os.path.join("runs", "compare", f"{o_run['name']}-{o_method}-minus-"
                                      f"{b_run['name']}-{b_method}.png")
        plots.plot_compare(p, PAIRED_SERIES, path)
        print(f"wrote {path}\n")
    return pairs
