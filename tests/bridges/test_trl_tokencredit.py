"""tokencredit_trl against TRL 1.16's own GRPOTrainer (needs TRL; skipped without it).

    .venv-trl/bin/python -m pytest -q tests/bridges/test_trl_tokencredit.py   # -s prints the differences

Every model here is built in code from a config (random weights, nothing downloaded): tiny_task's
GPT-2, smaller, unless a test names another family. A rollout batch is built the way TRL's
_compute_loss receives it (left-padded prompts of unequal lengths, right-padded completions,
advantages, old log-probs a little off the current ones so that the clip acts), and the bridge's
loss and gradient are compared with TRL's on the same batch, model and GRPOConfig.
"""

import contextlib
import copy
import dataclasses
import logging
import os
import re
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import pytest  # noqa: E402

pytest.importorskip("trl")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import tokencredit as tc  # noqa: E402
import tiny_task  # noqa: E402
from tokencredit_trl.grpo_config import (Credit, high_entropy_weights,  # noqa: E402
                                         resolve_credit)
from tokencredit_trl.grpo_trainer import TokenCreditGRPOTrainer  # noqa: E402

TINY = tiny_task.Task(n_layer=1, n_embd=32, n_head=2)
G, MAX_COMPLETION = 4, 12


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_task.build_tokenizer()


def tiny_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    return tiny_task.build_tiny_model(TINY, tokenizer)


def odd_length(completions, **kwargs):  # a reward with some spread within groups
    return [float(len(text) % 2) for text in completions]


def prompts(n, seed=7):
    problems = tiny_task.ProblemStream(TINY, seed).next(n)
    return Dataset.from_dict({"prompt": tiny_task.prompt_texts(problems)})


def left_padded(tokenizer, texts):  # (ids, attention), prompts as TRL pads them
    batch = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


def token_logprobs(logits, targets):  # log pi of each target token, in float32
    return logits.float().log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)


def config(cls=GRPOConfig, **settings):
    base = dict(output_dir=tempfile.mkdtemp(prefix="test-trl-tc-"), report_to="none",
                save_strategy="no", use_cpu=True, bf16=False, activation_checkpointing=False,
                disable_tqdm=True, seed=0, per_device_train_batch_size=2 * G, num_generations=G,
                max_completion_length=MAX_COMPLETION, use_bias_correction_kl=False, top_k=0,
                logging_steps=1)
    return cls(**{**base, **settings})


def make_trainer(model, tokenizer, credit=None, cls=TokenCreditGRPOTrainer, eval_dataset=None,
                 **settings):
    extra = dict(credit=credit) if cls is TokenCreditGRPOTrainer else {}
    if settings.get("beta"):  # TRL loads the reference model from the policy's path: give it one
        from transformers import AutoModelForCausalLM
        path = tempfile.mkdtemp(prefix="test-trl-tc-model-")
        model.save_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
    trainer = cls(model=model, reward_funcs=odd_length, args=config(**settings),
                  train_dataset=prompts(16), eval_dataset=eval_dataset, processing_class=tokenizer,
                  **extra)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; _compute_loss reads it
    return trainer


@pytest.fixture(scope="module")
def trainer(tokenizer):
    return make_trainer(tiny_model(tokenizer), tokenizer)


@contextlib.contextmanager
def setting(obj, **values):
    old = {k: getattr(obj, k) for k in values}
    for k, v in values.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


def rollout_batch(trainer, lengths, seed=4, spread=0.5, beta=False):
    """inputs as TRL's _compute_loss receives them: N = len(lengths) rows, groups of G
    consecutive rows, prompts of unequal lengths (so left padding is there)."""
    tokenizer, g = trainer.processing_class, torch.Generator().manual_seed(seed)
    N = len(lengths)
    problems = [p for p in tiny_task.ProblemStream(TINY, seed).next(N // G) for _ in range(G)]
    texts = tiny_task.prompt_texts(problems)
    prompt_ids, prompt_mask = left_padded(tokenizer, texts)
    prompt_lengths = prompt_mask.sum(dim=1)
    assert prompt_lengths.min() < prompt_lengths.max(), f"seed {seed}: prompts of equal lengths"
    T = max(lengths)
    completion_mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (N, T)
    digits = torch.randint(2, len(tokenizer), (N, T), generator=g)  # characters, no <pad>/<eos>
    completion_ids = torch.where(completion_mask.bool(), digits, tokenizer.pad_token_id)
    rewards = torch.randint(0, 2, (N // G, G), generator=g).float()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0  # both signs in every group
    inputs = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                  completion_mask=completion_mask,
                  advantages=tc.group_advantages(rewards).flatten(),
                  num_items_in_batch=completion_mask.sum(), tc_group=torch.arange(N) // G)
    with torch.no_grad():
        logp = scored(trainer, inputs)
    noise = spread * torch.randn(N, T, generator=g)
    inputs["old_per_token_logps"] = (logp + noise) * completion_mask  # ratios exp(-noise)
    if beta:
        inputs["ref_per_token_logps"] = (logp - noise.flip(0)) * completion_mask
    return inputs


def scored(trainer, inputs):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    return trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention,
                                                      inputs["completion_ids"].shape[1])[0]


def loss_and_grad(model, compute):
    model.zero_grad(set_to_none=True)
    loss = compute()
    loss.backward()
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    return loss.detach(), torch.cat(grads)


def trl_loss(trainer, inputs):
    return loss_and_grad(trainer.model,
                         lambda: GRPOTrainer._compute_loss(trainer, trainer.model, inputs))


def our_loss(trainer, inputs, credit=None):
    """The bridge's loss; with `credit`, that Credit resolved against the trainer's GRPOConfig."""
    credit = trainer.credit if credit is None else resolve_credit(credit, trainer.args)
    with setting(trainer, credit=credit):
        return loss_and_grad(trainer.model, lambda: trainer.compute_loss(trainer.model, inputs))


def split(inputs, rows):
    return {k: v if v.dim() == 0 else v[rows] for k, v in inputs.items()}


def assert_equal_to_trl(trainer, inputs, label):
    trainer.model.train()
    trl, trl_grad = trl_loss(trainer, inputs)
    ours, our_grad = our_loss(trainer, inputs)
    metrics = trainer._metrics["train"]
    clipped = metrics["tc/clip_frac_low"][-1] + metrics["tc/clip_frac_high"][-1]
    d_loss, d_grad = (ours - trl).abs().item(), (our_grad - trl_grad).abs().max().item()
    print(f"\n{label}: loss {trl.item():+.6f}, max|diff| loss {d_loss:.1e}, grad {d_grad:.1e} "
          f"(grad max {trl_grad.abs().max().item():.1e}, clipped {clipped:.2f})")
    assert clipped > 0.05  # the clip matters in this batch
    assert d_loss <= 1e-6 * max(1.0, trl.abs().item())
    assert d_grad <= 1e-6 * trl_grad.abs().max().item()


LENGTHS = [12, 3, 0, 7, 9, 1, 12, 5]  # one empty completion, one at the budget

# (GRPOConfig settings; the Credit that says the same thing explicitly, which must be accepted)
EXACT = [
    (dict(loss_type="grpo"), Credit(loss_mode="sample")),
    (dict(loss_type="bnpo"), Credit(loss_mode="token", token_count="local")),
    (dict(), Credit(loss_mode="token", token_count="global")),  # TRL's default loss_type, dapo
    (dict(loss_type="dr_grpo"), Credit(loss_mode="constant", max_len=MAX_COMPLETION)),
    (dict(epsilon_high=0.28), Credit(loss_mode="token")),  # Clip-Higher
    (dict(loss_type="grpo", importance_sampling_level="sequence"),  # GSPO
     Credit(loss_mode="sample", ratio_level="sequence")),
    (dict(loss_type="grpo", beta=0.04), Credit(loss_mode="sample")),  # k3 KL without the IS factor
    (dict(loss_type="grpo", top_entropy_quantile=0.2),
     Credit(loss_mode="sample", token_weights_fn=high_entropy_weights(0.2))),
    (dict(loss_type="grpo", top_entropy_quantile=0.2, temperature=0.7),  # entropies of logits / T
     Credit(loss_mode="sample", token_weights_fn=high_entropy_weights(0.2))),
    (dict(loss_type="luspo", importance_sampling_level="sequence"),
     Credit(loss_mode="constant", max_len=1, ratio_level="sequence")),
    (dict(loss_type="luspo"), Credit(loss_mode="constant", max_len=1)),  # TRL warns: not LUSPO's
]


def label(settings):
    return "-".join(f"{k}={v}" for k, v in settings.items()) or "defaults"


@pytest.mark.filterwarnings("ignore:GRPOConfig\\(loss_type='luspo'\\)")
@pytest.mark.parametrize("settings, credit", EXACT, ids=[label(r[0]) for r in EXACT])
def test_without_credit_the_loss_and_gradient_are_trls(tokenizer, settings, credit):
    """No Credit: the bridge computes what TRL's own _compute_loss computes from the same
    GRPOConfig; and the Credit that spells it out agrees with that GRPOConfig."""
    trainer = make_trainer(tiny_model(tokenizer), tokenizer, **settings)
    inputs = rollout_batch(trainer, LENGTHS, beta="beta" in settings)
    assert_equal_to_trl(trainer, inputs, label(settings))
    explicit = resolve_credit(credit, trainer.args)
    assert (dataclasses.replace(explicit, token_weights_fn=None)
            == dataclasses.replace(trainer.credit, token_weights_fn=None))
    fraction = getattr(trainer.credit.token_weights_fn, "top_fraction", None)
    assert fraction == getattr(explicit.token_weights_fn, "top_fraction", None)


# Each setting a Credit with defaults used to override silently: (GRPOConfig, what must run)
UNSET = [
    (dict(), dict(loss_mode="token", token_count="global", adv_eps=1e-4, adv_scale="std",
                  ratio_level="token", surrogate="clip", baseline="mean")),
    (dict(loss_type="grpo"), dict(loss_mode="sample")),
    (dict(loss_type="bnpo"), dict(loss_mode="token", token_count="local")),
    (dict(loss_type="dr_grpo"), dict(loss_mode="constant", max_len=MAX_COMPLETION)),
    (dict(loss_type="luspo", importance_sampling_level="sequence"),
     dict(loss_mode="constant", max_len=1, ratio_level="sequence")),
    (dict(scale_rewards="batch"), dict(adv_scale="batch", adv_eps=1e-4)),
    (dict(scale_rewards="none"), dict(adv_scale="none")),
    (dict(scale_rewards=False), dict(adv_scale="none")),  # GRPOConfig turns False into "none"
    (dict(importance_sampling_level="sequence"), dict(ratio_level="sequence")),
]


def test_entropies_the_weights_see_are_of_the_logits_over_temperature(tokenizer):
    """TRL's fused LM head divides the logits by GRPOConfig's temperature before the entropy; the
    bridge hands token_weights_fn those same entropies, so high_entropy_weights ranks what TRL's
    top_entropy_quantile ranks."""
    trainer = make_trainer(tiny_model(tokenizer, seed=1), tokenizer, temperature=0.5)
    inputs = rollout_batch(trainer, LENGTHS)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    T, mask = inputs["completion_ids"].shape[1], inputs["completion_mask"].bool()
    with torch.no_grad():
        entropies = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, T, compute_entropy=True)[1]
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = trainer.model(input_ids=ids, attention_mask=attention,
                               position_ids=positions).logits[:, -T - 1:-1]
    at_temperature = tc.token_entropy(logits / 0.5)
    assert (entropies - at_temperature).abs()[mask].max() < 1e-5
    assert (entropies - tc.token_entropy(logits)).abs()[mask].max() > 0.01  # T matters here


@pytest.mark.parametrize("settings, expected", UNSET, ids=[label(r[0]) for r in UNSET])
def test_credit_left_unset_is_what_grpoconfig_says(settings, expected):
    resolved = resolve_credit(Credit(), config(**settings))
    assert {k: getattr(resolved, k) for k in expected} == expected


def test_top_entropy_quantile_becomes_high_entropy_weights_on_one_process_only():
    weights = resolve_credit(None, config(top_entropy_quantile=0.3)).token_weights_fn
    assert weights.top_fraction == 0.3
    with pytest.raises(ValueError, match="over every process's tokens"):
        resolve_credit(None, config(top_entropy_quantile=0.3), num_processes=2)
    assert resolve_credit(None, config(), num_processes=2).token_weights_fn is None


@pytest.mark.parametrize("loss_type, settings, reason", [
    ("cispo", dict(epsilon_high=5.0), "capped at epsilon_high"),
    ("sapo", {}, "sigmoid gate"),
    ("vespo", {}, "gamma weight"),
])
def test_loss_types_tokencredit_cannot_express_are_refused_at_start(tokenizer, loss_type,
                                                                    settings, reason):
    with pytest.raises(ValueError, match=f"^loss_type must be one of \\['bnpo', 'dapo', "
                                         f"'dr_grpo', 'grpo', 'luspo'\\], got '{loss_type}': "
                                         f".*{reason}"):
        make_trainer(tiny_model(tokenizer), tokenizer, loss_type=loss_type, **settings)


DISAGREE = [  # (GRPOConfig settings, a Credit, the message: the key, what is allowed, the value)
    (dict(loss_type="bnpo"), Credit(loss_mode="sample"), "loss_mode must be 'token', as "
     "loss_type 'bnpo' says, or unset, got 'sample' (or change loss_type)"),
    (dict(loss_type="bnpo"), Credit(token_count="global"), "token_count must be 'local', as "
     "loss_type 'bnpo' says, or unset, got 'global' (or change loss_type)"),
    (dict(loss_type="dr_grpo"), Credit(max_len=7), "max_len must be 12, as loss_type 'dr_grpo' "
     "says, or unset, got 7 (or change loss_type)"),
    (dict(loss_type="grpo"), Credit(surrogate="reinforce"), "surrogate must be 'clip', as "
     "loss_type 'grpo' says, or unset, got 'reinforce' (or change loss_type)"),
    (dict(scale_rewards="none"), Credit(adv_scale="std"), "adv_scale must be 'none', as "
     "scale_rewards 'none' says, or unset, got 'std' (or change scale_rewards)"),
    (dict(importance_sampling_level="sequence"), Credit(ratio_level="sequence_token"),
     "ratio_level must be 'sequence', as importance_sampling_level 'sequence' says, or unset, got "
     "'sequence_token' (or change importance_sampling_level)"),
    (dict(top_entropy_quantile=0.2), Credit(token_weights_fn=high_entropy_weights(0.5)),
     "token_weights_fn must be unset or high_entropy_weights(0.2), as top_entropy_quantile 0.2 "
     "says, got 'high_entropy_weights(0.5)'"),
]


@pytest.mark.parametrize("settings, credit, message", DISAGREE,
                         ids=[f"{label(r[0])}-{r[2].split()[0]}" for r in DISAGREE])
def test_credit_disagreeing_with_a_changed_setting_raises_at_start(tokenizer, settings, credit,
                                                                  message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        make_trainer(tiny_model(tokenizer), tokenizer, credit, **settings)


@pytest.mark.parametrize("settings, credit, field, value", [
    (dict(), Credit(loss_mode="sample"), "loss_mode", "sample"),  # loss_type left at TRL's dapo
    (dict(loss_type="dapo"), Credit(loss_mode="group_token"), "loss_mode",
     "group_token"),  # = the default
    (dict(loss_type="grpo"), Credit(loss_mode="sample"), "loss_mode", "sample"),  # agrees
    (dict(), Credit(adv_scale="none", baseline="leave_one_out"), "baseline", "leave_one_out"),
    (dict(loss_type="grpo"), Credit(adv_eps=1e-6), "adv_eps", 1e-6),  # TRL has no setting
    (dict(top_entropy_quantile=0.2), Credit(token_weights_fn=high_entropy_weights(0.2)),
     "ratio_level", "token"),
])
def test_credit_agreeing_or_over_a_default_is_accepted(settings, credit, field, value):
    assert getattr(resolve_credit(credit, config(**settings)), field) == value


def test_advantages_without_credit_are_trls_for_every_scale_rewards(tokenizer):
    batch = None
    for scale in ("group", "batch", "none"):
        trainer = make_trainer(tiny_model(tokenizer), tokenizer, scale_rewards=scale)
        trainer.model.train()
        batch = [trainer.train_dataset[i] for i in range(2) for _ in range(G)]  # as TRL's sampler
        torch.manual_seed(0)
        trls = GRPOTrainer._generate_and_score_completions(trainer, batch)  # TRL's advantages
        rewards = trainer._rewards_per_func[:, 0].view(-1, G)
        assert rewards.std(dim=1).max() > 0  # some group has something to compare
        torch.manual_seed(0)
        ours = trainer._generate_and_score_completions(batch)
        assert torch.equal(trainer._rewards_per_func[:, 0].view(-1, G), rewards)  # same samples
        difference = (ours["advantages"] - trls["advantages"]).abs().max().item()
        print(f"\nscale_rewards={scale!r}: advantages max|diff| {difference:.1e}")
        assert difference <= 1e-6
    trainer.credit = resolve_credit(Credit(baseline="leave_one_out"), trainer.args)
    out = trainer._generate_and_score_completions(batch)
    rewards = trainer._rewards_per_func[:, 0].view(-1, G)
    expected = tc.group_advantages(rewards, scale="none", baseline="leave_one_out").flatten()
    assert torch.equal(out["advantages"], expected)
    assert out["tc_group"].tolist() == [0] * G + [1] * G


def trl_loss_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "trl.trainer.grpo_trainer" and "loss" in r.getMessage()]


def test_trls_loss_warnings_speak_of_the_settings_that_run(tokenizer, caplog):
    """TRL warns about GRPOConfig's loss settings; the bridge says the same of the ones it runs."""
    sequence = dict(importance_sampling_level="sequence")
    with caplog.at_level(logging.WARNING, logger="trl"):
        make_trainer(tiny_model(tokenizer), tokenizer, cls=GRPOTrainer, **sequence)
    assert any("`'dapo'` loss sums per-token" in m for m in trl_loss_warnings(caplog))  # stock
    caplog.clear()
    with (caplog.at_level(logging.WARNING, logger="trl"),
          warnings.catch_warnings(record=True) as w):
        warnings.simplefilter("always")
        make_trainer(tiny_model(tokenizer), tokenizer, Credit(loss_mode="sample"),
                     **sequence)  # GSPO
        make_trainer(tiny_model(tokenizer), tokenizer, Credit(ratio_level="sequence"),
                     loss_type="luspo")
    assert trl_loss_warnings(caplog) == []
    assert [str(x.message) for x in w if "ratio_level" in str(x.message)] == []
    with pytest.warns(UserWarning, match="ratio_level='sequence' with loss_mode 'token' sums"):
        make_trainer(tiny_model(tokenizer), tokenizer, **sequence)  # dapo's mode: TRL's warning
    with pytest.warns(UserWarning, match="loss_type='luspo'\\) with ratio_level='token'"):
        make_trainer(tiny_model(tokenizer), tokenizer, loss_type="luspo")
    assert trl_loss_warnings(caplog) == []


def test_group_token_checks_the_evaluation_batch_at_start(tokenizer):
    credit = Credit(loss_mode="group_token")
    with pytest.raises(ValueError, match="^per_device_eval_batch_size must be a multiple of "
                                         "num_generations_eval \\(4\\) with loss_mode "
                                         "'group_token', got 6$"):
        make_trainer(tiny_model(tokenizer), tokenizer, credit, eval_dataset=prompts(4, seed=8),
                     per_device_eval_batch_size=6, num_generations_eval=4)
    make_trainer(tiny_model(tokenizer), tokenizer, credit, eval_dataset=prompts(4, seed=8),
                 per_device_eval_batch_size=8, num_generations_eval=4)
    later = make_trainer(tiny_model(tokenizer), tokenizer, credit, per_device_eval_batch_size=6,
                         num_generations_eval=4)  # no eval set yet: evaluate() checks it
    with pytest.raises(ValueError, match="per_device_eval_batch_size must be a multiple"):
        later.evaluate(eval_dataset=prompts(4, seed=8))


def plain_group_token(logp, old, A, mask, B, eps=0.2):
    """DAPO's printed equation, a loop: (1/B) sum_groups (1 / tokens of the group) sum loss_it."""
    total = 0.0
    for b in range(B):
        rows = range(b * G, (b + 1) * G)
        tokens = sum(int(mask[i].sum()) for i in rows)
        for i in rows:
            for t in range(int(mask[i].sum())):
                ratio = torch.exp(logp[i, t] - old[i, t])
                clipped = ratio.clamp(1 - eps, 1 + eps)
                total = total - torch.min(ratio * A[i, t], clipped * A[i, t]) / (B * tokens)
    return total


def test_group_token_is_dapos_printed_equation_and_differs_from_trl_dapo(trainer):
    """Two prompts, one with long answers and one with short: TRL's dapo weighs every token of
    the batch alike, group_token gives each prompt the same share. Rows shuffled: the same loss."""
    trainer.model.train()
    inputs = rollout_batch(trainer, [12, 11, 12, 10, 2, 3, 1, 2], seed=3)
    trl, trl_grad = trl_loss(trainer, inputs)  # the module's trainer: TRL's default, dapo
    ours, our_grad = our_loss(trainer, inputs, Credit(loss_mode="group_token"))
    A = inputs["advantages"][:, None].expand_as(inputs["old_per_token_logps"])
    ref, ref_grad = loss_and_grad(trainer.model, lambda: plain_group_token(
        scored(trainer, inputs), inputs["old_per_token_logps"], A, inputs["completion_mask"], 2))
    shuffled, shuffled_grad = our_loss(trainer, split(inputs, torch.randperm(8)),
                                       Credit(loss_mode="group_token"))
    rel_loss = ((ours - trl).abs() / trl.abs()).item()
    rel_grad = ((our_grad - trl_grad).norm() / trl_grad.norm()).item()
    print(f"\ngroup_token vs TRL dapo: loss {ours.item():+.5f} vs {trl.item():+.5f} (relative "
          f"diff {rel_loss:.2f}), gradient relative diff {rel_grad:.2f}; vs the plain loop: "
          f"{(ours - ref).abs().item():.1e}, grad {(our_grad - ref_grad).abs().max().item():.1e}")
    tolerance = 1e-6 * ref_grad.abs().max()
    assert (ours - ref).abs() < 1e-6 and (our_grad - ref_grad).abs().max() < tolerance
    assert (ours - shuffled).abs() < 1e-6 and (our_grad - shuffled_grad).abs().max() < tolerance
    assert rel_grad > 0.1


def test_group_token_refuses_split_groups(trainer):
    """A micro-batch of split groups; a batch size that would split them is refused when the
    config is made (test_each_bad_setting_is_refused_when_the_config_is_made)."""
    inputs = rollout_batch(trainer, LENGTHS)
    with pytest.raises(ValueError, match="incomplete groups"):
        our_loss(trainer, split(inputs, torch.arange(6)), Credit(loss_mode="group_token"))


def test_per_token_weights_trl_cannot_express(trainer):
    """CSCR-style weights (any (N, T) >= 0): TRL's loss has no place for them; ours is the plain
    formula."""
    trainer.model.train()
    inputs = rollout_batch(trainer, LENGTHS, seed=5)
    mask = inputs["completion_mask"]
    sensitivity = torch.rand(mask.shape, generator=torch.Generator().manual_seed(1))
    weights = tc.cscr_weights(sensitivity, mask, strength=2.0)
    credit = Credit(loss_mode="sample", token_weights_fn=lambda *a: weights)
    ours, our_grad = our_loss(trainer, inputs, credit)
    with setting(trainer, loss_type="grpo"):
        trl, trl_grad = trl_loss(trainer, inputs)

    def plain():
        logp, old = scored(trainer, inputs), inputs["old_per_token_logps"]
        A, total = inputs["advantages"], 0.0
        for i in range(len(LENGTHS)):
            for t in range(LENGTHS[i]):
                ratio, a = torch.exp(logp[i, t] - old[i, t]), A[i] * weights[i, t]
                per_token = torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a)
                total = total - per_token / (len(LENGTHS) * LENGTHS[i])
        return total
    ref, ref_grad = loss_and_grad(trainer.model, plain)
    rel_grad = ((our_grad - trl_grad).norm() / trl_grad.norm()).item()
    print(f"\nCSCR weights (strength 2) vs TRL grpo: loss {ours.item():+.5f} vs {trl.item():+.5f},"
          f" gradient relative diff {rel_grad:.2f}; vs the plain loop "
          f"{(ours - ref).abs().item():.1e}")
    assert (ours - ref).abs() < 1e-6
    assert (our_grad - ref_grad).abs().max() < 1e-6 * ref_grad.abs().max()
    assert rel_grad > 0.05


def vllm_is_ratio(inputs, mode, seed=3, clip_max=2.0):
    """vLLM's importance-sampling weights as TRL 1.16's _generate_and_score_completions computes
    them, from sampling log-probs (vLLM's) a little off the old ones: exp(old - sampling) per
    token, or of its sum per row ("sequence_*"); "*_truncate" clamps at clip_max, "*_mask" sets
    what exceeds it to 0."""
    mask = inputs["completion_mask"]
    noise = 0.6 * torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed))
    diff = noise * mask  # old - sampling
    ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    assert (ratio > clip_max).any()  # the bound acts in this batch
    if mode.endswith("truncate"):
        return ratio.clamp(max=clip_max)
    return ratio.masked_fill(ratio > clip_max, 0.0)


IS_SETTINGS = [dict(loss_type="grpo"), dict(), dict(loss_type="bnpo"), dict(loss_type="dr_grpo"),
               dict(loss_type="luspo", importance_sampling_level="sequence"),
               dict(loss_type="grpo", importance_sampling_level="sequence"),  # GSPO
               dict(loss_type="grpo", beta=0.04)]  # the KL is not weighted


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate",
                                  "sequence_mask"])
@pytest.mark.parametrize("settings", IS_SETTINGS, ids=[label(s) for s in IS_SETTINGS])
def test_vllm_importance_sampling_weights_compose_with_the_credit(tokenizer, settings, mode):
    """use_vllm with vllm_importance_sampling_correction (TRL's default): the loss and gradient
    equal TRL's own loss given the same per-token weights; without vLLM here, the trainer is
    told it uses vLLM and the batch carries the weights TRL would compute."""
    trainer = make_trainer(tiny_model(tokenizer), tokenizer, **settings)
    inputs = rollout_batch(trainer, LENGTHS, beta="beta" in settings)
    inputs["importance_sampling_ratio"] = vllm_is_ratio(inputs, mode)
    trainer.model.train()
    _, without = trl_loss(trainer, inputs)
    with setting(trainer, use_vllm=True, vllm_importance_sampling_correction=True,
                 vllm_importance_sampling_mode=mode):
        assert_equal_to_trl(trainer, inputs, f"{label(settings)} {mode}")
        _, weighted = trl_loss(trainer, inputs)
    assert (weighted - without).norm() > 0.05 * without.norm()  # the weights matter here


def test_vllm_importance_sampling_weights_multiply_cscrs(trainer):
    """With per-token weights w (CSCR's) and vLLM's m: A_{i,t} = A_i w_{i,t} m_{i,t}, the plain
    product, at token level."""
    trainer.model.train()
    inputs = rollout_batch(trainer, LENGTHS, seed=5)
    mask = inputs["completion_mask"]
    w = tc.cscr_weights(torch.rand(mask.shape, generator=torch.Generator().manual_seed(1)), mask,
                        strength=2.0)
    m = vllm_is_ratio(inputs, "token_truncate")
    inputs["importance_sampling_ratio"] = m
    with setting(trainer, use_vllm=True, vllm_importance_sampling_correction=True):
        ours, our_grad = our_loss(trainer, inputs, Credit(loss_mode="sample",
                                                          token_weights_fn=lambda *a: w))
    product = dict(inputs, advantages=inputs["advantages"][:, None] * w * m)
    ref, ref_grad = our_loss(trainer, product, Credit(loss_mode="sample"))  # no vLLM: no m
    assert (ours - ref).abs() <= 1e-7 and (our_grad - ref_grad).abs().max() <= 1e-7


def test_mask_truncated_completions_is_trls(tokenizer):
    """mask_truncated_completions=True: the completions cut at max_completion_length get mask 0
    in TRL's generation step, which the bridge keeps; the loss and gradient on that batch equal
    TRL's (dapo, whose token count num_items_in_batch leaves the masked rows out)."""
    trainer = make_trainer(tiny_model(tokenizer), tokenizer, mask_truncated_completions=True,
                           max_completion_length=5)
    trainer.model.train()
    batch = [trainer.train_dataset[i] for i in range(2) for _ in range(G)]
    torch.manual_seed(1)
    trls = GRPOTrainer._generate_and_score_completions(trainer, batch)
    torch.manual_seed(1)
    ours = trainer._generate_and_score_completions(batch)
    assert torch.equal(ours["completion_ids"], trls["completion_ids"])
    ended = (ours["completion_ids"] == tokenizer.eos_token_id).any(dim=1)  # (N,)
    assert 0 < ended.sum() < len(ended)  # both kinds in this batch
    assert torch.equal(ours["completion_mask"], trls["completion_mask"])
    assert (ours["completion_mask"][~ended] == 0).all() and (ours["completion_mask"][ended]
                                                                .sum(dim=1) > 0).all()
    assert ours["num_items_in_batch"] == ours["completion_mask"].sum()
    trl, trl_grad = loss_and_grad(trainer.model, lambda: GRPOTrainer._compute_loss(
        trainer, trainer.model, trls))
    mine, my_grad = loss_and_grad(trainer.model, lambda: trainer.compute_loss(trainer.model,
                                                                                ours))
    print(f"\nmask_truncated_completions: {int((~ended).sum())} of {len(ended)} rows masked; "
          f"loss max|diff| {(mine - trl).abs().item():.1e}, grad "
          f"{(my_grad - trl_grad).abs().max().item():.1e}")
    assert (mine - trl).abs() <= 1e-6 * max(1.0, trl.abs().item())
    assert (my_grad - trl_grad).abs().max() <= 1e-5 * trl_grad.abs().max()


def one_token(mask, value):  # weights of 1, `value` at the first token of row 0 (a real token)
    weights = torch.ones(mask.shape)
    weights[0, 0] = value
    return weights


@pytest.mark.parametrize("bad", [
    lambda mask: one_token(mask, -0.5),  # negative
    lambda mask: one_token(mask, float("nan")),
    lambda mask: one_token(mask, float("inf")),
    lambda mask: torch.ones(mask.shape[0], 1),  # broadcasts over (N, T): not the mask's shape
    lambda mask: torch.ones(mask.shape[0], mask.shape[1] + 1),
    lambda mask: torch.ones(mask.shape).tolist(),  # not a tensor
], ids=["negative", "nan", "inf", "N-by-1", "N-by-T+1", "list"])
def test_token_weights_fn_must_return_finite_weights_of_the_masks_shape(trainer, bad):
    inputs = rollout_batch(trainer, LENGTHS)
    credit = Credit(loss_mode="sample",
                    token_weights_fn=lambda inputs, logp, entropies, mask: bad(mask))
    with pytest.raises(ValueError, match="token_weights_fn must return finite weights >= 0 of "
                                         "shape \\(8, 12\\) \\(N, T\\), got"):
        our_loss(trainer, inputs, credit)


@pytest.mark.parametrize("mode", ["sample", "token", "constant"])
def test_token_weights_of_one_change_nothing(trainer, mode):
    trainer.model.train()
    inputs = rollout_batch(trainer, LENGTHS, seed=5)
    ones = Credit(loss_mode=mode, token_weights_fn=lambda inputs, logp, *a: torch.ones_like(logp))
    plain, plain_grad = our_loss(trainer, inputs, Credit(loss_mode=mode))
    weighted, weighted_grad = our_loss(trainer, inputs, ones)
    assert torch.equal(weighted, plain) and torch.equal(weighted_grad, plain_grad)


def test_token_normaliser_global_or_local_under_gradient_accumulation(trainer):
    """2 micro-batches (GA = 2) of unequal token counts: "global" is the token mean over both
    (TRL dapo), "local" the mean of the two micro-batch means (TRL bnpo). They differ."""
    trainer.model.train()
    lengths = [12, 11, 12, 10, 2, 3, 1, 2]
    inputs = rollout_batch(trainer, lengths, seed=4)
    parts = [split(inputs, torch.arange(0, 4)), split(inputs, torch.arange(4, 8))]  # 45, 8 tokens

    def accumulated(compute):  # what one optimizer step applies: the micro-batches' losses summed
        return loss_and_grad(trainer.model, lambda: sum(compute(p) for p in parts))

    with (setting(trainer, current_gradient_accumulation_steps=2),
          setting(trainer.args, steps_per_generation=2)):
        results = {}
        for name, loss_type, credit in (
                ("global", "dapo", Credit(loss_mode="token")),
                ("local", "bnpo", Credit(loss_mode="token", token_count="local"))):
            with setting(trainer, credit=resolve_credit(credit, trainer.args),
                         loss_type=loss_type):
                results[name] = accumulated(lambda p: trainer.compute_loss(trainer.model, p))
                results[loss_type] = accumulated(
                    lambda p: GRPOTrainer._compute_loss(trainer, trainer.model, p))
    old, A, mask = inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"]
    results["token mean"] = loss_and_grad(trainer.model, lambda: tc.policy_loss(
        scored(trainer, inputs), old, A, mask, mode="token")[0])
    results["mean of means"] = loss_and_grad(trainer.model, lambda: sum(tc.policy_loss(
        scored(trainer, p), p["old_per_token_logps"], p["advantages"], p["completion_mask"],
        mode="token")[0] for p in parts) / 2)

    def diff(a, b):
        return max((results[a][0] - results[b][0]).abs().item(),
                   (results[a][1] - results[b][1]).abs().max().item())
    print(f"\nGA=2, micro-batches of 45 and 8 tokens: global loss "
          f"{results['global'][0].item():+.5f}, local {results['local'][0].item():+.5f}; global "
          f"vs token mean {diff('global', 'token mean'):.1e}, vs dapo {diff('global', 'dapo'):.1e}"
          f"; local vs mean of means {diff('local', 'mean of means'):.1e}, vs bnpo "
          f"{diff('local', 'bnpo'):.1e}; global vs local {diff('global', 'local'):.2e}")
    for a, b in (("global", "token mean"), ("global", "dapo"), ("local", "mean of means"),
                 ("local", "bnpo")):
        assert diff(a, b) < 1e-6, (a, b)
    assert diff("global", "local") > 1e-3


def test_positions_score_what_was_sampled(tokenizer):
    """Left-padded prompts on a model with absolute positions: stock TRL's log-probs are off by
    the padding's shift, the bridge's equal those of the distribution generate() sampled from."""
    model = tiny_model(tokenizer, seed=1)
    with torch.no_grad():
        model.transformer.wpe.weight.normal_(0.0, 1.0)  # positions that matter, as trained,
        model.transformer.wte.weight.normal_(0.0, 0.2)  # and a policy far from uniform
    stock = make_trainer(copy.deepcopy(model), tokenizer, cls=GRPOTrainer)
    ours = make_trainer(copy.deepcopy(model), tokenizer)
    problems = tiny_task.ProblemStream(TINY, 11).next(16)  # 2 to 5 terms: prompts of 4 to 10 tokens
    ids, attention = left_padded(tokenizer, tiny_task.prompt_texts(problems))
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    out = model.eval().generate(input_ids=ids, attention_mask=attention, do_sample=True, top_k=0,
                                max_new_tokens=10, output_logits=True,
                                return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=eos)
    responses = out.sequences[:, ids.shape[1]:]  # (16, T)
    is_eos = (responses == eos).long()
    mask = is_eos.cumsum(1) - is_eos == 0  # up to and including the first <eos>
    responses = responses.masked_fill(~mask, tokenizer.pad_token_id)
    sampled = token_logprobs(torch.stack(out.logits, 1), responses)  # what generate() drew from
    assert 0 < mask.sum() < mask.numel()  # some stopped early, some ran to the budget
    with torch.no_grad():
        errors = {}
        for name, trainer in (("stock TRL", stock), ("TokenCreditGRPOTrainer", ours)):
            logp = trainer._get_per_token_logps_and_entropies(
                trainer.model, torch.cat([ids, responses], 1),
                torch.cat([attention, mask.long()], 1), responses.shape[1])[0]
            errors[name] = (logp - sampled).abs()[mask].mean().item()
    print("\nmean |log-prob error| per token vs sampling: "
          + ", ".join(f"{k} {e:.2e}" for k, e in errors.items()))
    assert errors["stock TRL"] > 0.1
    assert errors["TokenCreditGRPOTrainer"] < 1e-5


def family_model(family, tokenizer):
    """A tiny model of a family, built from its config, with larger weights than its
    initialisation (embeddings and position tables N(0, 1), matrices N(0, 0.3)): a policy far
    from uniform whose attention depends on positions."""
    from transformers import (GPTNeoConfig, GPTNeoForCausalLM, LlamaConfig, LlamaForCausalLM,
                              OPTConfig, OPTForCausalLM, Qwen2Config, Qwen2ForCausalLM)
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
               bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
               max_position_embeddings=128)
    rope = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2, **ids)
    torch.manual_seed(3)
    model = {
        "gpt2": lambda: tiny_model(tokenizer, seed=3),
        "gpt_neo": lambda: GPTNeoForCausalLM(GPTNeoConfig(
            hidden_size=32, num_layers=1, num_heads=2, attention_types=[[["global"], 1]], **ids)),
        "opt": lambda: OPTForCausalLM(OPTConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ffn_dim=64,
            word_embed_proj_dim=32, dropout=0.0, **ids)),
        "llama": lambda: LlamaForCausalLM(LlamaConfig(**rope)),
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**rope)),
    }[family]()
    tables = ("wte.weight", "wpe.weight", "embed_tokens.weight", "embed_positions.weight")
    g = torch.Generator().manual_seed(3)  # the same weights whatever ran before
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:  # weights that make positions and tokens matter (see the test)
                p.normal_(0.0, 1.0 if name.endswith(tables) else 0.3, generator=g)
    return model


FAMILIES = {"gpt2": True, "gpt_neo": True, "opt": False, "llama": False, "qwen2": False}


@pytest.mark.parametrize("family", FAMILIES)
def test_model_families_loss_equal_and_where_positions_matter(tokenizer, family):
    """On each family: the bridge's loss and gradient are TRL's (dapo, on the same model); and
    the position fix, against each row scored alone without padding, matters only for the
    families that number positions from the left edge (GPT-2, GPT-Neo), not for OPT (positions
    from the mask itself) or RoPE (relative positions)."""
    model = family_model(family, tokenizer)
    stock = make_trainer(copy.deepcopy(model), tokenizer, cls=GRPOTrainer)
    ours = make_trainer(copy.deepcopy(model), tokenizer)
    inputs = rollout_batch(ours, LENGTHS)
    assert_equal_to_trl(ours, inputs, family)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    T, mask = inputs["completion_ids"].shape[1], inputs["completion_mask"].bool()
    model.eval()
    with torch.no_grad():
        alone = torch.zeros(mask.shape)
        for i in range(len(LENGTHS)):  # each row without padding: positions 0, 1, 2, ...
            real = ids[i][attention[i].bool()]
            logits = model(input_ids=real[None]).logits[0, :-1].float()
            n = int(mask[i].sum())
            if n:
                alone[i, :n] = token_logprobs(logits[-n:][None], real[-n:][None])[0]
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        stretched = model(input_ids=ids, attention_mask=attention, position_ids=2 * positions)
        logp = token_logprobs(stretched.logits[:, -T - 1:-1].float(), inputs["completion_ids"])
        error = dict(stretched=(logp - alone).abs()[mask])  # positions matter in this model
        for name, trainer in (("stock", stock), ("ours", ours)):
            trainer.model.eval()
            logp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, T)[0]
            error[name] = (logp - alone).abs()[mask]
    print(f"\n{family}: |log-prob error| per token vs unpadded: " + ", ".join(
        f"{k} mean {e.mean():.2e} max {e.max():.2e}" for k, e in error.items()))
    assert error["stretched"].mean() > 0.1
    assert error["ours"].max() < 1e-4
    if FAMILIES[family]:
        assert error["stock"].mean() > 0.1
    else:
        assert error["stock"].max() < 1e-4


def test_smoke_training_with_accumulation_and_group_token(tokenizer):
    """A few steps: 2 micro-batches per generation batch (groups shuffled whole), 2 iterations,
    per-token weights."""
    model = tiny_model(tokenizer, seed=2)
    before = [p.detach().clone() for p in model.parameters()]
    credit = Credit(loss_mode="group_token", baseline="leave_one_out",
                    token_weights_fn=high_entropy_weights(0.5))
    trainer = make_trainer(model, tokenizer, credit, gradient_accumulation_steps=2,
                           steps_per_generation=2, num_iterations=2, max_steps=4,
                           learning_rate=1e-3, max_completion_length=8)
    trainer.train()
    logged = [r for r in trainer.state.log_history if "tc/clip_frac_low" in r]
    assert len(logged) == 4 and all(torch.isfinite(torch.tensor(r["loss"])) for r in logged)
    assert any((p.detach() - b).abs().max() > 0 for p, b in zip(model.parameters(), before))


# -----------------------------------------------------------------------------
# dynamic sampling (DAPO) inside the trainer: the verdicts are scripted per round, so which
# groups are informative is known; the shaped second reward makes every group's weighted sum
# differ, so a filter on the sum instead of the verdicts would keep other groups.

M1, M2, M3, ALL1, ALL0 = [1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1], [1] * G, [0] * G


class Scripted:
    """The verdict reward function `correct`, one table (B groups of G verdicts) per round."""

    def __init__(self, tables):
        self.tables, self.calls = tables, 0

    def __call__(self, completions, **kwargs):
        table = self.tables[min(self.calls, len(self.tables) - 1)]
        self.calls += 1
        return [float(v) for group in table for v in group]


def shaped(completion_ids, **kwargs):  # a length shaping: never equal within a group
    return [-0.01 * len(ids) - 0.001 * i for i, ids in enumerate(completion_ids)]


def ds_trainer(tokenizer, tables, credit, widths=None, dataset=None, model=None, **settings):
    """A trainer whose rounds are recorded (each round's batch, weighted rewards, verdicts);
    widths: each round's completions cut to that many tokens (rounds of different widths)."""
    correct = Scripted(tables)
    correct.__name__ = "correct"
    base = dict(per_device_train_batch_size=4 * G, num_iterations=2, reward_weights=[1.0, 1.0])
    trainer = TokenCreditGRPOTrainer(
        model=model or tiny_model(tokenizer), reward_funcs=[correct, shaped],
        args=config(**{**base, **settings}), train_dataset=dataset or prompts(16),
        processing_class=tokenizer, credit=credit)
    trainer.current_gradient_accumulation_steps = 1
    trainer.recorded = []
    score_round, generate = trainer._score_round, trainer._generate

    def record(batch):
        out = score_round(batch)
        trainer.recorded.append(({k: v.clone() for k, v in out.items()},
                                 trainer._round_rewards.clone(),
                                 trainer._rewards_per_func[:, 0].clone(), batch))
        return out

    def cut(prompts_):
        result = list(generate(prompts_))
        if widths is not None:
            width = widths[len(trainer.recorded) % len(widths)]
            result[1] = [list(ids)[:width] for ids in result[1]]
        return tuple(result)
    trainer._score_round, trainer._generate = record, cut
    return trainer


def first_batch(trainer):
    trainer.model.train()
    batch = [trainer.train_dataset[i] for i in range(4) for _ in range(G)]  # as TRL's sampler
    torch.manual_seed(0)
    return trainer._generate_and_score_completions(batch)


PADS = dict(prompt_ids="left", prompt_mask="left", completion_ids="right",
            completion_mask="right", old_per_token_logps="right")


def widen(t, width, side, value=0):
    extra = width - t.shape[1]
    return torch.nn.functional.pad(t, (extra, 0) if side == "left" else (0, extra), value=value)


def replayed_fill_batch(trainer, batch_size, max_rounds):
    """tc.fill_batch on the recorded rounds, every key padded to the widest round."""
    pad_id = trainer.processing_class.pad_token_id
    widths = {k: max(out[k].shape[1] for out, *_ in trainer.recorded) for k in PADS}
    rounds = iter(trainer.recorded)

    def sample_groups():
        out, rewards, verdicts, _ = next(rounds)
        B = rewards.numel() // G
        groups = dict(correct=verdicts.view(B, G), rewards=rewards.view(B, G))
        for key, side in PADS.items():
            value = pad_id if key.endswith("_ids") else 0
            groups[key] = widen(out[key], widths[key], side, value).view(B, G, -1)
        return groups
    batch, stats = tc.fill_batch(sample_groups, batch_size, max_rounds, "correct")
    return {k: v.flatten(0, 1) for k, v in batch.items()}, stats, widths


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_dynamic_sampling_keeps_what_fill_batch_keeps(tokenizer, scale):
    """Rounds of different widths: the kept batch (ids, masks, old log-probs, advantages, stats)
    is fill_batch's on the same rounds, and each kept row scores as it did in its own round."""
    tables = [[M1, ALL1, ALL0, M2], [ALL0, M3, ALL1, ALL1], [M2, M1, M3, ALL0]]
    credit = Credit(dynamic_sampling=True, max_rounds=3, filter_reward="correct")
    trainer = ds_trainer(tokenizer, tables, credit, widths=[12, 5, 9], scale_rewards=scale)
    out = first_batch(trainer)
    expected, stats, widths = replayed_fill_batch(trainer, 4, 3)
    assert stats == dict(rounds=3, groups_seen=12, groups_informative=6, groups_kept=4, full=1)
    assert [o["completion_ids"].shape[1] for o, *_ in trainer.recorded] == [12, 5, 9]
    pad_id = tokenizer.pad_token_id
    for key, side in PADS.items():
        ours = widen(out[key], widths[key], side, pad_id if key.endswith("_ids") else 0)
        assert torch.equal(ours, expected[key].to(ours.dtype)), key
    A = tc.group_advantages(expected["rewards"].view(-1, G), scale=tc_scale(scale),
                            eps=1e-4).flatten()
    assert torch.equal(out["advantages"], A)
    assert out["tc_real"].tolist() == [1.0] * 16 and int(out["tc_rows"]) == 16
    assert int(out["num_items_in_batch"]) == int(out["completion_mask"].sum())
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("ds/")}
    assert logged == {**{f"ds/{k}": float(v) for k, v in stats.items()},
                      "ds/reward": pytest.approx(float(expected["rewards"].mean()), abs=1e-6)}
    # the kept rows come from rounds 0 and 2, of widths 12 and 9, prompts re-padded: each row's
    # log-probs scored in the concatenated batch are those of its own round
    with torch.no_grad():
        again = scored(trainer, out)
    mask = out["completion_mask"].bool()
    difference = (again - out["old_per_token_logps"]).abs()[mask].max().item()
    print(f"\nscale {scale}: kept rows re-scored in the concatenated batch: max|diff| "
          f"{difference:.1e}")
    assert difference < 1e-5


def tc_scale(scale_rewards):
    return {"group": "std", "batch": "batch", "none": "none"}[scale_rewards]


def test_dynamic_sampling_filters_on_the_named_verdict(tokenizer):
    expected = ("filter_reward must be the name of the verdict to filter on, one of the reward "
                "functions ['correct', 'shaped'], got ")
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}None$"):
        ds_trainer(tokenizer, [[M1] * 4], Credit(dynamic_sampling=True))
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}'nope'$"):
        ds_trainer(tokenizer, [[M1] * 4], Credit(dynamic_sampling=True, filter_reward="nope"))
    with pytest.raises(ValueError, match="^max_rounds must be an int >= 1, got 0$"):
        resolve_credit(Credit(dynamic_sampling=True, max_rounds=0), config())
    trainer = ds_trainer(tokenizer, [[ALL1] * 4], Credit(dynamic_sampling=True,
                                                         filter_reward="correct"),
                         dataset=prompts(3))  # fewer prompts than a round draws
    trainer.model.train()
    batch = [trainer.train_dataset[i % 3] for i in range(4) for _ in range(G)]
    with pytest.raises(ValueError, match="draws 4 prompts per round, but the train_dataset has 3"):
        trainer._generate_and_score_completions(batch)


@pytest.mark.parametrize("mode", ["sample", "token", "group_token", "constant"])
def test_a_short_batch_is_policy_loss_on_the_kept_rows_alone(tokenizer, mode):
    """2 of 4 groups informative after max_rounds: the loss and gradient are tc.policy_loss on
    fill_batch's rows alone (its normalisers), the fillers weigh nothing."""
    tables = [[ALL1, ALL0, M1, ALL1], [ALL0, ALL0, ALL1, ALL1], [ALL1, M2, ALL0, ALL0]]
    credit = Credit(loss_mode=mode, dynamic_sampling=True, max_rounds=3, filter_reward="correct")
    trainer = ds_trainer(tokenizer, tables, credit, widths=[12, 7, 10])
    out = first_batch(trainer)
    expected, stats, _ = replayed_fill_batch(trainer, 4, 3)
    assert stats["groups_kept"] == 2 and stats["full"] == 0 and stats["rounds"] == 3
    assert out["tc_real"].tolist() == [1.0] * 8 + [0.0] * 8
    assert out["completion_mask"][8:].sum() == 0 and out["advantages"][8:].abs().sum() == 0
    model = trainer.model
    g = torch.Generator().manual_seed(1)
    noise = 0.5 * torch.randn(out["completion_mask"].shape, generator=g)
    out["old_per_token_logps"] = out["old_per_token_logps"] + noise  # so that the clip acts
    ours = loss_and_grad(model, lambda: trainer.compute_loss(model, out))

    def plain(rows=8):
        kept = {k: v[:rows] for k, v in out.items() if torch.is_tensor(v) and v.dim() > 0}
        logp = scored(trainer, kept)
        A = torch.nn.functional.pad(tc.group_advantages(expected["rewards"].view(-1, G),
                                                        eps=1e-4).flatten(), (0, rows - 8))
        return tc.policy_loss(logp, kept["old_per_token_logps"], A, kept["completion_mask"],
                              mode=mode, group_size=G, max_len=MAX_COMPLETION,
                              eps_low=0.2, eps_high=0.2)[0]
    theirs = loss_and_grad(model, plain)
    loss_diff = (ours[0] - theirs[0]).abs().item()
    grad_diff = (ours[1] - theirs[1]).abs().max().item()
    print(f"\nshort batch, mode {mode}: loss {ours[0].item():.2e}, max|diff| loss "
          f"{loss_diff:.1e} grad {grad_diff:.1e}")
    assert loss_diff < 1e-6 and grad_diff < 1e-6
    assert ours[0].abs().item() > 1e-4
    with_fillers = plain(16).item()  # the fillers counted as rows: other normalisers
    if mode != "token":  # (token: the fillers have no tokens to count)
        assert abs(with_fillers - ours[0].item()) > 0.3 * abs(ours[0].item())
    # two micro-batches (GA = 2), the kept rows all in the first: each is scaled by its share
    with setting(trainer.args, steps_per_generation=2, gradient_accumulation_steps=2), \
            setting(trainer, current_gradient_accumulation_steps=2):
        halves = [split(out, torch.arange(8)), split(out, torch.arange(8, 16))]
        accumulated = loss_and_grad(model, lambda: sum(trainer.compute_loss(model, h)
                                                       for h in halves))
    assert (accumulated[0] - theirs[0]).abs() < 1e-6
    assert (accumulated[1] - theirs[1]).abs().max() < 1e-6


def test_dynamic_sampling_of_one_round_is_the_bridge_without_it(tokenizer):
    """max_rounds=1 and every group informative: the same batch, loss and gradient as
    dynamic sampling off."""
    tables = [[M1, M2, M3, M1]]
    results = []
    for credit in (Credit(), Credit(dynamic_sampling=True, max_rounds=1,
                                    filter_reward="correct")):
        trainer = ds_trainer(tokenizer, tables, credit)
        out = first_batch(trainer)
        model = trainer.model
        results.append((out, loss_and_grad(model, lambda: trainer.compute_loss(model, out))))
    (off, (loss_off, grad_off)), (on, (loss_on, grad_on)) = results
    for key in off:
        assert torch.equal(off[key], on[key]), key
    assert torch.equal(loss_off, loss_on) and torch.equal(grad_off, grad_on)
    assert loss_off.abs() > 1e-3


def test_dynamic_sampling_leaves_the_epochs_and_the_main_prompt_stream_alone(tokenizer):
    """Training 4 generation batches over 8 prompts (2 epochs): the prompts TRL's loader hands
    over and the epoch count are those without dynamic sampling; extra rounds draw elsewhere.
    Batch 2 finds nothing informative in 3 rounds: its loss is 0 and training goes on."""
    tables = [[ALL1, M1, ALL0, M2], [M1, M2, M3, M1], [ALL1] * 4, [ALL0] * 4, [ALL1] * 4,
              [M1] * 4]
    seen, states = [], []
    for credit in (Credit(), Credit(dynamic_sampling=True, filter_reward="correct")):
        trainer = ds_trainer(tokenizer, tables, credit, dataset=prompts(8), num_iterations=1,
                             max_steps=4, max_completion_length=6, learning_rate=1e-3)
        main = []
        generate = trainer._generate_and_score_completions

        def record(inputs, generate=generate, main=main):
            main.append([x["prompt"] for x in inputs])
            return generate(inputs)
        trainer._generate_and_score_completions = record
        trainer.train()
        seen.append(main)
        states.append((trainer.state.epoch, len(trainer.recorded), trainer.state.log_history))
    assert seen[0] == seen[1] and len(seen[0]) == 4
    extra = [x["prompt"] for x in trainer.recorded[1][3]]  # batch 1's second round
    assert extra != seen[1][0] and set(extra) <= set(prompts(8)["prompt"])
    assert states[0][0] == states[1][0] == 2.0
    assert states[0][1] == 4 and states[1][1] == 1 + 2 + 3 + 1 + 1 - 1  # rounds per batch 2,3,1,1
    logs = [r for r in states[1][2] if "ds/rounds" in r]
    assert [r["ds/rounds"] for r in logs] == [2.0, 3.0, 1.0, 1.0]
    assert [r["ds/full"] for r in logs] == [1.0, 0.0, 1.0, 1.0]
    assert logs[1]["loss"] == 0.0 and all(torch.isfinite(torch.tensor(r["loss"])) for r in logs)


# -----------------------------------------------------------------------------
# CSCR inside the trainer: the kept completions re-scored under c+ and c- (tiny_task's "Y"/"N")

CSCR = dict(cscr_strength=1.0, cond_pos="Y", cond_neg="N")


def scored_alone(model, tokenizer, prompts_, completions, mask, temperature, cond=""):
    """log pi(o_t | cond + prompt, o_<t) of each completion, its row scored alone: no padding,
    positions 0, 1, 2, ... (N, T), 0 past each completion's end."""
    logp = torch.zeros(mask.shape)
    for i, (prompt, n) in enumerate(zip(prompts_, mask.sum(dim=1).tolist())):
        prompt_ids = tokenizer(cond + prompt, return_tensors="pt")["input_ids"][0]
        ids = torch.cat([prompt_ids, completions[i, :n]])
        logits = model(input_ids=ids[None]).logits[0, len(prompt_ids) - 1:-1] / temperature
        logp[i, :n] = token_logprobs(logits, completions[i, :n])
    return logp


def test_cscr_scores_and_weights_are_each_rows_own(tokenizer):
    """The log-probs under c+, c- and none, and the weights: those of each row scored alone
    (no padding) on prompts of unequal length, through tokencredit's CSCR functions."""
    trainer = ds_trainer(tokenizer, [[M1, M2, M3, M1]], Credit(**CSCR))
    out = first_batch(trainer)
    logp, logp_pos, logp_neg = trainer._cscr_scored
    texts = [x["prompt"] for x in trainer.recorded[0][3]]
    lengths = out["prompt_mask"].sum(dim=1)
    assert lengths.min() < lengths.max()  # left padding is there
    responses, mask = out["completion_ids"], out["completion_mask"].bool()
    with torch.no_grad():
        theirs = {cond: scored_alone(trainer.model, tokenizer, texts, responses, mask,
                                     trainer.args.temperature, cond) for cond in ("Y", "N", "")}
    for name, ours, cond in (("c+", logp_pos, "Y"), ("c-", logp_neg, "N"), ("old", logp, "")):
        difference = (ours - theirs[cond]).abs()[mask].max().item()
        print(f"\nCSCR log-probs under {name} against each row scored alone: max|diff| "
              f"{difference:.1e}")
        assert difference < 1e-5, name
    assert (logp_pos - logp).abs()[mask].mean() > 1e-2  # the conditions move the log-probs
    d_pos, d_neg = tc.counterfactual_shifts(theirs[""], theirs["Y"], theirs["N"], mask)
    expected = tc.cscr_weights(tc.counterfactual_sensitivity(d_pos, d_neg), mask, 1.0, 0.0)
    difference = (out["tc_weights"] - expected).abs().max().item()
    print(f"CSCR weights against those of the rows scored alone: max|diff| {difference:.1e}")
    assert difference < 1e-5 and (expected - 1).abs()[mask].max() > 0.1
    d_pos, d_neg = tc.counterfactual_shifts(logp, logp_pos, logp_neg, mask)
    diagnostics = tc.shift_diagnostics(d_pos, d_neg, mask)
    logged = trainer._metrics["train"]
    for key in trainer.CSCR_METRICS:
        assert logged[f"cscr/{key}"][-1] == pytest.approx(diagnostics[key], abs=1e-6), key
    real = expected[mask]
    assert (logged["cscr/weight_min"][-1], logged["cscr/weight_max"][-1]) == pytest.approx(
        (real.min().item(), real.max().item()), abs=1e-5)


CHAT_TEMPLATE = ("{% for m in messages %}{{ '>' + m['content'] + ',' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '>>' }}{% endif %}")


def test_cscr_puts_the_assertion_inside_the_chat_template(tokenizer):
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = CHAT_TEMPLATE
    problems = tiny_task.ProblemStream(TINY, 7).next(4)
    conversations = [[{"role": "user", "content": text}]
                     for text in tiny_task.prompt_texts(problems)]
    trainer = TokenCreditGRPOTrainer(
        model=tiny_model(tokenizer), reward_funcs=odd_length, args=config(num_iterations=2),
        train_dataset=Dataset.from_dict({"prompt": conversations}), processing_class=chat,
        credit=Credit(**CSCR))
    ids, mask = trainer.conditioned_prompt_ids(conversations[:2], "Y")
    first = chat.decode(ids[0][mask[0].bool()])
    assert first == ">Y" + tiny_task.prompt_texts(problems[:1])[0] + ",>>"
    expected = chat.apply_chat_template([{"role": "user", "content": "Y" + conversations[1][0][
        "content"]}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert ids[1][mask[1].bool()].tolist() == list(expected)
    trainer.model.train()
    batch = [trainer.train_dataset[i] for i in range(2) for _ in range(G)]
    out = trainer._generate_and_score_completions(batch)
    assert out["tc_weights"].shape == out["completion_mask"].shape


def test_cscr_of_strength_0_is_the_bridge_without_weights(tokenizer):
    results = []
    for credit in (Credit(), Credit(**{**CSCR, "cscr_strength": 0.0})):
        trainer = ds_trainer(tokenizer, [[M1, M2, M3, M1]], credit)
        out = first_batch(trainer)
        noise = 0.3 * torch.randn(out["completion_mask"].shape,
                                  generator=torch.Generator().manual_seed(2))
        out["old_per_token_logps"] = out["old_per_token_logps"] + noise
        model = trainer.model
        results.append(loss_and_grad(model, lambda: trainer.compute_loss(model, out)))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert results[0][0].abs() > 1e-4


def test_only_the_kept_rows_are_rescored(tokenizer):
    """Dynamic sampling and CSCR: 4 groups kept of 12 sampled in 3 rounds; the model scores
    3 x 16 rows for TRL's old log-probs, and 2 conditions x 16 kept rows for CSCR."""
    tables = [[M1, ALL1, ALL0, M2], [ALL0, M3, ALL1, ALL1], [M2, M1, M3, ALL0]]
    credit = Credit(dynamic_sampling=True, max_rounds=3, filter_reward="correct", **CSCR)
    trainer = ds_trainer(tokenizer, tables, credit, widths=[12, 5, 9])
    calls = []
    hook = trainer.model.register_forward_pre_hook(
        lambda m, args, kwargs: calls.append(kwargs["input_ids"].shape[0])
        if kwargs.get("fused_lm_head") else None, with_kwargs=True)
    out = first_batch(trainer)
    hook.remove()
    # kept: groups 0, 3 of round 0, group 1 of round 1, group 0 of round 2 (then it is full)
    assert calls == [16] * 3 + [8, 8, 4, 4, 4, 4]
    kept_rounds = trainer._metrics["train"]["ds/groups_kept"][-1]
    assert kept_rounds == 4.0 and out["tc_weights"].shape == out["completion_mask"].shape
    real = out["completion_mask"].bool()
    assert (out["tc_weights"][~real] == 0).all() and (out["tc_weights"][real] > 0).all()


def test_smoke_training_with_dynamic_sampling_cscr_and_accumulation(tokenizer):
    """2 micro-batches per generation batch (groups shuffled whole), 2 iterations: one
    generation batch, re-scored under c+ and c- once per round used, its weights kept for the
    4 optimizer-step halves."""
    tables = [[M1, ALL1, ALL0, M2] * 2, [M3, M1, ALL1, ALL0] * 2]
    credit = Credit(loss_mode="group_token", dynamic_sampling=True, filter_reward="correct",
                    **CSCR)
    model = tiny_model(tokenizer, seed=2)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = ds_trainer(tokenizer, tables, credit, model=model, gradient_accumulation_steps=2,
                         steps_per_generation=2, max_steps=2, learning_rate=1e-3,
                         max_completion_length=8)
    rescored = []
    cscr_weights = trainer._cscr_weights

    def count(*args):
        rescored.append(args[2].numel())
        return cscr_weights(*args)
    trainer._cscr_weights = count
    trainer.train()
    assert len(trainer.recorded) == 2 and rescored == [16, 16]  # 4 + 4 groups kept
    logged = [r for r in trainer.state.log_history if "ds/rounds" in r]
    assert [r["ds/rounds"] for r in logged] == [2.0] and logged[0]["ds/full"] == 1.0
    assert 0 <= logged[0]["cscr/sign_reversal"] <= 1
    assert any((p.detach() - b).abs().max() > 0 for p, b in zip(model.parameters(), before))


def test_every_tokencredit_choice_is_a_plain_field_that_yaml_fills(tmp_path):
    """TokenCreditGRPOConfig adds Credit's fields but the callable, by the same names, each a
    str, float, int or bool (None allowed) with help; a YAML file fills them through TrlParser."""
    import typing
    from trl import TrlParser
    from tokencredit_trl import TokenCreditGRPOConfig
    ours = [f for f in dataclasses.fields(TokenCreditGRPOConfig)
            if f.name not in {g.name for g in dataclasses.fields(GRPOConfig)}]
    assert [f.name for f in ours] == [f.name for f in dataclasses.fields(Credit)
                                      if f.name != "token_weights_fn"]
    for f in ours:
        kinds = set(typing.get_args(f.type)) - {type(None)} or {f.type}
        assert kinds <= {str, float, int, bool} and len(kinds) == 1, f.name
        assert f.metadata["help"], f.name
    path = tmp_path / "run.yaml"
    path.write_text(f"bf16: false\noutput_dir: {tmp_path}\n"
                    "loss_mode: group_token\nbaseline: leave_one_out\nadv_eps: 1.0e-6\n"
                    "dynamic_sampling: true\nmax_rounds: 2\ncscr_strength: 0.5\n"
                    "cond_pos: 'Y'\ncond_neg: 'N'\n")
    config, = TrlParser((TokenCreditGRPOConfig,)).parse_args_and_config(["--config", str(path)])
    assert config.to_credit() == Credit(loss_mode="group_token", baseline="leave_one_out",
                                        adv_eps=1e-6, dynamic_sampling=True, max_rounds=2,
                                        cscr_strength=0.5, cond_pos="Y", cond_neg="N")


def test_the_trainer_takes_the_config_fields_and_the_callable(tokenizer):
    from tokencredit_trl import TokenCreditGRPOConfig
    args = config(TokenCreditGRPOConfig, loss_type="grpo", baseline="leave_one_out")
    weights = high_entropy_weights(0.5)
    trainer = TokenCreditGRPOTrainer(model=tiny_model(tokenizer), reward_funcs=odd_length,
                                     args=args, train_dataset=prompts(16),
                                     processing_class=tokenizer, token_weights_fn=weights)
    assert (trainer.credit.loss_mode, trainer.credit.baseline) == ("sample", "leave_one_out")
    assert trainer.credit.token_weights_fn is weights
    with pytest.raises(ValueError, match="not both"):
        TokenCreditGRPOTrainer(model=tiny_model(tokenizer), reward_funcs=odd_length, args=args,
                               train_dataset=prompts(16), processing_class=tokenizer,
                               credit=Credit(loss_mode="token"))


@pytest.mark.parametrize("version, accepted", [("1.16.0", True), ("1.16.3", True),
                                               ("1.15.0", False), ("1.17.0", False),
                                               ("2.0.0", False)])
def test_the_trl_version_is_checked_at_import(version, accepted):
    from tokencredit_trl import check_trl_version
    if accepted:
        check_trl_version(version)
    else:
        with pytest.raises(ImportError, match=f"tested on TRL >= 1.16.0, < 1.17 .*TRL {version} "
                                              "is installed"):
            check_trl_version(version)

# -----------------------------------------------------------------------------
# the training script (train.py): every setting checked when it is read, the reward functions,
# and the installed script run from a folder outside the clone

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "tokencredit_trl", "examples")

BAD = [  # (flags over the defaults, the whole message: the key, what is allowed, the value)
    (["--loss_type", "foo"], "loss_type must be one of ['bnpo', 'dapo', 'dr_grpo', 'grpo', "
     "'luspo'], got 'foo': not a loss type tokencredit expresses"),
    (["--loss_type", "cispo"], "loss_type must be one of ['bnpo', 'dapo', 'dr_grpo', 'grpo', "
     "'luspo'], got 'cispo': its surrogate is -A * log-prob weighted by the detached ratio capped "
     "at epsilon_high (5.0 recommended), not a PPO clip over [1 - epsilon, 1 + epsilon_high]; "
     "policy_loss has no such surrogate"),
    (["--loss_type", "bnpo", "--loss_mode", "sample"], "loss_mode must be 'token', as loss_type "
     "'bnpo' says, or unset, got 'sample' (or change loss_type)"),
    (["--loss_mode", "foo"], "loss_mode must be one of ('sample', 'token', 'group_token', "
     "'constant'), got 'foo'"),
    (["--cscr_strength", "-1", "--cond_pos", "Y", "--cond_neg", "N"],
     "cscr_strength must be a finite number >= 0, got -1.0"),
    (["--cscr_strength", "1"], "cond_pos must be a non-empty string with cscr_strength, got None"),
    (["--cscr_strength", "1", "--cond_pos", "Y", "--cond_neg", "Y"],
     "cond_neg must be other than cond_pos, got 'Y'"),
    (["--cscr_threshold", "inf", "--cscr_strength", "1", "--cond_pos", "Y", "--cond_neg", "N"],
     "cscr_threshold must be a finite number, got inf"),
    (["--adv_scale", "std", "--scale_rewards", "none"], "adv_scale must be 'none', as "
     "scale_rewards 'none' says, or unset, got 'std' (or change scale_rewards)"),
    (["--baseline", "median"], "baseline must be one of ('mean', 'leave_one_out'), got 'median'"),
    (["--adv_eps", "0"], "adv_eps must be a finite number > 0, got 0.0"),
    (["--surrogate", "ppo"], "surrogate must be one of ('clip', 'reinforce'), got 'ppo'"),
    (["--ratio_level", "batch"], "ratio_level must be one of ('token', 'sequence', "
     "'sequence_token'), got 'batch'"),
    (["--loss_type", "luspo", "--max_len", "0"], "max_len must be 1, as loss_type 'luspo' says, "
     "or unset, got 0 (or change loss_type)"),
    (["--loss_mode", "constant", "--max_len", "0"], "max_len must be a finite number > 0 (mode "
     "'constant': Dr. GRPO's budget), got 0"),
    (["--token_count", "all"], "token_count must be 'global' or 'local', got 'all'"),
    (["--max_rounds", "0"], "max_rounds must be an int >= 1, got 0"),
    (["--epsilon", "-0.2"], "epsilon must be a number >= 0, got -0.2"),
    (["--epsilon_high", "-0.1"], "epsilon_high must be a number >= 0, got -0.1"),
    (["--delta", "1.5"], "delta must be None: tokencredit's loss has no two-sided clipping, got "
     "1.5"),
    (["--entropy_coef", "0.01"], "entropy_coef must be 0.0: tokencredit's loss has no entropy "
     "bonus, got 0.01"),
    (["--multi_objective_aggregation", "normalize_then_sum"], "multi_objective_aggregation must be "
     "'sum_then_normalize': tokencredit's loss has no rewards normalised one by one, got "
     "'normalize_then_sum'"),
    (["--beta", "0.04"], "use_bias_correction_kl must be false with beta > 0 (tokencredit's k3 "
     "KL has no importance ratio), got True"),
    (["--use_vllm", "--vllm_importance_sampling_mode", "row"], "vllm_importance_sampling_mode "
     "must be one of ['token_truncate', 'token_mask', 'sequence_truncate', 'sequence_mask'], got "
     "'row'"),
    (["--loss_mode", "group_token", "--per_device_train_batch_size", "4", "--steps_per_generation",
      "2"], "per_device_train_batch_size must be a multiple of num_generations (8) with loss_mode "
     "'group_token' (whole groups in every micro-batch), got 4"),
]


@pytest.mark.parametrize("flags, message", BAD, ids=[" ".join(r[0]) for r in BAD])
def test_each_bad_setting_is_refused_when_the_config_is_made(tmp_path, flags, message):
    """TrlParser makes TokenCreditGRPOConfig from flags (a YAML file sets the same defaults):
    the ValueError comes from __post_init__, naming the key, what is allowed and the value."""
    from trl import TrlParser
    from tokencredit_trl import TokenCreditGRPOConfig
    base = ["--output_dir", str(tmp_path), "--bf16", "false", "--per_device_train_batch_size",
            "16", "--gradient_accumulation_steps", "2"]
    with pytest.raises(ValueError) as error:
        TrlParser((TokenCreditGRPOConfig,)).parse_args_and_config(base + flags)
    assert str(error.value) == message


def test_the_example_yaml_files_are_train_tinys_presets():
    """examples/dapo.yaml and cscr.yaml, read by the script's parser: train_tiny's dapo and cscr
    presets (and its defaults under them) in TRL's words, written out here by hand."""
    from tokencredit_trl.train import parse_args
    common = dict(num_generations=8, per_device_train_batch_size=128, num_iterations=2,
                  steps_per_generation=1, max_completion_length=48, temperature=1.0,
                  learning_rate=1e-4, max_grad_norm=1.0, beta=0.0, seed=0, top_k=0, top_p=1.0,
                  shuffle_dataset=False, bf16=False, max_steps=120)
    expected = {
        "dapo": (dict(common, epsilon=0.2, epsilon_high=0.28, reward_weights=[2.0, 1.0]),
                 dict(reward_funcs=["tiny_verifier", "get_soft_overlong_punishment"],
                      soft_punish_cache=6),
                 Credit(loss_mode="token", token_count="global", max_len=48, dynamic_sampling=True,
                        max_rounds=3, filter_reward="tiny_verifier")),
        "cscr": (dict(common, epsilon=0.2, epsilon_high=0.2, reward_weights=None),
                 dict(reward_funcs=["tiny_verifier"]),
                 Credit(loss_mode="sample", token_count="global", max_len=48, cscr_strength=1.0,
                        cscr_threshold=0.0, cond_pos="Y", cond_neg="N"))}
    for name, (settings, script_settings, credit) in expected.items():
        script, config, model_args, _ = parse_args(
            ["--config", os.path.join(EXAMPLES, f"{name}.yaml")])
        assert {k: getattr(config, k) for k in settings} == settings, name
        assert {k: getattr(script, k) for k in script_settings} == script_settings, name
        assert (model_args.model_name_or_path, script.dataset_name) == ("tiny/model", "tiny")
        assert resolve_credit(config.to_credit(), config) == dataclasses.replace(
            credit, surrogate="clip", ratio_level="token", adv_scale="std", baseline="mean",
            adv_eps=1e-6)
    # DAPO's +1/-1 verdicts as 2 x (1 or 0) with the overlong penalty: the same advantages
    verdicts = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    overlong = torch.tensor([[0.0, -0.5, -1.0, -1 / 6]])
    assert torch.allclose(tc.group_advantages(2 * verdicts + overlong),
                          tc.group_advantages(torch.where(verdicts > 0, 1.0, -1.0) + overlong))


@pytest.mark.parametrize("text, number", [
    ("6+9=15,15+8=23>23", 23.0), ("so 1,234.5 in all", 1234.5), ("-7", -7.0),
    ("48 / 2 = 24 clips in May, 72 in all.\n#### 72", 72.0), ("#### -3 (and 5 more)", -3.0),
    ("\\boxed{7}, then 9", 7.0), ("\\boxed{x} then 9", None), ("no number", None), ("", None)])
def test_final_number_is_the_number_a_text_answers_with(text, number):
    from tokencredit_trl.rewards import final_number
    assert final_number(text) == number


def test_final_answer_and_tiny_verifier_are_verdicts_on_their_columns(tokenizer):
    from tokencredit_trl.rewards import final_answer, tiny_verifier
    chat = [{"role": "assistant", "content": "It is 23.\n#### 23"}]
    assert final_answer(["3+4=7>23", "3+4=7>22", chat, "23.0"],
                        answer=[23, "23", "so\n#### 23", "23"]) == [1.0, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="^final_answer: the answer column must hold a number, "
                                         "got 'none'$"):
        final_answer(["1"], answer=["none"])
    eos, terms = tokenizer.eos_token_id, [[6, 9, 8]] * 4
    texts = ["6+9=15,15+8=23>23", "6+9=15,15+8=23>23", "6+9=14,14+8=22>22", "6+9=15>15>23"]
    ids = [[2, eos], [2, 3], [2, eos], [2, eos]]  # the second was cut before its <eos>
    assert tiny_verifier(texts, ids, terms) == [1.0, 0.0, 0.0, 0.0]
    assert tiny_verifier(texts, ids, terms) == [
        float(tiny_task.verify(t, text, i[-1] == eos)) for t, text, i in zip(terms, texts, ids)]


def test_the_script_names_reward_functions_as_trls_and_reads_their_columns(tmp_path,
                                                                            monkeypatch):
    from trl.rewards import accuracy_reward
    from tokencredit_trl.rewards import final_answer, tiny_verifier
    from tokencredit_trl.train import columns_needed, reward_functions
    monkeypatch.chdir(tmp_path)  # a dotted path is looked for in the working folder too
    (tmp_path / "my_rewards.py").write_text("def short(completion_ids, **kwargs):\n"
                                            "    return [-len(ids) for ids in completion_ids]\n")
    script = dataclasses.make_dataclass("S", ["reward_funcs", "soft_punish_cache"])
    made = reward_functions(script(["final_answer", "tiny_verifier", "accuracy_reward",
                                    "get_soft_overlong_punishment", "my_rewards.short"], 6),
                            config())
    assert made[:3] == [final_answer, tiny_verifier, accuracy_reward]
    assert made[3](completion_ids=[[1] * n for n in (6, 9, 12, 13)]) == [0.0, -0.5, -1.0, -1.0]
    assert made[4](completion_ids=[[1, 2]]) == [-2]
    assert [columns_needed(f) for f in made] == [["answer"], ["terms"], ["solution"], [], []]
    for names, cache, message in (
            (["exact"], 6, "reward_funcs must be each one of ['final_answer', 'tiny_verifier', "
             "'get_soft_overlong_punishment', 'accuracy_reward', 'reasoning_accuracy_reward', "
             "'think_format_reward'] or a dotted import path, got 'exact'"),
            (["my_rewards.long"], 6, "reward_funcs: 'my_rewards.long' cannot be imported: module "
             "'my_rewards' has no attribute 'long'"),
            (["get_soft_overlong_punishment"], 13, "soft_punish_cache must be an int in (0, "
             "max_completion_length = 12], got 13")):
        with pytest.raises(ValueError) as error:
            reward_functions(script(names, cache), config())
        assert str(error.value) == message


def run_outside(folder, *args, timeout=900):
    """python ARGS from `folder`, outside the clone, without the clone on the path: what an
    installed tokencredit runs. Returns (the finished process, the CPU seconds it used)."""
    import resource
    import subprocess
    import sys
    import time
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    done = subprocess.run([sys.executable, *args], cwd=folder, env=env, text=True,
                          capture_output=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"\n$ python {' '.join(args)}: exit {done.returncode}, {time.time() - start:.1f} s, "
          f"{cpu:.1f} s of CPU")
    return done, cpu


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The installed tokencredit_trl's folder, as a Python outside the clone finds it, checked
    to hold this clone's code (pip install . copies the files: a stale copy tests old code)."""
    done, _ = run_outside(tmp_path_factory.mktemp("elsewhere"), "-c", "import tokencredit_trl, "
                          "tiny_task; print(tokencredit_trl.__file__); print(tiny_task.__file__)")
    assert done.returncode == 0, done.stderr[-3000:]
    package, task = (os.path.dirname(path) for path in done.stdout.split())
    ours = ["tiny_task.py"] + [os.path.join("tokencredit_trl", name) for name in
                               os.listdir(os.path.join(ROOT, "tokencredit_trl"))
                               if name.endswith(".py")]
    ours += [os.path.join("tokencredit_trl", "examples", name) for name in os.listdir(EXAMPLES)]
    where = {"tiny_task.py": task}
    stale = [name for name in ours if open(os.path.join(ROOT, name)).read() != open(os.path.join(
        where.get(name, os.path.dirname(package)), name)).read()]
    if stale:
        pytest.fail(f"the installed tokencredit is not this clone's ({stale} differ): reinstall "
                    f"it, .venv-trl/bin/python -m pip install --no-deps .")
    return package


def test_the_installed_script_helps(installed, tmp_path):
    done, _ = run_outside(tmp_path, "-m", "tokencredit_trl.train", "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    for flag in ("--model_name_or_path", "--dataset_name", "--dataset_config", "--reward_funcs",
                 "--loss_type", "--loss_mode", "--cscr_strength", "--config"):
        assert flag in done.stdout, flag


def test_the_package_imports_the_trainer_only_when_asked(installed, tmp_path):
    """The script checks its settings before TRL's GRPOTrainer, seconds to import, is loaded."""
    done, _ = run_outside(tmp_path, "-c", "import sys, tokencredit_trl; print('trl.trainer."
                          "grpo_trainer' in sys.modules); tokencredit_trl.TokenCreditGRPOTrainer; "
                          "print('trl.trainer.grpo_trainer' in sys.modules)")
    assert done.returncode == 0 and done.stdout.split() == ["False", "True"], done.stderr[-3000:]


CLI_BAD = [["--loss_type", "foo"], ["--loss_type", "cispo"],
           ["--loss_type", "bnpo", "--loss_mode", "sample"], ["--loss_mode", "foo"],
           ["--cscr_strength", "-1"], ["--filter_reward", "overlong"]]


@pytest.mark.parametrize("flags", CLI_BAD, ids=[" ".join(f) for f in CLI_BAD])
def test_the_installed_script_refuses_a_bad_setting_at_once_in_one_line(installed, tmp_path,
                                                                        flags):
    """examples/dapo.yaml with a bad flag, from an empty folder (its tiny/model and tiny/ data are
    not there: neither is loaded): exit 1, no traceback, the last line names the key, and the
    process used under 10 s of CPU."""
    done, cpu = run_outside(tmp_path, "-m", "tokencredit_trl.train", "--config",
                            os.path.join(installed, "examples", "dapo.yaml"), *flags)
    last = done.stderr.strip().splitlines()[-1]
    print(last)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert last.startswith(f"python -m tokencredit_trl.train: error: {flags[-2][2:]} must be ")
    assert cpu < 10


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A folder outside the clone holding tiny/: a tiny causal LM made here (tiny_task's GPT-2,
    smaller, random weights) saved with save_pretrained with its tokenizer, and train.jsonl and
    test.jsonl, arithmetic problems with their reference answers."""
    from tokencredit_trl.tiny import write_problems
    folder = tmp_path_factory.mktemp("outside")
    tokenizer = tiny_task.build_tokenizer()
    tiny_model(tokenizer).save_pretrained(folder / "tiny" / "model")
    tokenizer.save_pretrained(folder / "tiny" / "model")
    write_problems(folder / "tiny" / "train.jsonl", tiny_task.ProblemStream(TINY, 0).next(64))
    write_problems(folder / "tiny" / "test.jsonl", tiny_task.ProblemStream(TINY, 1).next(8))
    return folder


def logged(stdout: str) -> list:
    """TRL's log records, as its PrinterCallback prints them (disable_tqdm: true): a dict each,
    of numbers written as text (None for NaN)."""
    import ast
    return [{k: float("nan") if v is None else float(v) for k, v in ast.literal_eval(line).items()}
            for line in stdout.splitlines() if line.startswith("{") and line.endswith("}")]


@pytest.mark.parametrize("example", ["dapo", "cscr"])
def test_the_installed_script_trains_a_saved_model_on_a_local_jsonl(installed, tiny_folder,
                                                                   example):
    """2 optimizer steps (one generation batch of 4 prompts x 8, 2 iterations) of the example's
    settings from outside the clone: TRL's log lines, with dynamic sampling's rounds (dapo) or
    CSCR's diagnostics and weights (cscr) beside TRL's own; the evaluation at the start; the
    model saved. The model's random weights answer nothing right, so dynamic sampling runs all 3
    rounds."""
    done, _ = run_outside(tiny_folder, "-m", "tokencredit_trl.train", "--config",
                          os.path.join(installed, "examples", f"{example}.yaml"), "--max_steps",
                          "2", "--logging_steps", "1", "--per_device_train_batch_size", "32",
                          "--per_device_eval_batch_size", "32")
    assert done.returncode == 0, done.stderr[-3000:]
    records = logged(done.stdout)
    train = [r for r in records if "loss" in r]
    evaluation = [r for r in records if "eval_reward" in r]
    assert len(train) == 2 and len(evaluation) == 2  # before (eval_on_start) and after
    assert {"reward", "completions/mean_length", "entropy", "learning_rate"} <= set(train[0])
    assert [r["eval_rewards/tiny_verifier/mean"] for r in evaluation] == [0.0, 0.0]
    if example == "dapo":
        rounds = {k: v for k, v in train[0].items() if k.startswith("ds/")}
        print(rounds)
        assert (rounds["ds/rounds"], rounds["ds/groups_seen"], rounds["ds/groups_kept"]) == (
            3.0, 12.0, 0.0)
        assert not any(k.startswith("cscr/") for k in train[0])
    else:
        diagnostics = {k: v for k, v in train[0].items() if k.startswith("cscr/")}
        print(diagnostics)
        assert len(diagnostics) == 9 and 0 <= diagnostics["cscr/sign_reversal"] <= 1
        assert 0 < diagnostics["cscr/weight_min"] < 1 < diagnostics["cscr/weight_max"]
        assert not any(k.startswith("ds/") for k in train[0])
    assert not any(k.startswith(("ds/", "cscr/")) for k in train[1])  # no generation at step 2
    assert os.path.exists(tiny_folder / "tiny" / "runs" / example / "model.safetensors")


def test_the_tiny_example_writes_its_model_data_and_yaml_files(installed, tmp_path):
    """python -m tokencredit_trl.tiny, with no warm-up steps and a smaller model for speed."""
    import json
    from transformers import AutoModelForCausalLM
    done, _ = run_outside(tmp_path, "-m", "tokencredit_trl.tiny", "--warmup_steps", "0",
                          "--num_problems", "16", "--eval_size", "4", "--n_layer", "1",
                          "--n_embd", "32", "--n_head", "2", "--device", "cpu")
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "tiny"
    for name, seed, n in (("train", 0, 16), ("test", 1, 4)):
        rows = [json.loads(line) for line in open(folder / f"{name}.jsonl")]
        assert [r["terms"] for r in rows] == tiny_task.ProblemStream(TINY, seed).next(n)
        assert all(r["prompt"] == "+".join(map(str, r["terms"])) + "="
                   and r["answer"] == sum(r["terms"]) for r in rows)
    for name in os.listdir(EXAMPLES):
        assert (folder / name).read_text() == open(os.path.join(EXAMPLES, name)).read()
    assert AutoModelForCausalLM.from_pretrained(folder / "model").config.n_layer == 1
    done, _ = run_outside(tmp_path, "-m", "tokencredit_trl.tiny", "--num_problems", "0")
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        "python -m tokencredit_trl.tiny: error: num_problems must be >= 1, got 0")


# -----------------------------------------------------------------------------
# two processes (not a pytest test): torchrun --nproc_per_node 2 tests/bridges/test_trl_tokencredit.py
# (docs/trl.md has its output). Global fill over rounds where the informative groups sit on
# one process: both keep the same groups, process 0 trains on process 1's rows, nothing hangs.

def two_processes():
    rank = int(os.environ.get("RANK", 0))
    tokenizer = tiny_task.build_tokenizer()
    # 4 groups per round (2 per process); round 0: both informative ones on process 1
    tables = [[ALL1, ALL0, M1, M2], [M3, ALL0, M1, M2], [M2, M1, M3, M1]]
    mine = [[group for group in table[2 * rank:2 * rank + 2]] for table in tables]
    credit = Credit(dynamic_sampling=True, max_rounds=3, filter_reward="correct", **CSCR)
    trainer = ds_trainer(tokenizer, mine, credit, widths=[12, 6, 9],
                         per_device_train_batch_size=2 * G, max_steps=2)
    acc = trainer.accelerator
    trainer.model.train()
    batch = [trainer.train_dataset[i] for i in range(2 * rank, 2 * rank + 2) for _ in range(G)]
    torch.manual_seed(rank)
    out = trainer._generate_and_score_completions(batch)
    stats = {k[3:]: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("ds/")}
    # the kept rows this process got, against the rounds' rows of every process
    rounds = [acc.gather(acc.pad_across_processes(o["completion_ids"], dim=1, pad_index=0))
              for o, *_ in trainer.recorded]
    expected = {0: [(0, 2), (0, 3)], 1: [(1, 0), (1, 2)]}[rank]  # (round, global group)
    width = out["completion_ids"].shape[1]
    same = all(torch.equal(widen(rounds[r][j * G:(j + 1) * G], width, "right"),
                           out["completion_ids"][k * G:(k + 1) * G].cpu())
               for k, (r, j) in enumerate(expected))
    decisions = acc.gather_for_metrics([stats], use_gather_object=True)
    print(f"rank {rank}: {stats}; kept (round, group) {expected}: rows equal {same}; "
          f"tc_group {out['tc_group'].tolist()}; same stats on both: "
          f"{decisions[0] == decisions[1]}", flush=True)
    trainer._metrics["train"].clear()
    trainer.train()  # 2 optimizer steps (2 iterations) on one generation batch: DS and CSCR
    logged = [(r["ds/rounds"], r["ds/groups_kept"], r["ds/full"])
              for r in trainer.state.log_history if "ds/rounds" in r]
    cscr = [tuple(round(r[f"cscr/{k}"], 4) for k in ("sign_reversal", "weight_min", "weight_max"))
            for r in trainer.state.log_history if "cscr/sign_reversal" in r]
    print(f"rank {rank}: trained {trainer.state.global_step} steps, (rounds, kept, full) per "
          f"generation batch {logged}, cscr/(sign_reversal, weight_min, weight_max) {cscr}",
          flush=True)


if __name__ == "__main__":
    two_processes()
