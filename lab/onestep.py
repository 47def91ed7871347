"""2. What does one step do under each weighting? One plain SGD step from the starting policy per
weighting, each token's change of log-probability measured exactly, its table and onestep.png."""

import os

import torch

import tiny_task
import train_tiny as tt
from lab import plots
from lab.credit import ENTROPY_TOP

ONE_STEP_STREAM = 3  # the lab's random stream for it, an offset from --warmup-seed

LENGTH_BUCKETS = (("short (<= 15 tokens)", 0, 15), ("medium (16-29)", 16, 29),
                  ("long (>= 30)", 30, 10 ** 9))


def one_step(model, tokenizer, args, tc, problems, strength: float, lr: float, device) -> dict:
    """One rollout batch from the starting policy; from the same weights and the same GRPO
    advantages, one plain SGD step (theta -= lr * grad) per weighting, and each token's change
    Delta_{i,t} = log pi_new(o_t) - log pi_old(o_t).

    SGD, not Adam, so that the raw gradient acts; lr small, so that the step is first order
    ("sample, lr/2" checks it). On-policy the gradient w.r.t. logp_{i,t} is -w_{i,t} A_{i,t}, so
    Delta is that credit times how much log pi(o_t) responds to the parameters, summed over every
    token's push. tc: the tokencredit module the run uses. Returns Delta (N, T) keyed by
    weighting, and the batch it was measured on.
    """
    tiny_task.seed_everything(args.warmup_seed + ONE_STEP_STREAM)
    r = tt.rollout(model, tokenizer, args, problems, args.group_size, False, device)
    correct, mask, G = r.correct.to(device), r.mask, args.group_size  # (N,), (N, T)
    rewards = torch.where(correct, args.reward_correct, args.reward_wrong).float().view(-1, G)
    advantages = tc.group_advantages(rewards, scale="std").flatten().to(device)  # (N,)
    with torch.no_grad():
        (logp, logits), (logp_pos, _), (logp_neg, _) = tiny_task.score(
            model, tokenizer, r.problems, r.responses, mask, args.temperature,
            ("", args.cond_pos, args.cond_neg), need_logits=True)
    sensitivity = tc.counterfactual_sensitivity(*tc.counterfactual_shifts(logp, logp_pos,
                                                                          logp_neg, mask))
    cscr = tc.cscr_weights(sensitivity, mask, strength, args.cscr_threshold)  # (N, T)
    keep = tc.high_entropy_mask(tc.token_entropy(logits), mask, ENTROPY_TOP)  # (N, T)
    settings = [(mode, mode, advantages, lr, "token") for mode in tc.AGGREGATION_MODES]
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
        (before, _), = tiny_task.score(model, tokenizer, r.problems, r.responses, mask,
                                       args.temperature)
        loss, _ = tc.policy_loss(before, before.detach(), token_adv, mask, mode=mode,
                                 group_size=G, max_len=args.max_new_tokens,
                                 ratio_level=ratio_level)
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= step_lr * p.grad  # plain SGD
            (after, _), = tiny_task.score(model, tokenizer, r.problems, r.responses, mask,
                                          args.temperature)
        delta[name] = torch.where(mask, after - before.detach(), 0.0).cpu()  # (N, T)
    model.load_state_dict(start)
    model.zero_grad(set_to_none=True)
    return dict(delta=delta, mask=mask.cpu(), correct=correct.cpu(), advantages=advantages.cpu(),
                responses=r.responses.cpu(), cscr_weights=cscr.cpu(),
                sensitivity=sensitivity.cpu(), strength=strength, lr=lr)


def report_one_step(model, tokenizer, args, tc, problems, strength: float, lr: float, device,
                    out_dir) -> dict:
    """On the first prompts_per_step held-out prompts: prints the table, draws onestep.png."""
    step = one_step(model, tokenizer, args, tc, problems[:args.prompts_per_step], strength, lr,
                    device)
    table = one_step_table(step)
    print("\n" + format_one_step(table))
    plots.plot_one_step(step, table, sample_over_token(step), tokenizer,
                        os.path.join(out_dir, "onestep.png"))
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
