"""1. Does RL fix the warm-up's mistakes? The results table (mean +- std over seeds), the rollout
statistics, and the one-knob runs: the grpo preset with one thing changed."""

from typing import Dict, List

from lab.records import methods_of, summarise_run
from lab.stats import mean_of, mean_std, number

SUMMARY_KEYS = ("accuracy", "sampled_accuracy", "accuracy_misconception", "length",
                "truncated_first10", "truncated_last10", "length_wrong_last10", "entropy")


def summarise(run: dict, method: str) -> dict:
    """One method of a run: each summary key's mean and std over its seeds."""
    rows = [summarise_run(r, run["start"]) for r in run["runs"] if r["method"] == method]
    table = dict(seeds=len(rows))
    for key in SUMMARY_KEYS:
        table[key], table[key + "_std"] = mean_std([r[key] for r in rows])
    return table


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
                    if rs[0]["updates"]["clip_frac_low"][:1] not in ([], [None]) else "-")
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


def format_knobs(runs: Dict[str, dict]) -> str:
    """One knob at a time: each row the grpo preset with one change, mean +- std over seeds."""
    lines = ["one knob at a time, held-out accuracy after the last update, mean +- std over seeds:",
             "| changed from `grpo` " + TABLE_HEADER, "|---" * 8 + "|"]
    lines += [format_row(label, summarise(runs[name], method)) for label, name, method, _ in KNOBS]
    return "\n".join(lines)

