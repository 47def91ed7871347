"""trl_tokencredit.py, tested against TRL 1.16's own GRPOTrainer._compute_loss (needs TRL; skipped without it).

    cd /work/main && /work/bench-venv/bin/python -m pytest -q test_trl_tokencredit.py      # -s prints the diffs

Every model here is train_tiny's tiny GPT-2 built in code (random weights, nothing downloaded). A
rollout batch is built the way TRL's _compute_loss receives it (left-padded prompts, right-padded
completions, advantages, old log-probs a little off the current ones so that the clip acts), and
the subclass's loss and gradient are compared with TRL's on the same batch and the same model.
"""

import contextlib
import copy
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import pytest  # noqa: E402

pytest.importorskip("trl")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import tokencredit as tc  # noqa: E402
import train_tiny as tt  # noqa: E402
from trl_tokencredit import Credit, TokenCreditGRPOTrainer, high_entropy_weights  # noqa: E402

TINY = tt.Args(n_layer=1, n_embd=32, n_head=2)
G, MAX_COMPLETION = 4, 12


@pytest.fixture(scope="module")
def tokenizer():
    return tt.build_tokenizer()


def tiny_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    return tt.build_tiny_model(TINY, tokenizer)


def odd_length(completions, **kwargs):  # a reward with some spread within groups
    return [float(len(text) % 2) for text in completions]


def make_trainer(model, tokenizer, credit=Credit(), cls=TokenCreditGRPOTrainer, **config):
    settings = dict(output_dir=tempfile.mkdtemp(prefix="test-trl-tc-"), report_to="none", save_strategy="no",
                    use_cpu=True, bf16=False, activation_checkpointing=False, disable_tqdm=True, seed=0,
                    per_device_train_batch_size=2 * G, num_generations=G, max_completion_length=MAX_COMPLETION,
                    use_bias_correction_kl=False, top_k=0, logging_steps=1)
    problems = tt.ProblemStream(TINY, 7).next(16)
    dataset = Dataset.from_dict({"prompt": tt.prompt_texts(TINY, problems)})
    extra = dict(credit=credit) if cls is TokenCreditGRPOTrainer else {}
    trainer = cls(model=model, reward_funcs=odd_length, args=GRPOConfig(**{**settings, **config}),
                  train_dataset=dataset, processing_class=tokenizer, **extra)
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


def rollout_batch(trainer, lengths, seed=0, spread=0.4, beta=False):
    """inputs as TRL's _compute_loss receives them: N = len(lengths) rows, groups of G consecutive rows."""
    tokenizer, g = trainer.processing_class, torch.Generator().manual_seed(seed)
    N = len(lengths)
    problems = [p for p in tt.ProblemStream(TINY, seed).next(N // G) for _ in range(G)]  # 2-5 terms: padding
    prompt_ids, prompt_mask = tt.tokenize_prompts(tokenizer, tt.prompt_texts(TINY, problems), "cpu")
    T = max(lengths)
    completion_mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (N, T)
    digits = torch.randint(2, len(tokenizer), (N, T), generator=g)  # characters, no <pad>/<eos>
    completion_ids = torch.where(completion_mask.bool(), digits, tokenizer.pad_token_id)
    rewards = torch.randint(0, 2, (N // G, G), generator=g).float()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0  # both signs in every group
    inputs = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                  completion_mask=completion_mask, advantages=tc.group_advantages(rewards).flatten(),
                  num_items_in_batch=completion_mask.sum(), tc_group=torch.arange(N) // G)
    with torch.no_grad():
        logp = scored(trainer, inputs)
    noise = spread * torch.randn(N, T, generator=g)
    inputs["old_per_token_logps"] = (logp + noise) * completion_mask  # ratios exp(-noise): the clip acts
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
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def trl_loss(trainer, inputs):
    return loss_and_grad(trainer.model, lambda: GRPOTrainer._compute_loss(trainer, trainer.model, inputs))


def our_loss(trainer, inputs, credit):
    with setting(trainer, credit=credit):
        return loss_and_grad(trainer.model, lambda: trainer._compute_loss(trainer.model, inputs))


def split(inputs, rows):
    return {k: v if v.dim() == 0 else v[rows] for k, v in inputs.items()}


LENGTHS = [12, 3, 0, 7, 9, 1, 12, 5]  # one empty completion, one at the budget

# (TRL loss_type, TRL settings, the Credit that should give the same loss and gradient)
EXACT = [
    ("grpo", {}, Credit(mode="sample")),
    ("bnpo", {}, Credit(mode="token", token_count="local")),
    ("dapo", {}, Credit(mode="token")),
    ("dr_grpo", {}, Credit(mode="constant")),  # max_len = max_completion_length
    ("dapo", dict(epsilon_high=0.28), Credit(mode="token")),  # Clip-Higher
    ("grpo", dict(importance_sampling_level="sequence"), Credit(mode="sample", ratio_level="sequence")),  # GSPO
    ("grpo", dict(beta=0.04), Credit(mode="sample")),  # k3 KL, use_bias_correction_kl=False
    ("grpo", dict(top_entropy_quantile=0.2), Credit(mode="sample", token_weights_fn=high_entropy_weights(0.2))),
]


@pytest.mark.parametrize("loss_type, trl_settings, credit", EXACT,
                         ids=[f"{r[0]}-{'-'.join(r[1]) or 'plain'}" for r in EXACT])
def test_loss_and_gradient_equal_trls(trainer, loss_type, trl_settings, credit):
    trainer.model.train()
    with setting(trainer, loss_type=loss_type, **trl_settings):
        inputs = rollout_batch(trainer, LENGTHS, beta="beta" in trl_settings)
        trl, trl_grad = trl_loss(trainer, inputs)
        ours, our_grad = our_loss(trainer, inputs, credit)
    clipped = trainer._metrics["train"]["tc/clip_frac_low"][-1] + trainer._metrics["train"]["tc/clip_frac_high"][-1]
    d_loss, d_grad = (ours - trl).abs().item(), (our_grad - trl_grad).abs().max().item()
    print(f"\n{loss_type} {trl_settings}: loss {trl.item():+.6f}, max|diff| loss {d_loss:.1e}, grad {d_grad:.1e} "
          f"(grad max {trl_grad.abs().max().item():.1e}, clipped {clipped:.2f})")
    assert clipped > 0.05  # the clip matters in this batch
    assert d_loss <= 1e-6 * max(1.0, trl.abs().item())
    assert d_grad <= 1e-6 * trl_grad.abs().max().item()


def plain_group_token(logp, old, A, mask, B, eps=0.2):
    """DAPO's printed equation, a loop: (1/B) sum_groups (1 / tokens of the group) sum_{i in group, t} loss_it."""
    total = 0.0
    for b in range(B):
        rows = range(b * G, (b + 1) * G)
        tokens = sum(int(mask[i].sum()) for i in rows)
        for i in rows:
            for t in range(int(mask[i].sum())):
                ratio = torch.exp(logp[i, t] - old[i, t])
                total = total - torch.min(ratio * A[i, t], ratio.clamp(1 - eps, 1 + eps) * A[i, t]) / (B * tokens)
    return total


def test_group_token_is_dapos_printed_equation_and_differs_from_trl_dapo(trainer):
    """Two prompts, one with long answers and one with short: TRL's dapo weighs every token of the batch
    alike, group_token gives each prompt the same share. Rows shuffled as TRL does: the same loss."""
    trainer.model.train()
    inputs = rollout_batch(trainer, [12, 11, 12, 10, 2, 3, 1, 2], seed=3)
    with setting(trainer, loss_type="dapo"):
        trl, trl_grad = trl_loss(trainer, inputs)
    ours, our_grad = our_loss(trainer, inputs, Credit(mode="group_token"))
    A = inputs["advantages"][:, None].expand_as(inputs["old_per_token_logps"])
    ref, ref_grad = loss_and_grad(trainer.model, lambda: plain_group_token(
        scored(trainer, inputs), inputs["old_per_token_logps"], A, inputs["completion_mask"], 2))
    shuffled, shuffled_grad = our_loss(trainer, split(inputs, torch.randperm(8)), Credit(mode="group_token"))
    rel_loss = ((ours - trl).abs() / trl.abs()).item()
    rel_grad = ((our_grad - trl_grad).norm() / trl_grad.norm()).item()
    print(f"\ngroup_token vs TRL dapo: loss {ours.item():+.5f} vs {trl.item():+.5f} (relative diff {rel_loss:.2f}), "
          f"gradient relative diff {rel_grad:.2f}; vs the plain loop: {(ours - ref).abs().item():.1e}, "
          f"grad {(our_grad - ref_grad).abs().max().item():.1e}")
    assert (ours - ref).abs() < 1e-6 and (our_grad - ref_grad).abs().max() < 1e-6 * ref_grad.abs().max()
    assert (ours - shuffled).abs() < 1e-6 and (our_grad - shuffled_grad).abs().max() < 1e-6 * ref_grad.abs().max()
    assert rel_grad > 0.1


def test_group_token_refuses_split_groups(trainer, tokenizer):
    inputs = rollout_batch(trainer, LENGTHS)
    with pytest.raises(ValueError, match="incomplete groups"):
        our_loss(trainer, split(inputs, torch.arange(6)), Credit(mode="group_token"))
    with pytest.raises(ValueError, match="multiple of num_generations"):
        make_trainer(tiny_model(tokenizer), tokenizer, Credit(mode="group_token"), per_device_train_batch_size=6,
                     steps_per_generation=2)


def test_per_token_weights_trl_cannot_express(trainer):
    """CSCR-style weights (any (N, T) >= 0): TRL's loss has no place for them; ours is the plain formula."""
    trainer.model.train()
    inputs = rollout_batch(trainer, LENGTHS, seed=5)
    mask = inputs["completion_mask"]
    sensitivity = torch.rand(mask.shape, generator=torch.Generator().manual_seed(1))
    weights = tc.cscr_weights(sensitivity, mask, strength=2.0)
    ours, our_grad = our_loss(trainer, inputs, Credit(mode="sample", token_weights_fn=lambda *a: weights))
    with setting(trainer, loss_type="grpo"):
        trl, trl_grad = trl_loss(trainer, inputs)

    def plain():
        logp, old = scored(trainer, inputs), inputs["old_per_token_logps"]
        A, total = inputs["advantages"], 0.0
        for i in range(len(LENGTHS)):
            for t in range(LENGTHS[i]):
                ratio, a = torch.exp(logp[i, t] - old[i, t]), A[i] * weights[i, t]
                total = total - torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a) / (len(LENGTHS) * LENGTHS[i])
        return total
    ref, ref_grad = loss_and_grad(trainer.model, plain)
    rel_grad = ((our_grad - trl_grad).norm() / trl_grad.norm()).item()
    print(f"\nCSCR weights (strength 2) vs TRL grpo: loss {ours.item():+.5f} vs {trl.item():+.5f}, gradient relative "
          f"diff {rel_grad:.2f}; vs the plain loop {(ours - ref).abs().item():.1e}")
    assert (ours - ref).abs() < 1e-6 and (our_grad - ref_grad).abs().max() < 1e-6 * ref_grad.abs().max()
    assert rel_grad > 0.05


def test_token_normaliser_global_or_local_under_gradient_accumulation(trainer):
    """2 micro-batches (GA = 2) of unequal token counts: "global" is the token mean over both (TRL dapo),
    "local" the mean of the two micro-batch means (TRL bnpo). They differ."""
    trainer.model.train()
    lengths = [12, 11, 12, 10, 2, 3, 1, 2]
    inputs = rollout_batch(trainer, lengths, seed=4)
    parts = [split(inputs, torch.arange(0, 4)), split(inputs, torch.arange(4, 8))]  # 45 and 8 tokens

    def accumulated(compute):  # what one optimizer step applies: the sum of the micro-batches' losses
        return loss_and_grad(trainer.model, lambda: sum(compute(p) for p in parts))

    with setting(trainer, current_gradient_accumulation_steps=2), setting(trainer.args, steps_per_generation=2):
        results = {}
        for name, loss_type, credit in (("global", "dapo", Credit(mode="token")),
                                        ("local", "bnpo", Credit(mode="token", token_count="local"))):
            with setting(trainer, credit=credit, loss_type=loss_type):
                results[name] = accumulated(lambda p: trainer._compute_loss(trainer.model, p))
                results[loss_type] = accumulated(lambda p: GRPOTrainer._compute_loss(trainer, trainer.model, p))
    kw = dict(mode="token")
    old, A, mask = inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"]
    results["token mean"] = loss_and_grad(trainer.model, lambda: tc.policy_loss(scored(trainer, inputs), old, A,
                                                                                mask, **kw)[0])
    results["mean of means"] = loss_and_grad(trainer.model, lambda: sum(tc.policy_loss(
        scored(trainer, p), p["old_per_token_logps"], p["advantages"], p["completion_mask"], **kw)[0]
        for p in parts) / 2)

    def diff(a, b):
        return max((results[a][0] - results[b][0]).abs().item(), (results[a][1] - results[b][1]).abs().max().item())
    print(f"\nGA=2, micro-batches of 45 and 8 tokens: global loss {results['global'][0].item():+.5f}, local "
          f"{results['local'][0].item():+.5f}; global vs token mean {diff('global', 'token mean'):.1e}, vs dapo "
          f"{diff('global', 'dapo'):.1e}; local vs mean of means {diff('local', 'mean of means'):.1e}, vs bnpo "
          f"{diff('local', 'bnpo'):.1e}; global vs local {diff('global', 'local'):.2e}")
    for a, b in (("global", "token mean"), ("global", "dapo"), ("local", "mean of means"), ("local", "bnpo")):
        assert diff(a, b) < 1e-6, (a, b)
    assert diff("global", "local") > 1e-3


def test_positions_score_what_was_sampled(tokenizer):
    """Left-padded prompts on a model with absolute positions: stock TRL's log-probs are off by the
    padding's shift, the subclass's equal the sampling distribution's and train_tiny.score's."""
    model = tiny_model(tokenizer, seed=1)
    with torch.no_grad():
        model.transformer.wpe.weight.normal_(0.0, 1.0)  # positions that matter, as in a trained model,
        model.transformer.wte.weight.normal_(0.0, 0.2)  # and a policy far from uniform (log-probs about -2)
    stock = make_trainer(copy.deepcopy(model), tokenizer, cls=GRPOTrainer)
    ours = make_trainer(copy.deepcopy(model), tokenizer)
    problems = tt.ProblemStream(TINY, 11).next(16)  # 2 to 5 terms: prompts of 4 to 10 tokens
    ids, attention = tt.tokenize_prompts(tokenizer, tt.prompt_texts(TINY, problems), "cpu")
    torch.manual_seed(0)
    responses, logits = tt.sample_tokens(model.eval(), ids, attention, 10, False, 1.0, tokenizer.eos_token_id)
    mask, _ = tt.response_mask(responses, tokenizer.eos_token_id)
    responses = responses.masked_fill(~mask, tokenizer.pad_token_id)
    sampled = tc.token_logprobs(logits, responses)  # the log-probs of the distribution sampled from
    with torch.no_grad():
        score = tt.score(model, tokenizer, TINY, problems, responses, mask)[0][0]
        errors = {}
        for name, trainer in (("stock TRL", stock), ("TokenCreditGRPOTrainer", ours)):
            logp = trainer._get_per_token_logps_and_entropies(
                trainer.model, torch.cat([ids, responses], 1), torch.cat([attention, mask.long()], 1),
                responses.shape[1])[0]
            errors[name] = ((logp - sampled).abs()[mask].mean().item(), (logp - score).abs()[mask].mean().item())
    print("\nmean |log-prob error| per token vs sampling, vs train_tiny.score: "
          + ", ".join(f"{k} {a:.2e}, {b:.2e}" for k, (a, b) in errors.items()))
    assert errors["stock TRL"][0] > 0.1
    assert max(errors["TokenCreditGRPOTrainer"]) < 1e-5


def test_advantages_are_group_advantages_of_the_rewards_trl_gathers(tokenizer):
    trainer = make_trainer(tiny_model(tokenizer), tokenizer, Credit(adv_eps=1e-4))
    trainer.model.train()
    batch = [trainer.train_dataset[i] for i in range(2) for _ in range(G)]  # 2 prompts x G, as TRL's sampler
    torch.manual_seed(0)
    trls = GRPOTrainer._generate_and_score_completions(trainer, batch)  # TRL's advantages (scale_rewards group)
    rewards = trainer._rewards_per_func[:, 0].view(-1, G)
    assert rewards.std(dim=1).max() > 0  # some group has something to compare
    assert torch.allclose(trls["advantages"], tc.group_advantages(rewards, eps=1e-4).flatten(), atol=1e-6)
    trainer.credit = Credit(adv_scale="none", baseline="leave_one_out")
    out = trainer._generate_and_score_completions(batch)
    rewards = trainer._rewards_per_func[:, 0].view(-1, G)
    expected = tc.group_advantages(rewards, scale="none", baseline="leave_one_out").flatten()
    assert torch.equal(out["advantages"], expected)
    assert out["tc_group"].tolist() == [0] * G + [1] * G


def test_smoke_training_with_accumulation_and_group_token(tokenizer):
    """A few steps: 2 micro-batches per generation batch (groups shuffled whole), 2 iterations, per-token weights."""
    model = tiny_model(tokenizer, seed=2)
    before = [p.detach().clone() for p in model.parameters()]
    credit = Credit(mode="group_token", baseline="leave_one_out", token_weights_fn=high_entropy_weights(0.5))
    trainer = make_trainer(model, tokenizer, credit, gradient_accumulation_steps=2, steps_per_generation=2,
                           num_iterations=2, max_steps=4, learning_rate=1e-3, max_completion_length=8)
    trainer.train()
    logged = [r for r in trainer.state.log_history if "tc/clip_frac_low" in r]
    assert len(logged) == 4 and all(torch.isfinite(torch.tensor(r["loss"])) for r in logged)
    assert any((p.detach() - b).abs().max() > 0 for p, b in zip(model.parameters(), before))
