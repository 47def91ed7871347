"""tokencredit_trl/tiny.py: train_tiny's task through TokenCreditGRPOTrainer, with its flags.

    python -m tokencredit_trl --loss-mode sample --steps 60 --seed 0    # train_tiny's flags
    python -m tokencredit_trl --preset dapo                             # or cscr, ...

train_tiny's warm-up checkpoint, prompts, verifier and held-out evaluation; the same run from a
YAML file in TRL's own names is train.py's. See docs/trl.md.
"""

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
from trl import GRPOConfig

import tokencredit as tc
from tokencredit_trl.grpo_trainer import Credit, TokenCreditGRPOTrainer, high_entropy_weights


def tiny_data(args, seed: int, num_problems: int, eos_id: int):
    """train_tiny's prompts (its stream, in order) as a dataset, and the reward functions: the
    verifier (first; it appends each batch's mean completion length to verifier.lengths) and,
    with overlong_shaping, DAPO's soft overlong penalty."""
    import tiny_task
    from datasets import Dataset
    problems = tiny_task.ProblemStream(args, seed).next(num_problems)
    dataset = Dataset.from_dict({"prompt": tiny_task.prompt_texts(problems), "terms": problems})
    lengths = []

    def verifier(prompts, completions, completion_ids, terms, **kwargs):
        # TRL cuts each completion after its first <eos> and decodes it without special tokens
        lengths.append(statistics.mean(len(ids) for ids in completion_ids))
        return [args.reward_correct if tiny_task.verify(t, text, len(ids) > 0 and ids[-1] == eos_id)
                else args.reward_wrong for text, ids, t in zip(completions, completion_ids, terms)]

    verifier.lengths = lengths
    reward_funcs = [verifier]
    if args.overlong_shaping:  # DAPO's soft overlong punishment, a reward of its own: the
        def overlong(completion_ids, **kwargs):  # dynamic sampling filters on the verifier's
            lengths = torch.tensor([len(ids) for ids in completion_ids])  # tokens, <eos> too
            return tc.overlong_penalty(lengths, args.max_new_tokens, args.overlong_cache).tolist()
        reward_funcs.append(overlong)
    return dataset, reward_funcs


def tiny_setup(args, seed: int, updates: int, device, eos_id: int, **config):
    """GRPOConfig, dataset and reward functions for `updates` rollout batches of train_tiny's task,
    set up as train_tiny trains: B x G samples at its temperature (no top-k/p), its budget,
    learning rate, update_epochs optimizer steps per batch, grad clip 1.0, float32. `config`
    overrides GRPOConfig fields; tiny_data gives the dataset and reward functions."""
    dataset, reward_funcs = tiny_data(args, seed, args.prompts_per_step * updates, eos_id)
    settings = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-tokencredit-"), report_to="none",
        save_strategy="no", disable_tqdm=True, use_cpu=torch.device(device).type == "cpu",
        seed=seed, shuffle_dataset=False, dataloader_num_workers=0,
        # one rollout batch = one optimizer batch = B prompts x G completions, update_epochs steps
        per_device_train_batch_size=args.prompts_per_step * args.group_size,
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=args.group_size,
        num_iterations=args.update_epochs, max_steps=args.update_epochs * updates,
        logging_steps=args.update_epochs, max_completion_length=args.max_new_tokens,
        temperature=args.temperature, top_k=0, top_p=1.0, min_p=None, repetition_penalty=1.0,
        beta=args.beta, use_bias_correction_kl=False, epsilon=args.eps_low,
        epsilon_high=args.eps_high, mask_truncated_completions=False, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        # GRPOConfig defaults to bf16 autocast and activation checkpointing; train_tiny runs in
        # float32 and keeps its activations
        bf16=False, fp16=False, activation_checkpointing=False)
    return GRPOConfig(**{**settings, **config}), dataset, reward_funcs


METHOD_FLAGS = ("loss_mode", "adv_scale", "baseline", "surrogate", "ratio_level", "eps_low",
                "eps_high", "beta", "entropy_top", "reward_correct", "reward_wrong",
                "dynamic_sampling", "max_sampling_rounds", "overlong_shaping", "overlong_cache",
                "cscr_strength", "cscr_threshold", "cond_pos", "cond_neg", "device", "log_every")
NOT_BRIDGED = ("opsd",)  # self-distillation: no loss of TRL's GRPOTrainer to put it in


def parse_args(argv=None):
    """Returns (train_tiny's Args with the flags given, the bridge's own options)."""
    import train_tiny as tt
    parser = argparse.ArgumentParser(
        prog="python -m tokencredit_trl",
        description="Train train_tiny's warm-up checkpoint on its task through "
                    "TokenCreditGRPOTrainer\n(TRL's GRPOTrainer with tokencredit's advantages and "
                    "loss); print the held-out accuracy before and after.",
        epilog="As train_tiny: 16 prompts x 8 samples per rollout batch, 48 new tokens, "
               "temperature 1, lr 1e-4,\n2 optimizer steps per batch, grad clip 1.0; the method "
               "flags are train_tiny's, with its defaults.\nSee docs/trl.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    tt.add_arguments(parser, METHOD_FLAGS)
    presets = [name for name in tt.PRESETS if name not in NOT_BRIDGED]
    parser.add_argument("--preset", choices=presets, default=None,
                        help="one of train_tiny's presets (its flags given override it); "
                             "default: train_tiny's defaults (GRPO)")
    parser.add_argument("--steps", type=int, default=60,
                        help="rollout batches (train_tiny's policy updates) (default: 60)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the prompts and the sampling (default: 0)")
    opt = vars(parser.parse_args(argv))
    steps, seed, preset = opt.pop("steps"), opt.pop("seed"), opt.pop("preset")
    preset = tt.PRESETS[preset] if preset else {}
    args = dataclasses.replace(tt.Args(), **{**preset, **opt})  # the preset, then the flags
    if steps < 1:
        parser.error(f"--steps must be >= 1, got {steps}")
    return args, argparse.Namespace(steps=steps, seed=seed)


def tiny_credit(args) -> Credit:
    """train_tiny's method as a Credit: every choice given, with train_tiny's eps (1e-6), its
    dynamic sampling (on the verifier) and CSCR (strength 0: off, as in train_tiny)."""
    top, cscr = args.entropy_top, args.cscr_strength > 0
    return Credit(mode=args.loss_mode, surrogate=args.surrogate, ratio_level=args.ratio_level,
                  adv_scale=args.adv_scale, baseline=args.baseline, adv_eps=1e-6,
                  token_weights_fn=None if top == 1 else high_entropy_weights(top),
                  dynamic_sampling=args.dynamic_sampling, max_rounds=args.max_sampling_rounds,
                  filter_reward="verifier" if args.dynamic_sampling else None,
                  cscr_strength=args.cscr_strength if cscr else None,
                  cscr_threshold=args.cscr_threshold, cond_pos=args.cond_pos if cscr else None,
                  cond_neg=args.cond_neg if cscr else None)


def main(argv=None) -> dict:
    import tiny_task
    import train_tiny as tt
    args, opt = parse_args(argv)
    try:
        tt.validate_args(args)
        tt.check_method(args)
        credit = tiny_credit(args)
        device = tiny_task.pick_device(args.device)
    except ValueError as error:  # a bad method flag, --device cuda without CUDA: one clear line
        sys.exit(f"python -m tokencredit_trl: error: {error}")
    if device.type == "mps":
        device = torch.device("cpu")  # TRL on MPS is untested here
    config, dataset, reward_funcs = tiny_setup(args, opt.seed, opt.steps, device,
                                               tiny_task.build_tokenizer().eos_token_id)
    return train_on_tiny_task(args, config, dataset, reward_funcs, opt.steps, credit=credit)


def steps_per_rollout(config) -> int:
    """Optimizer steps per rollout (generation) batch."""
    return max(1, config.num_iterations * config.steps_per_generation
               // config.gradient_accumulation_steps)


def train_on_tiny_task(args, config, dataset, reward_funcs, updates: int, **trainer_kwargs):
    """Train train_tiny's warm-up checkpoint (made on first use, cached in tokencredit_trl/runs)
    with TokenCreditGRPOTrainer(args=config, **trainer_kwargs) for `updates` rollout batches of
    num_iterations optimizer steps each; print a line per log_every batches (dynamic sampling's
    rounds among them) and the held-out accuracy before and after (the main process only).
    Returns the accuracies, the wall time and the mean generation rounds per batch."""
    import tiny_task
    import train_tiny as tt
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")  # TRL's names
    tiny_task.quiet_transformers()
    state = PartialState(cpu=config.use_cpu)
    main_process = state.is_main_process
    device = state.device
    if main_process:
        print(tiny_task.describe_device(device, "cpu" if config.use_cpu else "auto"), flush=True)
    runs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs")
    with state.main_process_first():  # one process warms up, the others read its checkpoint
        _, tokenizer, ckpt = tiny_task.load_or_warm_up(args, device, runs)
    held_out = tt.held_out_problems(args)
    tiny_task.seed_everything(config.seed)
    model = AutoModelForCausalLM.from_pretrained(ckpt).to(device)
    if main_process:
        start = tt.evaluate(model.eval(), tokenizer, args, held_out, device)
        print(f"start: held-out greedy {start['accuracy']:.3f}, sampled "
              f"{start['sampled_accuracy']:.3f}", flush=True)
    begin, every = time.time(), steps_per_rollout(config)

    class Progress(TrainerCallback):
        def on_log(self, train_args, state, control, logs=None, **kw):
            batch = state.global_step // every
            if (state.is_world_process_zero and logs and "reward" in logs
                    and (batch % args.log_every == 0 or batch in (1, updates))):
                rounds = (f" rounds {logs['ds/rounds']:.0f} kept {logs['ds/groups_kept']:.0f}"
                          if "ds/rounds" in logs else "")
                print(f"batch {batch:3d}/{updates} reward {logs['reward']:.2f} length "
                      f"{logs.get('completions/mean_length', float('nan')):.1f} entropy "
                      f"{logs['entropy']:.3f} clip low {logs.get('tc/clip_frac_low', 0):.3f} "
                      f"high {logs.get('tc/clip_frac_high', 0):.3f}{rounds} "
                      f"({time.time() - begin:.0f} s)", flush=True)

    trainer = TokenCreditGRPOTrainer(model=model, reward_funcs=reward_funcs, args=config,
                                     train_dataset=dataset, processing_class=tokenizer,
                                     callbacks=[Progress()], **trainer_kwargs)
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    trainer.train()
    wall = time.time() - begin
    rounds = [r["ds/rounds"] for r in trainer.state.log_history if "ds/rounds" in r]
    rounds = statistics.mean(rounds) if rounds else 1.0  # per rollout batch (= update)
    if not main_process:
        return dict(wall_s=wall, rounds=rounds)
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    end = tt.evaluate(model, tokenizer, args, held_out, model.device)
    print(f"end after {updates} rollout batches ({wall:.0f} s, {wall / updates:.2f} s and "
          f"{rounds:.2f} generation rounds per batch): held-out greedy "
          f"{start['accuracy']:.3f} -> {end['accuracy']:.3f}, sampled "
          f"{start['sampled_accuracy']:.3f} -> {end['sampled_accuracy']:.3f}", flush=True)
    return dict(start=start, end=end, wall_s=wall, rounds=rounds)
