"""tokencredit: how RLVR hands the credit of one verified answer to its tokens.

Every method here makes two choices for each token o_{i,t} of response i: an advantage A_{i,t}
(how good the answer was, and how much of that this token earned) and a weight w_{i,t} (how much
this token counts in the batch's loss). On-policy, the gradient of the loss with respect to
log pi(o_{i,t}) is -w_{i,t} A_{i,t} (plus the KL term's when beta > 0); the rest is bookkeeping.

One pure function per idea, in the order the data flows through a training step:
    1. advantages        overlong_penalty, group_advantages
    2. dynamic sampling  informative_groups, fill_batch
    3. surrogate         token_logprobs, policy_gradient_surrogate, importance_ratio,
                         sequence_ratio, clipped_surrogate, kl_k3
    4. aggregation       loss_denominators, token_weights, aggregate, policy_loss,
                         self_distillation_loss
    5. token credit      counterfactual_shifts, counterfactual_sensitivity, cscr_weights,
                         token_entropy, high_entropy_mask, token_advantages
    6. diagnostics       shift_diagnostics
Each public function is: docstring, input checks (the _check_* helpers at the bottom), the math.
Nothing here needs a model or a tokenizer.

References
[1] GRPO: Shao et al., "DeepSeekMath", arXiv 2402.03300.
[2] Dr. GRPO: Liu et al., "Understanding R1-Zero-Like Training", arXiv 2503.20783.
[3] DAPO: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    arXiv 2503.14476.
[4] CSCR: "Not All Tokens Deserve Equal Credit", known to us only from a Hugging Face Daily
    Papers summary (which gives no arXiv id and no authors). The sensitivity, weighting and
    renormalisation here are OUR READING, every choice a parameter.
[5] PPO: Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347.
[6] k3: J. Schulman, "Approximating KL Divergence", blog post, 2020.
[7] GSPO: Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071.
[8] RLOO: Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization",
    arXiv 2402.14740.
[9] Wang et al., "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RLVR",
    arXiv 2506.01939.

Shapes: B prompts, G responses per prompt (a group), N = B * G responses (row n is in group
n // G), T response tokens (padded), V vocabulary; mask (N, T) is 1 on real response tokens,
|o_i| = mask[i].sum().
"""

import math
from typing import Callable, Dict, Optional, Tuple

import torch

AGGREGATION_MODES = ("sample", "token", "group_token", "constant")
ADVANTAGE_SCALES = ("std", "batch", "none")
BASELINES = ("mean", "leave_one_out")
RATIO_LEVELS = ("token", "sequence", "sequence_token")
SURROGATES = ("clip", "reinforce")


# -----------------------------------------------------------------------------
# 1. rewards and group-relative advantages (GRPO [1], Dr. GRPO [2], DAPO [3], RLOO [8])

def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment [3], added to the reward: a ramp, not a cliff.

    R(|o|) = 0                                        if |o| <= max_len - cache_len
           = ((max_len - cache_len) - |o|) / cache_len  if max_len - cache_len < |o| <= max_len
           = -1                                       if |o| > max_len
    Args: lengths (N,); max_len the budget L_max; cache_len the soft zone, 0 < cache_len <= max_len.
    Returns: penalty (N,) float in [-1, 0].
    """
    _check_tensor(lengths, "lengths", 1, "(N,)")
    _check_int(max_len, "max_len", "a positive int", lambda v: v > 0)
    _check_int(cache_len, "cache_len", f"an int in (0, max_len = {max_len}]",
               lambda v: 0 < v <= max_len)
    _check_values(lengths, "lengths", "finite and >= 0", lambda x: torch.isfinite(x) & (x >= 0))
    lengths = lengths.to(torch.float32)  # (N,)
    soft_start = max_len - cache_len
    ramp = (soft_start - lengths) / cache_len  # (N,) in [-1, 0) inside the soft zone
    penalty = torch.where(lengths <= soft_start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_len, torch.full_like(lengths, -1.0), penalty)


def group_advantages(rewards: torch.Tensor, scale: str = "std", eps: float = 1e-6,
                     baseline: str = "mean") -> torch.Tensor:
    """Group-relative advantage of each response, A_i = (r_i - b_i) / s.

    baseline "mean" (GRPO [1]): b_i = mean_j r_j, which holds r_i: with s = 1 the expected
             gradient is (G-1)/G of REINFORCE's; "leave_one_out" (RLOO [8]):
             b_i = mean_{j != i} r_j keeps it exactly
    scale    "std" (GRPO): s = std_j r_j + eps (Bessel, eps outside the sqrt); "batch": s = std of
             all B*G rewards + eps; "none" (Dr. GRPO [2]): s = 1. s depends on r_i too: no
             baseline, and with it neither version keeps the expected gradient exactly.
    A group whose rewards are all equal gets exactly 0, and so does G = 1.
    Args: rewards (B, G) finite. Returns: advantages (B, G), given to every token of the response.
    """
    _check_tensor(rewards, "rewards", 2, "(B, G)")
    _check_choice(scale, "scale", ADVANTAGE_SCALES)
    _check_choice(baseline, "baseline", BASELINES)
    _check_number(eps, "eps", "> 0", lambda v: v > 0)
    _check_values(rewards, "rewards", "finite", torch.isfinite)
    rewards = rewards if rewards.is_floating_point() else rewards.to(torch.float32)
    G = rewards.shape[1]
    if G == 1:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (B, G) r_i - mean
    if baseline == "leave_one_out":
        centred = centred * (G / (G - 1))  # (B, G) r_i - mean_{j != i} r_j
    if scale == "std":
        centred = centred / (rewards.std(dim=1, keepdim=True) + eps)  # (B, G)
    elif scale == "batch":
        centred = centred / (rewards.std() + eps)  # (B, G)
    # a mean of equal floats need not round back to them exactly: force the 0
    all_equal = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)  # (B, 1)
    return torch.where(all_equal, torch.zeros_like(centred), centred)


# -----------------------------------------------------------------------------
# 2. dynamic sampling (DAPO [3])

def informative_groups(values: torch.Tensor) -> torch.Tensor:
    """True where a group's values are not all equal (0 < #correct < G): its advantages are not 0.

    Args: values (B, G) finite; bool reads as 0/1. Returns: keep (B,) bool.
    """
    _check_tensor(values, "values", 2, "(B, G)")
    _check_values(values, "values", "finite", lambda x: torch.isfinite(x.float()))
    return (values != values[:, :1]).any(dim=1)  # (B,)


def fill_batch(sample_groups: Callable[[], Dict[str, torch.Tensor]], batch_size: int,
               max_rounds: int, filter_key: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, int]]:
    """DAPO's dynamic sampling: sample rounds of groups, keep the informative ones.

    sample_groups() returns a dict of tensors sharing a leading dimension (that round's groups).
    A group is kept where informative_groups(groups[filter_key]), in the order sampled; the surplus
    beyond batch_size is dropped. After max_rounds calls it returns what it has, maybe fewer, maybe
    none (then each tensor has 0 groups and the last round's other dimensions). DAPO keeps
    0 < #correct < G: filter on the verdicts ("correct"), not a shaped reward.
    Returns: (batch, stats): rounds (calls made), groups_seen (groups sampled), groups_informative
    (of those, the informative, surplus included), groups_kept (in batch), full (1 if batch_size).
    """
    _check_int(batch_size, "batch_size", "a positive int", lambda v: v > 0)
    _check_int(max_rounds, "max_rounds", "a positive int", lambda v: v > 0)
    kept, n_kept, n_seen, n_informative, rounds, first = [], 0, 0, 0, 0, None
    while n_kept < batch_size and rounds < max_rounds:
        groups = sample_groups()
        rounds += 1
        first = _check_round(groups, filter_key, first)
        keep = informative_groups(groups[filter_key])  # (b,)
        n_seen += keep.shape[0]
        n_informative += int(keep.sum())
        take = keep.nonzero().squeeze(1)[: batch_size - n_kept]  # drop the surplus
        if take.numel() > 0:
            kept.append({key: value[take] for key, value in groups.items()})
            n_kept += take.numel()
    if kept:
        batch = {key: torch.cat([part[key] for part in kept], dim=0) for key in kept[0]}
    else:  # nothing informative: empty tensors with the last round's trailing shapes
        batch = {key: value[:0] for key, value in groups.items()}
    stats = dict(rounds=rounds, groups_seen=n_seen, groups_informative=n_informative,
                 groups_kept=n_kept, full=int(n_kept == batch_size))
    return batch, stats


# -----------------------------------------------------------------------------
# 3. the per-token surrogate: REINFORCE, the ratio, the clip (PPO [5], GSPO [7]), KL (k3 [6])

def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log pi(o_t | q, o_<t) of the sampled tokens, logits[t, o_t] - logsumexp_v logits[t, v].

    In float32 whatever the logits' dtype (bf16 would lose the small changes the clip looks at).
    Args: logits (N, T, V); targets (N, T) token ids in [0, V). Returns: logp (N, T).
    """
    _check_tensor(logits, "logits", 3, "(N, T, V)")
    _check_token_ids(targets, logits)
    logits = logits.float()
    picked = logits.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (N, T)
    return picked - torch.logsumexp(logits, dim=-1)  # (N, T)


def policy_gradient_surrogate(logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """REINFORCE's per-token loss, loss_t = -A_t log pi(o_t | q, o_<t), whose gradient is -A_t.

    A may be the raw reward (REINFORCE), a baselined advantage (GRPO) or per token (CSCR). The
    gradient ignores which policy sampled o_t, so it is right only on-policy. The advantages are
    constants of the loss (no gradient is meant for them): pass them detached, as policy_loss does.
    Args: logp (N, T); advantages (N,) or (N, T). Returns: loss (N, T), not yet aggregated.
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    advantages = _check_advantages(advantages, logp, "logp")  # (N, T)
    return -advantages * logp  # (N, T)


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                     level: str = "token") -> torch.Tensor:
    """pi_theta / pi_old, per token (PPO, GRPO) or per sequence (GSPO [7]); exactly 1 on padding.

    "token": rho_{i,t} = exp(logp_{i,t} - old_logp_{i,t}); "sequence" and "sequence_token":
    sequence_ratio's s_i on every token of response i.
    Args: logp, old_logp (a constant: no gradient flows into it), mask (N, T).
    Returns: ratio (N, T).
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    _check_same_shape(old_logp, "old_logp", logp, "logp", "(N, T)")
    mask = _check_mask(mask, logp, "logp")
    _check_choice(level, "level", RATIO_LEVELS)
    if level != "token":
        return sequence_ratio(logp, old_logp, mask, per_token=level == "sequence_token")
    return torch.exp(torch.where(mask, logp - old_logp.detach(), 0.0))  # (N, T), 1 on padding


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                   per_token: bool = False) -> torch.Tensor:
    """GSPO's sequence-level ratio [7], the geometric mean of a response's token ratios.

    s_i = exp(1/|o_i| sum_t (logp_{i,t} - old_logp_{i,t})), on every token of response i, so
    d s_i / d logp_{i,t} = s_i / |o_i|. per_token (GSPO-token): sg[s_i] * pi_{i,t} / sg[pi_{i,t}],
    the same value with d / d logp_{i,t} = s_i, for per-token advantages.
    Args: logp, old_logp (a constant), mask (N, T). Returns: ratio (N, T), 1 on padding, in at
    least float32 (bf16 cannot resolve GSPO's 3e-4 over 1000 tokens).
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    _check_same_shape(old_logp, "old_logp", logp, "logp", "(N, T)")
    mask = _check_mask(mask, logp, "logp")
    dtype = torch.promote_types(logp.dtype, torch.float32)
    log_ratio = torch.where(mask, logp - old_logp.detach(), 0.0).to(dtype)  # (N, T)
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1).to(dtype)  # (N, 1) |o_i|
    log_s = log_ratio.sum(dim=-1, keepdim=True) / lengths  # (N, 1) log s_i
    if per_token:
        log_s = torch.where(mask, logp - logp.detach(), 0.0) + log_s.detach()  # (N, T) = log s_i
    return torch.where(mask, torch.exp(log_s), logp.new_ones((), dtype=dtype))  # (N, T)


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float = 0.2,
                      eps_high: float = 0.2) -> torch.Tensor:
    """PPO-clip's per-token loss [5]: -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t).

    At rho = 1 its gradient is REINFORCE's; once rho leaves the range in the direction A pushes,
    0. GRPO uses one eps; eps_high > eps_low is DAPO's Clip-Higher [3]. eps_low >= 1 switches the
    lower clip off (a ratio is > 0), a large eps_high the upper one.
    Args: ratio (N, T) from importance_ratio; advantages (N,) or (N, T). Returns: loss (N, T).
    """
    _check_tensor(ratio, "ratio", 2, "(N, T)")
    _check_number(eps_low, "eps_low", ">= 0", lambda v: v >= 0, finite=False)
    _check_number(eps_high, "eps_high", ">= 0", lambda v: v >= 0, finite=False)
    A = _check_advantages(advantages, ratio, "ratio")  # (N, T); A_i on every token when (N,)
    unclipped = ratio * A  # (N, T)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * A  # (N, T)
    return -torch.minimum(unclipped, clipped)  # (N, T)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator [6] of KL(pi_theta || pi_ref): KL_t = r - log r - 1, r = pi_ref / pi_theta.

    Unbiased for o_t drawn from pi_theta (GRPO samples from pi_old) and never negative; its lower
    variance is an empirical finding for nearby policies, not a guarantee. As a loss its gradient
    is (1 - r) d log pi_theta, whose expectation is the gradient of KL(pi_ref || pi_theta).
    Args: logp, ref_logp (N, T). Returns: kl (N, T) >= 0.
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    _check_same_shape(ref_logp, "ref_logp", logp, "logp", "(N, T)")
    log_ratio = ref_logp - logp  # (N, T) log r
    return torch.expm1(log_ratio) - log_ratio  # r - 1 - log r, exact near r = 1


# -----------------------------------------------------------------------------
# 4. aggregation: who gets credit for a long answer (GRPO [1], Dr. GRPO [2], DAPO [3])

def loss_denominators(mask: torch.Tensor, mode: str, group_size: Optional[int] = None,
                      max_len: Optional[float] = None,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """d_i in w_{i,t} = mask_{i,t} / d_i: the one place where the methods' aggregations differ.

    "sample"      GRPO [1]             d_i = N * |o_i|                   mean per response, then
                                                                        over responses
    "token"       verl, TRL "dapo"     d_i = sum_{j in batch} |o_j|        one mean over the tokens
    "group_token" DAPO [3] as printed  d_i = B * sum_{j in group(i)} |o_j| token mean per prompt,
                                                                        then over prompts
    "constant"    Dr. GRPO [2]         d_i = N * max_len                  no length at all
    Args: mask (N, T); group_size ("group_token"); max_len, any positive constant ("constant",
    Dr. GRPO's generation budget); dtype a torch float dtype.
    Returns: d (N,) in dtype, at least float32 (bf16 counts 1001 tokens as 1000); a count of 0 is
    clamped to 1, so an empty response (group) gets weight 0, not NaN.
    """
    mask = _check_mask(mask)
    _check_choice(mode, "mode", AGGREGATION_MODES)
    _check_dtype(dtype)
    if mode == "group_token":
        _check_int(group_size, "group_size (mode 'group_token')",
                   f"a positive int dividing N = {mask.shape[0]}",
                   lambda v: v > 0 and mask.shape[0] % v == 0)
    if mode == "constant":
        _check_number(max_len, "max_len (mode 'constant': Dr. GRPO's budget)", "> 0",
                      lambda v: v > 0)
    N = mask.shape[0]
    lengths = mask.sum(dim=-1).to(torch.promote_types(dtype, torch.float32))  # (N,) |o_i|
    if mode == "sample":
        return N * lengths.clamp(min=1)  # (N,)
    if mode == "token":
        num_target_tokens = lengths.sum().clamp(min=1)  # sum over the batch of |o_j|
        return num_target_tokens.expand(N)  # (N,)
    if mode == "group_token":
        B = N // group_size
        group_tokens = lengths.view(B, group_size).sum(dim=1).clamp(min=1)  # (B,) tokens per group
        return B * group_tokens.repeat_interleave(group_size)  # (N,)
    return torch.full_like(lengths, float(N * max_len))  # (N,)


def token_weights(mask: torch.Tensor, mode: str, group_size: Optional[int] = None,
                  max_len: Optional[float] = None) -> torch.Tensor:
    """w_{i,t} = mask_{i,t} / d_i, the weight of each token in loss = sum_{i,t} w_{i,t} loss_{i,t}.

    Args: as loss_denominators. Returns: weights (N, T), 0 on padding. They sum to 1 for
    "token"; for "sample" and "group_token" when no response (group) is empty.
    """
    mask = _check_mask(mask)
    return mask / loss_denominators(mask, mode, group_size, max_len)[:, None]  # (N, T)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str,
              group_size: Optional[int] = None, max_len: Optional[float] = None) -> torch.Tensor:
    """One scalar from a per-token quantity: sum_{i,t} w_{i,t} x_{i,t} = sum_i 1/d_i sum_t x_{i,t}.

    Padding values, even NaN or inf, reach neither the result nor its gradient w.r.t. per_token.
    Args: per_token (N, T), any dtype (integers are averaged as float32); mask (N, T); mode,
    group_size, max_len as in loss_denominators. Returns: a 0-d tensor, float.
    """
    _check_tensor(per_token, "per_token", 2, "(N, T)")
    mask = _check_mask(mask, per_token, "per_token")
    x = per_token if per_token.is_floating_point() else per_token.to(torch.float32)
    denominator = loss_denominators(mask, mode, group_size, max_len, x.dtype)  # (N,) d_i
    real = torch.where(mask, x, 0.0)  # padding -> exactly 0
    return (real.sum(dim=-1) / denominator).sum().to(x.dtype)


def policy_loss(logp: torch.Tensor, old_logp: Optional[torch.Tensor], advantages: torch.Tensor,
                mask: torch.Tensor, mode: str = "sample", eps_low: float = 0.2,
                eps_high: float = 0.2, group_size: Optional[int] = None,
                max_len: Optional[float] = None, ref_logp: Optional[torch.Tensor] = None,
                beta: float = 0.0, surrogate: str = "clip",
                ratio_level: str = "token") -> Tuple[torch.Tensor, Dict[str, float]]:
    """The policy objective, minimised: loss = sum_{i,t} w_{i,t} [surrogate_{i,t} + beta KL_{i,t}].

    surrogate "clip":      clipped_surrogate(importance_ratio(logp, old_logp, mask, level), A)
              "reinforce": policy_gradient_surrogate(logp, A)   (old_logp may be None)
    On-policy (rho = 1) both give d loss / d logp_{i,t} = w_{i,t} (-A_{i,t} + beta (1 - pi_ref/pi)),
    whatever the ratio_level. "sequence" (GSPO) needs advantages (N,). old_logp, ref_logp and the
    advantages are constants (detached).
    Args: logp, old_logp, mask (N, T); advantages (N,) or (N, T); mode, group_size, max_len as in
    loss_denominators; eps_low, eps_high as in clipped_surrogate; ref_logp (N, T) when beta > 0.
    Returns: (loss, stats over real tokens: num_tokens, clip_frac_low (A < 0, rho < 1 - eps_low),
    clip_frac_high (A > 0, rho > 1 + eps_high), ratio_mean (these three with surrogate "clip"),
    kl_mean (only when beta > 0)), the stats Python floats (num_tokens an int). The inputs' values
    are checked and the stats read back in one host-device synchronisation.
    """
    mask, values_check = _check_loss_inputs(logp, old_logp, advantages, mask, ref_logp, beta,
                                            surrogate, ratio_level)
    # padding becomes exactly 0 first: garbage there reaches no value and no gradient
    inputs = _zero_padding(mask, logp, old_logp, advantages, ref_logp if beta > 0 else None)
    logp, old_logp, A, ref_logp = inputs
    ratio = kl = None
    if surrogate == "clip":
        ratio = importance_ratio(logp, old_logp, mask, ratio_level)  # (N, T) rho, or GSPO's s_i
        per_token = clipped_surrogate(ratio, A, eps_low, eps_high)  # (N, T)
    else:
        per_token = policy_gradient_surrogate(logp, A)  # (N, T) REINFORCE: no ratio, no clip
    if beta > 0:
        kl = kl_k3(logp, ref_logp)  # (N, T)
        per_token = per_token + beta * kl  # (N, T)
    loss = aggregate(per_token, mask, mode, group_size, max_len)  # sum_{i,t} w_{i,t} per_token
    return loss, _loss_stats(values_check, inputs, mask, ratio, kl, eps_low, eps_high)


def self_distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                           mask: torch.Tensor, mode: str = "token",
                           group_size: Optional[int] = None,
                           max_len: Optional[float] = None) -> torch.Tensor:
    """On-policy self-distillation (OPSD), CSCR's baseline: sum_{i,t} w_{i,t} KL(p_T || p_S)_t.

    p_T is the teacher (the same model given privileged context; no gradient), p_S the policy.
    KL_t = sum_v p_T(v) (log p_T(v) - log p_S(v)) over the v with p_T(v) > 0, so a -inf logit of
    the teacher (a masked vocabulary) counts as 0. The direction KL(teacher || student) is OUR
    choice; many setups use KL(student || teacher).
    Args: student_logits, teacher_logits (N, T, V); mask; mode etc. as in loss_denominators.
    """
    _check_tensor(student_logits, "student_logits", 3, "(N, T, V)")
    _check_same_shape(teacher_logits, "teacher_logits", student_logits, "student_logits",
                      "(N, T, V)")
    mask = _check_mask(mask, student_logits, "student_logits' first two dimensions")
    _check_distillation_logits(student_logits, teacher_logits, mask)
    real = mask[:, :, None]  # (N, T, 1): padding logits -> 0 before log_softmax
    teacher_logp = torch.log_softmax(torch.where(real, teacher_logits.detach(), 0.0).float(), -1)
    student_logp = torch.log_softmax(torch.where(real, student_logits, 0.0).float(), -1)
    p_teacher = teacher_logp.exp()  # (N, T, V)
    terms = torch.where(p_teacher > 0, p_teacher * (teacher_logp - student_logp), 0.0)  # (N, T, V)
    return aggregate(terms.sum(dim=-1), mask, mode, group_size, max_len)


# -----------------------------------------------------------------------------
# 5. which tokens carry the credit: CSCR [4] (our reading) and the high-entropy mask [9]

def counterfactual_shifts(logp: torch.Tensor, logp_pos: torch.Tensor, logp_neg: torch.Tensor,
                          mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """How each sampled token's log-prob moves when an outcome is asserted before the prompt [4].

    d+_t = log pi(o_t | c+, q, o_<t) - log pi(o_t | q, o_<t)     (c+ asserts "correct")
    d-_t = log pi(o_t | c-, q, o_<t) - log pi(o_t | q, o_<t)     (c- asserts "incorrect")
    Args: logp, logp_pos, logp_neg (N, T), one trajectory scored three ways; mask (N, T).
    Returns: (d_pos, d_neg), each (N, T), 0 on padding.
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    _check_same_shape(logp_pos, "logp_pos", logp, "logp", "(N, T)")
    _check_same_shape(logp_neg, "logp_neg", logp, "logp", "(N, T)")
    mask = _check_mask(mask, logp, "logp")
    return torch.where(mask, logp_pos - logp, 0.0), torch.where(mask, logp_neg - logp, 0.0)


def counterfactual_sensitivity(d_pos: torch.Tensor, d_neg: torch.Tensor) -> torch.Tensor:
    """s_t = max(|d+_t|, |d-_t|): OUR reading of CSCR's token sensitivity.

    It scores a token both assertions push the same way (not about the outcome) as it scores one
    they push apart; shift_diagnostics splits the two parts. Returns: (N, T) >= 0.
    """
    _check_tensor(d_pos, "d_pos", 2, "(N, T)")
    _check_same_shape(d_neg, "d_neg", d_pos, "d_pos", "(N, T)")
    return torch.maximum(d_pos.abs(), d_neg.abs())  # (N, T)


def cscr_weights(sensitivity: torch.Tensor, mask: torch.Tensor, strength: float,
                 threshold: float = 0.0) -> torch.Tensor:
    """CSCR's credit weights (our reading): shrink the tokens most sensitive to the outcome.

    w_t  = exp(-strength * max(0, s_t - threshold))
    w~_t = |o_i| * w_t / sum_{t' real} w_t'      renormalised: a response's weights have mean 1
    strength 0 gives w~ = 1 exactly (GRPO); padding and empty responses get 0.
    Args: sensitivity (N, T) >= 0; mask; strength (alpha) >= 0; threshold (tau).
    Returns: weights (N, T), float32; no strength underflows a response to 0/0 (w_t / sum w is
    computed after shifting each response's log w_t by its largest). T = 0 (no token column)
    gives an empty (N, 0) tensor: with no token there is no largest log w_t, so no shift.
    """
    _check_tensor(sensitivity, "sensitivity", 2, "(N, T)")
    mask = _check_mask(mask, sensitivity, "sensitivity")
    _check_number(strength, "strength", ">= 0", lambda v: v >= 0)
    _check_number(threshold, "threshold")
    _check_values(sensitivity, "sensitivity", "finite and >= 0",
                  lambda s: torch.isfinite(s) & (s >= 0), mask)
    log_w = -strength * torch.clamp(sensitivity.float() - threshold, min=0)  # (N, T) log w_t
    log_w = log_w.masked_fill(~mask, float("-inf"))
    if log_w.shape[-1] > 0:  # w_t / sum w is unchanged by a shift; this one avoids 0/0
        log_w = log_w - log_w.amax(dim=-1, keepdim=True)
    w = torch.exp(log_w)  # (N, T), 1 at the least sensitive token, 0 on padding
    lengths = mask.sum(dim=-1, keepdim=True).to(torch.float32)  # (N, 1) |o_i|
    weights = lengths * w / w.sum(dim=-1, keepdim=True)  # (N, T); strength 0: |o_i| / |o_i| = 1
    return torch.where(mask, weights, 0.0)  # NaN rows (no token) -> 0


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H_t = -sum_v p_t(v) log p_t(v), the policy's entropy at each position, in float32.

    A -inf logit (a masked-out token) has p = 0 and adds nothing: the entropy is over the tokens
    that remain. Args: logits (N, T, V). Returns: (N, T); aggregate(H, mask, "token") is its mean.
    """
    _check_tensor(logits, "logits", 3, "(N, T, V)")
    _check_values(logits, "logits", "finite or -inf, with a finite value at every position",
                  lambda x: (x < math.inf) & (x > -math.inf).any(-1, keepdim=True))
    logp = torch.log_softmax(logits.float(), dim=-1)  # (N, T, V)
    p = logp.exp()  # (N, T, V)
    return -torch.where(p > 0, p * logp, 0.0).sum(dim=-1)  # (N, T)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor,
                      top_fraction: float = 0.2) -> torch.Tensor:
    """Wang et al. [9]: the policy gradient only on a batch's highest-entropy ("forking") tokens.

    keep_{i,t} = 1 if H_{i,t} >= quantile(H over the batch's real tokens, 1 - top_fraction)
    (ties at the threshold are all kept). No renormalisation: the loss keeps its denominator.
    Args: entropy, mask (N, T); top_fraction in (0, 1], 0.2 in the paper.
    Returns: keep (N, T) float.
    """
    _check_tensor(entropy, "entropy", 2, "(N, T)")
    mask = _check_mask(mask, entropy, "entropy")
    _check_number(top_fraction, "top_fraction", "in (0, 1]", lambda v: 0 < v <= 1)
    _check_values(entropy, "entropy", "finite", torch.isfinite, mask)
    real = entropy[mask].float()  # (number of real tokens,)
    if real.numel() == 0:
        return torch.zeros(entropy.shape, device=entropy.device)
    if real.numel() <= 2 ** 24:  # torch.quantile's limit
        threshold = torch.quantile(real, 1 - top_fraction)  # interpolates between nearest ranks
    else:  # the same interpolation from a sort (equal up to rounding)
        pos = (1 - top_fraction) * (real.numel() - 1)
        ranked = real.sort().values
        upper = ranked[min(int(pos) + 1, real.numel() - 1)]
        threshold = torch.lerp(ranked[int(pos)], upper, pos - int(pos))
    return (mask & (entropy.float() >= threshold)).float()  # (N, T), compared in float32


def token_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-token advantages A_{i,t} = weights_{i,t} * A_i, from cscr_weights or high_entropy_mask.

    With cscr_weights, sign(A_{i,t}) = sign(A_i) and sum_t A_{i,t} = |o_i| A_i: the verifier
    decides the direction and the budget, the weights only where the credit lands.
    Args: advantages (N,); weights (N, T) >= 0. Returns: (N, T), for policy_loss.
    """
    _check_tensor(advantages, "advantages", 1, "(N,)")
    _check_tensor(weights, "weights", 2, "(N, T)")
    _check_rows(weights, "weights", advantages, "advantages")
    _check_values(weights, "weights", ">= 0", lambda w: w >= 0)
    return advantages[:, None] * weights  # (N, T)


# -----------------------------------------------------------------------------
# 6. diagnostics

def shift_diagnostics(d_pos: torch.Tensor, d_neg: torch.Tensor, mask: torch.Tensor,
                      min_shift: float = 0.0) -> Dict[str, float]:
    """Do the two asserted outcomes push a token the same way? Over the "affected" real tokens.

    affected: max(|d+|, |d-|) >= min_shift (all real tokens at 0). same_direction =
    frac(d+ d- > 0), sign_reversal = frac(d+ d- < 0); mean_abs_pos, mean_abs_neg,
    mean_sensitivity; the common part mean |d+ + d-| / 2 and the differential part
    mean |d+ - d-| / 2. OUR statistic: the paper's counting rule for "affected" tokens is not
    known to us. Also num_tokens, num_affected.
    """
    _check_tensor(d_pos, "d_pos", 2, "(N, T)")
    _check_same_shape(d_neg, "d_neg", d_pos, "d_pos", "(N, T)")
    mask = _check_mask(mask, d_pos, "d_pos")
    _check_number(min_shift, "min_shift", ">= 0", lambda v: v >= 0)
    _check_values(d_pos, "d_pos", "finite", torch.isfinite, mask)
    _check_values(d_neg, "d_neg", "finite", torch.isfinite, mask)
    sensitivity = counterfactual_sensitivity(d_pos, d_neg)  # (N, T)
    affected = mask & (sensitivity >= min_shift)  # (N, T)
    num_affected = affected.sum()
    denom = num_affected.clamp(min=1).to(torch.float32)

    def mean_over_affected(x):
        return float(torch.where(affected, x, 0.0).sum() / denom)

    product = d_pos * d_neg  # (N, T)
    return dict(same_direction=float((affected & (product > 0)).sum() / denom),
                sign_reversal=float((affected & (product < 0)).sum() / denom),
                mean_abs_pos=mean_over_affected(d_pos.abs()),
                mean_abs_neg=mean_over_affected(d_neg.abs()),
                mean_sensitivity=mean_over_affected(sensitivity),
                mean_abs_common=mean_over_affected((d_pos + d_neg).abs() / 2),
                mean_abs_differential=mean_over_affected((d_pos - d_neg).abs() / 2),
                num_tokens=int(mask.sum()), num_affected=int(num_affected))


# -----------------------------------------------------------------------------
# input checks: every public function validates before it computes, and says what it expected

def _check_tensor(x, name: str, ndim: int, shape_desc: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {shape_desc}, "
                         f"got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {shape_desc}, "
                         f"got shape {tuple(x.shape)}")


def _check_same_shape(x, name: str, ref: torch.Tensor, ref_name: str, shape_desc: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {shape_desc}, "
                         f"got {type(x).__name__}")
    if x.shape != ref.shape:
        raise ValueError(f"{name} must have the same shape as {ref_name}: "
                         f"{shape_desc} = {tuple(ref.shape)}, got {tuple(x.shape)}")
    _check_device(x, name, ref, ref_name)


def _check_rows(x: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if x.shape[0] != ref.shape[0]:
        raise ValueError(f"{name} must have N = {ref.shape[0]} rows like {ref_name}, "
                         f"got shape {tuple(x.shape)}")
    _check_device(x, name, ref, ref_name)


def _check_device(x: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if x.device != ref.device:
        raise ValueError(f"{name} must be on the device of {ref_name}, {ref.device}, "
                         f"got {x.device}")


def _check_number(x, name: str, condition: str = "", test=lambda v: True,
                  finite: bool = True) -> None:
    """x must be a real number (not a bool) that passes test, and finite unless finite=False."""
    real = isinstance(x, (int, float)) and not isinstance(x, bool)
    if not (real and test(x) and (math.isfinite(x) or not finite)):
        kind = "finite number" if finite else "number"
        raise ValueError(f"{name} must be a {kind}{' ' * bool(condition)}{condition}, got {x!r}")


def _check_int(x, name: str, expected: str, test) -> None:
    """x must be an int (not a bool) that passes test."""
    if not (isinstance(x, int) and not isinstance(x, bool) and test(x)):
        raise ValueError(f"{name} must be {expected}, got {x!r}")


def _check_choice(value, name: str, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_dtype(dtype) -> None:
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a torch floating-point dtype such as torch.float32, "
                         f"got {dtype!r}")


def _check_values(x: torch.Tensor, name: str, expected: str, ok, mask=None) -> None:
    """ok(x) must hold everywhere (or on the real tokens of mask): else name the first bad value."""
    bad = ~ok(x)
    if mask is not None:
        bad = bad & mask
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        on = " on real tokens" if mask is not None else ""
        raise ValueError(f"{name} must be {expected}{on}, got {x[where].item()} at index {where}")


def _mask_values_ok(mask: torch.Tensor) -> torch.Tensor:
    """0-d bool tensor: every value of mask is 0 or 1 (read by the caller, when it reads)."""
    if mask.dtype == torch.bool:
        return torch.ones((), dtype=torch.bool, device=mask.device)
    return ((mask == 0) | (mask == 1)).all()


def _check_mask_shape(mask, like: Optional[torch.Tensor], like_name: str) -> None:
    _check_tensor(mask, "mask", 2, "(N, T)")
    if like is not None and mask.shape != like.shape[:2]:
        raise ValueError(f"mask must have the same shape as {like_name}: (N, T) = "
                         f"{tuple(like.shape[:2])}, got {tuple(mask.shape)}")
    if like is not None:
        _check_device(mask, "mask", like, like_name)


def _check_mask(mask, like: Optional[torch.Tensor] = None, like_name: str = "") -> torch.Tensor:
    """mask as bool (N, T), after checking its rank, shape, device and 0/1 values."""
    _check_mask_shape(mask, like, like_name)
    if mask.dtype == torch.bool:
        return mask
    _check_values(mask, "mask", "0 or 1", lambda m: (m == 0) | (m == 1))
    return mask != 0


def _check_advantages(advantages, like: torch.Tensor, like_name: str) -> torch.Tensor:
    """Per-response (N,) or per-token (N, T) advantages, returned as (N, T) like `like`."""
    if not isinstance(advantages, torch.Tensor) or advantages.dim() not in (1, 2):
        got = (tuple(advantages.shape) if isinstance(advantages, torch.Tensor)
               else type(advantages).__name__)
        raise ValueError(f"advantages must be a torch.Tensor of shape (N,) or (N, T), got {got}")
    if advantages.dim() == 2:
        _check_same_shape(advantages, "advantages", like, like_name, "(N, T)")
        return advantages
    _check_rows(advantages, "advantages of shape (N,)", like, like_name)
    return advantages[:, None].expand(like.shape)  # (N, T), a view: every token gets A_i


def _check_token_ids(targets, logits: torch.Tensor) -> None:
    _check_tensor(targets, "targets", 2, "(N, T)")
    if targets.shape != logits.shape[:2]:
        raise ValueError(f"targets must have the shape of logits' first two dimensions: (N, T) = "
                         f"{tuple(logits.shape[:2])}, got {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must hold integer token ids, got dtype {targets.dtype}")
    V = logits.shape[-1]
    if targets.numel() and ((targets < 0) | (targets >= V)).any():
        raise ValueError(f"targets must be token ids in [0, V = {V}), got range "
                         f"[{targets.min().item()}, {targets.max().item()}]")


def _check_loss_inputs(logp, old_logp, advantages, mask, ref_logp, beta: float, surrogate: str,
                       ratio_level: str):
    """policy_loss's checks. Shapes, devices and choices now; the mask's 0/1 values as a 0-d bool
    tensor and a function naming the culprit, for _loss_stats, which adds the inputs' finiteness
    on real tokens: the values cost no host-device synchronisation of their own.
    Returns: (mask as bool, (mask_ok, raise_for_values))."""
    _check_tensor(logp, "logp", 2, "(N, T)")
    _check_choice(surrogate, "surrogate", SURROGATES)
    _check_choice(ratio_level, "ratio_level", RATIO_LEVELS)
    if old_logp is not None or surrogate == "clip":
        _check_same_shape(old_logp, "old_logp", logp, "logp", "(N, T)")
    _check_mask_shape(mask, logp, "logp")
    _check_advantages(advantages, logp, "logp")
    if surrogate == "reinforce" and ratio_level != "token":
        raise ValueError(f"ratio_level {ratio_level!r} needs surrogate 'clip', "
                         f"got surrogate 'reinforce'")
    if ratio_level == "sequence" and advantages.dim() == 2:
        raise ValueError(f"ratio_level 'sequence' (GSPO) needs one advantage per response, "
                         f"shape (N,), got {tuple(advantages.shape)}; use 'sequence_token' "
                         f"for per-token advantages")
    _check_number(beta, "beta", ">= 0", lambda v: v >= 0)
    if beta > 0:
        _check_same_shape(ref_logp, "ref_logp (needed when beta > 0)", logp, "logp", "(N, T)")
    real = mask if mask.dtype == torch.bool else mask != 0
    inputs = dict(logp=logp, old_logp=old_logp, advantages=advantages,
                  ref_logp=ref_logp if beta > 0 else None)
    inputs = {name: x for name, x in inputs.items() if x is not None}

    def raise_for_values():
        _check_mask(mask)  # names a value that is not 0 or 1
        for name, x in inputs.items():
            _check_values(x, name, "finite", torch.isfinite, real if x.dim() == 2 else None)
    return real, (_mask_values_ok(mask), raise_for_values)


def _zero_padding(mask: torch.Tensor, logp, old_logp, advantages, ref_logp):
    """policy_loss's inputs with padding set to exactly 0; old_logp, ref_logp and the advantages
    detached (constants of the loss). Per-response advantages (N,) have no padding."""
    def real(x):
        return torch.where(mask, x, 0.0) if x is not None and x.dim() == 2 else x

    def constant(x):
        return None if x is None else real(x.detach())
    return real(logp), constant(old_logp), constant(advantages), constant(ref_logp)


def _loss_stats(values_check, inputs, mask: torch.Tensor, ratio, kl, eps_low: float,
                eps_high: float) -> Dict[str, float]:
    """policy_loss's statistics over real tokens, read back in one synchronisation together with
    the input values' check (which raises here, naming the input at fault). inputs: the
    _zero_padding'ed (logp, old_logp, A, ref_logp), finite exactly where the real tokens are."""
    ok, raise_for_values = values_check
    A = inputs[2]
    with torch.no_grad():
        for x in inputs:  # a NaN or inf makes the sum one too (an overflow only looks further)
            ok = ok if x is None else ok & torch.isfinite(x.sum())  # 0-d: nothing is read yet
        num_tokens = torch.count_nonzero(mask)
        values = [ok, num_tokens]
        if ratio is not None:  # padding has rho = 1 exactly: never clipped
            A = A if A.dim() == 2 else A[:, None]  # (N, T) or (N, 1)
            values += [torch.count_nonzero((ratio < 1 - eps_low) & (A < 0)),
                       torch.count_nonzero((ratio > 1 + eps_high) & (A > 0)), ratio.sum()]
        if kl is not None:
            values.append(kl.sum())
        values = torch.stack([v.to(torch.float64) for v in values]).tolist()  # the one read
    if not values[0]:
        raise_for_values()
    n, denom = int(values[1]), max(values[1], 1)
    stats = dict(num_tokens=n)
    if ratio is not None:  # ratio.sum() counted padding's 1s: take them out
        stats.update(clip_frac_low=values[2] / denom, clip_frac_high=values[3] / denom,
                     ratio_mean=(values[4] - (mask.numel() - values[1])) / denom)
    if kl is not None:
        stats["kl_mean"] = values[-1] / denom
    return stats


def _check_distillation_logits(student_logits, teacher_logits, mask) -> None:
    """Real tokens' logits are finite or -inf (a masked vocabulary), and the student gives
    probability > 0 wherever the teacher does (else KL(teacher || student) is infinite)."""
    real = mask[:, :, None]
    for x, name in ((student_logits, "student_logits"), (teacher_logits, "teacher_logits")):
        _check_values(x, name, "finite or -inf", lambda v: ~torch.isnan(v) & (v < math.inf), real)
    teacher_has_mass = real & (teacher_logits > -math.inf) & (student_logits == -math.inf)
    if teacher_has_mass.any():
        where = tuple(int(i) for i in teacher_has_mass.nonzero()[0])
        raise ValueError(f"student_logits must be > -inf wherever teacher_logits are (KL(teacher "
                         f"|| student) would be infinite), got -inf at index {where}")


def _check_round(groups, filter_key: str, first: Optional[dict]) -> dict:
    """One round of fill_batch's sampler: a dict of tensors with one leading dimension, holding
    filter_key, with the keys and trailing shapes of the first round. Returns the first round."""
    if not isinstance(groups, dict) or filter_key not in groups:
        keys = f" with keys {sorted(groups)}" if isinstance(groups, dict) else ""
        raise ValueError(f"sample_groups() must return a dict with key {filter_key!r} (the "
                         f"filter_key), got {type(groups).__name__}{keys}")
    _check_tensor(groups[filter_key], f"sample_groups()[{filter_key!r}]", 2, "(b, G)")
    if first is not None and set(groups) != set(first):
        raise ValueError(f"sample_groups() must return the same keys every round: first "
                         f"{sorted(first)}, then {sorted(groups)}")
    b = groups[filter_key].shape[0]
    for key, value in groups.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != b:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"sample_groups()[{key!r}] must be a tensor with leading dimension "
                             f"b = {b} like {filter_key}, got {got}")
        if first is not None and value.shape[1:] != first[key].shape[1:]:
            raise ValueError(f"sample_groups()[{key!r}] must keep its trailing shape across "
                             f"rounds, got {tuple(value.shape[1:])} after "
                             f"{tuple(first[key].shape[1:])}")
    return groups if first is None else first
