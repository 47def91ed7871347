"""lab.py: what train_tiny.py's lab measures and draws, in the order its main() asks.

0. The starting policy: is the right answer within reach of sampling?   pass_at_group, format_start
1. Does RL fix the warm-up's mistakes?           evaluate (held-out), report_training: the table and curves.png
2. What does one step do under each weighting?   report_one_step: one_step, its table and onestep.png
3. Where does CSCR move credit?                  report_diagnosis: diagnose, its table and credit.png

Every table title printed by train_tiny.py can be searched for here. Questions 2 and 3 are asked of the
starting policy, on the first held-out prompts, from fixed random streams.
"""

import math
import os
import re
from typing import Dict, List

import torch

import tokencredit as tc
import train_tiny as tt


# the lab's fixed random streams, as offsets from --warmup-seed, so that no two share one (train_tiny's held-out
# problems use tt.HELD_OUT_STREAM)
DIAGNOSIS_STREAM, EVAL_SAMPLING_STREAM, ONE_STEP_STREAM, PASS_AT_G_STREAM = 1, 2, 3, 4


def token_labels(tokenizer, ids: torch.Tensor) -> List[str]:
    """One label per token id for the pictures, "eos" for <eos>."""
    texts = [tokenizer.decode([i]) for i in ids.tolist()]
    return ["eos" if text in ("", tokenizer.eos_token) else text for text in texts]


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


# -----------------------------------------------------------------------------
# 0. the starting policy: is the right answer within reach of sampling, and do lengths differ in a group?

@torch.no_grad()
def pass_at_group(model, tokenizer, args, problems, device) -> Dict[str, float]:
    """pass@1 (the mean accuracy of samples) and pass@G (some sample of the G is right): can a group
    contrast a right answer with a wrong one? And how much do the lengths of one prompt's answers differ?"""
    tt.seed_everything(args.warmup_seed + PASS_AT_G_STREAM)
    _, mask, texts, complete = tt.generate(model, tokenizer, args, problems, args.group_size, False, device)
    flat = [t for t in problems for _ in range(args.group_size)]
    correct = tt.verify_all(flat, texts, complete).view(len(problems), args.group_size)  # (B, G)
    lengths = mask.sum(dim=1).float().view(len(problems), args.group_size)  # (B, G)
    return {"pass@1": float(correct.float().mean()),
            f"pass@{args.group_size}": float(correct.any(dim=1).float().mean()),
            "longest/shortest in a group": float((lengths.max(dim=1).values / lengths.min(dim=1).values).mean()),
            "groups with a truncated answer": float((~complete).view(len(problems), args.group_size).any(dim=1)
                                                    .float().mean())}


def format_start(start: dict, args) -> str:
    reach = ", ".join(f"{k} {start[k]:.3f}" for k in (f"pass@1", f"pass@{args.group_size}",
                                                      "longest/shortest in a group", "groups with a truncated answer"))
    return (f"starting policy: held-out accuracy {start['accuracy']:.3f} greedy ({start['accuracy_misconception']:.3f} "
            f"where the misconception applies, {start['accuracy_other']:.3f} elsewhere), "
            f"{start['sampled_accuracy']:.3f} sampled ({start['sampled_accuracy_misconception']:.3f} where the misconception "
            f"applies), mean length {start['length']:.1f} tokens "
            f"({args.eval_size} problems)\n{args.group_size} samples per held-out problem: {reach}")


# -----------------------------------------------------------------------------
# 1. does RL fix the warm-up's mistakes? Held-out accuracy before and after, and the curves

def evaluate(model, tokenizer, args, problems, device) -> Dict[str, float]:
    """Held-out accuracy, greedy and as the mean over eval_samples samples at the rollout temperature
    (what RL maximises); greedy also split by whether the problem meets the misconception. Sampling
    draws from its own stream, so evaluating does not change the training run's."""
    greedy, sampled, lengths = [], [], []
    with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
        torch.manual_seed(args.warmup_seed + EVAL_SAMPLING_STREAM)
        for start in range(0, len(problems), 256):
            chunk = problems[start:start + 256]
            _, mask, texts, complete = tt.generate(model, tokenizer, args, chunk, 1, True, device)
            greedy += tt.verify_all(chunk, texts, complete).tolist()
            lengths += mask.sum(dim=1).tolist()
            _, _, texts, complete = tt.generate(model, tokenizer, args, chunk, args.eval_samples, False, device)
            right = tt.verify_all([t for t in chunk for _ in range(args.eval_samples)], texts, complete)
            sampled += right.view(len(chunk), args.eval_samples).float().mean(dim=1).tolist()
    meets = [meets_misconception(t, args) for t in problems]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return dict(accuracy=mean(greedy), sampled_accuracy=mean(sampled),
                length=mean(lengths), accuracy_misconception=mean([g for g, m in zip(greedy, meets) if m]),
                accuracy_other=mean([g for g, m in zip(greedy, meets) if not m]),
                sampled_accuracy_misconception=mean([x for x, m in zip(sampled, meets) if m]))


def meets_misconception(terms: List[int], args) -> bool:
    """True if solving `terms` adds one of the misconception's addends with a carry (where it errs)."""
    totals = [sum(terms[:k + 1]) for k in range(len(terms) - 1)]  # the partial sum before each step
    return any(tt.forgets_carry(total, x, tt.forgotten_addends(args)) for total, x in zip(totals, terms[1:]))


def progress(r: dict) -> str:
    """One update's log line: the rollouts, the policy's entropy, and where the seconds went."""
    if "entropy" not in r:
        return f"no informative group after {r['rounds']} rounds: update skipped"
    return (f"reward {r['reward']:+.2f} acc {r['accuracy']:.2f} len {r['length']:5.1f} ent {r['entropy']:.3f} "
            f"kept {r['kept_frac']:.2f}" + (f" eval {r['eval_accuracy']:.3f}" if "eval_accuracy" in r else "")
            + f" | gen {r['t_generate']:.2f}s score {r['t_score']:.2f}s update {r['t_update']:.2f}s")


def rollout_stats(batch: Dict[str, torch.Tensor], mask: torch.Tensor) -> Dict[str, float]:
    """What one update's rollouts look like: mean length, of right and of wrong answers; the fraction
    truncated (loops that hit the budget) and the fraction that finished after re-checking a step."""
    lengths = mask.sum(dim=1).float().cpu()  # (N,)
    correct, complete = batch["correct"].flatten(), batch["complete"].flatten()
    mean_or_nan = lambda x: float(x.mean()) if x.numel() else float("nan")  # noqa: E731
    return dict(length=float(lengths.mean()), length_correct=mean_or_nan(lengths[correct]),
                length_wrong=mean_or_nan(lengths[~correct]), truncated_frac=float((~complete).float().mean()),
                recheck_frac=float((batch["detour"].flatten() & complete).float().mean()))


def mean_of(records: List[dict], key: str) -> float:
    values = [r[key] for r in records if key in r and r[key] == r[key]]  # NaN: no such rollout in that batch
    return sum(values) / len(values) if values else float("nan")


def summarise_run(label: str, seed: int, history: List[dict], start: dict, wall_s: float, interrupted: bool) -> dict:
    """One method and seed: held-out accuracy at the start and at the last evaluation, and rollout statistics
    over the first and last ten updates."""
    final = next((r for r in reversed(history) if "eval_accuracy" in r), None)
    end = {k: final[f"eval_{k}"] for k in ("accuracy", "sampled_accuracy", "length", "accuracy_misconception",
                                            "accuracy_other", "sampled_accuracy_misconception")} if final else start
    trained = [r for r in history if "entropy" in r]
    summary = dict(method=label, seed=seed, start_accuracy=start["accuracy"],
                   start_sampled_accuracy=start["sampled_accuracy"], start_length=start["length"],
                   final_accuracy=end["accuracy"], final_sampled_accuracy=end["sampled_accuracy"],
                   final_length=end["length"], entropy=mean_of(trained[-5:], "entropy") if trained else 0.0,
                   start_accuracy_misconception=start["accuracy_misconception"],
                   final_accuracy_misconception=end["accuracy_misconception"],
                   final_accuracy_other=end["accuracy_other"],
                   start_sampled_accuracy_misconception=start["sampled_accuracy_misconception"],
                   final_sampled_accuracy_misconception=end["sampled_accuracy_misconception"],
                   truncated_first10=mean_of(trained[:10], "truncated_frac"),
                   truncated_last10=mean_of(trained[-10:], "truncated_frac"),
                   length_wrong_last10=mean_of(trained[-10:], "length_wrong"), steps=len(history), wall_s=wall_s,
                   s_per_step={k: sum(r[k] for r in history) / max(1, len(history))
                               for k in ("t_generate", "t_score", "t_update")})
    return dict(summary, interrupted=True) if interrupted else summary


def mean_std(values: List[float]) -> tuple:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


SUMMARY_KEYS = ("start_accuracy", "final_accuracy", "start_sampled_accuracy", "final_sampled_accuracy", "final_length",
                "entropy", "wall_s", "truncated_first10", "truncated_last10", "start_accuracy_misconception",
                "final_accuracy_misconception", "final_accuracy_other", "length_wrong_last10",
                "final_sampled_accuracy_misconception")


def summarise(runs: List[dict]) -> List[dict]:
    """One row per method: mean and std over seeds."""
    table = []
    for label in dict.fromkeys(r["method"] for r in runs):
        rows = [r for r in runs if r["method"] == label]
        entry = dict(method=label, seeds=len(rows))
        for key in SUMMARY_KEYS:
            entry[key], entry[key + "_std"] = mean_std([r[key] for r in rows])
        table.append(entry)
    return table


def format_table(table: List[dict]) -> str:
    lines = ["| method | seeds | greedy acc: start -> final | sampled acc: start -> final | held-out length | "
             "truncated rollouts: updates 1-10 -> last 10 | wrong-answer length, last 10 | entropy | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in table:
        lines.append(f"| {e['method']} | {e['seeds']} | {e['start_accuracy']:.3f} -> {e['final_accuracy']:.3f} "
                     f"+- {e['final_accuracy_std']:.3f} | {e['start_sampled_accuracy']:.3f} -> "
                     f"{e['final_sampled_accuracy']:.3f} +- {e['final_sampled_accuracy_std']:.3f} | "
                     f"{e['final_length']:.1f} +- {e['final_length_std']:.1f} | {e['truncated_first10']:.3f} -> "
                     f"{e['truncated_last10']:.3f} +- {e['truncated_last10_std']:.3f} | "
                     f"{e['length_wrong_last10']:.1f} +- {e['length_wrong_last10_std']:.1f} | {e['entropy']:.3f} | "
                     f"{e['wall_s']:.0f} |")
    return "\n".join(lines)


def report_training(runs: List[dict], histories: Dict[str, List[dict]], start: dict, args, out_dir: str) -> List[dict]:
    """Prints the table of every method (mean +- std over seeds), draws curves.png, returns the table."""
    table = summarise(runs)
    plot_curves(histories, start, os.path.join(out_dir, "curves.png"))
    print(f"\nheld-out accuracy after {args.steps} policy updates ({args.eval_size} problems; greedy, and the mean "
          f"of {args.eval_samples} samples at temperature {args.temperature:g}), mean +- std over seeds {args.seeds}:")
    print(format_table(table))
    return table


def plot_curves(histories: Dict[str, List[dict]], start: Dict[str, float], path: str) -> None:
    """curves.png: held-out accuracy, lengths of right and wrong answers, truncated and re-checked rollouts,
    entropy and the informative-group fraction against policy update, mean over seeds."""
    plt = pyplot()
    panels = [(("eval_accuracy", "eval_sampled_accuracy"), "held-out accuracy: greedy (solid), sampled (dashed)"),
              (("length_correct", "length_wrong"), "rollout length (tokens): correct (solid), wrong (dashed)"),
              (("truncated_frac",), "truncated rollouts (loops that hit the budget)"),
              (("recheck_frac",), "rollouts that finished with a re-checked step"),
              (("entropy",), "policy entropy (nats/token)"),
              (("kept_frac",), "informative groups (0 < #correct < G)")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def mean_curve(records, key, start_value=None):
        by_step: Dict[int, List[float]] = {}
        for r in records:
            if key in r and r[key] == r[key]:  # skip NaN (no wrong answer in that batch)
                by_step.setdefault(r["step"], []).append(r[key])
        if start_value is not None:
            by_step[0] = [start_value]
        steps = sorted(by_step)
        return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]

    for ax, (keys, title) in zip(axes.flat, panels):
        for k, (label, records) in enumerate(histories.items()):
            for key, style in zip(keys, ("-", "--")):
                if key.startswith("eval_"):
                    ax.plot(*mean_curve(records, key, start[key[len("eval_"):]]), style, marker="o", markersize=3,
                            color=colours[k % len(colours)], label=label if style == "-" else None)
                else:  # per-step values are noisy: a centred 5-step moving average
                    steps, values = mean_curve(records, key)
                    smooth = [sum(values[max(0, i - 2):i + 3]) / len(values[max(0, i - 2):i + 3])
                              for i in range(len(values))]
                    ax.plot(steps, smooth, style, color=colours[k % len(colours)], alpha=0.85,
                            label=label if style == "-" else None)
        ax.set_title(title + ("" if keys[0].startswith("eval_") else ", 5-step mean"), fontsize=10)
        ax.set_xlabel("policy update")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    seeds = len({r["seed"] for records in histories.values() for r in records})
    fig.suptitle(f"tiny-model RLVR, mean over {seeds} seed(s)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -----------------------------------------------------------------------------
# 2. what does one step do under each weighting? One plain SGD step, measured exactly

LENGTH_BUCKETS = (("short (<= 15 tokens)", 0, 15), ("medium (16-29)", 16, 29), ("long (>= 30)", 30, 10 ** 9))
ENTROPY_TOP = 0.2  # the fraction of a batch's tokens the entropy mask keeps, as in the 80/20 paper


def one_step(model, tokenizer, args, problems, strength: float, lr: float, device) -> dict:
    """One rollout batch from the starting policy; from the same weights and the same GRPO advantages,
    one plain SGD step (theta -= lr * grad) per weighting; Delta_{i,t} = log pi_new(o_t) - log pi_old(o_t).

    SGD, not Adam, so that the raw gradient acts; lr small, so that the step is first order ("sample, lr/2"
    checks it). On-policy the gradient w.r.t. logp_{i,t} is -w_{i,t} A_{i,t}, so Delta is that credit times
    how much log pi(o_t) responds to the parameters, summed over every token's push.
    Returns Delta (N, T) keyed by weighting, and the batch it was measured on.
    """
    tt.seed_everything(args.warmup_seed + ONE_STEP_STREAM)
    responses, mask, texts, complete = tt.generate(model, tokenizer, args, problems, args.group_size, False, device)
    G, B = args.group_size, len(problems)
    flat = [t for t in problems for _ in range(G)]
    correct = tt.verify_all(flat, texts, complete).to(device)  # (N,)
    rewards = torch.where(correct, args.reward_correct, args.reward_wrong).float().view(B, G)
    advantages = tc.group_advantages(rewards, scale="std").flatten().to(device)  # (N,)
    with torch.no_grad():
        (logp, logits), (logp_pos, _), (logp_neg, _) = tt.score(model, tokenizer, args, flat, responses, mask,
                                                                ("", args.cond_pos, args.cond_neg), need_logits=True)
    sensitivity = tc.counterfactual_sensitivity(*tc.counterfactual_shifts(logp, logp_pos, logp_neg, mask))
    cscr = tc.cscr_weights(sensitivity, mask, strength, args.cscr_threshold)  # (N, T)
    keep = tc.high_entropy_mask(tc.token_entropy(logits), mask, ENTROPY_TOP)  # (N, T)
    settings = [(mode, mode, advantages, lr, "token") for mode in tc.AGGREGATION_MODES]
    settings += [(f"cscr {strength:g}", "sample", tc.token_advantages(advantages, cscr), lr, "token"),
                 (f"entropy top {ENTROPY_TOP:g}", "sample", tc.token_advantages(advantages, keep), lr, "token"),
                 ("gspo", "sample", advantages, lr, "sequence"),
                 ("sample, lr/2", "sample", advantages, lr / 2, "token")]
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    delta = {}
    for name, mode, token_adv, step_lr, ratio_level in settings:
        model.load_state_dict(start)
        (before, _), = tt.score(model, tokenizer, args, flat, responses, mask)
        loss, _ = tc.policy_loss(before, before.detach(), token_adv, mask, mode=mode, group_size=G,
                                 max_len=args.max_new_tokens, ratio_level=ratio_level)
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= step_lr * p.grad  # plain SGD
            (after, _), = tt.score(model, tokenizer, args, flat, responses, mask)
        delta[name] = torch.where(mask, after - before.detach(), torch.zeros_like(after)).cpu()  # (N, T)
    model.load_state_dict(start)
    model.zero_grad(set_to_none=True)
    return dict(delta=delta, mask=mask.cpu(), correct=correct.cpu(), advantages=advantages.cpu(),
                responses=responses.cpu(), cscr_weights=cscr.cpu(), sensitivity=sensitivity.cpu(),
                strength=strength, lr=lr)


def report_one_step(model, tokenizer, args, problems, strength: float, device, out_dir: str) -> dict:
    """On the first prompts_per_step held-out prompts: prints the table, draws onestep.png, returns the table."""
    step = one_step(model, tokenizer, args, problems[:args.prompts_per_step], strength, args.one_step_lr, device)
    table = one_step_table(step)
    print("\n" + format_one_step(table))
    plot_one_step(step, table, tokenizer, os.path.join(out_dir, "onestep.png"))
    return table


def sample_over_token(step: dict) -> tuple:
    """Per response: lengths (N,), moved = A != 0 (N,), the measured ratio of the mean per-token change
    under "sample" to that under "token" (N,), and its first-order prediction mean|o| / |o_i| (N,)."""
    lengths = step["mask"].sum(dim=1).float()  # (N,)
    per_token = {n: step["delta"][n].sum(dim=1) / lengths.clamp(min=1) for n in ("sample", "token")}  # (N,)
    measured = per_token["sample"] / per_token["token"]  # (N,)
    predicted = lengths.mean() / lengths.clamp(min=1)  # (N,) w_sample / w_token
    return lengths, step["advantages"] != 0, measured, predicted


def one_step_table(step: dict) -> dict:
    """Per length bucket and outcome: the mean per-token change under each weighting, and the ratio
    sample/token against its first-order prediction (mean length) / |o_i|. Each response is compared
    with itself across weightings; responses whose group had equal rewards (A = 0) are left out."""
    lengths, moved, measured, predicted = sample_over_token(step)
    per_token = {name: d.sum(dim=1) / lengths.clamp(min=1) for name, d in step["delta"].items()}  # (N,) mean Delta
    rows = []
    for outcome, is_correct in (("correct", True), ("wrong", False)):
        for bucket, low, high in LENGTH_BUCKETS:
            rows_in = moved & (step["correct"] == is_correct) & (lengths >= low) & (lengths <= high)
            if not rows_in.any():
                continue
            ratio = measured[rows_in] / predicted[rows_in]
            rows.append(dict(outcome=outcome, bucket=bucket, responses=int(rows_in.sum()),
                             mean_length=float(lengths[rows_in].mean()),
                             per_token={name: float(v[rows_in].mean()) for name, v in per_token.items()},
                             ratio_measured=float(measured[rows_in].median()),
                             ratio_predicted=float(predicted[rows_in].median()),
                             ratio_over_predicted=float(ratio.median())))
    ratio = (measured / predicted)[moved]
    linear = (per_token["sample"] / per_token["sample, lr/2"])[moved]
    if not moved.any():  # every group had equal rewards: nothing moved on purpose
        ratio = linear = torch.full((1,), float("nan"))
    return dict(rows=rows, responses=int(moved.sum()), ratio_over_predicted_median=float(ratio.median()),
                ratio_over_predicted_iqr=(float(ratio.quantile(0.25)), float(ratio.quantile(0.75))),
                first_order_median=float(linear.median()), lr=step["lr"])


def format_one_step(table: dict) -> str:
    names = [n for n in table["rows"][0]["per_token"] if n != "sample, lr/2"] if table["rows"] else []
    lines = [f"One SGD step (lr {table['lr']:g}) from the starting policy, each weighting from the same weights "
             f"({table['responses']} responses with A != 0): mean change of log pi per token, x 1e-3",
             "| outcome | length | responses | mean length | " + " | ".join(names) +
             " | sample/token, median per response | first-order prediction, median of mean length / abs(o_i) |",
             "|---|---|---|---|" + "---|" * len(names) + "---|---|"]
    for r in table["rows"]:
        lines.append(f"| {r['outcome']} | {r['bucket']} | {r['responses']} | {r['mean_length']:.1f} | "
                     + " | ".join(f"{1e3 * r['per_token'][n]:+.2f}" for n in names)
                     + f" | {r['ratio_measured']:.2f} | {r['ratio_predicted']:.2f} |")
    low, high = table["ratio_over_predicted_iqr"]
    lines.append(f"per response, sample/token measured / predicted: median {table['ratio_over_predicted_median']:.2f}, "
                 f"IQR {low:.2f}-{high:.2f}; first-order check, Delta(lr) / Delta(lr/2): median "
                 f"{table['first_order_median']:.2f} (2 is exactly first order)")
    return "\n".join(lines)


def plot_one_step(step: dict, table: dict, tokenizer, path: str) -> None:
    """onestep.png: per-token change by bucket and weighting; sample/token against its prediction;
    Delta log pi along one response under GRPO and CSCR, sensitive tokens in red."""
    plt = pyplot()
    fig = plt.figure(figsize=(13, 8.5))
    ax_bars, ax_ratio, ax_tokens = fig.add_subplot(2, 2, 1), fig.add_subplot(2, 2, 2), fig.add_subplot(2, 1, 2)
    names = [n for n in step["delta"] if n != "sample, lr/2"]
    rows = table["rows"]
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        ax_bars.bar([i + k * width for i in range(len(rows))], [1e3 * r["per_token"][name] for r in rows],
                    width, label=name)
    ax_bars.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax_bars.set_xticklabels([f"{r['outcome']}\n{r['bucket'].split(' ')[0]}\n({r['responses']})" for r in rows],
                            fontsize=8)
    ax_bars.axhline(0, color="black", linewidth=0.6)
    ax_bars.set_ylabel("mean change of log pi per token (x 1e-3)")
    ax_bars.set_title("one SGD step: how far each response's tokens move, by weighting", fontsize=10)
    ax_bars.legend(fontsize=7)

    mask, adv = step["mask"], step["advantages"]
    lengths, moved, measured, predicted = sample_over_token(step)
    measured, predicted = measured[moved], predicted[moved]
    colours = ["tab:green" if c else "tab:red" for c in step["correct"][moved].tolist()]
    ax_ratio.scatter(lengths[moved], measured, c=colours, s=12, alpha=0.7, label="measured (green right, red wrong)")
    order = lengths[moved].argsort()
    ax_ratio.plot(lengths[moved][order], predicted[order], color="black", label="first order: mean length / |o_i|")
    ax_ratio.set_yscale("log")
    ax_ratio.set_xlabel("response length |o_i| (tokens)")
    ax_ratio.set_ylabel('change under "sample" / under "token"')
    ax_ratio.set_title("the weighting's own effect, response by response", fontsize=10)
    ax_ratio.legend(fontsize=7)

    # a well-formed wrong answer of 16 or more tokens (a slip or the misconception, not a loop): of
    # these, the one whose most sensitive token is most sensitive (what CSCR acts on)
    text = tokenizer.batch_decode(step["responses"].tolist(), skip_special_tokens=True)
    plain = torch.tensor([bool(re.fullmatch(r"(\d+\+\d=\d+,)*\d+\+\d=\d+>\d+", s)) for s in text])  # well formed
    finished = (step["responses"] == tokenizer.eos_token_id).any(dim=1)
    candidates = moved & ~step["correct"] & finished & plain & (lengths >= 16)
    if not candidates.any():
        candidates = moved if moved.any() else torch.ones_like(moved)
    spread = torch.where(mask, step["sensitivity"], torch.zeros_like(step["sensitivity"])).amax(dim=1)
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
    ax_tokens.set_title(f"change of log pi along one {outcome} response (A = {float(adv[row]):+.2f}); red tokens: "
                        f"CSCR weight < 1 (downweighted: among the response's most sensitive)", fontsize=10)
    ax_tokens.set_ylabel("change of log pi (x 1e-3)")
    ax_tokens.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -----------------------------------------------------------------------------
# 3. where does CSCR move credit? The diagnosis and the credit picture, on the starting policy

CLASSES = ("answer digit", "intermediate digit", "operator", "format")


def token_classes(tokenizer, responses: torch.Tensor) -> torch.Tensor:
    """(n, T) class index: digits after '>' are the answer, other digits intermediate, '+' '=' operators."""
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
    do the two assertions push each token class the same way, and what weight does CSCR give it?
    Returns (diagnosis dict, data for the credit picture)."""
    tt.seed_everything(args.warmup_seed + DIAGNOSIS_STREAM)
    responses, mask, texts, complete = tt.generate(model, tokenizer, args, problems, args.group_size, False, device)
    flat = [t for t in problems for _ in range(args.group_size)]
    (logp, logits), (logp_pos, _), (logp_neg, _) = tt.score(model, tokenizer, args, flat, responses, mask,
                                                            ("", args.cond_pos, args.cond_neg), need_logits=True)
    d_pos, d_neg = tc.counterfactual_shifts(logp, logp_pos, logp_neg, mask)
    sensitivity = tc.counterfactual_sensitivity(d_pos, d_neg)
    classes = token_classes(tokenizer, responses).to(device)
    correct = tt.verify_all(flat, texts, complete).to(device)
    weights = tc.cscr_weights(sensitivity, mask, strength, args.cscr_threshold)
    entropy = tc.token_entropy(logits)  # (N, T): the other bet on which tokens matter
    keep = tc.high_entropy_mask(entropy, mask, ENTROPY_TOP).bool()
    sensitive = tc.high_entropy_mask(sensitivity, mask, ENTROPY_TOP).bool()  # the top 20 % by sensitivity
    correlation = torch.corrcoef(torch.stack([entropy[mask], sensitivity[mask]]))[0, 1]  # over real tokens
    result = dict(all=tc.shift_diagnostics(d_pos, d_neg, mask), by_class={}, by_outcome={},
                  strength=strength, responses=len(flat), entropy_sensitivity_correlation=float(correlation),
                  top_entropy_also_top_sensitivity=float((keep & sensitive).sum() / keep.sum().clamp(min=1)))
    for k, name in enumerate(CLASSES):
        in_class = mask & (classes == k)
        entry = tc.shift_diagnostics(d_pos, d_neg, in_class)
        mean_in = lambda x: float(x[in_class].float().mean()) if in_class.any() else float("nan")  # noqa: E731
        entry.update(mean_cscr_weight=mean_in(weights), mean_entropy=mean_in(entropy), top_entropy=mean_in(keep))
        result["by_class"][name] = entry
    for name, rows in (("correct", correct), ("wrong", ~correct)):
        result["by_outcome"][name] = tc.shift_diagnostics(d_pos, d_neg, mask & rows[:, None])
    picture = dict(responses=responses.cpu(), mask=mask.cpu(), weights=weights.cpu(), correct=correct.cpu(),
                   sensitivity=sensitivity.cpu())
    return result, picture


def report_diagnosis(model, tokenizer, args, problems, strength: float, device, out_dir: str) -> dict:
    """On the first 32 held-out prompts: prints the table, draws credit.png, returns the diagnosis."""
    diagnosis, picture = diagnose(model, tokenizer, args, problems[:32], strength, device)
    print("\n" + format_diagnosis(diagnosis))
    plot_credit(picture, tokenizer, strength, os.path.join(out_dir, "credit.png"))
    return diagnosis


def format_diagnosis(diag: dict) -> str:
    a = diag["all"]
    lines = [f"CSCR diagnosis on the starting policy ({diag['responses']} sampled responses, "
             f"{a['num_tokens']} tokens): same direction {a['same_direction']:.3f}, sign reversal "
             f"{a['sign_reversal']:.3f}, mean |d+| {a['mean_abs_pos']:.3f}, mean |d-| {a['mean_abs_neg']:.3f}",
             f"entropy against sensitivity: correlation {diag['entropy_sensitivity_correlation']:.3f} over tokens; "
             f"{diag['top_entropy_also_top_sensitivity']:.3f} of the top {ENTROPY_TOP:.0%} by entropy are also in the "
             f"top {ENTROPY_TOP:.0%} by sensitivity",
             f"| token class | tokens | same direction | sign reversal | mean sensitivity | mean CSCR weight | "
             f"mean entropy | in the top {ENTROPY_TOP:.0%} by entropy |",
             "|---|---|---|---|---|---|---|---|"]
    for name, e in diag["by_class"].items():
        lines.append(f"| {name} | {e['num_tokens']} | {e['same_direction']:.3f} | {e['sign_reversal']:.3f} | "
                     f"{e['mean_sensitivity']:.3f} | {e['mean_cscr_weight']:.3f} | {e['mean_entropy']:.3f} | "
                     f"{e['top_entropy']:.3f} |")
    return "\n".join(lines)


def plot_credit(picture: dict, tokenizer, strength: float, path: str) -> None:
    """credit.png: each token of a short and a long sampled response, shaded by its share of the loss
    weight under "sample", "token" and CSCR (the credit is that share times A)."""
    plt = pyplot()
    mask, responses, weights = picture["mask"], picture["responses"], picture["weights"]
    N = mask.shape[0]
    lengths = mask.sum(dim=1)
    # the shortest and the longest correct response of the batch (any response if fewer than two are correct)
    candidates = picture["correct"] if int(picture["correct"].sum()) >= 2 else torch.ones(N, dtype=torch.bool)
    rows = [int(lengths.masked_fill(~candidates, 10 ** 9).argmin()), int(lengths.masked_fill(~candidates, -1).argmax())]
    shares = {
        '"sample" (GRPO)': tc.token_weights(mask, "sample"),
        '"token" (DAPO / verl / TRL)': tc.token_weights(mask, "token"),
        f'CSCR, strength {strength:g} (on "sample")': tc.token_weights(mask, "sample") * weights,
    }
    vmax = max(float(w[rows].max()) for w in shares.values())
    width = int(lengths.max())
    fig, axes = plt.subplots(len(rows) * len(shares), 1, figsize=(max(8, 0.32 * width + 2), 0.75 * len(rows) *
                                                                len(shares) + 1.2))
    cmap = plt.get_cmap("Blues")
    panel = 0
    for row in rows:
        tokens = token_labels(tokenizer, responses[row, : int(lengths[row])])
        for name, w in shares.items():
            ax = axes[panel]
            panel += 1
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
            ax.set_title(f"{len(tokens)}-token response: {float(values.sum()) * 100:.2f}% of the loss weight "
                         f"(batch of {N})", fontsize=8, loc="left", pad=2)
    fig.suptitle("Share of the loss weight each token receives (darker = more; its credit is this share x A)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
