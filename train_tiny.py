"""train_tiny.py: RLVR with tokencredit's equations, on a task a 0.6 M-parameter model can learn.

Top to bottom: the arguments and the presets, set-up, rollouts, train_step (rollout -> rewards
-> advantages -> per-token credit -> K updates -> record), the held-out evaluation, main. The task
(adding 2 to 5 one-digit numbers by partial sums, "6+9+8=" -> "6+9=15,15+8=23>23<eos>"), its exact
verifier, the model and the warm-up that makes a starting policy with habits RL can fix are in
tiny_task.py; lab/ runs this loop with measures of its own (Measures) and measures more.

    python train_tiny.py --quick        # a first look: GRPO on a smaller task, about 45 s
    python train_tiny.py                # five methods on the full task
    python train_tiny.py --quick --impl my/tokencredit.py   # your own equations train it
    python train_tiny.py --config runs/quick/config.json    # a run again, from its saved config
"""

import argparse
import copy
import dataclasses
import functools
import importlib.util
import itertools
import json
import os
import re
import sys
import time
from typing import Callable, Dict, List, NamedTuple

import torch
from transformers import HfArgumentParser

import tiny_task
from tiny_task import Task, arg

# -----------------------------------------------------------------------------
# arguments and presets


def trl(name: str) -> dict:  # GRPOConfig's name of the same setting (TRL 1.16): a flag beside ours
    return dict(aliases=sorted({f"--{name}", f"--{name.replace('_', '-')}"}))


@dataclasses.dataclass
class Args(Task):  # the task's arguments (tiny_task.Task), then the RL loop's
    methods: str = arg("grpo,drgrpo,dapo,cscr,opsd", "comma-separated presets to compare")
    seeds: str = arg("0", "comma-separated seeds; each seed runs every method", **trl("seed"))
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
    group_size: int = arg(8, "G: responses sampled per prompt", **trl("num_generations"))
    temperature: float = arg(1.0, "sampling temperature of the rollouts")
    lr: float = arg(1e-4, "learning rate of the policy updates (AdamW)", **trl("learning_rate"))
    update_epochs: int = arg(2, "passes over each rollout batch (the 2nd sees ratios != 1)",
                             **trl("num_iterations"))
    micro_batches: int = arg(0, "the update's forward in this many groups of similar length "
                                "(0: 4 on a CPU, 1 on a GPU)")
    log_every: int = arg(5, "policy updates between progress lines")
    # the method: set by the presets; any of them given here overrides every preset
    adv_scale: str = arg("std", "group advantage: / the group's std (GRPO), batch, none")
    baseline: str = arg("mean", "group advantage: - the group's mean (GRPO) or leave_one_out")
    loss_mode: str = arg("sample", "token weights: sample (GRPO); token, the batch's token mean "
                         "(verl 0.9.1's token-mean, TRL 1.16's dapo at its defaults); "
                         "group_token (DAPO's printed equation); constant (Dr. GRPO)")
    surrogate: str = arg("clip", "per-token loss: clip (PPO-clip) or reinforce (-A log pi)")
    ratio_level: str = arg("token", "importance ratio: token, sequence (GSPO), sequence_token",
                           **trl("importance_sampling_level"))
    eps_low: float = arg(0.2, "lower clip range: rho >= 1 - eps_low", **trl("epsilon"))
    eps_high: float = arg(0.2, "upper clip range: rho <= 1 + eps_high (Clip-Higher: 0.28)",
                          **trl("epsilon_high"))
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
    entropy_top: float = arg(1.0, "credit only on this top fraction of tokens by entropy",
                             **trl("top_entropy_quantile"))
    pg_coef: float = arg(1.0, "weight of the policy-gradient loss")
    distill_coef: float = arg(0.0, "weight of the self-distillation (OPSD) loss")

    def __post_init__(self):  # a bad value: one line that names its flag (the method's values:
        tiny_task.check_task(self)  # tokencredit checks them, check_method)
        tiny_task.check_fields(self, lambda v: v >= 0, ">= 0", "steps", "micro_batches")
        tiny_task.check_fields(self, lambda v: v >= 1, ">= 1", "prompts_per_step", "eval_size",
                               "eval_every", "eval_samples", "log_every", "update_epochs",
                               "max_sampling_rounds")
        tiny_task.check_fields(self, lambda v: v >= 2, ">= 2", "group_size")
        tiny_task.check_fields(self, lambda v: v > 0, "> 0", "lr", "temperature")
        tiny_task.require(self.device in ("auto", "cpu", "cuda", "mps"),
                          f"--device must be auto, cpu, cuda or mps, got {self.device!r}")
        tiny_task.require(bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name)),
                          f"--name must be a plain folder name under runs/ (letters, digits, "
                          f". _ -), got {self.name!r}")
        tiny_task.parse_list(self.seeds, int, "--seeds")
        for method in self.methods.split(","):
            tiny_task.require(method in PRESETS, f"--methods: unknown method {method!r}; expected "
                              f"a comma-separated list from {sorted(PRESETS)}")
        tiny_task.require(self.pg_coef >= 0 and self.distill_coef >= 0
                          and self.pg_coef + self.distill_coef > 0, f"--pg-coef and "
                          f"--distill-coef must be >= 0 and not both 0, got {self.pg_coef} and "
                          f"{self.distill_coef}")


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
HELD_OUT_STREAM, EVAL_SAMPLING_STREAM = 10 ** 6, 2  # seeds: warmup_seed + these (lab: 1, 3, 4)
NOT_GIVEN = object()  # a field's value before a flag or --config gives one


class Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help: each flag once, with its default; the presets' table as it is written."""

    def _format_action_invocation(self, action):  # --min-terms, not --min_terms beside it
        shown = copy.copy(action)  # (HfArgumentParser accepts both spellings)
        shown.option_strings = [o for o in action.option_strings if "_" not in o]
        return super()._format_action_invocation(shown)


def argument_parser() -> HfArgumentParser:
    """A flag for each field of Args (HfArgumentParser reads its type, default and help; a TRL
    name is an alias), and --config."""
    presets = "\n".join(f"  {name:<9s} " + ", ".join(f"{k}={v}" for k, v in preset.items())
                        for name, preset in PRESETS.items())
    parser = HfArgumentParser(
        Args, prog="train_tiny.py", formatter_class=Help, allow_abbrev=False,
        exit_on_error=False, description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--quick] [--methods M] [--seeds S] [--config FILE] [options]",
        epilog=f"presets (any argument given overrides it in every preset):\n{presets}\n"
               "--quick sets: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--config", metavar="FILE", help="arguments from a YAML or JSON file, by "
                        "the names above (runs/NAME/config.json reruns a run); flags beside it "
                        "win")
    return parser


def read_arguments(argv=None) -> Dict[str, object]:
    """The arguments given, by Args' names: --config FILE's, then the flags over them. A file's
    values pass through the parser as flags do, so both are typed and checked alike."""
    parser, argv = argument_parser(), sys.argv[1:] if argv is None else list(argv)
    unset = argparse.Namespace(**{f.name: NOT_GIVEN for f in dataclasses.fields(Args)})
    try:
        path = parser.parse_known_args(argv)[0].config
        given, unknown = parser.parse_known_args(
            (config_flags(parser, path) if path else []) + argv, unset)
    except argparse.ArgumentError as error:  # a value its flag's type refuses
        raise ValueError(str(error)) from None
    tiny_task.require(not unknown, f"unrecognized arguments: {' '.join(unknown)} (python "
                      "train_tiny.py --help lists them)")
    return {k: v for k, v in vars(given).items() if v is not NOT_GIVEN and k != "config"}


def config_flags(parser: HfArgumentParser, path: str) -> List[str]:
    """--config FILE's values as the flags --NAME=VALUE, from YAML or JSON."""
    if not (os.path.isfile(path) and path.endswith((".yaml", ".yml", ".json"))):
        raise ValueError(f"--config must name a .yaml, .yml or .json file, got {path!r}")
    with open(path) as f:
        import yaml  # PyYAML, which transformers requires
        values = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
    tiny_task.require(isinstance(values, dict), f"--config {path}: expected a mapping of "
                      f"argument names to values, got {type(values).__name__}")
    flags = [f"--{key}={value}" for key, value in values.items()]
    try:
        _, unknown = parser.parse_known_args(flags)
    except argparse.ArgumentError as error:
        raise ValueError(f"--config {path}: {error}") from None
    tiny_task.require(not unknown, f"--config {path}: unknown arguments {unknown}; expected "
                      "Args' names (python train_tiny.py --help)")
    return flags


def parse_args(argv=None):
    """Returns (base, runs, given): the run's arguments before any preset (Args' defaults,
    --quick's, then the given), one (method, Args) per method asked for (its preset over the
    base, the given over that), and the arguments given. Checks each method's arguments."""
    given = read_arguments(argv)
    quick = QUICK if given.get("quick") else {}
    base = Args(**{**quick, **{k: v for k, v in given.items() if k not in PRESET_KEYS}})
    overrides = {k: v for k, v in given.items() if k in PRESET_KEYS}
    runs = [(method, dataclasses.replace(base, **{**PRESETS[method], **overrides}))
            for method in base.methods.split(",")]
    for _, args in runs:
        check_method(args, load_tokencredit(args))
    return base, runs, given


# -----------------------------------------------------------------------------
# set-up: whose tokencredit.py runs, its checks of a method, what a caller measures

def load_tokencredit(args: Args):
    """The tokencredit module a run computes with: --impl's file (or TOKENCREDIT_IMPL's), a
    student's, else this folder's."""
    path = args.impl or os.environ.get("TOKENCREDIT_IMPL", "")
    tiny_task.require(not path or os.path.isfile(path),
                      f"--impl must name a tokencredit.py file, got {path!r}")
    return load_module(os.path.abspath(path) if path else "")


@functools.lru_cache(maxsize=None)  # a file runs once, however often it is asked for
def load_module(path: str):
    if not path:
        import tokencredit
        return tokencredit
    spec = importlib.util.spec_from_file_location("tokencredit_impl", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_method(a: Args, tc) -> None:
    """Let tokencredit check a method's arguments on a dummy batch now, not after the warm-up;
    it calls only the functions the method uses."""
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


class Measures(NamedTuple):
    """What a caller adds to the records (lab/ adds its own), {name: value}: from each update's
    rollouts (args, batch, texts) and from each held-out evaluation, per problem (args, problems,
    greedy right, sampled fraction right)."""
    rollouts: Callable[..., dict] = lambda args, batch, texts: {}
    evaluation: Callable[..., dict] = lambda args, problems, greedy, sampled: {}


# -----------------------------------------------------------------------------
# rollouts: sample (tiny_task.sample_tokens) and verify

def held_out_problems(args: Args) -> List[List[int]]:
    return tiny_task.ProblemStream(args, args.warmup_seed + HELD_OUT_STREAM).next(args.eval_size)


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
    ids, attention = tiny_task.tokenize_prompts(tokenizer, tiny_task.prompt_texts(problems),
                                                device)
    ids, attention = ids.repeat_interleave(repeats, 0), attention.repeat_interleave(repeats, 0)
    responses, _ = tiny_task.sample_tokens(model, ids, attention, args.max_new_tokens, greedy,
                                           args.temperature, tokenizer.eos_token_id)
    mask, complete = tiny_task.response_mask(responses, tokenizer.eos_token_id)
    responses = responses.masked_fill(~mask, tokenizer.pad_token_id)
    texts = decode(tokenizer, responses)
    flat = [t for t in problems for _ in range(repeats)]
    return Rollout(flat, responses, mask, texts, complete,
                   tiny_task.verify_all(flat, texts, complete))


def decode(tokenizer, responses: torch.Tensor) -> List[str]:
    """(n, T) token ids, <pad> after <eos> -> n texts without <eos>: what the verifier reads."""
    body = responses.masked_fill(responses == tokenizer.eos_token_id, tokenizer.pad_token_id)
    return tokenizer.batch_decode(body.tolist(), skip_special_tokens=True)


# -----------------------------------------------------------------------------
# one policy update: rollout -> rewards -> advantages -> per-token credit -> K updates

def sample_groups_fn(model, tokenizer, args: Args, stream: tiny_task.ProblemStream, device):
    """One round of rollouts for fill_batch: B prompts x G responses, verified. Responses are
    padded to the budget, so that dynamic sampling's rounds stack."""
    def sample_groups() -> Dict[str, torch.Tensor]:
        problems = stream.next(args.prompts_per_step)
        r = rollout(model, tokenizer, args, problems, args.group_size, False, device)
        pad = args.max_new_tokens - r.responses.shape[1]
        responses = torch.nn.functional.pad(r.responses, (0, pad), value=tokenizer.pad_token_id)
        mask = torch.nn.functional.pad(r.mask, (0, pad), value=False)  # (N, L_max)
        terms = [t + [-1] * (args.max_terms - len(t)) for t in problems]  # -1 pads: a tensor
        B, G = len(problems), args.group_size
        return dict(correct=r.correct.view(B, G), complete=r.complete.cpu().view(B, G),
                    terms=torch.tensor(terms), responses=responses.cpu().view(B, G, -1),
                    mask=mask.cpu().view(B, G, -1))
    return sample_groups


def collect_groups(args: Args, tc, sample_groups):
    """B groups of G verified responses; with DAPO's dynamic sampling, only informative ones
    (0 < #correct < G: it filters on the verifier, not on the shaped reward).
    Returns batch, record (kept_frac: the fraction of groups sampled that were informative)."""
    if args.dynamic_sampling:
        batch, fill = tc.fill_batch(sample_groups, args.prompts_per_step,
                                    args.max_sampling_rounds, filter_key="correct")
        return batch, dict(kept_frac=fill["groups_informative"] / fill["groups_seen"],
                           groups=fill["groups_kept"], rounds=fill["rounds"])
    batch = sample_groups()  # every group is trained on
    # kept_frac counts the groups with some right and some wrong answers, here rather than with
    # tc.informative_groups: a student's tokencredit.py trains GRPO before exercise 2
    mixed = batch["correct"].any(dim=1) & ~batch["correct"].all(dim=1)  # (B,)
    return batch, dict(kept_frac=int(mixed.sum()) / args.prompts_per_step,
                       groups=args.prompts_per_step, rounds=1)


def shaped_rewards(args: Args, tc, batch) -> torch.Tensor:
    """(B, G): the verdict's reward, plus DAPO's soft overlong penalty if asked for (it shapes the
    reward only: dynamic sampling read the verdicts)."""
    rewards = torch.where(batch["correct"], args.reward_correct, args.reward_wrong).float()
    if args.overlong_shaping:
        lengths = batch["mask"].sum(dim=-1).flatten()  # (N,)
        penalty = tc.overlong_penalty(lengths, args.max_new_tokens, args.overlong_cache)
        rewards = rewards + penalty.view(rewards.shape)
    return rewards


def score_conditions(model, tokenizer, args, problems, responses, mask) -> dict:
    """CSCR's log-probs under c+ and c-, and OPSD's teacher logits under c+ ({} if neither)."""
    if not (args.cscr_strength > 0 or args.distill_coef > 0):
        return {}
    (logp_pos, teacher_logits), (logp_neg, _) = tiny_task.score(
        model, tokenizer, problems, responses, mask, args.temperature,
        (args.cond_pos, args.cond_neg), need_logits=args.distill_coef > 0)
    return dict(logp_pos=logp_pos, logp_neg=logp_neg, teacher_logits=teacher_logits)


def token_credit(args: Args, tc, advantages, mask, entropy, old_logp, conds) -> torch.Tensor:
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


def update_loss(args: Args, tc, logp, logits, old_logp, token_adv, mask, ref_logp, conds):
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


def rollout_stats(batch: Dict[str, torch.Tensor], texts: List[str]) -> Dict[str, float]:
    """The update's rollouts: mean length, of right and of wrong answers; the fraction truncated
    (loops that hit the budget) and that finished after re-checking a step."""
    lengths = batch["mask"].sum(dim=-1).flatten().float()  # (N,)
    correct, complete = batch["correct"].flatten(), batch["complete"].flatten()
    right, wrong = lengths[correct], lengths[~correct]
    detour = torch.tensor([tiny_task.has_repeated_step(text) for text in texts])  # (N,)
    return dict(length=float(lengths.mean()),
                length_correct=float(right.mean()) if right.numel() else float("nan"),
                length_wrong=float(wrong.mean()) if wrong.numel() else float("nan"),
                truncated_frac=float((~complete).float().mean()),
                recheck_frac=float((detour & complete).float().mean()))


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


def train_step(step: int, args: Args, tc, model, ref_model, optimizer, tokenizer, sample_groups,
               device, measures: Measures = Measures()) -> dict:
    """One policy update with tokencredit module tc. Returns its log record."""
    timer = Timer(device)
    batch, record = collect_groups(args, tc, sample_groups)  # rollouts, verified
    record.update(step=step, t_generate=timer.lap())
    if record["groups"] == 0:  # dynamic sampling found nothing to learn from: no update
        return dict(record, t_score=0.0, t_update=0.0, skipped=1)
    G = args.group_size
    problems = [[x for x in row if x >= 0] for row in batch["terms"].tolist() for _ in range(G)]
    mask = batch["mask"].flatten(0, 1)  # (N, L_max); columns of padding only are cut:
    T = max(1, int(mask.sum(dim=1).max()))
    responses, mask = batch["responses"].flatten(0, 1)[:, :T].to(device), mask[:, :T].to(device)
    rewards = shaped_rewards(args, tc, batch)  # (B, G)
    advantages = tc.group_advantages(rewards, args.adv_scale, baseline=args.baseline)
    advantages = advantages.flatten().to(device)  # (N,) A_i
    with torch.no_grad():  # the privileged conditions (CSCR, OPSD) and the reference model
        conds = score_conditions(model, tokenizer, args, problems, responses, mask)
        ref_logp = (tiny_task.score(ref_model, tokenizer, problems, responses, mask,
                                    args.temperature)[0][0] if ref_model else None)
    record["t_score"] = timer.lap()
    micro_batches = args.micro_batches or (1 if timer.cuda else 4)  # GPU: fewer launches
    logp, logits = tiny_task.score_by_length(model, tokenizer, problems, responses, mask,
                                             args.temperature, micro_batches)
    old_logp = logp.detach()  # nothing has changed since the rollout: these are pi_old's
    entropy = tc.token_entropy(logits.detach())  # (N, T)
    token_adv = token_credit(args, tc, advantages, mask, entropy, old_logp, conds)  # (N,), (N, T)
    for epoch in range(args.update_epochs):
        if epoch > 0:
            logp, logits = tiny_task.score_by_length(model, tokenizer, problems, responses, mask,
                                                     args.temperature, micro_batches)
        loss, stats = update_loss(args, tc, logp, logits, old_logp, token_adv, mask, ref_logp,
                                  conds)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    record["t_update"] = timer.lap()
    texts = decode(tokenizer, batch["responses"].flatten(0, 1))  # (N,)
    return dict(record, reward=float(rewards.mean()),
                accuracy=float(batch["correct"].float().mean()),
                entropy=float(tc.aggregate(entropy, mask, "token")), loss=float(loss.detach()),
                **stats, **rollout_stats(batch, texts), **measures.rollouts(args, batch, texts))


# -----------------------------------------------------------------------------
# held-out evaluation, one method's run, and main

def evaluate(model, tokenizer, args: Args, problems, device,
             measures: Measures = Measures()) -> Dict[str, float]:
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
    meets = [tiny_task.meets_misconception(t, args) for t in problems]

    def mean(xs, where=None):  # over every problem, or where `meets` is `where`
        xs = [x for x, m in zip(xs, meets) if where is None or m == where]
        return sum(xs) / len(xs) if xs else float("nan")
    return dict(accuracy=mean(greedy), sampled_accuracy=mean(sampled), length=mean(lengths),
                accuracy_misconception=mean(greedy, True), accuracy_other=mean(greedy, False),
                sampled_accuracy_misconception=mean(sampled, True),
                **measures.evaluation(args, problems, greedy, sampled))


def progress(r: dict) -> str:
    """One update's log line: the rollouts, the policy's entropy, and where the seconds went."""
    if "entropy" not in r:
        return f"no informative group after {r['rounds']} rounds: update skipped"
    held_out = f" eval {r['eval_accuracy']:.3f}" if "eval_accuracy" in r else ""
    return (f"reward {r['reward']:+.2f} acc {r['accuracy']:.2f} len {r['length']:5.1f} "
            f"ent {r['entropy']:.3f} kept {r['kept_frac']:.2f}{held_out} | gen "
            f"{r['t_generate']:.2f}s score {r['t_score']:.2f}s update {r['t_update']:.2f}s")


def train_method(label: str, args: Args, seed: int, start_path: str, tokenizer, eval_problems,
                 device, log_file, measures: Measures = Measures()):
    """Policy updates from the warm-up weights. Returns (records, interrupted, the trained model).
    The model stays in eval mode: no dropout, so old and new log-probs agree on-policy."""
    from transformers import AutoModelForCausalLM
    tc = load_tokencredit(args)
    tiny_task.seed_everything(seed)
    model = AutoModelForCausalLM.from_pretrained(start_path).to(device).eval()
    ref_model = (AutoModelForCausalLM.from_pretrained(start_path).to(device).eval()
                 if args.beta > 0 else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sample_groups = sample_groups_fn(model, tokenizer, args, tiny_task.ProblemStream(args, seed),
                                     device)
    history = []
    try:
        for step in range(1, args.steps + 1):
            record = dict(method=label, seed=seed, **train_step(
                step, args, tc, model, ref_model, optimizer, tokenizer, sample_groups, device,
                measures))
            if step % args.eval_every == 0 or step == args.steps:
                held_out = evaluate(model, tokenizer, args, eval_problems, device, measures)
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


SUMMARY = (("greedy", "accuracy"), ("where the misconception applies", "accuracy_misconception"),
           ("sampled", "sampled_accuracy"))  # main's last lines: before -> after


def main(argv=None, measures: Measures = Measures()) -> dict:
    """Warm up (or reuse) the starting policy, train every method from it for every seed, print
    the held-out accuracy before and after. Writes runs/<name>/config.json (--config reruns it),
    metrics.jsonl (a record per update), results.json and each trained policy (METHOD-seedSEED/,
    save_pretrained), and returns the results."""
    base, runs, given = parse_args(argv)
    tiny_task.quiet_transformers()
    device = tiny_task.pick_device(base.device)
    print(tiny_task.describe_device(device, base.device))
    print(f"tokencredit: {os.path.abspath(load_tokencredit(base).__file__)}")  # ours, or --impl's
    out_dir = os.path.join("runs", base.name)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:  # --config reruns it
        json.dump({**{k: v for k, v in dataclasses.asdict(base).items() if k not in PRESET_KEYS},
                   **{k: v for k, v in given.items() if k in PRESET_KEYS}}, f, indent=1)
    model, tokenizer, start_path = tiny_task.load_or_warm_up(base, device, "runs")
    eval_problems = held_out_problems(base)
    start = evaluate(model, tokenizer, base, eval_problems, device, measures)
    print(f"starting policy: held-out accuracy {start['accuracy']:.3f} greedy "
          f"({start['accuracy_misconception']:.3f} where the misconception applies, "
          f"{start['accuracy_other']:.3f} elsewhere), {start['sampled_accuracy']:.3f} sampled "
          f"({start['sampled_accuracy_misconception']:.3f} where the misconception applies), "
          f"mean length {start['length']:.1f} tokens ({base.eval_size} problems)")
    results = dict(config=dataclasses.asdict(base), device=str(device), start=start,
                   warmup_path=start_path, runs=[], interrupted=False,
                   methods={label: dataclasses.asdict(args) for label, args in runs})
    seeds, begin = tiny_task.parse_list(base.seeds, int, "--seeds"), time.time()
    with open(os.path.join(out_dir, "metrics.jsonl"), "w") as log_file:
        for seed, (label, args) in itertools.product(seeds, runs):
            run_start = time.time()
            history, interrupted, model = train_method(label, args, seed, start_path, tokenizer,
                                                       eval_problems, device, log_file, measures)
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
            f"{what} {start[key]:.3f} -> {run['final'][key]:.3f}" for what, key in SUMMARY))
    print(f"wrote {out_dir}/config.json, metrics.jsonl, results.json and the trained policies "
          f"(METHOD-seedSEED/) (training took {results['wall_s']:.0f} s)")
    return results


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:  # bad arguments: one clear line, no traceback
        sys.exit(f"train_tiny.py: error: {error}")
    except NotImplementedError as missing:  # course mode: an exercise the method needs
        sys.exit(f"train_tiny.py: your tokencredit.py has not implemented {missing}, which "
                 f"--methods needs")
