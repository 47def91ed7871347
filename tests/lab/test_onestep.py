"""lab/onestep.py: what one plain-SGD step does under each weighting, on an untrained tiny policy."""


import json

import pytest
import torch

from lab import cli, onestep
import tokencredit as tc
import tiny_task
import train_tiny as tt


# -----------------------------------------------------------------------------
# the lab's one-step measurement

def tiny_policy(seed=0):  # an untrained 1-layer model: its answers are noise
    torch.manual_seed(seed)
    tokenizer = tiny_task.build_tokenizer()
    return tiny_task.build_tiny_model(tt.Args(n_layer=1, n_embd=32, n_head=2), tokenizer).eval(), tokenizer


def one_step_on_tiny_policy(monkeypatch, strength=1.0):
    """onestep.one_step on an untrained 1-layer model whose verdicts are fixed by hand (its answers are noise)."""
    model, tokenizer = tiny_policy()
    pattern = torch.tensor([True, False, False, True, False, True, False, False])
    monkeypatch.setattr(tiny_task, "verify_all", lambda problems, texts, complete: pattern.repeat(len(texts) // 8))
    args = tt.Args(max_new_tokens=24, group_size=4)
    return onestep.one_step(model, tokenizer, args, tc, [[1, 2], [3, 4, 5], [6, 7], [8, 9, 1, 2]], strength, 0.05,
                            "cpu")


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




def test_the_lab_records_its_learning_rate_where_its_runs_always_did(tmp_path, monkeypatch):
    """--one-step-lr is the lab's own option, not train_tiny's: the lab writes it into the run's
    arguments and each method's, as results.json has held it since the lab began."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    options, rest = cli.lab_options(["--steps", "3", "--one-step-lr", "0.03"])
    assert rest == ["--steps", "3"]
    cli.save(dict(config=dict(name="x"), methods=dict(grpo={}, dapo={})), options)
    saved = json.loads((tmp_path / "runs" / "x" / "results.json").read_text())
    assert [saved["config"]["one_step_lr"], saved["methods"]["grpo"]["one_step_lr"],
            saved["methods"]["dapo"]["one_step_lr"]] == [0.03, 0.03, 0.03]
    with pytest.raises(ValueError, match="--one-step-lr must be > 0, got 0.0"):
        cli.lab_options(["--one-step-lr", "0"])
