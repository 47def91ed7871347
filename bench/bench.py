"""bench/bench.py: seconds per update, train_tiny against TRL's GRPOTrainer; --loss: policy_loss's cost.

Both sides do the same work, from the same warm-up checkpoint, on the same device: train_tiny's task
and verifier, 16 prompts x 8 samples, temperature 1 without top-k or top-p, at most 48 new tokens,
std-normalised group advantages, the per-response token mean (train_tiny's "sample" mode, TRL's
loss_type "grpo"), clip 0.2, no KL, AdamW at train_tiny's learning rate, grad-norm clip 1.0, 2
optimizer steps per rollout batch, float32. The two alternate in one process, one TRL rollout batch
then one train_tiny update, so both see the same machine load. The first --skip updates of each side
are left out, and the result is the ratio of the medians (TRL / train_tiny). On CUDA every timed
part starts and ends with torch.cuda.synchronize().

--loss times tokencredit.policy_loss forward+backward against TRL's and verl's own loss code, where
installed, and a bare formula (bench/loss.py); it needs no checkpoint.

Stock TRL 1.16 scores left-padded prompts without position_ids, so GPT-2 reads them at shifted
positions; bench/bench.py measures that error before each run and times TRL with the fix
(tokencredit_trl.mask_positions), unless --stock-positions.

TRL is a benchmark-only dependency; set it up in a separate virtualenv:

    python -m venv .venv-bench
    .venv-bench/bin/pip install -r bench/requirements.txt

Then, from the project directory (the warm-up checkpoint is made on first use, 2-3 minutes):

    OMP_NUM_THREADS=1 .venv-bench/bin/python -m bench --updates 20 --skip 3
    .venv-bench/bin/python -m bench --device cuda --threads 4    # both sides on the GPU
    python -m bench --updates 3        # without TRL: train_tiny's side only
    .venv-trl/bin/python -m bench --loss   # policy_loss fwd+bwd against TRL's loss (verl's:
                                           # .venv-verl/bin/python; neither: python -m bench)
    python -m bench --help

Nothing is downloaded: the model and tokenizer come from runs/warmup-*/, and the hub is set offline.
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

for _name, _value in dict(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                          HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                          HF_DATASETS_OFFLINE="1").items():
    os.environ.setdefault(_name, _value)

import warnings  # noqa: E402

import torch  # noqa: E402

# TRL 1.16 uses names that transformers 5.24 renamed
warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
sys.path.insert(0, HERE)
import tiny_task  # noqa: E402
import train_tiny as tt  # noqa: E402

PARTS = ("generate", "score", "update", "total")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="One update = one rollout batch of 16 prompts x 8 samples and its 2 optimizer "
               "steps.\nSetup and examples: see the top of bench/bench.py.")
    add = parser.add_argument
    add("--device", default="auto", choices=("auto", "cpu", "cuda"),
        help="where both sides run: auto = CUDA if available, else the CPU (default: auto)")
    add("--updates", type=int, default=20, help="policy updates per side (default: 20)")
    add("--skip", type=int, default=3,
        help="first updates of each side left out of the medians: start-up, allocator and "
             "Trainer warm-up (default: 3, at most --updates - 1)")
    add("--seed", type=int, default=0,
        help="seed of the prompt stream and the sampling (default: 0)")
    add("--threads", type=int, default=1,
        help="torch CPU threads, shared by both sides (default: 1)")
    add("--no-trl", action="store_true", help="time train_tiny alone, even if TRL is installed")
    add("--stock-positions", action="store_true",
        help="time TRL as shipped, without the position-id fix (its log-probs are then wrong "
             "for left-padded prompts; see tokencredit_trl.mask_positions)")
    loss = parser.add_argument_group("policy_loss speed check (instead of the comparison with TRL)")
    loss.add_argument("--loss", action="store_true",
                      help="time tokencredit.policy_loss forward+backward against TRL's and verl's "
                           "own losses where installed, and a bare formula (bench/loss.py)")
    loss.add_argument("--shape", type=int, nargs=2, metavar=("N", "T"),
                      help="responses and tokens per response of the random batch "
                           "(default: 256 4096, then 64 1024)")
    loss.add_argument("--repeats", type=int, default=15,
                      help="timed rounds of each, alternating (default: 15)")
    opt = parser.parse_args(argv)
    if (opt.updates < 1 or opt.skip < 0 or opt.threads < 1 or opt.repeats < 1
            or min(opt.shape or (1,)) < 1):
        parser.error(f"need --updates >= 1, --skip >= 0, --threads >= 1, --repeats >= 1 and "
                     f"--shape >= 1, got {opt.updates}, {opt.skip}, {opt.threads}, {opt.repeats} "
                     f"and {opt.shape}")
    if opt.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda was asked for, but torch.cuda.is_available() is False (torch "
                     f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use "
                     f"--device cpu or auto")
    opt.requested = opt.device  # tiny_task.describe_device says what was asked for
    opt.device = torch.device("cuda" if opt.device == "auto" and torch.cuda.is_available() else
                              "cpu" if opt.device == "auto" else opt.device)
    opt.skip = min(opt.skip, opt.updates - 1)  # keep at least one update to take the median of
    return opt


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load(path, device):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(path).to(device)
    return model, AutoTokenizer.from_pretrained(path)


# -----------------------------------------------------------------------------
# train_tiny: train_method's set-up, stepped one update at a time

class TinySide:
    def __init__(self, args, ckpt, seed, device):
        tiny_task.seed_everything(seed)
        self.model, self.tokenizer = load(ckpt, device)
        self.model.eval()  # as train_method: no dropout, so old and new log-probs agree on-policy
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.0)
        self.sample_groups = tt.sample_groups_fn(self.model, self.tokenizer, args,
                                                 tiny_task.ProblemStream(args, seed), device)
        self.args, self.device, self.step, self.tc = args, device, 0, tt.load_tokencredit(args)

    def update(self):
        """One train_step. Its generate and score parts end in host reads (decoding, .item());
        update is the rest, measured to a synchronisation, since on CUDA the optimizer's work may
        still be queued."""
        self.step += 1
        sync(self.device)
        start = time.perf_counter()
        rec = tt.train_step(self.step, self.args, self.tc, self.model, None, self.optimizer,
                            self.tokenizer, self.sample_groups, self.device)
        sync(self.device)
        total = time.perf_counter() - start
        return dict(total=total, generate=rec["t_generate"], score=rec["t_score"],
                    update=total - rec["t_generate"] - rec["t_score"], length=rec["length"])


# -----------------------------------------------------------------------------
# TRL

# TRL times its steps with profiling contexts but reports them only to wandb/mlflow/trackio:
# keep them here.
PROFILE = []  # (name, seconds, grad enabled)


def capture_profile(device):
    """Keep TRL's profiling durations; on CUDA, synchronise at the start and end of each profiled
    part."""
    from trl.extras.profiling import ProfilingContext
    log = ProfilingContext._log_metrics
    enter, leave = ProfilingContext.__enter__, ProfilingContext.__exit__

    def keep(self, duration):
        PROFILE.append((self.name, duration, torch.is_grad_enabled()))
        return log(self, duration)

    def synced_enter(self):
        sync(device)
        return enter(self)

    def synced_exit(self, *exc):
        sync(device)
        return leave(self, *exc)

    ProfilingContext._log_metrics = keep
    ProfilingContext.__enter__, ProfilingContext.__exit__ = synced_enter, synced_exit


def make_trainer(args, ckpt, seed, updates, device, callbacks):
    """TRL's GRPOTrainer set up as train_tiny trains: B x G samples at its temperature (no top-k
    or top-p), its budget and learning rate, update_epochs optimizer steps per batch, grad clip
    1.0, float32, loss_type grpo; train_tiny's prompts (its stream, in order) and verifier, which
    records each batch's mean completion length."""
    import tempfile
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer
    from tokencredit_trl import mask_positions
    from tokencredit_trl.rewards import tiny_verifier
    model, tokenizer = load(ckpt, device)
    problems = tiny_task.ProblemStream(args, seed).next(args.prompts_per_step * updates)
    dataset = Dataset.from_dict({"prompt": tiny_task.prompt_texts(problems), "terms": problems})
    lengths = []

    def verifier(completion_ids, **kwargs):
        lengths.append(statistics.mean(len(ids) for ids in completion_ids))
        return tiny_verifier(completion_ids=completion_ids, **kwargs)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), report_to="none", save_strategy="no",
        disable_tqdm=True, use_cpu=torch.device(device).type == "cpu", seed=seed,
        shuffle_dataset=False, dataloader_num_workers=0,
        # one rollout batch = one optimizer batch = B prompts x G completions, update_epochs steps
        per_device_train_batch_size=args.prompts_per_step * args.group_size,
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=args.group_size,
        num_iterations=args.update_epochs, max_steps=args.update_epochs * updates,
        logging_steps=args.update_epochs, max_completion_length=args.max_new_tokens,
        temperature=args.temperature, top_k=0, top_p=1.0, min_p=None, repetition_penalty=1.0,
        beta=args.beta, use_bias_correction_kl=False, epsilon=args.eps_low,
        epsilon_high=args.eps_high, mask_truncated_completions=False, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        loss_type="grpo", scale_rewards="group", importance_sampling_level="token",
        # GRPOConfig defaults to bf16 autocast and activation checkpointing; train_tiny runs in
        # float32 and keeps its activations
        bf16=False, fp16=False, activation_checkpointing=False)
    trainer = GRPOTrainer(model=model, reward_funcs=verifier, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=callbacks)
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    return trainer, lambda: mask_positions(model), lengths


@torch.no_grad()
def position_error(trainer, fix, args, ckpt, seed, device):
    """Mean |log-prob difference| per response token between TRL's scoring forward and
    tiny_task.score, on 16 x 8 responses sampled by train_tiny.rollout: (stock TRL, TRL with
    mask_positions)."""
    model, tokenizer = load(ckpt, device)
    model.eval()
    tiny_task.seed_everything(seed + 1)
    problems = tiny_task.ProblemStream(args, seed + 1).next(args.prompts_per_step)
    r = tt.rollout(model, tokenizer, args, problems, args.group_size, False, device)
    flat, responses, mask = r.problems, r.responses, r.mask
    reference = tiny_task.score(model, tokenizer, flat, responses, mask, args.temperature)[0][0]
    texts = tiny_task.prompt_texts(flat)
    prompt_ids, prompt_mask = tiny_task.tokenize_prompts(tokenizer, texts, device)
    ids = torch.cat([prompt_ids, responses], 1)
    attention = torch.cat([prompt_mask, mask.long()], 1)
    errors = []
    for with_fix in (False, True):
        hook = fix() if with_fix else None
        logp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention,
                                                          responses.shape[1])[0]
        errors.append(float((logp - reference).abs()[mask].mean()))
        if hook:
            hook.remove()
    return errors


def trl_batch(profile, wall):
    """Split one TRL rollout batch like train_step's record: generate = rollout preparation
    (sampling, decoding, rewards, advantages) but for the no-grad old log-prob forward, which is
    score."""
    prepare = sum(s for name, s, _ in profile if name.endswith("._prepare_inputs"))
    score = sum(s for name, s, grad in profile
                if name.endswith("._get_per_token_logps_and_entropies") and not grad)
    return dict(total=wall, generate=prepare - score, score=score, update=wall - prepare)


def run_alternating(args, ckpt, opt, tiny):
    """Train TRL for opt.updates rollout batches; after each, outside TRL's clock, one train_tiny
    update."""
    from transformers import TrainerCallback
    capture_profile(opt.device)
    trl_rows, tiny_rows = [], []

    class Alternate(TrainerCallback):
        def on_train_begin(self, *a, **kw):
            sync(opt.device)
            self.start, self.mark = time.perf_counter(), len(PROFILE)

        def on_step_end(self, train_args, state, control, **kw):
            if state.global_step % args.update_epochs:
                return  # the rollout batch has more optimizer steps to run
            sync(opt.device)
            trl_rows.append(trl_batch(PROFILE[self.mark:], time.perf_counter() - self.start))
            tiny_rows.append(tiny.update())
            progress(len(trl_rows), opt, trl=trl_rows[-1], tiny=tiny_rows[-1])
            self.start, self.mark = time.perf_counter(), len(PROFILE)

    trainer, fix, lengths = make_trainer(args, ckpt, opt.seed, opt.updates, opt.device,
                                         [Alternate()])
    stock, fixed = position_error(trainer, fix, args, ckpt, opt.seed, opt.device)
    print(f"positions: TRL's log-probs differ from tiny_task.score's by {stock:.3f} nats per "
          f"token as shipped, by {fixed:.1e} with tokencredit_trl.mask_positions "
          f"({'not ' if opt.stock_positions else ''}used below)")
    if not opt.stock_positions:
        fix()
    trainer.train()
    for row, length in zip(trl_rows, lengths):
        row["length"] = length
    if torch.get_num_threads() != opt.threads:
        print(f"warning: torch now uses {torch.get_num_threads()} threads, not {opt.threads}")
    return tiny_rows, trl_rows


def progress(k, opt, **sides):
    if k == 1 or k % 5 == 0 or k == opt.updates:
        times = ", ".join(f"{name} {row['total']:.2f} s" for name, row in sides.items())
        print(f"update {k:3d}/{opt.updates}: {times}", flush=True)


def medians(rows, skip):
    return {key: statistics.median(r[key] for r in rows[skip:]) for key in rows[0]
            if key in PARTS + ("length",)}


def main(argv=None):
    opt = parse_args(argv)
    torch.set_num_threads(opt.threads)
    if opt.loss:
        from bench.loss import main as compare_losses
        return compare_losses(opt)
    import transformers
    tiny_task.quiet_transformers()
    print(tiny_task.describe_device(opt.device, opt.requested), flush=True)
    # train_tiny's grpo run, without its held-out evaluations inside the timed loop
    args = dataclasses.replace(tt.Args(), **tt.PRESETS["grpo"], steps=10 ** 9, eval_every=10 ** 9)
    # the warm-up: made once
    _, _, ckpt = tiny_task.load_or_warm_up(args, opt.device, os.path.join(HERE, "runs"))
    try:
        import trl
        have_trl = not opt.no_trl
    except ImportError:
        trl, have_trl = None, False
    print(f"bench: {opt.updates} updates per side, medians over the last "
          f"{opt.updates - opt.skip}; {args.prompts_per_step} prompts x {args.group_size} samples, "
          f"{args.max_new_tokens} new tokens, {args.update_epochs} optimizer steps per batch, lr "
          f"{args.lr:g}; torch {torch.__version__}, transformers {transformers.__version__}"
          + (f", trl {trl.__version__}" if have_trl else ""), flush=True)
    tiny = TinySide(args, ckpt, opt.seed, opt.device)
    if have_trl:
        tiny_rows, trl_rows = run_alternating(args, ckpt, opt, tiny)
    else:
        tiny_rows, trl_rows = [], None
        for k in range(1, opt.updates + 1):
            tiny_rows.append(tiny.update())
            progress(k, opt, train_tiny=tiny_rows[-1])

    print(f"\nseconds per update on {opt.device}, median of updates {opt.skip + 1}-{opt.updates} "
          f"(each column its own median)")
    print(f"{'':16s}" + "".join(f"{p:>10s}" for p in PARTS) + f"{'mean len':>10s}")
    results = dict(train_tiny=medians(tiny_rows, opt.skip))
    if trl_rows:
        results["TRL GRPOTrainer"] = medians(trl_rows, opt.skip)
    for name, m in results.items():
        print(f"{name:16s}" + "".join(f"{m[p]:10.3f}" for p in PARTS) + f"{m['length']:10.1f}")
    if trl_rows:
        ratio = results["TRL GRPOTrainer"]["total"] / results["train_tiny"]["total"]
        print(f"\nTRL / train_tiny, ratio of the median seconds per update: {ratio:.2f}")
        print("(train_tiny: score is the conditioned/reference scoring, none for GRPO; its old "
              "log-probs come from the first epoch's forward, inside update.\n TRL: score is its "
              "no-grad old log-prob forward; generate is the rest of its rollout preparation, "
              "rewards included, as in train_tiny.)")
        results["ratio"] = ratio
    elif opt.no_trl:
        print("\n--no-trl: only train_tiny was timed.")
    else:
        print("\nTRL is not installed here, so only train_tiny was timed. For the comparison with "
              "TRL's GRPOTrainer:\n    python -m venv .venv-bench && .venv-bench/bin/pip install "
              "-r bench/requirements.txt\n    OMP_NUM_THREADS=1 .venv-bench/bin/python -m bench")
    return results


if __name__ == "__main__":
    main()
