"""tokencredit: how RLVR hands the credit of one verified answer to its tokens.

Every method here makes two choices for each token o_{i,t} of response i: an advantage A_{i,t}
(how good the answer was, and how much of that this token earned) and a weight w_{i,t} (how much
this token counts in the batch's loss). On-policy, the gradient of the loss with respect to
log pi(o_{i,t}) is -w_{i,t} A_{i,t} (plus the KL term's when beta > 0); the rest is bookkeeping.

One pure function per idea, in the order the data flows through a training step (sections 1-6).
Each is: docstring, its inputs checked once at the door (_check_* at the bottom), the math. Math
that another function reuses sits in an unchecked _twin below the door, which the caller calls.

References
[1] GRPO: Shao et al., "DeepSeekMath", arXiv 2402.03300.
[2] Dr. GRPO: Liu et al., "Understanding R1-Zero-Like Training", arXiv 2503.20783.
[3] DAPO: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", 2503.14476.
[4] CSCR: "Not All Tokens Deserve Equal Credit", known to us only from a Hugging Face Daily Papers
    summary (no arXiv id, no authors): its sensitivity, weights and renormalisation are OUR READING.
[5] PPO: Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347.
[6] k3: J. Schulman, "Approximating KL Divergence", blog post, 2020.
[7] GSPO: Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071.
[8] RLOO: Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization", 2402.14740.
[9] Wang et al., "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RLVR",
    arXiv 2506.01939.

Shapes: B prompts, G responses per prompt (a group), N = B * G responses (row n in group n // G),
T response tokens (padded), V vocabulary; mask (N, T) is 1 on real tokens, |o_i| = mask[i].sum().
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
    Args: lengths (N,); max_len the budget L_max; cache_len in (0, max_len], the soft zone.
    Returns: penalty (N,) float in [-1, 0].
    """
    _check_tensors(("N",), lengths=lengths)
    _check_values("lengths", lengths, (lengths >= 0) & (lengths < math.inf), "finite and >= 0")
    _check_arg("max_len", max_len, type(max_len) is int and max_len > 0, "a positive int")
    _check_arg("cache_len", cache_len, type(cache_len) is int and 0 < cache_len <= max_len,
               f"an int in (0, max_len = {max_len}]")
    lengths = lengths.to(torch.float32)  # (N,)
    soft_start = max_len - cache_len
    ramp = (soft_start - lengths) / cache_len  # (N,) in [-1, 0) inside the soft zone
    penalty = torch.where(lengths <= soft_start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_len, torch.full_like(lengths, -1.0), penalty)


def group_advantages(rewards: torch.Tensor, scale: str = "std", eps: float = 1e-6,
                     baseline: str = "mean") -> torch.Tensor:
    """Group-relative advantage of each response, A_i = (r_i - b_i) / s.

    baseline "mean" (GRPO [1]): b_i = mean_j r_j, which holds r_i: with s = 1 the expected gradient
             is (G-1)/G of REINFORCE's; "leave_one_out" (RLOO [8]): mean_{j != i} r_j keeps it.
    scale    "std" (GRPO): s = std_j r_j + eps (Bessel, eps outside the sqrt); "batch": the std of
             all B*G rewards + eps; "none" (Dr. GRPO [2]): s = 1. s depends on r_i too: no
             baseline, and with it neither version keeps the expected gradient exactly.
    All rewards of a group equal (or G = 1): exactly 0. Args: rewards (B, G) finite. Returns:
    advantages (B, G), given to every token of the response.
    """
    _check_tensors(("B", "G"), rewards=rewards)
    _check_values("rewards", rewards, rewards.isfinite(), "finite")
    _check_arg("scale", scale, scale in ADVANTAGE_SCALES, f"one of {ADVANTAGE_SCALES}")
    _check_arg("eps", eps, 0 < _number(eps) < math.inf, "a finite number > 0")
    _check_arg("baseline", baseline, baseline in BASELINES, f"one of {BASELINES}")
    rewards = rewards if rewards.is_floating_point() else rewards.to(torch.float32)
    G = rewards.shape[1]
    if G == 1:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (B, G) r_i - mean
    if baseline == "leave_one_out":
        centred = centred * (G / (G - 1))  # (B, G) r_i - mean_{j != i} r_j
    if scale == "std":  # GRPO
        s = rewards.std(dim=1, keepdim=True) + eps  # (B, 1)
    elif scale == "batch":
        s = rewards.std() + eps  # ()
    else:  # "none", Dr. GRPO: no division (x / 1 is exact), so no difficulty bias
        s = 1.0
    centred = centred / s  # (B, G)
    # a mean of equal floats need not round back to them exactly: force the 0
    all_equal = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)  # (B, 1)
    return torch.where(all_equal, torch.zeros_like(centred), centred)


# -----------------------------------------------------------------------------
# 2. dynamic sampling (DAPO [3])

def informative_groups(values: torch.Tensor) -> torch.Tensor:
    """True where a group's values are not all equal: its advantages are not 0.

    Given the verifier's verdicts this is DAPO's 0 < #correct < G; given shaped rewards, it also
    keeps an all-wrong group whose penalties differ. Args: values (B, G) finite; bool reads as 0/1.
    Returns: keep (B,) bool."""
    _check_tensors(("B", "G"), values=values)
    _check_values("values", values, values.isfinite(), "finite")
    return (values != values[:, :1]).any(dim=1)  # (B,)


def fill_batch(sample_groups: Callable[[], Dict[str, torch.Tensor]], batch_size: int,
               max_rounds: int, filter_key: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, int]]:
    """DAPO's dynamic sampling: sample rounds of groups, keep the informative ones.

    sample_groups() returns a dict of tensors sharing a leading dimension (a round's groups). A
    group is kept where informative_groups(groups[filter_key]): its (b, G) values are not all
    equal (0 < #correct < G when filter_key names the verdicts, as it should), in the order
    sampled, the surplus dropped; after max_rounds calls, what there is, maybe no group.
    Returns: (batch, stats): rounds (calls made), groups_seen, groups_informative (surplus
    included), groups_kept (in batch), full (1 if batch_size kept).
    """
    _check_arg("sample_groups", sample_groups, callable(sample_groups), "callable")
    _check_arg("batch_size", batch_size, type(batch_size) is int and batch_size > 0,
               "a positive int")
    _check_arg("max_rounds", max_rounds, type(max_rounds) is int and max_rounds > 0,
               "a positive int")  # filter_key: in each round, by _check_round
    kept, n_kept, n_seen, n_informative, rounds, first = [], 0, 0, 0, 0, None
    while n_kept < batch_size and rounds < max_rounds:
        groups = sample_groups()
        rounds += 1
        first = _check_round(groups, filter_key, first)
        keep = informative_groups(groups[filter_key])  # (b,)
        n_seen += keep.shape[0]
        n_informative += int(keep.sum())
        take = keep.nonzero().squeeze(1)[: batch_size - n_kept]  # drop the surplus
        kept.append({key: value[take] for key, value in groups.items()})  # maybe 0 groups
        n_kept += take.numel()
    batch = {key: torch.cat([part[key] for part in kept], dim=0) for key in kept[0]}
    return batch, dict(rounds=rounds, groups_seen=n_seen, groups_informative=n_informative,
                       groups_kept=n_kept, full=int(n_kept == batch_size))


# -----------------------------------------------------------------------------
# 3. the per-token surrogate: REINFORCE, the ratio, the clip (PPO [5], GSPO [7]), KL (k3 [6])

def policy_gradient_surrogate(logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """REINFORCE's per-token loss, loss_t = -A_t log pi(o_t | q, o_<t), whose gradient is -A_t.

    A: the reward (REINFORCE), a baselined advantage (GRPO) or per token (CSCR), a constant (pass it
    detached, as policy_loss does). Right only on-policy: it ignores which policy sampled o_t.
    Args: logp (N, T); advantages (N,) or (N, T). Returns: loss (N, T), not yet aggregated.
    """
    N, T = _check_tensors(("N", "T"), floating=True, logp=logp)
    _check_tensors((N,), (N, T), device=logp.device, advantages=advantages)
    A = advantages if advantages.dim() == 2 else advantages[:, None]  # (N, T), or A_i (N, 1)
    return _policy_gradient_surrogate(logp, A)


def _policy_gradient_surrogate(logp, A):
    return -A * logp  # (N, T)


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                     level: str = "token") -> torch.Tensor:
    """pi_theta / pi_old, per token (PPO, GRPO) or per sequence (GSPO [7]); exactly 1 on padding.

    "token": rho_{i,t} = exp(logp_{i,t} - old_logp_{i,t}); "sequence", "sequence_token": GSPO's s_i.
    Args: logp, old_logp (a constant: no gradient flows into it), mask (N, T). Returns: (N, T).
    """
    N, T = _check_tensors(("N", "T"), floating=True, logp=logp, old_logp=old_logp)
    mask = _check_mask(mask, (N, T), device=logp.device)
    _check_arg("level", level, level in RATIO_LEVELS, f"one of {RATIO_LEVELS}")
    return _importance_ratio(logp, old_logp, mask, level)


def _importance_ratio(logp, old_logp, mask, level):
    if level != "token":
        return _sequence_ratio(logp, old_logp, mask, per_token=level == "sequence_token")
    return torch.exp(torch.where(mask, logp - old_logp.detach(), 0.0))  # (N, T), 1 on padding


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                   per_token: bool = False) -> torch.Tensor:
    """GSPO's sequence-level ratio [7], the geometric mean of a response's token ratios.

    s_i = exp(1/|o_i| sum_t (logp_{i,t} - old_logp_{i,t})), on every token of response i, so
    d s_i / d logp_{i,t} = s_i / |o_i|. per_token (GSPO-token): sg[s_i] * pi_{i,t} / sg[pi_{i,t}],
    the same value with d / d logp_{i,t} = s_i, for per-token advantages.
    Returns: (N, T), 1 on padding, in at least float32 (bf16 cannot resolve 3e-4 over 1000 tokens).
    """
    N, T = _check_tensors(("N", "T"), floating=True, logp=logp, old_logp=old_logp)
    mask = _check_mask(mask, (N, T), device=logp.device)
    _check_arg("per_token", per_token, type(per_token) is bool, "a bool")
    return _sequence_ratio(logp, old_logp, mask, per_token)


def _sequence_ratio(logp, old_logp, mask, per_token):
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

    At rho = 1 its gradient is REINFORCE's; once rho leaves the range in the direction A pushes, 0.
    GRPO uses one eps; eps_high > eps_low is DAPO's Clip-Higher [3]; eps_low >= 1: no lower clip.
    Args: ratio (N, T) from importance_ratio; advantages (N,) or (N, T). Returns: loss (N, T).
    """
    N, T = _check_tensors(("N", "T"), floating=True, ratio=ratio)
    _check_tensors((N,), (N, T), device=ratio.device, advantages=advantages)
    _check_arg("eps_low", eps_low, _number(eps_low) >= 0, "a number >= 0")
    _check_arg("eps_high", eps_high, _number(eps_high) >= 0, "a number >= 0")
    A = advantages if advantages.dim() == 2 else advantages[:, None]  # (N, T), or A_i (N, 1)
    return _clipped_surrogate(ratio, A, eps_low, eps_high)


def _clipped_surrogate(ratio, A, eps_low, eps_high):
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)  # (N, T)
    unclipped = ratio * A  # (N, T)
    clipped = clipped_ratio * A  # (N, T)
    # -min(unclipped, clipped), read from the side of the range rho is on (the clipped term where
    # rho left it in the direction A pushes), so that where the two terms round to one float the
    # gradient is still the equation's: torch.minimum would split it, in several more passes
    return -torch.where((ratio - clipped_ratio) * A.sign() > 0, clipped, unclipped)  # (N, T)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator [6] of KL(pi_theta || pi_ref): KL_t = r - log r - 1, r = pi_ref / pi_theta.

    Unbiased for o_t drawn from pi_theta (GRPO samples from pi_old), never negative; low variance
    is found for nearby policies, not guaranteed. As a loss its gradient is (1 - r) d log pi_theta,
    in expectation that of KL(pi_ref || pi_theta). Args: logp, ref_logp (N, T). Returns: (N, T).
    """
    _check_tensors(("N", "T"), floating=True, logp=logp, ref_logp=ref_logp)
    return _kl_k3(logp, ref_logp)


def _kl_k3(logp, ref_logp):
    log_ratio = ref_logp - logp  # (N, T) log r
    return torch.expm1(log_ratio) - log_ratio  # r - 1 - log r, exact near r = 1


# -----------------------------------------------------------------------------
# 4. aggregation: who gets credit for a long answer (GRPO [1], Dr. GRPO [2], DAPO [3])

def token_weights(mask: torch.Tensor, mode: str, group_size: Optional[int] = None,
                  max_len: Optional[float] = None) -> torch.Tensor:
    """w_{i,t} = mask_{i,t} / d_i, the weight of each token in loss = sum_{i,t} w_{i,t} loss_{i,t}.

    The denominator d_i is the one place where the methods' aggregations differ:
    "sample"      GRPO [1]             d_i = N |o_i|                      per response, then of N
    "token"       verl, TRL "dapo"     d_i = sum_{j in batch} |o_j|       one mean of all tokens
    "group_token" DAPO [3] as printed  d_i = B sum_{j in group(i)} |o_j|  per prompt, then of B
    "constant"    Dr. GRPO [2]         d_i = N max_len                    no length at all
    Args: mask (N, T); group_size ("group_token"); max_len, Dr. GRPO's budget ("constant"). Returns:
    (N, T) float32, 0 on padding and (a count of 0 clamped to 1) on empty responses, not NaN.
    """
    mask = _check_mask(mask, ("N", "T"))
    _check_aggregation(mask.shape[0], mode, group_size, max_len)
    return mask / _loss_denominators(mask, mode, group_size, max_len)[:, None]  # (N, T)


def _loss_denominators(mask, mode, group_size, max_len, dtype=torch.float32):
    """d_i (N,) in dtype, at least float32 (bf16 counts 1001 tokens as 1000)."""
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
    return torch.full_like(lengths, float(N * max_len))  # (N,) "constant"


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str,
              group_size: Optional[int] = None, max_len: Optional[float] = None) -> torch.Tensor:
    """One scalar from a per-token quantity: sum_{i,t} w_{i,t} x_{i,t} = sum_i 1/d_i sum_t x_{i,t}.

    Padding values, even NaN or inf, reach neither the result nor its gradient. Args: per_token
    (N, T) (integers averaged as float32); mask, mode etc. as in token_weights. Returns: 0-d float.
    """
    N, T = _check_tensors(("N", "T"), per_token=per_token)
    mask = _check_mask(mask, (N, T), device=per_token.device)
    _check_aggregation(N, mode, group_size, max_len)
    return _aggregate(per_token, mask, mode, group_size, max_len)


def _aggregate(per_token, mask, mode, group_size, max_len):
    x = per_token if per_token.is_floating_point() else per_token.to(torch.float32)
    denominator = _loss_denominators(mask, mode, group_size, max_len, x.dtype)  # (N,) d_i
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
    whatever the ratio_level. old_logp, ref_logp and the advantages are constants (detached).
    Args: logp, old_logp, mask (N, T); advantages (N,) or (N, T) ((N,) for "sequence", GSPO); mode
    etc. as in token_weights; eps_* as in clipped_surrogate; ref_logp (N, T) when beta > 0.
    Returns: (loss, stats over real tokens: num_tokens, clip_frac_low (A < 0, rho < 1 - eps_low),
    clip_frac_high (A > 0, rho > 1 + eps_high), ratio_mean (these with "clip"), kl_mean (beta > 0));
    one host-device synchronisation reads them and checks that the inputs are finite.
    """
    N, T = _check_tensors(("N", "T"), floating=True, logp=logp)
    if surrogate != "reinforce" or old_logp is not None:  # REINFORCE needs no old_logp
        _check_tensors((N, T), floating=True, device=logp.device, old_logp=old_logp)
    _check_tensors((N,), (N, T), device=logp.device, advantages=advantages)
    mask = _check_mask(mask, (N, T), device=logp.device)
    _check_aggregation(N, mode, group_size, max_len)
    _check_arg("eps_low", eps_low, _number(eps_low) >= 0, "a number >= 0")
    _check_arg("eps_high", eps_high, _number(eps_high) >= 0, "a number >= 0")
    _check_arg("beta", beta, 0 <= _number(beta) < math.inf, "a finite number >= 0")
    if beta > 0:
        _check_tensors((N, T), floating=True, device=logp.device, ref_logp=ref_logp)
    _check_arg("surrogate", surrogate, surrogate in SURROGATES, f"one of {SURROGATES}")
    _check_arg("ratio_level", ratio_level, ratio_level in RATIO_LEVELS, f"one of {RATIO_LEVELS}")
    _check_that(surrogate == "clip" or ratio_level == "token", f"ratio_level {ratio_level!r}",
                "have surrogate 'clip' (the ratio is clipped)", f"surrogate {surrogate!r}")
    _check_that(ratio_level != "sequence" or advantages.dim() == 1, "advantages", "be (N,) for "
                "ratio_level 'sequence' (GSPO; 'sequence_token': (N, T))", tuple(advantages.shape))
    A = advantages.detach()  # a constant, as are old_logp and ref_logp
    A = A[:, None] if A.dim() == 1 else A  # (N, 1) A_i, or (N, T)
    ratio = kl = None
    if surrogate == "clip":  # the ratio is exactly 1 on padding, whatever logp holds there
        ratio = _importance_ratio(logp, old_logp, mask, ratio_level)  # (N, T) rho, or GSPO's s_i
        per_token = _clipped_surrogate(ratio, A, eps_low, eps_high)  # (N, T)
    else:  # REINFORCE: no ratio, no clip
        per_token = _policy_gradient_surrogate(torch.where(mask, logp, 0.0), A)  # (N, T)
    if beta > 0:  # padding 0 first: garbage there reaches no value and no gradient
        kl = _kl_k3(torch.where(mask, logp, 0.0), torch.where(mask, ref_logp.detach(), 0.0))
        per_token = per_token + beta * kl  # (N, T)
    loss = _aggregate(per_token, mask, mode, group_size, max_len)  # sum_{i,t} w_{i,t} per_token
    inputs = dict(logp=logp, old_logp=old_logp, advantages=advantages,
                  ref_logp=ref_logp if beta > 0 else None)  # checked with the statistics
    return loss, _loss_stats(inputs, mask, ratio, A, kl, eps_low, eps_high)


def self_distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                           mask: torch.Tensor, mode: str = "token",
                           group_size: Optional[int] = None,
                           max_len: Optional[float] = None) -> torch.Tensor:
    """On-policy self-distillation (OPSD), CSCR's baseline: sum_{i,t} w_{i,t} KL(p_T || p_S)_t.

    p_T is the teacher (the same model given privileged context; no gradient), p_S the policy.
    KL_t = sum_{v: p_T(v) > 0} p_T(v) (log p_T(v) - log p_S(v)): a teacher's -inf logit counts 0.
    The direction KL(teacher || student) is OUR choice; many setups use KL(student || teacher).
    Args: student_logits, teacher_logits (N, T, V); mask; mode etc. as in token_weights.
    """
    N, T, V = _check_tensors(("N", "T", "V"), floating=True, student_logits=student_logits,
                             teacher_logits=teacher_logits)
    mask = _check_mask(mask, (N, T), device=student_logits.device)
    _check_values("student_logits", student_logits, (student_logits < math.inf) & (
        (student_logits > -math.inf) | (teacher_logits == -math.inf)), "finite or -inf, and > -inf "
        "where teacher_logits are (or KL(teacher || student) is infinite)", mask)
    _check_values("teacher_logits", teacher_logits, teacher_logits < math.inf, "finite or -inf",
                  mask)  # -inf: a token the teacher masked out
    _check_aggregation(N, mode, group_size, max_len)
    real = mask[:, :, None]  # (N, T, 1): padding logits -> 0 before log_softmax
    teacher_logp = torch.log_softmax(torch.where(real, teacher_logits.detach(), 0.0).float(), -1)
    student_logp = torch.log_softmax(torch.where(real, student_logits, 0.0).float(), -1)
    p_teacher = teacher_logp.exp()  # (N, T, V)
    terms = torch.where(p_teacher > 0, p_teacher * (teacher_logp - student_logp), 0.0)  # (N, T, V)
    return _aggregate(terms.sum(dim=-1), mask, mode, group_size, max_len)


# -----------------------------------------------------------------------------
# 5. which tokens carry the credit, u_{i,t} in A_{i,t} = A_i u_{i,t} (A[:, None] * u; the loss
#    weight w_{i,t} still applies on top): CSCR [4] (our reading), the high-entropy mask [9]

def counterfactual_shifts(logp: torch.Tensor, logp_pos: torch.Tensor, logp_neg: torch.Tensor,
                          mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """How each sampled token's log-prob moves when an outcome is asserted before the prompt [4].

    d+_t = log pi(o_t | c+, q, o_<t) - log pi(o_t | q, o_<t)     (c+ asserts "correct")
    d-_t = log pi(o_t | c-, q, o_<t) - log pi(o_t | q, o_<t)     (c- asserts "incorrect")
    Args: logp, logp_pos, logp_neg (one answer scored 3 ways), mask (N, T). Returns: (N, T) each.
    """
    N, T = _check_tensors(("N", "T"), floating=True, logp=logp, logp_pos=logp_pos,
                          logp_neg=logp_neg)
    mask = _check_mask(mask, (N, T), device=logp.device)
    return torch.where(mask, logp_pos - logp, 0.0), torch.where(mask, logp_neg - logp, 0.0)


def counterfactual_sensitivity(d_pos: torch.Tensor, d_neg: torch.Tensor) -> torch.Tensor:
    """s_t = max(|d+_t|, |d-_t|): OUR reading of CSCR's token sensitivity.

    It scores a token both assertions push the same way (not about the outcome) as one they push
    apart; shift_diagnostics splits the two. Returns: (N, T) >= 0."""
    _check_tensors(("N", "T"), d_pos=d_pos, d_neg=d_neg)
    _check_values("d_pos", d_pos, d_pos.isfinite(), "finite")
    _check_values("d_neg", d_neg, d_neg.isfinite(), "finite")
    return _counterfactual_sensitivity(d_pos, d_neg)


def _counterfactual_sensitivity(d_pos, d_neg):
    return torch.maximum(d_pos.abs(), d_neg.abs())  # (N, T)


def cscr_weights(sensitivity: torch.Tensor, mask: torch.Tensor, strength: float,
                 threshold: float = 0.0) -> torch.Tensor:
    """CSCR's credit weights (our reading): shrink the tokens most sensitive to the outcome.

    u_t  = exp(-strength * max(0, s_t - threshold))
    u~_t = |o_i| * u_t / sum_{t' real} u_t'      renormalised: a response's weights have mean 1
    strength 0: u~ = 1 exactly (GRPO). A_{i,t} = u~_t A_i keeps A_i's sign and sum_t A_{i,t} =
    |o_i| A_i: the verifier decides the direction and budget, the weights where credit lands.
    Args: sensitivity (N, T) >= 0; mask; strength (alpha) >= 0; threshold (tau). Returns: u~ (N, T)
    float32, 0 on padding and empty responses; log u_t shifted by its response's largest first, so
    no strength underflows to 0/0 (T = 0: an empty (N, 0)).
    """
    N, T = _check_tensors(("N", "T"), sensitivity=sensitivity)
    mask = _check_mask(mask, (N, T), device=sensitivity.device)
    _check_values("sensitivity", sensitivity, (sensitivity >= 0) & (sensitivity < math.inf),
                  "finite and >= 0", mask)
    _check_arg("strength", strength, 0 <= _number(strength) < math.inf, "a finite number >= 0")
    _check_arg("threshold", threshold, abs(_number(threshold)) < math.inf, "a finite number")
    log_w = -strength * torch.clamp(sensitivity.float() - threshold, min=0)  # (N, T) log u_t
    log_w = log_w.masked_fill(~mask, float("-inf"))
    if log_w.shape[-1] > 0:  # u_t / sum u is unchanged by a shift; this one avoids 0/0
        log_w = log_w - log_w.amax(dim=-1, keepdim=True)
    w = torch.exp(log_w)  # (N, T), 1 at the least sensitive token, 0 on padding
    lengths = mask.sum(dim=-1, keepdim=True).to(torch.float32)  # (N, 1) |o_i|
    weights = lengths * w / w.sum(dim=-1, keepdim=True)  # (N, T); strength 0: |o_i| / |o_i| = 1
    return torch.where(mask, weights, 0.0)  # NaN rows (no token) -> 0


def cscr_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """CSCR's token advantage (our reading): each response's advantage spread by token weights.

    A_{i,t} = w~_{i,t} A_i
    Args: advantages (N,) A_i; weights (N, T) >= 0, cscr_weights' w~ (or high_entropy_mask's
    keep, or their product). Returns: (N, T), what policy_loss takes as advantages. With
    cscr_weights it keeps A_i's sign and sum_t A_{i,t} = |o_i| A_i: the verifier sets direction
    and budget, the weights only where the credit lands.
    """
    N, = _check_tensors(("N",), advantages=advantages)
    _check_tensors((N, "T"), floating=True, device=advantages.device, weights=weights)
    _check_values("weights", weights, (weights >= 0) & (weights < math.inf), "finite and >= 0")
    return advantages[:, None] * weights  # (N, T)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H_t = -sum_v p_t(v) log p_t(v), the policy's entropy at each position, in float32.

    A -inf logit (a masked-out token) has p = 0 and adds nothing: the entropy is over the tokens
    that remain. Args: logits (N, T, V). Returns: (N, T); aggregate(H, mask, "token"): its mean."""
    _check_tensors(("N", "T", "V"), floating=True, logits=logits)
    _check_values("logits", logits, (logits < math.inf) & (logits > -math.inf).any(-1, True),
                  "finite or -inf, with a finite value at every position")
    logp = torch.log_softmax(logits.float(), dim=-1)  # (N, T, V)
    p = logp.exp()  # (N, T, V)
    return -torch.where(p > 0, p * logp, 0.0).sum(dim=-1)  # (N, T)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor,
                      top_fraction: float = 0.2) -> torch.Tensor:
    """Wang et al. [9]: the policy gradient only on a batch's highest-entropy ("forking") tokens.

    keep_{i,t} = 1 if H_{i,t} >= quantile(H over the batch's real tokens, 1 - top_fraction), ties
    all kept. No renormalisation: the loss keeps its denominator. Args: entropy, mask (N, T);
    top_fraction in (0, 1], 0.2 in the paper. Returns: keep (N, T) float.
    """
    N, T = _check_tensors(("N", "T"), entropy=entropy)
    mask = _check_mask(mask, (N, T), device=entropy.device)
    _check_values("entropy", entropy, entropy.isfinite(), "finite", mask)
    _check_arg("top_fraction", top_fraction, 0 < _number(top_fraction) <= 1, "a number in (0, 1]")
    real = entropy[mask].float()  # (number of real tokens,)
    if real.numel() == 0:
        return torch.zeros(entropy.shape, device=entropy.device)
    threshold = _quantile(real, 1 - top_fraction)
    return (mask & (entropy.float() >= threshold)).float()  # (N, T), compared in float32


def _quantile(x, q):
    """torch.quantile(x, q) in its float32 steps, at any len(x) (it stops at 2^24)."""
    rank = torch.tensor(q, dtype=x.dtype, device=x.device) * (x.numel() - 1)  # 0-d
    below, above = (min(int(k), x.numel() - 1) for k in (rank.floor(), rank.ceil()))
    lower, upper = (torch.kthvalue(x, k + 1).values for k in (below, above))  # k-th smallest
    return torch.lerp(lower, upper, rank - below)


# -----------------------------------------------------------------------------
# 6. diagnostics

def shift_diagnostics(d_pos: torch.Tensor, d_neg: torch.Tensor, mask: torch.Tensor,
                      min_shift: float = 0.0) -> Dict[str, float]:
    """Do the two asserted outcomes push a token the same way? Over the "affected" real tokens.

    affected: max(|d+|, |d-|) >= min_shift (all real tokens at 0). same_direction = frac(d+ d- > 0),
    sign_reversal = frac(d+ d- < 0); mean_abs_pos, mean_abs_neg, mean_sensitivity; the common part
    mean |d+ + d-| / 2, the differential part mean |d+ - d-| / 2; num_tokens, num_affected. OUR
    statistic: the paper's rule for "affected" tokens is not known to us.
    """
    N, T = _check_tensors(("N", "T"), d_pos=d_pos, d_neg=d_neg)
    mask = _check_mask(mask, (N, T), device=d_pos.device)
    _check_values("d_pos", d_pos, d_pos.isfinite(), "finite", mask)
    _check_values("d_neg", d_neg, d_neg.isfinite(), "finite", mask)
    _check_arg("min_shift", min_shift, 0 <= _number(min_shift) < math.inf, "a finite number >= 0")
    sensitivity = _counterfactual_sensitivity(d_pos, d_neg)  # (N, T)
    affected = mask & (sensitivity >= min_shift)  # (N, T)
    num_affected = affected.sum()
    denom = num_affected.clamp(min=1).to(torch.float32)
    product = d_pos * d_neg  # (N, T)
    parts = dict(same_direction=product > 0, sign_reversal=product < 0, mean_abs_pos=d_pos.abs(),
                 mean_abs_neg=d_neg.abs(), mean_sensitivity=sensitivity,
                 mean_abs_common=(d_pos + d_neg).abs() / 2,
                 mean_abs_differential=(d_pos - d_neg).abs() / 2)  # each (N, T), averaged:
    means = {name: float(torch.where(affected, x, 0.0).sum() / denom) for name, x in parts.items()}
    return dict(means, num_tokens=int(mask.sum()), num_affected=int(num_affected))


# -----------------------------------------------------------------------------
# input checks, made once at each public door: a ValueError says what was expected and what came

def _check_that(ok: bool, name: str, expected: str, got) -> None:
    if not ok:
        raise ValueError(f"{name} must {expected}, got {got}")


def _check_arg(name: str, x, ok: bool, expected: str) -> None:
    """A number, a choice or a callable: ok says whether x is what was expected."""
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {x!r}")


def _number(x) -> float:
    """x if it is an int or a float (a bool is not a number), else NaN: every comparison fails."""
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _check_tensors(*shapes: tuple, floating: bool = False, device=None, **tensors) -> tuple:
    """Each tensor, given as name=tensor, must be a torch.Tensor of one of the shapes (a size, or
    a letter: any), floating point if asked, on device if given; after the first, of the first's
    shape and device. Returns the first's shape."""
    first = None
    for name, x in tensors.items():
        tensor = torch.is_tensor(x)
        fits = tensor and any(x.shape == shape or len(shape) == x.dim() and all(
            isinstance(size, str) or size == n for size, n in zip(shape, x.shape))
            for shape in shapes)
        if not (fits and (x.is_floating_point() or not floating) and device in (None, x.device)):
            kind = "a floating-point torch.Tensor" if floating else "a torch.Tensor"
            sizes = " or ".join(str(shape).replace("'", "") for shape in shapes)  # (N, T), (4, 3)
            where = f" on {device}" if device is not None else ""
            got = f"{tuple(x.shape)}, {x.dtype} on {x.device}" if tensor else type(x).__name__
            raise ValueError(f"{name} must be {kind} {sizes}{where}, got {got}")
        if first is None:
            first, shapes, device = x.shape, (tuple(x.shape),), x.device
    return first


def _check_aggregation(N: int, mode: str, group_size, max_len) -> None:
    """mode one of AGGREGATION_MODES; group_size, for "group_token", a positive int dividing N;
    max_len, for "constant", a finite number > 0."""
    _check_arg("mode", mode, mode in AGGREGATION_MODES, f"one of {AGGREGATION_MODES}")
    _check_arg("group_size", group_size, mode != "group_token" or type(group_size) is int
               and group_size > 0 and N % group_size == 0,
               f"a positive int dividing N = {N} (mode 'group_token')")
    _check_arg("max_len", max_len, mode != "constant" or 0 < _number(max_len) < math.inf,
               "a finite number > 0 (mode 'constant': Dr. GRPO's budget)")


def _check_mask(mask, shape: tuple, device=None) -> torch.Tensor:
    """mask must be a torch.Tensor of that shape, bool or numbers 0 and 1. Returns it as bool."""
    _check_tensors(shape, device=device, mask=mask)
    if mask.dtype != torch.bool:
        _check_values("mask", mask, (mask == 0) | (mask == 1), "0 or 1")
    return mask if mask.dtype == torch.bool else mask != 0


def _check_values(name: str, x: torch.Tensor, ok: torch.Tensor, expected: str,
                  mask: Optional[torch.Tensor] = None) -> None:
    """x's values where ok is False are not what was expected (on real tokens, given a mask)."""
    real = ~ok if mask is None else ~ok & mask.view(mask.shape + (1,) * (x.dim() - mask.dim()))
    if real.any():
        at = tuple(real.nonzero()[0].tolist())
        on = " on real tokens" if mask is not None else ""
        _check_that(False, name, f"be {expected}{on}", f"{x[at].item()} at index {at}")


def _loss_stats(inputs: dict, mask: torch.Tensor, ratio: Optional[torch.Tensor], A: torch.Tensor,
                kl: Optional[torch.Tensor], eps_low: float, eps_high: float) -> Dict[str, float]:
    """policy_loss's statistics over the real tokens, read from the device at once with the sum
    of each input (name: tensor or None), padding and all: finite if the input is. If a value is
    not (a NaN or an inf on a real token, or only in padding, or an overflow), look which input."""
    with torch.no_grad():
        sums = {name: x.sum() for name, x in inputs.items() if x is not None}
        sums["num_tokens"] = torch.count_nonzero(mask)
        if ratio is not None:  # padding has rho = 1 exactly: never clipped
            sums.update(clip_frac_low=torch.count_nonzero((ratio < 1 - eps_low) & (A < 0)),
                        clip_frac_high=torch.count_nonzero((ratio > 1 + eps_high) & (A > 0)),
                        ratio_mean=ratio.sum())
        if kl is not None:  # 0 on padding
            sums["kl_mean"] = kl.sum()
        sums = dict(zip(sums, torch.stack([x.double() for x in sums.values()]).tolist()))  # 1 read
    if not all(map(math.isfinite, sums.values())):
        for name, x in inputs.items():
            if x is not None:
                _check_values(name, x, x.isfinite(), "finite", mask if x.dim() == 2 else None)
    n = sums["num_tokens"]
    if "ratio_mean" in sums:
        sums["ratio_mean"] -= mask.numel() - n  # the sum counted padding's 1s
    means = ("clip_frac_low", "clip_frac_high", "ratio_mean", "kl_mean")  # of the real tokens
    return dict(num_tokens=int(n), **{name: sums[name] / max(n, 1) for name in means
                                      if name in sums})


def _check_round(groups, filter_key: str, first: Optional[dict]) -> dict:
    """One round of fill_batch's sampler: a dict of tensors, filter_key's (b, G), of one leading
    size b, with the first round's keys and trailing shapes. Returns its shapes, b the leading
    size. The message names the sampler's output, not informative_groups' argument."""
    given = groups if isinstance(groups, dict) else {}
    got = {key: tuple(x.shape) if torch.is_tensor(x) else x for key, x in given.items()}
    shapes = {k: ("b",) + got[k][1:] for k, x in given.items() if torch.is_tensor(x) and x.dim()}
    expected = (f"return a dict of tensors with key {filter_key!r} (the filter_key) of shape "
                f"(b, G), one leading size b")
    if first is not None:
        expected += f", shapes {first} as in the first round"
    ok = (len(shapes) == len(got) and len(got.get(filter_key, ())) == 2
          and len({shape[0] for shape in got.values()}) == 1 and shapes == (first or shapes))
    _check_that(ok, "sample_groups()", expected, got or repr(groups))
    return first or shapes
