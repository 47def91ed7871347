"""Tests for tiny_task.py, train_tiny.py and lab/: the task and its verifier, sampling and scoring, the training
path, the lab's measurements, the command line, and one real run that must learn.

Tests that compare numbers across runs ask for --device cpu; the others accept what auto picks.
"""

import dataclasses
import json
import math
import os
import random
import re
import subprocess
import sys

import pytest
import torch

from lab import cli, compare, credit, learning, onestep, records, stats
import tokencredit as tc
import tiny_task
import train_tiny as tt

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# -----------------------------------------------------------------------------
# the task: the demonstrator, the overlong zone and the verifier

def test_render_problem_and_a_slip_carried_forward():
    assert tiny_task.render_problem([6, 9, 8]) == "6+9+8="
    for seed in range(20):  # every step slips by 1 or 2; the next step starts from the slipped total
        text, _ = tiny_task.demonstrate([6, 9, 8], demo_args(slip_rate=1.0), random.Random(seed))
        first, second = text.split(">")[0].split(",")
        assert first[:4] == "6+9=" and int(first[4:]) in (13, 14, 16, 17) and second.startswith(first[4:] + "+8=")


def demo_args(**rates):
    base = dict(misconception="9", misconception_rate=0.0, slip_rate=0.0, recheck_rate=0.0, loop_rate=0.0)
    return tt.Args(**{**base, **rates})


def test_demonstrator_habits_hand_worked():
    rng = random.Random(0)
    # the misconception: 15+9 forgets the carry (14), and the error is carried to the answer
    assert tiny_task.demonstrate([6, 9, 9], demo_args(misconception_rate=1.0), rng) == ("6+9=5,5+9=4>4", True)
    assert tiny_task.demonstrate([5, 5, 9], demo_args(misconception_rate=1.0), rng) == ("5+5=10,10+9=19>19", True)  # no carry
    assert tiny_task.meets_misconception([6, 9, 9], tt.Args()) and not tiny_task.meets_misconception([5, 5, 9], tt.Args())
    assert tiny_task.demonstrate([6, 9, 8], demo_args(), rng) == ("6+9=15,15+8=23>23", True)
    text, finished = tiny_task.demonstrate([6, 9, 8], demo_args(recheck_rate=1.0), rng)
    assert finished and text in ("6+9=15,6+9=15,15+8=23>23", "6+9=15,15+8=23,15+8=23>23")
    assert tiny_task.verify([6, 9, 8], text, finished) and tiny_task.has_repeated_step(text)
    text, finished = tiny_task.demonstrate([6, 9, 8], demo_args(loop_rate=1.0), rng)
    assert not finished and len(text) == tt.Args().max_new_tokens and tiny_task.has_repeated_step(text)
    assert not tiny_task.verify([6, 9, 8], text, finished) and not tiny_task.has_repeated_step("6+9=15,15+8=23>23")


def test_demonstrator_rates_and_the_overlong_zone():
    """The habits appear at their rates, and no right demonstration reaches DAPO's soft overlong zone."""
    args, rng = tt.Args(), random.Random(1)
    outcomes = [(terms, *tiny_task.demonstrate(terms, args, rng)) for terms in tiny_task.ProblemStream(args, 2).next(4000)]
    loops = sum(not finished for _, _, finished in outcomes) / len(outcomes)
    rechecks = sum(finished and tiny_task.has_repeated_step(t) for _, t, finished in outcomes) / len(outcomes)
    assert loops == pytest.approx(args.loop_rate, abs=0.015)
    assert rechecks == pytest.approx(args.recheck_rate, abs=0.025)
    right_lengths = [len(t) + 1 for terms, t, finished in outcomes if tiny_task.verify(terms, t, finished)]  # + <eos>
    assert max(right_lengths) <= args.max_new_tokens - args.overlong_cache
    longest = "9+9=18,18+9=27,27+9=36,36+9=45,36+9=45>45"  # five nines, a re-checked two-digit step
    assert len(longest) + 1 == args.max_new_tokens - args.overlong_cache


@pytest.mark.parametrize("response, complete, expected", [
    ("6+9=15,15+8=23>23", True, True),      # right
    ("6+9=15,15+8=24>24", True, False),     # wrong answer
    ("garbage>23", True, True),             # outcome reward: only the final answer is checked
    ("6+9=15,15+8=23>23", False, False),    # truncated: never produced <eos>
    ("6+9=15,15+8=23", True, False),        # malformed: no '>'
    ("6+9=15>15>23", True, False),          # malformed: two '>'
    (">", True, False),                     # malformed: no digits
    ("6+9=15,15+8=23>23,", True, False),    # extra tokens after the answer
    ("6+9=15,15+8=23>023", True, True),     # the number 23, with a leading zero
    ("", True, False),                      # empty
])
def test_verify(response, complete, expected):
    assert tiny_task.verify([6, 9, 8], response, complete) is expected


def test_response_mask_and_token_classes():
    tok = tiny_task.build_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    ids = [tok.convert_tokens_to_ids(c) for c in "3+4=7>7"] + [eos]
    responses = torch.tensor([ids + [pad, pad], ids[:5] + [eos, 5, 6, 7, 8]])
    mask, complete = tiny_task.response_mask(responses, eos)
    assert mask.sum(dim=1).tolist() == [8, 6] and complete.tolist() == [True, True]
    mask, complete = tiny_task.response_mask(torch.tensor([ids[:7] + [5, 6, 7]]), eos)
    assert mask.all() and complete.tolist() == [False]
    # 3 + 4 = 7 > 7 eos : intermediate, operator, intermediate, operator, intermediate, format, answer, format
    assert credit.token_classes(tok, torch.tensor([ids]))[0].tolist() == [1, 2, 1, 2, 1, 3, 0, 3]


# -----------------------------------------------------------------------------
# sampling and scoring: the log-probs trained on are those of the distribution sampled from

def tiny_policy(seed=0, device="cpu"):
    torch.manual_seed(seed)
    tokenizer = tiny_task.build_tokenizer()
    return tiny_task.build_tiny_model(tt.Args(n_layer=1, n_embd=32, n_head=2), tokenizer).to(device).eval(), tokenizer


def test_token_logprobs_hand_worked_and_float32():
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 2.0]]])  # (1, 2, 2): p = (1/4, 3/4), (1/2, 1/2)
    assert torch.allclose(tt.token_logprobs(logits, torch.tensor([[1, 0]])),
                          torch.tensor([[math.log(0.75), math.log(0.5)]]))
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, 7, generator=g)
    targets = torch.randint(0, 7, (3, 5), generator=g)
    ref = torch.tensor([[math.log(torch.softmax(logits[n, t], -1)[targets[n, t]]) for t in range(5)] for n in range(3)])
    assert torch.allclose(tt.token_logprobs(logits, targets), ref, atol=1e-6)
    got_bf16 = tt.token_logprobs(logits.bfloat16(), targets)
    assert got_bf16.dtype == torch.float32
    assert torch.allclose(got_bf16, tt.token_logprobs(logits.bfloat16().float(), targets))


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
    (logp, _), = tt.score(model, tokenizer, args, problems, sampled.masked_fill(~mask, tokenizer.pad_token_id), mask)
    assert torch.allclose(logp[mask], tt.token_logprobs(logits, sampled)[mask], atol=1e-4)
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
            (logp, logits), = tt.score(model, tokenizer, args, problems, responses, mask, need_logits=True)
        else:
            logp, logits = tt.score_by_length(model, tokenizer, args, problems, responses, mask, micro_batches)
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
    (old, _), = tt.score(model, tokenizer, args, flat, responses, mask)
    loss, _ = tc.policy_loss(old, old.detach(), advantages, mask, mode="sample")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        (new, _), = tt.score(model, tokenizer, args, flat, responses, mask)
    change = ((new - old.detach()) * mask).sum(dim=1)  # (N,) change of each response's log-prob
    assert (advantages * change).sum() > 0 and change[advantages > 0].mean() > change[advantages < 0].mean()


# -----------------------------------------------------------------------------
# the lab's one-step measurement

def one_step_on_tiny_policy(monkeypatch, strength=1.0):
    """onestep.one_step on an untrained 1-layer model whose verdicts are fixed by hand (its answers are noise)."""
    model, tokenizer = tiny_policy()
    pattern = torch.tensor([True, False, False, True, False, True, False, False])
    monkeypatch.setattr(tt, "verify_all", lambda problems, texts, complete: pattern.repeat(len(texts) // 8))
    args = tt.Args(max_new_tokens=24, group_size=4)
    return onestep.one_step(model, tokenizer, args, [[1, 2], [3, 4, 5], [6, 7], [8, 9, 1, 2]], strength, 0.05, "cpu")


def test_one_step_is_deterministic_and_first_order(monkeypatch):
    a, b = one_step_on_tiny_policy(monkeypatch), one_step_on_tiny_policy(monkeypatch)
    assert a["delta"].keys() == b["delta"].keys() and all(torch.equal(a["delta"][k], b["delta"][k]) for k in a["delta"])
    assert onestep.one_step_table(a)["first_order_median"] == pytest.approx(2.0, abs=0.05)  # half the lr, half the change
    moved = a["advantages"] != 0
    assert (a["advantages"] * a["delta"]["sample"].sum(dim=1))[moved].sum() > 0  # the way the advantages point


def test_one_step_sample_over_token_is_larger_for_short_responses(monkeypatch):
    """Under "sample" a short response's tokens weigh more than under "token", a long one's less: the
    measured ratio sample/token falls with length, as its first-order prediction mean|o| / |o_i| does."""
    step = one_step_on_tiny_policy(monkeypatch)
    lengths = step["mask"].sum(dim=1).float()
    moved = step["advantages"] != 0
    ratio = step["delta"]["sample"].sum(dim=1) / step["delta"]["token"].sum(dim=1)  # (N,)
    short, long = moved & (lengths <= lengths.mean() / 2), moved & (lengths >= lengths.mean() * 1.3)
    assert short.sum() >= 2 and long.sum() >= 2
    assert ratio[short].median() > 1 > ratio[long].median()
    w_sample, w_token = tc.token_weights(step["mask"], "sample"), tc.token_weights(step["mask"], "token")
    assert torch.allclose(w_sample.sum(dim=1) / w_token.sum(dim=1), lengths.mean() / lengths)


def test_one_step_cscr_at_strength_zero_is_grpo_exactly(monkeypatch):
    step = one_step_on_tiny_policy(monkeypatch, strength=0.0)
    assert torch.equal(step["delta"]["cscr 0"], step["delta"]["sample"])
    assert not torch.equal(one_step_on_tiny_policy(monkeypatch, strength=2.0)["delta"]["cscr 2"], step["delta"]["sample"])


# -----------------------------------------------------------------------------
# the lab's paired comparison: two runs, seed by seed

def test_t_quantile_and_the_sign_test_against_closed_forms():
    # df 1 and 2 have closed forms: tan(pi (p - 1/2)) and (2p - 1) / sqrt(2 p (1 - p))
    assert stats.t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-9)
    assert stats.t_quantile(0.975, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-9)
    assert stats.t_quantile(0.975, 9) == pytest.approx(2.262157, abs=1e-6)  # the printed tables'
    assert stats.t_quantile(0.5, 5) == pytest.approx(0.0, abs=1e-9)
    # two-sided: 2 P(Binomial(n, 1/2) <= smaller count); 7 of 7 is 2/128, 3 of 3 is 2/8
    assert stats.sign_test_p(0, 7) == 2 / 128 and stats.sign_test_p(3, 0) == 0.25
    assert stats.sign_test_p(2, 8) == 2 * (1 + 10 + 45) / 1024 and stats.sign_test_p(5, 5) == 1.0
    assert stats.sign_test_p(0, 0) == 1.0  # every seed tied: no evidence either way
    with pytest.raises(ValueError, match="0.5 <= p < 1 and df >= 1, got p=0.3"):
        stats.t_quantile(0.3, 4)


def test_paired_stats_hand_worked():
    # differences -1, -2, -3, +0.5: mean -1.375; Bessel sd sqrt(6.6875 / 3) = 1.49304; the 95 %
    # half-width t(0.975, 3) sd / sqrt(4) = 3.182446 x 0.746520 = 2.375759
    s = stats.paired_stats([-1.0, -2.0, -3.0, 0.5])
    assert s["mean"] == -1.375 and (s["plus"], s["minus"], s["zero"]) == (1, 3, 0)
    assert s["low"] == pytest.approx(-1.375 - 2.375759, abs=1e-5)
    assert s["high"] == pytest.approx(-1.375 + 2.375759, abs=1e-5)
    assert s["p"] == 2 * (1 + 4) / 16  # 1 of 4 positive
    tied = stats.paired_stats([5e-8, -1.0, -1.0], digits=4)  # +0.0000 as printed: a tie, counted
    assert (tied["plus"], tied["minus"], tied["zero"], tied["p"]) == (0, 2, 1, 0.5)  # apart
    assert stats.paired_stats([5e-8, -1.0, -1.0], digits=8)["plus"] == 1


def fake_run(name, seeds, truncated, wrong, sampled, **config):
    """A saved run as records.load_run returns it: grpo, 12 updates; truncated[s] and wrong[s] are
    seed s's per-update series (None: no wrong answer in that batch), sampled[s] its last
    held-out sampled accuracy."""
    cfg = {**dataclasses.asdict(tt.Args()), "methods": "grpo", "name": name, "steps": 12,
           "seeds": ",".join(map(str, seeds)), **config}
    evals = dict(accuracy=0.9, length=20.0, accuracy_misconception=0.8, accuracy_other=0.95,
                 sampled_accuracy_misconception=0.5)
    runs = [dict(method="grpo", seed=s, wall_s=1.0, evals={"12": dict(evals, sampled_accuracy=sampled[s])},
                 updates={**{k: [0.5] * 12 for k in records.UPDATE_KEYS}, "step": list(range(1, 13)),
                          "truncated_frac": truncated[s], "length_wrong": wrong[s]})
            for s in seeds]
    start = dict(evals, sampled_accuracy=0.4)
    return dict(name=name, config=cfg, methods={"grpo": {}}, start=start, runs=runs)


def test_compare_pairs_seeds_hand_worked(tmp_path, capsys):
    """Seeds 1 and 2 are in both runs (0 and 3 are not); updates 1-10 and 1-12 are averaged per
    seed before the difference, and a batch with no wrong answer (None) is left out."""
    flat = lambda x: [x] * 12  # noqa: E731
    base = fake_run("base", [0, 1, 2], {0: flat(0.9), 1: flat(0.10), 2: [0.2] * 10 + [0.0, 0.0]},
                    {0: flat(9.0), 1: flat(30.0), 2: flat(40.0)}, {0: 0.0, 1: 0.80, 2: 0.70})
    other = fake_run("other", [1, 2, 3], {1: flat(0.05), 2: [0.2] + [0.1] * 9 + [0.3, 0.3],
                                            3: flat(0.0)},
                     {1: [None] * 6 + [24.0] * 6, 2: flat(41.0), 3: flat(0.0)},
                     {1: 0.85, 2: 0.69, 3: 1.0}, loss_mode="token")
    paths = []
    for run in (base, other):
        paths.append(str(tmp_path / f"{run['name']}.json"))
        with open(paths[-1], "w") as f:
            json.dump(run, f)
    [p] = cli.main(["compare", *paths, "--plot", str(tmp_path / "pair.png")])
    out = capsys.readouterr().out
    assert p["seeds"] == [1, 2] and p["changed"] == {"loss_mode": ("sample", "token")}
    rows = {row["label"]: (row["diffs"], row) for row in p["rows"]}
    # truncated, seed 1: 0.05 - 0.10; seed 2, updates 1-10: 1.1 / 10 - 0.2; all 12: (1.7 - 2) / 12
    assert rows["truncated fraction, updates 1-10"][0] == pytest.approx([-0.05, -0.09])
    assert rows["truncated fraction, updates 1-12"][0] == pytest.approx([-0.05, -0.3 / 12])
    assert rows["wrong-answer length, updates 1-12"][0] == pytest.approx([24.0 - 30.0, 1.0])
    assert rows["wrong-answer length, updates 1-10"][0] == pytest.approx([-6.0, 1.0])  # 24 x 4 / 4
    diffs, s = rows["held-out sampled accuracy, at the end"]
    assert diffs == pytest.approx([0.05, -0.01]) and (s["plus"], s["minus"]) == (1, 1)
    assert s["mean"] == pytest.approx(0.02) and s["p"] == 1.0
    assert rows["response length, updates 1-12"][0] == [0.0, 0.0]  # the same series: ties
    assert out.startswith("paired comparison, other:grpo - base:grpo, loss_mode 'sample' -> "
                          "'token': seeds 1, 2 (2 in common; update 1's rollouts identical in 1")
    assert "| truncated fraction, updates 1-10 | -0.0500 -0.0900 | -0.0700 [" in out
    assert (tmp_path / "pair.png").stat().st_size > 0
    cli.main(["compare", *paths, *paths, "--primary"])  # two pairs, the two primary rows of each
    primary = capsys.readouterr().out.splitlines()
    assert primary[1] == compare.PRIMARY_HEADER and len(primary) == 3 + 2 * 2
    assert primary[3].startswith("| other - base | loss_mode 'sample' -> 'token' | truncated "
                                 "fraction, updates 1-10 | -0.0500 -0.0900 |")
    assert primary[4].startswith("| other - base | loss_mode 'sample' -> 'token' | wrong-answer "
                                 "length, updates 1-12 | -6.00 +1.00 |")
    with pytest.raises(ValueError, match="expected BASE OTHER pairs"):
        cli.main(["compare", *paths, paths[0]])


def test_compare_refuses_runs_it_cannot_pair(tmp_path):
    series = {s: [0.1] * 12 for s in range(3)}
    sampled = {s: 0.5 for s in range(3)}

    def side(name, seeds=(0, 1), **config):
        run = fake_run(name, list(seeds), series, series, sampled, **config)
        with open(tmp_path / f"{name}.json", "w") as f:
            json.dump(run, f)
        return records.load_side(str(tmp_path / f"{name}.json"))
    base = side("base")
    with pytest.raises(ValueError, match="no seed in common"):
        compare.pair_up(base, side("later", seeds=(2,), loss_mode="token"))
    with pytest.raises(ValueError, match="differ in loop_rate 0.12 -> 0.3, so one seed no longer"):
        compare.pair_up(base, side("loops", loop_rate=0.3, loss_mode="token"))
    with pytest.raises(ValueError, match="warmup_seed 1234 -> 7"):
        compare.pair_up(base, side("start", warmup_seed=7))
    with pytest.raises(ValueError, match="more than one knob, eps_high 0.2 -> 0.28, loss_mode"):
        compare.pair_up(base, side("two", eps_high=0.28, loss_mode="token"))
    with pytest.raises(ValueError, match="the same arguments"):
        compare.pair_up(base, side("twin"))
    elsewhere = side("elsewhere", loss_mode="token")
    elsewhere[0]["start"]["accuracy"] = 0.79  # the same arguments, another machine's warm-up
    with pytest.raises(ValueError, match=r"different policies .*\(0.9, 0.4, 20.0\) and \(0.79, "):
        compare.pair_up(base, elsewhere)
    with pytest.raises(ValueError, match="no saved run at"):
        records.load_side(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="name one, as .*:grpo, got 'dapo'"):
        records.load_side(str(tmp_path / "base.json") + ":dapo")
    assert compare.pair_up(base, side("token", loss_mode="token")) == ([0, 1], {"loss_mode": ("sample", "token")})


def test_the_report_prints_nan_where_no_held_out_problem_meets_the_misconception(tmp_path, capsys):
    """A held-out set too small to draw such a problem (--eval-size 4) has NaN accuracy there,
    stored as None; the report prints it as it prints any NaN, never a TypeError."""
    series = {s: [0.1] * 12 for s in (0, 1)}
    run = fake_run("few", [0, 1], series, {s: [20.0] * 12 for s in (0, 1)}, {0: 0.5, 1: 0.75})
    for evals in [run["start"]] + [r["evals"]["12"] for r in run["runs"]]:
        evals.update(accuracy_misconception=None, sampled_accuracy_misconception=None)
    with open(tmp_path / "few.json", "w") as f:
        json.dump(run, f)
    cli.report([str(tmp_path / "few.json")])
    out = capsys.readouterr().out
    assert "from 0.900 greedy (nan where the misconception applies) and 0.400 sampled (nan):" in out
    assert "| grpo | 0.900 +- 0.000 | 0.625 +- 0.177 | nan +- nan | 20.0 +- 0.0 | 0.100 -> 0.100 " \
           "| 20.0 +- 0.0 | 0.500 |" in out  # sampled: (0.5 + 0.75) / 2, std 0.25 / sqrt(2)


def test_the_report_names_a_table_it_does_not_print_again(tmp_path, capsys):
    """Two runs with the same results table (here: the same numbers): the second run's section
    gives its title and says it is the same, so that a reader does not think it missing."""
    series = {0: [0.1] * 12}
    for name in ("ours", "mine"):
        with open(tmp_path / f"{name}.json", "w") as f:
            json.dump(fake_run(name, [0], series, series, {0: 0.5}), f)
    cli.report([str(tmp_path / "ours.json"), str(tmp_path / "mine.json")])
    mine = capsys.readouterr().out.split("## mine\n")[1].split("\n")
    assert mine[1].startswith("held-out accuracy after 12 policy updates") and \
        mine[2] == "(the same table as above)" and mine[4].startswith("rollout statistics")


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
    monkeypatch.setattr(tt, "tc", tt.tc)  # --impl rebinds it; put ours back afterwards
    reference = open(tc.__file__).read()
    (tmp_path / "mine.py").write_text(reference)
    (tmp_path / "grpo_only.py").write_text(blank(reference, [2, 4, 6, 7, 8]))
    argv = TINY + ["--methods", "grpo", "--device", "cpu"]
    tt.main(argv + ["--name", "direct"])
    tt.main(argv + ["--name", "impl", "--impl", "mine.py"])
    assert tt.tc.__file__ == str(tmp_path / "mine.py")
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
    base, runs, seeds = tt.parse_args(["--methods", "grpo,dapo", "--eps-high", "0.5", "--steps", "7", "--seeds", "3,4"])
    (_, grpo), (_, dapo) = runs
    assert base.steps == 7 and grpo.steps == 7 and seeds == [3, 4]
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
    tt.main(argv + ["--name", "b"])
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
# TRL's names, --config, the saved config and the saved policy

TRL_ARGV = ["--num-generations", "4", "--max-completion-length", "40", "--learning-rate", "3e-4",
            "--epsilon", "0.1", "--epsilon-high", "0.3", "--num-iterations", "1",
            "--importance-sampling-level", "sequence", "--top-entropy-quantile", "0.5", "--seed", "7"]
OURS_ARGV = ["--group-size", "4", "--max-new-tokens", "40", "--lr", "3e-4", "--eps-low", "0.1",
             "--eps-high", "0.3", "--update-epochs", "1", "--ratio-level", "sequence", "--entropy-top", "0.5",
             "--seeds", "7"]


def test_grpo_configs_names_are_ours():
    methods = ["--methods", "grpo,dapo"]
    assert tt.parse_args(methods + TRL_ARGV) == tt.parse_args(methods + OURS_ARGV)
    _, (grpo, dapo), seeds = tt.parse_args(methods + TRL_ARGV)
    assert (grpo[1].group_size, dapo[1].eps_low, dapo[1].eps_high, grpo[1].lr, seeds) == (4, 0.1, 0.3, 3e-4, [7])
    assert (grpo[1].update_epochs, grpo[1].max_new_tokens, grpo[1].ratio_level, grpo[1].entropy_top) == \
        (1, 40, "sequence", 0.5)
    for loss_type, loss_mode in (("grpo", "sample"), ("dr_grpo", "constant"), ("dapo", "token"), ("bnpo", "token"),
                                 ("group_token", "group_token")):
        _, runs, _ = tt.parse_args(methods + ["--loss-type", loss_type])
        assert [a.loss_mode for _, a in runs] == [loss_mode, loss_mode], loss_type


def test_trl_loss_types_weigh_tokens_as_trl_does():
    """Each loss_type train_tiny accepts gives the loss TRL 1.16's GRPOTrainer._compute_loss computes from the
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
        _, ((_, args),), _ = tt.parse_args(["--methods", "grpo", "--loss-type", loss_type])
        ours = tc.aggregate(per_token, mask, args.loss_mode, group_size=3, max_len=L)
        assert torch.allclose(ours.double(), loss), loss_type


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "luspo", "vespo"])
def test_trl_loss_types_with_no_loss_mode_are_refused(loss_type):
    with pytest.raises(ValueError, match=f"--loss-type {loss_type}: TRL's {loss_type} is .*, not a loss_mode here"):
        tt.parse_args(["--loss-type", loss_type])


def test_config_file_in_yaml_or_json_and_flags_win(tmp_path):
    yaml_file, json_file = tmp_path / "run.yaml", tmp_path / "run.json"
    yaml_file.write_text("# a TRL-style file: GRPOConfig's names and ours\nnum_generations: 4\n"
                         "max_completion_length: 40\nlearning_rate: 3e-4  # PyYAML reads this as text\n"
                         "epsilon: 0.1\nepsilon_high: 0.3\nnum_iterations: 1\nimportance_sampling_level: sequence\n"
                         "top_entropy_quantile: 0.5\nseed: 7\nmethods: grpo,dapo\nloss_type: dr_grpo\n"
                         "misconception: 5\nmax_value: 5\ndynamic_sampling: true\n")
    json_file.write_text(json.dumps(dict(methods="grpo,dapo", group_size=4, max_new_tokens=40, lr=3e-4,
                                         eps_low=0.1, eps_high=0.3, update_epochs=1, ratio_level="sequence",
                                         entropy_top=0.5, seeds="7", loss_mode="constant", misconception="5",
                                         max_value=5, dynamic_sampling=True)))
    flags = OURS_ARGV + ["--methods", "grpo,dapo", "--loss-mode", "constant", "--misconception", "5",
                         "--max-value", "5", "--dynamic-sampling"]
    assert tt.parse_args(["--config", str(yaml_file)]) == tt.parse_args(flags)
    assert tt.parse_args(["--config", str(json_file)]) == tt.parse_args(flags)
    base, runs, seeds = tt.parse_args(["--config", str(yaml_file), "--seeds", "1,2", "--epsilon-high", "0.25"])
    assert seeds == [1, 2] and [a.eps_high for _, a in runs] == [0.25, 0.25] and base.group_size == 4


@pytest.mark.parametrize("text, message", [
    ("num_generations: four\n", "--config CONFIG: num_generations must be int, got 'four'"),
    ("group_size: 4.5\n", "--config CONFIG: group_size must be int, got 4.5"),
    ("dynamic_sampling: 1\n", "--config CONFIG: dynamic_sampling must be bool, got 1"),
    ("num_iterations: true\n", "--config CONFIG: num_iterations must be int, got True"),
    ("lr: fast\n", "--config CONFIG: lr must be float, got 'fast'"),
    ("per_device_train_batch_size: 8\n", "--config CONFIG: unknown argument 'per_device_train_batch_size'"),
    ("- grpo\n", "--config CONFIG: expected a mapping of argument names to values, got list"),
    ("loss_type: sapo\n", "--loss-type sapo: TRL's sapo is a sigmoid gate in place of the clip"),
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
    assert tt.parse_args(["--config", saved]) == tt.parse_args(argv)
    assert json.loads(open(saved).read())["eps_high"] == 0.3 and "loss_mode" not in open(saved).read()
    both = tt.parse_args(["--config", saved, "--methods", "grpo,drgrpo"])
    assert both == tt.parse_args(argv + ["--methods", "grpo,drgrpo"])
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


def test_command_line_error_is_one_line():
    done = subprocess.run([sys.executable, "train_tiny.py", "--methods", "ppo"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("train_tiny.py: error: --methods: unknown method 'ppo'")


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


def test_how_much_the_evaluation_set_overlaps_training(monkeypatch):
    """The 200 evaluation problems come from their own seeded stream, but one-digit sums repeat: the README
    states how many also occur among the warm-up's prompts (0.71) and seed 0's 60 x 16 training prompts (0.28)."""
    args = tt.Args()
    held_out = tiny_task.ProblemStream(args, args.warmup_seed + tt.HELD_OUT_STREAM).next(args.eval_size)
    seen, real_next = [], tiny_task.ProblemStream.next
    monkeypatch.setattr(tiny_task.ProblemStream, "next", lambda self, n: seen.extend(p := real_next(self, n)) or p)
    tokenizer, rng = tiny_task.build_tokenizer(), random.Random(args.warmup_seed)
    for _ in range(args.warmup_steps):  # the warm-up's batches, in its order, without the model
        tiny_task.warmup_batch(args, tokenizer, rng, "cpu")
    warmup = {tuple(p) for p in seen}
    training = {tuple(p) for p in real_next(tiny_task.ProblemStream(args, 0), args.steps * args.prompts_per_step)}
    assert sum(tuple(p) in warmup for p in held_out) / len(held_out) == pytest.approx(0.71, abs=0.005)
    assert sum(tuple(p) in training for p in held_out) / len(held_out) == pytest.approx(0.28, abs=0.005)
