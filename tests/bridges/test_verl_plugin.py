"""tokencredit_verl through verl 0.9.1's own registry, config objects and agg_loss, on the CPU.

No Ray, no GPU, tiny tensors. Where verl has the same computation (vanilla's clip and dual clip,
gspo; token-mean, seq-mean-token-mean, seq-mean-token-sum-norm; grpo and rloo advantages), the
plugin gives verl's value and gradient; where it has none (the per-prompt token mean), it gives
tokencredit.policy_loss's; split into data-parallel shards or micro-batches, it adds up to the
whole batch's. Skipped where verl is not installed (its own virtualenv: .ci/verl-env.sh).
`python -m pytest tests/bridges/test_verl_plugin.py -s` prints the differences docs/verl.md tabulates.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is not installed (bash .ci/verl-env.sh)")
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402

import tokencredit as tc  # noqa: E402
import tokencredit_verl  # noqa: E402, F401  (registers, where the entry point has not)

B, G, T = 3, 4, 7  # prompts, responses per prompt, padded length
N = B * G
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
TC_MODES = dict(zip(MODES, ("token", "sample", "constant")))


def actor_config(mode="token-mean", eps=(0.2, 0.28), clip_c=3.0, info=None):
    config = FSDPActorConfig(rollout_n=G, ppo_micro_batch_size_per_gpu=2, loss_agg_mode=mode,
                             clip_ratio_low=eps[0], clip_ratio_high=eps[1], clip_ratio_c=clip_c)
    config.global_batch_info.update(info or {})
    return config


def make_batch(seed=0):
    """N responses in verl's layout: rows of one group apart (uid), ratios on both sides of the
    clip, some above the dual clip's 3 where A < 0, lengths 1..T, binary rewards, mixed groups."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (N, T)
    logp = -torch.rand(N, T, generator=g) * 3  # (N, T)
    old_logp = logp + 0.4 * torch.randn(N, T, generator=g)  # (N, T) ratios 0.3 to 3
    old_logp[::3, :2] = logp[::3, :2] - 1.5  # ratio e^1.5 = 4.5 > 3 on some tokens
    rewards = torch.tensor([[1.0, 0, 0, 1], [0, 1, 0, 0], [1, 1, 1, 0]])  # (B, G)
    perm = torch.randperm(N, generator=g)  # verl's row order: groups interleaved
    uid = np.array([f"prompt-{n // G}" for n in range(N)], dtype=object)[perm.numpy()]
    score_at_end = torch.zeros(N, T)
    score_at_end[torch.arange(N), lengths - 1] = rewards.reshape(N)  # on the last token, as verl
    return dict(logp=logp[perm], old_logp=old_logp[perm], mask=mask[perm], uid=uid,
                token_level_rewards=score_at_end[perm], perm=perm)


def advantages(name, batch, config=None):
    A, returns = get_adv_estimator_fn(name)(token_level_rewards=batch["token_level_rewards"],
                                            response_mask=batch["mask"], index=batch["uid"],
                                            config=config)
    return A


def loss_and_grad(name, batch, A, mode, config, rows=slice(None), weights=None):
    logp = batch["logp"][rows].clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(
        old_log_prob=batch["old_logp"][rows], log_prob=logp, advantages=A[rows],
        response_mask=batch["mask"][rows], loss_agg_mode=mode, config=config,
        rollout_is_weights=None if weights is None else weights[rows])
    loss.backward()
    return loss.detach(), logp.grad, metrics


def assert_agree(case, ours, theirs, atol=1e-6):
    (loss, grad), (their_loss, their_grad) = ours[:2], theirs[:2]
    value_diff, grad_diff = (loss - their_loss).abs().item(), (grad - their_grad).abs().max().item()
    print(f"AGREE {case}: value {value_diff:.1e}, gradient {grad_diff:.1e}")
    assert value_diff <= atol and grad_diff <= atol, (case, value_diff, grad_diff)


# --- where verl has the same computation: its value and gradient ------------------------------

@pytest.mark.parametrize("info", [None, "shard"])
@pytest.mark.parametrize("mode", MODES)
def test_tokencredit_equals_verl_vanilla_with_its_dual_clip(mode, info):
    batch = make_batch()
    A = advantages("grpo", batch)
    # "shard": these rows as one of 2 ranks of a batch twice as big, by verl's global_batch_info
    info = info and dict(dp_size=2, batch_num_tokens=2 * int(batch["mask"].sum()) + 5,
                         global_batch_size=2 * N)
    weights = torch.rand(N, T, generator=torch.Generator().manual_seed(1)) + 0.5
    ours = loss_and_grad("tokencredit", batch, A, mode, actor_config(mode, info=info),
                         weights=weights)
    theirs = loss_and_grad("vanilla", batch, A, mode, actor_config(mode, info=info),
                           weights=weights)
    assert ours[2]["actor/pg_clipfrac_lower"] > 0  # the dual clip binds somewhere
    for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
        assert ours[2][key] == pytest.approx(theirs[2][key], abs=1e-6), key
    assert_agree(f"tokencredit / vanilla, {mode}, global info {info is not None}", ours, theirs)


@pytest.mark.parametrize("mode", MODES)
def test_tokencredit_gspo_token_equals_verl_gspo(mode):
    batch = make_batch(seed=2)
    noise = torch.randn(N, T, generator=torch.Generator().manual_seed(7))
    batch["old_logp"] = batch["logp"] + 2e-3 * noise  # GSPO's ratios sit near 1
    A = advantages("grpo", batch)
    config = actor_config(mode, eps=(3e-4, 4e-4))
    ours = loss_and_grad("tokencredit_gspo_token", batch, A, mode, config)
    theirs = loss_and_grad("gspo", batch, A, mode, config)
    assert 0 < ours[2]["actor/pg_clipfrac"] < 1  # some sequences clipped, some not
    assert_agree(f"tokencredit_gspo_token / gspo, {mode}", ours, theirs)


@pytest.mark.parametrize("ours, theirs, std", [("tokencredit_grpo", "grpo", True),
                                               ("tokencredit_drgrpo", "grpo", False),
                                               ("tokencredit_rloo", "rloo", True)])
def test_advantages_equal_verls(ours, theirs, std):
    batch = make_batch()
    A = advantages(ours, batch, AlgoConfig(norm_adv_by_std_in_grpo=std))
    their_A, _ = get_adv_estimator_fn(theirs)(
        token_level_rewards=batch["token_level_rewards"], response_mask=batch["mask"],
        index=batch["uid"], norm_adv_by_std_in_grpo=std)
    diff = (A - their_A).abs().max().item()
    print(f"AGREE {ours} / {theirs} (norm_adv_by_std_in_grpo={std}): advantages {diff:.1e}")
    assert diff <= 1e-6


def test_advantages_by_hand():
    """One group, rewards (1, 0, 0, 0), 2 tokens each: mean 1/4, Bessel std sqrt(0.75/3) = 1/2."""
    batch = dict(token_level_rewards=torch.tensor([[0.0, 1], [0, 0], [0, 0], [0, 0]]),
                 mask=torch.ones(4, 2, dtype=torch.bool), uid=np.array(["q"] * 4, dtype=object))
    expected = {"tokencredit_grpo": [1.5, -0.5], "tokencredit_drgrpo": [0.75, -0.25],
                "tokencredit_rloo": [1.0, -1 / 3]}
    for name, (first, others) in expected.items():
        A = advantages(name, batch)
        want = torch.tensor([first] + [others] * 3)[:, None].expand(4, 2)
        torch.testing.assert_close(A, want, atol=3e-6, rtol=0)


# --- where verl has none: tokencredit's own policy_loss ---------------------------------------

def test_group_token_equals_tokencredit_policy_loss():
    batch = make_batch(seed=3)
    config = actor_config("seq-mean-token-sum", clip_c=float("inf"))  # tokencredit: no dual clip
    A = advantages("tokencredit_grpo_group_token", batch)
    loss, grad, _ = loss_and_grad("tokencredit_group_token", batch, A, "seq-mean-token-sum",
                                  config)
    order = torch.argsort(batch["perm"])  # back to group order: rows n*G .. n*G+G-1, prompt n
    logp = batch["logp"][order].clone().requires_grad_(True)
    rewards = batch["token_level_rewards"][order].sum(-1).view(B, G)  # (B, G)
    their_loss, _ = tc.policy_loss(logp, batch["old_logp"][order],
                                   tc.group_advantages(rewards).reshape(N), batch["mask"][order],
                                   mode="group_token", eps_low=0.2, eps_high=0.28, group_size=G)
    their_loss.backward()
    assert_agree("tokencredit_group_token / tokencredit.policy_loss(mode='group_token')",
                 (loss, grad[order]), (their_loss.detach(), logp.grad))


@pytest.mark.parametrize("mode", MODES)
def test_without_dual_clip_tokencredit_is_tokencredits_policy_loss(mode):
    batch = make_batch(seed=4)
    A = advantages("tokencredit_grpo", batch)
    ours = loss_and_grad("tokencredit", batch, A, mode, actor_config(mode, clip_c=float("inf")))
    logp = batch["logp"].clone().requires_grad_(True)
    theirs, _ = tc.policy_loss(logp, batch["old_logp"], A, batch["mask"], mode=TC_MODES[mode],
                               eps_low=0.2, eps_high=0.28, max_len=T)
    theirs.backward()
    assert_agree(f"tokencredit (clip_ratio_c=inf) / tokencredit.policy_loss, {mode}", ours,
                 (theirs.detach(), logp.grad))


def test_group_token_gradient_by_hand():
    """On-policy, Dr. GRPO's A = (1/2, -1/2) in two groups of 2 with 1 + 3 and 1 + 1 tokens:
    d loss / d logp = -A / (B * group tokens) = -+1/16 in the first group, -+1/8 in the second."""
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=torch.bool)
    batch = dict(token_level_rewards=torch.tensor([[1.0], [0], [1], [0]]) * mask,
                 mask=mask, uid=np.array(["a", "a", "b", "b"], dtype=object))
    batch["logp"] = batch["old_logp"] = -torch.ones(4, 3)
    config = FSDPActorConfig(rollout_n=2, ppo_micro_batch_size_per_gpu=2, clip_ratio_c=3.0)
    A = advantages("tokencredit_drgrpo_group_token", batch)
    _, grad, _ = loss_and_grad("tokencredit_group_token", batch, A, "seq-mean-token-sum", config)
    want = torch.tensor([[-1 / 16, 0, 0], [1 / 16] * 3, [-1 / 8, 0, 0], [1 / 8, 0, 0]])
    torch.testing.assert_close(grad, want, atol=1e-7, rtol=0)


# --- the global batch: however it is split, the whole batch's gradient ------------------------

CASES = [("tokencredit", "tokencredit_grpo", mode) for mode in MODES] + [
    ("tokencredit_gspo", "tokencredit_rloo", "seq-mean-token-mean"),
    ("tokencredit_group_token", "tokencredit_grpo_group_token", "seq-mean-token-sum")]


@pytest.mark.parametrize("shards", [2, 4])
@pytest.mark.parametrize("loss_name, estimator, mode", CASES)
def test_shards_add_up_to_the_whole_batch(loss_name, estimator, mode, shards):
    """Rows in random order (a group spread over shards), cut into `shards` pieces. As data-parallel
    ranks (dp_size = shards), their mean (DDP's all-reduce) is the whole; as micro-batches on one
    rank (dp_size = 1), their sum."""
    batch = make_batch(seed=5)
    A = advantages(estimator, batch)  # on the whole batch, as verl's driver does
    whole_loss, whole_grad, _ = loss_and_grad(loss_name, batch, A, mode, actor_config(mode))
    assert (whole_grad[batch["mask"]] != 0).float().mean() > 0.5  # most tokens are not clipped
    pieces = torch.randperm(N, generator=torch.Generator().manual_seed(6)).chunk(shards)
    info = dict(batch_num_tokens=int(batch["mask"].sum()), global_batch_size=N)
    for dp_size in (shards, 1):
        config = actor_config(mode, info=dict(info, dp_size=dp_size))
        loss, grad = 0.0, torch.zeros(N, T)
        for rows in pieces:
            piece_loss, piece_grad, _ = loss_and_grad(loss_name, batch, A, mode, config, rows)
            loss, grad[rows] = loss + piece_loss / dp_size, piece_grad / dp_size
        assert_agree(f"{loss_name}, {mode}, {shards} shards, dp_size {dp_size}",
                     (loss, grad), (whole_loss, whole_grad))


# --- what the plugin refuses ---------------------------------------------------------------

def test_settings_without_a_tokencredit_twin_are_refused():
    batch = make_batch()
    A = advantages("tokencredit_grpo", batch)
    refused = [("tokencredit", "token-sum", actor_config(), "loss_agg_mode must be one of"),
               ("tokencredit_group_token", "token-mean", actor_config(), "seq-mean-token-sum"),
               ("tokencredit", "token-mean", actor_config(clip_c=1.0), "clip_ratio_c must be > 1"),
               ("tokencredit", "token-mean", actor_config(info=dict(dp_size=2)),
                "batch_num_tokens'] must be given when dp_size > 1")]
    for name, mode, config, message in refused:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            loss_and_grad(name, batch, A, mode, config)
    with pytest.raises(ValueError, match="every prompt the same number of responses"):
        advantages("tokencredit_grpo", dict(batch, uid=np.array(["a"] * 5 + ["b"] * 7)))
    with pytest.raises(ValueError, match="adv_estimator=tokencredit_drgrpo"):
        advantages("tokencredit_grpo", batch, AlgoConfig(norm_adv_by_std_in_grpo=False))


# --- docs/verl.md's DAPO command --------------------------------------------------------------

def test_the_documented_dapo_overrides_compose_with_verls_config():
    """docs/verl.md's overrides, composed with verl's own ppo_trainer config, give verl's actor and
    algorithm configs with tokencredit's names and DAPO's settings (composed, not run)."""
    import re
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    page = open(os.path.join(root, "docs", "verl.md")).read()
    command = re.search(r"```bash\npython -m verl.trainer.main_ppo (.*?)```", page, re.S).group(1)
    overrides = [word for word in command.replace("\\\n", " ").split() if "=" in word]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    algorithm = omega_conf_to_dataclass(config.algorithm)
    assert get_policy_loss_fn(actor.policy_loss.loss_mode).keywords["group_token"]
    assert get_adv_estimator_fn(algorithm.adv_estimator).keywords["group_token"]
    assert (actor.loss_agg_mode, actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c,
            actor.use_kl_loss, actor.rollout_n) == ("seq-mean-token-sum", 0.2, 0.28, float("inf"),
                                                   False, 16)
    assert (algorithm.filter_groups.enable, algorithm.filter_groups.metric) == (True, "acc")
    assert config.reward.reward_kwargs.overlong_buffer_cfg.len == 4096


# --- the entry point ---------------------------------------------------------------------

def test_import_verl_registers_the_names_through_the_entry_point(tmp_path):
    """In a fresh interpreter, from a folder without the project on sys.path: `import verl` alone
    loads tokencredit_verl (the installed entry point), and does not when verl's plugin loading
    is off (VERL_USE_EXTERNAL_PLUGINS=none)."""
    code = ("import sys, verl\nfrom verl.trainer.ppo import core_algos as ca\n"
            "print('tokencredit_verl' in sys.modules, 'tokencredit_group_token' in "
            "ca.POLICY_LOSS_REGISTRY, 'tokencredit_rloo_group_token' in ca.ADV_ESTIMATOR_REGISTRY)")
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VERL_USE_EXTERNAL_PLUGINS")}
    printed = {}
    for policy in ("auto", "none"):
        run_env = dict(env, VERL_USE_EXTERNAL_PLUGINS=policy)
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300, env=run_env)
        assert done.returncode == 0, done.stderr[-2000:]
        printed[policy] = done.stdout.split()[-3:]
    assert printed == {"auto": ["True"] * 3, "none": ["False"] * 3}, (
        f"{printed}: is the project installed (pip install -e .), with its entry point?")
