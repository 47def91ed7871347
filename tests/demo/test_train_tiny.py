"""train_tiny.py: sampling and scoring, one update, the command line and whole runs, the parser (flags, TRL's
names, YAML and JSON), the saved config and policy, and one real run that must learn (slow).

Tests that compare numbers across runs ask for --device cpu; the others accept what auto picks.
"""

import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from lab import cli, credit, learning
import tokencredit as tc
import tiny_task
import train_tiny as tt

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# -----------------------------------------------------------------------------
# sampling and scoring: the log-probs trained on are those of the distribution sampled from

def tiny_policy(seed=0, device="cpu"):
    torch.manual_seed(seed)
    tokenizer = tiny_task.build_tokenizer()
    return tiny_task.build_tiny_model(tt.Args(n_layer=1, n_embd=32, n_head=2), tokenizer).to(device).eval(), tokenizer


def test_token_logprobs_hand_worked_and_float32():
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 2.0]]])  # (1, 2, 2): p = (1/4, 3/4), (1/2, 1/2)
    assert torch.allclose(tiny_task.token_logprobs(logits, torch.tensor([[1, 0]])),
                          torch.tensor([[math.log(0.75), math.log(0.5)]]))
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, 7, generator=g)
    targets = torch.randint(0, 7, (3, 5), generator=g)
    ref = torch.tensor([[math.log(torch.softmax(logits[n, t], -1)[targets[n, t]]) for t in range(5)] for n in range(3)])
    assert torch.allclose(tiny_task.token_logprobs(logits, targets), ref, atol=1e-6)
    got_bf16 = tiny_task.token_logprobs(logits.bfloat16(), targets)
    assert got_bf16.dtype == torch.float32
    assert torch.allclose(got_bf16, tiny_task.token_logprobs(logits.bfloat16().float(), targets))


@pytest.mark.parametrize("device", DEVICES)
def test_scored_logprobs_equal_the_sampling_distribution(device):
    """score() (one forward over left-padded prompts + responses) gives the log-probs sample_tokens() drew from."""
    model, tokenizer = tiny_policy(device=device)
    args = tt.Args(max_new_tokens=10)
    problems = [[1, 2], [3, 4, 5, 6], [7, 8, 9]]  # prompts of different lengths: left padding matters
    ids, attention = tiny_task.tokenize_prompts(tokenizer, tiny_task.prompt_texts(problems), device)
    torch.manual_seed(1)
    sampled, logits = tiny_task.sample_tokens(model, ids, attention, 10, False, 1.0, tokenizer.eos_token_id)
    mask, _ = tiny_task.response_mask(sampled, tokenizer.eos_token_id)
    (logp, _), = tiny_task.score(model, tokenizer, problems, sampled.masked_fill(~mask, tokenizer.pad_token_id), mask,
                                 args.temperature)
    assert torch.allclose(logp[mask], tiny_task.token_logprobs(logits, sampled)[mask], atol=1e-4)
    assert mask.sum() > 6


def test_sampling_loop_matches_transformers_generate():
    """Greedy decoding with our KV-cache loop writes exactly what model.generate() writes."""
    model, tokenizer = tiny_policy()
    ids, attention = tiny_task.tokenize_prompts(tokenizer, tiny_task.prompt_texts([[1, 2], [3, 4, 5, 6]]), "cpu")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ours, _ = tiny_task.sample_tokens(model, ids, attention, 12, True, 1.0, eos)
    mask, _ = tiny_task.response_mask(ours, eos)
    theirs = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=12, do_sample=False,
                            pad_token_id=pad, eos_token_id=eos)[:, ids.shape[1]:]
    assert torch.equal(ours.masked_fill(~mask, pad), theirs)  # generate() pads after <eos>


def test_micro_batches_by_length_give_the_same_loss_and_gradient():
    """score_by_length (4 length-sorted micro-batches) against one score() call on a fixed batch."""
    model, tokenizer = tiny_policy()
    args = tt.Args(max_new_tokens=16)
    problems = [[1, 2], [3, 4, 5], [7, 8], [9, 9, 9, 9]] * 2
    torch.manual_seed(3)
    _, responses, mask, _, _, _ = tt.rollout(model, tokenizer, args, problems, 1, False, "cpu")
    assert mask.sum(dim=1).min() < mask.sum(dim=1).max()  # different lengths, or this means nothing
    advantages = torch.linspace(-1.5, 1.5, len(problems))
    results = []
    for micro_batches in (1, 4):
        model.zero_grad()
        if micro_batches == 1:
            (logp, logits), = tiny_task.score(model, tokenizer, problems, responses, mask, args.temperature,
                                              need_logits=True)
        else:
            logp, logits = tiny_task.score_by_length(model, tokenizer, problems, responses, mask, args.temperature,
                                                     micro_batches)
        loss, _ = tc.policy_loss(logp, logp.detach() - 0.1 * mask, advantages, mask, mode="token")
        loss.backward()
        results.append((loss.detach(), logp.detach()[mask], logits.detach()[mask],
                        torch.cat([p.grad.flatten() for p in model.parameters()])))
    for one, chunked in zip(*results):
        assert torch.allclose(one, chunked, atol=1e-5)


def test_one_update_moves_log_probs_towards_the_advantage():
    """A small SGD step on policy_loss raises sum_i A_i * (change in log pi(o_i)) on the batch it saw."""
    model, tokenizer = tiny_policy()
    args, problems = tt.Args(max_new_tokens=12), [[1, 2], [3, 4, 5]]
    torch.manual_seed(2)
    flat, responses, mask, _, _, _ = tt.rollout(model, tokenizer, args, problems, 4, False, "cpu")
    advantages = tc.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])).flatten()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    (old, _), = tiny_task.score(model, tokenizer, flat, responses, mask, args.temperature)
    loss, _ = tc.policy_loss(old, old.detach(), advantages, mask, mode="sample")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        (new, _), = tiny_task.score(model, tokenizer, flat, responses, mask, args.temperature)
    change = ((new - old.detach()) * mask).sum(dim=1)  # (N,) change of each response's log-prob
    assert (advantages * change).sum() > 0 and change[advantages > 0].mean() > change[advantages < 0].mean()


# -----------------------------------------------------------------------------
# the command line and whole runs

TINY = ["--quick", "--methods", tt.Args().methods, "--warmup-steps", "30", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--steps", "2",
        "--prompts-per-step", "2", "--group-size", "3", "--eval-size", "8", "--eval-every", "1",
        "--max-new-tokens", "24", "--max-terms", "3", "--log-every", "1"]


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def drop_times(record: dict) -> dict:  # what a run computes, without the seconds it took
    return {k: v for k, v in record.items() if not k.startswith("t_")}


@pytest.mark.slow  # every method, two seeds
def test_smoke_every_method_writes_its_files_on_the_cpu(tmp_path, monkeypatch, capsys):
    """The one test that asks for the CPU by name; what --device auto picks is never assumed."""
    monkeypatch.chdir(tmp_path)
    results = cli.main(TINY + ["--name", "smoke", "--seeds", "0,1", "--device", "cpu"])
    out = capsys.readouterr().out
    assert out.startswith("device: cpu (asked for cpu)") and "| method |" in out
    for title in ("held-out accuracy after 2 policy updates", "One SGD step", "CSCR diagnosis",
                  "rollout statistics", "the starting policy, 3 samples per held-out problem"):
        assert title in out
    run = tmp_path / "runs" / "smoke"
    for name in ("metrics.jsonl", "results.json", "curves.png", "onestep.png", "credit.png"):
        assert (run / name).stat().st_size > 0, name
    records = read_metrics(run / "metrics.jsonl")
    assert len(records) == 5 * 2 * 2  # methods x seeds x steps
    assert [r["method"] for r in results["runs"]] == tt.Args().methods.split(",") * 2
    assert all(0 <= r["final"]["accuracy"] <= 1 for r in results["runs"])
    on_disk = json.loads((run / "results.json").read_text())
    assert json.dumps(on_disk["one_step"]) == json.dumps(results["one_step"])  # NaN != NaN
    # the report reads the run back, and prints the same tables from its compact copy
    cli.report([str(run), "--save", str(tmp_path / "kept")])
    first = capsys.readouterr().out
    cli.report([str(tmp_path / "kept" / "smoke.json")])
    assert capsys.readouterr().out == first and learning.format_results(cli.load_run(str(run))) in first
    diag = results["diagnosis"]
    assert diag["all"]["same_direction"] + diag["all"]["sign_reversal"] == pytest.approx(1.0, abs=0.05)
    assert set(diag["by_class"]) == set(credit.CLASSES)
    tt.main(TINY + ["--name", "again", "--methods", "grpo"])  # the cached warm-up is reused
    assert "warm-up: reusing" in capsys.readouterr().out


def test_impl_trains_with_the_students_file(tmp_path, monkeypatch, capsys):
    """--impl: the reference, as a student's file, gives exactly the direct run's numbers; a file
    with only the GRPO exercises (1, 3, 5) written trains GRPO, and the lab names the exercise each
    measurement it skips needs."""
    from course.source import blank
    monkeypatch.chdir(tmp_path)
    reference = open(tc.__file__).read()
    (tmp_path / "mine.py").write_text(reference)
    (tmp_path / "grpo_only.py").write_text(blank(reference, [2, 4, 6, 7, 8]))
    argv = TINY + ["--methods", "grpo", "--device", "cpu"]
    tt.main(argv + ["--name", "direct"])
    assert f"tokencredit: {tc.__file__}\n" in capsys.readouterr().out
    tt.main(argv + ["--name", "impl", "--impl", "mine.py"])
    assert f"tokencredit: {tmp_path / 'mine.py'}\n" in capsys.readouterr().out
    assert tt.load_tokencredit(tt.Args(impl="mine.py")).__file__ == str(tmp_path / "mine.py")
    assert tt.load_tokencredit(tt.Args()) is tc  # ours, however often --impl loaded another
    direct, impl = (read_metrics(tmp_path / "runs" / name / "metrics.jsonl")
                    for name in ("direct", "impl"))
    assert [drop_times(r) for r in impl] == [drop_times(r) for r in direct] and len(direct) == 2
    capsys.readouterr()
    results = cli.main(argv + ["--name", "partial", "--impl", "grpo_only.py"])
    out = capsys.readouterr().out
    assert len(results["runs"]) == 1 and "pass_at_group" in results
    assert f"tokencredit: {tmp_path / 'grpo_only.py'}\n" in out  # which file it trained with
    assert "one_step skipped: your tokencredit.py has not implemented exercise 7" in out
    assert "diagnosis skipped: your tokencredit.py has not implemented exercise" in out


def test_presets_and_overrides():
    base, runs, given = tt.parse_args(["--methods", "grpo,dapo", "--eps-high", "0.5", "--steps", "7", "--seeds", "3,4"])
    (_, grpo), (_, dapo) = runs
    assert base.steps == 7 and grpo.steps == 7 and base.seeds == "3,4"
    assert given == dict(methods="grpo,dapo", eps_high=0.5, steps=7, seeds="3,4")
    assert grpo.eps_high == 0.5 and dapo.eps_high == 0.5  # the user's value beats every preset
    assert grpo.loss_mode == "sample" and dapo.loss_mode == "token" and dapo.dynamic_sampling
    assert dapo.reward_wrong == -1.0 and grpo.reward_wrong == 0.0 and grpo.surrogate == "clip"
    _, runs, _ = tt.parse_args(["--methods", "cscr,drgrpo", "--cscr-strength", "4", "--surrogate", "reinforce"])
    assert [(label, a.cscr_strength) for label, a in runs] == [("cscr", 4.0), ("drgrpo", 4.0)]
    assert all(a.surrogate == "reinforce" for _, a in runs) and runs[1][1].loss_mode == "constant"


def test_same_seed_same_metrics_and_reinforce_from_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = TINY + ["--methods", "dapo,cscr", "--device", "cpu"]
    tt.main(argv + ["--name", "a"])
    tt.main(["--config", "runs/a/config.json", "--name", "b"])  # the saved config reruns it
    a = [drop_times(r) for r in read_metrics(tmp_path / "runs" / "a" / "metrics.jsonl")]
    b = [drop_times(r) for r in read_metrics(tmp_path / "runs" / "b" / "metrics.jsonl")]
    assert a == b and len(a) == 4
    tt.main(TINY + ["--methods", "grpo", "--surrogate", "reinforce", "--name", "reinforce"])
    records = read_metrics(tmp_path / "runs" / "reinforce" / "metrics.jsonl")
    assert records and all("num_tokens" in r and "clip_frac_low" not in r for r in records)  # no ratio, no clip


def test_interrupt_still_writes_the_summary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real_step = tt.train_step

    def interrupt_at_second_step(step, *args, **kwargs):
        if step == 2:
            raise KeyboardInterrupt
        return real_step(step, *args, **kwargs)

    monkeypatch.setattr(tt, "train_step", interrupt_at_second_step)
    results = tt.main(TINY + ["--name", "stopped", "--steps", "5"])
    assert results["interrupted"] and len(results["runs"]) == 1  # stops after the interrupted method
    on_disk = json.loads((tmp_path / "runs" / "stopped" / "results.json").read_text())
    assert on_disk["runs"][0]["steps"] == 1 and on_disk["runs"][0]["interrupted"]
    assert len(read_metrics(tmp_path / "runs" / "stopped" / "metrics.jsonl")) == 1


def test_dynamic_sampling_filters_on_correctness(tmp_path, monkeypatch):
    """DAPO's filter reads the verifier's verdicts, not the reward the overlong penalty has shaped."""
    monkeypatch.chdir(tmp_path)
    seen, real_fill_batch = [], tc.fill_batch

    def spy(*args, **kwargs):
        seen.append(kwargs.get("filter_key"))
        return real_fill_batch(*args, **kwargs)

    monkeypatch.setattr(tc, "fill_batch", spy)
    tt.main(TINY + ["--methods", "dapo", "--name", "dapo"])
    assert seen and set(seen) == {"correct"}


@pytest.mark.parametrize("argv, message", [
    (["--methods", "grpo,ppo"], "unknown method 'ppo'"),
    (["--group-size", "1"], "--group-size must be >= 2"),
    (["--steps", "-3"], "--steps must be >= 0, got -3"),
    (["--lr", "-1"], "--lr must be > 0, got -1.0"),
    (["--name", "../../x"], "--name must be a plain folder name under runs/"),
    (["--loop-rate", "0.9", "--recheck-rate", "0.2"], "--recheck-rate + --loop-rate must be <= 1"),
    (["--slip-rate", "1.5"], "--slip-rate must be in [0, 1], got 1.5"),
    (["--misconception", "12"], "--misconception must list addends in 0..max_value = 9"),
    (["--max-new-tokens", "120"], "leaves no room for a prompt"),
    (["--micro-batches", "-1"], "--micro-batches must be >= 0"),
    (["--n-embd", "30"], "--n-embd must be a multiple of --n-head, got 30 and 4"),
    (["--pg-coef", "0"], "--pg-coef and --distill-coef must be >= 0 and not both 0"),
    # the method's own arguments are checked by tokencredit, before any work starts
    (["--loss-mode", "seq"], "mode must be one of ('sample', 'token', 'group_token', 'constant'), got 'seq'"),
    (["--adv-scale", "mad"], "scale must be one of ('std', 'batch', 'none'), got 'mad'"),
    (["--surrogate", "ppo"], "surrogate must be one of ('clip', 'reinforce'), got 'ppo'"),
    (["--eps-low", "-0.1"], "eps_low must be a number >= 0, got -0.1"),
    (["--beta", "-1"], "beta must be a finite number >= 0, got -1.0"),
    (["--cond-neg", "Y"], "--cond-pos and --cond-neg must differ"),
    (["--cscr-strength", "-2"], "strength must be a finite number >= 0, got -2.0"),
    (["--reward-wrong", "nan"], "rewards must be finite"),
    (["--methods", "dapo", "--overlong-cache", "60"], "cache_len must be an int in (0, max_len = 48], got 60"),
])
def test_bad_arguments(argv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tt.parse_args(argv)


# -----------------------------------------------------------------------------
# the parser: flags, TRL's names, YAML and JSON; the saved config and the saved policy

TRL_ARGV = ["--num-generations", "4", "--max-completion-length", "40", "--learning-rate", "3e-4",
            "--epsilon", "0.1", "--epsilon-high", "0.3", "--num-iterations", "1",
            "--importance-sampling-level", "sequence", "--top-entropy-quantile", "0.5", "--seed", "7"]
OURS_ARGV = ["--group-size", "4", "--max-new-tokens", "40", "--lr", "3e-4", "--eps-low", "0.1",
             "--eps-high", "0.3", "--update-epochs", "1", "--ratio-level", "sequence", "--entropy-top", "0.5",
             "--seeds", "7"]
# TRL 1.16's loss_type whose token weights are a loss_mode's: grpo divides each response by its length,
# dr_grpo by max_completion_length, dapo by the batch's tokens, and so does bnpo here (one process, the
# whole batch in one loss); docs/translation.md has the others
TRL_LOSS_TYPES = dict(grpo="sample", dr_grpo="constant", dapo="token", bnpo="token")


def test_grpo_configs_names_are_ours():
    methods = ["--methods", "grpo,dapo"]
    assert tt.parse_args(methods + TRL_ARGV) == tt.parse_args(methods + OURS_ARGV)
    base, (grpo, dapo), _ = tt.parse_args(methods + TRL_ARGV)
    assert (grpo[1].group_size, dapo[1].eps_low, dapo[1].eps_high, grpo[1].lr, base.seeds) == (4, 0.1, 0.3, 3e-4, "7")
    assert (grpo[1].update_epochs, grpo[1].max_new_tokens, grpo[1].ratio_level, grpo[1].entropy_top) == \
        (1, 40, "sequence", 0.5)
    assert tt.parse_args(["--group_size", "4", "--eps_high", "0.3"]) == tt.parse_args(["--group-size", "4", "--eps-high", "0.3"])


def test_trl_loss_types_weigh_tokens_as_trl_does():
    """Each loss_type with a loss_mode gives the loss TRL 1.16's GRPOTrainer._compute_loss computes from the
    same per-token losses, one process, one micro-batch (its lines for each type, written out here)."""
    g = torch.Generator().manual_seed(0)
    per_token, L = torch.randn(6, 9, generator=g, dtype=torch.float64), 12  # L: max_completion_length
    mask = torch.zeros(6, 9, dtype=torch.float64)
    for i, length in enumerate((1, 9, 4, 7, 2, 9)):
        mask[i, :length] = 1
    trl = dict(grpo=((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean(),
               bnpo=(per_token * mask).sum() / mask.sum().clamp(min=1.0),
               dr_grpo=(per_token * mask).sum() / (per_token.size(0) * L),
               dapo=(per_token * mask).sum() / mask.sum())  # num_items_in_batch: the batch's tokens
    for loss_type, loss in trl.items():
        _, ((_, args),), _ = tt.parse_args(["--methods", "grpo", "--loss-mode", TRL_LOSS_TYPES[loss_type]])
        ours = tc.aggregate(per_token, mask, args.loss_mode, group_size=3, max_len=L)
        assert torch.allclose(ours.double(), loss), loss_type


@pytest.mark.parametrize("loss_type", ["grpo", "cispo", "sapo", "luspo", "vespo"])
def test_trl_loss_type_is_not_a_flag(loss_type):
    """TRL's loss_type names other weightings than loss_mode's (docs/translation.md): refused, not guessed."""
    with pytest.raises(ValueError, match=f"unrecognized arguments: --loss-type {loss_type}"):
        tt.parse_args(["--loss-type", loss_type])


def test_help_lists_each_flag_once():
    help_text = tt.argument_parser().format_help()
    text = help_text[help_text.index("\noptions:\n"):help_text.index("\npresets")]  # after the usage line
    for f in dataclasses.fields(tt.Args):
        flag = "--" + f.name.replace("_", "-")
        assert len(re.findall(re.escape(flag) + r"[ ,\n]", text)) == 1, flag
    assert not re.findall(r"--[a-z]+_", text)  # --min-terms alone, not --min_terms beside it
    assert text.count("--num-generations") == 1 and "(default: 8)" in text and "  dapo      " in help_text


def test_config_file_in_yaml_or_json_and_flags_win(tmp_path):
    yaml_file, json_file = tmp_path / "run.yaml", tmp_path / "run.json"
    yaml_file.write_text("# a TRL-style file: GRPOConfig's names and ours\nnum_generations: 4\n"
                         "max_completion_length: 40\nlearning_rate: 3e-4  # PyYAML reads this as text\n"
                         "epsilon: 0.1\nepsilon_high: 0.3\nnum_iterations: 1\nimportance_sampling_level: sequence\n"
                         "top_entropy_quantile: 0.5\nseed: 7\nmethods: grpo,dapo\nloss_mode: constant\n"
                         "misconception: 5\nmax_value: 5\ndynamic_sampling: true\n")
    json_file.write_text(json.dumps(dict(methods="grpo,dapo", group_size=4, max_new_tokens=40, lr=3e-4,
                                         eps_low=0.1, eps_high=0.3, update_epochs=1, ratio_level="sequence",
                                         entropy_top=0.5, seeds="7", loss_mode="constant", misconception="5",
                                         max_value=5, dynamic_sampling=True)))
    flags = OURS_ARGV + ["--methods", "grpo,dapo", "--loss-mode", "constant", "--misconception", "5",
                         "--max-value", "5", "--dynamic-sampling"]
    assert tt.parse_args(["--config", str(yaml_file)]) == tt.parse_args(flags)
    assert tt.parse_args(["--config", str(json_file)]) == tt.parse_args(flags)
    base, runs, _ = tt.parse_args(["--config", str(yaml_file), "--seeds", "1,2", "--epsilon-high", "0.25"])
    assert base.seeds == "1,2" and [a.eps_high for _, a in runs] == [0.25, 0.25] and base.group_size == 4


@pytest.mark.parametrize("text, message", [
    ("num_generations: four\n", "--config CONFIG: argument --group_size/--group-size/--num-generations/"
                                "--num_generations: invalid int value: 'four'"),
    ("group_size: 4.5\n", "--config CONFIG: argument --group_size/--group-size/--num-generations/--num_generations: "
                          "invalid int value: '4.5'"),
    ("dynamic_sampling: maybe\n", "--config CONFIG: argument --dynamic_sampling/--dynamic-sampling: Truthy value "
                                  "expected: got maybe"),
    ("num_iterations: true\n", "--config CONFIG: argument --update_epochs/--update-epochs/--num-iterations/"
                               "--num_iterations: invalid int value: 'True'"),
    ("lr: fast\n", "--config CONFIG: argument --lr/--learning-rate/--learning_rate: invalid float value: 'fast'"),
    ("per_device_train_batch_size: 8\n", "--config CONFIG: unknown arguments ['--per_device_train_batch_size=8']"),
    ("loss_type: sapo\n", "--config CONFIG: unknown arguments ['--loss_type=sapo']"),
    ("- grpo\n", "--config CONFIG: expected a mapping of argument names to values, got list"),
    ("steps: -3\n", "--steps must be >= 0, got -3"),  # in range: Args checks it, whoever gave it
])
def test_bad_config_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message.replace("CONFIG", str(path)))):
        tt.parse_args(["--config", str(path)])
    with pytest.raises(ValueError, match=re.escape("--config must name a .yaml, .yml or .json file, got 'run.txt'")):
        tt.parse_args(["--config", "run.txt"])


def test_the_saved_config_reruns_the_run_and_the_saved_policy_samples(tmp_path, monkeypatch):
    """runs/<name>/config.json gives the same arguments, and each preset's still applies under it (the same
    arguments give the same numbers: test_same_seed_same_metrics...); the trained policy loads with
    from_pretrained from its folder, offline, holds the trained weights, and samples as it did in the run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    trained, real_train_method = {}, tt.train_method

    def keep_trained(label, args, seed, *rest):
        history, interrupted, model = real_train_method(label, args, seed, *rest)
        trained[label] = {k: v.clone() for k, v in model.state_dict().items()}
        return history, interrupted, model

    monkeypatch.setattr(tt, "train_method", keep_trained)
    # the warm-up of TINY gets every answer wrong: a length penalty over the whole budget gives a gradient
    argv = TINY + ["--methods", "grpo", "--eps-high", "0.3", "--overlong-shaping", "--overlong-cache", "24",
                   "--device", "cpu", "--name", "first"]
    results = tt.main(argv)
    saved = "runs/first/config.json"
    assert tt.parse_args(["--config", saved])[:2] == tt.parse_args(argv)[:2]  # the same base and runs
    assert json.loads(open(saved).read())["eps_high"] == 0.3 and "loss_mode" not in open(saved).read()
    both = tt.parse_args(["--config", saved, "--methods", "grpo,drgrpo"])
    assert both[:2] == tt.parse_args(argv + ["--methods", "grpo,drgrpo"])[:2]
    assert [(a.loss_mode, a.eps_high) for _, a in both[1]] == [("sample", 0.3), ("constant", 0.3)]
    base = tt.Args(**results["config"])
    for run in results["runs"]:
        folder = tmp_path / "runs" / "first" / f"{run['method']}-seed0"
        model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
        saved, start = model.state_dict(), AutoModelForCausalLM.from_pretrained(results["warmup_path"]).state_dict()
        assert all(torch.equal(saved[k], v) for k, v in trained[run["method"]].items())
        assert not all(torch.equal(saved[k], v) for k, v in start.items())  # it trained
        assert tokenizer("6+9=")["input_ids"] == tiny_task.build_tokenizer()("6+9=")["input_ids"]
        args = tt.Args(**results["methods"][run["method"]])
        again = tt.evaluate(model.eval(), tokenizer, args, tt.held_out_problems(base), "cpu")
        assert json.dumps(again, sort_keys=True) == json.dumps(run["final"], sort_keys=True)  # NaN, NaN


def test_cuda_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--device cuda was asked for, but torch .* finds no CUDA device here"):
        tiny_task.pick_device("cuda")
    assert tiny_task.pick_device("auto").type in ("cpu", "mps")


@pytest.mark.slow  # two processes that each import transformers
@pytest.mark.parametrize("argv, message", [
    (["--methods", "ppo"], "--methods: unknown method 'ppo'; expected a comma-separated list from ['cscr', "
                           "'dapo', 'drgrpo', 'entropy80', 'grpo', 'gspo', 'opsd']"),  # Args' own check
    (["--group-size", "four"], "argument --group_size/--group-size/--num-generations/--num_generations: "
                               "invalid int value: 'four'"),  # the parser's
])
def test_command_line_error_is_one_line(argv, message):
    done = subprocess.run([sys.executable, "train_tiny.py", *argv], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"train_tiny.py: error: {message}"


@pytest.mark.slow  # a real run: about 40 s on 2 CPU cores
def test_grpo_fixes_the_warm_ups_mistakes(tmp_path, monkeypatch):
    """python train_tiny.py --quick: a 300-step warm-up, then 40 GRPO updates, on the CPU.

    Measured with `python train_tiny.py --quick --seeds 0,1,2` on 2 CPU threads: held-out greedy
    accuracy went from 0.840 to 0.870, 0.870 and 0.900 for seeds 0, 1 and 2, sampled accuracy from
    0.600 to 0.785, 0.792 and 0.802, and greedy accuracy where the misconception applies (11 of
    the 100 problems) from 0.000 to 0.455, 0.455 and 0.545. This test asserts seed 0 rises at least
    0.12 sampled and 0.27 where the misconception applies (about two thirds of the smallest rise),
    and greedy does not fall.
    """
    monkeypatch.chdir(tmp_path)
    results = tt.main(["--quick", "--seeds", "0", "--name", "learn", "--device", "cpu"])
    start, final = results["start"], results["runs"][0]["final"]
    import transformers
    if (torch.__version__.split("+")[0], transformers.__version__) == ("2.13.0", "5.24.0"):
        # the README's line; other releases draw other random streams (at the floors of
        # requirements.txt the warm-up came out at 0.517 sampled, and GRPO took it to 0.775)
        assert start["sampled_accuracy"] == pytest.approx(0.600, abs=0.05)
    assert final["sampled_accuracy"] >= start["sampled_accuracy"] + 0.12
    assert final["accuracy"] >= start["accuracy"]
    assert final["accuracy_misconception"] >= start["accuracy_misconception"] + 0.27  # the habit
