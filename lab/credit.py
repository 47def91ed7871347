"""3. Where does CSCR move credit, and does the entropy mask pick the same tokens? The diagnosis
on the starting policy, by token class, and the credit picture (credit.png)."""

import os

import torch

import tiny_task
import train_tiny as tt
from lab import plots

DIAGNOSIS_STREAM = 1  # the lab's random stream for it, an offset from --warmup-seed
ENTROPY_TOP = 0.2  # the fraction of a batch's tokens the entropy mask keeps, as in the 80/20 paper
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
def diagnose(model, tokenizer, args, tc, problems, strength: float, device):
    """Sample G responses per problem from the starting policy and score them under c+ and c-:
    do the two assertions push each token class the same way, and what weight does CSCR give
    it (tc: the run's tokencredit)? Returns (diagnosis dict, data for the credit picture)."""
    tiny_task.seed_everything(args.warmup_seed + DIAGNOSIS_STREAM)
    r = tt.rollout(model, tokenizer, args, problems, args.group_size, False, device)
    mask = r.mask
    (logp, logits), (logp_pos, _), (logp_neg, _) = tiny_task.score(
        model, tokenizer, r.problems, r.responses, mask, args.temperature,
        ("", args.cond_pos, args.cond_neg), need_logits=True)
    d_pos, d_neg = tc.counterfactual_shifts(logp, logp_pos, logp_neg, mask)
    sensitivity = tc.counterfactual_sensitivity(d_pos, d_neg)
    classes = token_classes(tokenizer, r.responses).to(device)
    correct = r.correct.to(device)
    weights = tc.cscr_weights(sensitivity, mask, strength, args.cscr_threshold)
    entropy = tc.token_entropy(logits)  # (N, T): the other bet on which tokens matter
    keep = tc.high_entropy_mask(entropy, mask, ENTROPY_TOP).bool()
    sensitive = tc.high_entropy_mask(sensitivity, mask, ENTROPY_TOP).bool()  # top 20 % by s
    correlation = torch.corrcoef(torch.stack([entropy[mask], sensitivity[mask]]))[0, 1]
    result = dict(all=tc.shift_diagnostics(d_pos, d_neg, mask), by_class={}, by_outcome={},
                  strength=strength, responses=len(r.problems),
                  entropy_sensitivity_correlation=float(correlation),
                  top_entropy_also_top_sensitivity=float((keep & sensitive).sum()
                                                         / keep.sum().clamp(min=1)))
    for k, name in enumerate(CLASSES):
        in_class = mask & (classes == k)
        entry = tc.shift_diagnostics(d_pos, d_neg, in_class)

        def mean_in(x):
            return float(x[in_class].float().mean()) if in_class.any() else float("nan")
        entry.update(mean_cscr_weight=mean_in(weights), mean_entropy=mean_in(entropy),
                     top_entropy=mean_in(keep))
        result["by_class"][name] = entry
    for name, rows in (("correct", correct), ("wrong", ~correct)):
        result["by_outcome"][name] = tc.shift_diagnostics(d_pos, d_neg, mask & rows[:, None])
    picture = dict(responses=r.responses.cpu(), mask=mask.cpu(), weights=weights.cpu(),
                   correct=correct.cpu(), sensitivity=sensitivity.cpu())
    return result, picture


def report_diagnosis(model, tokenizer, args, tc, problems, strength: float, device,
                     out_dir) -> dict:
    """On the first 32 held-out prompts: prints the table, draws credit.png."""
    diagnosis, picture = diagnose(model, tokenizer, args, tc, problems[:32], strength, device)
    diagnosis["credit_png"] = plots.plot_credit(picture, tokenizer, tc, strength,
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
