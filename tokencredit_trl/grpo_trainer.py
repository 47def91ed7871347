"""tokencredit_trl/grpo_trainer.py: TRL's GRPOTrainer with tokencredit's advantages and loss.

TokenCreditGRPOTrainer is TRL's GRPOTrainer (generation, rewards, reference model, accelerate,
several GPUs) whose advantages are tokencredit.group_advantages and whose loss is
tokencredit.policy_loss. GRPOConfig stays the source of truth: without tokencredit's choices the
trainer computes what TRL would (loss_type, scale_rewards, importance_sampling_level,
top_entropy_quantile, epsilon, beta, vLLM's importance-sampling correction), or refuses at start
what tokencredit cannot express. tokencredit's choices come from TokenCreditGRPOConfig's fields
(grpo_config.py: YAML, TrlParser) or, in Python, from `credit=Credit(...)`; they add what TRL has no
setting for (loss_mode "group_token", the leave-one-out baseline, per-token weights, DAPO's dynamic
sampling, CSCR's re-scoring under c+ and c-) and may replace a setting left at TRL's default; one
that disagrees with a setting you changed raises. grpo_config.resolve_credit checks every
setting when the config is made; this file checks only what the model and the data show.

    trainer = TokenCreditGRPOTrainer(model=..., reward_funcs=..., train_dataset=...,
                                     args=TokenCreditGRPOConfig(loss_type="grpo",
                                                                baseline="leave_one_out", ...))
See docs/trl.md: the mapping, what is exact and tested, normalisers, positions, refusals.
"""

import contextlib
import dataclasses
import logging
import math
import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from trl import GRPOConfig, GRPOTrainer
from trl.data_utils import is_conversational
from trl.trainer.utils import RepeatSampler, get_config_model_id, pad, split_tensor_dict

import tokencredit as tc
from tokencredit_trl.grpo_config import (Credit, TokenCreditGRPOConfig, check_eval_batch,
                                         filter_column, resolve_credit)


def mask_positions(model):
    """Pass position_ids = cumsum(attention_mask) - 1 (clamped at 0) when TRL scores and gives
    none. Only TRL's scoring calls, marked fused_lm_head=True, and only text: generation and
    multimodal models that build their own positions are left alone. Returns the hook's handle
    (.remove() undoes it)."""
    def add_positions(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if (kwargs.get("fused_lm_head") and kwargs.get("position_ids") is None
                and "pixel_values" not in kwargs and mask is not None and mask.dim() == 2):
            kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)  # pads shift none
        return args, kwargs
    return model.register_forward_pre_hook(add_positions, with_kwargs=True)


def with_sampling_correction(advantages, is_ratio, mask, ratio_level: str):
    """A_{i,t} times vLLM's importance-sampling weight m (TRL's importance_sampling_ratio, (N, T)
    or (N, 1), >= 0, computed without gradient). TRL multiplies its per-token loss by m, and
    -min(rho A m, clip(rho) A m) = m (-min(rho A, clip(rho) A)) for m >= 0: the correction is one
    more per-token weight of the credit. Under ratio_level "sequence" the advantages stay (N,)
    and the per-token loss is one value per row, so the row's masked mean of m gives every
    aggregation TRL's value. Returns (N, T), or (N,) for "sequence"."""
    m = is_ratio.expand(mask.shape)  # (N, T)
    if ratio_level == "sequence":
        return advantages * (m * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (N,)
    return (advantages if advantages.dim() == 2 else advantages[:, None]) * m  # (N, T)


def assert_in_conversation(messages: list, cond: str) -> list:
    """CSCR's assertion in a chat prompt: `cond` before the content of the last user message,
    so that the chat template wraps it (never raw text before the template's tokens)."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users or not isinstance(messages[users[-1]].get("content"), str):
        raise ValueError(f"CSCR on a conversation needs a last user message with text content, "
                         f"got roles {[m.get('role') for m in messages]}")
    last = users[-1]
    return (messages[:last] + [{**messages[last], "content": cond + messages[last]["content"]}]
            + messages[last + 1:])


def shuffle_groups(batch: dict, group: torch.Tensor, G: int) -> dict:
    """TRL's shuffle_sequence_dict, moving whole groups: rows g*G..g*G+G-1 must be one group."""
    n = group.shape[0]
    if n % G or not (group.view(-1, G) == group.view(-1, G)[:, :1]).all():
        raise ValueError(f"loss_mode 'group_token' needs whole groups of num_generations = {G} "
                         f"consecutive rows in each process's generation batch; got group ids "
                         f"{group.tolist()}")
    order = (torch.randperm(n // G)[:, None] * G + torch.arange(G)).flatten()  # groups as blocks

    def permute(v):
        if v is None or (torch.is_tensor(v) and v.dim() == 0):
            return v  # e.g. num_items_in_batch
        return v[order.to(v.device)] if torch.is_tensor(v) else [v[i] for i in order]
    return {key: permute(value) for key, value in batch.items()}


# TRL's start-up warnings keyed on the loss settings Credit may replace: TRL logs them from its
# own settings, so they are held back while it starts and _warn_like_trl says the same of the
# settings that run.
TRL_LOSS_WARNINGS = ("When using `'luspo'` loss", "VESPO computes",
                     "When using `importance_sampling_level='sequence'`")


@contextlib.contextmanager
def _without_trl_loss_warnings():
    def keep(record):  # accelerate's logger puts "[RANK 0] " in front
        return not any(start in record.getMessage() for start in TRL_LOSS_WARNINGS)
    trl_logger = logging.getLogger("trl.trainer.grpo_trainer")
    trl_logger.addFilter(keep)
    try:
        yield
    finally:
        trl_logger.removeFilter(keep)


class TokenCreditGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages are tc.group_advantages and whose loss is tc.policy_loss."""

    def __init__(self, model, reward_funcs=None, args: Optional[GRPOConfig] = None, *more,
                 credit: Optional[Credit] = None, token_weights_fn: Optional[Callable] = None,
                 **kwargs):
        """args: a TokenCreditGRPOConfig (its fields are tokencredit's choices) or a GRPOConfig
        with `credit=Credit(...)` or none; token_weights_fn: the one choice that is code."""
        if args is None:  # TRL's default config (as GRPOTrainer makes it), to resolve Credit now
            name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = GRPOConfig(f"{name.split('/')[-1]}-GRPO")
        if isinstance(args, TokenCreditGRPOConfig):
            if credit is not None:
                raise ValueError("tokencredit's choices come from TokenCreditGRPOConfig's fields "
                                 "or from credit=Credit(...) with a GRPOConfig, not both")
            credit = args.to_credit()
        if token_weights_fn is not None:
            if credit is not None and credit.token_weights_fn is not None:
                raise ValueError("token_weights_fn given twice: as an argument and in Credit")
            credit = dataclasses.replace(credit or Credit(), token_weights_fn=token_weights_fn)
        self.credit = resolve_credit(credit, args, args.world_size)  # before the model loads
        with _without_trl_loss_warnings():
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        self._refuse_what_is_not_ours()
        self._warn_like_trl()
        self._ds_pending, self._ds_passes = [], 0  # the private prompt stream (_extra_prompts)
        self._position_hooks = ([mask_positions(m) for m in (self.model, self.ref_model)
                                 if m is not None] if self.credit.fix_positions else [])

    def _refuse_what_is_not_ours(self):
        """What only the model and the data show (grpo_config.check_settings has the rest)."""
        refused = {"vision-language models (text only here)": self._is_vlm,
                   "a MoE router aux loss": self.aux_loss_enabled}
        for what, present in refused.items():
            if present:
                raise ValueError(f"TokenCreditGRPOTrainer does not support {what}")
        if self.eval_dataset is not None:
            check_eval_batch(self.credit, self.args)
        if self.credit.dynamic_sampling:
            self._filter_column = filter_column(self.credit, self.reward_func_names)
            if isinstance(self.train_dataset, torch.utils.data.IterableDataset) or not hasattr(
                    self.train_dataset, "__getitem__"):
                raise ValueError("dynamic sampling draws its extra prompts by index: it needs a "
                                 "map-style train_dataset, not an IterableDataset")

    def evaluate(self, *args, **kwargs):
        check_eval_batch(self.credit, self.args)  # an eval_dataset given only now
        return super().evaluate(*args, **kwargs)

    def _warn_like_trl(self):
        """TRL's start-up warnings on the loss, of the settings that run (see TRL_LOSS_WARNINGS)."""
        c = self.credit
        if self.args.loss_type == "luspo" and c.ratio_level != "sequence":
            warnings.warn(f"GRPOConfig(loss_type='luspo') with ratio_level={c.ratio_level!r}: the "
                          "LUSPO paper's setup is importance_sampling_level='sequence'")
        sums_tokens = c.loss_mode in ("token", "group_token") or (
            c.loss_mode == "constant" and c.max_len != 1)
        if c.ratio_level == "sequence" and sums_tokens:
            warnings.warn(f"ratio_level='sequence' with loss_mode {c.loss_mode!r} sums per-token "
                          "terms, which weights each completion by its length instead of "
                          "optimising the per-sequence objective; GSPO's is loss_mode 'sample' "
                          "(loss_type 'grpo')")

    # ---- advantages: tc.group_advantages of the rewards TRL gathers from every process

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions,
                                                            completion_ids_list)
        return self._rewards_per_func  # (N_all, reward functions), all processes in order

    def _generate_and_score_completions(self, inputs):
        c = self.credit
        if not self.model.training or not (c.dynamic_sampling or c.cscr_strength is not None):
            return self._score_round(inputs)  # evaluation is left alone
        if c.dynamic_sampling:
            return self._dynamic_batch(inputs)
        out = self._score_round(inputs)
        rows = torch.arange(out["completion_ids"].shape[0])
        out["tc_weights"], diagnostics = self._cscr_weights(out, [x["prompt"] for x in inputs],
                                                            rows)
        self._log_cscr([diagnostics])
        return out

    def _score_round(self, inputs):
        """One call of TRL's generation and scoring, with tokencredit's advantages."""
        out = super()._generate_and_score_completions(inputs)
        G = self.num_generations if self.model.training else self.num_generations_eval
        per_func = self._rewards_per_func
        if torch.isnan(per_func).all(dim=1).any():
            raise ValueError("a completion got None from every reward function; tokencredit's "
                             "advantages need a reward for every completion")
        weights = self.reward_weights.to(per_func.device)[None, :]
        rewards = (per_func * weights).nansum(dim=1)  # (N_all,)
        self._round_rewards = rewards
        c = self.credit
        advantages = tc.group_advantages(rewards.view(-1, G), scale=c.adv_scale, eps=c.adv_eps,
                                         baseline=c.baseline).flatten()  # (N_all,)
        n, device = out["completion_ids"].shape[0], out["completion_ids"].device
        first = self.accelerator.process_index * n  # this process's rows, as TRL slices them
        out["advantages"] = advantages[first:first + n].to(device)
        out["tc_group"] = torch.arange(first, first + n, device=device) // G
        if "importance_sampling_ratio" in out:  # (N, 1) in TRL's sequence modes: rounds pad it
            out["importance_sampling_ratio"] = out["importance_sampling_ratio"].expand(
                out["completion_mask"].shape).contiguous()  # (N, T)
        return out

    # ---- DAPO's dynamic sampling: tc.fill_batch over global rounds, on every process alike

    def _dynamic_batch(self, inputs):
        """Rounds of TRL's generation until fill_batch has B_all informative groups (all
        processes: the rewards are gathered, so every process takes the same decisions and runs
        the same rounds). The kept groups are gathered and dealt out in fill_batch's order; a
        short batch ends in filler rows of mask 0 (tc_real 0) that carry no weight."""
        c, G = self.credit, self.num_generations
        P, p = self.accelerator.num_processes, self.accelerator.process_index
        n = len(inputs)  # this process's rows
        rounds = []

        def sample_groups():
            batch = inputs if not rounds else self._extra_prompts(n)
            out = self._score_round(batch)
            rounds.append((out, [x["prompt"] for x in batch]))
            rewards = self._round_rewards.view(-1, G).cpu()  # (B_all, G), the weighted sum
            verdicts = self._rewards_per_func[:, self._filter_column].view(-1, G).cpu()
            B = rewards.shape[0]
            return dict(verdict=verdicts, rewards=rewards, index=torch.arange(B),
                        round=torch.full((B,), len(rounds) - 1))

        B_all = n * P // G
        kept, stats = tc.fill_batch(sample_groups, B_all, c.max_rounds, "verdict")
        K = stats["groups_kept"]
        where = list(zip(kept["round"].tolist(), kept["index"].tolist()))  # fill_batch's order
        used = sorted({r for r, _ in where}) or [0]  # rounds holding kept groups (fillers: 0)
        diagnostics = []
        if c.cscr_strength is not None:  # each process re-scores the kept rows it holds
            b = n // G
            for r in used:
                out, prompts = rounds[r]
                mine = [j - p * b for rr, j in where if rr == r and p * b <= j < (p + 1) * b]
                rows = (torch.tensor(mine, dtype=torch.long)[:, None] * G
                        + torch.arange(G)).flatten()
                weights = torch.zeros(out["completion_mask"].shape, device=out["advantages"].device)
                if rows.numel() or P > 1:  # P > 1: every process calls the model alike (ZeRO-3)
                    w, d = self._cscr_weights(out, prompts, rows)
                    weights[rows.to(weights.device)] = w
                    diagnostics.append(d)
                out["tc_weights"] = weights
            self._log_cscr(diagnostics)
        whole = {r: self._gather_round(rounds[r][0]) for r in used}  # every process's rows
        global_rows = [(r, torch.arange(j * G, (j + 1) * G)) for r, j in where]  # kept groups
        fillers = torch.arange((B_all - K) * G)  # rows of the first used round, masked out
        batch = {}
        for key, (side, value) in self._pad_rules(whole[used[0]]).items():
            parts = [whole[r][key][rows] for r, rows in global_rows]
            parts.append(whole[used[0]][key][fillers])
            width = max(part.shape[1] for part in parts)
            batch[key] = torch.cat([F.pad(part, (width - part.shape[1], 0) if side == "left"
                                          else (0, width - part.shape[1]), value=value)
                                    for part in parts])
        device = batch["completion_ids"].device
        real = torch.arange(B_all * G, device=device) < K * G  # (N_all,)
        batch["completion_mask"] = batch["completion_mask"] * real[:, None]
        if "tc_weights" in batch:
            batch["tc_weights"] = batch["tc_weights"] * real[:, None]
        advantages = torch.zeros(B_all * G, device=device)
        if K:
            advantages[:K * G] = tc.group_advantages(
                kept["rewards"], scale=c.adv_scale, eps=c.adv_eps, baseline=c.baseline
            ).flatten().to(device)
        loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        mine = slice(p * n, (p + 1) * n)
        out = {key: value[mine] for key, value in batch.items()}
        out.update(advantages=advantages[mine], tc_real=real[mine].float(),
                   tc_group=torch.arange(B_all * G, device=device)[mine] // G,
                   num_items_in_batch=loss_mask.sum(), tc_rows=torch.tensor(K * G, device=device))
        metrics = self._metrics["train"]
        for key, value in stats.items():
            metrics[f"ds/{key}"].append(float(value))
        metrics["ds/reward"].append(float(kept["rewards"].mean()) if K else float("nan"))
        return out

    # how each key of TRL's batch pads when rounds of other widths are concatenated
    PAD_SIDES = {"prompt_ids": "left", "prompt_mask": "left", "completion_ids": "right",
                 "completion_mask": "right", "old_per_token_logps": "right",
                 "ref_per_token_logps": "right", "sampling_per_token_logps": "right",
                 "tool_mask": "right", "tc_weights": "right", "importance_sampling_ratio": "right"}
    RECOMPUTED = ("advantages", "tc_group", "num_items_in_batch")

    def _pad_rules(self, out) -> dict:
        """key -> (side, value): prompts left, completions right, tool_mask with 1, token ids
        with <pad>. Any other key raises (multimodal inputs, keys of a newer TRL)."""
        pad_id = self._tokenizer.pad_token_id
        values = dict(prompt_ids=pad_id, completion_ids=pad_id, tool_mask=1)
        unknown = sorted(set(out) - set(self.PAD_SIDES) - set(self.RECOMPUTED))
        if unknown:
            raise ValueError(f"dynamic sampling cannot concatenate rounds holding {unknown}: it "
                             f"knows how to pad {sorted(self.PAD_SIDES)} (text models only)")
        return {key: (self.PAD_SIDES[key], values.get(key, 0)) for key in out
                if key in self.PAD_SIDES}

    def _gather_round(self, out) -> dict:
        """One round's rows of every process, in process order, each key padded its own way."""
        gathered = {}
        for key, (side, value) in self._pad_rules(out).items():
            t = self.accelerator.pad_across_processes(out[key], dim=1, pad_index=value,
                                                      pad_first=side == "left")
            gathered[key] = self.accelerator.gather(t)
        return gathered

    def _extra_prompts(self, n: int) -> list:
        """This process's n rows of a generation batch from a private RepeatSampler over the
        training set (seed + 1, reshuffled each pass): the main loader, its epochs and its
        sampler are not touched."""
        P, p, G = self.accelerator.num_processes, self.accelerator.process_index, \
            self.num_generations
        while len(self._ds_pending) < n * P:
            sampler = RepeatSampler(self.train_dataset, mini_repeat_count=G,
                                    batch_size=n * P // G, repeat_count=1, shuffle=True,
                                    seed=self.args.seed + 1 + self._ds_passes)
            self._ds_passes += 1
            drawn = list(sampler)
            if not drawn:  # RepeatSampler drops an incomplete batch: this one would never end
                raise ValueError(f"dynamic sampling draws {n * P // G} prompts per round, but the "
                                 f"train_dataset has {len(self.train_dataset)}")
            self._ds_pending.extend(drawn)
        take, self._ds_pending = self._ds_pending[:n * P], self._ds_pending[n * P:]
        return [self.train_dataset[i] for i in take[p * n:(p + 1) * n]]

    # ---- CSCR: the completions re-scored under c+ and c- by the current policy, no gradient

    def conditioned_prompt_ids(self, prompts: list, cond: str):
        """TRL's own prompt tokenization of the prompts with the assertion `cond`: before the
        text of a text prompt, or before the content of the last user message of a conversation
        (inside the chat template). Returns left-padded (ids, mask)."""
        if is_conversational({"prompt": prompts[0]}):
            prompts = [assert_in_conversation(messages, cond) for messages in prompts]
        else:
            prompts = [cond + text for text in prompts]
        ids, _, _ = self._tokenize_prompts(prompts)
        ids = [torch.as_tensor(row) for row in ids]
        return (pad(ids, self._tokenizer.pad_token_id, "left"),
                pad([torch.ones_like(row) for row in ids], 0, "left"))

    def _cscr_weights(self, out, prompts, rows):
        """CSCR's weights (len(rows), T) of these rows of one round and their shift_diagnostics:
        log-probs under c+ and c- (two forwards) against the old ones (TRL's, or a third
        forward on TRL's prompt when it computed none)."""
        c, device = self.credit, out["completion_ids"].device
        rows = rows.to(device)
        completion_ids, completion_mask = out["completion_ids"][rows], out["completion_mask"][rows]
        mask = completion_mask * out["tool_mask"][rows] if "tool_mask" in out else completion_mask
        T = completion_ids.shape[1]
        picked = [prompts[i] for i in rows.tolist()]
        if not picked:  # this process holds no kept row: score one, keep none (collectives)
            rows, picked = rows.new_zeros(1), prompts[:1]
            completion_ids, completion_mask = out["completion_ids"][:1], out["completion_mask"][:1]
            mask = completion_mask[:0]

        def score(prompt_ids, prompt_mask):
            ids = torch.cat([prompt_ids.to(device), completion_ids], dim=1)
            attention = torch.cat([prompt_mask.to(device), completion_mask], dim=1)
            return self._get_per_token_logps_and_entropies(self.model, ids, attention, T)[0]

        with torch.no_grad():
            logp_pos = score(*self.conditioned_prompt_ids(picked, c.cond_pos))
            logp_neg = score(*self.conditioned_prompt_ids(picked, c.cond_neg))
            if "old_per_token_logps" in out:
                logp = out["old_per_token_logps"][rows]
            else:
                logp = score(out["prompt_ids"][rows], out["prompt_mask"][rows])
        n = mask.shape[0]
        logp, logp_pos, logp_neg = logp[:n], logp_pos[:n], logp_neg[:n]
        self._cscr_scored = (logp, logp_pos, logp_neg)  # for the tests
        d_pos, d_neg = tc.counterfactual_shifts(logp, logp_pos, logp_neg, mask)
        weights = tc.cscr_weights(tc.counterfactual_sensitivity(d_pos, d_neg), mask,
                                  c.cscr_strength, c.cscr_threshold)
        real = weights[mask.bool()]  # a completion's weights have mean 1: their spread is logged
        spread = (real.min().item(), real.max().item()) if real.numel() else (math.inf, -math.inf)
        return weights, dict(tc.shift_diagnostics(d_pos, d_neg, mask), weight_min=spread[0],
                             weight_max=spread[1])

    CSCR_METRICS = ("same_direction", "sign_reversal", "mean_abs_pos", "mean_abs_neg",
                    "mean_sensitivity", "mean_abs_common", "mean_abs_differential")

    def _log_cscr(self, diagnostics: list):
        """tc.shift_diagnostics over every process's re-scored tokens, as cscr/* metrics, and
        the smallest and largest weight of those tokens, cscr/weight_min and cscr/weight_max."""
        device = self.accelerator.device
        local = [sum(d["num_affected"] for d in diagnostics)]
        local += [sum(d[k] * d["num_affected"] for d in diagnostics) for k in self.CSCR_METRICS]
        totals = self.accelerator.reduce(torch.tensor(local, dtype=torch.float64, device=device),
                                         reduction="sum").tolist()
        for key, total in zip(self.CSCR_METRICS, totals[1:]):
            self._metrics["train"][f"cscr/{key}"].append(total / max(totals[0], 1.0))
        spread = [[min([d["weight_min"] for d in diagnostics], default=math.inf),
                   -max([d["weight_max"] for d in diagnostics], default=-math.inf)]]
        low, minus_high = self.accelerator.gather(
            torch.tensor(spread, dtype=torch.float64, device=device)).min(dim=0).values.tolist()
        if totals[0] > 0:  # no re-scored token: no weight
            self._metrics["train"]["cscr/weight_min"].append(low)
            self._metrics["train"]["cscr/weight_max"].append(-minus_high)

    def _prepare_inputs(self, generation_batch):
        if self.credit.loss_mode != "group_token" or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        # TRL's _prepare_inputs (text only), with a shuffle that keeps each group's rows together
        spg = self.args.steps_per_generation
        if self._step % (spg * self.num_iterations) == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            batch = shuffle_groups(batch, batch["tc_group"], self.num_generations)
            self._buffered_inputs = split_tensor_dict(batch, spg)
        return self._buffered_inputs[self._step % spg]

    # ---- the loss: tc.policy_loss on one micro-batch, scaled to the optimizer step

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's public seam (Trainer.compute_loss), in place of GRPOTrainer._compute_loss."""
        if return_outputs:
            raise ValueError("TokenCreditGRPOTrainer does not return outputs (as GRPOTrainer)")
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logp, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True)
        mask = (completion_mask if "tool_mask" not in inputs
                else completion_mask * inputs["tool_mask"])
        old_logp = inputs.get("old_per_token_logps")
        old_logp = logp.detach() if old_logp is None else old_logp  # TRL skips it on-policy
        ref_logp = inputs.get("ref_per_token_logps")
        advantages = inputs["advantages"]  # (N,)
        c, training = self.credit, self.model.training
        weights = inputs.get("tc_weights")  # CSCR's, fixed at generation
        if c.token_weights_fn is not None:
            more = c.token_weights_fn(inputs, logp.detach(), entropies.detach(), mask)  # (N, T)
            if not (isinstance(more, torch.Tensor) and more.shape == mask.shape
                    and bool(torch.isfinite(more).all()) and bool((more >= 0).all())):
                raise ValueError(f"token_weights_fn must return finite weights >= 0 of shape "
                                 f"{tuple(mask.shape)} (N, T), got {getattr(more, 'shape', more)}")
            weights = more if weights is None else weights * more
        if weights is not None:
            advantages = tc.cscr_advantages(advantages, weights)  # (N, T): A_i times the weights
        if self.use_vllm and self.vllm_importance_sampling_correction:
            advantages = with_sampling_correction(advantages, inputs["importance_sampling_ratio"],
                                                  mask, c.ratio_level)
        G = self.num_generations if training else self.num_generations_eval
        real = inputs.get("tc_real")  # dynamic sampling: 0 on a short batch's fillers
        if real is None:
            rows, n_real = slice(None), None
        else:
            rows = real.nonzero().squeeze(1)
            n_real = rows.numel()
            if n_real == 0:  # fillers only: their loss is 0 (mask 0), with the stats' keys
                rows = torch.arange(real.shape[0], device=real.device)
        if c.loss_mode == "group_token":
            group = inputs["tc_group"]
            rows = (self._rows_by_group(group, G) if real is None or n_real == 0
                    else rows[self._rows_by_group(group[rows], G)])
        loss, stats = tc.policy_loss(
            logp[rows], old_logp[rows], advantages[rows], mask[rows], mode=c.loss_mode,
            eps_low=self.epsilon_low, eps_high=self.epsilon_high, group_size=G, max_len=c.max_len,
            ref_logp=None if ref_logp is None else ref_logp[rows], beta=self.beta,
            surrogate=c.surrogate, ratio_level=c.ratio_level)
        self._log_stats(stats, entropies, mask[rows], "train" if training else "eval", rows)
        return loss * self._step_scale(inputs, mask, training, n_real)

    @staticmethod
    def _rows_by_group(group: torch.Tensor, G: int) -> torch.Tensor:
        """Row order putting each group's rows together; a ValueError if a group is not whole."""
        order = torch.argsort(group, stable=True)
        _, counts = torch.unique_consecutive(group[order], return_counts=True)
        if (counts != G).any():
            raise ValueError(f"loss_mode 'group_token' got a micro-batch with incomplete groups "
                             f"(rows per group {counts.tolist()}, num_generations = {G}); its "
                             f"normaliser needs whole groups")
        return order

    def _step_scale(self, inputs, mask, training: bool, n_real=None):
        """From policy_loss's micro-batch normaliser to the optimizer step's (docs/trl.md).
        n_real: the micro-batch's kept rows under dynamic sampling (None without it)."""
        GA = self.current_gradient_accumulation_steps if training else 1  # no accumulation in eval
        spg = self.args.steps_per_generation if training else 1
        P = self.accelerator.num_processes
        if self.credit.loss_mode == "token" and self.credit.token_count == "global":
            step_tokens = inputs["num_items_in_batch"].clamp(min=1) / P * GA / spg
            return mask.sum().clamp(min=1) / step_tokens  # TRL dapo's count
        if n_real is not None:  # this micro-batch's share of the kept rows of every process
            return n_real * P * spg / (inputs["tc_rows"].clamp(min=1) * GA)
        return 1.0 / GA

    def _log_stats(self, stats: dict, entropies, mask, mode: str, rows=slice(None)):
        """tokencredit's stats (means over real tokens) and the entropy, over every process."""
        keys = [k for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "kl_mean")
                if k in stats]
        n = stats["num_tokens"]
        local = [float(n), float((entropies.detach()[rows] * mask).sum())]
        local += [stats[k] * n for k in keys]
        totals = self.accelerator.reduce(torch.tensor(local, device=mask.device),
                                         reduction="sum").tolist()
        denom = max(totals[0], 1.0)
        self._metrics[mode]["entropy"].append(totals[1] / denom)
        for k, total in zip(keys, totals[2:]):
            self._metrics[mode][f"tc/{k}"].append(total / denom)

