"""bench.py: seconds per policy update, train_tiny against TRL's GRPOTrainer on the same task.

Both sides do the same work, from the same warm-up checkpoint: train_tiny's task and verifier,
16 prompts x 8 samples, temperature 1 without top-k or top-p, at most 48 new tokens, std-normalised
group advantages, the per-response token mean (train_tiny's "sample" mode, TRL's loss_type "grpo"),
clip 0.2, no KL, AdamW at train_tiny's learning rate, grad-norm clip 1.0, 2 optimizer steps per
rollout batch, one CPU thread each. The two alternate in one process, one TRL rollout batch then one
train_tiny update, so both see the same machine load. The first --skip updates of each side are left
out, and the result is the ratio of the medians (TRL / train_tiny).

TRL is a benchmark-only dependency; set it up in a separate virtualenv:

    python -m venv .venv-bench
    .venv-bench/bin/pip install -r requirements-bench.txt

Then, from the project directory (the warm-up checkpoint is made on first use, 2-3 minutes):

    OMP_NUM_THREADS=1 .venv-bench/bin/python bench.py --updates 20 --skip 3
    python bench.py --updates 3        # without TRL: train_tiny's side only
    python bench.py --help

Nothing is downloaded: the model and tokenizer come from runs/warmup-*/, and the hub is set offline.
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

for _name, _value in dict(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                          HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1").items():
    os.environ.setdefault(_name, _value)

import warnings  # noqa: E402

import torch  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")  # TRL 1.16 uses names 5.24 renamed

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_tiny as tt  # noqa: E402

PARTS = ("generate", "score", "update", "total")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="One update = one rollout batch of 16 prompts x 8 samples and its 2 "
                                            "optimizer steps.\nSetup and examples: see the top of bench.py.")
    parser.add_argument("--updates", type=int, default=20, help="policy updates per side (default: 20)")
    parser.add_argument("--skip", type=int, default=3,
                        help="first updates of each side left out of the medians: start-up, allocator and "
                             "Trainer warm-up (default: 3, at most --updates - 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt stream and the sampling (default: 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, shared by both sides (default: 1)")
    parser.add_argument("--no-trl", action="store_true", help="time train_tiny alone, even if TRL is installed")
    parser.add_argument("--stock-positions", action="store_true",
                        help="time TRL as shipped, without the position-id fix (its log-probs are then wrong "
                             "for left-padded prompts; see fix_positions)")
    opt = parser.parse_args(argv)
    if opt.updates < 1 or opt.skip < 0 or opt.threads < 1:
        parser.error(f"need --updates >= 1, --skip >= 0 and --threads >= 1, got {opt.updates}, {opt.skip}, "
                     f"{opt.threads}")
    opt.skip = min(opt.skip, opt.updates - 1)  # keep at least one update to take the median of
    return opt


def load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


# -----------------------------------------------------------------------------
# train_tiny: train_method's set-up, stepped one update at a time

class TinySide:
    def __init__(self, args, ckpt, seed):
        tt.seed_everything(seed)
        self.model, self.tokenizer = load(ckpt)
        self.model.eval()  # as train_method: no dropout, so old and new log-probs agree on-policy
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.0)
        self.sample_groups = tt.sample_groups_fn(self.model, self.tokenizer, args, tt.ProblemStream(args, seed),
                                                 torch.device("cpu"))
        self.args, self.seed, self.step = args, seed, 0

    def update(self):
        self.step += 1
        start = time.perf_counter()
        rec = tt.train_step(self.step, "grpo", self.seed, self.args, self.model, None, self.optimizer,
                            self.tokenizer, self.sample_groups, 0.0, False, [], torch.device("cpu"))
        return dict(total=time.perf_counter() - start, generate=rec["t_generate"], score=rec["t_score"],
                    update=rec["t_update"], length=rec["length"])


# -----------------------------------------------------------------------------
# TRL

def fix_positions(model):
    """Number GPT-2's positions from the attention mask when a caller passes no position_ids.

    Stock TRL 1.16 scores a batch (old log-probs, and the loss) by calling the backbone with input_ids
    and attention_mask only. GPT-2 then numbers positions 0, 1, 2, ... from the left edge, padding
    included, so a left-padded prompt of this task (3 to 10 tokens, padded to the batch's longest) is
    read at positions shifted by its padding, while generate() sampled it at unshifted ones. The
    log-probs TRL trains on are then not those of the sampling distribution: position_error measures
    the gap before each run (0.78 nats per token on average on the default checkpoint, 0 with the
    fix). With the fix TRL computes what train_tiny computes, which numbers positions from the mask
    in score() and sample_tokens(). `fix.enabled` switches it.
    """
    backbone = model.base_model  # what TRL's fused LM head calls
    forward = backbone.forward

    def forward_with_positions(*a, **kw):
        mask = kw.get("attention_mask")
        if (fix.enabled and kw.get("position_ids") is None and kw.get("past_key_values") is None
                and kw.get("cache") is None and mask is not None and mask.dim() == 2):
            kw["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return forward(*a, **kw)

    fix = forward_with_positions
    fix.enabled = True
    backbone.forward = forward_with_positions
    return fix


# TRL times its steps with profiling contexts but reports them only to wandb/mlflow/trackio: keep them here.
PROFILE = []  # (name, seconds, grad enabled)


def capture_profile():
    import trl.extras.profiling as profiling
    log = profiling.ProfilingContext._log_metrics

    def keep(self, duration):
        PROFILE.append((self.name, duration, torch.is_grad_enabled()))
        return log(self, duration)

    profiling.ProfilingContext._log_metrics = keep


def make_trainer(args, ckpt, seed, updates, callbacks):
    import tempfile
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer
    model, tokenizer = load(ckpt)
    fix = fix_positions(model)
    problems = tt.ProblemStream(args, seed).next(args.prompts_per_step * updates)  # train_tiny's prompts, in order
    dataset = Dataset.from_dict({"prompt": tt.prompt_texts(args, problems), "terms": problems})
    eos = tokenizer.eos_token_id
    lengths = []

    def exact_verifier(prompts, completions, completion_ids, terms, **kwargs):
        # TRL cuts each completion after its first <eos> and decodes it without special tokens
        lengths.append(statistics.mean(len(ids) for ids in completion_ids))
        return [float(tt.verify(t, text, len(ids) > 0 and ids[-1] == eos))
                for text, ids, t in zip(completions, completion_ids, terms)]

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), report_to="none", save_strategy="no", disable_tqdm=True,
        use_cpu=True, seed=seed, shuffle_dataset=False, dataloader_num_workers=0,
        # one rollout batch = one optimizer batch = 16 prompts x 8 completions, used for update_epochs steps
        per_device_train_batch_size=args.prompts_per_step * args.group_size, gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=args.group_size, num_iterations=args.update_epochs,
        max_steps=args.update_epochs * updates, logging_steps=args.update_epochs,
        max_completion_length=args.max_new_tokens, temperature=args.temperature, top_k=0, top_p=1.0,
        min_p=None, repetition_penalty=1.0,
        loss_type="grpo", scale_rewards="group", importance_sampling_level="token", beta=0.0,
        epsilon=args.eps_low, epsilon_high=args.eps_high, mask_truncated_completions=False,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        # GRPOConfig defaults to bf16 autocast and activation checkpointing; train_tiny runs in float32 and
        # keeps its activations
        bf16=False, fp16=False, activation_checkpointing=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=exact_verifier, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=callbacks)
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    return trainer, fix, lengths


@torch.no_grad()
def position_error(trainer, fix, args, ckpt, seed):
    """Mean |log-prob difference| per response token between TRL's scoring forward and train_tiny.score,
    on 16 x 8 responses sampled by train_tiny.generate: (stock TRL, TRL with fix_positions)."""
    model, tokenizer = load(ckpt)
    model.eval()
    tt.seed_everything(seed + 1)
    problems = tt.ProblemStream(args, seed + 1).next(args.prompts_per_step)
    responses, mask, _, _ = tt.generate(model, tokenizer, args, problems, args.group_size, False, "cpu")
    flat = [t for t in problems for _ in range(args.group_size)]
    reference = tt.score(model, tokenizer, args, flat, responses, mask)[0][0]
    prompt_ids, prompt_mask = tt.tokenize_prompts(tokenizer, tt.prompt_texts(args, flat), "cpu")
    ids, attention = torch.cat([prompt_ids, responses], 1), torch.cat([prompt_mask, mask.long()], 1)
    errors = []
    for enabled in (False, True):
        fix.enabled = enabled
        logp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, responses.shape[1])[0]
        errors.append(float((logp - reference).abs()[mask].mean()))
    fix.enabled = True
    return errors


def trl_batch(profile, wall):
    """Split one TRL rollout batch like train_step's record: generate = rollout preparation (sampling,
    decoding, rewards, advantages) but for the no-grad old log-prob forward, which is score."""
    prepare = sum(s for name, s, _ in profile if name.endswith("._prepare_inputs"))
    score = sum(s for name, s, grad in profile if name.endswith("._get_per_token_logps_and_entropies") and not grad)
    return dict(total=wall, generate=prepare - score, score=score, update=wall - prepare)


def run_alternating(args, ckpt, opt, tiny):
    """Train TRL for opt.updates rollout batches; after each, outside TRL's clock, one train_tiny update."""
    from transformers import TrainerCallback
    capture_profile()
    trl_rows, tiny_rows = [], []

    class Alternate(TrainerCallback):
        def on_train_begin(self, *a, **kw):
            self.start, self.mark = time.perf_counter(), len(PROFILE)

        def on_step_end(self, train_args, state, control, **kw):
            if state.global_step % args.update_epochs:
                return  # the rollout batch has more optimizer steps to run
            trl_rows.append(trl_batch(PROFILE[self.mark:], time.perf_counter() - self.start))
            tiny_rows.append(tiny.update())
            progress(len(trl_rows), opt, trl=trl_rows[-1], tiny=tiny_rows[-1])
            self.start, self.mark = time.perf_counter(), len(PROFILE)

    trainer, fix, lengths = make_trainer(args, ckpt, opt.seed, opt.updates, [Alternate()])
    stock, fixed = position_error(trainer, fix, args, ckpt, opt.seed)
    print(f"positions: TRL's log-probs differ from train_tiny.score's by {stock:.3f} nats per token as shipped, "
          f"by {fixed:.1e} with bench.py's fix ({'not ' if opt.stock_positions else ''}used below)")
    fix.enabled = not opt.stock_positions
    trainer.train()
    for row, length in zip(trl_rows, lengths):
        row["length"] = length
    if torch.get_num_threads() != opt.threads:
        print(f"warning: torch now uses {torch.get_num_threads()} threads, not {opt.threads}")
    return tiny_rows, trl_rows


def progress(k, opt, **sides):
    if k == 1 or k % 5 == 0 or k == opt.updates:
        print(f"update {k:3d}/{opt.updates}: " + ", ".join(f"{name} {row['total']:.2f} s" for name, row in
                                                          sides.items()), flush=True)


def medians(rows, skip):
    return {key: statistics.median(r[key] for r in rows[skip:]) for key in rows[0] if key in PARTS + ("length",)}


def main(argv=None):
    opt = parse_args(argv)
    torch.set_num_threads(opt.threads)
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    base = tt.Args()
    # train_tiny's grpo run, without its held-out evaluations inside the timed loop
    args = tt.method_args(base, "grpo", {})
    args = dataclasses.replace(args, steps=10 ** 9, eval_every=10 ** 9)
    _, _, ckpt = tt.load_or_warm_up(base, torch.device("cpu"), os.path.join(HERE, "runs"))  # makes it once
    try:
        import trl
        have_trl = not opt.no_trl
    except ImportError:
        trl, have_trl = None, False
    print(f"bench: {opt.updates} updates per side, medians over the last {opt.updates - opt.skip}; "
          f"{args.prompts_per_step} prompts x {args.group_size} samples, {args.max_new_tokens} new tokens, "
          f"{args.update_epochs} optimizer steps per batch, lr {args.lr:g}; {opt.threads} thread(s); "
          f"torch {torch.__version__}, transformers {transformers.__version__}"
          + (f", trl {trl.__version__}" if have_trl else ""), flush=True)
    tiny = TinySide(args, ckpt, opt.seed)
    if have_trl:
        tiny_rows, trl_rows = run_alternating(args, ckpt, opt, tiny)
    else:
        tiny_rows, trl_rows = [], None
        for k in range(1, opt.updates + 1):
            tiny_rows.append(tiny.update())
            progress(k, opt, train_tiny=tiny_rows[-1])

    print(f"\nseconds per update, median of updates {opt.skip + 1}-{opt.updates} (each column its own median)")
    print(f"{'':16s}" + "".join(f"{p:>10s}" for p in PARTS) + f"{'mean len':>10s}")
    results = dict(train_tiny=medians(tiny_rows, opt.skip))
    if trl_rows:
        results["TRL GRPOTrainer"] = medians(trl_rows, opt.skip)
    for name, m in results.items():
        print(f"{name:16s}" + "".join(f"{m[p]:10.3f}" for p in PARTS) + f"{m['length']:10.1f}")
    if trl_rows:
        ratio = results["TRL GRPOTrainer"]["total"] / results["train_tiny"]["total"]
        print(f"\nTRL / train_tiny, ratio of the median seconds per update: {ratio:.2f}")
        print("(train_tiny: score is the conditioned/reference scoring, none for GRPO; its old log-probs come from "
              "the first epoch's forward, inside update.\n TRL: score is its no-grad old log-prob forward; "
              "generate is the rest of its rollout preparation, rewards included, as in train_tiny.)")
        results["ratio"] = ratio
    elif not opt.no_trl:
        print("\nTRL is not installed here, so only train_tiny was timed. For the comparison with TRL's "
              "GRPOTrainer:\n    python -m venv .venv-bench && .venv-bench/bin/pip install -r requirements-bench.txt"
              "\n    OMP_NUM_THREADS=1 .venv-bench/bin/python bench.py")
    return results


if __name__ == "__main__":
    main()
