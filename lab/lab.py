"""The lab (python -m lab): runs train_tiny.py's RL loop and measures it, one question at a time.

0. Is the right answer within reach of sampling?     pass_at_group
1. Does RL fix the warm-up's mistakes?               the results table, rollout figures, curves.png
2. What does one step do under each weighting?       one_step, its table and onestep.png
3. Where does CSCR move credit?                      diagnose, its table and credit.png
4. Does one knob change what happens, seed by seed?  compare: two saved runs, paired by seed
5. Do CSCR's own claims hold here, seed by seed?     sweep and cscr-diagnose, in lab/cscr.py
Questions 0, 2 and 3 are asked of the starting policy, on the first held-out prompts, from fixed
random streams. Every table title printed here can be searched for in this file.

    python -m lab --quick                       # train_tiny.py --quick, then every measurement
    python -m lab --seeds 0,1,2 --name readme   # the results table (any train_tiny argument)
    python -m lab knobs --seeds 0,1,2           # the one-knob runs, each knob on its own
    python -m lab report results/*.json         # every table again, from saved results
    python -m lab report runs/NAME --save results/    # a run's results, compacted for keeping
    python -m lab compare results/A.json results/B.json     # B - A, seed by seed, and a picture
    python -m lab sweep results/cscr-*.json --plot docs/cscr-sweep.png   # CSCR's claims
"""

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from typing import Dict, List

import torch

import tiny_task
import train_tiny as tt  # its tokencredit is tt.tc: a student's, with --impl

# the lab's fixed random streams, as offsets from --warmup-seed (train_tiny's use 2 and 10 ** 6)
DIAGNOSIS_STREAM, ONE_STEP_STREAM, PASS_AT_G_STREAM = 1, 3, 4
ENTROPY_TOP = 0.2  # the fraction of a batch's tokens the entropy mask keeps, as in the 80/20 paper


# -----------------------------------------------------------------------------
# the command line: run and measure, run the knobs, or report saved results

def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = {"report": report, "knobs": run_knobs, "compare": compare}
    if argv[:1] and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    if "-h" in argv or "--help" in argv:  # the lab's commands, then the training arguments
        print(__doc__.strip() + "\n\nEach command has its own --help (python -m lab compare "
              "--help).\nThe training arguments, which python -m lab passes to train_tiny.py:\n")
    results = tt.main(argv)  # the RL runs: prints the progress and the accuracy before and after
    out_dir = os.path.join("runs", results["config"]["name"])
    args = tt.Args(**results["config"])
    model, tokenizer, _ = tiny_task.load_or_warm_up(args, results["device"], "runs")  # the start
    problems = tt.held_out_problems(args)
    strength = next((a["cscr_strength"] for a in results["methods"].values()
                     if a["cscr_strength"] > 0), 1.0)  # the first CSCR strength asked for, else 1
    measurements = (("pass_at_group", lambda: report_pass_at_group(model, tokenizer, args, problems,
                                                                    results["device"])),
                    ("one_step", lambda: report_one_step(model, tokenizer, args, problems,
                                                         strength, results["device"], out_dir)),
                    ("diagnosis", lambda: report_diagnosis(model, tokenizer, args, problems,
                                                           strength, results["device"], out_dir)))
    for name, measure in measurements:
        try:
            results[name] = measure()
        except NotImplementedError as missing:  # course mode: a student's unfinished exercise
            print(f"\n{name} skipped: your tokencredit.py has not implemented {missing}")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    run = load_run(out_dir)
    print("\n" + format_results(run))
    print("\n" + format_rollouts([run]))
    plot_curves(run, os.path.join(out_dir, "curves.png"))
    print(f"\nwrote {out_dir}/results.json, curves.png, onestep.png, credit.png")
    return results


# -----------------------------------------------------------------------------
# 0. the starting policy: is the right answer within reach, and do lengths differ in a group?

@torch.no_grad()
def pass_at_group(model, tokenizer, args, problems, device) -> Dict[str, float]:
    """pass@1 (the mean accuracy of samples) and pass@G (some sample of the G is right): can a
    group contrast a right answer with a wrong one? And how much do one prompt's lengths differ?"""
    tiny_task.seed_everything(args.warmup_seed + PASS_AT_G_STREAM)
    r = tt.rollout(model, tokenizer, args, problems, args.group_size, False, device)
    correct = r.correct.view(len(problems), args.group_size)  # (B, G)
    lengths = r.mask.sum(dim=1).float().view(len(problems), args.group_size)  # (B, G)
    truncated = (~r.complete).view(len(problems), args.group_size).any(dim=1)  # (B,)
    return {"pass@1": float(correct.float().mean()),
            f"pass@{args.group_size}": float(correct.any(dim=1).float().mean()),
            "longest/shortest in a group": float((lengths.max(1).values / lengths.min(1).values)
                                                 .mean()),
            "groups with a truncated answer": float(truncated.float().mean())}


def report_pass_at_group(model, tokenizer, args, problems, device) -> dict:
    reach = pass_at_group(model, tokenizer, args, problems, device)
    print("\n" + format_reach(reach, args.group_size))
    return reach


def format_reach(reach: dict, G: int) -> str:
    keys = ("pass@1", f"pass@{G}", "longest/shortest in a group", "groups with a truncated answer")
    return (f"the starting policy, {G} samples per held-out problem: "
            + ", ".join(f"{k} {reach[k]:.3f}" for k in keys))


# -----------------------------------------------------------------------------
# 1. does RL fix the warm-up's mistakes? Tables and curves from a run's records

SUMMARY_KEYS = ("accuracy", "sampled_accuracy", "accuracy_misconception", "length",
                "truncated_first10", "truncated_last10", "length_wrong_last10", "entropy")
UPDATE_KEYS = ("step", "reward", "accuracy", "entropy", "kept_frac", "groups", "rounds",
               "length", "length_correct", "length_wrong", "truncated_frac", "recheck_frac",
               "clip_frac_low", "clip_frac_high")
EVAL_KEYS = ("accuracy", "sampled_accuracy", "length", "accuracy_misconception",
             "accuracy_other", "sampled_accuracy_misconception")


def load_run(path: str) -> dict:
    """A run as the reports read it, from runs/NAME (results.json and metrics.jsonl) or from its
    compact copy results/NAME.json: config, start, one_step, diagnosis, and per method and seed
    the per-update series ("updates") and held-out evaluations ("evals", by update)."""
    if path.endswith(".json"):
        with open(path) as f:
            return json.load(f)
    with open(os.path.join(path, "results.json")) as f:
        results = json.load(f)
    with open(os.path.join(path, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    runs = []
    for r in results["runs"]:
        mine = [x for x in records if x["method"] == r["method"] and x["seed"] == r["seed"]]
        runs.append(dict(method=r["method"], seed=r["seed"], wall_s=round(r["wall_s"], 1),
                         updates={k: [compact(x.get(k)) for x in mine] for k in UPDATE_KEYS},
                         evals={str(x["step"]): {k: compact(x[f"eval_{k}"]) for k in EVAL_KEYS}
                                for x in mine if "eval_accuracy" in x}))
    methods = {label: {k: v for k, v in args.items() if v != results["config"].get(k)}
               for label, args in results.get("methods", {}).items()}  # what a preset changed
    return dict(name=os.path.basename(os.path.normpath(path)), config=results["config"],
                methods=methods,
                start={k: compact(v) for k, v in {**results["start"],
                                                  **results.get("pass_at_group", {})}.items()},
                runs=runs,
                **{k: results[k] for k in ("one_step", "diagnosis") if k in results})


def compact(x):
    """A float to 5 significant digits (what the tables print, and some); NaN as None."""
    if isinstance(x, float):
        return None if math.isnan(x) else float(f"{x:.5g}")
    return x


def number(x) -> float:
    """A stored value as a number: None (a NaN, compacted) back to NaN, which prints as nan."""
    return float("nan") if x is None else x


def mean_of(values: List) -> float:
    values = [v for v in values if v is not None]  # None: no such rollout in that batch
    return sum(values) / len(values) if values else float("nan")


def mean_std(values: List[float]) -> tuple:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


def summarise_run(run: dict, start: dict) -> dict:
    """One method and seed: held-out accuracy at the last evaluation (the start if none), and
    rollout statistics over the first and the last ten updates."""
    u = run["updates"]
    final = run["evals"][max(run["evals"], key=int)] if run["evals"] else start
    trained = [i for i, e in enumerate(u["entropy"]) if e is not None]  # not skipped

    def over(key, updates):
        return mean_of([u[key][i] for i in updates])
    return dict({k: number(final[k]) for k in EVAL_KEYS}, entropy=over("entropy", trained[-5:]),
                truncated_first10=over("truncated_frac", trained[:10]),
                truncated_last10=over("truncated_frac", trained[-10:]),
                length_wrong_last10=over("length_wrong", trained[-10:]))


def summarise(run: dict, method: str) -> dict:
    """One method of a run: each summary key's mean and std over its seeds."""
    rows = [summarise_run(r, run["start"]) for r in run["runs"] if r["method"] == method]
    table = dict(seeds=len(rows))
    for key in SUMMARY_KEYS:
        table[key], table[key + "_std"] = mean_std([r[key] for r in rows])
    return table


def methods_of(run: dict) -> List[str]:
    return list(dict.fromkeys(r["method"] for r in run["runs"]))


TABLE_HEADER = ("| greedy acc | sampled acc | greedy where the misconception applies | held-out "
                "length | truncated rollouts: updates 1-10 -> last 10 | wrong-answer length, "
                "last 10 | entropy |")


def format_row(label: str, e: dict) -> str:
    def pm(key, digits=3):
        return f"{e[key]:.{digits}f} +- {e[key + '_std']:.{digits}f}"
    return (f"| {label} | {pm('accuracy')} | {pm('sampled_accuracy')} | "
            f"{pm('accuracy_misconception')} | {pm('length', 1)} | {e['truncated_first10']:.3f} -> "
            f"{e['truncated_last10']:.3f} | {pm('length_wrong_last10', 1)} | {e['entropy']:.3f} |")


def format_results(run: dict) -> str:
    """Does RL fix the warm-up's mistakes? One row per method, mean +- std over seeds."""
    c, s = run["config"], {k: number(v) for k, v in run["start"].items()}
    seeds = sorted({r["seed"] for r in run["runs"]})
    lines = [f"held-out accuracy after {c['steps']} policy updates ({c['eval_size']} problems; "
             f"greedy, and the mean of {c['eval_samples']} samples at temperature "
             f"{c['temperature']:g}), mean +- std over seeds {', '.join(map(str, seeds))}; from "
             f"{s['accuracy']:.3f} greedy ({s['accuracy_misconception']:.3f} where the "
             f"misconception applies) and {s['sampled_accuracy']:.3f} sampled "
             f"({s['sampled_accuracy_misconception']:.3f}):",
             "| method " + TABLE_HEADER, "|---" * 8 + "|"]
    lines += [format_row(m, summarise(run, m)) for m in methods_of(run)]
    return "\n".join(lines)


def format_rollouts(runs: List[dict]) -> str:
    """What the rollout logs say, per run and method, mean over seeds."""
    lines = ["rollout statistics from metrics.jsonl, mean over seeds (clipped: the last epoch's "
             "fraction of tokens, over all updates):",
             "| run | method | truncated at update 1 | re-checked: update 1 -> last 10 | "
             "right-answer length: updates 1-5 -> last 10 | informative groups: all, updates "
             "1-10 -> last 10 | sampling rounds per update | updates with B groups | clipped "
             "low / high | greedy elsewhere |", "|---" * 10 + "|"]
    for run in runs:
        for method in methods_of(run):
            rs = [r for r in run["runs"] if r["method"] == method]

            def per_seed(key, part=slice(None)):
                return mean_of([mean_of(r["updates"][key][part]) for r in rs])
            full = sum(g == run["config"]["prompts_per_step"] for r in rs
                       for g in r["updates"]["groups"])
            total = sum(len(r["updates"]["groups"]) for r in rs)
            other = mean_of([summarise_run(r, run["start"])["accuracy_other"] for r in rs])
            clip = (f"{per_seed('clip_frac_low'):.4f} / {per_seed('clip_frac_high'):.4f}"
                    if rs[0]["updates"]["clip_frac_low"][0] is not None else "-")
            lines.append(
                f"| {run['name']} | {method} | {per_seed('truncated_frac', slice(0, 1)):.3f} | "
                f"{per_seed('recheck_frac', slice(0, 1)):.3f} -> "
                f"{per_seed('recheck_frac', slice(-10, None)):.3f} | "
                f"{per_seed('length_correct', slice(0, 5)):.1f} -> "
                f"{per_seed('length_correct', slice(-10, None)):.1f} | "
                f"{per_seed('kept_frac'):.2f}, {per_seed('kept_frac', slice(0, 10)):.2f} -> "
                f"{per_seed('kept_frac', slice(-10, None)):.2f} | {per_seed('rounds'):.2f} | "
                f"{full} of {total} | {clip} | {other:.3f} |")
    return "\n".join(lines)


def plot_curves(run: dict, path: str) -> None:
    """curves.png: held-out accuracy, lengths of right and wrong answers, truncated and re-checked
    rollouts, entropy and the informative-group fraction against policy update, mean over seeds."""
    plt = pyplot()
    panels = [(("accuracy", "sampled_accuracy"), "held-out accuracy: greedy (solid), sampled "
                                                 "(dashed)"),
              (("length_correct", "length_wrong"), "rollout length (tokens): correct (solid), "
                                                   "wrong (dashed)"),
              (("truncated_frac",), "truncated rollouts (loops that hit the budget)"),
              (("recheck_frac",), "rollouts that finished with a re-checked step"),
              (("entropy",), "policy entropy (nats/token)"),
              (("kept_frac",), "informative groups (0 < #correct < G)")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (keys, title) in zip(axes.flat, panels):
        for k, method in enumerate(methods_of(run)):
            rs = [r for r in run["runs"] if r["method"] == method]
            for key, style in zip(keys, ("-", "--")):
                if keys[0] == "accuracy":  # held-out evaluations, from the start
                    steps = sorted({int(s) for r in rs for s in r["evals"]})
                    values = [run["start"][key]] + [mean_of([r["evals"].get(str(s), {}).get(key)
                                                             for r in rs]) for s in steps]
                    ax.plot([0] + steps, values, style, marker="o", markersize=3,
                            color=colours[k % len(colours)], label=method if style == "-" else None)
                    continue
                n = len(rs[0]["updates"][key])
                values = [mean_of([r["updates"][key][i] for r in rs]) for i in range(n)]
                smooth = [mean_of(values[max(0, i - 2):i + 3]) for i in range(n)]  # 5 updates
                ax.plot(rs[0]["updates"]["step"], smooth, style, alpha=0.85,
                        color=colours[k % len(colours)], label=method if style == "-" else None)
        ax.set_title(title + ("" if keys[0] == "accuracy" else ", 5-update mean"), fontsize=10)
        ax.set_xlabel("policy update")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    seeds = len({r["seed"] for r in run["runs"]})
    fig.suptitle(f"tiny-model RLVR, mean over {seeds} seed(s)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -----------------------------------------------------------------------------
# one knob at a time: the grpo preset with one thing changed, and the report of saved runs

KNOBS = [  # (row label, saved run, method in it, train_tiny arguments of that run)
    ("none: the `grpo` preset", "readme", "grpo", None),
    ("`--loss-mode token`", "knob-loss-token", "grpo", "--methods grpo --loss-mode token"),
    ("`--loss-mode group_token`", "knob-loss-group_token", "grpo",
     "--methods grpo --loss-mode group_token"),
    ("`--loss-mode constant`", "knob-loss-constant", "grpo", "--methods grpo --loss-mode constant"),
    ("`--adv-scale none`", "knob-adv-none", "grpo", "--methods grpo --adv-scale none"),
    ("`--adv-scale batch`", "knob-adv-batch", "grpo", "--methods grpo --adv-scale batch"),
    ("`--baseline leave_one_out` (RLOO)", "knob-rloo", "grpo",
     "--methods grpo --baseline leave_one_out"),
    ("`--eps-high 0.28` (Clip-Higher)", "knob-clip-higher", "grpo",
     "--methods grpo --eps-high 0.28"),
    ("`--dynamic-sampling`", "knob-dynamic", "grpo", "--methods grpo --dynamic-sampling"),
    ("`--surrogate reinforce`", "knob-reinforce", "grpo", "--methods grpo --surrogate reinforce"),
    ("CSCR, strength 1 (`--methods cscr`)", "readme", "cscr", None),
    ("CSCR, strength 4 (`--methods cscr --cscr-strength 4`)", "knob-cscr4", "cscr",
     "--methods cscr --cscr-strength 4"),
    ("GSPO (`--methods gspo`)", "knob-gspo", "gspo", "--methods gspo"),
    ("entropy mask, top 20 % (`--methods entropy80`)", "knob-entropy80", "entropy80",
     "--methods entropy80"),
]


def run_knobs(argv: List[str]) -> dict:
    """Each knob's run, with the extra arguments given (--seeds 0,1,2 for the committed ones)."""
    if "-h" in argv or "--help" in argv:
        print("usage: python -m lab knobs [train_tiny arguments, e.g. --seeds 0,1,2]\n\nTrains "
              "each run of the one-knob table into runs/NAME\n(python -m lab report runs/readme "
              "runs/knob-* prints the table):\n" + "\n".join(
                  f"  {name:<22} {knob}" for _, name, _, knob in KNOBS if knob))
        return {}
    for _, name, _, knob in KNOBS:
        if knob is not None:
            tt.main(knob.split() + ["--name", name] + argv)
    return {}


def format_knobs(runs: Dict[str, dict]) -> str:
    """One knob at a time: each row the grpo preset with one change, mean +- std over seeds."""
    lines = ["one knob at a time, held-out accuracy after the last update, mean +- std over seeds:",
             "| changed from `grpo` " + TABLE_HEADER, "|---" * 8 + "|"]
    lines += [format_row(label, summarise(runs[name], method)) for label, name, method, _ in KNOBS]
    return "\n".join(lines)


def report(argv: List[str]) -> dict:
    """python -m lab report PATH... [--save DIR] [--curves DIR]: every table again, from
    runs/NAME folders or their compact copies results/NAME.json; --save DIR writes those compact
    copies, --curves DIR draws each run's curves as DIR/NAME-curves.png."""
    parser = argparse.ArgumentParser(prog="python -m lab report", description="Print every table "
                                     "again from saved runs: runs/NAME folders or their compact "
                                     "copies results/NAME.json.")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="runs/NAME or results/NAME.json")
    parser.add_argument("--save", metavar="DIR", help="write each run's compact copy DIR/NAME.json")
    parser.add_argument("--curves", metavar="DIR", help="draw each run's DIR/NAME-curves.png")
    options = parser.parse_args(argv)
    paths, save = options.paths, options.save
    runs, printed = {run["name"]: run for run in map(load_run, paths)}, []

    def show(text):  # a table once, however many runs share it (the same warm-up, say)
        if text in printed and "\n" in text:  # its title, that the run has it too
            print(f"\n{text.splitlines()[0]}\n(the same table as above)")
        else:
            printed.append(text)
            print("\n" + text)
    for name, run in runs.items():
        if save:
            os.makedirs(save, exist_ok=True)
            with open(os.path.join(save, f"{name}.json"), "w") as f:
                json.dump(run, f, separators=(",", ":"))
        if not name.startswith("knob-"):
            if options.curves:
                plot_curves(run, os.path.join(options.curves, f"{name}-curves.png"))
            print(f"\n## {name}")
            if "pass@1" in run["start"]:
                show(format_reach(run["start"], run["config"]["group_size"]))
            show(format_results(run))
            show(format_rollouts([run]))
            for key, fmt in (("one_step", format_one_step), ("diagnosis", format_diagnosis)):
                if run.get(key):
                    show(fmt(run[key]))
    if all(name in runs for _, name, _, _ in KNOBS):
        print("\n## one knob at a time")
        show(format_knobs(runs))
        knob_runs = dict.fromkeys(name for _, name, _, knob in KNOBS if knob)  # in table order
        show(format_rollouts([runs[name] for name in knob_runs]))
    return runs


# -----------------------------------------------------------------------------
# 2. what does one step do under each weighting? One plain SGD step, measured exactly

LENGTH_BUCKETS = (("short (<= 15 tokens)", 0, 15), ("medium (16-29)", 16, 29),
                  ("long (>= 30)", 30, 10 ** 9))


def one_step(model, tokenizer, args, problems, strength: float, lr: float, device) -> dict:
    """One rollout batch from the starting policy; from the same weights and the same GRPO
    advantages, one plain SGD step (theta -= lr * grad) per weighting, and each token's change
    Delta_{i,t} = log pi_new(o_t) - log pi_old(o_t).

    SGD, not Adam, so that the raw gradient acts; lr small, so that the step is first order
    ("sample, lr/2" checks it). On-policy the gradient w.r.t. logp_{i,t} is -w_{i,t} A_{i,t}, so
    Delta is that credit times how much log pi(o_t) responds to the parameters, summed over every
    token's push. Returns Delta (N, T) keyed by weighting, and the batch it was measured on.
    """
    tiny_task.seed_everything(args.warmup_seed + ONE_STEP_STREAM)
    r = tt.rollout(model, tokenizer, args, problems, args.group_size, False, device)
    correct, mask, G = r.correct.to(device), r.mask, args.group_size  # (N,), (N, T)
    rewards = torch.where(correct, args.reward_correct, args.reward_wrong).float().view(-1, G)
    advantages = tt.tc.group_advantages(rewards, scale="std").flatten().to(device)  # (N,)
    with torch.no_grad():
        (logp, logits), (logp_pos, _), (logp_neg, _) = tt.score(
            model, tokenizer, args, r.problems, r.responses, mask,
            ("", args.cond_pos, args.cond_neg), need_logits=True)
    sensitivity = tt.tc.counterfactual_sensitivity(*tt.tc.counterfactual_shifts(logp, logp_pos,
                                                                            logp_neg, mask))
    cscr = tt.tc.cscr_weights(sensitivity, mask, strength, args.cscr_threshold)  # (N, T)
    keep = tt.tc.high_entropy_mask(tt.tc.token_entropy(logits), mask, ENTROPY_TOP)  # (N, T)
    settings = [(mode, mode, advantages, lr, "token") for mode in tt.tc.AGGREGATION_MODES]
    settings += [(f"cscr {strength:g}", "sample", advantages[:, None] * cscr, lr,
                  "token"),
                 (f"entropy top {ENTROPY_TOP:g}", "sample",
                  advantages[:, None] * keep, lr, "token"),
                 ("gspo", "sample", advantages, lr, "sequence"),
                 ("sample, lr/2", "sample", advantages, lr / 2, "token")]
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    delta = {}
    for name, mode, token_adv, step_lr, ratio_level in settings:
        model.load_state_dict(start)
        (before, _), = tt.score(model, tokenizer, args, r.problems, r.responses, mask)
        loss, _ = tt.tc.policy_loss(before, before.detach(), token_adv, mask, mode=mode,
                                  group_size=G, max_len=args.max_new_tokens,
                                  ratio_level=ratio_level)
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= step_lr * p.grad  # plain SGD
            (after, _), = tt.score(model, tokenizer, args, r.problems, r.responses, mask)
        delta[name] = torch.where(mask, after - before.detach(), 0.0).cpu()  # (N, T)
    model.load_state_dict(start)
    model.zero_grad(set_to_none=True)
    return dict(delta=delta, mask=mask.cpu(), correct=correct.cpu(), advantages=advantages.cpu(),
                responses=r.responses.cpu(), cscr_weights=cscr.cpu(),
                sensitivity=sensitivity.cpu(), strength=strength, lr=lr)


def report_one_step(model, tokenizer, args, problems, strength: float, device, out_dir) -> dict:
    """On the first prompts_per_step held-out prompts: prints the table, draws onestep.png."""
    step = one_step(model, tokenizer, args, problems[:args.prompts_per_step], strength,
                    args.one_step_lr, device)
    table = one_step_table(step)
    print("\n" + format_one_step(table))
    plot_one_step(step, table, tokenizer, os.path.join(out_dir, "onestep.png"))
    return table


def sample_over_token(step: dict) -> tuple:
    """Per response: lengths (N,), moved = A != 0 (N,), the measured ratio of the mean per-token
    change under "sample" to that under "token" (N,), and its first-order prediction
    mean|o| / |o_i| (N,)."""
    lengths = step["mask"].sum(dim=1).float()  # (N,)
    per_token = {n: step["delta"][n].sum(dim=1) / lengths.clamp(min=1) for n in ("sample", "token")}
    measured = per_token["sample"] / per_token["token"]  # (N,)
    predicted = lengths.mean() / lengths.clamp(min=1)  # (N,) w_sample / w_token
    return lengths, step["advantages"] != 0, measured, predicted


def one_step_table(step: dict) -> dict:
    """Per length bucket and outcome: the mean per-token change under each weighting, and the
    ratio sample/token against its first-order prediction (mean length) / |o_i|. Each response is
    compared with itself across weightings; responses with A = 0 are left out."""
    lengths, moved, measured, predicted = sample_over_token(step)
    per_token = {name: d.sum(dim=1) / lengths.clamp(min=1) for name, d in step["delta"].items()}
    rows = []
    for outcome, is_correct in (("correct", True), ("wrong", False)):
        for bucket, low, high in LENGTH_BUCKETS:
            rows_in = moved & (step["correct"] == is_correct) & (lengths >= low) & (lengths <= high)
            if not rows_in.any():
                continue
            ratio = measured[rows_in] / predicted[rows_in]
            rows.append(dict(outcome=outcome, bucket=bucket, responses=int(rows_in.sum()),
                             mean_length=float(lengths[rows_in].mean()),
                             per_token={name: float(v[rows_in].mean())
                                        for name, v in per_token.items()},
                             ratio_measured=float(measured[rows_in].median()),
                             ratio_predicted=float(predicted[rows_in].median()),
                             ratio_over_predicted=float(ratio.median())))
    ratio = (measured / predicted)[moved]
    linear = (per_token["sample"] / per_token["sample, lr/2"])[moved]
    if not moved.any():  # every group had equal rewards: nothing moved on purpose
        ratio = linear = torch.full((1,), float("nan"))
    return dict(rows=rows, responses=int(moved.sum()),
                ratio_over_predicted_median=float(ratio.median()),
                ratio_over_predicted_iqr=(float(ratio.quantile(0.25)),
                                          float(ratio.quantile(0.75))),
                first_order_median=float(linear.median()), lr=step["lr"])


def format_one_step(table: dict) -> str:
    names = [n for n in (table["rows"][0]["per_token"] if table["rows"] else [])
             if n != "sample, lr/2"]
    lines = [f"One SGD step (lr {table['lr']:g}) from the starting policy, each weighting from the "
             f"same weights ({table['responses']} responses with A != 0): mean change of log pi "
             f"per token, x 1e-3",
             "| outcome | length | responses | mean length | " + " | ".join(names) +
             " | sample/token, median per response | first-order prediction, median of mean "
             "length / abs(o_i) |", "|---|---|---|---|" + "---|" * len(names) + "---|---|"]
    for r in table["rows"]:
        lines.append(f"| {r['outcome']} | {r['bucket']} | {r['responses']} | "
                     f"{r['mean_length']:.1f} | "
                     + " | ".join(f"{1e3 * r['per_token'][n]:+.2f}" for n in names)
                     + f" | {r['ratio_measured']:.2f} | {r['ratio_predicted']:.2f} |")
    low, high = table["ratio_over_predicted_iqr"]
    lines.append(f"per response, sample/token measured / predicted: median "
                 f"{table['ratio_over_predicted_median']:.2f}, IQR {low:.2f}-{high:.2f}; "
                 f"first-order check, Delta(lr) / Delta(lr/2): median "
                 f"{table['first_order_median']:.2f} (2 is exactly first order)")
    return "\n".join(lines)


def plot_one_step(step: dict, table: dict, tokenizer, path: str) -> None:
    """onestep.png: per-token change by bucket and weighting; sample/token against its
    prediction; Delta log pi along one response under GRPO and CSCR, sensitive tokens in red."""
    plt = pyplot()
    fig = plt.figure(figsize=(13, 8.5))
    ax_bars, ax_ratio = fig.add_subplot(2, 2, 1), fig.add_subplot(2, 2, 2)
    ax_tokens = fig.add_subplot(2, 1, 2)
    names = [n for n in step["delta"] if n != "sample, lr/2"]
    rows = table["rows"]
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        ax_bars.bar([i + k * width for i in range(len(rows))],
                    [1e3 * r["per_token"][name] for r in rows], width, label=name)
    ax_bars.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax_bars.set_xticklabels([f"{r['outcome']}\n{r['bucket'].split(' ')[0]}\n({r['responses']})"
                             for r in rows], fontsize=8)
    ax_bars.axhline(0, color="black", linewidth=0.6)
    ax_bars.set_ylabel("mean change of log pi per token (x 1e-3)")
    ax_bars.set_title("one SGD step: how far each response's tokens move, by weighting",
                      fontsize=10)
    ax_bars.legend(fontsize=7)

    mask, adv = step["mask"], step["advantages"]
    lengths, moved, measured, predicted = sample_over_token(step)
    measured, predicted = measured[moved], predicted[moved]
    colours = ["tab:green" if c else "tab:red" for c in step["correct"][moved].tolist()]
    ax_ratio.scatter(lengths[moved], measured, c=colours, s=12, alpha=0.7,
                     label="measured (green right, red wrong)")
    order = lengths[moved].argsort()
    ax_ratio.plot(lengths[moved][order], predicted[order], color="black",
                  label="first order: mean length / |o_i|")
    ax_ratio.set_yscale("log")
    ax_ratio.set_xlabel("response length |o_i| (tokens)")
    ax_ratio.set_ylabel('change under "sample" / under "token"')
    ax_ratio.set_title("the weighting's own effect, response by response", fontsize=10)
    ax_ratio.legend(fontsize=7)

    # a well-formed wrong answer of 16 or more tokens (a slip or the misconception, not a loop):
    # of these, the one whose most sensitive token is most sensitive (what CSCR acts on)
    text = tokenizer.batch_decode(step["responses"].tolist(), skip_special_tokens=True)
    plain = torch.tensor([bool(re.fullmatch(r"(\d+\+\d=\d+,)*\d+\+\d=\d+>\d+", s)) for s in text])
    finished = (step["responses"] == tokenizer.eos_token_id).any(dim=1)
    candidates = moved & ~step["correct"] & finished & plain & (lengths >= 16)
    if not candidates.any():
        candidates = moved if moved.any() else torch.ones_like(moved)
    spread = torch.where(mask, step["sensitivity"], 0.0).amax(dim=1)
    row = int(spread.masked_fill(~candidates, -1).argmax())
    n_tok = int(lengths[row])
    tokens = token_labels(tokenizer, step["responses"][row, :n_tok])
    cscr_name = next(n for n in names if n.startswith("cscr"))
    for name, style in (("sample", "-o"), (cscr_name, "-s")):
        ax_tokens.plot(range(n_tok), 1e3 * step["delta"][name][row, :n_tok], style, markersize=3,
                       label=f"{name} (GRPO)" if name == "sample" else f"{name} on sample weights")
    sensitive = step["cscr_weights"][row, :n_tok] < 1
    ax_tokens.set_xticks(range(n_tok))
    ax_tokens.set_xticklabels(tokens, fontsize=8)
    for tick, is_sensitive in zip(ax_tokens.get_xticklabels(), sensitive.tolist()):
        tick.set_color("tab:red" if is_sensitive else "black")
    ax_tokens.axhline(0, color="black", linewidth=0.6)
    outcome = "correct" if bool(step["correct"][row]) else "wrong"
    ax_tokens.set_title(f"change of log pi along one {outcome} response (A = "
                        f"{float(adv[row]):+.2f}); red tokens: CSCR weight < 1 (downweighted: "
                        f"among the response's most sensitive)", fontsize=10)
    ax_tokens.set_ylabel("change of log pi (x 1e-3)")
    ax_tokens.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -----------------------------------------------------------------------------
# 3. where does CSCR move credit? The diagnosis and the credit picture, on the starting policy

CLASSES = ("answer digit", "intermediate digit", "operator", "format")


def token_classes(tokenizer, responses: torch.Tensor) -> torch.Tensor:
    """(n, T) class index: digits after '>' are the answer, other digits intermediate, '+' '='
    operators, the rest format."""
    ids = responses.unique().tolist()
    text = {i: tokenizer.decode([i]) for i in ids}
    lookup = torch.zeros(max(ids) + 1, 3, dtype=torch.bool)  # has digit, is operator, has '>'
    for i, s in text.items():
        lookup[i] = torch.tensor([any(c.isdigit() for c in s), s.strip() in ("+", "="), ">" in s])
    flags = lookup[responses.cpu()]  # (n, T, 3)
    has_gt = flags[..., 2].long()
    after_gt = (has_gt.cumsum(dim=1) - has_gt) > 0
    classes = torch.full(responses.shape, 3)  # format
    classes[flags[..., 1]] = 2
    classes[flags[..., 0] & ~after_gt] = 1
    classes[flags[..., 0] & after_gt] = 0
    return classes


@torch.no_grad()
def diagnose(model, tokenizer, args, problems, strength: float, device):
    """Sample G responses per problem from the starting policy and score them under c+ and c-:
    do the two assertions push each token class the same way, and what weight does CSCR give
    it? Returns (diagnosis dict, data for the credit picture)."""
    tiny_task.seed_everything(args.warmup_seed + DIAGNOSIS_STREAM)
    r = tt.rollout(model, tokenizer, args, problems, args.group_size, False, device)
    mask = r.mask
    (logp, logits), (logp_pos, _), (logp_neg, _) = tt.score(
        model, tokenizer, args, r.problems, r.responses, mask, ("", args.cond_pos, args.cond_neg),
        need_logits=True)
    d_pos, d_neg = tt.tc.counterfactual_shifts(logp, logp_pos, logp_neg, mask)
    sensitivity = tt.tc.counterfactual_sensitivity(d_pos, d_neg)
    classes = token_classes(tokenizer, r.responses).to(device)
    correct = r.correct.to(device)
    weights = tt.tc.cscr_weights(sensitivity, mask, strength, args.cscr_threshold)
    entropy = tt.tc.token_entropy(logits)  # (N, T): the other bet on which tokens matter
    keep = tt.tc.high_entropy_mask(entropy, mask, ENTROPY_TOP).bool()
    sensitive = tt.tc.high_entropy_mask(sensitivity, mask, ENTROPY_TOP).bool()  # top 20 % by s
    correlation = torch.corrcoef(torch.stack([entropy[mask], sensitivity[mask]]))[0, 1]
    result = dict(all=tt.tc.shift_diagnostics(d_pos, d_neg, mask), by_class={}, by_outcome={},
                  strength=strength, responses=len(r.problems),
                  entropy_sensitivity_correlation=float(correlation),
                  top_entropy_also_top_sensitivity=float((keep & sensitive).sum()
                                                         / keep.sum().clamp(min=1)))
    for k, name in enumerate(CLASSES):
        in_class = mask & (classes == k)
        entry = tt.tc.shift_diagnostics(d_pos, d_neg, in_class)

        def mean_in(x):
            return float(x[in_class].float().mean()) if in_class.any() else float("nan")
        entry.update(mean_cscr_weight=mean_in(weights), mean_entropy=mean_in(entropy),
                     top_entropy=mean_in(keep))
        result["by_class"][name] = entry
    for name, rows in (("correct", correct), ("wrong", ~correct)):
        result["by_outcome"][name] = tt.tc.shift_diagnostics(d_pos, d_neg, mask & rows[:, None])
    picture = dict(responses=r.responses.cpu(), mask=mask.cpu(), weights=weights.cpu(),
                   correct=correct.cpu(), sensitivity=sensitivity.cpu())
    return result, picture


def report_diagnosis(model, tokenizer, args, problems, strength: float, device, out_dir) -> dict:
    """On the first 32 held-out prompts: prints the table, draws credit.png."""
    diagnosis, picture = diagnose(model, tokenizer, args, problems[:32], strength, device)
    diagnosis["credit_png"] = plot_credit(picture, tokenizer, strength,
                                          os.path.join(out_dir, "credit.png"))
    print("\n" + format_diagnosis(diagnosis))
    return diagnosis


def format_diagnosis(diag: dict) -> str:
    a = diag["all"]
    lines = [f"CSCR diagnosis on the starting policy ({diag['responses']} sampled responses, "
             f"{a['num_tokens']} tokens): same direction {a['same_direction']:.3f}, sign reversal "
             f"{a['sign_reversal']:.3f}, mean |d+| {a['mean_abs_pos']:.3f}, mean |d-| "
             f"{a['mean_abs_neg']:.3f}",
             f"entropy against sensitivity: correlation "
             f"{diag['entropy_sensitivity_correlation']:.3f} over tokens; "
             f"{diag['top_entropy_also_top_sensitivity']:.3f} of the top {ENTROPY_TOP:.0%} by "
             f"entropy are also in the top {ENTROPY_TOP:.0%} by sensitivity",
             f"| token class | tokens | same direction | sign reversal | mean sensitivity | mean "
             f"CSCR weight (strength {diag['strength']:g}) | mean entropy | in the top "
             f"{ENTROPY_TOP:.0%} by entropy |", "|---|---|---|---|---|---|---|---|"]
    for name, e in diag["by_class"].items():
        lines.append(f"| {name} | {e['num_tokens']} | {e['same_direction']:.3f} | "
                     f"{e['sign_reversal']:.3f} | {e['mean_sensitivity']:.3f} | "
                     f"{e['mean_cscr_weight']:.3f} | {e['mean_entropy']:.3f} | "
                     f"{e['top_entropy']:.3f} |")
    if "credit_png" in diag:  # the two responses credit.png draws
        short, long = diag["credit_png"]["lengths"]
        lines.append(f"credit.png, responses of {short} and {long} tokens, each one's share of the "
                     "loss weight: " + "; ".join(f"{name} {a:.2%} and {b:.2%}" for name, (a, b)
                                                 in diag["credit_png"]["shares"].items()))
    return "\n".join(lines)


def plot_credit(picture: dict, tokenizer, strength: float, path: str) -> dict:
    """credit.png: each token of a short and a long sampled response, shaded by its share of the
    loss weight under "sample", "token" and CSCR (the credit is that share times A). Returns the
    two responses' lengths and each weighting's share of the loss weight per response."""
    plt = pyplot()
    mask, responses, weights = picture["mask"], picture["responses"], picture["weights"]
    N, lengths = mask.shape[0], mask.sum(dim=1)
    # the shortest and the longest correct response (any response if fewer than two are correct)
    candidates = (picture["correct"] if int(picture["correct"].sum()) >= 2
                  else torch.ones(N, dtype=torch.bool))
    rows = [int(lengths.masked_fill(~candidates, 10 ** 9).argmin()),
            int(lengths.masked_fill(~candidates, -1).argmax())]
    shares = {'"sample" (GRPO)': tt.tc.token_weights(mask, "sample"),
              '"token" (DAPO / verl / TRL)': tt.tc.token_weights(mask, "token"),
              f'CSCR, strength {strength:g} (on "sample")': tt.tc.token_weights(mask, "sample")
              * weights}
    vmax = max(float(w[rows].max()) for w in shares.values())
    width = int(lengths.max())
    panels = [(row, name, w) for row in rows for name, w in shares.items()]
    fig, axes = plt.subplots(len(panels), 1,
                             figsize=(max(8, 0.32 * width + 2), 0.75 * len(panels) + 1.2))
    cmap = plt.get_cmap("Blues")
    for ax, (row, name, w) in zip(axes, panels):
        tokens = token_labels(tokenizer, responses[row, : int(lengths[row])])
        values = w[row, : len(tokens)]
        for t, (tok, v) in enumerate(zip(tokens, values.tolist())):
            ax.add_patch(plt.Rectangle((t, 0), 1, 1, color=cmap(0.1 + 0.9 * v / vmax)))
            ax.text(t + 0.5, 0.5, tok, ha="center", va="center", fontsize=8,
                    color="white" if v / vmax > 0.6 else "black")
        ax.set_xlim(0, width)
        ax.set_ylim(0, 1)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
        ax.set_title(f"{len(tokens)}-token response: {float(values.sum()) * 100:.2f}% of the loss "
                     f"weight (batch of {N})", fontsize=8, loc="left", pad=2)
    fig.suptitle("Share of the loss weight each token receives (darker = more; its credit is this "
                 "share x A)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return dict(lengths=[int(lengths[row]) for row in rows],
                shares={name: [float(w[row].sum()) for row in rows] for name, w in shares.items()})


def token_labels(tokenizer, ids: torch.Tensor) -> List[str]:
    """One label per token id for the pictures, "eos" for <eos>."""
    texts = [tokenizer.decode([i]) for i in ids.tolist()]
    return ["eos" if text in ("", tokenizer.eos_token) else text for text in texts]


# -----------------------------------------------------------------------------
# 4. does one knob change what happens, seed by seed? Two saved runs compared in pairs
#
# Two runs with the same seed start from the same warm-up, see the same problems and the same
# first rollout batch; they differ only in the knob. The difference within a seed is therefore
# free of most of what a seed changes, and it is the difference a paired comparison reads.

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


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: the x with P(T <= x) = p for T with df degrees of freedom, by
    bisection on the CDF, which is 1/2 + the density integrated from 0 to x (Simpson's rule)."""
    if not (0.5 <= p < 1 and df >= 1):
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x, n=2000):
        h = x / n
        f = [math.exp(log_c - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def sign_test_p(plus: int, minus: int) -> float:
    """The exact two-sided sign test: under "no effect" each seed's difference is + or - with
    probability 1/2 (ties dropped), so P = 2 P(Binomial(n, 1/2) <= the smaller count), at most 1."""
    n, k = plus + minus, min(plus, minus)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


def paired_stats(diffs: List[float], digits: int = 6) -> dict:
    """Per-seed differences -> their mean, its 95 % t-interval, the sign counts and the sign
    test's p. A difference that rounds to 0 at `digits` decimals, as the table prints it, is a
    tie: the compact copies keep 5 significant digits, so two equal sums of truncated answers
    can differ in the 8th decimal. One seed gives no interval (nan)."""
    n = len(diffs)
    mean, sd = mean_std(diffs)
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n) if n > 1 else float("nan")
    signs = [round(d, digits) for d in diffs]
    plus, minus = sum(d > 0 for d in signs), sum(d < 0 for d in signs)
    return dict(n=n, mean=mean, low=mean - half, high=mean + half, plus=plus, minus=minus,
                zero=n - plus - minus, p=sign_test_p(plus, minus))


def load_side(spec: str) -> tuple:
    """PATH or PATH:METHOD (a run folder or results/NAME.json) -> (run, method)."""
    path, _, method = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not os.path.exists(path if path.endswith(".json") else os.path.join(path, "results.json")):
        raise ValueError(f"compare: no saved run at {path!r}; expected runs/NAME or "
                         "results/NAME.json, optionally followed by :METHOD")
    run = load_run(path)
    methods = methods_of(run)
    if not method and len(methods) == 1:
        method = methods[0]
    if method not in methods:
        raise ValueError(f"compare: {path} holds the methods {', '.join(methods)}; name one, "
                         f"as {path}:{methods[0]}, got {repr(method) if method else 'none'}")
    return run, method


def method_args(run: dict, method: str) -> dict:
    """The arguments method trained with: the run's config and what its preset changed."""
    return {**run["config"], **run.get("methods", {}).get(method, {})}


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


def seed_run(side: tuple, seed: int) -> dict:
    """The record of side's method trained with seed."""
    run, method = side
    return next(r for r in run["runs"] if r["method"] == method and r["seed"] == seed)


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


def plot_compare(p: dict, path: str) -> None:
    """The picture: each seed's difference OTHER - BASE per update (5-update mean, thin) and the
    mean over seeds (thick), one panel per rollout measure, and the held-out sampled accuracy."""
    plt = pyplot()
    base, other, seeds = p["base"], p["other"], p["seeds"]

    def series(side, seed, key):
        r = seed_run(side, seed)
        if key == "sampled_accuracy":  # held-out, from the shared start (difference 0)
            steps = sorted(map(int, r["evals"]))
            return [0] + steps, [side[0]["start"][key]] + [r["evals"][str(s)][key] for s in steps]
        return r["updates"]["step"], r["updates"][key]
    panels = [(key, label, 5) for key, label, _ in PAIRED_SERIES]
    panels.append(("sampled_accuracy", "held-out sampled accuracy", 1))
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    for ax, (key, label, window) in zip(axes.flat, panels):
        curves = []
        for seed in seeds:
            steps, b = series(base, seed, key)
            _, o = series(other, seed, key)
            diff = [None if x is None or y is None else y - x for x, y in zip(b, o)]
            curves.append([mean_of(diff[max(0, i - window // 2):i + window // 2 + 1])
                           for i in range(len(diff))])
            ax.plot(steps, curves[-1], color="tab:blue", alpha=0.3, linewidth=0.8)
        ax.plot(steps, [mean_of(c) for c in zip(*curves)], color="tab:blue", linewidth=2.5,
                label=f"mean of {len(seeds)} seeds")
        ax.axhline(0, color="black", linewidth=0.8)
        smoothing = ", 5-update mean" if window > 1 else " at each evaluation"
        ax.set_title(f"{label}{smoothing}", fontsize=10)
        ax.set_xlabel("policy update")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{other[0]['name']}:{other[1]} minus {base[0]['name']}:{base[1]}, "
                 "seed by seed (thin: one seed; thick: their mean; below 0: OTHER is lower)",
                 fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
    if len(a.runs) % 2 or (a.plot and len(a.runs) > 2):
        raise ValueError(f"compare: expected BASE OTHER pairs (and --plot with one pair), got "
                         f"{len(a.runs)} runs: {' '.join(a.runs)}")
    sides = [load_side(spec) for spec in a.runs]
    pairs = [paired(base, other) for base, other in zip(sides[::2], sides[1::2])]
    if a.primary:
        print(format_primary(pairs))
        return pairs
    for p in pairs:
        print(format_compare(p))
        (b_run, b_method), (o_run, o_method) = p["base"], p["other"]
        path = a.plot or os.path.join("runs", "compare", f"{o_run['name']}-{o_method}-minus-"
                                      f"{b_run['name']}-{b_method}.png")
        plot_compare(p, path)
        print(f"wrote {path}\n")
    return pairs


# -----------------------------------------------------------------------------
# helpers

def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt

