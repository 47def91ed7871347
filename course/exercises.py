"""The course's data, in one place: the exercises and their points (docs/course.md, "Points"),
the sets, and selfcheck's plants. Nothing else in course/ names a tokencredit function, so a change
to tokencredit.py's functions is a change here only.
"""

EXERCISES = {  # k: (title, {function: points}), in the README's order
    1: ("advantages", {"group_advantages": 7, "overlong_penalty": 3}),
    2: ("dynamic sampling", {"informative_groups": 3, "fill_batch": 7}),
    3: ("surrogate and clip", {"_policy_gradient_surrogate": 2, "_importance_ratio": 3,
                               "_clipped_surrogate": 5}),
    4: ("KL", {"_kl_k3": 10}),
    5: ("aggregation", {"_loss_denominators": 3, "token_weights": 2, "_aggregate": 2,
                        "policy_loss": 3}),
    6: ("GSPO", {"_sequence_ratio": 10}),
    7: ("CSCR", {"counterfactual_shifts": 3, "_counterfactual_sensitivity": 2,
                 "cscr_weights": 5}),
    8: ("entropy mask", {"high_entropy_mask": 10}),
}
SETS = {"grpo": (1, 3, 5), "dapo": (1, 2, 3, 5), "cscr": (1, 3, 5, 7), "all": tuple(EXERCISES)}

# selfcheck's plants, edits of tokencredit.py: (exercise, what, ((text, replaced by), ...)).
# They quote the reference, so neither a handout nor a Gradescope bundle carries them.
MISTAKES = (
    (1, "sign flip", (("centred = rewards - rewards.mean(dim=1, keepdim=True)",
                       "centred = rewards.mean(dim=1, keepdim=True) - rewards"),)),
    (1, "population std", (("rewards.std(dim=1, keepdim=True)",
                            "rewards.std(dim=1, keepdim=True, correction=0)"),)),
    (1, "RLOO without G / (G - 1)", (("centred = centred * (G / (G - 1))", "centred = centred"),)),
    (2, "keeps the surplus", (("keep.nonzero().squeeze(1)[: batch_size - n_kept]",
                               "keep.nonzero().squeeze(1)"),)),
    (3, "clip bounds swapped", (("torch.clamp(ratio, 1 - eps_low, 1 + eps_high)",
                                 "torch.clamp(ratio, 1 - eps_high, 1 + eps_low)"),)),
    (4, "k1 instead of k3", (("return torch.expm1(log_ratio) - log_ratio",
                              "return -log_ratio"),)),
    (5, '"sample" without N', (("return N * lengths.clamp(min=1)",
                                "return lengths.clamp(min=1)"),)),
    (5, "KL subtracted", (("per_token = per_token + beta * kl",
                           "per_token = per_token - beta * kl"),)),
    (6, "GSPO sum, not mean", (("log_s = log_ratio.sum(dim=-1, keepdim=True) / lengths",
                                "log_s = log_ratio.sum(dim=-1, keepdim=True)"),)),
    (7, "CSCR without renormalisation", (
        ("weights = lengths * w / w.sum(dim=-1, keepdim=True)",
         "weights = torch.exp(-strength * torch.clamp(sensitivity.float() - threshold, min=0))"),)),
    (7, "sensitivity without abs", (("torch.maximum(d_pos.abs(), d_neg.abs())",
                                     "torch.maximum(d_pos, d_neg)"),)),
    (8, "keeps the lowest entropies", (("_quantile(real, 1 - top_fraction)",
                                        "_quantile(real, top_fraction)"),)),
    (2, "informative_groups as std > 0", (("return (values != values[:, :1]).any(dim=1)",
                                           "return values.float().std(dim=1) > 0"),)),
    (4, "k3 clamped at 10", (("return torch.expm1(log_ratio) - log_ratio",
                              "return torch.clamp(torch.expm1(log_ratio) - log_ratio, max=10)"),)),
    (6, "sequence_ratio in the input dtype", (
        ("dtype = torch.promote_types(logp.dtype, torch.float32)", "dtype = logp.dtype"),)),
    (8, "high_entropy_mask returning bool", (
        ("return (mask & (entropy.float() >= threshold)).float()",
         "return mask & (entropy.float() >= threshold)"),)),
    (8, "the threshold over padding too", (("real = entropy[mask].float()",
                                            "real = entropy.flatten().float()"),)),
    (2, "groups_informative counting the kept only", (
        ("n_informative += int(keep.sum())\n        take = keep.nonzero().squeeze(1)[: batch_size "
         "- n_kept]  # drop the surplus", "take = keep.nonzero().squeeze(1)[: batch_size - n_kept]"
         "\n        n_informative += take.numel()"),)),
    (7, "cscr_weights without the padding mask", (
        ('    log_w = log_w.masked_fill(~mask, float("-inf"))\n', ""),)),
)
CORRECT = (  # other correct solutions, each at full marks: (exercise, what, edits)
    (1, "a module-level constant", (
        ('SURROGATES = ("clip", "reinforce")\n',
         'SURROGATES = ("clip", "reinforce")\nOVERLONG_FLOOR = -1.0  # the penalty past max_len\n'),
        ("torch.full_like(lengths, -1.0)", "torch.full_like(lengths, OVERLONG_FLOOR)"))),
    (6, "a @torch.no_grad() helper for the stop-gradient", (
        ("def sequence_ratio(", "@torch.no_grad()\ndef _constant(x):\n    return x.clone()\n\n\n"
         "def sequence_ratio("),
        ("log_ratio = torch.where(mask, logp - old_logp.detach(), 0.0).to(dtype)",
         "log_ratio = torch.where(mask, logp - _constant(old_logp), 0.0).to(dtype)"),
        ("log_s = torch.where(mask, logp - logp.detach(), 0.0) + log_s.detach()",
         "log_s = torch.where(mask, logp - _constant(logp), 0.0) + _constant(log_s)"))),
    (1, "a constant built by a module-level for", (
        ('SURROGATES = ("clip", "reinforce")\n',
         'SURROGATES = ("clip", "reinforce")\n_FLOORS = []\nfor _x in (-1.0,):\n'
         '    _FLOORS.append(_x)\n'),
        ("torch.full_like(lengths, -1.0)", "torch.full_like(lengths, _FLOORS[0])"))),
    (4, "kl_k3 picked by a module-level if", (
        ("def kl_k3(", "if hasattr(torch, 'expm1'):\n    def _k3(x):\n"
         "        return torch.expm1(x) - x\nelse:\n    def _k3(x):\n"
         "        return torch.exp(x) - 1 - x\n\n\ndef kl_k3("),
        ("return torch.expm1(log_ratio) - log_ratio", "return _k3(log_ratio)"))),
)
ENDLESS = (2, "an endless loop in fill_batch", (
    ("while n_kept < batch_size and rounds < max_rounds:", "while True:"),))

EXERCISE_OF = {name: k for k, (_, points) in EXERCISES.items() for name in points}


def names(k) -> tuple:
    """The functions of exercise k, in the table's order."""
    return tuple(EXERCISES[k][1])


def points(k) -> float:
    """Exercise k's points: the sum of its functions'."""
    return sum(EXERCISES[k][1].values())
