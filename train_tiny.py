"""train_tiny.py: a lab for GRPO, Dr. GRPO, DAPO, CSCR and OPSD on a tiny model and a task RL can fix.

A small GPT-2-style model (about 0.6 M parameters, built from a config, nothing
downloaded) adds 2 to 5 one-digit numbers by writing running partial sums.
Every algorithmic step comes from tokencredit.py; this file samples, scores,
updates and measures.

Task encoding (one character per token):
    prompt    "6+9+8="                      the problem
    response  "6+9=15,15+8=23>23<eos>"      partial sums, then ">" and the final answer
An exact verifier reads the digits after the single ">" of a response that
ended with <eos>; anything else (malformed, truncated, extra text) is wrong.

The starting policy imitates a demonstrator with habits that RL can fix:
    misconception  it forgets the carry when adding 9 (15+9=14), 60% of the time,
                   so greedy decoding starts out wrong wherever that happens;
    slips          any other step is off by 1 or 2, 8% of the time;
    re-checks      25% of its answers write one step twice: right, and ~8 tokens longer;
    loops          12% repeat one step until the budget of 48 tokens: truncated, wrong.
So the answers to one prompt differ in length for reasons that matter to credit
(a 20-token answer beside a 48-token loop), and the right answer is within
reach of sampling (pass@8 is near 1 at the start).
Privileged outcome conditions (CSCR, OPSD): a quarter of the warm-up's
demonstrations carry the verifier's verdict before the prompt, "Y" (correct)
or "N" (wrong), so the model learns what those tags mean.

The lab, in the order it runs:
    does RL fix the warm-up's mistakes?            train each method, curves.png, the table
    what does one step do under each weighting?    one_step(), onestep.png
    where does CSCR move credit?                   diagnose(), credit.png

    python train_tiny.py                 # warm-up, then every method, about 6 min on 2 CPU cores
    python train_tiny.py --quick         # a smaller task, about 35 s, for a first look
    python train_tiny.py --help          # every argument
"""


import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

import tokencredit as tc

PRESETS: Dict[str, Dict[str, object]] = {
    # GRPO [arXiv 2402.03300]: std-normalised advantages, mean over each response then over responses
    "grpo": dict(adv_scale="std", loss_mode="sample", eps_low=0.2, eps_high=0.2),
    # Dr. GRPO [arXiv 2503.20783]: no std, a constant denominator (the generation budget)
    "drgrpo": dict(adv_scale="none", loss_mode="constant", eps_low=0.2, eps_high=0.2),
    # DAPO [arXiv 2503.14476]: token-level mean, Clip-Higher, dynamic sampling, soft overlong, +-1 rewards
    "dapo": dict(adv_scale="std", loss_mode="token", eps_low=0.2, eps_high=0.28, dynamic_sampling=True,
                 overlong_shaping=True, reward_wrong=-1.0),
    # CSCR [arXiv 2607.27888]: GRPO with sensitive tokens downweighted (our reading; moderate strength)
    "cscr": dict(adv_scale="std", loss_mode="sample", eps_low=0.2, eps_high=0.2, cscr_strength="1.0"),
    # OPSD, the CSCR paper's baseline: distil from the model told "this answer is correct", no reward
    "opsd": dict(loss_mode="token", pg_coef=0.0, distill_coef=1.0),
}


@dataclass
class Args:
    # --- what to run
    methods: str = "grpo,drgrpo,dapo,cscr,opsd"
    """comma-separated presets to compare, from: grpo, drgrpo, dapo, cscr, opsd"""
    seeds: str = "0"
    """comma-separated seeds; each seed runs every method (the table reports mean and std)"""
    name: str = "default"
    """results go to runs/<name>/"""
    device: str = "auto"
    """auto (CUDA if present, else MPS, else CPU), cpu, cuda or mps"""
    quick: bool = False
    """a first look in well under a minute: 2-3 numbers up to 5, budget 32, a shorter warm-up, fewer steps"""
    # --- the task
    min_terms: int = 2
    """fewest numbers in a problem"""
    max_terms: int = 5
    """most numbers in a problem"""
    max_value: int = 9
    """numbers are drawn from 0..max_value"""
    # --- the demonstrator the warm-up imitates: the starting policy's habits, which RL can fix
    misconception: str = "9"
    """comma-separated addends whose carry the demonstrator forgets (15+9=14); empty for none"""
    misconception_rate: float = 0.6
    """how often it forgets that carry: above 0.5, so greedy decoding starts out wrong there"""
    slip_rate: float = 0.08
    """chance that any other step of a demonstration is off by 1 or 2"""
    recheck_rate: float = 0.25
    """chance that a demonstration writes one step twice: a harmless detour of about 8 tokens"""
    loop_rate: float = 0.12
    """chance that a demonstration repeats one step until the budget: truncated, so wrong"""
    eval_size: int = 200
    """held-out problems, scored with greedy decoding"""
    eval_every: int = 20
    """policy updates between held-out evaluations"""
    eval_samples: int = 4
    """sampled responses per held-out problem for the sampled accuracy (mean@k at the rollout temperature)"""
    # --- the model and its warm-up
    model: str = ""
    """a local transformers causal-LM directory (save_pretrained layout) to train instead of the tiny model"""
    prompt_template: str = "{problem}"
    """how a problem is rendered as text; must contain {problem}"""
    cond_pos: str = "Y"
    """text put before the prompt to assert 'this answer is correct' (CSCR's c+, OPSD's teacher)"""
    cond_neg: str = "N"
    """text put before the prompt to assert 'this answer is incorrect' (CSCR's c-)"""
    n_layer: int = 3
    """transformer blocks of the tiny model"""
    n_embd: int = 128
    """width of the tiny model"""
    n_head: int = 4
    """attention heads of the tiny model"""
    warmup_steps: int = 800
    """supervised steps imitating the demonstrator (0 to skip)"""
    warmup_batch: int = 64
    """sequences per supervised step"""
    warmup_lr: float = 2e-3
    """learning rate of the warm-up"""
    warmup_seed: int = 1234
    """seed of the warm-up, shared by every method and every RL seed"""
    # --- rollouts and updates
    steps: int = 60
    """policy updates per method"""
    prompts_per_step: int = 16
    """B: prompts (groups) per policy update"""
    group_size: int = 8
    """G: responses sampled per prompt"""
    max_new_tokens: int = 48
    """generation budget L_max; longer responses are truncated (and wrong)"""
    temperature: float = 1.0
    """sampling temperature of the rollouts"""
    lr: float = 1e-4
    """learning rate of the policy updates (AdamW)"""
    update_epochs: int = 2
    """passes over each rollout batch; the second one sees ratios away from 1, so the clip acts"""
    micro_batches: int = 4
    """the update's forward and backward run on this many groups of rows of similar length (less padding)"""
    log_every: int = 5
    """policy updates between progress lines"""
    one_step_lr: float = 0.01
    """learning rate of the single plain-SGD step that shows what each weighting does"""
    # --- the method (set by the presets; any of them can be given to override)
    adv_scale: str = "std"
    """group advantage: std (GRPO) or none (Dr. GRPO)"""
    loss_mode: str = "sample"
    """token weights: sample, token, group_token or constant"""
    eps_low: float = 0.2
    """lower clip range: rho >= 1 - eps_low"""
    eps_high: float = 0.2
    """upper clip range: rho <= 1 + eps_high (DAPO's Clip-Higher uses 0.28)"""
    reward_correct: float = 1.0
    """reward of a verified answer"""
    reward_wrong: float = 0.0
    """reward of a wrong, malformed or truncated answer (DAPO uses -1)"""
    dynamic_sampling: bool = False
    """DAPO: resample until the batch holds prompts_per_step informative groups"""
    max_sampling_rounds: int = 3
    """dynamic sampling gives up after this many rounds and trains on what it has"""
    overlong_shaping: bool = False
    """DAPO: add the soft overlong penalty to the reward"""
    overlong_cache: int = 6
    """length of the soft overlong zone, L_cache: (L_max - L_cache, L_max] = (42, 48] holds no correct answer"""
    beta: float = 0.0
    """weight of the k3 KL to the warm-up model (GRPO's paper used 0.04)"""
    cscr_strength: str = "0"
    """CSCR alpha; several comma-separated values run the strength ablation"""
    cscr_threshold: float = 0.0
    """CSCR tau: sensitivity below it is not downweighted"""
    pg_coef: float = 1.0
    """weight of the policy-gradient loss"""
    distill_coef: float = 0.0
    """weight of the self-distillation (OPSD) loss"""


QUICK = dict(name="quick", max_terms=3, max_value=5, misconception="5", max_new_tokens=32, warmup_steps=150,
             steps=12, prompts_per_step=8, eval_size=100, eval_every=6, log_every=6)
PRESET_KEYS = sorted({key for preset in PRESETS.values() for key in preset})


# -----------------------------------------------------------------------------
# arguments

def parse_args(argv: Optional[List[str]] = None):
    """Return (base Args, explicit overrides). Presets apply under the overrides."""
    presets = "\n".join(f"  {name:<7s} " + ", ".join(f"{k}={v}" for k, v in preset.items())
                         for name, preset in PRESETS.items())
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"presets (a method's arguments; any argument given here overrides them for every method):\n"
               f"{presets}\n--quick sets: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        doc = ARG_DOCS.get(f.name, "")
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=f"{doc} (default: {f.default})")
        else:
            kind = {"int": int, "float": float, "str": str}.get(f.type if isinstance(f.type, str) else f.type.__name__)
            parser.add_argument(flag, type=kind, default=argparse.SUPPRESS, metavar=f.name.upper(),
                                help=f"{doc} (default: {f.default})")
    given = vars(parser.parse_args(argv))
    base = Args()
    if given.get("quick", False):
        base = dataclasses.replace(base, **QUICK)
    base = dataclasses.replace(base, **{k: v for k, v in given.items() if k not in PRESET_KEYS})
    overrides = {k: v for k, v in given.items() if k in PRESET_KEYS}
    validate_args(base, overrides)
    return base, overrides


def _field_docs() -> Dict[str, str]:
    """The docstring under each Args field, read from this file's source."""
    import inspect
    source = inspect.getsource(Args)
    return dict(re.findall(r"\n    (\w+): [^\n]*\n    \"\"\"(.*?)\"\"\"", source))


ARG_DOCS = _field_docs()


def method_args(base: Args, method: str, overrides: Dict[str, object]) -> Args:
    """A method's full configuration: defaults, then its preset, then what the user gave."""
    return dataclasses.replace(base, **{**PRESETS[method], **overrides})


def validate_args(base: Args, overrides: Dict[str, object]) -> None:
    def fail(message):
        raise ValueError(message)

    for method in base.methods.split(","):
        if method not in PRESETS:
            fail(f"--methods: unknown method {method!r}; expected a comma-separated list from {sorted(PRESETS)}")
    parse_list(base.seeds, int, "--seeds")
    if base.group_size < 2:
        fail(f"--group-size must be >= 2 (a group needs two responses to compare), got {base.group_size}")
    for name in ("steps", "warmup_steps"):
        if getattr(base, name) < 0:
            fail(f"--{name.replace('_', '-')} must be >= 0, got {getattr(base, name)}")
    for name in ("prompts_per_step", "max_new_tokens", "eval_size", "eval_every", "log_every", "update_epochs",
                 "warmup_batch", "max_sampling_rounds", "eval_samples", "micro_batches"):
        if getattr(base, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(base, name)}")
    if not 1 <= base.min_terms <= base.max_terms:
        fail(f"--min-terms and --max-terms must satisfy 1 <= min <= max, got {base.min_terms} and {base.max_terms}")
    if base.max_value < 1:
        fail(f"--max-value must be >= 1, got {base.max_value}")
    if base.device not in ("auto", "cpu", "cuda", "mps"):
        fail(f"--device must be auto, cpu, cuda or mps, got {base.device!r}")
    if "{problem}" not in base.prompt_template:
        fail(f"--prompt-template must contain {{problem}}, got {base.prompt_template!r}")
    if base.temperature <= 0:
        fail(f"--temperature must be > 0, got {base.temperature}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", base.name):
        fail(f"--name must be a plain folder name under runs/ (letters, digits, . _ -), got {base.name!r}")
    if base.n_embd % base.n_head:
        fail(f"--n-embd must be divisible by --n-head, got {base.n_embd} and {base.n_head}")
    longest_prompt = (1 + len(base.prompt_template) - len("{problem}")  # a condition tag, the template's text
                      + base.max_terms * (len(str(base.max_value)) + 1))  # "9+9+...=": one character a token
    if not base.model and longest_prompt + base.max_new_tokens + 1 > 128:
        fail(f"--max-new-tokens {base.max_new_tokens} leaves no room for a prompt of up to {longest_prompt} "
             f"tokens in the tiny model's 128 positions")
    for name in ("misconception_rate", "slip_rate", "recheck_rate", "loop_rate"):
        if not 0 <= getattr(base, name) <= 1:
            fail(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(base, name)}")
    if base.recheck_rate + base.loop_rate > 1:
        fail(f"--recheck-rate + --loop-rate must be <= 1, got {base.recheck_rate} + {base.loop_rate}")
    if any(not 0 <= d <= base.max_value for d in forgotten_addends(base)):
        fail(f"--misconception must list addends in 0..max_value = {base.max_value}, got {base.misconception!r}")
    for name in ("warmup_lr", "one_step_lr"):
        if not getattr(base, name) > 0:
            fail(f"--{name.replace('_', '-')} must be > 0, got {getattr(base, name)}")
    for method in base.methods.split(","):
        a = method_args(base, method, overrides)
        if a.adv_scale not in tc.ADVANTAGE_SCALES:
            fail(f"--adv-scale must be one of {tc.ADVANTAGE_SCALES}, got {a.adv_scale!r}")
        if a.loss_mode not in tc.AGGREGATION_MODES:
            fail(f"--loss-mode must be one of {tc.AGGREGATION_MODES}, got {a.loss_mode!r}")
        strengths = parse_list(a.cscr_strength, float, "--cscr-strength")
        if any(s < 0 for s in strengths):
            fail(f"--cscr-strength values must be >= 0, got {a.cscr_strength}")
        if not a.lr > 0:
            fail(f"--lr must be > 0, got {a.lr}")
        for name in ("eps_low", "eps_high", "beta", "pg_coef", "distill_coef"):
            if not getattr(a, name) >= 0:
                fail(f"--{name.replace('_', '-')} must be >= 0, got {getattr(a, name)}")
        if a.pg_coef == 0 and a.distill_coef == 0:
            fail("--pg-coef and --distill-coef are both 0: there would be no loss to train on")
        if not (math.isfinite(a.reward_correct) and math.isfinite(a.reward_wrong)):
            fail(f"--reward-correct and --reward-wrong must be finite, got {a.reward_correct} and {a.reward_wrong}")
        if not math.isfinite(a.cscr_threshold):
            fail(f"--cscr-threshold must be finite, got {a.cscr_threshold}")
        if a.overlong_shaping and not 0 < a.overlong_cache <= a.max_new_tokens:
            fail(f"--overlong-cache must be in (0, max_new_tokens = {a.max_new_tokens}], got {a.overlong_cache}")


def parse_list(text: str, kind, flag: str) -> list:
    try:
        values = [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be a comma-separated list of {kind.__name__}, got {text!r}") from None
    if not values:
        raise ValueError(f"{flag} must name at least one value, got {text!r}")
    return values


def pick_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}); use --device cpu or auto")
    mps = getattr(torch.backends, "mps", None)
    if requested == "mps" and not (mps and mps.is_available()):
        raise ValueError("--device mps was asked for, but MPS is not available; use --device cpu or auto")
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else ("mps" if mps and mps.is_available() else "cpu")
    return torch.device(requested)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA when present


# -----------------------------------------------------------------------------
# the task: problems, solutions and the exact verifier

def render_problem(terms: List[int]) -> str:
    return "+".join(str(x) for x in terms) + "="


def render_steps(terms: List[int], slips: Optional[Dict[int, int]] = None) -> List[str]:
    """The running partial sums "a+b=c", one string a step; slips {step: delta} add errors, carried forward."""
    steps, total = [], terms[0]
    for k, x in enumerate(terms[1:]):
        new_total = max(0, total + x + (slips or {}).get(k, 0))
        steps.append(f"{total}+{x}={new_total}")
        total = new_total
    return steps


def forgotten_addends(args: Args) -> set:
    """The addends whose carry the demonstrator forgets, from --misconception ("9" -> {9})."""
    return set(parse_list(args.misconception, int, "--misconception")) if args.misconception else set()


def forgets_carry(total: int, x: int, forgotten: set) -> bool:
    """Does the step total + x meet the misconception: a forgotten addend, and a carry to forget?"""
    return x in forgotten and total % 10 + x >= 10


def demonstrate(terms: List[int], args: Args, rng: random.Random) -> tuple:
    """One solution as the demonstrator writes it, with its habits. Returns (text, finished).

    - misconception: it forgets the carry when adding one of args.misconception
      (15+9=14), with probability misconception_rate: a fact RL must overturn;
    - slips: any other step is off by 1 or 2 with probability slip_rate;
    - a re-check (recheck_rate): one step written twice, harmless, about 8 tokens longer;
    - a loop (loop_rate): one step repeated until the budget max_new_tokens runs out, never finished.
    """
    forgotten = forgotten_addends(args)
    slips, total = {}, terms[0]
    for k, x in enumerate(terms[1:]):
        if forgets_carry(total, x, forgotten) and rng.random() < args.misconception_rate:
            slips[k] = -10
        elif rng.random() < args.slip_rate:
            slips[k] = rng.choice([-2, -1, 1, 2])
        total = max(0, total + x + slips.get(k, 0))
    steps = render_steps(terms, slips)
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


class ProblemStream:
    """Seeded problems: every method sees the same sequence for one seed."""

    def __init__(self, args: Args, seed: int):
        self.rng = random.Random(seed)
        self.args = args

    def next(self, n: int) -> List[List[int]]:
        a = self.args
        return [[self.rng.randint(0, a.max_value) for _ in range(self.rng.randint(a.min_terms, a.max_terms))]
                for _ in range(n)]


# -----------------------------------------------------------------------------
# the tiny model and its character tokenizer, built in code

SPECIALS = ["<pad>", "<eos>"]
CHARS = list("0123456789+=,>YN")


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
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
    """Supervised sequences imitating the demonstrator. A quarter of its correct solutions carry
    the tag "Y" before the prompt and a quarter of its wrong ones "N", so the model learns what
    "this answer is correct / incorrect" means (CSCR's conditions). Loss on the response only."""
    stream = ProblemStream(args, rng.randrange(2 ** 31))
    texts, prompt_lens = [], []
    for terms in stream.next(args.warmup_batch):
        text, finished = demonstrate(terms, args, rng)
        cond = ""
        if rng.random() < 0.25:
            cond = args.cond_pos if verify(terms, text, finished) else args.cond_neg
        prompt = cond + args.prompt_template.format(problem=render_problem(terms))
        texts.append(prompt + text + (tokenizer.eos_token if finished else ""))
        prompt_lens.append(len(tokenizer(prompt)["input_ids"]))
    tokenizer.padding_side = "right"
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    ids, attention = batch["input_ids"].to(device), batch["attention_mask"].to(device)  # (n, L)
    labels = ids.masked_fill(attention == 0, -100)
    positions = torch.arange(ids.shape[1], device=device)[None, :]
    labels = labels.masked_fill(positions < torch.tensor(prompt_lens, device=device)[:, None], -100)
    return ids, attention, labels


def warmup_key(args: Args) -> str:
    fields = dict(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, steps=args.warmup_steps,
                  batch=args.warmup_batch, lr=args.warmup_lr, seed=args.warmup_seed, min_terms=args.min_terms,
                  max_terms=args.max_terms, max_value=args.max_value, cond_pos=args.cond_pos,
                  cond_neg=args.cond_neg, template=args.prompt_template, misconception=args.misconception,
                  misconception_rate=args.misconception_rate, slip_rate=args.slip_rate,
                  recheck_rate=args.recheck_rate, loop_rate=args.loop_rate, budget=args.max_new_tokens, version=2)
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def load_or_warm_up(args: Args, device, runs_dir: str):
    """The starting policy: --model DIR, or the tiny model after a cached supervised warm-up."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if args.model:
        if not os.path.isdir(args.model):
            raise ValueError(f"--model must be a local directory in save_pretrained layout, got {args.model!r}")
        print(f"loading {args.model}")
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model).to(device)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return model, tokenizer, args.model
    path = os.path.join(runs_dir, f"warmup-{warmup_key(args)}")
    if os.path.exists(os.path.join(path, "config.json")):
        print(f"warm-up: reusing {path}")
        tokenizer = AutoTokenizer.from_pretrained(path)
        return AutoModelForCausalLM.from_pretrained(path).to(device), tokenizer, path
    tokenizer = build_tokenizer()
    seed_everything(args.warmup_seed)
    model = build_tiny_model(args, tokenizer).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"warm-up: {args.warmup_steps} supervised steps on a {n_params / 1e6:.2f} M-parameter model")
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
    return model, tokenizer, path


# -----------------------------------------------------------------------------
# rollouts and scoring

def tokenize_prompts(tokenizer, texts: List[str], device):
    tokenizer.padding_side = "left"  # decoder-only generation continues at the right edge
    batch = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=True)
    return batch["input_ids"].to(device), batch["attention_mask"].to(device)  # (n, P)


def prompt_texts(args: Args, problems: List[List[int]], cond: str = "") -> List[str]:
    return [cond + args.prompt_template.format(problem=render_problem(t)) for t in problems]


def response_mask(responses: torch.Tensor, eos_id: int):
    """Real tokens run up to and including the first <eos>. Returns (mask (n, T), complete (n,))."""
    is_eos = responses == eos_id  # (n, T)
    before_or_at_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) == 0  # (n, T)
    return before_or_at_eos, is_eos.any(dim=1)


@torch.no_grad()
def sample_tokens(model, ids, attention, max_new_tokens: int, greedy: bool, temperature: float, eos_id: int):
    """Autoregressive sampling with the model's KV cache, one token for every row per step.

    A plain loop instead of model.generate(): same distribution (softmax of logits / temperature,
    no top-k or top-p), with less work per token. It stops when every row has written <eos>.
    ids, attention (n, P) left-padded prompts. Returns (new tokens (n, T <= max_new_tokens),
    the logits that produced them (n, T, V)); tokens after a row's <eos> are arbitrary.
    """
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)  # (n, P): left padding does not shift positions
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
    """Sample `repeats` responses per problem. Returns responses (n, T), mask (n, T), texts, complete.

    T is the longest response of this call (at most max_new_tokens): no padding beyond it.
    """
    ids, attention = tokenize_prompts(tokenizer, prompt_texts(args, problems), device)
    ids, attention = ids.repeat_interleave(repeats, 0), attention.repeat_interleave(repeats, 0)
    responses, _ = sample_tokens(model, ids, attention, args.max_new_tokens, greedy, args.temperature,
                                 tokenizer.eos_token_id)
    mask, complete = response_mask(responses, tokenizer.eos_token_id)
    responses = responses.masked_fill(~mask, tokenizer.pad_token_id)
    texts = decode_responses(tokenizer, responses, mask)
    return responses, mask, texts, complete


def decode_responses(tokenizer, responses, mask) -> List[str]:
    body = responses.masked_fill(responses == tokenizer.eos_token_id, tokenizer.pad_token_id)
    return tokenizer.batch_decode(body.masked_fill(~mask, tokenizer.pad_token_id).tolist(), skip_special_tokens=True)


def score(model, tokenizer, args, problems, responses, mask, conds=("",), need_logits=False):
    """log pi(o_t | cond, q, o_<t) for each condition, in one batched forward.

    problems: n problems (one per response row); responses, mask (n, T).
    Returns a list with one (logp (n, T), logits (n, T, V) or None) per condition.
    """
    n, T = responses.shape
    texts = [text for cond in conds for text in prompt_texts(args, problems, cond)]
    prompt_ids, prompt_attention = tokenize_prompts(tokenizer, texts, responses.device)  # (k n, P)
    P = prompt_ids.shape[1]
    k = len(conds)
    ids = torch.cat([prompt_ids, responses.repeat(k, 1)], dim=1)  # (k n, P + T)
    attention = torch.cat([prompt_attention, mask.repeat(k, 1).long()], dim=1)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)  # as generate numbers left-padded tokens
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    logits = logits[:, P - 1:P + T - 1]  # (k n, T, V): the logits that predicted each response token
    logp = tc.token_logprobs(logits, responses.repeat(k, 1))  # (k n, T)
    return [(logp[i * n:(i + 1) * n], logits[i * n:(i + 1) * n] if need_logits else None) for i in range(k)]


def score_by_length(model, tokenizer, args, problems, responses, mask, micro_batches: int):
    """score() with logits, in micro-batches of rows of similar length, each cut to its own longest response.

    The same log-probs as one score() call (up to float rounding), with less work on padding: a
    48-token loop no longer makes every 8-token answer in the batch pay for 48 positions.
    Returns (logp (n, T), logits (n, T, V)), both 0 beyond each micro-batch's longest response.
    """
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


# -----------------------------------------------------------------------------
# token classes, for the CSCR diagnosis and the credit picture

CLASSES = ("answer digit", "intermediate digit", "operator", "format")


def token_classes(tokenizer, responses: torch.Tensor) -> torch.Tensor:
    """(n, T) class index: digits after '>' are the answer, other digits intermediate, '+' '=' operators."""
    ids = responses.unique().tolist()
    text = {i: tokenizer.decode([i]) for i in ids}
    lookup = torch.zeros(max(ids) + 1, 3, dtype=torch.bool)  # has digit, is operator, has '>'
    for i, s in text.items():
        lookup[i] = torch.tensor([any(c.isdigit() for c in s), s.strip() in ("+", "="), ">" in s])
    flags = lookup[responses.cpu()]  # (n, T, 3)
    has_gt = flags[..., 2].long()
    after_gt = (has_gt.cumsum(dim=1) - has_gt) > 0
    classes = torch.full(responses.shape, 3)  # format
    classes[flags[..., 1]] = 2
    classes[flags[..., 0] & ~after_gt] = 1
    classes[flags[..., 0] & after_gt] = 0
    return classes


# -----------------------------------------------------------------------------
# does RL fix the warm-up's mistakes? One method's training run

def meets_misconception(terms: List[int], args: Args) -> bool:
    """True if solving `terms` adds one of the misconception's addends with a carry (where it errs)."""
    forgotten = forgotten_addends(args)
    totals = [sum(terms[:k + 1]) for k in range(len(terms) - 1)]  # the partial sum before each step
    return any(forgets_carry(total, x, forgotten) for total, x in zip(totals, terms[1:]))


def evaluate(model, tokenizer, args, problems, device) -> Dict[str, float]:
    """Held-out accuracy two ways: greedy decoding, and the mean over eval_samples samples at the
    rollout temperature (the quantity RL maximises). Greedy accuracy is also split by whether the
    problem meets the demonstrator's misconception. Sampling uses its own seed, so evaluating
    does not change the training run's random stream."""
    model.eval()
    greedy, sampled, lengths = [], 0, []
    devices = [device] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(args.warmup_seed + 2)
        for start in range(0, len(problems), 256):
            chunk = problems[start:start + 256]
            _, mask, texts, complete = generate(model, tokenizer, args, chunk, 1, True, device)
            greedy += verify_all(chunk, texts, complete).tolist()
            lengths += mask.sum(dim=1).tolist()
            _, _, texts, complete = generate(model, tokenizer, args, chunk, args.eval_samples, False, device)
            flat = [t for t in chunk for _ in range(args.eval_samples)]
            sampled += int(verify_all(flat, texts, complete).sum())
    meets = [meets_misconception(t, args) for t in problems]
    split = lambda want: [g for g, m in zip(greedy, meets) if m == want]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    return dict(accuracy=mean(greedy), sampled_accuracy=sampled / (len(problems) * args.eval_samples),
                length=mean(lengths), accuracy_misconception=mean(split(True)), accuracy_other=mean(split(False)))


@torch.no_grad()
def pass_at_group(model, tokenizer, args, problems, device) -> Dict[str, float]:
    """pass@1 (mean accuracy of samples) and pass@G (some sample of the G is right): is the right
    answer within reach of sampling, so that a group can contrast it with a wrong one? And do the
    answers to one prompt differ in length: the longest over the shortest of a group, and how many
    groups hold a truncated answer."""
    seed_everything(args.warmup_seed + 4)
    _, mask, texts, complete = generate(model, tokenizer, args, problems, args.group_size, False, device)
    flat = [t for t in problems for _ in range(args.group_size)]
    correct = verify_all(flat, texts, complete).view(len(problems), args.group_size)
    lengths = mask.sum(dim=1).float().view(len(problems), args.group_size)  # (B, G)
    return {"pass@1": float(correct.float().mean()), f"pass@{args.group_size}": float(correct.any(dim=1).float().mean()),
            "longest/shortest in a group": float((lengths.max(dim=1).values / lengths.min(dim=1).values).mean()),
            "groups with a truncated answer": float((~complete).view(len(problems), args.group_size).any(dim=1)
                                                    .float().mean())}


def has_repeated_step(text: str) -> bool:
    """A detour: some step "a+b=c" written twice in a row (a re-check, or a loop)."""
    steps = text.split(">")[0].split(",")
    return any(a == b for a, b in zip(steps, steps[1:]))


def sample_groups_fn(model, tokenizer, args, stream, device):
    """One round of rollouts for fill_batch: B prompts x G responses with their rewards.

    Responses are padded to the budget max_new_tokens here, so that rounds stack; train_step
    trims the batch back to its longest response.
    """
    def sample_groups():
        problems = stream.next(args.prompts_per_step)
        responses, mask, texts, complete = generate(model, tokenizer, args, problems, args.group_size, False, device)
        pad = args.max_new_tokens - responses.shape[1]
        responses = torch.nn.functional.pad(responses, (0, pad), value=tokenizer.pad_token_id)  # (N, L_max)
        mask = torch.nn.functional.pad(mask, (0, pad), value=False)
        flat = [t for t in problems for _ in range(args.group_size)]
        correct = verify_all(flat, texts, complete)  # (N,) what the verifier says
        rewards = torch.where(correct, args.reward_correct, args.reward_wrong).float()  # (N,)
        if args.overlong_shaping:  # shapes the reward only: dynamic sampling still filters on `correct`
            rewards = rewards + tc.overlong_penalty(mask.sum(dim=1).cpu(), args.max_new_tokens, args.overlong_cache)
        detour = torch.tensor([has_repeated_step(s) for s in texts])
        B, G = len(problems), args.group_size
        return dict(rewards=rewards.view(B, G), correct=correct.view(B, G), complete=complete.cpu().view(B, G),
                    detour=detour.view(B, G), terms=torch.tensor([t + [-1] * (args.max_terms - len(t)) for t in problems]),
                    responses=responses.cpu().view(B, G, -1), mask=mask.cpu().view(B, G, -1))
    return sample_groups


def unpad_terms(row: torch.Tensor) -> List[int]:
    return [int(x) for x in row.tolist() if x >= 0]


def train_method(label: str, args: Args, start_path: str, tokenizer, eval_problems, start_eval, seed: int,
                 device, log_file):
    """Policy updates from the warm-up weights. Returns (summary, per-step history, trained model).

    The model stays in eval mode: the tiny model has no dropout, and a loaded
    one should not either, or old and new log-probs would differ on-policy.
    """
    from transformers import AutoModelForCausalLM
    seed_everything(seed)
    model = AutoModelForCausalLM.from_pretrained(start_path).to(device).eval()
    ref_model = AutoModelForCausalLM.from_pretrained(start_path).to(device).eval() if args.beta > 0 else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    stream = ProblemStream(args, seed)
    sample_groups = sample_groups_fn(model, tokenizer, args, stream, device)
    strength = parse_list(args.cscr_strength, float, "--cscr-strength")[0]
    use_conditions = strength > 0 or args.distill_coef > 0
    history, summary = [], dict(method=label, seed=seed, start_accuracy=start_eval["accuracy"],
                                start_sampled_accuracy=start_eval["sampled_accuracy"],
                                start_length=start_eval["length"])
    run_start = time.time()
    try:
        for step in range(1, args.steps + 1):
            record = train_step(step, label, seed, args, model, ref_model, optimizer, tokenizer, sample_groups,
                                strength, use_conditions, eval_problems, device)
            history.append(record)
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            if step % args.log_every == 0 or step == 1 or step == args.steps:
                print_progress(record, args.steps)
    except KeyboardInterrupt:
        summary["interrupted"] = True
        print(f"\n[{label}] interrupted after {len(history)} steps; summarising what ran", flush=True)
    if not any("eval_accuracy" in r for r in history[-1:]) and history:
        history[-1].update({f"eval_{k}": v for k, v in evaluate(model, tokenizer, args, eval_problems, device).items()})
    final = [r for r in history if "eval_accuracy" in r]
    trained = [r for r in history if "entropy" in r]
    summary.update(final_accuracy=final[-1]["eval_accuracy"] if final else start_eval["accuracy"],
                   final_sampled_accuracy=(final[-1]["eval_sampled_accuracy"] if final
                                           else start_eval["sampled_accuracy"]),
                   final_length=final[-1]["eval_length"] if final else start_eval["length"],
                   entropy=sum(r["entropy"] for r in trained[-5:]) / max(1, len(trained[-5:])),
                   start_accuracy_misconception=start_eval["accuracy_misconception"],
                   final_accuracy_misconception=(final[-1]["eval_accuracy_misconception"] if final
                                                 else start_eval["accuracy_misconception"]),
                   final_accuracy_other=final[-1]["eval_accuracy_other"] if final else start_eval["accuracy_other"],
                   truncated_first10=mean_of(trained[:10], "truncated_frac"),
                   truncated_last10=mean_of(trained[-10:], "truncated_frac"),
                   length_wrong_last10=mean_of(trained[-10:], "length_wrong"),
                   steps=len(history), wall_s=time.time() - run_start,
                   s_per_step={k: sum(r[k] for r in history) / max(1, len(history))
                               for k in ("t_generate", "t_score", "t_update")})
    return summary, history, model


def mean_of(records: List[dict], key: str) -> float:
    values = [r[key] for r in records if key in r and r[key] == r[key]]  # NaN: no such rollout in that batch
    return sum(values) / len(values) if values else float("nan")


def print_progress(record: dict, steps: int) -> None:
    extra = f" eval {record['eval_accuracy']:.3f}" if "eval_accuracy" in record else ""
    if "entropy" not in record:
        print(f"[{record['method']:>9s} seed {record['seed']}] step {record['step']:3d}/{steps} "
              f"no informative group after {record['rounds']} rounds: update skipped", flush=True)
        return
    print(f"[{record['method']:>9s} seed {record['seed']}] step {record['step']:3d}/{steps} "
          f"reward {record['reward']:+.2f} acc {record['accuracy']:.2f} len {record['length']:5.1f} "
          f"ent {record['entropy']:.3f} kept {record['kept_frac']:.2f}{extra} | gen {record['t_generate']:.2f}s "
          f"score {record['t_score']:.2f}s update {record['t_update']:.2f}s", flush=True)


def train_step(step, label, seed, args, model, ref_model, optimizer, tokenizer, sample_groups, strength,
               use_conditions, eval_problems, device) -> dict:
    """Rollout (with dynamic sampling if asked), CSCR weights, clipped updates. Returns the log record."""
    t0 = time.time()
    if args.dynamic_sampling:  # DAPO keeps groups with 0 < #correct < G: it filters on the verifier, not the reward
        batch, fill = tc.fill_batch(sample_groups, args.prompts_per_step, args.max_sampling_rounds,
                                    filter_key="correct")
    else:
        batch = sample_groups()
        fill = dict(rounds=1, groups_seen=args.prompts_per_step,
                    groups_informative=int(tc.informative_groups(batch["correct"]).sum()))
    t_generate = time.time() - t0
    B = batch["rewards"].shape[0]
    record = dict(method=label, seed=seed, step=step, kept_frac=fill["groups_informative"] / fill["groups_seen"],
                  groups=B, rounds=fill["rounds"])
    if B == 0:  # dynamic sampling found nothing to learn from: skip the update, keep the log honest
        record.update(t_generate=t_generate, t_score=0.0, t_update=0.0, skipped=1)
        return record
    G = args.group_size
    problems = [unpad_terms(row) for row in batch["terms"] for _ in range(G)]
    mask = batch["mask"].view(B * G, -1)  # (N, L_max)
    T = max(1, int(mask.sum(dim=1).max()))  # saves the work on columns that are padding in every row
    responses = batch["responses"].view(B * G, -1)[:, :T].to(device)  # (N, T)
    mask = mask[:, :T].to(device)  # (N, T)
    advantages = tc.group_advantages(batch["rewards"], scale=args.adv_scale).flatten().to(device)  # (N,)

    t1 = time.time()
    with torch.no_grad():  # the privileged conditions (CSCR, OPSD) and the reference model, never trained
        conds = (args.cond_pos, args.cond_neg) if use_conditions else ()
        conditioned = score(model, tokenizer, args, problems, responses, mask, conds,
                            need_logits=args.distill_coef > 0) if conds else []
        ref_logp = score(ref_model, tokenizer, args, problems, responses, mask)[0][0] if ref_model else None
    t_score = time.time() - t1

    t2 = time.time()
    for epoch in range(args.update_epochs):
        logp, logits = score_by_length(model, tokenizer, args, problems, responses, mask, args.micro_batches)
        if epoch == 0:  # nothing has changed since the rollout: this forward's log-probs are pi_old's,
            old_logp = logp.detach()  # so no separate scoring pass is needed
            token_adv = advantages
            if strength > 0:
                d_pos, d_neg = tc.counterfactual_shifts(old_logp, conditioned[0][0], conditioned[1][0], mask)
                weights = tc.cscr_weights(tc.counterfactual_sensitivity(d_pos, d_neg), mask, strength,
                                          args.cscr_threshold)
                token_adv = tc.cscr_advantages(advantages, weights)  # (N, T)
        loss = torch.zeros((), device=device)
        stats = {}
        if args.pg_coef > 0:
            pg_loss, stats = tc.policy_loss(logp, old_logp, token_adv, mask, mode=args.loss_mode,
                                            eps_low=args.eps_low, eps_high=args.eps_high, group_size=G,
                                            max_len=args.max_new_tokens, ref_logp=ref_logp, beta=args.beta)
            loss = loss + args.pg_coef * pg_loss
        if args.distill_coef > 0:
            distill = tc.self_distillation_loss(logits, conditioned[0][1], mask, mode=args.loss_mode, group_size=G,
                                                max_len=args.max_new_tokens)
            loss = loss + args.distill_coef * distill
            stats["distill_loss"] = float(distill.detach())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if epoch == 0:
            with torch.no_grad():
                entropy = float(tc.masked_entropy(logits, mask))
    t_update = time.time() - t2

    lengths = mask.sum(dim=1).float().cpu()
    correct, complete = batch["correct"].flatten(), batch["complete"].flatten()
    mean_or_nan = lambda x: float(x.mean()) if x.numel() else float("nan")
    record.update(reward=float(batch["rewards"].mean()), accuracy=float(correct.float().mean()),
                  length=float(lengths.mean()), length_correct=mean_or_nan(lengths[correct]),
                  length_wrong=mean_or_nan(lengths[~correct]), truncated_frac=float((~complete).float().mean()),
                  recheck_frac=float((batch["detour"].flatten() & complete).float().mean()),
                  entropy=entropy, loss=float(loss.detach()), t_generate=t_generate, t_score=t_score,
                  t_update=t_update, **stats)
    if step % args.eval_every == 0 or step == args.steps:
        record.update({f"eval_{k}": v for k, v in evaluate(model, tokenizer, args, eval_problems, device).items()})
    return record


# -----------------------------------------------------------------------------
# where does CSCR move credit? The diagnosis and the credit picture, on the starting policy

@torch.no_grad()
def diagnose(model, tokenizer, args: Args, problems, strength: float, device):
    """Sample G responses per problem from the starting policy and score them under c+ and c-.

    Returns (diagnosis dict, data for the credit picture).
    """
    model.eval()
    seed_everything(args.warmup_seed + 1)
    responses, mask, texts, complete = generate(model, tokenizer, args, problems, args.group_size, False, device)
    flat = [t for t in problems for _ in range(args.group_size)]
    (logp, _), (logp_pos, _), (logp_neg, _) = score(model, tokenizer, args, flat, responses, mask,
                                                    ("", args.cond_pos, args.cond_neg))
    d_pos, d_neg = tc.counterfactual_shifts(logp, logp_pos, logp_neg, mask)
    sensitivity = tc.counterfactual_sensitivity(d_pos, d_neg)
    classes = token_classes(tokenizer, responses).to(device)
    correct = verify_all(flat, texts, complete).to(device)
    weights = tc.cscr_weights(sensitivity, mask, strength, args.cscr_threshold)
    result = dict(all=tc.shift_diagnostics(d_pos, d_neg, mask), by_class={}, by_outcome={},
                  strength=strength, responses=len(flat))
    for k, name in enumerate(CLASSES):
        in_class = mask & (classes == k)
        entry = tc.shift_diagnostics(d_pos, d_neg, in_class)
        entry["mean_cscr_weight"] = float(weights[in_class].mean()) if in_class.any() else float("nan")
        result["by_class"][name] = entry
    for name, rows in (("correct", correct), ("wrong", ~correct)):
        result["by_outcome"][name] = tc.shift_diagnostics(d_pos, d_neg, mask & rows[:, None])
    picture = dict(responses=responses.cpu(), mask=mask.cpu(), weights=weights.cpu(), correct=correct.cpu(),
                   sensitivity=sensitivity.cpu())
    return result, picture


def plot_credit(picture, tokenizer, args: Args, path: str) -> None:
    """Each token of a short and a long sampled response, shaded by its share of the update."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mask, responses, weights = picture["mask"], picture["responses"], picture["weights"]
    N = mask.shape[0]
    lengths = mask.sum(dim=1)
    # the shortest and the longest correct response of the batch (any response if fewer than two are correct)
    candidates = picture["correct"] if int(picture["correct"].sum()) >= 2 else torch.ones(N, dtype=torch.bool)
    rows = [int(lengths.masked_fill(~candidates, 10 ** 9).argmin()), int(lengths.masked_fill(~candidates, -1).argmax())]
    strength = parse_list(args.cscr_strength, float, "--cscr-strength")[0] or 1.0
    shares = {
        '"sample" (GRPO)': tc.token_weights(mask, "sample"),
        '"token" (DAPO / verl / TRL)': tc.token_weights(mask, "token"),
        f'CSCR, strength {strength:g} (on "sample")': tc.token_weights(mask, "sample") * weights,
    }
    vmax = max(float(w[rows].max()) for w in shares.values())
    width = int(lengths.max())
    fig, axes = plt.subplots(len(rows) * len(shares), 1, figsize=(max(8, 0.32 * width + 2), 0.75 * len(rows) *
                                                                len(shares) + 1.2))
    cmap = plt.get_cmap("Blues")
    panel = 0
    for row in rows:
        tokens = [tokenizer.decode([i]) for i in responses[row, : int(lengths[row])].tolist()]
        tokens = ["eos" if t in ("", tokenizer.eos_token) else t for t in tokens]
        for name, w in shares.items():
            ax = axes[panel]
            panel += 1
            values = w[row, : len(tokens)]
            for t, (tok, v) in enumerate(zip(tokens, values.tolist())):
                ax.add_patch(plt.Rectangle((t, 0), 1, 1, color=cmap(0.1 + 0.9 * v / vmax)))
                ax.text(t + 0.5, 0.5, tok, ha="center", va="center", fontsize=8,
                        color="white" if v / vmax > 0.6 else "black")
            ax.set_xlim(0, width)
            ax.set_ylim(0, 1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
            ax.set_title(f"{len(tokens)}-token response: {float(values.sum()) * 100:.2f}% of the update "
                         f"(batch of {N})", fontsize=8, loc="left", pad=2)
    fig.suptitle("Share of the update each token receives (darker = more credit)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(histories: Dict[str, List[dict]], start_eval: Dict[str, float], path: str) -> None:
    """Held-out accuracy, lengths of right and wrong answers, truncated and re-check rates, entropy and
    the informative-group fraction against policy update, mean over seeds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(("eval_accuracy", "eval_sampled_accuracy"), "held-out accuracy: greedy (solid), sampled (dashed)"),
              (("length_correct", "length_wrong"), "rollout length (tokens): correct (solid), wrong (dashed)"),
              (("truncated_frac",), "truncated rollouts (loops that hit the budget)"),
              (("recheck_frac",), "rollouts that finished with a re-checked step"),
              (("entropy",), "policy entropy (nats/token)"),
              (("kept_frac",), "informative groups (0 < #correct < G)")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def mean_curve(records, key, start=None):
        by_step: Dict[int, List[float]] = {}
        for r in records:
            if key in r and r[key] == r[key]:  # skip NaN (no wrong answer in that batch)
                by_step.setdefault(r["step"], []).append(r[key])
        if start is not None:
            by_step[0] = [start]
        steps = sorted(by_step)
        return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]

    for ax, (keys, title) in zip(axes.flat, panels):
        for k, (label, records) in enumerate(histories.items()):
            for key, style in zip(keys, ("-", "--")):
                if key.startswith("eval_"):
                    start = start_eval["accuracy" if key == "eval_accuracy" else "sampled_accuracy"]
                    ax.plot(*mean_curve(records, key, start), style, color=colours[k % len(colours)], marker="o",
                            markersize=3, label=label if style == "-" else None)
                else:  # per-step values are noisy: a centred 5-step moving average
                    steps, values = mean_curve(records, key)
                    smooth = [sum(values[max(0, i - 2):i + 3]) / len(values[max(0, i - 2):i + 3])
                              for i in range(len(values))]
                    ax.plot(steps, smooth, style, color=colours[k % len(colours)], alpha=0.85,
                            label=label if style == "-" else None)
        ax.set_title(title + ("" if keys[0].startswith("eval_") else ", 5-step mean"), fontsize=10)
        ax.set_xlabel("policy update")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    seeds = len({r["seed"] for records in histories.values() for r in records})
    fig.suptitle(f"tiny-model RLVR, mean over {seeds} seed(s)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -----------------------------------------------------------------------------
# what does one step do under each weighting? One plain SGD step, measured exactly

LENGTH_BUCKETS = (("short (<= 15 tokens)", 0, 15), ("medium (16-29)", 16, 29), ("long (>= 30)", 30, 10 ** 9))


def one_step(model, tokenizer, args: Args, problems, strength: float, lr: float, device) -> dict:
    """One rollout batch from the starting policy; from the same weights and with the same GRPO
    advantages, one plain SGD step (theta -= lr * grad) per weighting; the change of every
    token's log-prob, Delta_{i,t} = log pi_new(o_t) - log pi_old(o_t).

    SGD, not Adam, so that what moves is the raw gradient; lr small, so that the step stays
    first order (checked: "sample" at lr/2 moves each token by half as much). On-policy the
    gradient of the loss w.r.t. logp_{i,t} is -w_{i,t} A_{i,t}, so Delta_{i,t} is that credit
    times how much log pi(o_t) responds to the parameters, summed over every token's push.
    Returns tensors (N, T) keyed by weighting, and the batch they were measured on.
    """
    model.eval()
    seed_everything(args.warmup_seed + 3)
    responses, mask, texts, complete = generate(model, tokenizer, args, problems, args.group_size, False, device)
    G, B = args.group_size, len(problems)
    flat = [t for t in problems for _ in range(G)]
    correct = verify_all(flat, texts, complete).to(device)  # (N,)
    rewards = torch.where(correct, args.reward_correct, args.reward_wrong).float().view(B, G)
    advantages = tc.group_advantages(rewards, scale="std").flatten().to(device)  # (N,)
    with torch.no_grad():
        (logp, _), (logp_pos, _), (logp_neg, _) = score(model, tokenizer, args, flat, responses, mask,
                                                        ("", args.cond_pos, args.cond_neg))
    sensitivity = tc.counterfactual_sensitivity(*tc.counterfactual_shifts(logp, logp_pos, logp_neg, mask))
    cscr = tc.cscr_weights(sensitivity, mask, strength, args.cscr_threshold)  # (N, T)
    settings = [(mode, mode, advantages, lr) for mode in tc.AGGREGATION_MODES]
    settings += [(f"cscr {strength:g}", "sample", tc.cscr_advantages(advantages, cscr), lr),
                 ("sample, lr/2", "sample", advantages, lr / 2)]
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    delta = {}
    for name, mode, token_adv, step_lr in settings:
        model.load_state_dict(start)
        (new_logp, _), = score(model, tokenizer, args, flat, responses, mask)
        loss, _ = tc.policy_loss(new_logp, new_logp.detach(), token_adv, mask, mode=mode, group_size=G,
                                 max_len=args.max_new_tokens)
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= step_lr * p.grad  # plain SGD
            (new_logp, _), = score(model, tokenizer, args, flat, responses, mask)
        delta[name] = torch.where(mask, new_logp - logp, torch.zeros_like(logp)).cpu()  # (N, T)
    model.load_state_dict(start)
    model.zero_grad(set_to_none=True)
    return dict(delta=delta, mask=mask.cpu(), correct=correct.cpu(), advantages=advantages.cpu(),
                responses=responses.cpu(), cscr_weights=cscr.cpu(), sensitivity=sensitivity.cpu(),
                strength=strength, lr=lr)


def sample_over_token(step: dict) -> tuple:
    """Per response: lengths (N,), moved = A != 0 (N,), the measured ratio of the mean per-token change
    under "sample" to that under "token" (N,), and its first-order prediction mean|o| / |o_i| (N,)."""
    lengths = step["mask"].sum(dim=1).float()  # (N,)
    per_token = {n: step["delta"][n].sum(dim=1) / lengths.clamp(min=1) for n in ("sample", "token")}  # (N,)
    measured = per_token["sample"] / per_token["token"]  # (N,)
    predicted = lengths.mean() / lengths.clamp(min=1)  # (N,) w_sample / w_token
    return lengths, step["advantages"] != 0, measured, predicted


def one_step_table(step: dict) -> dict:
    """Per length bucket and outcome: the mean per-token change under each weighting, and the
    ratio sample/token against its first-order prediction (mean length) / |o_i|.

    Each response is compared with itself across weightings; responses whose group had equal
    rewards (A = 0) are left out.
    """
    lengths, moved, measured, predicted = sample_over_token(step)
    per_token = {name: d.sum(dim=1) / lengths.clamp(min=1) for name, d in step["delta"].items()}  # (N,) mean Delta
    rows = []
    for outcome, is_correct in (("correct", True), ("wrong", False)):
        for bucket, low, high in LENGTH_BUCKETS:
            rows_in = moved & (step["correct"] == is_correct) & (lengths >= low) & (lengths <= high)
            if not rows_in.any():
                continue
            ratio = measured[rows_in] / predicted[rows_in]
            rows.append(dict(outcome=outcome, bucket=bucket, responses=int(rows_in.sum()),
                             mean_length=float(lengths[rows_in].mean()),
                             per_token={name: float(v[rows_in].mean()) for name, v in per_token.items()},
                             ratio_measured=float(measured[rows_in].median()),
                             ratio_predicted=float(predicted[rows_in].median()),
                             ratio_over_predicted=float(ratio.median())))
    ratio = (measured / predicted)[moved]
    linear = (per_token["sample"] / per_token["sample, lr/2"])[moved]
    if not moved.any():  # every group had equal rewards: nothing moved on purpose
        ratio = linear = torch.full((1,), float("nan"))
    return dict(rows=rows, responses=int(moved.sum()), ratio_over_predicted_median=float(ratio.median()),
                ratio_over_predicted_iqr=(float(ratio.quantile(0.25)), float(ratio.quantile(0.75))),
                first_order_median=float(linear.median()), lr=step["lr"])


def format_one_step(table: dict) -> str:
    names = [n for n in table["rows"][0]["per_token"] if n != "sample, lr/2"] if table["rows"] else []
    lines = [f"One SGD step (lr {table['lr']:g}) from the starting policy, each weighting from the same weights "
             f"({table['responses']} responses with A != 0): mean change of log pi per token, x 1e-3",
             "| outcome | length | responses | mean length | " + " | ".join(names) +
             " | sample/token, median per response | first-order prediction, median of mean length / abs(o_i) |",
             "|---|---|---|---|" + "---|" * len(names) + "---|---|"]
    for r in table["rows"]:
        lines.append(f"| {r['outcome']} | {r['bucket']} | {r['responses']} | {r['mean_length']:.1f} | "
                     + " | ".join(f"{1e3 * r['per_token'][n]:+.2f}" for n in names)
                     + f" | {r['ratio_measured']:.2f} | {r['ratio_predicted']:.2f} |")
    low, high = table["ratio_over_predicted_iqr"]
    lines.append(f"per response, sample/token measured / predicted: median {table['ratio_over_predicted_median']:.2f}, "
                 f"IQR {low:.2f}-{high:.2f}; first-order check, Delta(lr) / Delta(lr/2): median "
                 f"{table['first_order_median']:.2f} (2 is exactly first order)")
    return "\n".join(lines)


def plot_one_step(step: dict, table: dict, tokenizer, path: str) -> None:
    """Three panels: per-token change by bucket and weighting; sample/token against its prediction;
    Delta log pi along one response under GRPO and CSCR, sensitive tokens in red."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(13, 8.5))
    ax_bars, ax_ratio, ax_tokens = fig.add_subplot(2, 2, 1), fig.add_subplot(2, 2, 2), fig.add_subplot(2, 1, 2)
    names = [n for n in step["delta"] if n != "sample, lr/2"]
    rows = table["rows"]
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        ax_bars.bar([i + k * width for i in range(len(rows))], [1e3 * r["per_token"][name] for r in rows],
                    width, label=name)
    ax_bars.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax_bars.set_xticklabels([f"{r['outcome']}\n{r['bucket'].split(' ')[0]}\n({r['responses']})" for r in rows],
                            fontsize=8)
    ax_bars.axhline(0, color="black", linewidth=0.6)
    ax_bars.set_ylabel("mean change of log pi per token (x 1e-3)")
    ax_bars.set_title("one SGD step: how far each response's tokens move, by weighting", fontsize=10)
    ax_bars.legend(fontsize=7)

    mask, adv = step["mask"], step["advantages"]
    lengths, moved, measured, predicted = sample_over_token(step)
    measured, predicted = measured[moved], predicted[moved]
    colours = ["tab:green" if c else "tab:red" for c in step["correct"][moved].tolist()]
    ax_ratio.scatter(lengths[moved], measured, c=colours, s=12, alpha=0.7, label="measured (green right, red wrong)")
    order = lengths[moved].argsort()
    ax_ratio.plot(lengths[moved][order], predicted[order], color="black", label="first order: mean length / |o_i|")
    ax_ratio.set_yscale("log")
    ax_ratio.set_xlabel("response length |o_i| (tokens)")
    ax_ratio.set_ylabel('change under "sample" / under "token"')
    ax_ratio.set_title("the weighting's own effect, response by response", fontsize=10)
    ax_ratio.legend(fontsize=7)

    # a well-formed wrong answer of 16 or more tokens (a slip or the misconception, not a loop): of
    # these, the one whose most sensitive token is most sensitive (what CSCR acts on)
    text = tokenizer.batch_decode(step["responses"].tolist(), skip_special_tokens=True)
    plain = torch.tensor([bool(re.fullmatch(r"(\d+\+\d=\d+,)*\d+\+\d=\d+>\d+", s)) for s in text])  # well formed
    finished = (step["responses"] == tokenizer.eos_token_id).any(dim=1)
    candidates = moved & ~step["correct"] & finished & plain & (lengths >= 16)
    if not candidates.any():
        candidates = moved if moved.any() else torch.ones_like(moved)
    spread = torch.where(mask, step["sensitivity"], torch.zeros_like(step["sensitivity"])).amax(dim=1)
    row = int(spread.masked_fill(~candidates, -1).argmax())
    n_tok = int(lengths[row])
    tokens = [tokenizer.decode([i]) or "eos" for i in step["responses"][row, :n_tok].tolist()]
    tokens = ["eos" if t == tokenizer.eos_token else t for t in tokens]
    cscr_name = next(n for n in names if n.startswith("cscr"))
    for name, style in (("sample", "-o"), (cscr_name, "-s")):
        ax_tokens.plot(range(n_tok), 1e3 * step["delta"][name][row, :n_tok], style, markersize=3,
                       label=f"{name} (GRPO)" if name == "sample" else f"{name} on sample weights")
    sensitive = step["cscr_weights"][row, :n_tok] < 1
    ax_tokens.set_xticks(range(n_tok))
    ax_tokens.set_xticklabels(tokens, fontsize=8)
    for tick, is_sensitive in zip(ax_tokens.get_xticklabels(), sensitive.tolist()):
        tick.set_color("tab:red" if is_sensitive else "black")
    ax_tokens.axhline(0, color="black", linewidth=0.6)
    outcome = "correct" if bool(step["correct"][row]) else "wrong"
    ax_tokens.set_title(f"change of log pi along one {outcome} response (A = {float(adv[row]):+.2f}); red tokens: "
                        f"CSCR weight < 1 (more sensitive than the response's average)", fontsize=10)
    ax_tokens.set_ylabel("change of log pi (x 1e-3)")
    ax_tokens.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -----------------------------------------------------------------------------
# the comparison

def mean_std(values: List[float]) -> tuple:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


def summarise(runs: List[dict]) -> List[dict]:
    """One row per method: mean and std over seeds."""
    table = []
    for label in dict.fromkeys(r["method"] for r in runs):
        rows = [r for r in runs if r["method"] == label]
        entry = dict(method=label, seeds=len(rows))
        for key in ("start_accuracy", "final_accuracy", "start_sampled_accuracy", "final_sampled_accuracy",
                    "final_length", "entropy", "wall_s", "truncated_first10", "truncated_last10",
                    "start_accuracy_misconception", "final_accuracy_misconception", "final_accuracy_other",
                    "length_wrong_last10"):
            entry[key], entry[key + "_std"] = mean_std([r[key] for r in rows])
        table.append(entry)
    return table


def format_table(table: List[dict]) -> str:
    lines = ["| method | seeds | greedy acc: start -> final | sampled acc: start -> final | held-out length | "
             "truncated rollouts: updates 1-10 -> last 10 | wrong-answer length, last 10 | entropy | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in table:
        lines.append(f"| {e['method']} | {e['seeds']} | {e['start_accuracy']:.3f} -> {e['final_accuracy']:.3f} "
                     f"+- {e['final_accuracy_std']:.3f} | {e['start_sampled_accuracy']:.3f} -> "
                     f"{e['final_sampled_accuracy']:.3f} +- {e['final_sampled_accuracy_std']:.3f} | "
                     f"{e['final_length']:.1f} +- {e['final_length_std']:.1f} | {e['truncated_first10']:.3f} -> "
                     f"{e['truncated_last10']:.3f} +- {e['truncated_last10_std']:.3f} | "
                     f"{e['length_wrong_last10']:.1f} +- {e['length_wrong_last10_std']:.1f} | {e['entropy']:.3f} | "
                     f"{e['wall_s']:.0f} |")
    return "\n".join(lines)


def format_diagnosis(diag: dict) -> str:
    a = diag["all"]
    lines = [f"CSCR diagnosis on the starting policy ({diag['responses']} sampled responses, "
             f"{a['num_tokens']} tokens): same direction {a['same_direction']:.3f}, sign reversal "
             f"{a['sign_reversal']:.3f}, mean |d+| {a['mean_abs_pos']:.3f}, mean |d-| {a['mean_abs_neg']:.3f}",
             "| token class | tokens | same direction | sign reversal | mean sensitivity | mean CSCR weight |",
             "|---|---|---|---|---|---|"]
    for name, e in diag["by_class"].items():
        lines.append(f"| {name} | {e['num_tokens']} | {e['same_direction']:.3f} | {e['sign_reversal']:.3f} | "
                     f"{e['mean_sensitivity']:.3f} | {e['mean_cscr_weight']:.3f} |")
    return "\n".join(lines)


def expand_methods(base: Args, overrides: dict) -> List[tuple]:
    """(label, Args) per run; several --cscr-strength values make one run each (the ablation)."""
    runs = []
    for method in base.methods.split(","):
        args = method_args(base, method, overrides)
        strengths = parse_list(args.cscr_strength, float, "--cscr-strength")
        if len(strengths) == 1:
            runs.append((method, args))
        else:
            runs += [(f"{method}@{s:g}", dataclasses.replace(args, cscr_strength=str(s))) for s in strengths]
    return runs


def main(argv: Optional[List[str]] = None) -> dict:
    base, overrides = parse_args(argv)
    import transformers
    transformers.logging.set_verbosity_error()  # no progress bars or config chatter between our log lines
    transformers.logging.disable_progress_bar()
    device = pick_device(base.device)
    print(f"device: {device} (asked for {base.device})" + (f", {torch.cuda.get_device_name(device)}"
                                                            if device.type == "cuda" else
                                                            f", {torch.get_num_threads()} threads"))
    out_dir = os.path.join("runs", base.name)
    os.makedirs(out_dir, exist_ok=True)
    model, tokenizer, start_path = load_or_warm_up(base, device, "runs")
    eval_problems = ProblemStream(base, 10 ** 6 + base.warmup_seed).next(base.eval_size)  # never the training stream
    start_eval = evaluate(model, tokenizer, base, eval_problems, device)
    print(f"starting policy: held-out accuracy {start_eval['accuracy']:.3f} greedy "
          f"({start_eval['accuracy_misconception']:.3f} where the misconception applies, "
          f"{start_eval['accuracy_other']:.3f} elsewhere), "
          f"{start_eval['sampled_accuracy']:.3f} sampled, mean length {start_eval['length']:.1f} tokens "
          f"({base.eval_size} problems)")
    reach = pass_at_group(model, tokenizer, base, eval_problems, device)
    print(f"{base.group_size} samples per held-out problem: " + ", ".join(f"{k} {v:.3f}" for k, v in reach.items()))
    start_eval.update(reach)
    runs = expand_methods(base, overrides)
    first_strengths = [parse_list(a.cscr_strength, float, "--cscr-strength")[0] for _, a in runs]
    strength = next((s for s in first_strengths if s > 0), 1.0)  # the diagnosis uses the first CSCR strength
    diag_args = dataclasses.replace(base, cscr_strength=str(strength))
    diagnosis, picture = diagnose(model, tokenizer, diag_args, eval_problems[:32], strength, device)
    print(format_diagnosis(diagnosis))
    plot_credit(picture, tokenizer, diag_args, os.path.join(out_dir, "credit.png"))
    step = one_step(model, tokenizer, base, eval_problems[:base.prompts_per_step], strength, base.one_step_lr, device)
    step_table = one_step_table(step)
    print(format_one_step(step_table))
    plot_one_step(step, step_table, tokenizer, os.path.join(out_dir, "onestep.png"))
    del model

    results = dict(config=dataclasses.asdict(base), overrides=overrides, device=str(device), start=start_eval,
                   warmup_path=start_path, diagnosis=diagnosis, one_step=step_table, runs=[], interrupted=False)
    histories: Dict[str, List[dict]] = {}
    total_start = time.time()
    with open(os.path.join(out_dir, "metrics.jsonl"), "w") as log_file:
        for seed in parse_list(base.seeds, int, "--seeds"):
            for label, args in runs:
                summary, history, _ = train_method(label, args, start_path, tokenizer, eval_problems, start_eval,
                                                   seed, device, log_file)
                results["runs"].append(summary)
                histories.setdefault(label, []).extend(history)
                if summary.get("interrupted"):
                    results["interrupted"] = True
                    break
            if results["interrupted"]:
                break
    results["wall_s"] = time.time() - total_start
    results["table"] = summarise(results["runs"])
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    plot_curves(histories, start_eval, os.path.join(out_dir, "curves.png"))
    print(f"\nheld-out accuracy after {base.steps} policy updates ({base.eval_size} problems; greedy, and the "
          f"mean of {base.eval_samples} samples at temperature {base.temperature:g}), mean +- std over seeds "
          f"{base.seeds}:")
    print(format_table(results["table"]))
    print(f"\nwrote {out_dir}/metrics.jsonl, results.json, curves.png, credit.png, onestep.png "
          f"(training took {results['wall_s']:.0f} s)")
    return results


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:  # bad arguments: one clear line, no traceback
        sys.exit(f"train_tiny.py: error: {error}")
