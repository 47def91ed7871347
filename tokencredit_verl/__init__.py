"""tokencredit_verl: tokencredit's losses and advantages inside verl 0.9.1, by name (docs/verl.md).

verl imports every entry point of the group `verl.plugins` when it is itself imported; this package
is one, so `import verl` registers in verl.trainer.ppo.core_algos:

policy losses (actor_rollout_ref.actor.policy_loss.loss_mode=NAME), verl's clip settings
(clip_ratio_low, clip_ratio_high; clip_ratio when they are None):
    tokencredit              PPO-clip on the token ratio, with verl's dual clip (clip_ratio_c: a
                             token with A < 0 loses at most -A * clip_ratio_c; inf: none)
    tokencredit_gspo         GSPO's sequence ratio s_i, no dual clip (as verl's gspo)
    tokencredit_gspo_token   GSPO-token's sg[s_i] pi / sg[pi], no dual clip (as verl's gspo)
    tokencredit_group_token  DAPO's per-prompt token mean as printed [3]: advantages from a
                             *_group_token estimator, loss_agg_mode seq-mean-token-sum
  loss_agg_mode (the other three): token-mean, seq-mean-token-mean, seq-mean-token-sum-norm, which
  are tokencredit's aggregation modes "token", "sample" and "constant" (max_len: loss_scale_factor,
  else the padded length T, as verl).
advantage estimators (algorithm.adv_estimator=NAME): tokencredit.group_advantages of the summed
rewards, grouped by verl's uid, eps 1e-6, Bessel's std:
    tokencredit_grpo    (r_i - mean) / (std + eps)    tokencredit_drgrpo   r_i - mean
    tokencredit_rloo    r_i - mean_{j != i} r_j       and NAME_group_token of each (below).

The per-prompt token mean needs each response's group, which never reaches verl's policy loss (its
arguments are per row, and verl reorders rows to balance its workers). So the estimator, which sees
the groups, folds the weight into the advantage: NAME_group_token gives N * w_{i,t} * A_i with
w = tokencredit.token_weights(mask, "group_token", G) = 1 / (B |group(i)| tokens), and the loss
sums over tokens and divides by verl's global batch size N. The clip and the dual clip are
positively homogeneous in A (c > 0: loss(c A) = c loss(A)), so this is DAPO's weighting exactly.

Every loss is tokencredit's on the micro-batch, times the micro-batch's share of verl's global
batch (config.global_batch_info: dp_size, batch_num_tokens, global_batch_size): what data
parallelism averages and micro-batches add up is the whole batch's loss, however it is split.
"""

import logging
import math
from functools import partial

import numpy as np
import torch

import tokencredit as tc
import verl
from verl.trainer.ppo import core_algos

VERL_TESTED = ("0.9.1",)  # where the loss signature and config.global_batch_info were checked

if verl.__version__ not in VERL_TESTED:  # verl swallows a plugin's ImportError: say it in the log
    _message = (f"tokencredit_verl was tested with verl {', '.join(VERL_TESTED)}, this is verl "
                f"{verl.__version__}: its losses are not registered (pip install verl==0.9.1)")
    logging.getLogger(__name__).warning(_message)
    raise ImportError(_message)

# verl's loss_agg_mode -> tokencredit's aggregation mode
AGGREGATIONS = {"token-mean": "token", "seq-mean-token-mean": "sample",
                "seq-mean-token-sum-norm": "constant"}
GROUP_TOKEN_AGGREGATION = "seq-mean-token-sum"  # sum_{i,t} / N: the weights sit in the advantages
LOSSES = {"tokencredit": "token", "tokencredit_gspo": "sequence",
          "tokencredit_gspo_token": "sequence_token", "tokencredit_group_token": "token"}
ESTIMATORS = {"tokencredit_grpo": dict(baseline="mean", scale="std"),
              "tokencredit_drgrpo": dict(baseline="mean", scale="none"),
              "tokencredit_rloo": dict(baseline="leave_one_out", scale="none")}


def policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                config=None, rollout_is_weights=None, *, ratio_level="token", group_token=False):
    """verl's policy-loss signature around tokencredit's clipped surrogate and aggregation.

    loss = share * tokencredit.aggregate(dual_clip(clipped_surrogate(rho, A)) * is_weights, mask)
    rho: importance_ratio at ratio_level; dual_clip (token level, verl's): A < 0 -> min(l, -A c);
    is_weights: verl's rollout correction, per token; share: _global_share.
    Args: old_log_prob, log_prob, advantages, response_mask (N, T); loss_agg_mode and config (verl's
    ActorConfig: clip_ratio*, loss_scale_factor, global_batch_info); rollout_is_weights (N, T).
    Returns: (loss, metrics over real tokens: pg_clipfrac = clip_frac_low + clip_frac_high,
    pg_clipfrac_lower (the dual clip), ppo_kl, as verl's vanilla names them).
    """
    _check(config is not None, "config", "be verl's actor config (the clip settings)", None)
    mask = response_mask.bool()
    mode, max_len = _aggregation(loss_agg_mode, config, mask, group_token)
    eps_low, eps_high, clip_c = _clip_settings(config, ratio_level)
    ratio = tc.importance_ratio(log_prob, old_log_prob, mask, ratio_level)  # (N, T)
    per_token = tc.clipped_surrogate(ratio, advantages, eps_low, eps_high)  # (N, T)
    dual = (advantages < 0) & (per_token > -advantages * clip_c)  # (N, T) where the cap binds
    per_token = torch.where(dual, -advantages * clip_c, per_token)  # (N, T) verl's dual clip
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights  # (N, T)
    loss = tc.aggregate(per_token, mask, mode, max_len=max_len) * _global_share(mask, mode, config)
    with torch.no_grad():
        low = (ratio < 1 - eps_low) & (advantages < 0)  # (N, T)
        high = (ratio > 1 + eps_high) & (advantages > 0)  # (N, T)
        kl = old_log_prob - log_prob  # (N, T)
        parts = [low, high, low | high, dual, kl]  # each (N, T), averaged over real tokens:
        sums = torch.stack([torch.where(mask, x.float(), 0.0).sum() for x in parts])
        means = sums / mask.sum().clamp(min=1)
    names = ("clip_frac_low", "clip_frac_high", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl")
    return loss, {f"actor/{name}": value for name, value in zip(names, means.tolist())}


def group_advantages(token_level_rewards, response_mask, index, config=None, *, baseline, scale,
                     group_token=False, **unused):
    """verl's estimator signature around tokencredit.group_advantages; the rows' groups: index.

    A_i on every real token of response i (verl's grpo and rloo do the same); group_token:
    N * w_{i,t} * A_i, w = tokencredit.token_weights(mask, "group_token", G), for the loss
    tokencredit_group_token. Args: token_level_rewards, response_mask (N, T); index (N,) verl's uid
    per row, G rows each (in any order); config: verl's algorithm config. Returns: (A, A), (N, T).
    """
    _check(scale != "std" or config is None or config.get("norm_adv_by_std_in_grpo", True),
           "algorithm.norm_adv_by_std_in_grpo", "be True for a tokencredit_grpo estimator (no "
           "std: adv_estimator=tokencredit_drgrpo)", False)
    mask = response_mask.bool()
    order, G = _groups(index, mask.shape[0])  # (N,) rows sorted into groups
    N = mask.shape[0]
    with torch.no_grad():
        rewards = token_level_rewards.sum(dim=-1)[order].view(N // G, G)  # (B, G) one per response
        A = tc.group_advantages(rewards, scale=scale, baseline=baseline).reshape(N, 1)  # (N, 1)
        if group_token:  # (N, T) N w_{i,t} A_i, sorted
            credit = A * N * tc.token_weights(mask[order], "group_token", group_size=G)
        else:
            credit = A * mask[order]  # (N, T) A_i on real tokens, sorted
        advantages = torch.empty_like(credit)
        advantages[order] = credit  # (N, T) back in verl's order
    return advantages, advantages


def _aggregation(loss_agg_mode, config, mask, group_token):
    """tokencredit's (mode, max_len) for verl's loss_agg_mode."""
    if group_token:
        _check(loss_agg_mode == GROUP_TOKEN_AGGREGATION, "loss_agg_mode", f"be "
               f"{GROUP_TOKEN_AGGREGATION!r} for tokencredit_group_token (its advantages carry "
               "the per-prompt weights)", repr(loss_agg_mode))
        return "constant", 1.0  # d_i = N * 1
    _check(loss_agg_mode in AGGREGATIONS, "loss_agg_mode", f"be one of {tuple(AGGREGATIONS)} "
           "(tokencredit's token, sample, constant)", repr(loss_agg_mode))
    info = config.global_batch_info or {}
    max_len = info.get("loss_scale_factor") or config.get("loss_scale_factor") or mask.shape[-1]
    return AGGREGATIONS[loss_agg_mode], float(max_len)


def _clip_settings(config, ratio_level):
    """(eps_low, eps_high, dual-clip bound) from verl's actor config, as verl reads them."""
    eps_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    eps_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    clip_c = config.get("clip_ratio_c", 3.0) if ratio_level == "token" else math.inf
    _check(clip_c > 1, "clip_ratio_c", "be > 1 (verl's dual clip; inf: none)", clip_c)
    return eps_low, eps_high, clip_c


def _global_share(mask, mode, config):
    """The micro-batch's tokencredit denominator over its share of verl's global one.

    "token": d = its real tokens, verl's batch_num_tokens / dp_size; the others: d_i = its rows
    times |o_i| or max_len, verl's global_batch_size / dp_size times the same. Data parallelism
    averages the dp_size ranks' gradients, micro-batches add theirs: the whole batch's gradient.
    """
    info = config.global_batch_info or {}
    dp_size = info.get("dp_size") or 1
    name = "batch_num_tokens" if mode == "token" else "global_batch_size"
    total = info.get(name)
    if total is None:  # verl's own agg_loss then takes the micro-batch as the batch
        _check(dp_size == 1, f"global_batch_info[{name!r}]", f"be given when dp_size > 1", None)
        return 1.0
    local = mask.sum().clamp(min=1) if mode == "token" else mask.shape[0]
    return local * dp_size / total


def _groups(index, N):
    """(order, G): the rows sorted by group (stable), and the one group size."""
    index = np.asarray(index).reshape(-1)
    _check(index.shape[0] == N, "index", f"give one uid per row, N = {N}", index.shape[0])
    groups = torch.as_tensor(np.unique(index, return_inverse=True)[1].reshape(-1))  # (N,)
    sizes = torch.bincount(groups)  # (B,)
    _check(bool((sizes == sizes[0]).all()), "index", "give every prompt the same number of "
           "responses G (tokencredit's groups are (B, G))", sorted(set(sizes.tolist())))
    return torch.argsort(groups, stable=True), int(sizes[0])


def _check(ok, name, expected, got):
    if not ok:
        raise ValueError(f"{name} must {expected}, got {got}")


for _name, _level in LOSSES.items():
    core_algos.register_policy_loss(_name)(partial(
        policy_loss, ratio_level=_level, group_token=_name.endswith("group_token")))
for _name, _choice in ESTIMATORS.items():
    core_algos.register_adv_est(_name)(partial(group_advantages, **_choice))
    core_algos.register_adv_est(_name + "_group_token")(
        partial(group_advantages, **_choice, group_token=True))
