"""train_tiny.py: GRPO, Dr. GRPO, DAPO, GSPO, CSCR, the entropy mask and OPSD on a task RL can fix.

A GPT-2-style model of 0.6 M parameters, built in code, adds 2 to 5 one-digit numbers by writing
running partial sums. Every equation comes from tokencredit.py; this file samples, verifies and
updates, top to bottom; lab.py measures and draws.

    prompt    "6+9+8="                    one character per token
    response  "6+9=15,15+8=23>23<eos>"    the verifier reads the number after the single ">" of a
                                          response that ended with <eos>; anything else is wrong
The starting policy imitates a demonstrator with habits that RL can fix: it forgets the carry when
adding 9 (15+9=14) 60% of the time, so greedy decoding starts out wrong there; 8% of other steps
slip by 1 or 2; 25% of its answers re-check a step (right, ~8 tokens longer); 12% loop on a step
until the 48-token budget (truncated, wrong). A quarter of the warm-up's demonstrations carry the
verdict before the prompt, "Y" (correct) or "N" (wrong): the conditions CSCR and OPSD score under.

    python train_tiny.py              # warm-up, then five methods: about 5 min on 2 CPU cores
    python train_tiny.py --quick      # a smaller task, about 35 s, for a first look
"""

import argparse
import dataclasses
import hashlib
import inspect
import itertools
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

import tokencredit as tc

# -----------------------------------------------------------------------------
# arguments and presets

PRESETS: Dict[str, Dict[str, object]] = {
    # GRPO [arXiv 2402.03300]: std-normalised advantages, mean over each response then over responses
    "grpo": dict(adv_scale="std", loss_mode="sample", eps_low=0.2, eps_high=0.2),
    # Dr. GRPO [arXiv 2503.20783]: no std, a constant denominator (the generation budget)
    "drgrpo": dict(adv_scale="none", loss_mode="constant", eps_low=0.2, eps_high=0.2),
    # DAPO [arXiv 2503.14476]: batch token mean, Clip-Higher, dynamic sampling, soft overlong, +-1 rewards
    "dapo": dict(adv_scale="std", loss_mode="token", eps_low=0.2, eps_high=0.28, dynamic_sampling=True,
                 overlong_shaping=True, reward_wrong=-1.0),
    # CSCR [arXiv 2607.27888]: GRPO with sensitive tokens downweighted (our reading; moderate strength)
    "cscr": dict(adv_scale="std", loss_mode="sample", eps_low=0.2, eps_high=0.2, cscr_strength="1.0"),
    # OPSD, the CSCR paper's baseline: distil from the model told "this answer is correct", no reward
    "opsd": dict(loss_mode="token", pg_coef=0.0, distill_coef=1.0),
    # GSPO [arXiv 2507.18071]: one length-normalised ratio per response, clipped per response (its clip range)
    "gspo": dict(adv_scale="std", loss_mode="sample", ratio_level="sequence", eps_low=3e-4, eps_high=4e-4),
    # the 80/20 rule [arXiv 2506.01939]: GRPO's gradient on the top 20 % of a batch's tokens by entropy only
    "entropy80": dict(adv_scale="std", loss_mode="sample", eps_low=0.2, eps_high=0.2, entropy_top=0.2),
}


@dataclass
class Args:
    # --- what to run
    methods: str = "grpo,drgrpo,dapo,cscr,opsd"  # comma-separated presets to compare (see the list below)
    seeds: str = "0"  # comma-separated seeds; each seed runs every method (the table reports mean and std)
    name: str = "default"  # results go to runs/<name>/
    device: str = "auto"  # auto (CUDA if present, else MPS, else CPU), cpu, cuda or mps
    quick: bool = False  # a first look in under a minute: 2-3 numbers up to 5, budget 32, shorter warm-up, fewer steps
    # --- the task
    min_terms: int = 2  # fewest numbers in a problem
    max_terms: int = 5  # most numbers in a problem
    max_value: int = 9  # numbers are drawn from 0..max_value
    # --- the demonstrator the warm-up imitates: the starting policy's habits, which RL can fix
    misconception: str = "9"  # addends whose carry the demonstrator forgets (15+9=14), comma-separated; empty for none
    misconception_rate: float = 0.6  # how often it forgets that carry: above 0.5, so greedy decoding starts out wrong
    slip_rate: float = 0.08  # chance that any other step of a demonstration is off by 1 or 2
    recheck_rate: float = 0.25  # chance a demonstration writes one step twice: a harmless detour of about 8 tokens
    loop_rate: float = 0.12  # chance that a demonstration repeats one step until the budget: truncated, so wrong
    eval_size: int = 200  # held-out problems, scored with greedy decoding
    eval_every: int = 20  # policy updates between held-out evaluations
    eval_samples: int = 4  # samples per held-out problem for the sampled accuracy, at the rollout temperature
    # --- the tiny model and its warm-up
    cond_pos: str = "Y"  # text put before the prompt to assert 'this answer is correct' (CSCR's c+, OPSD's teacher)
    cond_neg: str = "N"  # text put before the prompt to assert 'this answer is incorrect' (CSCR's c-)
    n_layer: int = 3  # transformer blocks of the tiny model
    n_embd: int = 128  # width of the tiny model
    n_head: int = 4  # attention heads of the tiny model
    warmup_steps: int = 800  # supervised steps imitating the demonstrator (0 to skip)
    warmup_batch: int = 64  # sequences per supervised step
    warmup_lr: float = 2e-3  # learning rate of the warm-up
    warmup_seed: int = 1234  # seed of the warm-up, shared by every method and RL seed; the lab's fixed streams too
    # --- rollouts and updates
    steps: int = 60  # policy updates per method
    prompts_per_step: int = 16  # B: prompts (groups) per policy update
    group_size: int = 8  # G: responses sampled per prompt
    max_new_tokens: int = 48  # generation budget L_max; longer responses are truncated (and wrong)
    temperature: float = 1.0  # sampling temperature of the rollouts
    lr: float = 1e-4  # learning rate of the policy updates (AdamW)
    update_epochs: int = 2  # passes over each rollout batch; the second one sees ratios away from 1, so the clip acts
    micro_batches: int = 0  # the update's forward on groups of rows of similar length; 0: 4 on a CPU, 1 on a GPU
    log_every: int = 5  # policy updates between progress lines
    one_step_lr: float = 0.01  # learning rate of lab.py's single plain-SGD step that shows what each weighting does
    # --- the method (set by the presets; any of them can be given to override)
    adv_scale: str = "std"  # group advantage: divide by the group's std (GRPO), the batch's, or none (Dr. GRPO)
    baseline: str = "mean"  # group advantage: subtract the group's mean (GRPO) or the others' (leave_one_out, RLOO)
    loss_mode: str = "sample"  # token weights: sample, token, group_token or constant
    surrogate: str = "clip"  # per-token loss: clip (PPO-clip) or reinforce (-A log pi, no ratio)
    ratio_level: str = "token"  # importance ratio: token (PPO, GRPO), sequence (GSPO) or sequence_token
    eps_low: float = 0.2  # lower clip range: rho >= 1 - eps_low
    eps_high: float = 0.2  # upper clip range: rho <= 1 + eps_high (DAPO's Clip-Higher uses 0.28)
    reward_correct: float = 1.0  # reward of a verified answer
    reward_wrong: float = 0.0  # reward of a wrong, malformed or truncated answer (DAPO uses -1)
    dynamic_sampling: bool = False  # DAPO: resample until the batch holds prompts_per_step informative groups
    max_sampling_rounds: int = 3  # dynamic sampling gives up after this many rounds and trains on what it has
    overlong_shaping: bool = False  # DAPO: add the soft overlong penalty to the reward
    overlong_cache: int = 6  # L_cache: the soft overlong zone is (L_max - L_cache, L_max], (42, 48] by default
    beta: float = 0.0  # weight of the k3 KL to the warm-up model (GRPO's paper used 0.04)
    cscr_strength: str = "0"  # CSCR alpha; several comma-separated values run the strength ablation
    cscr_threshold: float = 0.0  # CSCR tau: sensitivity below it is not downweighted
    entropy_top: float = 1.0  # policy gradient only on this top fraction of a batch's tokens by entropy (1: all)
    pg_coef: float = 1.0  # weight of the policy-gradient loss
    distill_coef: float = 0.0  # weight of the self-distillation (OPSD) loss


QUICK = dict(name="quick", max_terms=3, max_value=5, misconception="5", max_new_tokens=32, warmup_steps=150,
             steps=12, prompts_per_step=8, eval_size=100, eval_every=6, log_every=6)
PRESET_KEYS = sorted({key for preset in PRESETS.values() for key in preset})
HELD_OUT_STREAM = 10 ** 6  # the held-out problems' seed is warmup_seed + this; lab.py's fixed streams use 1 to 4


def parse_args(argv: Optional[List[str]] = None):
    """Returns (base Args, runs, seeds): runs is one (label, Args, CSCR strength) per trained method."""
    docs = dict(re.findall(r"\n    (\w+): \w+ = .*?  # (.*)", inspect.getsource(Args)))  # each field's comment
    presets = "\n".join(f"  {name:<9s} " + ", ".join(f"{k}={v}" for k, v in preset.items())
                        for name, preset in PRESETS.items())
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"presets (a method's arguments; any argument given here overrides them for every method):\n"
               f"{presets}\n--quick sets: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    for f in dataclasses.fields(Args):
        flag, doc = "--" + f.name.replace("_", "-"), f"{docs[f.name]} (default: {f.default})"
        if f.type is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=doc)
        else:
            parser.add_argument(flag, type=f.type, default=argparse.SUPPRESS, metavar=f.name.upper(), help=doc)
    given = vars(parser.parse_args(argv))
    base = dataclasses.replace(Args(), **(QUICK if given.get("quick") else {}))
    base = dataclasses.replace(base, **{k: v for k, v in given.items() if k not in PRESET_KEYS})
    overrides = {k: v for k, v in given.items() if k in PRESET_KEYS}
    validate_args(base)
    runs = []
    for method in base.methods.split(","):
        if method not in PRESETS:
            raise ValueError(f"--methods: unknown method {method!r}; expected a comma-separated list from "
                             f"{sorted(PRESETS)}")
        args = dataclasses.replace(base, **{**PRESETS[method], **overrides})  # defaults, preset, what the user gave
        strengths = parse_list(args.cscr_strength, float, "--cscr-strength")
        labels = [method] if len(strengths) == 1 else [f"{method}@{s:g}" for s in strengths]  # the ablation
        for label, strength in zip(labels, strengths):
            runs.append((label, dataclasses.replace(args, cscr_strength=str(strength)), strength))
            check_method(runs[-1][1], strength)
    return base, runs, parse_list(base.seeds, int, "--seeds")


def validate_args(a: Args) -> None:
    """The lab's own arguments; the method's are checked by tokencredit itself (check_method)."""
    def require(ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(message)

    require(a.group_size >= 2, f"--group-size must be >= 2 (a group compares two or more), got {a.group_size}")
    for name in ("steps", "warmup_steps", "micro_batches"):
        require(getattr(a, name) >= 0, f"--{name.replace('_', '-')} must be >= 0, got {getattr(a, name)}")
    for name in ("prompts_per_step", "max_new_tokens", "eval_size", "eval_every", "log_every", "update_epochs",
                 "warmup_batch", "max_sampling_rounds", "eval_samples"):
        require(getattr(a, name) >= 1, f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    for name in ("warmup_lr", "one_step_lr", "lr", "temperature"):
        require(getattr(a, name) > 0, f"--{name.replace('_', '-')} must be > 0, got {getattr(a, name)}")
    require(1 <= a.min_terms <= a.max_terms and a.max_value >= 1, f"--min-terms, --max-terms and --max-value must "
            f"satisfy 1 <= min <= max and 1 <= max-value, got {a.min_terms}, {a.max_terms} and {a.max_value}")
    require(a.device in ("auto", "cpu", "cuda", "mps"), f"--device must be auto, cpu, cuda or mps, got {a.device!r}")
    require(bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", a.name)),
            f"--name must be a plain folder name under runs/ (letters, digits, . _ -), got {a.name!r}")
    require(a.cond_pos != a.cond_neg and set(a.cond_pos + a.cond_neg) <= set("0123456789+=,>YN"), f"--cond-pos and "
            f"--cond-neg must differ and use the tokenizer's characters 0-9+=,>YN, got {a.cond_pos!r}, {a.cond_neg!r}")
    longest_prompt = max(len(a.cond_pos), len(a.cond_neg)) + a.max_terms * (len(str(a.max_value)) + 1)  # a token a char
    require(longest_prompt + a.max_new_tokens + 1 <= 128, f"--max-new-tokens {a.max_new_tokens} leaves no room for a "
            f"prompt of up to {longest_prompt} tokens in the tiny model's 128 positions")
    for name in ("misconception_rate", "slip_rate", "recheck_rate", "loop_rate"):
        require(0 <= getattr(a, name) <= 1, f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(a, name)}")
    require(a.recheck_rate + a.loop_rate <= 1, f"--recheck-rate + --loop-rate must be <= 1, got {a.recheck_rate} + "
            f"{a.loop_rate}")
    require(all(0 <= d <= a.max_value for d in forgotten_addends(a)),
            f"--misconception must list addends in 0..max_value = {a.max_value}, got {a.misconception!r}")
    parse_list(a.seeds, int, "--seeds")


def check_method(a: Args, strength: float) -> None:
    """Let tokencredit check a method's arguments on a dummy batch now, rather than after the warm-up."""
    if not (a.pg_coef >= 0 and a.distill_coef >= 0 and a.pg_coef + a.distill_coef > 0):
        raise ValueError(f"--pg-coef and --distill-coef must be >= 0 and not both 0, got {a.pg_coef} and "
                         f"{a.distill_coef}")
    ones = torch.ones(a.group_size, 1)  # one group of one-token responses
    tc.group_advantages(torch.tensor([[a.reward_correct, a.reward_wrong]]), scale=a.adv_scale, baseline=a.baseline)
    tc.policy_loss(ones, ones, ones[:, 0], ones, mode=a.loss_mode, eps_low=a.eps_low, eps_high=a.eps_high,
                   group_size=a.group_size, max_len=a.max_new_tokens, ref_logp=ones, beta=a.beta,
                   surrogate=a.surrogate, ratio_level=a.ratio_level)
    tc.cscr_weights(ones, ones, strength, a.cscr_threshold)
    tc.high_entropy_mask(ones, ones, a.entropy_top)
    if a.overlong_shaping:
        tc.overlong_penalty(ones[:, 0], a.max_new_tokens, a.overlong_cache)


def parse_list(text: str, kind, flag: str) -> list:
    try:
        values = [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be a comma-separated list of {kind.__name__}, got {text!r}") from None
    if not values:
        raise ValueError(f"{flag} must name at least one value, got {text!r}")
    return values


def pick_device(requested: str) -> torch.device:
    """auto: CUDA if present, else Apple's MPS, else the CPU."""
    available = dict(cuda=torch.cuda.is_available(), mps=torch.backends.mps.is_available(), cpu=True)
    if requested == "auto":
        requested = next(name for name, ok in available.items() if ok)
    if not available[requested]:
        raise ValueError(f"--device {requested} was asked for, but torch {torch.__version__} finds no "
                         f"{requested.upper()} device here; use --device cpu or auto")
    return torch.device(requested)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA when present


# -----------------------------------------------------------------------------
# the task: problems, the demonstrator's solutions and the exact verifier

def render_problem(terms: List[int]) -> str:
    return "+".join(str(x) for x in terms) + "="


def forgotten_addends(args: Args) -> set:
    """The addends whose carry the demonstrator forgets, from --misconception ("9" -> {9})."""
    return set(parse_list(args.misconception, int, "--misconception")) if args.misconception else set()


def forgets_carry(total: int, x: int, forgotten: set) -> bool:
    """Does the step total + x meet the misconception: a forgotten addend, and a carry to forget?"""
    return x in forgotten and total % 10 + x >= 10


def demonstrate(terms: List[int], args: Args, rng: random.Random) -> tuple:
    """One solution with the demonstrator's habits (see the top). Returns (text, finished): a loop never finishes."""
    forgotten, steps, total = forgotten_addends(args), [], terms[0]
    for x in terms[1:]:  # the running partial sums "a+b=c", a slip carried forward
        slip = 0
        if forgets_carry(total, x, forgotten) and rng.random() < args.misconception_rate:
            slip = -10
        elif rng.random() < args.slip_rate:
            slip = rng.choice([-2, -1, 1, 2])
        steps.append(f"{total}+{x}={max(0, total + x + slip)}")
        total = max(0, total + x + slip)
    if not steps:
        return f">{terms[0]}", True
    detour, k = rng.random(), rng.randrange(len(steps))
    if detour < args.loop_rate:
        text = ",".join(steps[:k + 1])
        while len(text) < args.max_new_tokens:
            text += "," + steps[k]
        return text[:args.max_new_tokens], False
    if detour < args.loop_rate + args.recheck_rate:
        steps.insert(k + 1, steps[k])
    return ",".join(steps) + f">{total}", True


ANSWER = re.compile(r"[^>]*>(\d{1,9})")


def verify(terms: List[int], response: str, complete: bool) -> bool:
    """True only for a finished response whose single '>' is followed by exactly the right number."""
    if not complete:
        return False  # truncated: the model never said it was done
    match = ANSWER.fullmatch(response.strip())
    return bool(match) and int(match.group(1)) == sum(terms)


def verify_all(problems: List[List[int]], texts: List[str], complete: torch.Tensor) -> torch.Tensor:
    """verify() for each (problem, response, finished) row: (n,) bool."""
    return torch.tensor([verify(t, s, bool(c)) for t, s, c in zip(problems, texts, complete.tolist())],
                        dtype=torch.bool)


def has_repeated_step(text: str) -> bool:
    """A detour: some step "a+b=c" written twice in a row (a re-check, or a loop)."""
    steps = text.split(">")[0].split(",")
    return any(a == b for a, b in zip(steps, steps[1:]))


class ProblemStream:
    """Seeded problems: every method sees the same sequence for one seed."""

    def __init__(self, args: Args, seed: int):
        self.rng, self.args = random.Random(seed), args

    def next(self, n: int) -> List[List[int]]:
        a = self.args
        return [[self.rng.randint(0, a.max_value) for _ in range(self.rng.randint(a.min_terms, a.max_terms))]
                for _ in range(n)]


# -----------------------------------------------------------------------------
# the tiny model, its character tokenizer (built in code) and the supervised warm-up

def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>"] + list("0123456789+=,>YN"))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")


def build_tiny_model(args: Args, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=args.n_embd, n_layer=args.n_layer,
                        n_head=args.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    return GPT2LMHeadModel(config)


def warmup_batch(args: Args, tokenizer, rng: random.Random, device):
    """Demonstrations to imitate, loss on the response only. A quarter of them carry the verdict
    before the prompt ("Y" if right, "N" if wrong), so that the model learns what the tags mean."""
    stream = ProblemStream(args, rng.randrange(2 ** 31))
    texts, prompt_lens = [], []
    for terms in stream.next(args.warmup_batch):
        text, finished = demonstrate(terms, args, rng)
        cond = (args.cond_pos if verify(terms, text, finished) else args.cond_neg) if rng.random() < 0.25 else ""
        prompt = cond + render_problem(terms)
        texts.append(prompt + text + (tokenizer.eos_token if finished else ""))
        prompt_lens.append(len(tokenizer(prompt)["input_ids"]))
    batch = tokenizer(texts, padding=True, padding_side="right", return_tensors="pt")
    ids, attention = batch["input_ids"].to(device), batch["attention_mask"].to(device)  # (n, L)
    labels = ids.masked_fill(attention == 0, -100)
    positions = torch.arange(ids.shape[1], device=device)[None, :]
    labels = labels.masked_fill(positions < torch.tensor(prompt_lens, device=device)[:, None], -100)
    return ids, attention, labels


WARMUP_FIELDS = ("n_layer", "n_embd", "n_head", "warmup_steps", "warmup_batch", "warmup_lr", "warmup_seed", "min_terms",
                 "max_terms", "max_value", "cond_pos", "cond_neg", "misconception", "misconception_rate", "slip_rate",
                 "recheck_rate", "loop_rate", "max_new_tokens")


def warmup_key(args: Args) -> str:
    """Names the cached warm-up by every argument it depends on."""
    fields = {name: getattr(args, name) for name in WARMUP_FIELDS}
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def load_or_warm_up(args: Args, device, runs_dir: str):
    """The starting policy: the tiny model after a supervised warm-up, cached in runs_dir. Returns
    (model, tokenizer, the checkpoint's path)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = os.path.join(runs_dir, f"warmup-{warmup_key(args)}")
    if os.path.exists(os.path.join(path, "config.json")):
        print(f"warm-up: reusing {path}")
        return AutoModelForCausalLM.from_pretrained(path).to(device).eval(), AutoTokenizer.from_pretrained(path), path
    tokenizer = build_tokenizer()
    seed_everything(args.warmup_seed)
    model = build_tiny_model(args, tokenizer).to(device)
    print(f"warm-up: {args.warmup_steps} supervised steps on a "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M-parameter model")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.warmup_lr, weight_decay=0.0)
    rng = random.Random(args.warmup_seed)
    start = time.time()
    for step in range(args.warmup_steps):
        lr = args.warmup_lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / args.warmup_steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        ids, attention, labels = warmup_batch(args, tokenizer, rng, device)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % max(1, args.warmup_steps // 5) == 0:
            print(f"  warm-up step {step + 1:4d}/{args.warmup_steps} loss {loss.item():.3f} "
                  f"({time.time() - start:.0f} s)")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    print(f"warm-up: saved to {path}")
    return model.eval(), tokenizer, path


# -----------------------------------------------------------------------------
# rollouts: sampling with a KV cache, and scoring the sampled tokens

def prompt_texts(args: Args, problems: List[List[int]], cond: str = "") -> List[str]:
    return [cond + render_problem(t) for t in problems]


def tokenize_prompts(tokenizer, texts: List[str], device):
    batch = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")  # generation goes on at the right
    return batch["input_ids"].to(device), batch["attention_mask"].to(device)  # (n, P)


def response_mask(responses: torch.Tensor, eos_id: int):
    """Real tokens run up to and including the first <eos>. Returns (mask (n, T), complete (n,))."""
    is_eos = responses == eos_id  # (n, T)
    before_or_at_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) == 0  # (n, T)
    return before_or_at_eos, is_eos.any(dim=1)


def mask_positions(attention: torch.Tensor) -> torch.Tensor:
    """Position ids numbered from the attention mask (n, L): left padding shifts no real token."""
    return (attention.cumsum(dim=1) - 1).clamp(min=0)


@torch.no_grad()
def sample_tokens(model, ids, attention, max_new_tokens: int, greedy: bool, temperature: float, eos_id: int):
    """Sampling with the model's KV cache: softmax(logits / temperature), no top-k or top-p, as
    model.generate() samples, with less work per token; it stops once every row has written <eos>.
    ids, attention (n, P): left-padded prompts. Returns (tokens (n, T <= max_new_tokens), the logits that
    produced them (n, T, V)); tokens after a row's <eos> are arbitrary."""
    positions = mask_positions(attention)  # (n, P)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
    next_position = positions[:, -1:] + 1  # (n, 1)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    tokens, all_logits = [], []
    for _ in range(max_new_tokens):
        logits = out.logits[:, -1].float()  # (n, V)
        if greedy:
            token = logits.argmax(dim=-1)  # (n,)
        else:
            token = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1).squeeze(1)  # (n,)
        tokens.append(token)
        all_logits.append(logits)
        finished |= token == eos_id
        if finished.all() or len(tokens) == max_new_tokens:
            break
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)  # (n, P + t)
        out = model(input_ids=token[:, None], attention_mask=attention, position_ids=next_position,
                    cache=out.cache, use_cache=True)
        next_position = next_position + 1
    return torch.stack(tokens, dim=1), torch.stack(all_logits, dim=1)  # (n, T), (n, T, V)


def generate(model, tokenizer, args: Args, problems: List[List[int]], repeats: int, greedy: bool, device):
    """Sample `repeats` responses per problem. Returns responses (n, T), mask (n, T), texts, complete (n,);
    T is the longest response of this call, padded with <pad> after each row's <eos>."""
    ids, attention = tokenize_prompts(tokenizer, prompt_texts(args, problems), device)
    ids, attention = ids.repeat_interleave(repeats, 0), attention.repeat_interleave(repeats, 0)
    responses, _ = sample_tokens(model, ids, attention, args.max_new_tokens, greedy, args.temperature,
                                 tokenizer.eos_token_id)
    mask, complete = response_mask(responses, tokenizer.eos_token_id)
    responses = responses.masked_fill(~mask, tokenizer.pad_token_id)
    body = responses.masked_fill(responses == tokenizer.eos_token_id, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(body.tolist(), skip_special_tokens=True)
    return responses, mask, texts, complete


def score(model, tokenizer, args, problems, responses, mask, conds=("",), need_logits=False):
    """log pi(o_t | cond, q, o_<t) of the responses (n, T) under each condition, in one batched forward, at
    the sampling temperature and with positions numbered from the attention mask, as sample_tokens draws.
    Returns one (logp (n, T), logits (n, T, V) or None) per condition."""
    n, T = responses.shape
    texts = [text for cond in conds for text in prompt_texts(args, problems, cond)]
    prompt_ids, prompt_attention = tokenize_prompts(tokenizer, texts, responses.device)  # (k n, P)
    P, k = prompt_ids.shape[1], len(conds)
    ids = torch.cat([prompt_ids, responses.repeat(k, 1)], dim=1)  # (k n, P + T)
    attention = torch.cat([prompt_attention, mask.repeat(k, 1).long()], dim=1)
    positions = mask_positions(attention)  # as sample_tokens numbers them
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    logits = logits[:, P - 1:P + T - 1] / args.temperature  # (k n, T, V): what each token was drawn from
    logp = tc.token_logprobs(logits, responses.repeat(k, 1))  # (k n, T)
    return [(logp[i * n:(i + 1) * n], logits[i * n:(i + 1) * n] if need_logits else None) for i in range(k)]


def score_by_length(model, tokenizer, args, problems, responses, mask, micro_batches: int):
    """score() with logits, on micro-batches of rows of similar length, each cut to its longest response:
    the same log-probs with less work on padding (a 48-token loop no longer makes every 8-token answer pay
    for 48 positions). Returns (logp (n, T), logits (n, T, V))."""
    n, T = responses.shape
    lengths = mask.sum(dim=1)  # (n,)
    order = lengths.argsort()  # rows from the shortest response to the longest
    parts_logp, parts_logits = [], []
    for rows in order.chunk(micro_batches):
        width = max(1, int(lengths[rows].max()))
        (logp, logits), = score(model, tokenizer, args, [problems[i] for i in rows.tolist()],
                                responses[rows, :width], mask[rows, :width], need_logits=True)
        parts_logp.append(torch.nn.functional.pad(logp, (0, T - width)))  # (rows, T)
        parts_logits.append(torch.nn.functional.pad(logits, (0, 0, 0, T - width)))  # (rows, T, V)
    inverse = order.argsort()  # back to the batch's order
    return torch.cat(parts_logp)[inverse], torch.cat(parts_logits)[inverse]


def sample_groups_fn(model, tokenizer, args: Args, stream: ProblemStream, device):
    """One round of rollouts for fill_batch: B prompts x G responses, verified, with their rewards.
    Responses are padded to the budget max_new_tokens, so that dynamic sampling's rounds stack."""
    def sample_groups() -> Dict[str, torch.Tensor]:
        problems = stream.next(args.prompts_per_step)
        responses, mask, texts, complete = generate(model, tokenizer, args, problems, args.group_size, False, device)
        pad = args.max_new_tokens - responses.shape[1]
        responses = torch.nn.functional.pad(responses, (0, pad), value=tokenizer.pad_token_id)  # (N, L_max)
        mask = torch.nn.functional.pad(mask, (0, pad), value=False)  # (N, L_max)
        correct = verify_all([t for t in problems for _ in range(args.group_size)], texts, complete)  # (N,)
        rewards = torch.where(correct, args.reward_correct, args.reward_wrong).float()  # (N,)
        if args.overlong_shaping:  # shapes the reward only: dynamic sampling still filters on `correct`
            rewards = rewards + tc.overlong_penalty(mask.sum(dim=1).cpu(), args.max_new_tokens, args.overlong_cache)
        B, G = len(problems), args.group_size
        return dict(rewards=rewards.view(B, G), correct=correct.view(B, G), complete=complete.cpu().view(B, G),
                    detour=torch.tensor([has_repeated_step(s) for s in texts]).view(B, G),
                    terms=torch.tensor([t + [-1] * (args.max_terms - len(t)) for t in problems]),  # -1 pads
                    responses=responses.cpu().view(B, G, -1), mask=mask.cpu().view(B, G, -1))
    return sample_groups


# -----------------------------------------------------------------------------
# one policy update: rollouts -> advantages -> (CSCR weights) -> clipped updates

def train_step(step: int, args: Args, strength: float, model, ref_model, optimizer, tokenizer, sample_groups,
               device) -> dict:
    """Rollout (with dynamic sampling if asked), advantages, per-token credit, update_epochs updates.
    Returns the step's log record."""
    cuda = torch.device(device).type == "cuda"

    def clock() -> float:  # seconds, once the GPU has finished what was queued (it runs asynchronously)
        if cuda:
            torch.cuda.synchronize()
        return time.time()

    t0 = clock()
    if args.dynamic_sampling:  # DAPO keeps groups with 0 < #correct < G: it filters on the verifier, not the reward
        batch, fill = tc.fill_batch(sample_groups, args.prompts_per_step, args.max_sampling_rounds,
                                    filter_key="correct")
    else:
        batch = sample_groups()
        fill = dict(rounds=1, groups_seen=args.prompts_per_step,
                    groups_informative=int(tc.informative_groups(batch["correct"]).sum()))
    B, G = batch["rewards"].shape[0], args.group_size
    record = dict(step=step, kept_frac=fill["groups_informative"] / fill["groups_seen"], groups=B,
                  rounds=fill["rounds"], t_generate=clock() - t0)
    if B == 0:  # dynamic sampling found nothing to learn from: skip the update, keep the log honest
        return dict(record, t_score=0.0, t_update=0.0, skipped=1)
    problems = [[int(x) for x in row if x >= 0] for row in batch["terms"].tolist() for _ in range(G)]
    mask = batch["mask"].view(B * G, -1)  # (N, L_max)
    T = max(1, int(mask.sum(dim=1).max()))  # columns that are padding in every row do no work
    responses = batch["responses"].view(B * G, -1)[:, :T].to(device)  # (N, T)
    mask = mask[:, :T].to(device)  # (N, T)
    advantages = tc.group_advantages(batch["rewards"], args.adv_scale, baseline=args.baseline).flatten().to(device)

    t1 = clock()
    with torch.no_grad():  # the privileged conditions (CSCR, OPSD) and the reference model, never trained
        if strength > 0 or args.distill_coef > 0:
            (logp_pos, teacher_logits), (logp_neg, _) = score(model, tokenizer, args, problems, responses, mask,
                                                              (args.cond_pos, args.cond_neg),
                                                              need_logits=args.distill_coef > 0)
        ref_logp = score(ref_model, tokenizer, args, problems, responses, mask)[0][0] if ref_model else None
    t_score = clock() - t1

    t2 = clock()
    micro_batches = args.micro_batches or (1 if cuda else 4)  # on a GPU, fewer launches beat less padding
    for epoch in range(args.update_epochs):
        logp, logits = score_by_length(model, tokenizer, args, problems, responses, mask, micro_batches)
        if epoch == 0:  # nothing has changed since the rollout: this forward's log-probs are pi_old's
            old_logp = logp.detach()
            token_entropy = tc.token_entropy(logits.detach())  # (N, T)
            entropy = float(tc.aggregate(token_entropy, mask, "token"))
            weights = None  # which tokens carry the credit: all alike, unless CSCR or the entropy mask says
            if strength > 0:  # CSCR: less credit where the privileged conditions shift a token most
                d_pos, d_neg = tc.counterfactual_shifts(old_logp, logp_pos, logp_neg, mask)
                weights = tc.cscr_weights(tc.counterfactual_sensitivity(d_pos, d_neg), mask, strength,
                                          args.cscr_threshold)
            if args.entropy_top < 1:  # the 80/20 rule: credit only on the batch's highest-entropy tokens
                keep = tc.high_entropy_mask(token_entropy, mask, args.entropy_top)
                weights = keep if weights is None else weights * keep
            token_adv = advantages if weights is None else tc.token_advantages(advantages, weights)  # (N,) or (N, T)
        loss, stats = torch.zeros((), device=device), {}
        if args.pg_coef > 0:
            pg_loss, stats = tc.policy_loss(logp, old_logp, token_adv, mask, mode=args.loss_mode,
                                            eps_low=args.eps_low, eps_high=args.eps_high, group_size=G,
                                            max_len=args.max_new_tokens, ref_logp=ref_logp, beta=args.beta,
                                            surrogate=args.surrogate, ratio_level=args.ratio_level)
            loss = loss + args.pg_coef * pg_loss
        if args.distill_coef > 0:
            distill = tc.self_distillation_loss(logits, teacher_logits, mask, mode=args.loss_mode, group_size=G,
                                                max_len=args.max_new_tokens)
            loss = loss + args.distill_coef * distill
            stats["distill_loss"] = float(distill.detach())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    t_update = clock() - t2

    import lab
    return dict(record, reward=float(batch["rewards"].mean()), accuracy=float(batch["correct"].float().mean()),
                entropy=entropy, loss=float(loss.detach()), t_score=t_score, t_update=t_update, **stats,
                **lab.rollout_stats(batch, mask))  # lengths of right and wrong answers, loops, re-checks


# -----------------------------------------------------------------------------
# one method's run, and main

def train_method(label: str, args: Args, strength: float, seed: int, start_path: str, tokenizer, eval_problems,
                 device, log_file):
    """Policy updates from the warm-up weights. Returns (per-step records, interrupted). The model stays
    in eval mode: no dropout, so old and new log-probs agree on-policy."""
    from transformers import AutoModelForCausalLM
    import lab
    seed_everything(seed)
    model = AutoModelForCausalLM.from_pretrained(start_path).to(device).eval()
    ref_model = AutoModelForCausalLM.from_pretrained(start_path).to(device).eval() if args.beta > 0 else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sample_groups = sample_groups_fn(model, tokenizer, args, ProblemStream(args, seed), device)
    history = []
    try:
        for step in range(1, args.steps + 1):
            record = dict(method=label, seed=seed, **train_step(step, args, strength, model, ref_model, optimizer,
                                                                tokenizer, sample_groups, device))
            if step % args.eval_every == 0 or step == args.steps:  # held-out accuracy: lab.evaluate
                record.update({f"eval_{k}": v for k, v in lab.evaluate(model, tokenizer, args, eval_problems,
                                                                        device).items()})
            history.append(record)
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            if step % args.log_every == 0 or step == 1 or step == args.steps:
                print(f"[{label:>9s} seed {seed}] step {step:3d}/{args.steps} " + lab.progress(record), flush=True)
    except KeyboardInterrupt:  # Ctrl-C: stop here, and still write the summary of what ran
        print(f"\n[{label}] interrupted after {len(history)} steps; summarising what ran", flush=True)
        return history, True
    return history, False


def main(argv: Optional[List[str]] = None) -> dict:
    base, runs, seeds = parse_args(argv)
    sys.modules.setdefault("train_tiny", sys.modules[__name__])  # lab.py's `import train_tiny` finds this file
    import lab
    import transformers
    transformers.logging.set_verbosity_error()  # no progress bars or config chatter between our log lines
    transformers.logging.disable_progress_bar()
    device = pick_device(base.device)
    print(f"device: {device} (asked for {base.device}), "
          + (torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"))
    out_dir = os.path.join("runs", base.name)
    os.makedirs(out_dir, exist_ok=True)
    model, tokenizer, start_path = load_or_warm_up(base, device, "runs")
    eval_problems = ProblemStream(base, base.warmup_seed + HELD_OUT_STREAM).next(base.eval_size)
    start = lab.evaluate(model, tokenizer, base, eval_problems, device)
    start.update(lab.pass_at_group(model, tokenizer, base, eval_problems, device))
    print(lab.format_start(start, base))

    # does RL fix the warm-up's mistakes? Every method from the same start, for every seed
    results = dict(config=dataclasses.asdict(base), device=str(device), start=start, warmup_path=start_path,
                   runs=[], interrupted=False)
    histories: Dict[str, List[dict]] = {}
    begin = time.time()
    with open(os.path.join(out_dir, "metrics.jsonl"), "w") as log_file:
        for seed, (label, args, strength) in itertools.product(seeds, runs):
            run_start = time.time()
            history, interrupted = train_method(label, args, strength, seed, start_path, tokenizer, eval_problems,
                                                device, log_file)
            histories.setdefault(label, []).extend(history)
            results["runs"].append(lab.summarise_run(label, seed, history, start, time.time() - run_start,
                                                     interrupted))
            if interrupted:
                results["interrupted"] = True
                break
    results["wall_s"] = time.time() - begin
    results["table"] = lab.report_training(results["runs"], histories, start, base, out_dir)  # curves.png

    # what does one step do under each weighting? where does CSCR move credit? Asked of the starting policy
    strength = next((s for _, _, s in runs if s > 0), 1.0)  # the first CSCR strength asked for, else 1
    results["one_step"] = lab.report_one_step(model, tokenizer, base, eval_problems, strength, device, out_dir)
    results["diagnosis"] = lab.report_diagnosis(model, tokenizer, base, eval_problems, strength, device, out_dir)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {out_dir}/metrics.jsonl, results.json, curves.png, onestep.png, credit.png "
          f"(training took {results['wall_s']:.0f} s)")
    return results


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:  # bad arguments: one clear line, no traceback
        sys.exit(f"train_tiny.py: error: {error}")
