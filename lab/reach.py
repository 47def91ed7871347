"""0. Is the right answer within reach of sampling? pass@1 and pass@G of the starting policy, and
how much the lengths of one prompt's answers differ."""

from typing import Dict

import torch

import tiny_task
import train_tiny as tt

PASS_AT_G_STREAM = 4  # the lab's random stream for it, an offset from --warmup-seed


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
