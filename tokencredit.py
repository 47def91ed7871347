"""tokencredit: how RLVR hands the credit of one verified answer to its tokens.

Every method here makes two choices for each token o_{i,t} of response i:
an advantage A_{i,t} (how good the answer was, and in CSCR how much of that
this token earned) and a weight w_{i,t} (how much this token counts in the
batch's loss). On-policy the gradient of the loss with respect to log pi(o_{i,t})
is -w_{i,t} A_{i,t}, plus the KL term's when beta > 0; the rest is bookkeeping.

One pure function per idea, in the order the data flows through a training
step: rewards -> group advantages -> dynamic sampling -> per-token surrogate
(plain policy gradient, then PPO-clip) -> aggregation (who gets credit for a
long answer) -> CSCR reweighting -> diagnostics. Nothing here needs a model
or a tokenizer.

References
[1] GRPO: Shao et al., "DeepSeekMath", arXiv 2402.03300.
[2] Dr. GRPO: Liu et al., "Understanding R1-Zero-Like Training", arXiv 2503.20783.
[3] DAPO: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System
    at Scale", arXiv 2503.14476.
[4] CSCR: "Not All Tokens Deserve Equal Credit", arXiv 2607.27888. Its full
    text was not available to us: the sensitivity, weighting and
    renormalisation below are OUR READING of its abstract, and every choice
    is a parameter.
[5] PPO: Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347.
[6] k3: J. Schulman, "Approximating KL Divergence", blog post, 2020.

Shape letters used everywhere
    B  prompts in a batch
    G  responses sampled per prompt (the group)
    N  = B * G responses; row n belongs to group n // G
    T  response tokens (padded width)
    V  vocabulary size
    mask (N, T): 1 on real response tokens, 0 on padding; |o_i| = mask[i].sum()
"""

import math
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

AGGREGATION_MODES = ("sample", "token", "group_token", "constant")
ADVANTAGE_SCALES = ("std", "none")
SURROGATES = ("clip", "reinforce")


# -----------------------------------------------------------------------------
# input checks (every public function validates before it computes)

def _check_tensor(x, name: str, ndim: int, shape_desc: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {shape_desc}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {shape_desc}, got shape {tuple(x.shape)}")


def _check_same_shape(x, name: str, ref: torch.Tensor, ref_name: str, shape_desc: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {shape_desc}, got {type(x).__name__}")
    if x.shape != ref.shape:
        raise ValueError(f"{name} must have the same shape as {ref_name}: "
                         f"{shape_desc} = {tuple(ref.shape)}, got {tuple(x.shape)}")


def _check_mask(mask, like: Optional[torch.Tensor] = None, like_name: str = "") -> torch.Tensor:
    """Return mask as bool (N, T) after checking its rank, shape and 0/1 values."""
    _check_tensor(mask, "mask", 2, "(N, T)")
    if like is not None and mask.shape != like.shape[:2]:
        raise ValueError(f"mask must have the same shape as {like_name}: (N, T) = "
                         f"{tuple(like.shape[:2])}, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        bad = ~((mask == 0) | (mask == 1))
        if bad.any():
            raise ValueError(f"mask must hold only 0 and 1, got value {mask[bad][0].item()}")
        mask = mask != 0
    return mask


def _check_finite_on(x: torch.Tensor, name: str, mask: Optional[torch.Tensor] = None) -> None:
    """NaN or inf on a real token (or anywhere, without a mask) is an error."""
    bad = ~torch.isfinite(x)
    if mask is not None:
        bad = bad & mask
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must be finite on real tokens, got {x[where].item()} at index {where}")


def _check_mode(mode: str) -> None:
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode must be one of {AGGREGATION_MODES}, got {mode!r}")


def _check_advantages(advantages, like: torch.Tensor, like_name: str,
                      mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-response (N,) or per-token (N, T) advantages, returned as (N, T) like `like`.

    With a mask, they must also be finite on real tokens (and everywhere, when (N,)).
    """
    if not isinstance(advantages, torch.Tensor):
        raise ValueError(f"advantages must be a torch.Tensor of shape (N,) or (N, T), got {type(advantages).__name__}")
    if advantages.dim() == 1:
        if advantages.shape[0] != like.shape[0]:
            raise ValueError(f"advantages of shape (N,) must have N = {like.shape[0]} rows like {like_name}, "
                             f"got {tuple(advantages.shape)}")
        if mask is not None:
            _check_finite_on(advantages, "advantages")
        return advantages[:, None].expand(like.shape)  # (N, T), a view: every token gets A_i
    if advantages.dim() == 2:
        _check_same_shape(advantages, "advantages", like, like_name, "(N, T)")
        if mask is not None:
            _check_finite_on(advantages, "advantages", mask)
        return advantages
    raise ValueError(f"advantages must have shape (N,) or (N, T), got {tuple(advantages.shape)}")


def response_lengths(mask: torch.Tensor) -> torch.Tensor:
    """|o_i| = sum_t mask[i, t]: mask (N, T) -> lengths (N,), as float."""
    mask = _check_mask(mask)
    return mask.sum(dim=-1).to(torch.float32)  # (N,)


# -----------------------------------------------------------------------------
# 1. rewards and group-relative advantages (GRPO [1], Dr. GRPO [2], DAPO [3])

def group_advantages(rewards: torch.Tensor, scale: str = "std", eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantage of each response.

    scale="std"  (GRPO):     A_i = (r_i - mean_j r_j) / (std_j r_j + eps)
    scale="none" (Dr. GRPO): A_i =  r_i - mean_j r_j
    std is Bessel-corrected (divides by G - 1), as verl and TRL compute it,
    and eps is added to the std, outside the square root, as both do.
    A group whose rewards are all equal gets exactly 0. So does G = 1, as in
    TRL; verl instead returns the raw score for a group of one (mean 0, std 1).

    Args: rewards (B, G) finite; scale "std" or "none"; eps > 0 guards the division.
    Returns: advantages (B, G), broadcast later to every token of the response.
    Why: comparing a response with its own group replaces a learned critic.
    """
    _check_tensor(rewards, "rewards", 2, "(B, G)")
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    _check_finite_on(rewards, "rewards")
    rewards = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    B, G = rewards.shape
    if G == 1:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (B, G)
    if scale == "std":
        centred = centred / (rewards.std(dim=1, keepdim=True) + eps)  # (B, G)
    # a mean of equal floats need not round back to them exactly: force the 0
    return torch.where(informative_groups(rewards)[:, None], centred, torch.zeros_like(centred))


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward.

    R(|o|) = 0                                   if |o| <= max_len - cache_len
           = ((max_len - cache_len) - |o|) / cache_len   if max_len - cache_len < |o| <= max_len
           = -1                                  if |o| > max_len

    Args: lengths (N,) response lengths; max_len the generation budget L_max;
          cache_len the soft zone L_cache, 0 < cache_len <= max_len.
    Returns: penalty (N,) float in [-1, 0].
    Why: a ramp, not a cliff, tells a long response it is getting too long.
    """
    _check_tensor(lengths, "lengths", 1, "(N,)")
    if not (isinstance(max_len, int) and max_len > 0):
        raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    if not (isinstance(cache_len, int) and 0 < cache_len <= max_len):
        raise ValueError(f"cache_len must be an int in (0, max_len = {max_len}], got {cache_len!r}")
    _check_finite_on(lengths.to(torch.float32), "lengths")
    if (lengths < 0).any():
        raise ValueError(f"lengths must be >= 0, got {lengths.min().item()}")
    lengths = lengths.to(torch.float32)
    soft_start = max_len - cache_len
    ramp = (soft_start - lengths) / cache_len  # (N,) in [-1, 0) inside the soft zone
    penalty = torch.where(lengths <= soft_start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_len, torch.full_like(lengths, -1.0), penalty)


# -----------------------------------------------------------------------------
# 2. dynamic sampling (DAPO [3])

def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """True where a group's rewards are not all equal (0 < #correct < G for 0/1 rewards).

    Args: rewards (B, G) finite; bool (correct or not) is read as 0/1.
    Returns: keep (B,) bool.
    Why: a group of equal rewards has advantage 0 everywhere and teaches nothing.
    """
    _check_tensor(rewards, "rewards", 2, "(B, G)")
    rewards = rewards.float() if rewards.dtype == torch.bool else rewards
    _check_finite_on(rewards, "rewards")
    return (rewards != rewards[:, :1]).any(dim=1)  # (B,)


def fill_batch(sample_groups: Callable[[], Dict[str, torch.Tensor]], batch_size: int,
               max_rounds: int, filter_key: str = "rewards") -> Tuple[Dict[str, torch.Tensor], Dict[str, int]]:
    """DAPO's dynamic sampling: sample, keep informative groups, until the batch is full.

    Each call of sample_groups() returns a dict of tensors that all share a
    leading dimension b (the groups of that round) and hold groups[filter_key]
    (b, G). Groups for which informative_groups(groups[filter_key]) is True are
    kept; once batch_size groups are kept the surplus is dropped. After
    max_rounds calls it stops and returns what it has, possibly fewer than
    batch_size groups (never raises because the data is too easy or too hard).

    DAPO keeps a group when 0 < #correct < G, so filter on correctness
    (filter_key="correct", a 0/1 or bool tensor). With a shaped reward (say
    the soft overlong penalty added), "rewards" also keeps an all-wrong group
    whose penalties differ, and group normalisation then blows a length
    difference up into full-size credit.

    Returns: (batch, stats). batch has the same keys, leading dimension
    <= batch_size. stats: rounds, groups_seen, groups_informative,
    groups_kept, full (1 if batch_size groups were collected, else 0).
    Why: keeps the number of groups that carry a learning signal constant.
    """
    if not (isinstance(batch_size, int) and batch_size > 0):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if not (isinstance(max_rounds, int) and max_rounds > 0):
        raise ValueError(f"max_rounds must be a positive int, got {max_rounds!r}")
    if not isinstance(filter_key, str):
        raise ValueError(f"filter_key must be a str naming the tensor to filter on, got {filter_key!r}")
    kept, n_kept, n_seen, n_informative, rounds = [], 0, 0, 0, 0
    while n_kept < batch_size and rounds < max_rounds:
        groups = sample_groups()
        rounds += 1
        if not isinstance(groups, dict) or filter_key not in groups:
            raise ValueError(f"sample_groups() must return a dict with key {filter_key!r} (the filter_key), "
                             f"got {type(groups).__name__}"
                             + (f" with keys {sorted(groups)}" if isinstance(groups, dict) else ""))
        keep = informative_groups(groups[filter_key])  # (b,)
        b = keep.shape[0]
        for key, value in groups.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != b:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"sample_groups()[{key!r}] must be a tensor with leading dimension "
                                 f"b = {b} like {filter_key}, got {got}")
        n_seen += b
        n_informative += int(keep.sum())
        take = keep.nonzero().squeeze(1)[: batch_size - n_kept]  # drop the surplus
        if take.numel() > 0:
            kept.append({key: value[take] for key, value in groups.items()})
            n_kept += take.numel()
    if kept:
        batch = {}
        for key in kept[0]:
            parts = [part[key] for part in kept]
            shapes = {tuple(p.shape[1:]) for p in parts}
            if len(shapes) > 1:
                raise ValueError(f"sample_groups()[{key!r}] must keep its trailing shape across rounds, "
                                 f"got {sorted(shapes)}")
            batch[key] = torch.cat(parts, dim=0)
    else:  # nothing informative: empty tensors with the last round's trailing shapes
        batch = {key: value[:0] for key, value in groups.items()}
    stats = dict(rounds=rounds, groups_seen=n_seen, groups_informative=n_informative,
                 groups_kept=n_kept, full=int(n_kept == batch_size))
    return batch, stats


# -----------------------------------------------------------------------------
# 3. per-token quantities

def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log pi(o_t | q, o_<t) of the sampled tokens, computed in float32.

    logp_t = logits[t, o_t] - logsumexp_v logits[t, v]

    Args: logits (N, T, V), any float dtype; targets (N, T) integer token ids in [0, V).
    Returns: logp (N, T) float32.
    Why: bf16 log-softmax loses the small ratio changes that clipping looks at.
    """
    _check_tensor(logits, "logits", 3, "(N, T, V)")
    _check_tensor(targets, "targets", 2, "(N, T)")
    if targets.shape != logits.shape[:2]:
        raise ValueError(f"targets must have the shape of logits' first two dimensions: (N, T) = "
                         f"{tuple(logits.shape[:2])}, got {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must hold integer token ids, got dtype {targets.dtype}")
    V = logits.shape[-1]
    if targets.numel() and (targets.min() < 0 or targets.max() >= V):
        raise ValueError(f"targets must be token ids in [0, V = {V}), got range "
                         f"[{targets.min().item()}, {targets.max().item()}]")
    logits = logits.float()
    picked = logits.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (N, T)
    return picked - torch.logsumexp(logits, dim=-1)  # (N, T)


def masked_entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean per-token entropy of the policy over real tokens.

    H_t = -sum_v p_t(v) log p_t(v);  result = sum_t mask_t H_t / sum_t mask_t

    Args: logits (N, T, V); mask (N, T).
    Returns: scalar float32 tensor (0 when there is no real token).
    Why: DAPO watches entropy collapse (and explosion) as the health signal.
    """
    _check_tensor(logits, "logits", 3, "(N, T, V)")
    mask = _check_mask(mask, logits, "logits' first two dimensions")
    logp = torch.log_softmax(logits.float(), dim=-1)  # (N, T, V)
    entropy = -(logp.exp() * logp).sum(dim=-1)  # (N, T)
    num_tokens = mask.sum().clamp(min=1)
    return torch.where(mask, entropy, torch.zeros_like(entropy)).sum() / num_tokens


def policy_gradient_surrogate(logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Per-token plain policy-gradient (REINFORCE) loss, to be minimised.

    loss_t = -A_t * log pi(o_t | q, o_<t)
    A is the raw reward r (REINFORCE), a group-baselined advantage such as
    r - mean(r) or GRPO's A_i (REINFORCE with a baseline), or per-token
    advantages (CSCR). Its gradient is d loss_t / d logp_t = -A_t at any
    policy: it does not know which policy sampled o_t, so it is the right
    gradient only on-policy (one step per batch of samples).

    Args: logp (N, T) with gradient; advantages (N,) broadcast to every token or (N, T).
    Returns: loss (N, T), not yet masked or averaged.
    Why: credit in its plainest form: A_t times the direction that makes o_t more likely.
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    advantages = _check_advantages(advantages, logp, "logp")  # (N, T)
    return -advantages * logp  # (N, T)


def _ppo_clip(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), elementwise; rho and A (N, T)."""
    unclipped = ratio * advantages  # (N, T)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * advantages  # (N, T)
    return -torch.minimum(unclipped, clipped)


def _check_clip_range(eps_low: float, eps_high: float) -> None:
    if not eps_low >= 0:
        raise ValueError(f"eps_low must be >= 0, got {eps_low}")
    if not eps_high >= 0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      eps_low: float = 0.2, eps_high: float = 0.2) -> torch.Tensor:
    """Per-token PPO-clip loss [5] (to be minimised).

    rho_t = exp(logp_t - old_logp_t)
    loss_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)
    On-policy (rho = 1) its gradient equals policy_gradient_surrogate's, -A_t;
    once rho leaves [1 - eps_low, 1 + eps_high] in the direction A pushes, the
    gradient of that token is 0.

    Args: logp, old_logp (N, T); advantages (N,) broadcast to every token or (N, T)
          per token; eps_low >= 0, eps_high >= 0. GRPO [1] uses one eps for both;
          eps_high > eps_low is DAPO's Clip-Higher [3]. eps_low >= 1 puts the lower
          bound 1 - eps_low at or below 0, which a ratio (always > 0) never reaches:
          the lower clip is off. A large eps_high switches the upper clip off.
    Returns: loss (N, T), not yet masked or averaged.
    Why: the clip stops one batch from moving a token's probability too far.
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    _check_same_shape(old_logp, "old_logp", logp, "logp", "(N, T)")
    _check_clip_range(eps_low, eps_high)
    advantages = _check_advantages(advantages, logp, "logp")  # (N, T)
    ratio = torch.exp(logp - old_logp)  # (N, T)
    return _ppo_clip(ratio, advantages, eps_low, eps_high)  # (N, T)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator [6] of KL(pi_theta || pi_ref) on the sampled tokens.

    KL_t = r - log r - 1, with r = pi_ref / pi_theta and log r = ref_logp - logp

    For o_t sampled from pi_theta, E[KL_t] = KL(pi_theta || pi_ref). The plain
    log-ratio k1 = -log r is unbiased too; k3 adds that every sample is >= 0
    and that its variance is lower. It is unbiased only for samples from
    pi_theta, while GRPO samples from pi_old. Used as a loss term, its gradient
    d KL_t / d logp_t = 1 - r has expectation (under pi_theta) equal to the
    gradient of KL(pi_ref || pi_theta), not of KL(pi_theta || pi_ref).

    Args: logp, ref_logp (N, T).
    Returns: kl (N, T), >= 0 everywhere, 0 where the two agree.
    Why: the per-token KL penalty of GRPO [1], never negative, cheap from sampled tokens alone.
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    _check_same_shape(ref_logp, "ref_logp", logp, "logp", "(N, T)")
    log_ratio = ref_logp - logp  # (N, T)
    return torch.exp(log_ratio) - log_ratio - 1


# -----------------------------------------------------------------------------
# 4. aggregation: who gets credit for a long answer

def _weight_denominators(mask: torch.Tensor, mode: str, group_size: Optional[int],
                         max_len: Optional[float], dtype: torch.dtype) -> torch.Tensor:
    """d_i with w_{i,t} = mask_{i,t} / d_i, from a bool mask (N, T); (N,) in dtype, at least float32."""
    _check_mode(mode)
    N, T = mask.shape
    dtype = torch.promote_types(dtype, torch.float32)  # count lengths exactly: bf16 rounds 1001 to 1000
    lengths = mask.sum(dim=-1).to(dtype)  # |o_i|, (N,)
    if mode == "sample":
        return N * lengths.clamp(min=1)  # (N,) N * |o_i|
    if mode == "token":
        num_target_tokens = lengths.sum().clamp(min=1)  # sum over the batch of |o_j|
        return num_target_tokens.expand(N)  # (N,)
    if mode == "group_token":
        if not (isinstance(group_size, int) and group_size > 0 and N % group_size == 0):
            raise ValueError(f"mode 'group_token' needs group_size, a positive int dividing N = {N}, "
                             f"got {group_size!r}")
        B = N // group_size
        group_tokens = lengths.view(B, group_size).sum(dim=1).clamp(min=1)  # (B,) sum_{j in group} |o_j|
        return B * group_tokens.repeat_interleave(group_size)  # (N,)
    # "constant"
    if isinstance(max_len, bool) or not (isinstance(max_len, (int, float)) and 0 < max_len < math.inf):
        raise ValueError(f"mode 'constant' needs max_len, a positive finite constant (Dr. GRPO: the "
                         f"generation budget), got {max_len!r}")
    return torch.full((N,), float(N * max_len), dtype=dtype, device=mask.device)  # (N,) N * max_len


def token_weights(mask: torch.Tensor, mode: str, group_size: Optional[int] = None,
                  max_len: Optional[float] = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight w_{i,t} each token receives in loss = sum_{i,t} w_{i,t} loss_{i,t}.

    "sample"      GRPO [1]:  w = 1 / (N * |o_i|)          mean in a response, then over responses
    "token"       verl token-mean, TRL dapo/bnpo:  w = 1 / sum_{j in batch} |o_j|
    "group_token" DAPO [3] as written:  w = 1 / (B * sum_{j in group(i)} |o_j|)
    "constant"    Dr. GRPO [2]:  w = 1 / (N * max_len)    a fixed constant, no length in it
    Padding gets weight 0; a response with no real token gets 0 everywhere
    (code that divides by a mask's sum gives NaN there instead).

    Args: mask (N, T); mode as above; group_size G (needed by "group_token",
          must divide N); max_len (needed by "constant"): any positive constant.
          Dr. GRPO uses the generation budget (the most tokens a response may
          have); SFT-style code divides a masked sum by 1.0. Note that
          max_len = T, the padded width, changes with each batch's longest response.
          dtype of the result: lengths are counted in at least float32, cast at the end.
    Returns: weights (N, T). They sum to 1 for "token" and
          "group_token", and for "sample" when no response is empty.
    Why: under "sample" a token of a 100-token answer weighs 10x a token of a 1000-token one.
    """
    _check_mode(mode)
    mask = _check_mask(mask)
    denominator = _weight_denominators(mask, mode, group_size, max_len, dtype)  # (N,)
    return (mask / denominator[:, None]).to(dtype)  # (N, T)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str,
              group_size: Optional[int] = None, max_len: Optional[float] = None) -> torch.Tensor:
    """Reduce a per-token quantity to one scalar: sum_{i,t} w_{i,t} x_{i,t} = sum_i (1/d_i) sum_{t real} x_{i,t}.

    w = mask / d comes from token_weights(mask, mode, ...). Padding values, even
    NaN or inf, change neither the result nor its gradient with respect to
    per_token. Limit: they can still poison the gradient of whatever computed
    per_token (aggregate(exp(x)) with x = inf in padding gives NaN in x's
    gradient), so guard the inputs first, as policy_loss and
    self_distillation_loss do.

    Args: per_token (N, T); mask (N, T); mode, group_size, max_len as in token_weights.
    Returns: scalar tensor.
    Why: the weight w is where GRPO, Dr. GRPO and DAPO's losses differ in aggregation
         (they also differ in advantage scaling, eps_high, reward and KL).
    """
    _check_tensor(per_token, "per_token", 2, "(N, T)")
    mask = _check_mask(mask, per_token, "per_token")
    denominator = _weight_denominators(mask, mode, group_size, max_len, per_token.dtype)  # (N,) d_i
    real = torch.where(mask, per_token, torch.zeros((), dtype=per_token.dtype))  # padding -> exactly 0
    return (real.sum(dim=-1) / denominator).sum().to(per_token.dtype)


def policy_loss(logp: torch.Tensor, old_logp: Optional[torch.Tensor], advantages: torch.Tensor,
                mask: torch.Tensor, mode: str = "sample", eps_low: float = 0.2,
                eps_high: float = 0.2, group_size: Optional[int] = None,
                max_len: Optional[float] = None, ref_logp: Optional[torch.Tensor] = None,
                beta: float = 0.0, surrogate: str = "clip") -> Tuple[torch.Tensor, Dict[str, float]]:
    """The whole policy objective, to be minimised.

    loss = sum_{i,t} w_{i,t} [ surrogate_{i,t} + beta * KL_k3_{i,t} ]
    surrogate = "clip":      -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)   clipped_surrogate
              = "reinforce": -A log pi                                      policy_gradient_surrogate
    with w from token_weights(mask, mode). On-policy (logp == old_logp, rho = 1),
    for either surrogate:
        d loss / d logp_{i,t} = w_{i,t} * ( -A_{i,t} + beta * (1 - pi_ref/pi_theta) )
    which is -w_{i,t} A_{i,t}, credit in gradient form, when beta = 0.

    Args: logp (N, T) with gradient; old_logp (N, T) from the rollout ("reinforce"
          ignores it, and it may be None there); advantages (N,) or (N, T); mask (N, T); mode, group_size,
          max_len as in token_weights; eps_low, eps_high >= 0 the clip range; ref_logp
          (N, T) and beta >= 0 for the KL penalty (needs ref_logp when beta > 0);
          surrogate "clip" or "reinforce".
    Returns: (loss scalar, stats) with stats floats over real tokens: num_tokens; for
          "clip" with old_logp: clip_frac_low (A < 0 and rho < 1 - eps_low),
          clip_frac_high (A > 0 and rho > 1 + eps_high), ratio_mean; kl_mean when beta > 0.
    Why: one place where the surrogate, the credit weights and the KL meet.
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    mask = _check_mask(mask, logp, "logp")
    _check_mode(mode)
    if surrogate not in SURROGATES:
        raise ValueError(f"surrogate must be one of {SURROGATES}, got {surrogate!r}")
    if old_logp is not None or surrogate == "clip":
        _check_same_shape(old_logp, "old_logp", logp, "logp", "(N, T)")
    _check_clip_range(eps_low, eps_high)
    _check_advantages(advantages, mask, "mask")
    per_token_advantages = advantages.dim() == 2
    if not beta >= 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (N, T), got None")
        _check_same_shape(ref_logp, "ref_logp", logp, "logp", "(N, T)")

    # padding becomes exactly 0 before any arithmetic, so garbage there cannot leak into values or gradients
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if per_token_advantages:
        advantages = torch.where(mask, advantages, zero)  # (N, T)
    A = advantages if per_token_advantages else advantages[:, None]  # (N, T) or (N, 1): broadcasts, not copied
    if surrogate == "clip":
        log_ratio = torch.where(mask, logp - old_logp, zero)  # (N, T), 0 on padding, so rho = 1 there
        ratio = torch.exp(log_ratio)  # (N, T), computed once: the loss and the stats share it
        per_token = _ppo_clip(ratio, A, eps_low, eps_high)  # (N, T), clipped_surrogate
        checked = log_ratio  # finite iff logp and old_logp are, on real tokens
    else:
        logp_real = torch.where(mask, logp, zero)  # (N, T)
        per_token = policy_gradient_surrogate(logp_real, advantages)  # (N, T), A broadcast when (N,)
        checked = logp_real
    if beta > 0:
        kl = kl_k3(torch.where(mask, logp, zero), torch.where(mask, ref_logp, zero))  # (N, T), 0 on padding
        per_token = per_token + beta * kl

    # one combined finite check: a sum of finite numbers is finite (unless it overflows);
    # only when it is not do we look for the culprit, to name it
    with torch.no_grad():
        total = checked.sum() + advantages.sum()
        if beta > 0:
            total = total + torch.where(mask, ref_logp, zero).sum()
        if not torch.isfinite(total):
            _check_finite_on(logp, "logp", mask)
            if old_logp is not None:
                _check_finite_on(old_logp, "old_logp", mask)
            _check_finite_on(advantages, "advantages", mask if per_token_advantages else None)
            if beta > 0:
                _check_finite_on(ref_logp, "ref_logp", mask)
            # every input is finite on real tokens: only the check's sum overflowed

    loss = aggregate(per_token, mask, mode, group_size, max_len)

    with torch.no_grad():
        num_tokens = int(torch.count_nonzero(mask))
        denom = max(num_tokens, 1)
        stats = dict(num_tokens=num_tokens)
        if surrogate == "clip":
            # padding has rho = 1 exactly, inside the clip range, so it is never counted as clipped
            low = torch.count_nonzero((ratio < 1 - eps_low) & (A < 0))
            high = torch.count_nonzero((ratio > 1 + eps_high) & (A > 0))
            padding = mask.numel() - num_tokens
            stats.update(clip_frac_low=float(low) / denom, clip_frac_high=float(high) / denom,
                         ratio_mean=(float(ratio.sum()) - padding) / denom)  # drop padding's rho = 1
        if beta > 0:
            stats["kl_mean"] = float(kl.sum()) / denom  # kl is 0 on padding
    return loss, stats


# -----------------------------------------------------------------------------
# 5. CSCR: counterfactual-sensitivity credit reallocation [4] (our reading)

def counterfactual_shifts(logp: torch.Tensor, logp_pos: torch.Tensor, logp_neg: torch.Tensor,
                          mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """How each sampled token's log-prob moves when the outcome is asserted.

    d+_t = log pi(o_t | c+, q, o_<t) - log pi(o_t | q, o_<t)   (c+ asserts "correct")
    d-_t = log pi(o_t | c-, q, o_<t) - log pi(o_t | q, o_<t)   (c- asserts "incorrect")

    Args: logp, logp_pos, logp_neg (N, T): the same fixed trajectories scored
          plainly and under each condition; mask (N, T) optional, zeros padding.
    Returns: (d_pos, d_neg), each (N, T).
    Why: a token whose probability hinges on the asserted outcome is where a privileged teacher would push.
    """
    _check_tensor(logp, "logp", 2, "(N, T)")
    _check_same_shape(logp_pos, "logp_pos", logp, "logp", "(N, T)")
    _check_same_shape(logp_neg, "logp_neg", logp, "logp", "(N, T)")
    d_pos = logp_pos - logp  # (N, T)
    d_neg = logp_neg - logp  # (N, T)
    if mask is not None:
        mask = _check_mask(mask, logp, "logp")
        d_pos = torch.where(mask, d_pos, torch.zeros_like(d_pos))
        d_neg = torch.where(mask, d_neg, torch.zeros_like(d_neg))
    return d_pos, d_neg


def counterfactual_sensitivity(d_pos: torch.Tensor, d_neg: torch.Tensor) -> torch.Tensor:
    """s_t = max(|d+_t|, |d-_t|): OUR reading of CSCR's token sensitivity, not the paper's rule.

    It scores a token that both assertions push the same way (a shift that is
    not about the outcome) exactly as it scores one they push in opposite
    directions (the outcome-relevant kind). Splitting each shift into a common
    part c = (d+ + d-)/2 and a differential part e = (d+ - d-)/2 (so d+ = c + e,
    d- = c - e) separates the two; shift_diagnostics reports both.

    Args: d_pos, d_neg (N, T) from counterfactual_shifts.
    Returns: sensitivity (N, T) >= 0.
    Why: CSCR downweights tokens whose probability moves a lot under a privileged assertion.
    """
    _check_tensor(d_pos, "d_pos", 2, "(N, T)")
    _check_same_shape(d_neg, "d_neg", d_pos, "d_pos", "(N, T)")
    return torch.maximum(d_pos.abs(), d_neg.abs())  # (N, T)


def cscr_weights(sensitivity: torch.Tensor, mask: torch.Tensor, strength: float,
                 threshold: float = 0.0) -> torch.Tensor:
    """Credit weights that shrink sensitive tokens, renormalised per response.

    w_t = exp(-strength * max(0, s_t - threshold))
    w~_t = |o_i| * w_t / sum_{t' real} w_t'        so a response's weights have mean 1
    Padding gets 0; a response with no real token gets zeros (not NaN).
    strength = 0 gives w~ = 1 on every real token: plain GRPO.

    Args: sensitivity (N, T) >= 0; mask (N, T); strength (alpha) >= 0;
          threshold (tau): sensitivity below it is not penalised.
    Returns: weights (N, T) float32, > 0 on real tokens (up to float underflow).
    Why: moves credit away from substitutable surface tokens without changing its total.
    """
    _check_tensor(sensitivity, "sensitivity", 2, "(N, T)")
    mask = _check_mask(mask, sensitivity, "sensitivity")
    if not (math.isfinite(strength) and strength >= 0):
        raise ValueError(f"strength must be a finite number >= 0, got {strength}")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold}")
    _check_finite_on(sensitivity, "sensitivity", mask)
    if (mask & (sensitivity < 0)).any():
        raise ValueError(f"sensitivity must be >= 0 on real tokens, got {sensitivity[mask].min().item()}")
    log_w = -strength * torch.clamp(sensitivity.float() - threshold, min=0)  # (N, T) log of w_t
    log_w = log_w.masked_fill(~mask, float("-inf"))
    log_w = log_w - log_w.amax(dim=-1, keepdim=True)  # the ratio w_t / sum w is unchanged; no underflow to 0/0
    w = torch.exp(log_w)  # (N, T), 1 at the response's least sensitive token, 0 on padding
    lengths = mask.sum(dim=-1, keepdim=True).to(torch.float32)  # (N, 1) |o_i|
    weights = lengths * w / w.sum(dim=-1, keepdim=True)  # (N, T); strength 0 gives |o_i| / |o_i| = 1 exactly
    return torch.where(mask, weights, torch.zeros_like(weights))  # NaN rows (no token) -> 0


def cscr_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-token advantages A_{i,t} = w~_{i,t} * A_i.

    With cscr_weights, sign(A_{i,t}) = sign(A_i) and sum_t A_{i,t} = |o_i| * A_i:
    the verifier's direction and the response's credit budget are kept.

    Args: advantages (N,) from group_advantages(...).flatten(); weights (N, T).
    Returns: per-token advantages (N, T), ready for clipped_surrogate / policy_loss.
    Why: the outcome decides the sign; sensitivity only decides where credit lands.
    """
    _check_tensor(advantages, "advantages", 1, "(N,)")
    _check_tensor(weights, "weights", 2, "(N, T)")
    if weights.shape[0] != advantages.shape[0]:
        raise ValueError(f"weights must have N = {advantages.shape[0]} rows like advantages, "
                         f"got shape {tuple(weights.shape)}")
    if (weights < 0).any():
        raise ValueError(f"weights must be >= 0, got {weights.min().item()}")
    return advantages[:, None] * weights  # (N, T)


# -----------------------------------------------------------------------------
# 6. diagnostics and the self-distillation baseline

def shift_diagnostics(d_pos: torch.Tensor, d_neg: torch.Tensor, mask: torch.Tensor,
                      min_shift: float = 0.0) -> Dict[str, float]:
    """CSCR's diagnosis of privileged shifts, over the affected real tokens.

    affected       = real tokens with max(|d+|, |d-|) >= min_shift (all of them when min_shift = 0)
    same_direction = frac(d+ * d- > 0)   both assertions push the token the same way
    sign_reversal  = frac(d+ * d- < 0)   the assertions disagree, as an outcome signal should
    (tokens where either shift is exactly 0 count in neither)
    mean_abs_pos = mean |d+|, mean_abs_neg = mean |d-|, mean_sensitivity = mean max(|d+|, |d-|)
    mean_abs_common = mean |d+ + d-| / 2          the part both assertions share
    mean_abs_differential = mean |d+ - d-| / 2    the part that depends on which outcome is asserted

    This is our statistic, not the paper's: the paper's 91-96 % figure counts
    "affected" tokens against a baseline from two neutral prefixes, which is
    not computed here. min_shift is our stand-in for "affected"; compare
    fractions with the paper's only as a rough analogue.

    Args: d_pos, d_neg (N, T); mask (N, T); min_shift >= 0, in nats.
    Returns: dict of floats, plus num_tokens (real) and num_affected; means and
          fractions are over affected tokens, 0 when there is none.
    Why: if both assertions move a token alike, its shift is not about the outcome.
    """
    _check_tensor(d_pos, "d_pos", 2, "(N, T)")
    _check_same_shape(d_neg, "d_neg", d_pos, "d_pos", "(N, T)")
    mask = _check_mask(mask, d_pos, "d_pos")
    if not (math.isfinite(min_shift) and min_shift >= 0):
        raise ValueError(f"min_shift must be a finite number >= 0, got {min_shift}")
    sensitivity = torch.maximum(d_pos.abs(), d_neg.abs())  # (N, T)
    affected = mask & (sensitivity >= min_shift)  # (N, T)
    num_affected = affected.sum()
    denom = num_affected.clamp(min=1).to(torch.float32)
    product = d_pos * d_neg  # (N, T)
    zero = torch.zeros((), dtype=d_pos.dtype)

    def mean_over_affected(x: torch.Tensor) -> float:
        return float(torch.where(affected, x, zero).sum() / denom)

    return dict(same_direction=float((affected & (product > 0)).sum() / denom),
                sign_reversal=float((affected & (product < 0)).sum() / denom),
                mean_abs_pos=mean_over_affected(d_pos.abs()), mean_abs_neg=mean_over_affected(d_neg.abs()),
                mean_sensitivity=mean_over_affected(sensitivity),
                mean_abs_common=mean_over_affected((d_pos + d_neg).abs() / 2),
                mean_abs_differential=mean_over_affected((d_pos - d_neg).abs() / 2),
                num_tokens=int(mask.sum()), num_affected=int(num_affected))


def self_distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                           mask: torch.Tensor, mode: str = "token", group_size: Optional[int] = None,
                           max_len: Optional[int] = None) -> torch.Tensor:
    """On-policy self-distillation (OPSD), the baseline CSCR compares with.

    KL_t = KL(p_T || p_S) = sum_v p_T(v) (log p_T(v) - log p_S(v)), per token
    loss = sum_{i,t} w_{i,t} KL_t with w from token_weights(mask, mode)
    p_T is the teacher (the same model given privileged context; no gradient
    flows into it), p_S the student (the policy). The direction, KL(teacher ||
    student), is OUR choice: "KL from the teacher to the policy" is read both
    ways, and many OPSD setups use KL(student || teacher).
    Padding logits, even NaN or inf, reach neither the loss nor any gradient.

    Args: student_logits, teacher_logits (N, T, V) at the same response tokens; mask (N, T);
          mode, group_size, max_len as in token_weights.
    Returns: scalar loss.
    Why: the dense per-token signal that CSCR argues is not reliably aligned with the answer.
    """
    _check_tensor(student_logits, "student_logits", 3, "(N, T, V)")
    _check_same_shape(teacher_logits, "teacher_logits", student_logits, "student_logits", "(N, T, V)")
    mask = _check_mask(mask, student_logits, "student_logits' first two dimensions")
    real = mask[:, :, None]  # (N, T, 1): padding logits -> 0 before log_softmax, as in policy_loss
    zero = torch.zeros((), dtype=student_logits.dtype, device=student_logits.device)
    teacher_logp = torch.log_softmax(torch.where(real, teacher_logits.detach(), zero).float(), dim=-1)  # (N, T, V)
    student_logp = torch.log_softmax(torch.where(real, student_logits, zero).float(), dim=-1)  # (N, T, V)
    kl = (teacher_logp.exp() * (teacher_logp - student_logp)).sum(dim=-1)  # (N, T)
    return aggregate(kl, mask, mode, group_size, max_len)


# -----------------------------------------------------------------------------
# speed check: python tokencredit.py

def _benchmark(N: int = 256, T: int = 4096, repeats: int = 15) -> None:
    """Time policy_loss forward + backward against the bare formula, alternating the two.

    The bare formula is the same loss written without checks or stats:
    -min(rho A, clip(rho) A), masked and averaged over real tokens ("token" mode).
    """
    import statistics
    import time
    torch.manual_seed(0)
    lengths = torch.randint(1, T + 1, (N,))
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (N, T)
    logp = (-torch.rand(N, T) * 3).requires_grad_()
    old_logp = logp.detach() + 0.1 * torch.randn(N, T)
    advantages = torch.randn(N)

    def run_policy_loss():
        logp.grad = None
        loss, _ = policy_loss(logp, old_logp, advantages, mask, mode="token")
        loss.backward()

    mask_float = mask.float()  # prepared once, outside the timing: the bare formula's best case

    def run_bare_formula():
        logp.grad = None
        ratio = torch.exp(logp - old_logp)  # (N, T)
        A = advantages[:, None]  # (N, 1)
        per_token = -torch.minimum(ratio * A, torch.clamp(ratio, 0.8, 1.2) * A)  # (N, T)
        ((per_token * mask_float).sum() / mask_float.sum()).backward()

    def seconds(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    run_policy_loss(), run_bare_formula()  # warm-up
    ours, bare = [], []
    for _ in range(repeats):  # alternate, so that a busy moment slows both alike
        ours.append(seconds(run_policy_loss))
        bare.append(seconds(run_bare_formula))
    t_ours, t_bare = statistics.median(ours), statistics.median(bare)
    print(f"N={N} T={T} threads={torch.get_num_threads()}: policy_loss fwd+bwd {t_ours * 1e3:.1f} ms, "
          f"bare formula fwd+bwd {t_bare * 1e3:.1f} ms, ratio {t_ours / t_bare:.2f}x "
          f"(median of {repeats}, alternating)")


if __name__ == "__main__":
    _benchmark()
