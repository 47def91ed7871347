"""trl_tokencredit.py: TRL's GRPOTrainer with tokencredit's loss, for models and GPUs beyond the laptop.

TokenCreditGRPOTrainer is TRL 1.16's GRPOTrainer (generation, rewards, reference model, accelerate,
several GPUs) whose advantages are tokencredit.group_advantages and whose loss is
tokencredit.policy_loss. The tokencredit choices are one argument, `credit=Credit(...)`:

    from trl import GRPOConfig
    from trl_tokencredit import Credit, TokenCreditGRPOTrainer, high_entropy_weights
    trainer = TokenCreditGRPOTrainer(model=..., reward_funcs=..., train_dataset=..., args=GRPOConfig(...),
                                     credit=Credit(mode="group_token", baseline="leave_one_out"))
    trainer.train()

The clip range and the KL weight stay GRPOConfig's epsilon, epsilon_high and beta (TRL computes the
reference log-probs when beta > 0). GRPOConfig's loss_type, scale_rewards and importance_sampling_level
are not used: Credit's mode, adv_scale and ratio_level replace them. Options that change TRL's loss
in ways Credit does not express raise a ValueError (see _refuse_what_is_not_ours).

Advantages. TRL computes them in _generate_and_score_completions from the rewards of every process
(scale_rewards group/batch/none, std + 1e-4). Mapping Credit onto scale_rewards would lose the
leave-one-out baseline (RLOO) and keep TRL's eps, so instead the rewards TRL gathers (the weighted sum
of the reward functions, as TRL's default sum_then_normalize) go through tc.group_advantages, and each
process keeps its slice, as TRL does. adv_eps=1e-4 gives TRL's scale_rewards="group" advantages up to
rounding (a test checks it). TRL's completions table still logs TRL's own advantages.

Group structure. TRL shuffles the rows of a generation batch (row by row) and splits it into
steps_per_generation micro-batches; with one micro-batch a group's rows are all there, in any order,
and with several a group is split. Each row therefore carries its group id ("tc_group"); for
mode "group_token" the shuffle moves whole groups (so each micro-batch holds whole groups when
per_device_train_batch_size is a multiple of num_generations, checked at start) and the loss sorts
the rows by group id and raises a ValueError if any group is incomplete.

Normalisers under gradient accumulation (GA) and P processes. policy_loss normalises one micro-batch;
TRL backpropagates each micro-batch's loss and DDP averages the P processes' gradients. So
    sample, constant, group_token: micro-batch loss / GA. Every micro-batch has the same number of
        rows (and, for group_token, of whole groups), so the sum over micro-batches and processes is
        exactly tokencredit's loss on the optimizer step's batch. = TRL grpo, dr_grpo.
    token, token_count="global" (default): the micro-batch's token sum over the step's token count
        as TRL's dapo counts it, num_items_in_batch / P * GA / steps_per_generation (num_items_in_batch:
        the generation batch's tokens, all processes). Exactly tokencredit's "token" on the step's batch
        when steps_per_generation == GA (TRL's default); otherwise the generation batch's mean count
        per step. = TRL dapo.
    token, token_count="local": each micro-batch's own token mean, / GA: a mean of micro-batch means,
        not the step's token mean (unequal micro-batches weigh their tokens unequally). = TRL bnpo.

Positions. Stock TRL 1.16 scores left-padded prompts without position_ids, so a model with absolute
positions (GPT-2, train_tiny's tiny model) reads each prompt shifted by its padding, and the log-probs
it trains on are not those it sampled from (about 0.8 nats per token on train_tiny's checkpoint;
bench.py prints it). TRL fixed the same omission in its Online DPO / XPO / Nash-MD trainers
(huggingface/trl issue 6800, PR 6819), not in GRPO. mask_positions() adds position_ids =
cumsum(attention_mask) - 1 to TRL's scoring calls; the trainer installs it (Credit(fix_positions=False)
to skip); harmless for RoPE models.

Per-token credit. Credit(token_weights_fn=f) multiplies f(inputs, per_token_logps, entropies, mask),
an (N, T) tensor >= 0, into the advantages with tc.token_advantages; high_entropy_weights(0.2) is a
ready one (Wang et al., arXiv 2506.01939; TRL's top_entropy_quantile, within one micro-batch).

Run train_tiny's task through it (needs TRL: pip install -r requirements-bench.txt):
    python trl_tokencredit.py --loss-mode sample --steps 60 --seed 0
    python trl_tokencredit.py --help
See docs/trl.md for several GPUs and for what is exact.
"""

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Optional

import torch
try:
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import split_tensor_dict
except ImportError as error:  # TRL is a bench-only dependency
    raise ImportError("trl_tokencredit.py needs TRL 1.16: pip install -r requirements-bench.txt") from error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokencredit as tc  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Credit:
    """tokencredit's choices; the clip range and beta stay GRPOConfig's epsilon, epsilon_high, beta."""
    mode: str = "sample"  # policy_loss's aggregation: sample, token, group_token or constant
    surrogate: str = "clip"  # clip (PPO-clip) or reinforce
    ratio_level: str = "token"  # token, sequence (GSPO) or sequence_token
    adv_scale: str = "std"  # group_advantages' scale: std, batch or none
    baseline: str = "mean"  # group_advantages' baseline: mean or leave_one_out (RLOO)
    adv_eps: float = 1e-6  # added to the std (TRL adds 1e-4)
    token_count: str = "global"  # mode "token" under GA: global (the step's tokens, TRL dapo) or local (bnpo)
    max_len: Optional[int] = None  # mode "constant": the constant; None = max_completion_length
    token_weights_fn: Optional[Callable] = None  # (inputs, logp, entropies, mask) -> (N, T) weights >= 0
    fix_positions: bool = True  # number positions from the attention mask when TRL scores (mask_positions)

    def __post_init__(self):  # let tokencredit check the choices on a dummy batch now, not after generating
        if self.token_count not in ("global", "local"):
            raise ValueError(f"token_count must be 'global' or 'local', got {self.token_count!r}")
        tc.group_advantages(torch.tensor([[1.0, 0.0]]), scale=self.adv_scale, eps=self.adv_eps,
                            baseline=self.baseline)
        ones = torch.ones(2, 1)
        tc.policy_loss(ones, ones, ones[:, 0], ones, mode=self.mode, group_size=2, max_len=self.max_len or 1,
                       surrogate=self.surrogate, ratio_level=self.ratio_level)


def mask_positions(model):
    """Pass position_ids = cumsum(attention_mask) - 1 (clamped at 0) when TRL scores and gives none.

    Only TRL's scoring calls, marked fused_lm_head=True, and only text: generation and multimodal
    models that build their own positions are left alone. Returns the hook's handle (.remove() undoes it).
    """
    def add_positions(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if (kwargs.get("fused_lm_head") and kwargs.get("position_ids") is None and "pixel_values" not in kwargs
                and mask is not None and mask.dim() == 2):
            kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)  # left padding shifts nothing
        return args, kwargs
    return model.register_forward_pre_hook(add_positions, with_kwargs=True)


def high_entropy_weights(top_fraction: float = 0.2) -> Callable:
    """token_weights_fn keeping the policy gradient on the micro-batch's top_fraction highest-entropy tokens."""
    tc.high_entropy_mask(torch.ones(1, 1), torch.ones(1, 1), top_fraction)  # a bad fraction fails now, not mid-run

    def weights(inputs, per_token_logps, entropies, mask):
        return tc.high_entropy_mask(entropies, mask, top_fraction)  # (N, T) 0/1
    return weights


def shuffle_groups(batch: dict, group: torch.Tensor, G: int) -> dict:
    """TRL's shuffle_sequence_dict, moving whole groups: rows g*G..g*G+G-1 must be one group."""
    n = group.shape[0]
    if n % G or not (group.view(-1, G) == group.view(-1, G)[:, :1]).all():
        raise ValueError(f"mode 'group_token' needs whole groups of num_generations = {G} consecutive rows in "
                         f"each process's generation batch; got group ids {group.tolist()}")
    order = (torch.randperm(n // G)[:, None] * G + torch.arange(G)).flatten()  # (n,) groups moved as blocks

    def permute(v):
        if v is None or (torch.is_tensor(v) and v.dim() == 0):
            return v  # e.g. num_items_in_batch
        return v[order.to(v.device)] if torch.is_tensor(v) else [v[i] for i in order]
    return {key: permute(value) for key, value in batch.items()}


class TokenCreditGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages are tc.group_advantages and whose loss is tc.policy_loss."""

    def __init__(self, *args, credit: Credit = Credit(), **kwargs):
        super().__init__(*args, **kwargs)
        self.credit = credit
        self._refuse_what_is_not_ours()
        self._position_hooks = ([mask_positions(m) for m in (self.model, self.ref_model) if m is not None]
                                if credit.fix_positions else [])

    def _refuse_what_is_not_ours(self):
        a, G = self.args, self.num_generations
        refused = {"vision-language models (text only here)": self._is_vlm,
                   "top_entropy_quantile < 1 (use Credit(token_weights_fn=high_entropy_weights(...)))":
                   self.top_entropy_quantile < 1.0,
                   "off_policy_mask_threshold": self.off_policy_mask_threshold is not None,
                   "delta (two-sided clipping)": a.delta is not None,
                   "an entropy bonus (entropy_coef, use_adaptive_entropy)": self._entropy_bonus_enabled,
                   "a MoE router aux loss": self.aux_loss_enabled,
                   "vLLM importance sampling correction": self.use_vllm and self.vllm_importance_sampling_correction,
                   "multi_objective_aggregation='normalize_then_sum'": self.multi_objective_aggregation
                   != "sum_then_normalize",
                   "use_bias_correction_kl=True with beta > 0 (tokencredit's k3 has no ratio; set it False)":
                   self.beta > 0 and a.use_bias_correction_kl}
        for what, present in refused.items():
            if present:
                raise ValueError(f"TokenCreditGRPOTrainer does not support {what}")
        if self.credit.mode == "group_token" and a.per_device_train_batch_size % G:
            raise ValueError(f"mode 'group_token' needs whole groups in every micro-batch: "
                             f"per_device_train_batch_size ({a.per_device_train_batch_size}) must be a multiple of "
                             f"num_generations ({G})")

    # ---- advantages: tc.group_advantages of the rewards TRL gathers from every process

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func  # (N_all, reward functions), every process's rows in process order

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        G = self.num_generations if self.model.training else self.num_generations_eval
        per_func = self._rewards_per_func
        if torch.isnan(per_func).all(dim=1).any():
            raise ValueError("a completion got None from every reward function; tokencredit's advantages need "
                             "a reward for every completion")
        rewards = (per_func * self.reward_weights.to(per_func.device)[None, :]).nansum(dim=1)  # (N_all,)
        c = self.credit
        advantages = tc.group_advantages(rewards.view(-1, G), scale=c.adv_scale, eps=c.adv_eps,
                                         baseline=c.baseline).flatten()  # (N_all,)
        n = out["completion_ids"].shape[0]
        first = self.accelerator.process_index * n  # this process's rows, as TRL slices them
        out["advantages"] = advantages[first:first + n].to(out["completion_ids"].device)
        out["tc_group"] = torch.arange(first, first + n, device=out["completion_ids"].device) // G
        return out

    def _prepare_inputs(self, generation_batch):
        if self.credit.mode != "group_token" or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        # TRL's _prepare_inputs (text only), with a shuffle that keeps each group's rows together
        spg = self.args.steps_per_generation
        if self._step % (spg * self.num_iterations) == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            batch = shuffle_groups(batch, batch["tc_group"], self.num_generations)
            self._buffered_inputs = split_tensor_dict(batch, spg)
        return self._buffered_inputs[self._step % spg]

    # ---- the loss: tc.policy_loss on one micro-batch, scaled to the optimizer step

    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logp, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True)  # (N, T) each
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        old_logp = inputs.get("old_per_token_logps")
        old_logp = logp.detach() if old_logp is None else old_logp  # TRL skips the old forward when on-policy
        ref_logp = inputs.get("ref_per_token_logps")
        advantages = inputs["advantages"]  # (N,)
        c, training = self.credit, self.model.training
        if c.token_weights_fn is not None:
            weights = c.token_weights_fn(inputs, logp.detach(), entropies.detach(), mask)  # (N, T)
            advantages = tc.token_advantages(advantages, weights)  # (N, T)
        G = self.num_generations if training else self.num_generations_eval
        rows = self._rows_by_group(inputs["tc_group"], G) if c.mode == "group_token" else slice(None)
        loss, stats = tc.policy_loss(
            logp[rows], old_logp[rows], advantages[rows], mask[rows], mode=c.mode, eps_low=self.epsilon_low,
            eps_high=self.epsilon_high, group_size=G, max_len=c.max_len or self.max_completion_length,
            ref_logp=None if ref_logp is None else ref_logp[rows], beta=self.beta, surrogate=c.surrogate,
            ratio_level=c.ratio_level)
        self._log_stats(stats, entropies, mask, "train" if training else "eval")
        return loss * self._step_scale(inputs, mask, training)

    @staticmethod
    def _rows_by_group(group: torch.Tensor, G: int) -> torch.Tensor:
        """Row order putting each group's rows together; a ValueError if a group is not whole here."""
        order = torch.argsort(group, stable=True)
        _, counts = torch.unique_consecutive(group[order], return_counts=True)
        if (counts != G).any():
            raise ValueError(f"mode 'group_token' got a micro-batch with incomplete groups (rows per group "
                             f"{counts.tolist()}, num_generations = {G}); its normaliser needs whole groups")
        return order

    def _step_scale(self, inputs, mask, training: bool):
        """From policy_loss's micro-batch normaliser to the optimizer step's (see the top of the file)."""
        GA = self.current_gradient_accumulation_steps if training else 1  # TRL does not accumulate in eval
        if self.credit.mode == "token" and self.credit.token_count == "global":
            spg = self.args.steps_per_generation if training else 1
            step_tokens = inputs["num_items_in_batch"].clamp(min=1) / self.accelerator.num_processes * GA / spg
            return mask.sum().clamp(min=1) / step_tokens  # TRL dapo's count
        return 1.0 / GA

    def _log_stats(self, stats: dict, entropies, mask, mode: str):
        """tokencredit's stats (means over real tokens) and the entropy, over every process, in TRL's metrics."""
        keys = [k for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "kl_mean") if k in stats]
        n = stats["num_tokens"]
        local = [float(n), float((entropies.detach() * mask).sum())] + [stats[k] * n for k in keys]
        totals = self.accelerator.reduce(torch.tensor(local, device=mask.device), reduction="sum").tolist()
        denom = max(totals[0], 1.0)
        self._metrics[mode]["entropy"].append(totals[1] / denom)
        for k, total in zip(keys, totals[2:]):
            self._metrics[mode][f"tc/{k}"].append(total / denom)


# -----------------------------------------------------------------------------
# train_tiny's task through TRL: its checkpoint, prompts, verifier and held-out evaluation

def tiny_setup(args, seed: int, updates: int, device, eos_id: int, **config):
    """GRPOConfig, dataset and reward function for `updates` rollout batches of train_tiny's task, set up
    as train_tiny trains: B x G samples at its temperature (no top-k/p), its budget, learning rate,
    update_epochs optimizer steps per batch, grad clip 1.0, float32. `config` overrides GRPOConfig
    fields. The reward function appends each batch's mean completion length to verifier.lengths."""
    import train_tiny as tt
    from datasets import Dataset
    problems = tt.ProblemStream(args, seed).next(args.prompts_per_step * updates)  # train_tiny's prompts, in order
    dataset = Dataset.from_dict({"prompt": tt.prompt_texts(args, problems), "terms": problems})
    lengths = []

    def verifier(prompts, completions, completion_ids, terms, **kwargs):
        # TRL cuts each completion after its first <eos> and decodes it without special tokens
        lengths.append(statistics.mean(len(ids) for ids in completion_ids))
        return [args.reward_correct if tt.verify(t, text, len(ids) > 0 and ids[-1] == eos_id) else args.reward_wrong
                for text, ids, t in zip(completions, completion_ids, terms)]

    verifier.lengths = lengths
    settings = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-tokencredit-"), report_to="none", save_strategy="no",
        disable_tqdm=True, use_cpu=torch.device(device).type == "cpu", seed=seed, shuffle_dataset=False,
        dataloader_num_workers=0,
        # one rollout batch = one optimizer batch = B prompts x G completions, used for update_epochs steps
        per_device_train_batch_size=args.prompts_per_step * args.group_size, gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=args.group_size, num_iterations=args.update_epochs,
        max_steps=args.update_epochs * updates, logging_steps=args.update_epochs,
        max_completion_length=args.max_new_tokens, temperature=args.temperature, top_k=0, top_p=1.0, min_p=None,
        repetition_penalty=1.0, beta=args.beta, use_bias_correction_kl=False, epsilon=args.eps_low,
        epsilon_high=args.eps_high, mask_truncated_completions=False,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        # GRPOConfig defaults to bf16 autocast and activation checkpointing; train_tiny runs in float32 and keeps
        # its activations
        bf16=False, fp16=False, activation_checkpointing=False)
    return GRPOConfig(**{**settings, **config}), dataset, verifier


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Train train_tiny's warm-up checkpoint on its task through TokenCreditGRPOTrainer\n(TRL's "
                    "GRPOTrainer with tokencredit's advantages and loss); print the held-out accuracy before and "
                    "after.",
        epilog="As train_tiny: 16 prompts x 8 samples per rollout batch, 48 new tokens, temperature 1, lr 1e-4,\n"
               "2 optimizer steps per batch, grad clip 1.0. See the top of trl_tokencredit.py and docs/trl.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--loss-mode", default="sample", choices=tc.AGGREGATION_MODES, help="policy_loss's mode (default: sample)")
    add("--adv-scale", default="std", choices=tc.ADVANTAGE_SCALES, help="group_advantages' scale (default: std)")
    add("--baseline", default="mean", choices=tc.BASELINES, help="group_advantages' baseline (default: mean)")
    add("--surrogate", default="clip", choices=tc.SURROGATES, help="per-token loss (default: clip)")
    add("--ratio-level", default="token", choices=tc.RATIO_LEVELS, help="importance ratio (default: token)")
    add("--eps-low", type=float, default=0.2, help="lower clip range (default: 0.2)")
    add("--eps-high", type=float, default=0.2, help="upper clip range; DAPO uses 0.28 (default: 0.2)")
    add("--beta", type=float, default=0.0, help="weight of the k3 KL to the starting model (default: 0)")
    add("--high-entropy", type=float, default=None, metavar="FRACTION",
        help="keep the policy gradient on this fraction of highest-entropy tokens (default: all tokens)")
    add("--steps", type=int, default=60, help="rollout batches (train_tiny's policy updates) (default: 60)")
    add("--seed", type=int, default=0, help="seed of the prompts and the sampling (default: 0)")
    add("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: CUDA if present (default: auto)")
    add("--log-every", type=int, default=10, help="rollout batches between progress lines (default: 10)")
    opt = parser.parse_args(argv)
    if opt.steps < 1 or opt.log_every < 1:
        parser.error(f"--steps and --log-every must be >= 1, got {opt.steps} and {opt.log_every}")
    return opt


def main(argv=None) -> dict:
    opt = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")  # TRL 1.16 uses renamed names
    import transformers
    from transformers import AutoModelForCausalLM, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    import lab
    import train_tiny as tt
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    args = dataclasses.replace(tt.Args(), eps_low=opt.eps_low, eps_high=opt.eps_high, beta=opt.beta)
    try:
        device = tt.pick_device(opt.device)
    except ValueError as error:  # --device cuda without CUDA: one clear line
        sys.exit(f"trl_tokencredit.py: error: {error}")
    if device.type == "mps":
        device = torch.device("cpu")  # TRL on MPS is untested here
    print(f"device: {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else
                                 f", {torch.get_num_threads()} threads"), flush=True)
    _, tokenizer, ckpt = tt.load_or_warm_up(args, device, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                       "runs"))
    held_out = tt.ProblemStream(args, args.warmup_seed + tt.HELD_OUT_STREAM).next(args.eval_size)
    tt.seed_everything(opt.seed)
    model = AutoModelForCausalLM.from_pretrained(ckpt).to(device)
    evaluate = lab.evaluate  # train_tiny's held-out evaluation: greedy and sampled accuracy
    start = evaluate(model.eval(), tokenizer, args, held_out, device)
    print(f"start: held-out greedy {start['accuracy']:.3f}, sampled {start['sampled_accuracy']:.3f}", flush=True)

    credit = Credit(mode=opt.loss_mode, surrogate=opt.surrogate, ratio_level=opt.ratio_level, adv_scale=opt.adv_scale,
                    baseline=opt.baseline,
                    token_weights_fn=None if opt.high_entropy is None else high_entropy_weights(opt.high_entropy))
    config, dataset, verifier = tiny_setup(args, opt.seed, opt.steps, device, tokenizer.eos_token_id)
    begin = time.time()

    class Progress(TrainerCallback):
        def on_log(self, train_args, state, control, logs=None, **kw):
            batch = state.global_step // args.update_epochs
            if logs and "reward" in logs and (batch % opt.log_every == 0 or batch in (1, opt.steps)):
                print(f"batch {batch:3d}/{opt.steps} reward {logs['reward']:.2f} length "
                      f"{logs.get('completions/mean_length', float('nan')):.1f} entropy {logs['entropy']:.3f} "
                      f"clip low {logs.get('tc/clip_frac_low', 0):.3f} high {logs.get('tc/clip_frac_high', 0):.3f}"
                      f" ({time.time() - begin:.0f} s)", flush=True)

    trainer = TokenCreditGRPOTrainer(model=model, reward_funcs=verifier, args=config, train_dataset=dataset,
                                     processing_class=tokenizer, callbacks=[Progress()], credit=credit)
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    trainer.train()
    wall = time.time() - begin
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    end = evaluate(model, tokenizer, args, held_out, model.device)
    print(f"end after {opt.steps} rollout batches ({wall:.0f} s): held-out greedy {start['accuracy']:.3f} -> "
          f"{end['accuracy']:.3f}, sampled {start['sampled_accuracy']:.3f} -> {end['sampled_accuracy']:.3f}")
    return dict(start=start, end=end, wall_s=wall)


if __name__ == "__main__":
    main()
