"""The translation table, tested: verl, TRL and CS336 code next to the tokencredit call that matches it.

Each row of docs/translation.md maps a piece of another library's code to a tokencredit call and
says when the two compute the same number. Here each "their side" is a plain function written
from the upstream source as it reads (a loop where that is the obvious reading), with all of its
factors, and cited by version, file and function. Each test compares it with the tokencredit call,
and where the row names a condition, the test shows the case that breaks it too.

Versions read: verl 0.8.0.dev at commit b178a3cd5, TRL 1.16.0, and the helper interfaces of
Stanford CS336 (Spring 2025) assignment 5.

The data is chosen so that plausible wrong formulas give other numbers: unequal lengths, an empty
response, advantages of both signs, a padded width that is neither the generation budget nor the
longest response, off-policy ratios on both sides of the clip, and eps large enough to matter.
"""

import math
from collections import defaultdict

import pytest
import torch

import tokencredit as tc

F64 = torch.float64


# -----------------------------------------------------------------------------
# shared helpers

def right_padded(lengths, width):
    """mask (N, width): row i holds lengths[i] real tokens, then padding."""
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def make_batch(lengths, width, seed, spread=0.4):
    """x (a per-token loss), logp, old_logp (N, T) float64 and A (N,), with A of both signs.

    logp - old_logp ~ spread * N(0, 1): with spread 0.4 the ratios fall on both sides of a 0.2 clip.
    """
    g = torch.Generator().manual_seed(seed)
    N = len(lengths)
    x = torch.randn(N, width, generator=g, dtype=F64)
    old = -0.05 - 2 * torch.rand(N, width, generator=g, dtype=F64)
    logp = old + spread * torch.randn(N, width, generator=g, dtype=F64)
    A = torch.randn(N, generator=g, dtype=F64)
    A[0], A[1] = A[0].abs() + 0.5, -A[1].abs() - 0.5
    return x, logp, old, A, right_padded(lengths, width)


def same(ours, theirs, rtol=1e-5, atol=1e-7):
    """Equal at float32 precision (tokencredit may compute in float32)."""
    ours, theirs = (torch.as_tensor(v).detach().to(F64) for v in (ours, theirs))
    if ours.numel() == theirs.numel() == 1:  # a scalar either way
        ours, theirs = ours.reshape(()), theirs.reshape(())
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)


def differ(ours, theirs, rel=1e-3):
    a, b = float(ours), float(theirs)
    assert abs(a - b) > rel * max(abs(a), abs(b)), f"expected different numbers, got {a} and {b}"


def value_and_grad(loss_of_logp, logp):
    """(loss, d loss / d logp) of a loss written as a function of logp."""
    logp = logp.detach().clone().requires_grad_(True)
    loss = loss_of_logp(logp)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def same_value_and_grad(ours_of_logp, theirs_of_logp, logp):
    ours, theirs = value_and_grad(ours_of_logp, logp), value_and_grad(theirs_of_logp, logp)
    same(ours[0], theirs[0])
    same(ours[1], theirs[1])


def gspo_batch(lengths, seed):
    """Off-policy data at GSPO's scale: each response's mean log-ratio in [-1e-3, 1e-3], so that with
    GSPO's clip range [1 - 3e-4, 1 + 4e-4] some sequence ratios are clipped and some are not."""
    g = torch.Generator().manual_seed(seed)
    N, T = len(lengths), max(lengths) + 2
    mask = right_padded(lengths, T)
    old = -0.05 - 2 * torch.rand(N, T, generator=g, dtype=F64)
    row_shift = torch.tensor([1e-3, -5e-4, 1e-4, 1e-3, -2e-4, -6e-4, -8e-4, 3e-5][:N], dtype=F64)
    logp = old + row_shift[:, None] + 2e-4 * torch.randn(N, T, generator=g, dtype=F64)
    A = torch.tensor([1.0, -0.7, 0.4, -1.2, 0.9, 0.8, -0.3, 1.1][:N], dtype=F64)
    return logp, old, A, mask


def sequence_ratio(logp, old, mask):
    """exp(mean log-ratio) of each response, computed once for the data checks."""
    m = mask.to(F64)
    return torch.exp(((logp - old) * m).sum(-1) / m.sum(-1).clamp(min=1))


GSPO_EPS_LOW, GSPO_EPS_HIGH = 3e-4, 4e-4


def check_gspo_data_clips_both_ways(logp, old, A, mask):
    s = sequence_ratio(logp, old, mask)
    real = mask.any(-1)
    clipped = real & (((s > 1 + GSPO_EPS_HIGH) & (A > 0)) | ((s < 1 - GSPO_EPS_LOW) & (A < 0)))
    assert clipped.any() and (real & ~clipped).any(), "the data must clip some responses and not others"


# =============================================================================
# verl 0.8.0.dev (commit b178a3cd5)
# =============================================================================

def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None,
                  global_batch_size=None, loss_scale_factor=None):
    """verl 0.8.0.dev verl/trainer/ppo/core_algos.py agg_loss, one response at a time."""
    rows = range(loss_mat.shape[0])
    seq_sum = [(loss_mat[i] * loss_mask[i]).sum() for i in rows]  # token-sum of each response
    seq_len = [loss_mask[i].sum() for i in rows]
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = sum(seq_len)
        return sum(seq_sum) / batch_num_tokens * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        if loss_agg_mode == "seq-mean-token-mean":
            seq_loss = [s / (n + 1e-8) for s, n in zip(seq_sum, seq_len)]
        else:
            seq_loss = seq_sum
        kept = [bool(n > 0) for n in seq_len]  # fully masked responses are left out of the sum ...
        if global_batch_size is None:
            global_batch_size = sum(kept)  # ... and, by default, out of the count
        return sum(l for l, k in zip(seq_loss, kept) if k) / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None:
            loss_scale_factor = loss_mask.shape[-1]  # the mask's width, rollout.response_length
        return sum(seq_sum) / loss_scale_factor
    raise ValueError(loss_agg_mode)


def verl_legacy_worker_loss(loss_mat, mask, loss_agg_mode, micro_batch_rows, dp=1):
    """The loss one optimizer step of verl's default worker backpropagates, for one mini-batch.

    verl/workers/actor/dp_actor.py DataParallelPPOActor.update_policy (trainer.use_legacy_worker_impl
    "auto", the default; use_dynamic_bsz False): each of the dp processes splits its share of the
    mini-batch into micro-batches of ppo_micro_batch_size_per_gpu rows; each calls agg_loss with its
    defaults (config.global_batch_info is never filled on this path) and backpropagates
    loss * (1 / gradient_accumulation); FSDP averages the gradients over the dp processes.
    """
    N = mask.shape[0]
    share = N // dp
    gradient_accumulation = share // micro_batch_rows  # ppo_mini_batch_size // ppo_micro_batch_size_per_gpu
    total = 0.0
    for p in range(dp):
        for start in range(p * share, (p + 1) * share, micro_batch_rows):
            micro = slice(start, start + micro_batch_rows)
            total = total + verl_agg_loss(loss_mat[micro], mask[micro], loss_agg_mode) * (1 / gradient_accumulation)
    return total / dp


def verl_new_engine_loss(loss_mat, mask, loss_agg_mode, micro_batch_rows, dp=1, loss_scale_factor=None):
    """The same for verl's new engine (trainer.use_legacy_worker_impl "disable").

    verl/workers/engine/fsdp/transformer_impl.py forward_backward_batch: batch_num_tokens = the
    mini-batch's real tokens summed over the dp processes; verl/trainer/ppo/ray_trainer.py
    _update_actor: global_batch_size = ppo_mini_batch_size * rollout.n, every response of the
    mini-batch, empty or not; verl/workers/utils/losses.py ppo_loss passes them, dp_size and
    actor.loss_scale_factor to agg_loss; each micro-batch's loss is backpropagated as it is; FSDP
    averages the gradients over the dp processes.
    """
    N = mask.shape[0]
    share = N // dp
    total = 0.0
    for p in range(dp):
        for start in range(p * share, (p + 1) * share, micro_batch_rows):
            micro = slice(start, start + micro_batch_rows)
            total = total + verl_agg_loss(loss_mat[micro], mask[micro], loss_agg_mode, dp_size=dp,
                                          batch_num_tokens=mask.sum(), global_batch_size=N,
                                          loss_scale_factor=loss_scale_factor)
    return total / dp


# One mini-batch of 8 responses padded, as verl's agent loop pads them, to rollout.response_length
# = 16, the longest being 14 tokens; row 2 is empty. Micro-batches of rows 0-3 and 4-7 hold 21 and
# 29 tokens, so a mean of micro-batch means is not the batch's mean.
VERL_RESPONSE_LENGTH = 16
VERL_LENGTHS = [11, 3, 0, 7, 9, 1, 5, 14]


def verl_batch():
    x, _, _, _, mask = make_batch(VERL_LENGTHS, VERL_RESPONSE_LENGTH, seed=11)
    return x, mask


def non_empty(x, mask):
    keep = mask.any(dim=-1)
    return x[keep], mask[keep]


# (mode, tokencredit call) exact for one micro-batch on one process under the default worker
VERL_ONE_MICRO_BATCH = [
    ("token-mean", lambda x, m: tc.aggregate(x, m, "token")),
    ("seq-mean-token-mean", lambda x, m: tc.aggregate(*non_empty(x, m), "sample")),
    ("seq-mean-token-sum", lambda x, m: tc.aggregate(*non_empty(x, m), "constant", max_len=1.0)),
    ("seq-mean-token-sum-norm",
     lambda x, m: tc.aggregate(x, m, "constant", max_len=VERL_RESPONSE_LENGTH / m.shape[0])),
]


@pytest.mark.parametrize("mode, ours", VERL_ONE_MICRO_BATCH, ids=[r[0] for r in VERL_ONE_MICRO_BATCH])
def test_verl_loss_agg_mode_one_micro_batch(mode, ours):
    x, mask = verl_batch()
    same(ours(x, mask), verl_legacy_worker_loss(x, mask, mode, micro_batch_rows=8))


def test_verl_seq_mean_modes_drop_empty_responses_in_the_default_worker():
    x, mask = verl_batch()
    keep = mask.any(-1)
    N, kept = mask.shape[0], int(keep.sum())
    theirs = verl_legacy_worker_loss(x, mask, "seq-mean-token-mean", micro_batch_rows=8)
    # aggregate(x, mask, "sample") divides by all N responses, verl by the non-empty ones
    same(tc.aggregate(x, mask, "sample") * N / kept, theirs)
    differ(tc.aggregate(x, mask, "sample"), theirs)


def test_verl_seq_mean_token_sum_norm_divides_by_the_response_length_not_the_longest_response():
    x, mask = verl_batch()
    N = mask.shape[0]
    longest = int(mask.sum(-1).max())
    assert longest < VERL_RESPONSE_LENGTH == mask.shape[-1]
    theirs = verl_legacy_worker_loss(x, mask, "seq-mean-token-sum-norm", micro_batch_rows=8)
    same(tc.aggregate(x, mask, "constant", max_len=VERL_RESPONSE_LENGTH / N), theirs)
    differ(tc.aggregate(x, mask, "constant", max_len=longest / N), theirs)


# (worker, mode, micro-batch rows, dp processes, tokencredit call): exact with gradient
# accumulation (8 rows / dp / micro rows micro-batches per process) and processes
VERL_ACCUMULATED = [
    ("new engine", "token-mean", 2, 2, lambda x, m: tc.aggregate(x, m, "token")),
    ("new engine", "seq-mean-token-mean", 2, 2, lambda x, m: tc.aggregate(x, m, "sample")),
    ("new engine", "seq-mean-token-sum", 2, 2, lambda x, m: tc.aggregate(x, m, "constant", max_len=1.0)),
    # no dp_size factor in this branch: the gradient average over dp processes divides by dp
    ("new engine", "seq-mean-token-sum-norm", 2, 2,
     lambda x, m: tc.aggregate(x, m, "constant", max_len=VERL_RESPONSE_LENGTH * 2 / m.shape[0])),
    # sum / (L * gradient_accumulation * dp): max_len = L / (rows per micro-batch)
    ("default worker", "seq-mean-token-sum-norm", 2, 2,
     lambda x, m: tc.aggregate(x, m, "constant", max_len=VERL_RESPONSE_LENGTH / 2)),
    # the mean over micro-batches of each micro-batch's own token mean
    ("default worker", "token-mean", 4, 1,
     lambda x, m: (tc.aggregate(x[:4], m[:4], "token") + tc.aggregate(x[4:], m[4:], "token")) / 2),
    ("default worker", "seq-mean-token-mean", 4, 1,
     lambda x, m: (tc.aggregate(*non_empty(x[:4], m[:4]), "sample")
                   + tc.aggregate(*non_empty(x[4:], m[4:]), "sample")) / 2),
]


@pytest.mark.parametrize("worker, mode, micro_rows, dp, ours", VERL_ACCUMULATED,
                         ids=[f"{r[0]}-{r[1]}-micro{r[2]}-dp{r[3]}" for r in VERL_ACCUMULATED])
def test_verl_loss_agg_mode_with_gradient_accumulation_and_processes(worker, mode, micro_rows, dp, ours):
    x, mask = verl_batch()
    run = verl_new_engine_loss if worker == "new engine" else verl_legacy_worker_loss
    kwargs = dict(loss_scale_factor=VERL_RESPONSE_LENGTH) if worker == "new engine" else {}
    same(ours(x, mask), run(x, mask, mode, micro_batch_rows=micro_rows, dp=dp, **kwargs))


def test_verl_default_worker_under_gradient_accumulation_is_not_one_batch_mean():
    x, mask = verl_batch()
    token_mean = verl_legacy_worker_loss(x, mask, "token-mean", micro_batch_rows=4)
    differ(tc.aggregate(x, mask, "token"), token_mean)
    seq_mean = verl_legacy_worker_loss(x, mask, "seq-mean-token-mean", micro_batch_rows=4)
    differ(tc.aggregate(x, mask, "sample"), seq_mean)
    # the new engine, same micro-batches: the mini-batch's own mean
    same(tc.aggregate(x, mask, "token"), verl_new_engine_loss(x, mask, "token-mean", micro_batch_rows=4))


# --- advantages

def verl_grpo_outcome_advantage(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl 0.8.0.dev core_algos.py compute_grpo_outcome_advantage, on the scores
    (token_level_rewards.sum(-1)); verl then multiplies each by the response mask."""
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx], id2std[idx] = torch.mean(torch.stack(group)), torch.std(torch.stack(group))
    out = scores.clone()
    for i in range(len(scores)):
        if norm_adv_by_std_in_grpo:
            out[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        else:
            out[i] = scores[i] - id2mean[index[i]]
    return out


def verl_rloo_outcome_advantage(scores, index):
    """verl 0.8.0.dev core_algos.py compute_rloo_outcome_advantage, on the scores."""
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    id2mean = {idx: (torch.tensor(0.0) if len(g) == 1 else torch.mean(torch.stack(g))) for idx, g in id2score.items()}
    out = scores.clone()
    for i in range(len(scores)):
        n = len(id2score[index[i]])
        if n > 1:
            out[i] = scores[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
    return out


# 3 prompts x 4 responses, float32 as verl's rewards: a 0/1 group, a shaped group, an all-equal group
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.25, -0.5, 1.0, 0.75], [1.0, 1.0, 1.0, 1.0]])


@pytest.mark.parametrize("epsilon", [1e-6, 0.1], ids=["eps1e-6", "eps0.1"])  # 0.1: eps inside the sqrt would show
@pytest.mark.parametrize("norm_adv_by_std_in_grpo, scale", [(True, "std"), (False, "none")])
def test_verl_grpo_advantage(norm_adv_by_std_in_grpo, scale, epsilon):
    B, G = REWARDS.shape
    index = [b for b in range(B) for _ in range(G)]  # verl's uid: responses to one prompt share it
    theirs = verl_grpo_outcome_advantage(REWARDS.flatten(), index, epsilon, norm_adv_by_std_in_grpo)
    same(tc.group_advantages(REWARDS, scale=scale, eps=epsilon).flatten(), theirs)


def test_verl_grpo_advantage_where_it_differs():
    # a group of one: verl divides the raw score by 1 + eps; tokencredit gives 0
    r = torch.tensor([[0.7]])
    same(verl_grpo_outcome_advantage(r.flatten(), [0]), 0.7 / (1 + 1e-6))
    assert tc.group_advantages(r).item() == 0.0
    # all-equal float32 rewards whose mean rounds: verl divides the rounding error by 1e-6
    r = torch.full((1, 8), 0.1)
    theirs = verl_grpo_outcome_advantage(r.flatten(), [0] * 8)
    assert theirs.abs().max() > 1e-3
    assert (tc.group_advantages(r) == 0).all()


def test_verl_rloo_advantage():
    B, G = REWARDS.shape
    index = [b for b in range(B) for _ in range(G)]
    theirs = verl_rloo_outcome_advantage(REWARDS.flatten(), index)
    same(tc.group_advantages(REWARDS, scale="none", baseline="leave_one_out").flatten(), theirs)
    # a group of one: verl keeps the raw score, tokencredit gives 0
    same(verl_rloo_outcome_advantage(torch.tensor([0.7]), [0]), 0.7)
    assert tc.group_advantages(torch.tensor([[0.7]]), scale="none", baseline="leave_one_out").item() == 0.0


def verl_group_mean_std(scores, group_of, eps=1e-6):
    """verl 0.8.0.dev verl/utils/groupwise.py group_mean_std, one group at a time: {group: (mean,
    std)}, in float32. The variance comes from one pass over the sums (sum of squares minus the
    squared sum over the count, over count - 1), floored at eps before the square root; a group
    of one gets mean 0 and std 1."""
    scores = scores.to(torch.float32)
    stats = {}
    for g in set(group_of):
        members = [scores[i] for i in range(len(scores)) if group_of[i] == g]
        n = float(len(members))
        s1, s2 = torch.zeros(()), torch.zeros(())
        for x in members:
            s1, s2 = s1 + x, s2 + x * x
        var = (s2 - s1 * s1 / max(n, 1.0)) / max(n - 1.0, 1.0)
        if n <= 1:
            stats[g] = (torch.tensor(0.0), torch.tensor(1.0))
        else:
            stats[g] = (s1 / n, torch.sqrt(torch.clamp(var, min=eps)))
    return stats


def verl_grpo_vectorized_advantage(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl 0.8.0.dev core_algos.py compute_grpo_vectorized_outcome_advantage, on the scores. The
    trainer (ray_trainer.py compute_advantage) calls it with neither epsilon nor
    norm_adv_by_std_in_grpo, so their defaults hold there."""
    stats = verl_group_mean_std(scores, index, eps=epsilon)
    out = torch.empty(len(scores))
    for i in range(len(scores)):
        mean, std = stats[index[i]]
        centred = scores[i].to(torch.float32) - mean
        out[i] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
    return out


def verl_rloo_vectorized_advantage(scores, index):
    """verl 0.8.0.dev core_algos.py compute_rloo_vectorized_outcome_advantage, one response at a
    time: (c r_i - group sum) / max(c - 1, 1) where the group has c > 1 responses, else 0."""
    out = torch.empty_like(scores)
    for i in range(len(scores)):
        group = [scores[j] for j in range(len(scores)) if index[j] == index[i]]
        c = len(group)
        out[i] = (c * scores[i] - sum(group)) / max(c - 1, 1) if c > 1 else 0.0
    return out


@pytest.mark.parametrize("epsilon", [1e-6, 0.1], ids=["eps1e-6", "eps0.1"])
def test_verl_grpo_vectorized_advantage(epsilon):
    # REWARDS' two informative groups have variances 1/3 and 0.44, above either eps: exact
    B, G = REWARDS.shape
    index = [b for b in range(B) for _ in range(G)]
    theirs = verl_grpo_vectorized_advantage(REWARDS.flatten(), index, epsilon)
    same(tc.group_advantages(REWARDS, scale="std", eps=epsilon).flatten(), theirs)


def test_verl_grpo_vectorized_advantage_where_it_differs():
    # a group of one: r / (1 + eps), like the loop; tokencredit gives 0
    r = torch.tensor([[0.7]])
    same(verl_grpo_vectorized_advantage(r.flatten(), [0]), 0.7 / (1 + 1e-6))
    same(verl_grpo_outcome_advantage(r.flatten(), [0]), 0.7 / (1 + 1e-6))
    assert tc.group_advantages(r).item() == 0.0
    # eight equal float32 rewards of 0.1: the mean rounds. The loop divides that rounding error
    # by eps (plus a std of rounding error), the variance floor divides it by sqrt(eps) + eps
    r = torch.full((1, 8), 0.1)
    loop = verl_grpo_outcome_advantage(r.flatten(), [0] * 8)
    vectorized = verl_grpo_vectorized_advantage(r.flatten(), [0] * 8)
    assert torch.allclose(loop, torch.full((8,), -0.0074), rtol=0.01)
    assert torch.allclose(vectorized, torch.full((8,), -7.4e-6), rtol=0.01)
    assert (tc.group_advantages(r) == 0).all()
    # a spread group whose variance is under eps: floored, so not its own std
    r = torch.tensor([[0.5, 0.5001, 0.5, 0.5001]])  # variance 3.3e-9 < 1e-6
    ours = tc.group_advantages(r).flatten()
    vectorized = verl_grpo_vectorized_advantage(r.flatten(), [0] * 4)
    same(ours, verl_grpo_outcome_advantage(r.flatten(), [0] * 4))
    same(vectorized, (r.flatten() - r.mean()) / (math.sqrt(1e-6) + 1e-6), rtol=1e-3)
    assert (ours.abs() > 0.8).all() and (vectorized.abs() < 0.06).all()
    # a large mean against the spread: the one-pass float32 variance loses digits
    r = 1000 + torch.tensor([[0.0, 0.5, 1.0, 0.25]])
    ours = tc.group_advantages(r).flatten()
    same(ours, verl_grpo_outcome_advantage(r.flatten(), [0] * 4))
    differ(verl_grpo_vectorized_advantage(r.flatten(), [0] * 4)[0], ours[0], rel=0.01)


def test_verl_rloo_vectorized_advantage():
    B, G = REWARDS.shape
    index = [b for b in range(B) for _ in range(G)]
    theirs = verl_rloo_vectorized_advantage(REWARDS.flatten(), index)
    same(tc.group_advantages(REWARDS, scale="none", baseline="leave_one_out").flatten(), theirs)
    # a group of one: 0 there as here, where the loop (compute_rloo_outcome_advantage) keeps r
    r = torch.tensor([0.7])
    assert verl_rloo_vectorized_advantage(r, [0]).item() == 0.0
    assert tc.group_advantages(r[None], scale="none", baseline="leave_one_out").item() == 0.0
    same(verl_rloo_outcome_advantage(r, [0]), 0.7)


# --- policy losses

def verl_vanilla_pg_losses(old_log_prob, log_prob, advantages, clip_ratio_low=0.2, clip_ratio_high=0.2,
                           clip_ratio_c=3.0):
    """verl 0.8.0.dev core_algos.py compute_policy_loss_vanilla, the per-token pg_losses before
    agg_loss, one token at a time; advantages (N, T) as verl passes them."""
    out = torch.empty_like(log_prob)
    N, T = log_prob.shape
    for i in range(N):
        for t in range(T):
            log_ratio = min(max(float(log_prob[i, t] - old_log_prob[i, t]), -20.0), 20.0)
            ratio = math.exp(log_ratio)
            a = float(advantages[i, t])
            loss1 = -a * ratio
            loss2 = -a * min(max(ratio, 1 - clip_ratio_low), 1 + clip_ratio_high)
            clip_loss1 = max(loss1, loss2)
            loss3 = -a * clip_ratio_c  # dual clip, applied where the advantage is negative
            out[i, t] = min(loss3, clip_loss1) if a < 0 else clip_loss1
    return out


def test_verl_vanilla_equals_clipped_surrogate_except_dual_clip():
    _, logp, old, A, mask = make_batch([9, 4, 7, 2, 8, 6], 10, seed=12, spread=1.5)  # ratios up to ~e^4
    A_tok = A[:, None].expand_as(logp)
    theirs = verl_vanilla_pg_losses(old, logp, A_tok)
    rho = torch.exp(logp - old)
    ours = tc.clipped_surrogate(tc.importance_ratio(logp, old, mask), A)
    dual = mask & (A_tok < 0) & (rho > 3.0)
    assert dual.any() and (mask & ~dual & (rho > 1.2)).any() and (mask & (rho < 0.8)).any()
    same(ours[mask & ~dual], theirs[mask & ~dual])
    same(theirs[dual], -A_tok[dual] * 3.0)  # verl caps the loss at -A * clip_ratio_c (gradient 0 there)
    same(ours[dual], -A_tok[dual] * rho[dual])  # tokencredit keeps -A * rho
    assert (ours[dual] > theirs[dual]).all()


@pytest.mark.parametrize("loss_agg_mode, mode", [("token-mean", "token"), ("seq-mean-token-mean", "sample")])
def test_verl_vanilla_policy_loss(loss_agg_mode, mode):
    _, logp, old, A, mask = make_batch([9, 4, 7, 2, 8, 6], 10, seed=13)  # no ratio above 3
    assert torch.exp(logp - old)[mask].max() < 3.0
    theirs = verl_agg_loss(verl_vanilla_pg_losses(old, logp, A[:, None].expand_as(logp)), mask, loss_agg_mode)
    same(tc.policy_loss(logp, old, A, mask, mode=mode)[0], theirs)


def verl_low_var_kl(logprob, ref_logprob):
    """verl 0.8.0.dev core_algos.py kl_penalty(..., "low_var_kl"), actor.kl_loss_type's default, per
    token (tensor arithmetic, so that the gradient flows to logprob)."""
    out = torch.empty_like(logprob)
    for i in range(logprob.shape[0]):
        for t in range(logprob.shape[1]):
            kl = torch.clamp(ref_logprob[i, t] - logprob[i, t], -20.0, 20.0)
            out[i, t] = torch.clamp(torch.exp(kl) - kl - 1, -10.0, 10.0)
    return out


def test_verl_low_var_kl_is_k3_clamped_at_10():
    g = torch.Generator().manual_seed(14)
    logp = -3 * torch.rand(6, 10, generator=g, dtype=F64)
    ref = logp + 4 * (2 * torch.rand(6, 10, generator=g, dtype=F64) - 1)  # ref - logp in [-4, 4]
    ours, theirs = tc.kl_k3(logp, ref), verl_low_var_kl(logp, ref)
    small = ours <= 10
    assert small.any() and (~small).any()
    same(ours[small], theirs[small])
    assert (theirs[~small] == 10).all() and (ours[~small] > 10).all()


def test_verl_kl_loss_in_the_policy_loss():
    # default worker, one micro-batch: pg_loss + kl_loss_coef * agg_loss(low_var_kl), both with loss_agg_mode
    _, logp, old, A, mask = make_batch([9, 4, 7, 2, 8, 6], 10, seed=15)
    ref = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(16), dtype=F64)
    kl_loss_coef = 0.05
    assert tc.kl_k3(logp, ref)[mask].max() < 10
    theirs = (verl_agg_loss(verl_vanilla_pg_losses(old, logp, A[:, None].expand_as(logp)), mask, "token-mean")
              + kl_loss_coef * verl_agg_loss(verl_low_var_kl(logp, ref), mask, "token-mean"))
    same(tc.policy_loss(logp, old, A, mask, mode="token", ref_logp=ref, beta=kl_loss_coef)[0], theirs)


def verl_gspo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                   clip_ratio_low, clip_ratio_high, agg=verl_agg_loss):
    """verl 0.8.0.dev core_algos.py compute_policy_loss_gspo, then agg_loss as it calls it: with
    "seq-mean-token-mean" whatever loss_agg_mode says. advantages (N, T). agg(loss_mat, mask, mode):
    one micro-batch's agg_loss by default; each row's losses depend on that row only, so a
    worker's split into micro-batches can be applied to the whole matrix."""
    rows = []
    for i in range(log_prob.shape[0]):
        n = response_mask[i].sum().clamp(min=1)
        seq_log_ratio = ((log_prob[i] - old_log_prob[i]) * response_mask[i]).sum() / n
        # value s_i, gradient that of one token's ratio: sg[log s_i] + log_prob - sg[log_prob], capped at 10
        log_ratio = torch.clamp(seq_log_ratio.detach() + log_prob[i] - log_prob[i].detach(), max=10.0)
        ratio = torch.exp(log_ratio)
        loss1 = -advantages[i] * ratio
        loss2 = -advantages[i] * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
        rows.append(torch.maximum(loss1, loss2))
    return agg(torch.stack(rows), response_mask, "seq-mean-token-mean")


@pytest.mark.parametrize("per_token", [False, True], ids=["A-per-response", "A-per-token"])
def test_verl_gspo(per_token):
    logp, old, A, mask = gspo_batch([9, 4, 7, 2, 8, 6], seed=17)
    check_gspo_data_clips_both_ways(logp, old, A, mask)
    # verl takes advantages (N, T); an estimator other than GRPO's may vary them along a response
    weights = 0.5 + torch.rand(logp.shape, generator=torch.Generator().manual_seed(19), dtype=F64)
    ours_A = A[:, None] * weights if per_token else A
    A_tok = A[:, None] * weights if per_token else A[:, None].expand_as(logp)
    theirs = lambda lp: verl_gspo_loss(old, lp, A_tok, mask, "token-mean", GSPO_EPS_LOW, GSPO_EPS_HIGH)
    levels = ["sequence_token"] if per_token else ["sequence_token", "sequence"]  # the same, with A per response
    for level in levels:
        same_value_and_grad(lambda lp: tc.policy_loss(lp, old, ours_A, mask, mode="sample", eps_low=GSPO_EPS_LOW,
                                                      eps_high=GSPO_EPS_HIGH, ratio_level=level)[0], theirs, logp)


def test_verl_kl_loss_under_gspo_is_aggregated_apart_from_the_policy_term():
    # loss_agg_mode "token-mean" (the default): the gspo policy term is seq-mean-token-mean
    # regardless, the KL term follows loss_agg_mode. Default worker: one micro-batch, one process
    logp, old, A, mask = gspo_batch([9, 4, 7, 2, 8, 6], seed=26)
    check_gspo_data_clips_both_ways(logp, old, A, mask)
    ref = old + 0.6 * torch.randn(old.shape, generator=torch.Generator().manual_seed(27), dtype=F64)
    kl_loss_coef = 0.1  # large enough that the two aggregations of the KL term differ by 1 %
    assert tc.kl_k3(logp, ref)[mask].max() < 10
    A_tok = A[:, None].expand_as(logp)
    clip = dict(eps_low=GSPO_EPS_LOW, eps_high=GSPO_EPS_HIGH)

    def theirs(loss_agg_mode, agg=verl_agg_loss):
        return lambda lp: (
            verl_gspo_loss(old, lp, A_tok, mask, loss_agg_mode, GSPO_EPS_LOW, GSPO_EPS_HIGH, agg)
            + kl_loss_coef * agg(verl_low_var_kl(lp, ref), mask, loss_agg_mode))

    def ours(lp):
        policy = tc.policy_loss(lp, old, A, mask, mode="sample", ratio_level="sequence_token",
                                **clip)[0]
        return policy + kl_loss_coef * tc.aggregate(tc.kl_k3(lp, ref), mask, "token")

    def one_call(lp):  # one aggregation for both terms
        return tc.policy_loss(lp, old, A, mask, mode="sample", ratio_level="sequence_token",
                              ref_logp=ref, beta=kl_loss_coef, **clip)[0]

    same_value_and_grad(ours, theirs("token-mean"), logp)
    v_one, g_one = value_and_grad(one_call, logp)
    v_theirs, g_theirs = value_and_grad(theirs("token-mean"), logp)
    differ(v_one, v_theirs, rel=0.01)
    assert (g_one - g_theirs).abs().max() > 1e-3 * g_theirs.abs().max()
    # with loss_agg_mode "seq-mean-token-mean" both terms share it, and the one call is exact
    same_value_and_grad(one_call, theirs("seq-mean-token-mean"), logp)
    # the new engine (losses.py ppo_loss), 2 processes x 3 micro-batches: the same two terms
    new_engine = lambda mat, m, mode: verl_new_engine_loss(mat, m, mode, micro_batch_rows=1, dp=2)
    same_value_and_grad(ours, theirs("token-mean", new_engine), logp)


def verl_cispo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, clip_ratio_low, clip_ratio_high):
    """verl 0.8.0.dev core_algos.py compute_policy_loss_cispo then agg_loss; advantages (N, T)."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    weight = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high).detach()  # no gradient through the ratio
    return verl_agg_loss(-weight * advantages * log_prob, response_mask, loss_agg_mode)


@pytest.mark.parametrize("loss_agg_mode, mode", [("token-mean", "token"), ("seq-mean-token-mean", "sample")])
def test_verl_cispo(loss_agg_mode, mode):
    _, logp, old, A, mask = make_batch([9, 4, 7, 2, 8, 6], 10, seed=18)
    A_tok = A[:, None].expand_as(logp)

    def ours(lp):
        weight = torch.clamp(tc.importance_ratio(lp, old, mask), 0.8, 1.2).detach()
        return tc.policy_loss(lp, old, A[:, None] * weight, mask, mode=mode, surrogate="reinforce")[0]

    same_value_and_grad(ours, lambda lp: verl_cispo_loss(old, lp, A_tok, mask, loss_agg_mode, 0.2, 0.2), logp)


# =============================================================================
# TRL 1.16.0
# =============================================================================

def trl_per_token_loss(logp, old, A, mask, loss_type, importance_sampling_level="token", epsilon_low=0.2,
                       epsilon_high=0.2, beta=0.0, ref=None, use_bias_correction_kl=True, entropy_mask=None,
                       importance_sampling_ratio=None, phi=None, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05):
    """TRL 1.16.0 trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss, as far as per_token_loss."""
    m = mask.to(F64)
    log_ratio = logp - old
    if importance_sampling_level == "token":
        log_importance_weights = log_ratio  # (N, T)
    else:  # "sequence": the mean log-ratio over the response, gradient through all of it
        log_importance_weights = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0))[:, None]  # (N, 1)
    coef_1 = torch.exp(log_importance_weights)
    adv = A[:, None]
    if beta != 0.0:
        per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
    if loss_type == "cispo":  # epsilon_high is a cap on the ratio here, not 1 + epsilon_high
        per_token_loss = -torch.clamp(coef_1, max=epsilon_high).detach() * adv * logp
    elif loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    elif loss_type == "sapo":
        tau = torch.where(adv > 0, sapo_temperature_pos, sapo_temperature_neg)
        per_token_loss = -torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau * adv
    elif loss_type == "vespo":
        per_token_loss = -phi * adv * logp
    else:
        raise ValueError(loss_type)
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask
    if importance_sampling_ratio is not None:  # use_vllm with vllm_importance_sampling_correction (not vespo)
        per_token_loss = per_token_loss * importance_sampling_ratio
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    return per_token_loss


def trl_normalise(per_token_loss, mask, loss_type, current_gradient_accumulation_steps, num_items_in_batch,
                  num_processes, steps_per_generation, max_completion_length):
    """TRL 1.16.0 GRPOTrainer._compute_loss: from per_token_loss to one micro-batch's loss, in train mode."""
    m = mask.to(F64)
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token_loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
        return loss / current_gradient_accumulation_steps
    if loss_type == "bnpo":
        return (per_token_loss * m).sum() / m.sum().clamp(min=1.0) / current_gradient_accumulation_steps
    if loss_type == "dr_grpo":
        loss = (per_token_loss * m).sum() / (per_token_loss.size(0) * max_completion_length)
        return loss / current_gradient_accumulation_steps
    if loss_type in ("cispo", "dapo", "vespo"):
        normalizer = num_items_in_batch.clamp(min=1.0) / num_processes
        normalizer = normalizer * current_gradient_accumulation_steps / steps_per_generation
        return (per_token_loss * m).sum() / normalizer
    if loss_type == "luspo":
        return (per_token_loss * m).sum(-1).mean() / current_gradient_accumulation_steps
    raise ValueError(loss_type)


def trl_optimizer_step_loss(logp, old, A, mask, loss_type, num_processes=1, gradient_accumulation_steps=1,
                            steps_per_generation=1, window=0, max_completion_length=None, **per_token_kwargs):
    """The loss whose gradient one TRL optimizer step applies, for one generation batch (all rows).

    The rows are split evenly over the processes; each process splits its share into
    steps_per_generation micro-batches (GRPOTrainer._prepare_inputs) and one optimizer step runs
    gradient_accumulation_steps of them (the `window`-th group), each backpropagating _compute_loss
    as it is (GRPOTrainer.loss_is_scaled_for_ga = True: the HF Trainer does not divide again);
    DDP averages the gradients over the processes. num_items_in_batch counts the real tokens of the
    whole generation batch on all processes (_generate_and_score_completions).
    """
    N = mask.shape[0]
    share = N // num_processes
    rows_per_micro = share // steps_per_generation
    num_items_in_batch = mask.sum().to(F64)
    total = 0.0
    for p in range(num_processes):
        for k in range(window * gradient_accumulation_steps, (window + 1) * gradient_accumulation_steps):
            rows = slice(p * share + k * rows_per_micro, p * share + (k + 1) * rows_per_micro)
            per_token = trl_per_token_loss(logp[rows], old[rows], A[rows], mask[rows], loss_type,
                                           **{key: (v[rows] if torch.is_tensor(v) else v)
                                              for key, v in per_token_kwargs.items()})
            total = total + trl_normalise(per_token, mask[rows], loss_type, gradient_accumulation_steps,
                                          num_items_in_batch, num_processes, steps_per_generation,
                                          max_completion_length)
    return total / num_processes


# One generation batch of 8 completions, padded to the longest (9 tokens); max_completion_length 12;
# row 2 is empty (TRL clamps each length to 1, so it contributes 0).
TRL_LENGTHS = [9, 2, 0, 6, 4, 9, 1, 7]
TRL_MAX_COMPLETION_LENGTH = 12


def trl_batch(seed=21, spread=0.4):
    _, logp, old, A, mask = make_batch(TRL_LENGTHS, max(TRL_LENGTHS), seed, spread)
    return logp, old, A, mask


# (loss_type, processes, gradient accumulation, steps_per_generation, policy_loss keywords)
TRL_EXACT = [
    ("grpo", 2, 2, 2, dict(mode="sample")),  # exact for any accumulation and processes
    ("dr_grpo", 2, 2, 2, dict(mode="constant", max_len=TRL_MAX_COMPLETION_LENGTH)),  # likewise
    ("dapo", 2, 2, 2, dict(mode="token")),  # exact when gradient accumulation == steps_per_generation
    ("dapo", 1, 1, 1, dict(mode="token")),
    ("bnpo", 1, 1, 1, dict(mode="token")),  # exact for one micro-batch on one process only
]


@pytest.mark.parametrize("loss_type, P, GA, S, kwargs", TRL_EXACT,
                         ids=[f"{r[0]}-P{r[1]}-GA{r[2]}-S{r[3]}" for r in TRL_EXACT])
def test_trl_loss_type(loss_type, P, GA, S, kwargs):
    logp, old, A, mask = trl_batch()
    same_value_and_grad(
        lambda lp: tc.policy_loss(lp, old, A, mask, **kwargs)[0],
        lambda lp: trl_optimizer_step_loss(lp, old, A, mask, loss_type, num_processes=P, gradient_accumulation_steps=GA,
                                           steps_per_generation=S, max_completion_length=TRL_MAX_COMPLETION_LENGTH),
        logp)


def test_trl_bnpo_under_gradient_accumulation_is_a_mean_of_micro_batch_means():
    logp, old, A, mask = trl_batch()
    theirs = trl_optimizer_step_loss(logp, old, A, mask, "bnpo", gradient_accumulation_steps=2, steps_per_generation=2)
    halves = [slice(0, 4), slice(4, 8)]
    same(sum(tc.policy_loss(logp[h], old[h], A[h], mask[h], mode="token")[0] for h in halves) / 2, theirs)
    differ(tc.policy_loss(logp, old, A, mask, mode="token")[0], theirs)


def test_trl_dapo_when_steps_per_generation_exceeds_gradient_accumulation():
    # steps_per_generation 4, gradient accumulation 2: two optimizer steps per generation batch; the
    # first runs rows 0-3 (17 tokens of 38) but divides by num_items_in_batch * 2 / 4 = 19
    logp, old, A, mask = trl_batch()
    theirs = trl_optimizer_step_loss(logp, old, A, mask, "dapo", gradient_accumulation_steps=2, steps_per_generation=4)
    w = slice(0, 4)
    window_tokens, normaliser = int(mask[w].sum()), float(mask.sum()) * 2 / 4
    assert window_tokens != normaliser
    differ(tc.policy_loss(logp[w], old[w], A[w], mask[w], mode="token")[0], theirs)
    # what it is: the window's token-sum over that normaliser, "constant" with N * max_len = normaliser
    same(tc.policy_loss(logp[w], old[w], A[w], mask[w], mode="constant", max_len=normaliser / 4)[0], theirs)


def test_trl_kl_term():
    logp, old, A, mask = trl_batch()
    ref = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(22), dtype=F64)
    beta = 0.04
    ours = lambda old_: (lambda lp: tc.policy_loss(lp, old_, A, mask, mode="token", ref_logp=ref, beta=beta)[0])
    theirs = lambda old_, bias: (lambda lp: trl_optimizer_step_loss(
        lp, old_, A, mask, "dapo", beta=beta, ref=ref, use_bias_correction_kl=bias))
    # use_bias_correction_kl=False: the k3 term, exact, off-policy too
    same_value_and_grad(ours(old), theirs(old, False), logp)
    # the default, True, multiplies the KL by the ratio: same value on-policy, another gradient
    on_policy = logp.detach()
    v_ours, g_ours = value_and_grad(ours(on_policy), logp)
    v_theirs, g_theirs = value_and_grad(theirs(on_policy, True), logp)
    same(v_ours, v_theirs)
    assert (g_ours - g_theirs).abs().max() > 1e-3


# --- importance_sampling_level="sequence" (GSPO) and luspo: the aggregation still follows loss_type

@pytest.mark.parametrize("loss_type, kwargs", [
    ("grpo", dict(mode="sample")),
    ("dapo", dict(mode="token")),
    ("luspo", dict(mode="constant", max_len=1.0)),  # LUSPO: the sequence loss times |o_i|, mean over responses
])
def test_trl_sequence_level_importance_sampling(loss_type, kwargs):
    # 2 processes, gradient accumulation 2 = steps_per_generation: exact for all three
    logp, old, A, mask = gspo_batch([9, 4, 0, 7, 2, 8, 6, 5], seed=23)  # row 2 empty
    check_gspo_data_clips_both_ways(logp, old, A, mask)
    same_value_and_grad(
        lambda lp: tc.policy_loss(lp, old, A, mask, eps_low=GSPO_EPS_LOW, eps_high=GSPO_EPS_HIGH,
                                  ratio_level="sequence", **kwargs)[0],
        lambda lp: trl_optimizer_step_loss(lp, old, A, mask, loss_type, num_processes=2, gradient_accumulation_steps=2,
                                           steps_per_generation=2, importance_sampling_level="sequence",
                                           epsilon_low=GSPO_EPS_LOW, epsilon_high=GSPO_EPS_HIGH),
        logp)


# --- cispo, vespo, sapo

def test_trl_cispo():
    logp, old, A, mask = trl_batch()
    epsilon_high = 1.3  # TRL recommends 5.0; 1.3 makes the cap bite on this data
    assert (torch.exp(logp - old)[mask] > epsilon_high).any()

    def ours(lp):
        weight = torch.clamp(tc.importance_ratio(lp, old, mask), max=epsilon_high).detach()
        return tc.policy_loss(lp, old, A[:, None] * weight, mask, mode="token", surrogate="reinforce")[0]

    for P, GA, S in [(1, 1, 1), (2, 2, 2)]:  # the dapo normaliser, under dapo's conditions
        same_value_and_grad(ours, lambda lp: trl_optimizer_step_loss(
            lp, old, A, mask, "cispo", num_processes=P, gradient_accumulation_steps=GA, steps_per_generation=S,
            epsilon_high=epsilon_high), logp)


def trl_vespo_phi(A, log_ratio, mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0):
    """TRL 1.16.0 GRPOTrainer.get_gamma_weights (no vLLM ratio), one response at a time: (N, 1), no gradient."""
    lower = math.log(1e-8)
    phi = torch.empty(len(A), 1, dtype=F64)
    for i in range(len(A)):
        seq_log_ratio = float((torch.clamp(log_ratio[i], -20.0, 20.0) * mask[i]).sum())  # a sum, not a mean
        log_w = min(max(seq_log_ratio, lower), 20.0)
        k, lam = (k_pos, lambda_pos) if A[i] >= 0 else (k_neg, lambda_neg)
        phi[i, 0] = math.exp(lam + k * log_w - lam * math.exp(log_w))
    return phi


def test_trl_vespo_given_its_gamma_weight():
    logp, old, A, mask = trl_batch(spread=0.1)
    phi = trl_vespo_phi(A, (logp - old).detach(), mask)
    assert phi.min() < 0.9 and phi.max() > 0.5  # the weight varies: it matters

    def ours(lp):
        return tc.policy_loss(lp, old, A[:, None] * phi.expand_as(lp), mask, mode="token",
                              surrogate="reinforce")[0]

    same_value_and_grad(ours, lambda lp: trl_optimizer_step_loss(lp, old, A, mask, "vespo", phi=phi), logp)


def test_trl_sapo_not_here_but_its_on_policy_gradient_is_grpo():
    logp, old, A, mask = trl_batch()
    on_policy = logp.detach()
    ours = lambda old_: (lambda lp: tc.policy_loss(lp, old_, A, mask, mode="sample")[0])
    theirs = lambda old_: (lambda lp: trl_optimizer_step_loss(lp, old_, A, mask, "sapo"))
    same(value_and_grad(ours(on_policy), logp)[1], value_and_grad(theirs(on_policy), logp)[1])
    differ(value_and_grad(ours(on_policy), logp)[0], value_and_grad(theirs(on_policy), logp)[0])  # values differ
    differ(value_and_grad(ours(old), logp)[1].abs().sum(), value_and_grad(theirs(old), logp)[1].abs().sum())


# --- top_entropy_quantile

def trl_entropy(logits, temperature):
    """The entropies GRPOTrainer._compute_loss gets from TRL 1.16.0's fused LM head
    (trl/trainer/utils.py add_fused_lm_head, given args.temperature;
    trl/kernels/chunked_logprob.py):
    -sum_v p log p of softmax(logits / temperature), one position at a time. logits: the model's
    own output logits (the head applies the model's logit scale and softcap first)."""
    N, T, _ = logits.shape
    out = torch.empty(N, T)
    for i in range(N):
        for t in range(T):
            logp = torch.log_softmax(logits[i, t].float() / temperature, dim=-1)
            out[i, t] = -(logp.exp() * logp).sum()
    return out


def trl_high_entropy_mask(entropies, mask, threshold):
    """TRL 1.16.0 GRPOTrainer.get_high_entropy_mask on one process (nothing to gather)."""
    local = entropies[mask.bool()].float()
    if local.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    entropy_threshold = torch.quantile(local, threshold)
    return ((entropies * mask.float()) >= entropy_threshold) & mask.bool()


def test_trl_top_entropy_quantile():
    # 36 real tokens: the 0.8 quantile falls on a token's own entropy, so ">=" and ">" would differ
    _, logp, old, A, mask = make_batch([9, 2, 0, 6, 4, 9, 1, 5], 9, seed=21)
    N, T = mask.shape
    g = torch.Generator().manual_seed(24)
    logits = torch.randn(N, T, 11, generator=g) * (0.3 + 3 * torch.rand(N, T, 1, generator=g))
    top_entropy_quantile = 0.2
    temperature = 0.5  # GRPOConfig.temperature: TRL's entropies are those of logits / temperature
    theirs_entropy = trl_entropy(logits, temperature)
    theirs_mask = trl_high_entropy_mask(theirs_entropy, mask, 1 - top_entropy_quantile)  # 1 - q
    entropy = tc.token_entropy(logits / temperature)
    same(entropy, theirs_entropy)
    keep = tc.high_entropy_mask(entropy, mask, top_fraction=top_entropy_quantile)
    # the temperature matters: without it other tokens are kept
    without = tc.high_entropy_mask(tc.token_entropy(logits), mask,
                                   top_fraction=top_entropy_quantile)
    assert not torch.equal(without.bool(), theirs_mask)
    assert (entropy[mask] == torch.quantile(entropy[mask], 1 - top_entropy_quantile)).any()
    assert torch.equal(keep.bool(), theirs_mask) and 0 < keep.sum() < mask.sum()
    ref = old + 0.3 * torch.randn(old.shape, generator=g, dtype=F64)
    same_value_and_grad(
        lambda lp: tc.policy_loss(lp, old, A[:, None] * keep.to(F64), mask, mode="token",
                                  ref_logp=ref, beta=0.04)[0],
        lambda lp: trl_optimizer_step_loss(lp, old, A, mask, "dapo", entropy_mask=theirs_mask.to(F64),
                                           beta=0.04, ref=ref, use_bias_correction_kl=False),
        logp)


def trl_vllm_importance_sampling_ratio(old_per_token_logps, sampling_per_token_logps, mask, mode,
                                      clip_min=None, clip_max=3.0):
    """TRL 1.16.0 GRPOTrainer._generate_and_score_completions, use_vllm with
    vllm_importance_sampling_correction: the ratio of the trainer's log-probs (before the update)
    to vLLM's, one completion at a time. "token_*" modes give (N, T); "sequence_*" modes one ratio
    per completion, (N, 1), from the summed log-ratio. "*_truncate" clamps it to [clip_min,
    clip_max]; "*_mask" sets it to 0 outside (a missing bound is no bound). Defaults as
    GRPOConfig's: mode "sequence_mask", clip_max 3.0, clip_min None."""
    N, T = mask.shape
    sequence_level = mode in ("sequence_mask", "sequence_truncate")
    out = torch.empty((N, 1) if sequence_level else (N, T), dtype=old_per_token_logps.dtype)
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    for i in range(N):
        diff = (old_per_token_logps[i] - sampling_per_token_logps[i]) * mask[i]
        diff = torch.nan_to_num(diff, nan=0.0)  # a NaN sampling log-prob: ratio 1
        ratios = torch.exp(diff.sum(-1, keepdim=True)) if sequence_level else torch.exp(diff)
        if mode.endswith("_truncate"):
            ratios = torch.clamp(ratios, min=clip_min, max=clip_max)
        else:
            ratios = torch.where((ratios < lo) | (ratios > hi), torch.zeros_like(ratios), ratios)
        out[i] = ratios
    return out


VLLM_IS_MODES = ["sequence_mask", "sequence_truncate", "token_mask", "token_truncate"]


@pytest.mark.parametrize("mode", VLLM_IS_MODES)
def test_trl_vllm_importance_sampling_correction(mode):
    # the clipped surrogate scales with A (w >= 0): -min(rho A, clip(rho) A) w
    # = -min(rho wA, clip(rho) wA)
    logp, old, A, mask = trl_batch()
    N, T = mask.shape
    g = torch.Generator().manual_seed(25)
    sampling = old + 0.6 * torch.randn(old.shape, generator=g, dtype=F64)  # vLLM's log-probs
    ref = old + 0.3 * torch.randn(old.shape, generator=g, dtype=F64)
    w = trl_vllm_importance_sampling_ratio(old, sampling, mask, mode)
    sequence_level = mode.startswith("sequence")
    assert w.shape == ((N, 1) if sequence_level else (N, T))
    real = mask.any(-1)[:, None] if sequence_level else mask
    bounded = (w[real] == 0) if mode.endswith("_mask") else (w[real] == 3.0)
    assert bounded.any() and (~bounded).any() and (w[real] != 1).all()  # the bound acts on some
    kl = dict(beta=0.04, ref=ref, use_bias_correction_kl=False)  # the KL term is not weighted
    theirs = lambda lp: trl_optimizer_step_loss(lp, old, A, mask, "dapo",
                                                importance_sampling_ratio=w, **kl)
    weighted = [A[:, None] * w.expand(N, T)]
    if sequence_level:
        weighted.append(A * w[:, 0])  # one weight per completion: (N,) advantages work too
    for A_w in weighted:
        same_value_and_grad(
            lambda lp: tc.policy_loss(lp, old, A_w, mask, mode="token", ref_logp=ref, beta=0.04)[0],
            theirs, logp)
    if sequence_level:
        # GSPO's sequence ratio needs (N,) advantages: A * w[:, 0]
        same_value_and_grad(
            lambda lp: tc.policy_loss(lp, old, A * w[:, 0], mask, mode="token",
                                      ratio_level="sequence")[0],
            lambda lp: trl_optimizer_step_loss(lp, old, A, mask, "dapo",
                                               importance_sampling_ratio=w,
                                               importance_sampling_level="sequence"),
            logp)
        # unexpanded, the (N, 1) ratio is not (N, T) advantages
        with pytest.raises(ValueError, match=r"advantages must be a torch.Tensor \(8,\) or \(8, 9\) on cpu, got \(8, 1\)"):
            tc.policy_loss(logp, old, A[:, None] * w, mask, mode="token")


# --- advantages

def trl_nanstd(x):
    """TRL 1.16.0 trl/trainer/utils.py nanstd, for a tensor without NaN: Bessel-corrected."""
    mean = x.mean()
    return torch.sqrt(((x - mean) ** 2).mean() * len(x) / (len(x) - 1))


def trl_grpo_advantages(rewards, num_generations, scale_rewards):
    """TRL 1.16.0 GRPOTrainer._generate_and_score_completions, one reward function, the default
    multi_objective_aggregation "sum_then_normalize"; rewards flat (B * G,)."""
    groups = [rewards[j:j + num_generations] for j in range(0, len(rewards), num_generations)]
    out = torch.empty_like(rewards)
    for gi, group in enumerate(groups):
        mean = group.mean()
        for j in range(num_generations):
            i = gi * num_generations + j
            if scale_rewards == "group":
                std = trl_nanstd(group)
            elif scale_rewards == "batch":
                std = trl_nanstd(rewards)
            advantage = rewards[i] - mean
            out[i] = advantage / (std + 1e-4) if scale_rewards != "none" else advantage
    return out


@pytest.mark.parametrize("scale_rewards, scale", [("group", "std"), ("batch", "batch"), ("none", "none")])
def test_trl_advantages(scale_rewards, scale):
    B, G = REWARDS.shape
    theirs = trl_grpo_advantages(REWARDS.flatten(), G, scale_rewards)
    same(tc.group_advantages(REWARDS, scale=scale, eps=1e-4).flatten(), theirs)
    if scale != "none":  # the default eps=1e-6 misses by about 1e-4 / std, relative
        ours_default = tc.group_advantages(REWARDS, scale=scale).flatten()
        k = theirs.abs().argmax()
        assert 5e-5 < abs(float(ours_default[k] / theirs[k]) - 1) < 1e-3


def test_trl_group_scale_where_it_differs():
    # eight equal float32 rewards of 0.1: the mean rounds, and TRL divides that rounding error (over
    # a std of rounding error) by about 1e-4; tokencredit gives exactly 0
    r = torch.full((1, 8), 0.1)
    theirs = trl_grpo_advantages(r.flatten(), 8, "group")
    assert torch.allclose(theirs, torch.full((8,), -7.45e-5), rtol=0.01)
    assert (tc.group_advantages(r, scale="std", eps=1e-4) == 0).all()


def trl_rloo_advantages(rewards, num_generations):
    """TRL 1.16.0 trl/trainer/rloo_trainer.py RLOOTrainer._generate_and_score_completions, beta
    folded into the rewards beforehand, normalize_advantages False (the default)."""
    out = torch.empty_like(rewards)
    for start in range(0, len(rewards), num_generations):
        group = rewards[start:start + num_generations]
        for j in range(num_generations):
            baseline = (group.sum() - group[j]) / (num_generations - 1)
            out[start + j] = group[j] - baseline
    return out


def test_trl_rloo_advantages():
    B, G = REWARDS.shape
    same(tc.group_advantages(REWARDS, scale="none", baseline="leave_one_out").flatten(),
         trl_rloo_advantages(REWARDS.flatten(), G))


def trl_rloo_loss(logp, old_logps, A, mask, epsilon_low=0.2, epsilon_high=0.2, gradient_accumulation_steps=1):
    """TRL 1.16.0 RLOOTrainer._compute_loss: one ratio per response, of the summed log-probs; the
    HF Trainer divides by gradient accumulation (loss_is_scaled_for_ga = False)."""
    m = mask.to(F64)
    losses = []
    for i in range(len(A)):
        coef_1 = torch.exp((logp[i] * m[i]).sum() - old_logps[i])
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        losses.append(-torch.min(coef_1 * A[i], coef_2 * A[i]))
    return torch.stack(losses).mean() / gradient_accumulation_steps


def test_trl_rloo_loss_matches_only_its_on_policy_gradient():
    logp, old, A, mask = trl_batch()
    m = mask.to(F64)
    ours = lambda lp: tc.policy_loss(lp, None, A, mask, mode="constant", max_len=1.0, surrogate="reinforce")[0]
    on_policy_old_logps = (logp * m).sum(-1).detach()
    theirs = lambda old_logps: (lambda lp: trl_rloo_loss(lp, old_logps, A, mask))
    same(value_and_grad(ours, logp)[1], value_and_grad(theirs(on_policy_old_logps), logp)[1])
    off_policy_old_logps = (old * m).sum(-1)  # whole-sequence ratios: clipped, unlike any tokencredit ratio
    differ(value_and_grad(ours, logp)[1].abs().sum(), value_and_grad(theirs(off_policy_old_logps), logp)[1].abs().sum())


# =============================================================================
# CS336 (Spring 2025) assignment 5 helpers, written from their documented formulas
# =============================================================================

def masked_mean(tensor, mask, dim=None):
    """sum(tensor * mask) / sum(mask), over dim or over everything."""
    m = mask.to(tensor.dtype)
    if dim is None:
        return (tensor * m).sum() / m.sum()
    return (tensor * m).sum(dim) / m.sum(dim)


def masked_normalize(tensor, mask, dim=None, normalize_constant=1.0):
    """sum(tensor * mask) / normalize_constant, over dim or over everything."""
    m = mask.to(tensor.dtype)
    if dim is None:
        return (tensor * m).sum() / normalize_constant
    return (tensor * m).sum(dim) / normalize_constant


def compute_group_normalized_rewards(raw_rewards, group_size, advantage_eps, normalize_by_std):
    """The advantage part of compute_group_normalized_rewards (raw rewards already scored):
    (r - group mean) / (group std + advantage_eps), torch's unbiased std; or r - group mean."""
    out = torch.empty_like(raw_rewards)
    for start in range(0, len(raw_rewards), group_size):
        group = raw_rewards[start:start + group_size]
        for j in range(group_size):
            centred = group[j] - group.mean()
            out[start + j] = centred / (group.std() + advantage_eps) if normalize_by_std else centred
    return out


def compute_naive_policy_gradient_loss(raw_rewards_or_advantages, policy_log_probs):
    """-A * log pi per token; A (batch, 1)."""
    return -raw_rewards_or_advantages * policy_log_probs


def compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange):
    """-min(ratio * A, clip(ratio, 1 - cliprange, 1 + cliprange) * A) per token; A (batch, 1)."""
    ratio = torch.exp(policy_log_probs - old_log_probs)
    return -torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - cliprange, 1 + cliprange) * advantages)


def grpo_microbatch_train_step_loss(policy_log_probs, response_mask, gradient_accumulation_steps, advantages,
                                    old_log_probs, cliprange):
    """grpo_microbatch_train_step with loss_type "grpo_clip": the per-token loss, masked_mean over each
    response, mean over the micro-batch, divided by gradient_accumulation_steps (then backward)."""
    per_token = compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange)
    return masked_mean(per_token, response_mask, dim=-1).mean() / gradient_accumulation_steps


COURSE_C = 12.0  # a normalize_constant (Dr. GRPO: the generation budget), not the padded width 9
COURSE_ROWS = [
    ("masked_mean(x, mask)", lambda x, m: masked_mean(x, m), lambda x, m: tc.aggregate(x, m, "token")),
    ("masked_mean(x, mask, dim=-1).mean()", lambda x, m: masked_mean(x, m, dim=-1).mean(),
     lambda x, m: tc.aggregate(x, m, "sample")),
    ("masked_normalize(x, mask, normalize_constant=C)",
     lambda x, m: masked_normalize(x, m, normalize_constant=COURSE_C),
     lambda x, m: tc.aggregate(x, m, "constant", max_len=COURSE_C / m.shape[0])),
    ("masked_normalize(x, mask, dim=-1, normalize_constant=C).mean()",
     lambda x, m: masked_normalize(x, m, dim=-1, normalize_constant=COURSE_C).mean(),
     lambda x, m: tc.aggregate(x, m, "constant", max_len=COURSE_C)),
]


@pytest.mark.parametrize("name, theirs, ours", COURSE_ROWS, ids=[r[0] for r in COURSE_ROWS])
def test_course_masked_helpers(name, theirs, ours):
    x, _, _, _, mask = make_batch([9, 2, 5, 6, 4, 8], 9, seed=31)  # no empty row: masked_mean(dim=-1) would be NaN
    same(ours(x, mask), theirs(x, mask))


@pytest.mark.parametrize("advantage_eps", [1e-6, 0.1])
@pytest.mark.parametrize("normalize_by_std, scale", [(True, "std"), (False, "none")])
def test_course_group_normalized_rewards(normalize_by_std, scale, advantage_eps):
    B, G = REWARDS.shape
    theirs = compute_group_normalized_rewards(REWARDS.flatten(), G, advantage_eps, normalize_by_std)
    same(tc.group_advantages(REWARDS, scale=scale, eps=advantage_eps).flatten(), theirs)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns: std of one value
def test_course_group_of_one_is_nan_there_and_zero_here():
    theirs = compute_group_normalized_rewards(torch.tensor([0.7]), 1, 1e-6, True)  # std of one value: NaN
    assert math.isnan(theirs.item()) and tc.group_advantages(torch.tensor([[0.7]])).item() == 0.0


def test_course_all_equal_group_where_it_differs():
    # eight equal float32 rewards of 0.1: the documented formula with torch's mean and std divides
    # the mean's rounding error by about advantage_eps, as verl's loop does; tokencredit gives 0
    r = torch.full((1, 8), 0.1)
    theirs = compute_group_normalized_rewards(r.flatten(), 8, 1e-6, True)
    assert torch.allclose(theirs, torch.full((8,), -0.0074), rtol=0.01)
    assert (tc.group_advantages(r, scale="std", eps=1e-6) == 0).all()


def test_course_per_token_losses():
    _, logp, old, A, mask = make_batch([9, 2, 5, 6, 4, 8], 9, seed=32)
    raw_rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=F64)
    same(tc.policy_gradient_surrogate(logp, raw_rewards),
         compute_naive_policy_gradient_loss(raw_rewards[:, None], logp))
    same(tc.policy_gradient_surrogate(logp, A), compute_naive_policy_gradient_loss(A[:, None], logp))
    ours = tc.clipped_surrogate(tc.importance_ratio(logp, old, mask), A, 0.2, 0.2)
    same(ours[mask], compute_grpo_clip_loss(A[:, None], logp, old, 0.2)[mask])  # importance_ratio is 1 on padding


def test_course_grpo_microbatch_train_step():
    # gradient accumulation 2 over micro-batches of equal size: the batch's "sample" mean, gradient included
    _, logp, old, A, mask = make_batch([9, 2, 5, 6, 4, 8], 9, seed=33)
    halves = [slice(0, 3), slice(3, 6)]
    same_value_and_grad(
        lambda lp: tc.policy_loss(lp, old, A, mask, mode="sample", eps_low=0.2, eps_high=0.2)[0],
        lambda lp: sum(grpo_microbatch_train_step_loss(lp[h], mask[h], 2, A[h, None], old[h], 0.2) for h in halves),
        logp)


def test_course_compute_entropy():
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(34)) * 2
    p = torch.softmax(logits, dim=-1)
    same(tc.token_entropy(logits), -(p * torch.log(p)).sum(-1))  # compute_entropy: -sum_v p log p


def test_empty_response_gives_zero_here_and_nan_where_code_divides_by_the_mask_sum():
    x, _, _, _, mask = make_batch([9, 0, 5, 6, 4, 8], 9, seed=35)  # row 1 is empty
    per_row = masked_mean(x, mask, dim=-1)  # 0 / 0 on row 1
    assert math.isnan(per_row[1].item()) and math.isnan(per_row.mean().item())
    ours = tc.aggregate(x, mask, "sample")  # the empty response gets weight 0; the others keep 1 / (N |o_i|)
    same(ours, sum(per_row[i] for i in range(6) if i != 1) / 6)
    for mode in tc.AGGREGATION_MODES:
        w = tc.token_weights(mask, mode, group_size=3, max_len=9)
        assert torch.isfinite(w).all() and w[1].sum() == 0
