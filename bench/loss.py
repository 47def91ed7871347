"""bench/loss.py: policy_loss against TRL's and verl's own loss code (python -m bench --loss).

Each baseline is the library's code as it is, called on the same tensors as policy_loss (logp a
leaf, old_logp, advantages, a right-padded bool mask), forward and backward, clip 0.2, no KL:

  TRL 1.16, with its statistics  GRPOTrainer._compute_loss, as training runs it: the loss, then
                                 the clip fractions it logs (each read with .item()); on a stand-in
                                 trainer with the state it reads (a GRPOConfig, a one-process
                                 Accelerator) whose forward returns logp, and entropies (N, 1), so
                                 that the entropy it also logs costs next to nothing
  TRL 1.16, bare loss            the same method's statements up to its metrics ("# Log the
                                 metrics"), then `return loss`: the loss alone
  verl 0.9.1                     core_algos.compute_policy_loss_vanilla, with its clip fractions and
                                 KL (verl's dual clip, 3, never binds here); its advantages are per
                                 token, so policy_loss gets the same (N, T) tensor there
  the bare formula               -min(rho A, clip(rho) A), masked and averaged, written here: no
                                 checks, no statistics, padding not made 0 (garbage there is NaN)

"token" is TRL's loss_type "dapo" and verl's "token-mean"; "sample" TRL's "grpo" and verl's
"seq-mean-token-mean". On the CPU, one thread: the calls alternate, in an order that rotates, and
each is timed in this process's CPU time (other processes on a shared machine do not count); a
ratio is the median over the rounds of policy_loss's time over the baseline's in the same round.
TRL and verl cannot share an environment: run this once in each (.ci/trl-env.sh, .ci/verl-env.sh
make them); a baseline that is not installed is skipped, and said so.
"""

import ast
import functools
import inspect
import statistics
import tempfile
import textwrap
import time
import types
from collections import defaultdict

import torch

import tokencredit as tc

SHAPES = ((256, 4096), (64, 1024))
TRL_TYPES = dict(token="dapo", sample="grpo")  # TRL's loss_type for each aggregation mode
VERL_MODES = dict(token="token-mean", sample="seq-mean-token-mean")


def make_batch(N: int, T: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    old_logp = -torch.rand(N, T, generator=g) * 3
    return dict(logp=(old_logp + 0.1 * torch.randn(N, T, generator=g)).requires_grad_(),
                old_logp=old_logp,  # ratios on both sides of the clip
                advantages=torch.randn(N, generator=g),
                mask=torch.arange(T)[None, :] < lengths[:, None])  # (N, T) right-padded


def ours(batch: dict, mode: str, per_token_advantages: bool = False):
    A = batch["advantages"]
    A = A[:, None] * batch["mask"] if per_token_advantages else A  # verl's (N, T)
    return lambda: tc.policy_loss(batch["logp"], batch["old_logp"], A, batch["mask"], mode)[0]


def bare_formula(batch: dict, mode: str):
    logp, old_logp, mask = batch["logp"], batch["old_logp"], batch["mask"].float()
    A = batch["advantages"][:, None]  # (N, 1)

    def loss():
        ratio = torch.exp(logp - old_logp)  # (N, T)
        per_token = -torch.minimum(ratio * A, torch.clamp(ratio, 0.8, 1.2) * A) * mask  # (N, T)
        if mode == "token":
            return per_token.sum() / mask.sum()
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    return loss


def trl_losses(batch: dict, mode: str) -> dict:
    """TRL's GRPOTrainer._compute_loss, and the same statements without its metrics."""
    import trl
    from accelerate import Accelerator
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer import grpo_trainer
    logp, mask = batch["logp"], batch["mask"]
    N, T = mask.shape
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, report_to=[], use_cpu=True, loss_type=TRL_TYPES[mode])
    trainer = types.SimpleNamespace(  # the state _compute_loss reads, as GRPOTrainer sets it
        args=config, loss_type=config.loss_type, beta=config.beta, epsilon_low=config.epsilon,
        epsilon_high=config.epsilon if config.epsilon_high is None else config.epsilon_high,
        importance_sampling_level=config.importance_sampling_level, use_vllm=config.use_vllm,
        top_entropy_quantile=config.top_entropy_quantile, aux_loss_enabled=False,
        off_policy_mask_threshold=config.off_policy_mask_threshold, _entropy_bonus_enabled=False,
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        accelerator=Accelerator(cpu=True), _metrics=dict(train=defaultdict(list)),
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logp, torch.zeros(N, 1), None))
    ids = torch.zeros((), dtype=torch.bool)  # token ids the stand-in forward never reads
    inputs = dict(prompt_ids=ids.expand(N, 0), prompt_mask=mask[:, :0], completion_ids=ids.expand(
        N, T), completion_mask=mask, advantages=batch["advantages"],
        old_per_token_logps=batch["old_logp"], num_items_in_batch=mask.sum())
    source = ast.parse(textwrap.dedent(inspect.getsource(GRPOTrainer._compute_loss)))
    method = source.body[0]
    metrics = [i for i, s in enumerate(method.body) if isinstance(s, ast.FunctionDef)]
    if trl.__version__ != "1.16.0" or not metrics:
        raise ImportError(f"TRL {trl.__version__}: its _compute_loss was read at 1.16.0 only")
    method.body = method.body[:metrics[0]] + ast.parse("return loss").body
    namespace = dict(vars(grpo_trainer))
    exec(compile(ast.fix_missing_locations(source), grpo_trainer.__file__, "exec"), namespace)
    bare = namespace["_compute_loss"]
    return {f"TRL {trl.__version__}, bare loss": functools.partial(bare, trainer, None, inputs),
            f"TRL {trl.__version__}, with its statistics":
                functools.partial(GRPOTrainer._compute_loss, trainer, None, inputs)}


def verl_loss(batch: dict, mode: str) -> dict:
    import verl
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.workers.config import FSDPActorConfig
    config = FSDPActorConfig(rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                             clip_ratio_high=0.2, loss_agg_mode=VERL_MODES[mode])
    mask = batch["mask"]
    A = batch["advantages"][:, None] * mask  # (N, T): verl's advantages, A_i on real tokens
    loss = functools.partial(compute_policy_loss_vanilla, batch["old_logp"], batch["logp"], A,
                             mask, VERL_MODES[mode], config)
    return {f"verl {verl.__version__}": lambda: loss()[0]}


def forward_backward(batch: dict, loss_fn):
    def step():
        batch["logp"].grad = None
        loss = loss_fn()
        loss.backward()
        return loss.detach(), batch["logp"].grad
    return step


def count_reads(fn) -> int:
    """How often fn reads a tensor's value back to Python (.item(), .tolist(), bool(), ...): on a
    GPU each read waits for the device."""
    reads, real = [], {m: getattr(torch.Tensor, m) for m in
                       ("item", "tolist", "__bool__", "__float__", "__int__")}
    for m, method in real.items():
        setattr(torch.Tensor, m, lambda self, *a, _m=method: reads.append(1) or _m(self, *a))
    try:
        fn()
    finally:
        for m, method in real.items():
            setattr(torch.Tensor, m, method)
    return len(reads)


def compare(N: int, T: int, mode: str, repeats: int, skipped: set) -> None:
    batch = make_batch(N, T)
    sides = {}  # name: (policy_loss's step, the baseline's step)
    for name, make in (("TRL", trl_losses), ("verl", verl_loss)):
        try:
            baselines = make(batch, mode)
        except ImportError as why:
            skipped.add(f"{name} ({why})")
            continue
        mine = ours(batch, mode, per_token_advantages=name == "verl")
        for label, fn in baselines.items():
            sides[label] = (forward_backward(batch, mine), forward_backward(batch, fn))
    sides["the bare formula"] = (forward_backward(batch, ours(batch, mode)),
                                 forward_backward(batch, bare_formula(batch, mode)))
    calls = min(16, max(1, 2 ** 20 // (N * T)))  # a small batch: timed over several calls
    print(f"\nN={N} T={T} mode {mode!r}, {repeats} rounds of {calls} call(s) each, forward + "
          f"backward")
    agreement = {}
    for label, (mine, theirs) in sides.items():  # also the warm-up
        (loss, grad), (their_loss, their_grad) = mine(), theirs()
        agreement[label] = (float(loss - their_loss), float((grad - their_grad).abs().max()))
    rounds = {label: [] for label in sides}
    steps = [(label, k) for label in sides for k in (0, 1)]
    for r in range(repeats):
        seconds = {}
        for label, k in steps[r % len(steps):] + steps[:r % len(steps)]:  # rotate the order
            start = time.process_time()
            for _ in range(calls):
                sides[label][k]()
            seconds[label, k] = (time.process_time() - start) / calls
        for label in sides:
            rounds[label].append((seconds[label, 0], seconds[label, 1]))
    for label, pairs in rounds.items():
        ratio = statistics.median(a / b for a, b in pairs)
        mine, theirs = (statistics.median(p[k] for p in pairs) * 1e3 for k in (0, 1))
        print(f"  policy_loss / {label + ':':32s} {ratio:.2f}  ({mine:.2f} ms / {theirs:.2f} ms; "
              f"the losses differ by {agreement[label][0]:.1e}, the gradients by at most "
              f"{agreement[label][1]:.1e})")


def main(opt) -> None:
    torch.manual_seed(0)
    batch = make_batch(4, 8)
    reads = count_reads(forward_backward(batch, ours(batch, "token")))
    print(f"policy_loss against its baselines, {torch.get_num_threads()} thread(s), torch "
          f"{torch.__version__}; host reads of the device per policy_loss call: {reads}")
    skipped = set()
    for N, T in [opt.shape] if opt.shape else SHAPES:
        for mode in ("token", "sample"):
            compare(N, T, mode, opt.repeats, skipped)
    for why in sorted(skipped):
        print(f"skipped: {why}")
