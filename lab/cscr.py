"""5. Do CSCR's own claims hold here, seed by seed? The strength sweep and the diagnosis.

The CSCR summary ("Not All Tokens Deserve Equal Credit", a Hugging Face Daily Papers summary)
makes four claims. This file reads them off saved runs:
  1-3  `python -m lab sweep results/cscr-*.json`: every strength against strength 0 (GRPO, the
       same code path) in the same seed, per measure: each seed's difference, the mean with a
       95 % t-interval, the sign counts, the sign test; and the picture (--plot).
  4    `python -m lab cscr-diagnose --warmup-seed S`: the diagnosis on the starting policy and
       after training at strength 1 (seed 0), saved to results/cscr-diagnosis/wsS.json, which
       the sweep command prints beside the summary's words when given.
The sweep's plan was fixed before its runs: strengths 0, 0.25, 0.5, 1, 2, 4, 8 at tau = 0 and
tau = 0.1 (about the starting policy's mean sensitivity), seeds 0-9, one thread per run; the
stability measure is the number of updates whose rollout entropy exceeds twice strength 0's at
the same update and seed.
"""

import argparse
import dataclasses
import json
import os
from typing import Dict, List

import torch

import tiny_task
import train_tiny as tt
from lab import credit, plots
from lab.compare import EARLY, format_paired, pair_up
from lab.records import load_side, method_args, seed_run
from lab.stats import mean_of, paired_stats

ENTROPY_BLOWUP = 2.0  # an update is unstable when its entropy exceeds this times strength 0's
SWEEP_HEADER = ("| strength | tau | per seed, in seed order | mean [95 % t-interval] | "
                "seeds + / - / 0 | sign test p |")
MEASURES = (  # (label, digits, per-seed value from (run, start, its strength-0 run))
    ("held-out sampled accuracy at the end", 3,
     lambda r, start, base: final(r, start)["sampled_accuracy"]),
    ("held-out greedy accuracy at the end", 3, lambda r, start, base: final(r, start)["accuracy"]),
    ("held-out greedy where the misconception applies, at the end", 3,
     lambda r, start, base: final(r, start)["accuracy_misconception"]),
    ("rollout entropy, mean over the run", 4, lambda r, start, base: mean_of(
        r["updates"]["entropy"])),
    (f"truncated fraction, updates 1-{EARLY}", 4, lambda r, start, base: mean_of(
        r["updates"]["truncated_frac"][:EARLY])),
    (f"updates with entropy > {ENTROPY_BLOWUP:g} x strength 0's (stability)", 1,
     lambda r, start, base: float(sum(
         e is not None and b is not None and e > ENTROPY_BLOWUP * b
         for e, b in zip(r["updates"]["entropy"], base["updates"]["entropy"])))),
    ("largest drop in held-out sampled accuracy between evaluations", 3,
     lambda r, start, base: largest_drop(r, start)),
)
CLAIMS = (  # the summary's words, then what the diagnosis measures for each part
    ("many affected tokens shift in the same direction under both conditions",
     "fraction of tokens with sign(d+) = sign(d-)", "same_direction"),
    ("with limited sign reversals", "sign-reversal rate", "sign_reversal"),
)


def final(r: dict, start: dict) -> dict:
    """The held-out evaluation at the end of a run (the start if it never evaluated)."""
    return r["evals"][max(r["evals"], key=int)] if r["evals"] else start


def largest_drop(r: dict, start: dict) -> float:
    """The largest fall of held-out sampled accuracy from one evaluation to the next (the start
    counts as the first); 0 if it never fell."""
    series = [start["sampled_accuracy"]] + [r["evals"][k]["sampled_accuracy"]
                                            for k in sorted(r["evals"], key=int)]
    return max([0.0] + [a - b for a, b in zip(series, series[1:])])


# -----------------------------------------------------------------------------
# claims 1-3: the strength sweep, read in pairs

def arms(paths: List[str]) -> Dict[tuple, tuple]:
    """{(warmup_seed, strength, tau): (run, method)} of the saved CSCR runs; strength 0 is one
    arm whatever its tau (it never reads tau)."""
    out = {}
    for path in paths:
        run, method = load_side(path)
        args = method_args(run, method)
        strength = args["cscr_strength"]
        tau = args["cscr_threshold"] if strength else 0.0
        key = (args["warmup_seed"], strength, tau)
        if key in out:
            raise ValueError(f"sweep: {path} and {out[key][0]['name']} are both strength "
                             f"{strength:g}, tau {tau:g}, warm-up seed {key[0]}")
        out[key] = (run, method)
    return out


def with_tau(side: tuple, tau: float) -> tuple:
    """A strength-0 run as if it had been given tau: it never reads tau, so it pairs with any."""
    run, method = side
    return dict(run, config=dict(run["config"], cscr_threshold=tau)), method


def sweep_rows(found: Dict[tuple, tuple]) -> list:
    """One dict per (warm-up seed, strength, tau, measure): each strength > 0 against the
    strength-0 run of its warm-up, over the seeds both have (pair_up checks the pairing)."""
    rows = []
    for (ws, strength, tau), other in sorted(found.items()):
        if strength == 0:
            continue
        if (ws, 0.0, 0.0) not in found:
            raise ValueError(f"sweep: strength {strength:g} on warm-up seed {ws} has no "
                             "strength-0 run to pair with")
        base = found[ws, 0.0, 0.0]
        seeds, _ = pair_up(with_tau(base, tau), other)  # one knob apart, or an error
        for label, digits, measure in MEASURES:
            diffs = []
            for seed in seeds:
                b, o = seed_run(base, seed), seed_run(other, seed)
                diffs.append(measure(o, other[0]["start"], b) - measure(b, base[0]["start"], b))
            rows.append(dict(warmup_seed=ws, strength=strength, tau=tau, measure=label,
                             digits=digits, seeds=seeds, diffs=diffs,
                             **paired_stats(diffs, digits)))
    return rows


def format_sweep(rows: list) -> str:
    """One table per warm-up and measure: a row per (strength, tau), strength minus strength 0."""
    out = []
    for ws in sorted({r["warmup_seed"] for r in rows}):
        for label, digits, _ in MEASURES:
            mine = [r for r in rows if r["warmup_seed"] == ws and r["measure"] == label]
            if not mine:
                continue
            seeds = ", ".join(map(str, mine[0]["seeds"]))
            out += [f"CSCR sweep, warm-up seed {ws}: {label}, strength s minus strength 0 "
                    f"(GRPO) in the same seed (seeds {seeds})", SWEEP_HEADER, "|---" * 6 + "|"]
            out += [f"| {r['strength']:g} | {r['tau']:g} | {format_paired(r)} |"
                    for r in mine]
            out.append("")
    return "\n".join(out).rstrip()


# -----------------------------------------------------------------------------
# claim 4: the diagnosis, on the starting policy and after training at strength 1

def diagnose(model, tokenizer, args, tc, problems, strength: float, device) -> dict:
    """credit.diagnose, and for each token class its share of all tokens and of the top 20 % of
    tokens by sensitivity: where the largest shifts sit."""
    result, picture = credit.diagnose(model, tokenizer, args, tc, problems, strength, device)
    mask = picture["mask"]
    classes = credit.token_classes(tokenizer, picture["responses"])
    top = tc.high_entropy_mask(picture["sensitivity"], mask, credit.ENTROPY_TOP).bool()
    for k, name in enumerate(credit.CLASSES):
        in_class = mask & (classes == k)
        result["by_class"][name]["shares"] = (float(in_class.sum() / mask.sum()),
                                              float((top & in_class).sum() / top.sum()))
    return result


def diagnose_trained(argv: List[str]) -> dict:
    """python -m lab cscr-diagnose [--warmup-seed S] [--seed 0] [--strength 1] [--save DIR]; run
    it with OMP_NUM_THREADS=1, as the sweep ran, to start from the sweep's warm-up."""
    parser = argparse.ArgumentParser(
        prog="python -m lab cscr-diagnose", description="CSCR's diagnosis (claim 4) on the "
        "starting policy and after training one seed at a CSCR strength; the default task.")
    parser.add_argument("--warmup-seed", type=int, default=tt.Args.warmup_seed)
    parser.add_argument("--seed", type=int, default=0, help="the training seed (0)")
    parser.add_argument("--strength", type=float, default=1.0, help="CSCR's alpha (1)")
    parser.add_argument("--save", default=os.path.join("results", "cscr-diagnosis"),
                        help="where the JSON goes (results/cscr-diagnosis/)")
    a = parser.parse_args(argv)
    args = dataclasses.replace(tt.Args(), **{**tt.PRESETS["cscr"], "cscr_strength": a.strength,
                                             "warmup_seed": a.warmup_seed})
    tiny_task.quiet_transformers()
    device, tc = torch.device("cpu"), tt.load_tokencredit(args)
    model, tokenizer, start_path = tiny_task.load_or_warm_up(args, device, "runs")
    held_out = tt.held_out_problems(args)
    problems = held_out[:32]
    out = dict(warmup_seed=a.warmup_seed, seed=a.seed, strength=a.strength)
    out["start"] = diagnose(model, tokenizer, args, tc, problems, a.strength, device)
    with open(os.devnull, "w") as log:
        history, _, trained = tt.train_method("cscr", args, a.seed, start_path, tokenizer,
                                              held_out, device, log)
    out["trained"] = diagnose(trained, tokenizer, args, tc, problems, a.strength, device)
    out["trained_accuracy"] = history[-1]["eval_accuracy"]
    path = os.path.join(a.save, f"ws{a.warmup_seed}.json")
    os.makedirs(a.save, exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(format_claim4([out]) + f"\nwrote {path}")
    return out


def format_claim4(diagnoses: List[dict]) -> str:
    """Claim 4, part by part: the summary's words, then what each policy measured."""
    header = "| the summary says | measured here | " + " | ".join(
        f"warm-up {d['warmup_seed']}, {when}" for d in diagnoses
        for when in ("start", f"after strength {d['strength']:g}")) + " |"
    lines = ["CSCR diagnosis, claim 4 (32 held-out prompts x G samples, scored under c+ and "
             "c-; seed {} trained 60 updates)".format(diagnoses[0]["seed"]), header,
             "|---" * (2 + 2 * len(diagnoses)) + "|"]
    policies = [d[when] for d in diagnoses for when in ("start", "trained")]
    for said, measured, key in CLAIMS:
        lines.append(f"| {said} | {measured} | "
                     + " | ".join(f"{p['all'][key]:.3f}" for p in policies) + " |")
    said = ("the biggest shifts tend to concentrate on highly substitutable surface-form tokens, "
            "while problem-specific reasoning tokens are often less sensitive")
    for name in policies[0]["by_class"]:
        lines.append(f"| {said} | {name}: share of all tokens -> of the top 20 % by "
                     "sensitivity | " + " | ".join(
                         "{:.3f} -> {:.3f}".format(*p["by_class"][name]["shares"])
                         for p in policies)
                     + " |")
        said = "(the same)"
    return "\n".join(lines)


def sweep(argv: List[str]) -> list:
    """python -m lab sweep results/cscr-*.json [results/cscr-diagnosis/*.json] [--plot PATH]"""
    parser = argparse.ArgumentParser(
        prog="python -m lab sweep", description="CSCR's strength sweep read in pairs: each "
        "strength against strength 0 in the same seed, per measure; claim 4's diagnosis from "
        "any results/cscr-diagnosis/ws*.json given (python -m lab cscr-diagnose writes them).")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="saved CSCR runs (results/cscr-s*.json) and diagnoses "
                        "(results/cscr-diagnosis/*.json)")
    parser.add_argument("--plot", metavar="PATH", help="draw the picture there")
    a = parser.parse_args(argv)
    runs, diagnoses = [], []
    for path in a.paths:  # a diagnosis is a JSON file that holds a "trained" policy's
        saved = {}
        if os.path.isfile(path):
            with open(path) as f:
                saved = json.load(f)
        if "trained" in saved:
            diagnoses.append(saved)
        else:
            runs.append(path)
    rows = sweep_rows(arms(runs))
    print(format_sweep(rows))
    if diagnoses:
        print("\n" + format_claim4(sorted(diagnoses, key=lambda d: d["warmup_seed"])))
    if a.plot:
        plots.plot_sweep(rows, [label for label, _, _ in MEASURES], a.plot)
        print(f"wrote {a.plot}")
    return rows
