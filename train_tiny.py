"""train_tiny.py: RLVR with tokencredit's equations, on a task a 0.6 M-parameter model can learn.

The RL loop top to bottom: arguments and presets, rollouts, train_step (rollout -> rewards ->
advantages -> per-token credit -> K updates -> record), evaluation, main. The task (adding 2 to 5
one-digit numbers by partial sums, "6+9+8=" -> "6+9=15,15+8=23>23<eos>"), its exact verifier
and the warm-up that makes a starting policy with habits RL can fix are in tiny_task.py; lab/
runs this loop and measures it.

    python train_tiny.py --quick        # a first look: GRPO on a smaller task, about 45 s
    python train_tiny.py                # five methods on the full task
    python train_tiny.py --quick --impl my/tokencredit.py   # your own equations train it
"""

import argparse
import dataclasses
import importlib.util
import itertools
import json
import os
import re
import sys
import textwrap
import time
from typing import Dict, List, NamedTuple, Optional

import torch

import tokencredit as tc
from tiny_task import (ProblemStream, Task, arg, carry_steps, check_fields, check_task,
                       describe_device, has_repeated_step, load_or_warm_up, mask_positions,
                       meets_long_misconception, meets_misconception, parse_list, pick_device,
                       prompt_texts, quiet_transformers, require, response_mask, sample_tokens,
                       seed_everything, tokenize_prompts, verify_all)

# -----------------------------------------------------------------------------
# arguments and presets


@dataclasses.dataclass
class Args(Task):  # the task's arguments (tiny_task.Task), then the RL loop's
    methods: str = arg("grpo,drgrpo,dapo,cscr,opsd", "comma-separated presets to compare")
    seeds: str = arg("0", "comma-separated seeds; each seed runs every method")
    name: str = arg("default", "results go to runs/<name>/")
    device: str = arg("auto", "auto (CUDA if present, else MPS, else CPU), cpu, cuda or mps")
    quick: bool = arg(False, "a first look: GRPO alone on a smaller task (what it sets: below)")
    impl: str = arg("", "a tokencredit.py to run instead of this folder's (or TOKENCREDIT_IMPL)")
    eval_size: int = arg(200, "held-out problems, scored with greedy decoding")
    eval_every: int = arg(20, "policy updates between held-out evaluations")
    eval_samples: int = arg(4, "samples per held-out problem for the sampled accuracy")
    # rollouts and updates
    steps: int = arg(60, "policy updates per method")
    prompts_per_step: int = arg(16, "B: prompts (groups) per policy update")
    group_size: int = arg(8, "G: responses sampled per prompt")
    temperature: float = arg(1.0, "sampling temperature of the rollouts")
    lr: float = arg(1e-4, "learning rate of the policy updates (AdamW)")
    update_epochs: int = arg(2, "passes over each rollout batch (the 2nd sees ratios != 1)")
    micro_batches: int = arg(0, "the update's forward in this many groups of similar length "
                                "(0: 4 on a CPU, 1 on a GPU)")
    log_every: int = arg(5, "policy updates between progress lines")
    one_step_lr: float = arg(0.01, "learning rate of the lab's single plain-SGD step")
    # the method: set by the presets; any of them given here overrides every preset
    adv_scale: str = arg("std", "group advantage: / the group's std (GRPO), batch, none")
    baseline: str = arg("mean", "group advantage: - the group's mean (GRPO) or leave_one_out")
    loss_mode: str = arg("sample", "token weights: sample (GRPO); token, the batch's token mean "
                         "(verl 0.9.1's token-mean, TRL 1.16's dapo at its defaults); "
                         "group_token (DAPO's printed equation); constant (Dr. GRPO)")
    surrogate: str = arg("clip", "per-token loss: clip (PPO-clip) or reinforce (-A log pi)")
    ratio_level: str = arg("token", "importance ratio: token, sequence (GSPO), sequence_token")
    eps_low: float = arg(0.2, "lower clip range: rho >= 1 - eps_low")
    eps_high: float = arg(0.2, "upper clip range: rho <= 1 + eps_high (Clip-Higher: 0.28)")
    reward_correct: float = arg(1.0, "reward of a verified answer")
    reward_wrong: float = arg(0.0, "reward of a wrong, malformed or truncated answer")
    dynamic_sampling: bool = arg(False, "DAPO: resample until B groups are informative, "
                                 "filtering on the verifier's verdicts (0 < #correct < G), "
                                 "not on the shaped reward")
    max_sampling_rounds: int = arg(3, "dynamic sampling trains on what it has after these")
    overlong_shaping: bool = arg(False, "DAPO: add the soft overlong penalty to the reward")
    overlong_cache: int = arg(6, "L_cache: the soft zone is (L_max - L_cache, L_max]")
    beta: float = arg(0.0, "weight of the k3 KL to the warm-up model (GRPO's paper: 0.04)")
    cscr_strength: float = arg(0.0, "CSCR's alpha: 0 is GRPO")
    cscr_threshold: float = arg(0.0, "CSCR's tau: sensitivity below it is not downweighted")
    entropy_top: float = arg(1.0, "credit only on this top fraction of tokens by entropy")
    pg_coef: float = arg(1.0, "weight of the policy-gradient loss")
    distill_coef: float = arg(0.0, "weight of the self-distillation (OPSD) loss")


PRESETS: Dict[str, Dict[str, object]] = {
    # GRPO [arXiv 2402.03300]: std-normalised advantages, mean over each response then over them
    "grpo": dict(adv_scale="std", loss_mode="sample", eps_low=0.2, eps_high=0.2),
    # Dr. GRPO [arXiv 2503.20783]: no std, a constant denominator (the generation budget)
    "drgrpo": dict(adv_scale="none", loss_mode="constant", eps_low=0.2, eps_high=0.2),
    # DAPO [arXiv 2503.14476]: token mean, Clip-Higher, dynamic sampling, soft overlong, +-1
    "dapo": dict(adv_scale="std", loss_mode="token", eps_low=0.2, eps_high=0.28,
                 dynamic_sampling=True, overlong_shaping=True, reward_wrong=-1.0),
    # CSCR ("Not All Tokens Deserve Equal Credit"): GRPO, sensitive tokens downweighted (ours)
    "cscr": dict(adv_scale="std", loss_mode="sample", eps_low=0.2, eps_high=0.2,
                 cscr_strength=1.0),
    # OPSD, the CSCR paper's baseline: distil from the model told "this answer is correct"
    "opsd": dict(loss_mode="token", pg_coef=0.0, distill_coef=1.0),
    # GSPO [arXiv 2507.18071]: one length-normalised ratio per response, with its clip range
    "gspo": dict(adv_scale="std", loss_mode="sample", ratio_level="sequence", eps_low=3e-4,
                 eps_high=4e-4),
    # the 80/20 rule [arXiv 2506.01939]: GRPO's gradient on the top 20 % of tokens by entropy
    "entropy80": dict(adv_scale="std", loss_mode="sample", eps_low=0.2, eps_high=0.2,
                      entropy_top=0.2),
}
QUICK = dict(name="quick", methods="grpo", max_terms=3, max_value=5, misconception="5",
             max_new_tokens=32, warmup_steps=300, steps=40, eval_size=100, eval_every=10,
             log_every=10)  # GRPO alone, on 2-3 numbers up to 5 (forgetting the carry of a 5)
PRESET_KEYS = sorted({key for preset in PRESETS.values() for key in preset})
# GRPOConfig's names (TRL 1.16) for the settings both have: flags beside ours, and config keys
TRL_NAMES = dict(num_generations="group_size", max_completion_length="max_new_tokens",
                 learning_rate="lr", epsilon="eps_low", epsilon_high="eps_high",
                 num_iterations="update_epochs", loss_type="loss_mode",
                 importance_sampling_level="ratio_level", top_entropy_quantile="entropy_top",
                 seed="seeds")
# TRL's loss_type values whose token weights are a loss_mode's: grpo divides each response by its
# length, dr_grpo by max_completion_length, dapo by the batch's tokens, and so does bnpo here
# (one process, the whole batch in one loss). The others have no loss_mode here:
TRL_LOSS_TYPES = dict(grpo="sample", dr_grpo="constant", dapo="token", bnpo="token")
TRL_ONLY = dict(cispo="REINFORCE on a clipped, detached ratio", vespo="a gamma weight per "
                "response on REINFORCE", sapo="a sigmoid gate in place of the clip",
                luspo="d_i = N (constant with max_len 1; here max_len is the budget)")
HELD_OUT_STREAM, EVAL_SAMPLING_STREAM = 10 ** 6, 2  # seeds: warmup_seed + these (lab: 1, 3, 4)
MEASURES = (("greedy", "accuracy"), ("where the misconception applies", "accuracy_misconception"),
            ("sampled", "sampled_accuracy"))  # main's summary: before -> after


def add_arguments(parser: argparse.ArgumentParser, names: Optional[List[str]] = None) -> None:
    """A --flag for each field of Args (or of names); a flag not given stays out of the parsed
    namespace, so that a preset can tell it from a default."""
    task = parser.add_argument_group("the task, the demonstrator and the warm-up (tiny_task.py)")
    task_names = {f.name for f in dataclasses.fields(Task)}
    for f in dataclasses.fields(Args):
        if names is None or f.name in names:
            flags = ["--" + name.replace("_", "-") for name in
                     [f.name] + [trl for trl, ours in TRL_NAMES.items() if ours == f.name]]
            kind = (dict(action=argparse.BooleanOptionalAction) if f.type is bool
                    else dict(type=f.type, metavar=f.name.upper()))
            (task if f.name in task_names else parser).add_argument(
                *flags, dest=f.name, default=argparse.SUPPRESS,
                help=f"{f.metadata['help']} ({f.default!r})", **kind)


def read_arguments(argv: Optional[List[str]] = None,
                   prog: Optional[str] = None) -> Dict[str, object]:
    """The arguments given, by Args' names: --config FILE's, then the command line's over them."""
    presets = "\n".join(f"  {name:<9s} " + ", ".join(f"{k}={v}" for k, v in preset.items())
                        for name, preset in PRESETS.items())
    parser = argparse.ArgumentParser(
        prog=prog, usage="%(prog)s [--quick] [--methods M] [--seeds S] [--config FILE] [options]",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"presets (any argument given overrides it in every preset):\n{presets}\n"
               "--quick sets: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()) +
               "\n\nGRPOConfig's names (TRL 1.16), as flags and --config keys:\n" + textwrap.fill(
                   ", ".join(f"{trl}={ours}" for trl, ours in TRL_NAMES.items()) + "; loss_type "
                   + ", ".join(f"{trl}={ours}" for trl, ours in TRL_LOSS_TYPES.items()) + " (the "
                   "same token weights). TRL's epsilon_high defaults to epsilon, here to the "
                   "preset's.", 90, initial_indent="  ", subsequent_indent="  "))
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="arguments from a YAML or JSON file, by these names or GRPOConfig's; "
                             "flags given beside it win. Each run writes runs/<name>/config.json")
    add_arguments(parser)
    given = vars(parser.parse_args(argv))
    given = {**(read_config(given.pop("config")) if "config" in given else {}), **given}
    loss = given.get("loss_mode")
    require(loss not in TRL_ONLY, f"--loss-type {loss}: TRL's {loss} is {TRL_ONLY.get(loss)}, not "
            f"a loss_mode here; expected TRL's grpo, dr_grpo, dapo, bnpo or sample, token, "
            f"group_token, constant")
    if loss in TRL_LOSS_TYPES:
        given["loss_mode"] = TRL_LOSS_TYPES[loss]
    return given


def read_config(path: str) -> Dict[str, object]:
    """--config FILE: {Args' name or GRPOConfig's: value}, from YAML or JSON, typed as Args'."""
    if not (os.path.isfile(path) and path.endswith((".yaml", ".yml", ".json"))):
        raise ValueError(f"--config must name a .yaml, .yml or .json file, got {path!r}")
    with open(path) as f:
        if path.endswith(".json"):
            values = json.load(f)
        else:
            import yaml  # PyYAML, which transformers requires
            values = yaml.safe_load(f)
    require(isinstance(values, dict), f"--config {path}: expected a mapping of argument names to "
            f"values, got {type(values).__name__}")
    kinds, config = {f.name: f.type for f in dataclasses.fields(Args)}, {}
    for key, value in values.items():
        name = TRL_NAMES.get(key, key)
        require(name in kinds, f"--config {path}: unknown argument {key!r}; expected Args' names "
                f"(python train_tiny.py --help) or GRPOConfig's {sorted(TRL_NAMES)}")
        config[name] = as_kind(kinds[name], value)
        require(config[name] is not None, f"--config {path}: {key} must be "
                f"{kinds[name].__name__}, got {value!r}")
    return config


def as_kind(kind, value):
    """A config's value as Args' type, or None if it is not one: YAML reads 1e-4 as text, and
    seeds: 0 as a number."""
    if kind is bool or isinstance(value, bool):
        return value if kind is bool and isinstance(value, bool) else None
    accepted = {int: (int,), float: (int, float, str), str: (int, str)}[kind]
    if not isinstance(value, accepted):
        return None
    try:
        return kind(value)
    except ValueError:
        return None


def parse_args(argv: Optional[List[str]] = None, prog: Optional[str] = None):
    """Returns (the base Args, one (method, Args) per method asked for, the seeds). prog: the
    command --help names (python -m lab runs this parser too)."""
    return resolve_args(read_arguments(argv, prog))


def resolve_args(given: Dict[str, object]):
    """parse_args from the arguments given: defaults, --quick's, then the given, each preset's
    values under the given."""
    base = dataclasses.replace(Args(), **(QUICK if given.get("quick") else {}))
    base = dataclasses.replace(base, **{k: v for k, v in given.items() if k not in PRESET_KEYS})
    validate_args(base)
    if base.impl or os.environ.get("TOKENCREDIT_IMPL"):
        use_tokencredit(base.impl or os.environ["TOKENCREDIT_IMPL"])
    runs = []
    for method in base.methods.split(","):
        if method not in PRESETS:
            raise ValueError(f"--methods: unknown method {method!r}; expected a comma-separated "
                             f"list from {sorted(PRESETS)}")
        overrides = {k: v for k, v in given.items() if k in PRESET_KEYS}
        runs.append((method, dataclasses.replace(base, **{**PRESETS[method], **overrides})))
        check_method(runs[-1][1])
    return base, runs, parse_list(base.seeds, int, "--seeds")


# -----------------------------------------------------------------------------
# rollouts: sample (tiny_task.sample_tokens) and verify; score the sampled tokens

def held_out_problems(args: Args) -> List[List[int]]:
    return ProblemStream(args, args.warmup_seed + HELD_OUT_STREAM).next(args.eval_size)


class Rollout(NamedTuple):
    problems: List[List[int]]  # (n,) each response's problem
    responses: torch.Tensor  # (n, T) token ids, <pad> after each row's <eos>
    mask: torch.Tensor  # (n, T) real tokens, up to and including <eos>
    texts: List[str]  # (n,) decoded, without special tokens
    complete: torch.Tensor  # (n,) ended with <eos>
    correct: torch.Tensor  # (n,) bool, on the CPU: the verifier's verdict


def rollout(model, tokenizer, args: Args, problems: List[List[int]], repeats: int, greedy: bool,
            device) -> Rollout:
    """Sample `repeats` responses per problem (T: the longest of this call) and verify them."""
    ids, attention = tokenize_prompts(tokenizer, prompt_texts(problems), device)
    ids, attention = ids.repeat_interleave(repeats, 0), attention.repeat_interleave(repeats, 0)
    responses, _ = sample_tokens(model, ids, attention, args.max_new_tokens, greedy,
                                 args.temperature, tokenizer.eos_token_id)
    mask, complete = response_mask(responses, tokenizer.eos_token_id)
    responses = responses.masked_fill(~mask, tokenizer.pad_token_id)
    body = responses.masked_fill(responses == tokenizer.eos_token_id, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(body.tolist(), skip_special_tokens=True)
    flat = [t for t in problems for _ in range(repeats)]
    return Rollout(flat, responses, mask, texts, complete, verify_all(flat, texts, complete))


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log pi(o_t | q, o_<t) of the sampled tokens, logits[t, o_t] - logsumexp_v logits[t, v]:
    (N, T, V), (N, T) -> (N, T), in float32 whatever the logits' dtype (bf16 would lose the small
    changes the clip looks at)."""
    logits = logits.float()
    picked = logits.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (N, T)
    return picked - torch.logsumexp(logits, dim=-1)  # (N, T)


def score(model, tokenizer, args, problems, responses, mask, conds=("",), need_logits=False):
    """log pi(o_t | cond, q, o_<t) of the responses (n, T) under each condition, in one batched
    forward, at the sampling temperature and with positions numbered from the attention mask, as
    sample_tokens draws. Returns one (logp (n, T), logits (n, T, V) or None) per condition."""
    n, T = responses.shape
    texts = [text for cond in conds for text in prompt_texts(problems, cond)]
    prompt_ids, prompt_attention = tokenize_prompts(tokenizer, texts, responses.device)  # (k n, P)
    P, k = prompt_ids.shape[1], len(conds)
    ids = torch.cat([prompt_ids, responses.repeat(k, 1)], dim=1)  # (k n, P + T)
    attention = torch.cat([prompt_attention, mask.repeat(k, 1).long()], dim=1)
    logits = model(input_ids=ids, attention_mask=attention,
                   position_ids=mask_positions(attention)).logits
    logits = logits[:, P - 1:P + T - 1] / args.temperature  # (k n, T, V): what each came from
    logp = token_logprobs(logits, responses.repeat(k, 1))  # (k n, T)
    return [(logp[i * n:(i + 1) * n], logits[i * n:(i + 1) * n] if need_logits else None)
            for i in range(k)]


def score_by_length(model, tokenizer, args, problems, responses, mask, micro_batches: int):
    """score() with logits, on micro-batches of rows of similar length, each cut to its longest
    response: the same log-probs with less work on padding. Returns logp (n, T), logits."""
    T, lengths = responses.shape[1], mask.sum(dim=1)  # lengths (n,)
    order, parts = lengths.argsort(), []  # rows from the shortest response to the longest
    for rows in order.chunk(micro_batches):
        width = max(1, int(lengths[rows].max()))
        (logp, logits), = score(model, tokenizer, args, [problems[i] for i in rows.tolist()],
                                responses[rows, :width], mask[rows, :width], need_logits=True)
        parts.append((torch.nn.functional.pad(logp, (0, T - width)),  # (rows, T)
                      torch.nn.functional.pad(logits, (0, 0, 0, T - width))))  # (rows, T, V)
    inverse = order.argsort()  # back to the batch's order
    return tuple(torch.cat(part)[inverse] for part in zip(*parts))


# -----------------------------------------------------------------------------
# one policy update: rollout -> rewards -> advantages -> per-token credit -> K updates

def sample_groups_fn(model, tokenizer, args: Args, stream: ProblemStream, device):
    """One round of rollouts for fill_batch: B prompts x G responses, verified and rewarded.
    Responses are padded to the budget, so that dynamic sampling's rounds stack."""
    def sample_groups() -> Dict[str, torch.Tensor]:
        problems = stream.next(args.prompts_per_step)
        r = rollout(model, tokenizer, args, problems, args.group_size, False, device)
        pad = args.max_new_tokens - r.responses.shape[1]
        responses = torch.nn.functional.pad(r.responses, (0, pad), value=tokenizer.pad_token_id)
        mask = torch.nn.functional.pad(r.mask, (0, pad), value=False)  # (N, L_max)
        rewards = torch.where(r.correct, args.reward_correct, args.reward_wrong).float()  # (N,)
        if args.overlong_shaping:  # shapes the reward only: DAPO's filter reads `correct`
            rewards = rewards + tc.overlong_penalty(mask.sum(dim=1).cpu(), args.max_new_tokens,
                                                    args.overlong_cache)
        terms = [t + [-1] * (args.max_terms - len(t)) for t in problems]  # -1 pads: a tensor
        B, G = len(problems), args.group_size
        return dict(rewards=rewards.view(B, G), correct=r.correct.view(B, G),
                    complete=r.complete.cpu().view(B, G), terms=torch.tensor(terms),
                    detour=torch.tensor([has_repeated_step(s) for s in r.texts]).view(B, G),
                    carries=torch.tensor([carry_steps(s, args) for s in r.texts]).view(B, G, 4),
                    responses=responses.cpu().view(B, G, -1), mask=mask.cpu().view(B, G, -1))
    return sample_groups


def train_step(step: int, args: Args, model, ref_model, optimizer, tokenizer, sample_groups,
               device) -> dict:
    """One policy update. Returns its log record."""
    timer = Timer(device)
    batch, record = collect_groups(args, sample_groups)  # rollouts, verified and rewarded
    record.update(step=step, t_generate=timer.lap())
    if record["groups"] == 0:  # dynamic sampling found nothing to learn from: no update
        return dict(record, t_score=0.0, t_update=0.0, skipped=1)
    G = args.group_size
    problems = [[x for x in row if x >= 0] for row in batch["terms"].tolist() for _ in range(G)]
    mask = batch["mask"].flatten(0, 1)  # (N, L_max); columns of padding only are cut:
    T = max(1, int(mask.sum(dim=1).max()))
    responses, mask = batch["responses"].flatten(0, 1)[:, :T].to(device), mask[:, :T].to(device)
    advantages = tc.group_advantages(batch["rewards"], args.adv_scale, baseline=args.baseline)
    advantages = advantages.flatten().to(device)  # (N,) A_i
    with torch.no_grad():  # the privileged conditions (CSCR, OPSD) and the reference model
        conds = score_conditions(model, tokenizer, args, problems, responses, mask)
        ref_logp = (score(ref_model, tokenizer, args, problems, responses, mask)[0][0]
                    if ref_model else None)
    record["t_score"] = timer.lap()
    micro_batches = args.micro_batches or (1 if timer.cuda else 4)  # GPU: fewer launches
    logp, logits = score_by_length(model, tokenizer, args, problems, responses, mask, micro_batches)
    old_logp = logp.detach()  # nothing has changed since the rollout: these are pi_old's
    entropy = tc.token_entropy(logits.detach())  # (N, T)
    token_adv = token_credit(args, advantages, mask, entropy, old_logp, conds)  # (N,) or (N, T)
    for epoch in range(args.update_epochs):
        if epoch > 0:
            logp, logits = score_by_length(model, tokenizer, args, problems, responses, mask,
                                           micro_batches)
        loss, stats = update_loss(args, logp, logits, old_logp, token_adv, mask, ref_logp, conds)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    record["t_update"] = timer.lap()
    return dict(record, reward=float(batch["rewards"].mean()),
                accuracy=float(batch["correct"].float().mean()),
                entropy=float(tc.aggregate(entropy, mask, "token")), loss=float(loss.detach()),
                **stats, **rollout_stats(batch, mask, args))


def collect_groups(args: Args, sample_groups):
    """B groups of G verified responses; with DAPO's dynamic sampling, only informative ones
    (0 < #correct < G: it filters on the verifier, not on the shaped reward).
    Returns batch, record (kept_frac: the fraction of groups sampled that were informative)."""
    if args.dynamic_sampling:
        batch, fill = tc.fill_batch(sample_groups, args.prompts_per_step,
                                    args.max_sampling_rounds, filter_key="correct")
        kept_frac, rounds = fill["groups_informative"] / fill["groups_seen"], fill["rounds"]
    else:
        batch, rounds = sample_groups(), 1
        mixed = (batch["correct"] != batch["correct"][:, :1]).any(dim=1)  # (B,), counted only
        kept_frac = int(mixed.sum()) / args.prompts_per_step
    return batch, dict(kept_frac=kept_frac, groups=batch["rewards"].shape[0], rounds=rounds)


def score_conditions(model, tokenizer, args, problems, responses, mask) -> dict:
    """CSCR's log-probs under c+ and c-, and OPSD's teacher logits under c+ ({} if neither)."""
    if not (args.cscr_strength > 0 or args.distill_coef > 0):
        return {}
    (logp_pos, teacher_logits), (logp_neg, _) = score(
        model, tokenizer, args, problems, responses, mask, (args.cond_pos, args.cond_neg),
        need_logits=args.distill_coef > 0)
    return dict(logp_pos=logp_pos, logp_neg=logp_neg, teacher_logits=teacher_logits)


def token_credit(args: Args, advantages, mask, entropy, old_logp, conds) -> torch.Tensor:
    """Which tokens carry the credit: all alike (GRPO), less where CSCR's conditions shift a
    token most, only the batch's highest-entropy tokens (80/20), or both.
    Returns A_i (N,) or A_{i,t} (N, T)."""
    weights = None
    if args.cscr_strength > 0:
        d_pos, d_neg = tc.counterfactual_shifts(old_logp, conds["logp_pos"], conds["logp_neg"],
                                                mask)
        weights = tc.cscr_weights(tc.counterfactual_sensitivity(d_pos, d_neg), mask,
                                  args.cscr_strength, args.cscr_threshold)
    if args.entropy_top < 1:
        keep = tc.high_entropy_mask(entropy, mask, args.entropy_top)
        weights = keep if weights is None else weights * keep
    return advantages if weights is None else tc.cscr_advantages(advantages, weights)  # A_{i,t}


def update_loss(args: Args, logp, logits, old_logp, token_adv, mask, ref_logp, conds):
    """pg_coef * policy_loss + distill_coef * self_distillation_loss. Returns (loss, stats)."""
    loss, stats = torch.zeros((), device=logp.device), {}
    if args.pg_coef > 0:
        pg_loss, stats = tc.policy_loss(
            logp, old_logp, token_adv, mask, mode=args.loss_mode, eps_low=args.eps_low,
            eps_high=args.eps_high, group_size=args.group_size, max_len=args.max_new_tokens,
            ref_logp=ref_logp, beta=args.beta, surrogate=args.surrogate,
            ratio_level=args.ratio_level)
        loss = loss + args.pg_coef * pg_loss
    if args.distill_coef > 0:
        distill = tc.self_distillation_loss(logits, conds["teacher_logits"], mask,
                                            mode=args.loss_mode, group_size=args.group_size,
                                            max_len=args.max_new_tokens)
        loss = loss + args.distill_coef * distill
        stats["distill_loss"] = float(distill.detach())
    return loss, stats


def is_long(terms: torch.Tensor, args: Args) -> torch.Tensor:
    """(B, max_terms), -1 padded -> (B,): more numbers than the middle of the task's range (4 or 5
    of 2-5): the problems whose answers are long."""
    return (terms >= 0).sum(dim=1) * 2 > args.min_terms + args.max_terms


def rollout_stats(batch: Dict[str, torch.Tensor], mask: torch.Tensor,
                  args: Args) -> Dict[str, float]:
    """The update's rollouts: mean length, of right and of wrong answers; the fraction truncated
    (loops that hit the budget) and that finished after re-checking a step; of the steps where a
    misconception applies, the fraction written right: the first's in answers to short and to
    long problems (is_long), the second's (--long-misconception-rate), all in long answers."""
    lengths = mask.sum(dim=1).float().cpu()  # (N,)
    correct, complete = batch["correct"].flatten(), batch["complete"].flatten()
    right, wrong = lengths[correct], lengths[~correct]
    long = is_long(batch["terms"], args)[:, None].expand(batch["correct"].shape).flatten()  # (N,)
    carries = batch["carries"].flatten(0, 1).float()  # (N, 4): met, right; met, right

    def done_right(rows, k):  # of the steps where misconception k applies, the fraction right
        met = carries[rows, 2 * k].sum()
        return float(carries[rows, 2 * k + 1].sum() / met) if met else float("nan")
    return dict(fix_short=done_right(~long, 0), fix_long=done_right(long, 0),
                fix_long_misconception=done_right(slice(None), 1), length=float(lengths.mean()),
                length_correct=float(right.mean()) if right.numel() else float("nan"),
                length_wrong=float(wrong.mean()) if wrong.numel() else float("nan"),
                truncated_frac=float((~complete).float().mean()),
                recheck_frac=float((batch["detour"].flatten() & complete).float().mean()))


class Timer:
    """Seconds between laps, once the GPU has finished what was queued (it runs asynchronously)."""

    def __init__(self, device):
        self.cuda, self.last = torch.device(device).type == "cuda", 0.0
        self.lap()

    def lap(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        start, self.last = self.last, time.time()
        return self.last - start


# -----------------------------------------------------------------------------
# held-out evaluation, one method's run, and main

def evaluate(model, tokenizer, args: Args, problems, device) -> Dict[str, float]:
    """Held-out accuracy, greedy and as the mean over eval_samples samples at the rollout
    temperature (what RL maximises), each also where the problem meets the misconception; greedy
    elsewhere too. Sampling draws from its own stream: evaluating leaves the run's unchanged."""
    greedy, sampled, lengths = [], [], []
    with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
        torch.manual_seed(args.warmup_seed + EVAL_SAMPLING_STREAM)
        for start in range(0, len(problems), 256):
            chunk = problems[start:start + 256]
            r = rollout(model, tokenizer, args, chunk, 1, True, device)
            greedy, lengths = greedy + r.correct.tolist(), lengths + r.mask.sum(dim=1).tolist()
            r = rollout(model, tokenizer, args, chunk, args.eval_samples, False, device)
            sampled += r.correct.view(len(chunk), -1).float().mean(dim=1).tolist()
    meets = [meets_misconception(t, args) for t in problems]
    groups = dict(long=is_long(torch.tensor([t + [-1] * (args.max_terms - len(t))
                                             for t in problems]), args).tolist(),
                  long_misconception=[meets_long_misconception(t, args) for t in problems])

    def mean(xs, where=None, among=meets):  # over every problem, or where among is `where`
        xs = [x for x, m in zip(xs, among) if where is None or m == where]
        return sum(xs) / len(xs) if xs else float("nan")
    by_group = {f"{what}_{name}": mean(xs, True, among)  # the lab's failure-1 measures
                for name, among in groups.items() for what, xs in (("accuracy", greedy),
                                                                   ("sampled_accuracy", sampled))}
    return dict(accuracy=mean(greedy), sampled_accuracy=mean(sampled), length=mean(lengths),
                accuracy_misconception=mean(greedy, True), accuracy_other=mean(greedy, False),
                sampled_accuracy_misconception=mean(sampled, True),
                sampled_accuracy_short=mean(sampled, False, groups["long"]), **by_group)


def progress(r: dict) -> str:
    """One update's log line: the rollouts, the policy's entropy, and where the seconds went."""
    if "entropy" not in r:
        return f"no informative group after {r['rounds']} rounds: update skipped"
    held_out = f" eval {r['eval_accuracy']:.3f}" if "eval_accuracy" in r else ""
    return (f"reward {r['reward']:+.2f} acc {r['accuracy']:.2f} len {r['length']:5.1f} "
            f"ent {r['entropy']:.3f} kept {r['kept_frac']:.2f}{held_out} | gen "
            f"{r['t_generate']:.2f}s score {r['t_score']:.2f}s update {r['t_update']:.2f}s")


def train_method(label: str, args: Args, seed: int, start_path: str, tokenizer, eval_problems,
                 device, log_file):
    """Policy updates from the warm-up weights. Returns (records, interrupted, the trained model).
    The model stays in eval mode: no dropout, so old and new log-probs agree on-policy."""
    from transformers import AutoModelForCausalLM
    seed_everything(seed)
    model = AutoModelForCausalLM.from_pretrained(start_path).to(device).eval()
    ref_model = (AutoModelForCausalLM.from_pretrained(start_path).to(device).eval()
                 if args.beta > 0 else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sample_groups = sample_groups_fn(model, tokenizer, args, ProblemStream(args, seed), device)
    history = []
    try:
        for step in range(1, args.steps + 1):
            record = dict(method=label, seed=seed, **train_step(
                step, args, model, ref_model, optimizer, tokenizer, sample_groups, device))
            if step % args.eval_every == 0 or step == args.steps:
                held_out = evaluate(model, tokenizer, args, eval_problems, device)
                record.update({f"eval_{k}": v for k, v in held_out.items()})
            history.append(record)
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            if step % args.log_every == 0 or step in (1, args.steps):
                print(f"[{label:>9s} seed {seed}] step {step:3d}/{args.steps} " + progress(record),
                      flush=True)
    except KeyboardInterrupt:  # Ctrl-C: stop here, and still write the summary of what ran
        print(f"\n[{label}] interrupted after {len(history)} steps; summarising what ran")
        return history, True, model
    return history, False, model


def main(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> dict:
    """Warm up (or reuse) the starting policy, train every method from it for every seed, print
    the held-out accuracy before and after. Writes runs/<name>/config.json (--config reruns it),
    metrics.jsonl (a record per update), results.json and each trained policy (METHOD-seedSEED/,
    save_pretrained), and returns the results."""
    given = read_arguments(argv, prog)
    base, runs, seeds = resolve_args(given)
    quiet_transformers()
    device = pick_device(base.device)
    print(describe_device(device, base.device))
    print(f"tokencredit: {os.path.abspath(tc.__file__)}")  # ours, or the student's (--impl)
    out_dir = os.path.join("runs", base.name)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:  # --config reruns it
        json.dump({**{k: v for k, v in dataclasses.asdict(base).items() if k not in PRESET_KEYS},
                   **{k: v for k, v in given.items() if k in PRESET_KEYS}}, f, indent=1)
    model, tokenizer, start_path = load_or_warm_up(base, device, "runs")
    eval_problems = held_out_problems(base)
    start = evaluate(model, tokenizer, base, eval_problems, device)
    print(f"starting policy: held-out accuracy {start['accuracy']:.3f} greedy "
          f"({start['accuracy_misconception']:.3f} where the misconception applies, "
          f"{start['accuracy_other']:.3f} elsewhere), {start['sampled_accuracy']:.3f} sampled "
          f"({start['sampled_accuracy_misconception']:.3f} where the misconception applies), "
          f"mean length {start['length']:.1f} tokens ({base.eval_size} problems)")
    results = dict(config=dataclasses.asdict(base), device=str(device), start=start,
                   warmup_path=start_path, runs=[], interrupted=False,
                   methods={label: dataclasses.asdict(args) for label, args in runs})
    begin = time.time()
    with open(os.path.join(out_dir, "metrics.jsonl"), "w") as log_file:
        for seed, (label, args) in itertools.product(seeds, runs):
            run_start = time.time()
            history, interrupted, model = train_method(label, args, seed, start_path, tokenizer,
                                                       eval_problems, device, log_file)
            model.save_pretrained(os.path.join(out_dir, f"{label}-seed{seed}"))  # from_pretrained
            tokenizer.save_pretrained(os.path.join(out_dir, f"{label}-seed{seed}"))
            evals = [r for r in history if "eval_accuracy" in r]
            final = {k[5:]: v for k, v in evals[-1].items() if k[:5] == "eval_"} if evals else start
            results["runs"].append(dict(method=label, seed=seed, steps=len(history), final=final,
                                        wall_s=time.time() - run_start, interrupted=interrupted))
            results["interrupted"] = interrupted
            if interrupted:
                break
    results["wall_s"] = time.time() - begin
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nheld-out accuracy before -> after {base.steps} updates:")
    for run in results["runs"]:
        print(f"  {run['method']:>9s} seed {run['seed']}: " + ", ".join(
            f"{what} {start[key]:.3f} -> {run['final'][key]:.3f}" for what, key in MEASURES))
    print(f"wrote {out_dir}/config.json, metrics.jsonl, results.json and the trained policies "
          f"(METHOD-seedSEED/) (training took {results['wall_s']:.0f} s)")
    return results


# -----------------------------------------------------------------------------
# set-up: checks of the arguments, and whose tokencredit.py runs

def validate_args(a: Args) -> None:
    """The task's arguments (check_task), then the loop's; a method's are checked by tokencredit
    itself (check_method)."""
    check_task(a)
    check_fields(a, lambda v: v >= 0, ">= 0", "steps", "micro_batches")
    check_fields(a, lambda v: v >= 1, ">= 1", "prompts_per_step", "eval_size", "eval_every",
                 "eval_samples", "log_every", "update_epochs", "max_sampling_rounds")
    check_fields(a, lambda v: v >= 2, ">= 2", "group_size")
    check_fields(a, lambda v: v > 0, "> 0", "one_step_lr", "lr", "temperature")
    require(a.device in ("auto", "cpu", "cuda", "mps"),
            f"--device must be auto, cpu, cuda or mps, got {a.device!r}")
    require(bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", a.name)), f"--name must be a plain "
            f"folder name under runs/ (letters, digits, . _ -), got {a.name!r}")
    parse_list(a.seeds, int, "--seeds")


def check_method(a: Args) -> None:
    """Let tokencredit check a method's arguments on a dummy batch now, not after the warm-up;
    it calls only the functions the method uses."""
    if not (a.pg_coef >= 0 and a.distill_coef >= 0 and a.pg_coef + a.distill_coef > 0):
        raise ValueError(f"--pg-coef and --distill-coef must be >= 0 and not both 0, got "
                         f"{a.pg_coef} and {a.distill_coef}")
    ones = torch.ones(a.group_size, 1)  # one group of one-token responses
    tc.group_advantages(torch.tensor([[a.reward_correct, a.reward_wrong]]), scale=a.adv_scale,
                        baseline=a.baseline)
    if a.pg_coef > 0:
        tc.policy_loss(ones, ones, ones[:, 0], ones, mode=a.loss_mode, eps_low=a.eps_low,
                       eps_high=a.eps_high, group_size=a.group_size, max_len=a.max_new_tokens,
                       ref_logp=ones, beta=a.beta, surrogate=a.surrogate,
                       ratio_level=a.ratio_level)
    if a.cscr_strength != 0:
        tc.cscr_weights(ones, ones, a.cscr_strength, a.cscr_threshold)
    if a.entropy_top != 1:
        tc.high_entropy_mask(ones, ones, a.entropy_top)
    if a.overlong_shaping:
        tc.overlong_penalty(ones[:, 0], a.max_new_tokens, a.overlong_cache)


def use_tokencredit(path: str) -> None:
    """--impl: every equation from the tokencredit.py at path (a student's) instead of ours."""
    global tc
    if not os.path.isfile(path):
        raise ValueError(f"--impl must name a tokencredit.py file, got {path!r}")
    spec = importlib.util.spec_from_file_location("tokencredit_impl", path)
    tc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tc)


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:  # bad arguments: one clear line, no traceback
        sys.exit(f"train_tiny.py: error: {error}")
    except NotImplementedError as missing:  # course mode: an exercise the method needs
        sys.exit(f"train_tiny.py: your tokencredit.py has not implemented {missing}, which "
                 f"--methods needs")
