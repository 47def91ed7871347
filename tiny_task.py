"""tiny_task.py: the task train_tiny.py's RL loop acts on, and the policy it starts from.

A GPT-2-style model of 0.6 M parameters, built in code, adds 2 to 5 one-digit numbers by writing
partial sums, a token per character:

    prompt "6+9+8="  response "6+9=15,15+8=23>23<eos>"

The exact verifier accepts a response that ended with <eos> and whose single ">" is followed by
the right sum. The starting policy imitates a demonstrator with habits RL can fix: it forgets the
carry when adding 9 (15+9=14) 60% of the time, so greedy decoding errs there; 8% of other steps
slip by 1 or 2; 25% of its answers re-check a step (~8 tokens longer, right); 12% loop until the
48-token budget (truncated, wrong). A quarter of its demonstrations carry the verdict before the
prompt, "Y" or "N": the conditions CSCR and OPSD score under.

In this file: Task (every argument the starting policy depends on), the problems and the
demonstrator, the verifier, the tokenizer and the model, the supervised warm-up, sampling and
scoring the model's answers, and the set-up the scripts share (the Task's checks, the device,
seeding). No RL and no tokencredit: that is train_tiny.py.
"""

import dataclasses
import hashlib
import inspect
import json
import math
import os
import random
import re
import time
from typing import List

import torch
from transformers.hf_argparser import HfArg


def arg(default, help: str, **more):  # a field with its --help line, as HfArgumentParser reads it
    return HfArg(default=default, help=help, **more)


@dataclasses.dataclass
class Task:
    """The task, the demonstrator whose habits the warm-up imitates, and the tiny model: what the
    warm-up's checkpoint depends on. train_tiny.Args adds the RL loop's arguments to these."""
    min_terms: int = arg(2, "fewest numbers in a problem")
    max_terms: int = arg(5, "most numbers in a problem")
    max_value: int = arg(9, "numbers are drawn from 0..max_value")
    misconception: str = arg("9", "addends whose carry it forgets (15+9=14), comma-separated")
    misconception_rate: float = arg(0.6, "how often it forgets that carry (> 0.5: greedy errs)")
    long_misconception_rate: float = arg(0.0, "how often it forgets the carry into a two-digit "
                                         "running sum (13+8=11), met only in answers of 3+ "
                                         "numbers (0: never; the lab's failure-1 case)")
    slip_rate: float = arg(0.08, "chance that any other step is off by 1 or 2")
    recheck_rate: float = arg(0.25, "chance it writes one step twice: a harmless ~8-token detour")
    loop_rate: float = arg(0.12, "chance it repeats one step until the budget: truncated, wrong")
    max_new_tokens: int = arg(48, "generation budget L_max; longer responses are truncated",
                              aliases=["--max_completion_length", "--max-completion-length"])
    cond_pos: str = arg("Y", "text before the prompt asserting 'correct' (CSCR's c+, OPSD)")
    cond_neg: str = arg("N", "text before the prompt asserting 'incorrect' (CSCR's c-)")
    n_layer: int = arg(3, "transformer blocks")
    n_embd: int = arg(128, "width")
    n_head: int = arg(4, "attention heads")
    warmup_steps: int = arg(800, "supervised steps imitating the demonstrator (0 to skip)")
    warmup_batch: int = arg(64, "sequences per supervised step")
    warmup_lr: float = arg(2e-3, "learning rate of the warm-up")
    warmup_seed: int = arg(1234, "seed of the warm-up and of the held-out problems")


# -----------------------------------------------------------------------------
# the problems, the demonstrator's solutions and the exact verifier

def render_problem(terms: List[int]) -> str:
    return "+".join(str(x) for x in terms) + "="


def forgotten_addends(task: Task) -> set:  # --misconception "9" -> {9}
    return set(parse_list(task.misconception, int, "--misconception") if task.misconception else [])


def forgets_carry(total: int, x: int, forgotten: set) -> bool:  # the misconception applies here
    return x in forgotten and total % 10 + x >= 10


def forgets_long_carry(total: int, x: int) -> bool:  # the second misconception applies here
    return total >= 10 and total % 10 + x >= 10


def meets_misconception(terms: List[int], task: Task) -> bool:
    totals = [sum(terms[:k + 1]) for k in range(len(terms) - 1)]  # the sum before each step
    return any(forgets_carry(s, x, forgotten_addends(task)) for s, x in zip(totals, terms[1:]))


def meets_long_misconception(terms: List[int], task: Task) -> bool:
    """A step of the right solution that --long-misconception-rate acts on (none if it is 0)."""
    totals = [sum(terms[:k + 1]) for k in range(len(terms) - 1)]
    forgotten = forgotten_addends(task)
    return bool(task.long_misconception_rate) and any(
        forgets_long_carry(s, x) and not forgets_carry(s, x, forgotten)
        for s, x in zip(totals, terms[1:]))


STEP = re.compile(r"(\d+)\+(\d)=(\d+)(?=[,>])")  # a finished step "a+x=c" of a response


def carry_steps(text: str, task: Task) -> tuple:
    """The response's finished steps a+x=c where each misconception applies to a and x (its own
    running sum, slips and all), and how many of them it wrote right (c = a + x). Returns
    (met, right) for the first misconception and (met, right) for the second."""
    forgotten, counts = forgotten_addends(task), [0, 0, 0, 0]
    for a, x, c in STEP.findall(text):
        a, x, c = int(a), int(x), int(c)
        which = (0 if forgets_carry(a, x, forgotten)
                 else 2 if task.long_misconception_rate and forgets_long_carry(a, x) else None)
        if which is not None:
            counts[which] += 1
            counts[which + 1] += c == a + x
    return tuple(counts)


def demonstrate(terms: List[int], task: Task, rng: random.Random) -> tuple:
    """One solution with the demonstrator's habits (see the top). Returns (text, finished)."""
    forgotten, steps, total = forgotten_addends(task), [], terms[0]
    for x in terms[1:]:  # the running partial sums "a+b=c", a slip carried forward
        slip, applies, rate = 0, forgets_carry(total, x, forgotten), task.misconception_rate
        if not applies and task.long_misconception_rate and forgets_long_carry(total, x):
            applies, rate = True, task.long_misconception_rate  # 13+8=11: only long answers
        if applies and rng.random() < rate:
            slip = -10
        elif rng.random() < task.slip_rate:
            slip = rng.choice([-2, -1, 1, 2])
        steps.append(f"{total}+{x}={max(0, total + x + slip)}")
        total = max(0, total + x + slip)
    if not steps:
        return f">{terms[0]}", True
    detour, k = rng.random(), rng.randrange(len(steps))
    if detour < task.loop_rate:  # a loop never finishes
        text = ",".join(steps[:k + 1])
        while len(text) < task.max_new_tokens:
            text += "," + steps[k]
        return text[:task.max_new_tokens], False
    if detour < task.loop_rate + task.recheck_rate:
        steps.insert(k + 1, steps[k])
    return ",".join(steps) + f">{total}", True


def verify(terms: List[int], response: str, complete: bool) -> bool:
    """True only for a finished response whose single '>' is followed by exactly the right sum."""
    match = re.fullmatch(r"[^>]*>(\d{1,9})", response.strip())
    return complete and bool(match) and int(match.group(1)) == sum(terms)


def verify_all(problems: List[List[int]], texts: List[str], complete: torch.Tensor) -> torch.Tensor:
    return torch.tensor([verify(t, s, c) for t, s, c in zip(problems, texts, complete.tolist())],
                        dtype=torch.bool)


def has_repeated_step(text: str) -> bool:  # a detour: a step written twice in a row
    steps = text.split(">")[0].split(",")
    return any(a == b for a, b in zip(steps, steps[1:]))


class ProblemStream:
    """Seeded problems: every method sees the same sequence for one seed."""

    def __init__(self, task: Task, seed: int):
        self.rng, self.task = random.Random(seed), task

    def next(self, n: int) -> List[List[int]]:
        t, rng = self.task, self.rng
        return [[rng.randint(0, t.max_value) for _ in range(rng.randint(t.min_terms, t.max_terms))]
                for _ in range(n)]


# -----------------------------------------------------------------------------
# the tiny model, its character tokenizer (built in code) and the supervised warm-up

CHARACTERS, POSITIONS = "0123456789+=,>YN", 128  # the tokenizer's characters, the model's context


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>"] + list(CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # a char a token
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")


def build_tiny_model(task: Task, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tokenizer), n_positions=POSITIONS, n_embd=task.n_embd, n_layer=task.n_layer,
        n_head=task.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id))


def warmup_batch(task: Task, tokenizer, rng: random.Random, device):
    """Demonstrations to imitate, loss on the response only. A quarter of them carry the verdict
    before the prompt ("Y" if right, "N" if wrong), so that the model learns what the tags mean."""
    texts, prompt_lens = [], []
    for terms in ProblemStream(task, rng.randrange(2 ** 31)).next(task.warmup_batch):
        text, finished = demonstrate(terms, task, rng)
        verdict = task.cond_pos if verify(terms, text, finished) else task.cond_neg
        prompt = (verdict if rng.random() < 0.25 else "") + render_problem(terms)
        texts.append(prompt + text + (tokenizer.eos_token if finished else ""))
        prompt_lens.append(len(tokenizer(prompt)["input_ids"]))
    batch = tokenizer(texts, padding=True, padding_side="right", return_tensors="pt")
    ids, attention = batch["input_ids"].to(device), batch["attention_mask"].to(device)  # (n, L)
    prompt_lens = torch.tensor(prompt_lens, device=device)[:, None]  # (n, 1)
    in_prompt = torch.arange(ids.shape[1], device=device)[None] < prompt_lens  # (n, L)
    return ids, attention, ids.masked_fill((attention == 0) | in_prompt, -100)


def warmup_path(task: Task, runs_dir: str) -> str:
    """runs_dir/warmup-<hash of the Task's fields and torch's thread count (it changes the float
    sums)>; --long-misconception-rate counts only when it is set, so older warm-ups keep theirs."""
    key = {f.name: getattr(task, f.name) for f in dataclasses.fields(Task)
           if f.name != "long_misconception_rate" or task.long_misconception_rate}
    key = json.dumps(dict(key, threads=torch.get_num_threads()), sort_keys=True)
    return os.path.join(runs_dir, f"warmup-{hashlib.sha1(key.encode()).hexdigest()[:10]}")


def load_or_warm_up(task: Task, device, runs_dir: str):
    """The starting policy: the tiny model after a supervised warm-up, cached at warmup_path.
    Returns (model, tokenizer, the checkpoint's path)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = warmup_path(task, runs_dir)
    if os.path.exists(os.path.join(path, "config.json")):
        print(f"warm-up: reusing {path}")
        model = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
        return model, AutoTokenizer.from_pretrained(path), path
    tokenizer = build_tokenizer()
    seed_everything(task.warmup_seed)
    model = build_tiny_model(task, tokenizer).to(device)
    print(f"warm-up: {task.warmup_steps} supervised steps on a "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M-parameter model")
    optimizer = torch.optim.AdamW(model.parameters(), lr=task.warmup_lr, weight_decay=0.0)
    rng, start = random.Random(task.warmup_seed), time.time()
    for step in range(task.warmup_steps):
        cosine = 0.5 * (1 + math.cos(math.pi * step / task.warmup_steps))
        for group in optimizer.param_groups:
            group["lr"] = task.warmup_lr * min(1.0, (step + 1) / 20) * cosine
        ids, attention, labels = warmup_batch(task, tokenizer, rng, device)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % max(1, task.warmup_steps // 5) == 0:
            print(f"  warm-up step {step + 1:4d}/{task.warmup_steps} loss {loss.item():.3f} "
                  f"({time.time() - start:.0f} s)")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    print(f"warm-up: saved to {path}")
    return model.eval(), tokenizer, path


# -----------------------------------------------------------------------------
# sampling with a KV cache from left-padded prompts, and scoring what was sampled

def prompt_texts(problems: List[List[int]], cond: str = "") -> List[str]:
    return [cond + render_problem(t) for t in problems]


def tokenize_prompts(tokenizer, texts: List[str], device):  # left-padded: generation goes right
    batch = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
    return batch["input_ids"].to(device), batch["attention_mask"].to(device)  # (n, P) each


def response_mask(responses: torch.Tensor, eos_id: int):
    """Real tokens run up to and including the first <eos>. Returns mask (n, T), complete (n,)."""
    is_eos = (responses == eos_id).long()  # (n, T)
    return is_eos.cumsum(dim=1) - is_eos == 0, is_eos.bool().any(dim=1)


def mask_positions(attention: torch.Tensor) -> torch.Tensor:  # left padding shifts no position
    return (attention.cumsum(dim=1) - 1).clamp(min=0)


@torch.no_grad()
def sample_tokens(model, ids, attention, max_new_tokens: int, greedy: bool, temperature: float,
                  eos_id: int):
    """Sampling with a KV cache from softmax(logits / temperature), no top-k or top-p, as
    model.generate() samples, until every row has written <eos>. ids, attention (n, P): the
    left-padded prompts. Returns tokens (n, T), arbitrary after <eos>, and logits (n, T, V)."""
    # transformers 5.21 renamed past_key_values to cache; older releases know only the old name
    cache = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
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
            token = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1).squeeze(1)
        tokens.append(token)
        all_logits.append(logits)
        finished |= token == eos_id
        if finished.all() or len(tokens) == max_new_tokens:
            break
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)  # (n, P + t)
        out = model(input_ids=token[:, None], attention_mask=attention, position_ids=next_position,
                    use_cache=True, **{cache: getattr(out, cache)})
        next_position = next_position + 1
    return torch.stack(tokens, dim=1), torch.stack(all_logits, dim=1)  # (n, T), (n, T, V)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log pi(o_t | q, o_<t) of the sampled tokens, logits[t, o_t] - logsumexp_v logits[t, v]:
    (N, T, V), (N, T) -> (N, T), in float32 whatever the logits' dtype (bf16 would lose the small
    changes the clip looks at)."""
    logits = logits.float()
    picked = logits.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (N, T)
    return picked - torch.logsumexp(logits, dim=-1)  # (N, T)


def score(model, tokenizer, problems, responses, mask, temperature: float, conds=("",),
          need_logits=False):
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
    logits = logits[:, P - 1:P + T - 1] / temperature  # (k n, T, V): what each came from
    logp = token_logprobs(logits, responses.repeat(k, 1))  # (k n, T)
    return [(logp[i * n:(i + 1) * n], logits[i * n:(i + 1) * n] if need_logits else None)
            for i in range(k)]


def score_by_length(model, tokenizer, problems, responses, mask, temperature: float,
                    micro_batches: int):
    """score() with logits, on micro-batches of rows of similar length, each cut to its longest
    response: the same log-probs with less work on padding. Returns logp (n, T), logits."""
    T, lengths = responses.shape[1], mask.sum(dim=1)  # lengths (n,)
    order, parts = lengths.argsort(), []  # rows from the shortest response to the longest
    for rows in order.chunk(micro_batches):
        width = max(1, int(lengths[rows].max()))
        (logp, logits), = score(model, tokenizer, [problems[i] for i in rows.tolist()],
                                responses[rows, :width], mask[rows, :width], temperature,
                                need_logits=True)
        parts.append((torch.nn.functional.pad(logp, (0, T - width)),  # (rows, T)
                      torch.nn.functional.pad(logits, (0, 0, 0, T - width))))  # (rows, T, V)
    inverse = order.argsort()  # back to the batch's order
    return tuple(torch.cat(part)[inverse] for part in zip(*parts))


# -----------------------------------------------------------------------------
# set-up: the Task's checks, the device, seeding, and comma-separated lists

def check_task(t: Task) -> None:
    """A ValueError, naming the flag, for any Task field out of range."""
    check_fields(t, lambda v: v >= 0, ">= 0", "warmup_steps")
    check_fields(t, lambda v: v >= 1, ">= 1", "warmup_batch", "max_new_tokens", "n_layer",
                 "n_embd", "n_head")
    check_fields(t, lambda v: 0 <= v <= 1, "in [0, 1]", "misconception_rate",
                 "long_misconception_rate", "slip_rate", "recheck_rate", "loop_rate")
    check_fields(t, lambda v: v > 0, "> 0", "warmup_lr")
    require(t.n_embd % t.n_head == 0, f"--n-embd must be a multiple of --n-head, got "
            f"{t.n_embd} and {t.n_head}")
    require(1 <= t.min_terms <= t.max_terms and t.max_value >= 1,
            f"--min-terms, --max-terms and --max-value must satisfy 1 <= min <= max and "
            f"1 <= max-value, got {t.min_terms}, {t.max_terms} and {t.max_value}")
    require(t.cond_pos != t.cond_neg and set(t.cond_pos + t.cond_neg) <= set(CHARACTERS),
            f"--cond-pos and --cond-neg must differ and use the tokenizer's characters "
            f"{CHARACTERS}, got {t.cond_pos!r}, {t.cond_neg!r}")
    prompt = max(len(t.cond_pos), len(t.cond_neg)) + t.max_terms * (len(str(t.max_value)) + 1)
    require(prompt + t.max_new_tokens + 1 <= POSITIONS, f"--max-new-tokens {t.max_new_tokens} "
            f"leaves no room for a prompt of up to {prompt} tokens in the model's {POSITIONS} "
            f"positions")
    require(t.recheck_rate + t.loop_rate <= 1,
            f"--recheck-rate + --loop-rate must be <= 1, got {t.recheck_rate} + {t.loop_rate}")
    require(all(0 <= d <= t.max_value for d in forgotten_addends(t)), f"--misconception must "
            f"list addends in 0..max_value = {t.max_value}, got {t.misconception!r}")


def require(ok: bool, message: str) -> None:  # a check of the command line's arguments
    if not ok:
        raise ValueError(message)


def check_fields(args, test, expected: str, *names: str) -> None:
    """require test(value) of each field in names, naming its flag and what was expected."""
    for name in names:
        value = getattr(args, name)
        require(test(value), f"--{name.replace('_', '-')} must be {expected}, got {value}")


def pick_device(requested: str) -> torch.device:
    """auto: CUDA if present, else Apple's MPS, else the CPU."""
    available = dict(cuda=torch.cuda.is_available(), mps=torch.backends.mps.is_available(),
                     cpu=True)
    if requested == "auto":
        requested = next(name for name, ok in available.items() if ok)
    if not available[requested]:
        raise ValueError(f"--device {requested} was asked for, but torch {torch.__version__} "
                         f"finds no {requested.upper()} device here; use --device cpu or auto")
    return torch.device(requested)


def describe_device(device: torch.device, requested: str) -> str:  # every script prints this
    what = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"{torch.get_num_threads()} threads")
    return f"device: {device} (asked for {requested}), {what}"


def quiet_transformers() -> None:  # no progress bars or config chatter between the log lines
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def seed_everything(seed: int) -> None:  # random, numpy, torch and CUDA: one seed for all
    from transformers import set_seed
    set_seed(seed)


def parse_list(text: str, kind, flag: str) -> list:
    try:
        values = [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = None
    if not values:
        raise ValueError(f"{flag} must be a comma-separated list of {kind.__name__}, got {text!r}")
    return values
