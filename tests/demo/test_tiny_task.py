"""tiny_task.py: the demonstrator and its habits, the overlong zone, the verifier, and how much the
held-out problems overlap the warm-up's and training's."""

import random

import pytest
import torch

from lab import credit
import tiny_task
import train_tiny as tt


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


@pytest.mark.slow  # draws the warm-up's whole stream of prompts
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
