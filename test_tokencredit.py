"""Tests for tokencredit.py, in the file's order.

Each function is checked three ways: a hand-worked case with the numbers written here, a plain-loop
reference that follows the paper's equation literally (the references come first: they are the
equations, one token at a time), and its invariants. Run: python -m pytest -q
"""

import functools
import itertools
import math

import pytest
import torch

import tokencredit as tc


Z, O, P, NAN, INF = torch.zeros, torch.ones, functools.partial, float("nan"), float("inf")


def random_mask(N, T, generator, min_len=1):
    """Right-padded mask with random lengths in [min_len, T]."""
    lengths = torch.randint(min_len, T + 1, (N,), generator=generator)
    return torch.arange(T)[None, :] < lengths[:, None]


# -----------------------------------------------------------------------------
# plain-loop references: the papers' equations, one scalar at a time

def ref_group_advantages(rewards, scale="std", eps=1e-6, baseline="mean"):
    everything = [r for group in rewards.tolist() for r in group]
    batch_mean = sum(everything) / len(everything)
    batch_std = math.sqrt(sum((r - batch_mean) ** 2 for r in everything) / (len(everything) - 1))
    out = []
    for group in rewards.tolist():
        G = len(group)
        if G == 1 or all(r == group[0] for r in group):
            out.append([0.0] * G)
            continue
        mean = sum(group) / G
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (G - 1))
        row = []
        for i, r in enumerate(group):
            b = mean if baseline == "mean" else sum(group[j] for j in range(G) if j != i) / (G - 1)
            s = {"std": std + eps, "batch": batch_std + eps, "none": 1.0}[scale]
            row.append((r - b) / s)
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


def ref_loss(logp, old_logp, adv, mask, mode, eps_low=0.2, eps_high=0.2, group_size=None, max_len=None,
             ref_logp=None, beta=0.0, ratio_level="token", surrogate="clip"):
    """The objectives as the papers write them, token by token; autograd flows through logp."""
    N, T = mask.shape
    per_response = []  # (sum over the response's tokens of the loss, |o_i|)
    for i in range(N):
        real = [t for t in range(T) if mask[i, t]]
        if real:  # GSPO: s_i = (pi_theta(o_i) / pi_old(o_i)) ** (1 / |o_i|)
            s = torch.exp(sum(logp[i, t] - old_logp[i, t] for t in real) / len(real)) if old_logp is not None else None
        total = torch.zeros((), dtype=logp.dtype)
        for t in real:
            a = adv[i, t] if adv.dim() == 2 else adv[i]
            if surrogate == "reinforce":
                term = -a * logp[i, t]
            else:
                if ratio_level == "token":
                    rho = torch.exp(logp[i, t] - old_logp[i, t])
                elif ratio_level == "sequence":
                    rho = s
                else:  # GSPO-token: sg[s_i] * pi_t / sg[pi_t]
                    rho = s.detach() * torch.exp(logp[i, t] - logp[i, t].detach())
                term = -torch.minimum(rho * a, torch.clamp(rho, 1 - eps_low, 1 + eps_high) * a)
            if beta:
                r = torch.exp(ref_logp[i, t] - logp[i, t])
                term = term + beta * (r - torch.log(r) - 1)
            total = total + term
        per_response.append((total, len(real)))
    if mode == "sample":  # GRPO: 1/G sum_i 1/|o_i| sum_t, averaged over prompts
        return sum(s / n for s, n in per_response if n) / N
    if mode == "token":  # one mean over every token of the batch
        return sum(s for s, _ in per_response) / sum(n for _, n in per_response)
    if mode == "group_token":  # DAPO's equation: a token mean per group, then the mean over groups
        groups = [per_response[b:b + group_size] for b in range(0, N, group_size)]
        return sum(sum(s for s, _ in g) / sum(n for _, n in g) for g in groups  # an empty group: 0
                   if sum(n for _, n in g)) / len(groups)
    if mode == "constant":  # Dr. GRPO: 1/G sum_i 1/max_len sum_t
        return sum(s / max_len for s, _ in per_response) / N
    raise AssertionError(mode)


def ref_loss_stats(logp, old_logp, adv, mask, eps_low, eps_high, ratio_level, ref_logp, beta):
    """policy_loss's statistics as they are defined, one real token at a time."""
    N, T = mask.shape
    low = high = count = 0
    ratios, kls = [], []
    for i in range(N):
        real = [t for t in range(T) if mask[i, t]]
        for t in real:
            if ratio_level == "token":
                rho = math.exp(float(logp[i, t]) - float(old_logp[i, t]))
            else:  # GSPO's s_i, on every token of the response
                rho = math.exp(sum(float(logp[i, u]) - float(old_logp[i, u]) for u in real) / len(real))
            a = float(adv[i, t] if adv.dim() == 2 else adv[i])
            low += a < 0 and rho < 1 - eps_low
            high += a > 0 and rho > 1 + eps_high
            ratios.append(rho)
            r = math.exp(float(ref_logp[i, t]) - float(logp[i, t]))
            kls.append(r - math.log(r) - 1)
            count += 1
    stats = dict(num_tokens=count, clip_frac_low=low / max(count, 1), clip_frac_high=high / max(count, 1),
                 ratio_mean=sum(ratios) / max(count, 1))
    return dict(stats, kl_mean=sum(kls) / max(count, 1)) if beta > 0 else stats


def ref_overlong_penalty(lengths, max_len, cache_len):
    soft_start = max_len - cache_len
    return torch.tensor([0.0 if L <= soft_start else (soft_start - L) / cache_len if L <= max_len
                         else -1.0 for L in lengths.tolist()])


def ref_informative_groups(values):
    return torch.tensor([any(v != row[0] for v in row) for row in values.tolist()],
                        dtype=torch.bool)


def ref_fill_batch(rounds, batch_size, max_rounds):
    """DAPO's dynamic sampling on rounds of group values (a list of (b, G) lists): group k of the
    whole sequence is kept if its values are not all equal, in order, until batch_size.
    Returns: (the kept groups' indices k, as a tensor; the stats dict)."""
    kept, seen, informative, k, calls = [], 0, 0, 0, 0
    for groups in rounds[:max_rounds]:
        if len(kept) == batch_size:
            break
        calls += 1
        for row in groups:
            seen += 1
            if any(v != row[0] for v in row):
                informative += 1
                if len(kept) < batch_size:
                    kept.append(k)
            k += 1
    stats = dict(rounds=calls, groups_seen=seen, groups_informative=informative,
                 groups_kept=len(kept), full=int(len(kept) == batch_size))
    return torch.tensor(kept, dtype=torch.long), stats


def ref_policy_gradient_surrogate(logp, adv):
    N, T = logp.shape
    return torch.tensor([[-float(adv[i, t] if adv.dim() == 2 else adv[i]) * float(logp[i, t])
                          for t in range(T)] for i in range(N)], dtype=torch.float64)


def ref_importance_ratio(logp, old_logp, mask):
    N, T = mask.shape
    return torch.tensor([[math.exp(float(logp[i, t]) - float(old_logp[i, t])) if mask[i, t] else 1.0
                          for t in range(T)] for i in range(N)], dtype=torch.float64)


def ref_sequence_ratio(logp, old_logp, mask):
    """GSPO's s_i = exp(mean over the real tokens of the log-ratio) on real tokens, 1 on padding."""
    N, T = mask.shape
    out = torch.ones(N, T, dtype=torch.float64)
    for i in range(N):
        real = [t for t in range(T) if mask[i, t]]
        for t in real:
            log_ratios = [float(logp[i, u]) - float(old_logp[i, u]) for u in real]
            out[i, t] = math.exp(sum(log_ratios) / len(real))
    return out


def ref_clipped_surrogate(ratio, adv, eps_low, eps_high):
    N, T = ratio.shape
    out = torch.zeros(N, T, dtype=torch.float64)
    for i in range(N):
        for t in range(T):
            rho, a = float(ratio[i, t]), float(adv[i, t] if adv.dim() == 2 else adv[i])
            out[i, t] = -min(rho * a, min(max(rho, 1 - eps_low), 1 + eps_high) * a)
    return out


def ref_kl_k3(logp, ref_logp):
    N, T = logp.shape
    out = torch.zeros(N, T, dtype=torch.float64)
    for i in range(N):
        for t in range(T):
            log_r = float(ref_logp[i, t]) - float(logp[i, t])
            out[i, t] = math.expm1(log_r) - log_r  # r - 1 - log r
    return out


def ref_loss_denominators(mask, mode, group_size=None, max_len=None):
    N = len(mask)
    lengths = [sum(int(m) for m in row) for row in mask.tolist()]
    if mode == "sample":
        return torch.tensor([N * max(n, 1) for n in lengths], dtype=torch.float64)
    if mode == "token":
        return torch.tensor([max(sum(lengths), 1)] * N, dtype=torch.float64)
    if mode == "group_token":
        B = N // group_size
        return torch.tensor([B * max(sum(lengths[i // group_size * group_size:][:group_size]), 1)
                             for i in range(N)], dtype=torch.float64)
    return torch.tensor([N * max_len] * N, dtype=torch.float64)


def ref_aggregate(x, mask, mode, group_size=None, max_len=None):
    d = ref_loss_denominators(mask, mode, group_size, max_len).tolist()
    N, T = mask.shape
    return sum(float(x[i, t]) / d[i] for i in range(N) for t in range(T) if mask[i, t])


def ref_counterfactual_shifts(logp, logp_pos, logp_neg, mask):
    N, T = mask.shape
    d_pos, d_neg = torch.zeros(N, T, dtype=torch.float64), torch.zeros(N, T, dtype=torch.float64)
    for i in range(N):
        for t in range(T):
            if mask[i, t]:
                d_pos[i, t] = float(logp_pos[i, t]) - float(logp[i, t])
                d_neg[i, t] = float(logp_neg[i, t]) - float(logp[i, t])
    return d_pos, d_neg


def ref_counterfactual_sensitivity(d_pos, d_neg):
    N, T = d_pos.shape
    return torch.tensor([[max(abs(float(d_pos[i, t])), abs(float(d_neg[i, t]))) for t in range(T)]
                         for i in range(N)], dtype=torch.float64)


def ref_cscr_weights(s, mask, strength, threshold):
    N, T = mask.shape
    out = torch.zeros(N, T)
    for i in range(N):
        raw = [math.exp(-strength * max(0.0, float(s[i, t]) - threshold)) if mask[i, t] else 0.0 for t in range(T)]
        length, total = sum(int(m) for m in mask[i]), sum(raw)
        for t in range(T):
            out[i, t] = length * raw[t] / total if mask[i, t] else 0.0
    return out


def ref_cscr_advantages(advantages, weights):
    N, T = weights.shape
    return torch.tensor([[float(advantages[i]) * float(weights[i, t]) for t in range(T)] for i in range(N)])


def ref_quantile(values, q):
    """Linear interpolation between the two nearest ranks, as numpy's and torch's default."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    low, high = math.floor(pos), math.ceil(pos)
    return s[low] + (s[high] - s[low]) * (pos - low)


def ref_high_entropy_mask(entropy, mask, top_fraction):
    N, T = mask.shape
    real = [float(entropy[i, t]) for i in range(N) for t in range(T) if mask[i, t]]
    if not real:
        return torch.zeros(N, T)
    threshold = ref_quantile(real, 1 - top_fraction)
    return torch.tensor([[1.0 if mask[i, t] and float(entropy[i, t]) >= threshold else 0.0
                          for t in range(T)] for i in range(N)])


# -----------------------------------------------------------------------------
# 1. rewards and group advantages

def test_overlong_penalty_hand_worked():
    lengths = torch.tensor([0, 10, 12, 13, 14, 16, 17, 100])
    # max_len 16, cache 4: the soft zone is (12, 16]
    got = tc.overlong_penalty(lengths, max_len=16, cache_len=4)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]))
    assert torch.allclose(got, ref_overlong_penalty(lengths, 16, 4))


def test_overlong_penalty_matches_the_loop_reference():
    """The ramp over every length from 0 to past the budget, a soft zone of 1 token and one as
    long as the budget (it starts at 0), and float lengths."""
    for max_len, cache_len in ((30, 7), (16, 16), (5, 1)):
        lengths = torch.arange(0, max_len + 4)
        assert torch.allclose(tc.overlong_penalty(lengths, max_len, cache_len),
                              ref_overlong_penalty(lengths, max_len, cache_len).float())
    lengths = torch.tensor([11.5, 12.0, 14.5, 16.0, 16.5])
    assert torch.allclose(tc.overlong_penalty(lengths, 16, 4), torch.tensor([0, 0, -0.625, -1, -1.0]))


def test_overlong_penalty_is_a_float_in_minus_1_to_0_that_never_rewards_length():
    many = tc.overlong_penalty(torch.arange(0, 40), max_len=30, cache_len=7)  # int64 lengths
    assert many.dtype == torch.float32 and tuple(many.shape) == (40,)
    assert many.min() == -1 and many.max() == 0 and (many[1:] <= many[:-1]).all()
    assert (many[:24] == 0).all() and (many[30:] == -1).all()  # 0 up to 30 - 7, -1 from 30 on


def test_group_advantages_hand_worked():
    # (the README's table, checked below, works std, none and leave_one_out by hand)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    # "batch": the std of all 12 rewards (Bessel: 0.5149) instead of each group's
    none = torch.tensor([[0.5, -0.5, -0.5, 0.5], [-0.25, -0.25, -0.25, 0.75], [0.0] * 4])
    assert rewards.flatten().std().item() == pytest.approx(0.514929, abs=1e-6)
    assert torch.allclose(tc.group_advantages(rewards, "batch", eps=1e-4), none / (0.514929 + 1e-4))
    # the std's effect for G = 8 (README section 1): the lone right answer gets 2.47, yet its
    # group's total |A| (4.95) is smaller than that of a group with four right answers (7.48)
    lone, half = tc.group_advantages(torch.tensor([[1.0] + [0.0] * 7, [1.0] * 4 + [0.0] * 4]))
    assert lone[0].item() == pytest.approx(2.4749, abs=1e-4)
    assert lone.abs().sum().item() == pytest.approx(4.9497, abs=1e-4)
    assert half.abs().sum().item() == pytest.approx(7.4833, abs=1e-4)


@pytest.mark.parametrize("scale, baseline", list(itertools.product(tc.ADVANTAGE_SCALES, tc.BASELINES)))
def test_group_advantages_match_loop_reference(scale, baseline):
    g = torch.Generator().manual_seed(0)
    for B, G in [(5, 8), (3, 2), (1, 16)]:
        rewards = torch.randint(-1, 3, (B, G), generator=g).double()
        for eps in (1e-6, 0.5):  # eps large enough to tell inside from outside the square root
            got = tc.group_advantages(rewards, scale=scale, eps=eps, baseline=baseline)
            assert torch.allclose(got, ref_group_advantages(rewards, scale, eps, baseline), atol=1e-12)


def test_group_advantages_invariants():
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(16, 8, generator=g)
    for scale, baseline in itertools.product(tc.ADVANTAGE_SCALES, tc.BASELINES):
        adv = tc.group_advantages(rewards, scale=scale, baseline=baseline)
        assert torch.allclose(adv.sum(dim=1), torch.zeros(16), atol=1e-5)  # zero-sum per group
    adv = tc.group_advantages(rewards)
    assert torch.allclose(adv.std(dim=1), torch.ones(16), atol=1e-4)  # unit std, up to eps
    assert torch.allclose(tc.group_advantages(3 * rewards + 7), adv, atol=1e-4)  # shift and scale change nothing
    # equal rewards whose float mean does not round back to them still give exactly 0; so does G = 1
    equal = torch.full((1, 8), 0.1)
    assert (equal - equal.mean(dim=1, keepdim=True)).abs().max() > 0  # the data can tell the two apart
    for scale, baseline in itertools.product(tc.ADVANTAGE_SCALES, tc.BASELINES):
        assert torch.equal(tc.group_advantages(equal, scale, baseline=baseline), torch.zeros(1, 8))
    assert torch.equal(tc.group_advantages(torch.tensor([[1.0], [0.0]])), torch.zeros(2, 1))


def test_group_mean_baseline_shrinks_the_expected_gradient_and_leave_one_out_keeps_it():
    """Exact expectation over every group of G = 3 draws from a 3-outcome policy: REINFORCE's
    sum_i r_i grad log pi(o_i) has mean G grad J; with the group mean as baseline (r_i is in it)
    the mean is (G - 1) grad J, and with the leave-one-out mean it is G grad J exactly."""
    G, reward = 3, torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    logits = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)
    pi = torch.softmax(logits, dim=0)
    grad_logpi = torch.eye(3, dtype=torch.float64) - pi  # row o: d log pi(o) / d logits
    grad_J = (pi[:, None] * reward[:, None] * grad_logpi).sum(dim=0)  # J = E[r]
    expected = {"reinforce": 0, "mean": 0, "leave_one_out": 0}
    for outcomes in itertools.product(range(3), repeat=G):
        p = math.prod(pi[o].item() for o in outcomes)
        r = reward[list(outcomes)]
        expected["reinforce"] = expected["reinforce"] + p * (r[:, None] * grad_logpi[list(outcomes)]).sum(dim=0)
        for baseline in ("mean", "leave_one_out"):
            A = tc.group_advantages(r[None], scale="none", baseline=baseline)[0]
            expected[baseline] = expected[baseline] + p * (A[:, None] * grad_logpi[list(outcomes)]).sum(dim=0)
    assert torch.allclose(expected["reinforce"], G * grad_J, atol=1e-12)
    assert torch.allclose(expected["mean"], (G - 1) * grad_J, atol=1e-12)
    assert torch.allclose(expected["leave_one_out"], G * grad_J, atol=1e-12)


# -----------------------------------------------------------------------------
# 2. dynamic sampling

def test_informative_groups():
    rewards = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [-1.0, -1.0, 1.0]])
    assert tc.informative_groups(rewards).tolist() == [False, False, True, True]
    g = torch.Generator().manual_seed(2)
    correct = torch.randint(0, 2, (50, 4), generator=g).bool()
    loop = [0 < sum(row) < 4 for row in correct.tolist()]  # 0 < #correct < G
    assert tc.informative_groups(correct).tolist() == loop


def test_informative_groups_equal_floats_are_not_informative_and_keep_is_bool():
    """A group of equal floats is uninformative even where its float std is not 0 (8 x 0.1 alone
    has std 8e-9 in float32): its advantages are exactly 0. keep is (B,) bool, also for B = 0."""
    equal = torch.tensor([[0.1] * 8, [0.7] * 8, [1 / 3] * 8, [0.1] * 7 + [0.2]])
    assert equal[:1].std(dim=1).item() > 0  # the data tells `std > 0` from `not all equal`
    keep = tc.informative_groups(equal)
    assert keep.dtype == torch.bool and keep.tolist() == [False, False, False, True]
    assert torch.equal(keep, ref_informative_groups(equal))
    assert [tc.informative_groups(row[None]).item() for row in equal] == [False] * 3 + [True]
    none = tc.informative_groups(Z(0, 4))
    assert none.dtype == torch.bool and none.shape == (0,)


def fake_sampler(informative, per_round=4):
    """sample_groups() for fill_batch: per_round groups of 3 a call, group k informative if
    informative(k); counts its calls."""
    def sample():
        sample.calls += 1
        ids = torch.arange(per_round) + per_round * (sample.calls - 1)
        correct = torch.tensor([[0.0, float(informative(int(k))), 0.0] for k in ids])
        return {"correct": correct, "group_id": ids, "tokens": ids[:, None, None].expand(-1, 3, 5)}
    sample.calls = 0
    return sample


def test_fill_batch_fills_exactly_and_drops_surplus():
    sampler = fake_sampler(lambda k: k % 2 == 0)  # every other group informative, 2 per round
    batch, stats = tc.fill_batch(sampler, 5, 10, filter_key="correct")
    assert batch["group_id"].tolist() == [0, 2, 4, 6, 8]  # in order, the surplus (10) dropped
    assert batch["correct"].shape == (5, 3) and batch["tokens"].shape == (5, 3, 5)
    assert stats == dict(rounds=3, groups_seen=12, groups_informative=6, groups_kept=5, full=1)
    assert sampler.calls == 3


def test_fill_batch_drops_a_group_of_equal_floats_and_reports_ints():
    """Filtered on shaped rewards of equal floats, a group whose advantages are all 0 is dropped;
    the stats are Python ints, the batch keeps the sampler's dtypes. One group a round."""
    rewards = [[0.1] * 8, [0.0] * 7 + [1.0], [0.7] * 8, [1.0] + [0.0] * 7]
    sample = rounds(*({"rewards": torch.tensor([r]), "group_id": torch.tensor([k])}
                      for k, r in enumerate(rewards)))
    batch, stats = tc.fill_batch(sample, 2, 4, filter_key="rewards")
    assert batch["group_id"].tolist() == [1, 3] and batch["group_id"].dtype == torch.long
    assert stats == dict(rounds=4, groups_seen=4, groups_informative=2, groups_kept=2, full=1)
    assert all(type(v) is int for v in stats.values())


def test_fill_batch_matches_the_loop_reference():
    g = torch.Generator().manual_seed(31)
    sizes = torch.randint(1, 5, (6,), generator=g).tolist()  # groups a round
    rounds_ = [torch.randint(0, 2, (b, 3), generator=g).float() for b in sizes]
    for batch_size, max_rounds in [(1, 6), (4, 6), (7, 3), (30, 6)]:
        results = iter(rounds_)
        batch, stats = tc.fill_batch(lambda: {"v": next(results)}, batch_size, max_rounds, "v")
        kept, expected = ref_fill_batch([r.tolist() for r in rounds_], batch_size, max_rounds)
        assert torch.equal(batch["v"], torch.cat(rounds_)[kept]) and stats == expected


def test_fill_batch_survives_an_uninformative_sampler():
    batch, stats = tc.fill_batch(fake_sampler(lambda k: False), 4, 3, filter_key="correct")
    assert stats == dict(rounds=3, groups_seen=12, groups_informative=0, groups_kept=0, full=0)
    assert batch["correct"].shape == (0, 3) and batch["tokens"].shape == (0, 3, 5)
    batch, stats = tc.fill_batch(fake_sampler(lambda k: k == 5), 4, 3, filter_key="correct")
    assert batch["group_id"].tolist() == [5] and stats["full"] == 0 and stats["rounds"] == 3


def test_fill_batch_filters_on_the_key_it_is_given():
    # "rewards" carry a soft overlong penalty, "correct" is the verifier's verdict
    correct = torch.tensor([[False, False, False], [True, False, False], [True, True, True]])
    rewards = torch.tensor([[-1.0, -1.125, -1.0],  # all wrong, but the shaped rewards differ
                            [1.0, -1.0, -1.0],
                            [1.0, 0.875, 1.0]])  # all right, shaped rewards differ
    sample = lambda: {"rewards": rewards, "correct": correct, "group_id": torch.arange(3)}  # noqa: E731
    by_correct, stats = tc.fill_batch(sample, 3, 1, filter_key="correct")
    assert by_correct["group_id"].tolist() == [1] and stats["groups_informative"] == 1
    by_reward, _ = tc.fill_batch(sample, 3, 1, filter_key="rewards")  # what a shaped-reward filter would keep
    assert by_reward["group_id"].tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="filter_key"):
        tc.fill_batch(sample, 3, 1)  # no default that could be the wrong one


# -----------------------------------------------------------------------------
# 3. the per-token surrogate

def test_policy_gradient_surrogate_hand_worked_and_loop():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.8]]))
    got = tc.policy_gradient_surrogate(logp, torch.tensor([2.0]))  # raw reward 2 on every token
    assert torch.allclose(got, torch.tensor([[2 * math.log(2), 4 * math.log(2), -2 * math.log(0.8)]]))
    g = torch.Generator().manual_seed(21)
    logp, adv = -torch.rand(4, 6, generator=g), torch.randn(4, 6, generator=g)
    loop = [[-float(adv[i, t]) * float(logp[i, t]) for t in range(6)] for i in range(4)]
    assert torch.allclose(tc.policy_gradient_surrogate(logp, adv), torch.tensor(loop))


def test_policy_gradient_surrogate_gradient_is_minus_the_advantage():
    g = torch.Generator().manual_seed(32)
    for adv in (torch.randn(3, generator=g, dtype=torch.float64),
                torch.randn(3, 4, generator=g, dtype=torch.float64)):
        logp = (-torch.rand(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
        loss = tc.policy_gradient_surrogate(logp, adv)
        assert torch.allclose(loss, ref_policy_gradient_surrogate(logp.detach(), adv), atol=1e-12)
        loss.sum().backward()
        assert torch.equal(logp.grad, -(adv if adv.dim() == 2 else adv[:, None].expand(3, 4)))


def test_policy_gradient_surrogate_gives_each_response_its_advantage_on_every_token():
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.25, -3.0, -1.0]], dtype=torch.float64)
    got = tc.policy_gradient_surrogate(logp, torch.tensor([1.5, -2.0], dtype=torch.float64))
    # -A_i log pi: row 1 with A = 1.5, row 2 with A = -2
    expected = torch.tensor([[1.5, 0.75, 3.0], [-0.5, -6.0, -2.0]], dtype=torch.float64)
    assert got.dtype == torch.float64 and torch.equal(got, expected)


def test_importance_ratio_ignores_padding_garbage_in_value_and_gradient():
    """NaN or inf in padding (of logp or old_logp) gives ratio 1 there and a finite gradient 0;
    the real tokens' ratios and gradients are those of clean inputs."""
    g = torch.Generator().manual_seed(33)
    mask = random_mask(4, 5, g)
    old = -torch.rand(4, 5, generator=g, dtype=torch.float64)
    clean = old + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    expected = ref_importance_ratio(clean, old, mask)
    for fill in (NAN, INF, -INF):
        for dirty_old in (False, True):
            logp, old_ = clean.clone(), old.clone()
            (old_ if dirty_old else logp)[~mask] = fill
            logp.requires_grad_()
            ratio = tc.importance_ratio(logp, old_, mask, "token")
            assert torch.allclose(ratio, expected, atol=1e-12) and (ratio[~mask] == 1).all()
            ratio.sum().backward()
            assert torch.allclose(logp.grad, torch.where(mask, expected, 0.0), atol=1e-12)


def test_importance_ratio_hand_worked():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.2, 0.2, 0.2]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.1], [0.4, 0.2, 0.8]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # 0.5 / 0.25 = 2, 0.25 / 0.5 = 0.5, padding 1 (not 9); 0.5, 1, 0.25
    assert torch.allclose(tc.importance_ratio(logp, old, mask),
                          torch.tensor([[2.0, 0.5, 1.0], [0.5, 1.0, 0.25]]))


def test_importance_ratio_old_logp_is_a_constant():
    """No gradient reaches old_logp, even when it carries one; logp's is the ratio (d rho / d
    logp = rho) on real tokens and 0 on padding."""
    g = torch.Generator().manual_seed(35)
    mask = random_mask(3, 5, g)
    logp = (-torch.rand(3, 5, generator=g, dtype=torch.float64)).requires_grad_()
    old = (-torch.rand(3, 5, generator=g, dtype=torch.float64)).requires_grad_()
    ratio = tc.importance_ratio(logp, old, mask)
    ratio.sum().backward()
    assert old.grad is None or (old.grad == 0).all()
    assert torch.allclose(logp.grad, torch.where(mask, ratio.detach(), 0.0), atol=1e-12)


def test_importance_ratio_per_token_and_per_sequence():
    # response 0: log-ratios 0.1, 0.3 (and padding); response 1: -0.2, 0.0, 0.2
    old = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    log_ratio = torch.tensor([[0.1, 0.3, 5.0], [-0.2, 0.0, 0.2]], dtype=torch.float64)
    token = tc.importance_ratio(log_ratio, old, mask, "token")
    assert torch.allclose(token, torch.tensor([[math.exp(0.1), math.exp(0.3), 1.0], [math.exp(-0.2), 1.0, math.exp(0.2)]],
                                              dtype=torch.float64))  # padding is exactly 1
    # GSPO: the geometric mean of a response's token ratios, exp(0.2) and exp(0) = 1
    for level in ("sequence", "sequence_token"):
        logp = log_ratio.clone().requires_grad_()
        s = tc.importance_ratio(logp, old, mask, level)
        assert torch.allclose(s, torch.tensor([[math.exp(0.2)] * 2 + [1.0], [1.0] * 3], dtype=torch.float64))
        s[:, 0].sum().backward()  # the first token's ratio: how does it move with each log-prob?
        if level == "sequence":  # d s_i / d logp_{i,t} = s_i / |o_i|, for every token of the response
            expected = [[math.exp(0.2) / 2] * 2 + [0.0], [1 / 3] * 3]
        else:  # GSPO-token: only the token's own log-prob, with slope s_i
            expected = [[math.exp(0.2), 0.0, 0.0], [1.0, 0.0, 0.0]]
        assert torch.allclose(logp.grad, torch.tensor(expected, dtype=torch.float64))


def test_clipped_surrogate_hand_worked():
    rho = torch.tensor([[1.5, 1.1, 0.5, 0.9]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    # rho 1.5, A=+1: clipped at 1.2 -> -1.2; rho 1.1: -1.1; rho 0.5, A=-1: -min(-0.5, -0.8) = 0.8; rho 0.9: 0.9
    assert torch.allclose(tc.clipped_surrogate(rho, adv), torch.tensor([[-1.2, -1.1, 0.8, 0.9]]))
    higher = tc.clipped_surrogate(rho, adv, eps_low=0.2, eps_high=0.28)  # Clip-Higher
    assert torch.allclose(higher, torch.tensor([[-1.28, -1.1, 0.8, 0.9]]))
    assert torch.allclose(tc.clipped_surrogate(rho, torch.tensor([2.0])), tc.clipped_surrogate(rho, torch.full((1, 4), 2.0)))
    # switched off: eps_low >= 1 puts the lower bound at or below 0, where no ratio goes
    rho = torch.tensor([[0.01, 0.5, 1.0, 3.0]])
    for a in (1.0, -1.0):
        off = tc.clipped_surrogate(rho, torch.tensor([a]), eps_low=10.0, eps_high=float("inf"))
        assert torch.allclose(off, -rho * a)
    assert torch.allclose(tc.clipped_surrogate(rho, torch.tensor([-1.0]), eps_low=1.0), rho)  # only the lower clip off
    assert torch.allclose(tc.clipped_surrogate(rho, torch.tensor([-1.0])), torch.tensor([[0.8, 0.8, 1.0, 3.0]]))


def test_clipped_surrogate_gradient_is_reinforces_inside_and_0_where_clipped():
    """d loss / d rho = -A inside [1 - eps_low, 1 + eps_high] (rho = 1 and 1.1 included, where the
    clipped and unclipped terms are equal), 0 outside in the direction A pushes, -A the other
    way."""
    rho = torch.tensor([[1.0, 1.1, 0.9, 1.5, 1.5, 0.5, 0.5]], dtype=torch.float64)
    rho.requires_grad_()
    adv = torch.tensor([[2.0, 2.0, -3.0, 2.0, -3.0, -3.0, 2.0]], dtype=torch.float64)
    loss = tc.clipped_surrogate(rho, adv)
    assert torch.allclose(loss, ref_clipped_surrogate(rho.detach(), adv, 0.2, 0.2), atol=1e-12)
    loss.sum().backward()
    assert rho.grad.tolist() == [[-2.0, -2.0, 3.0, 0.0, 3.0, 0.0, -2.0]]
    g = torch.Generator().manual_seed(34)
    ratio = torch.exp(0.4 * torch.randn(5, 6, generator=g, dtype=torch.float64))
    adv = torch.randn(5, generator=g)
    assert torch.allclose(tc.clipped_surrogate(ratio, adv, 0.2, 0.28),
                          ref_clipped_surrogate(ratio, adv, 0.2, 0.28))


def test_clipped_surrogate_equals_torch_minimums_form_ties_included():
    """The value of -torch.minimum(rho A, clip(rho) A), bit for bit, and its gradient, at ties too:
    rho A == clip(rho) A where rho is inside the range, on a bound, or one float past one (the two
    terms round to one value), A of both signs and 0. Past a bound, torch.minimum splits a tie
    (-A / 2); the equation's own gradient is 0 where A pushes rho out (the clip binds), -A where
    A pulls it back in, and that is what clipped_surrogate gives there."""
    low, high, a = 1 - 0.2, 1 + 0.28, 11 / 7
    past_low, past_high = math.nextafter(low, 0), math.nextafter(high, 2)  # one float out
    rho = torch.tensor([past_high, past_high, past_low, past_low, high, high, low, low, 1.1,
                        past_high, 9.0, float("nan"), float("inf"), 0.0], dtype=torch.float64)
    A = torch.tensor([a, -a, -a, a, a, -a, a, -a, 2.0, 0.0, -3.0, 2.0, -3.0, 2.0],
                     dtype=torch.float64)
    assert (rho * A)[:4].tolist() == (torch.clamp(rho, low, high) * A)[:4].tolist()  # ties
    mine, theirs = rho[None].clone().requires_grad_(), rho[None].clone().requires_grad_()
    loss = tc.clipped_surrogate(mine, A[None], 0.2, 0.28)
    main = -torch.minimum(theirs * A, torch.clamp(theirs, low, high) * A)  # torch.minimum's form
    assert torch.equal(loss.isnan(), main.isnan())
    assert torch.equal(loss.nan_to_num(), main.nan_to_num())
    loss.nansum().backward()
    main.nansum().backward()
    assert mine.grad[0, :4].tolist() == [0.0, a, 0.0, -a]  # the clip binds: 0; else -A
    assert theirs.grad[0, :4].tolist() == [-a / 2, a / 2, a / 2, -a / 2]  # torch.minimum splits
    assert torch.equal(mine.grad[0, 4:].nan_to_num(), theirs.grad[0, 4:].nan_to_num())


def test_clipped_surrogate_matches_the_loop_reference_for_each_clip_range():
    """GRPO's one eps, Clip-Higher, and both clips off; advantages per response and per token."""
    g = torch.Generator().manual_seed(36)
    ratio = torch.exp(0.5 * torch.randn(6, 7, generator=g, dtype=torch.float64))
    for adv in (torch.randn(6, generator=g, dtype=torch.float64),
                torch.randn(6, 7, generator=g, dtype=torch.float64)):
        for eps_low, eps_high in ((0.2, 0.2), (0.2, 0.28), (0.1, 0.5), (10.0, float("inf"))):
            assert torch.allclose(tc.clipped_surrogate(ratio, adv, eps_low, eps_high),
                                  ref_clipped_surrogate(ratio, adv, eps_low, eps_high),
                                  atol=1e-12)


def test_kl_k3_value_and_the_direction_of_its_gradient():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.5), math.log(0.5)]])
    # equal -> 0; r = 0.5 / 0.25 = 2 -> 2 - log 2 - 1
    assert torch.allclose(tc.kl_k3(logp, ref), torch.tensor([[0.0, 1 - math.log(2)]]))
    g = torch.Generator().manual_seed(5)
    assert (tc.kl_k3(torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)) >= 0).all()
    # a 5-token categorical, o ~ pi_theta exactly: weight each token by pi_theta(o)
    logits = torch.randn(5, generator=g, dtype=torch.float64).requires_grad_()
    ref = torch.log_softmax(torch.randn(5, generator=g, dtype=torch.float64), dim=-1)
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    k3 = tc.kl_k3(logp[None], ref[None])[0]  # (5,)
    kl_pi_ref, kl_ref_pi = (p * (logp - ref)).sum(), (ref.exp() * (ref - logp)).sum()
    assert (p * k3).sum().item() == pytest.approx(kl_pi_ref.item(), rel=1e-12)  # unbiased for KL(pi || ref)
    assert (p * (1 - torch.exp(ref - logp))).sum().item() == pytest.approx(0.0, abs=1e-12)  # E[1 - r] = 0
    expected_grad, = torch.autograd.grad((p.detach() * k3).sum(), logits, retain_graph=True)
    grad_ref_pi, = torch.autograd.grad(kl_ref_pi, logits, retain_graph=True)
    grad_pi_ref, = torch.autograd.grad(kl_pi_ref, logits)
    assert torch.allclose(expected_grad, grad_ref_pi, atol=1e-12)  # the gradient is KL(ref || pi)'s
    assert not torch.allclose(expected_grad, grad_pi_ref, atol=1e-3)


def test_kl_k3_matches_the_loop_reference():
    """Both directions (ref above and below logp), far and near r = 1, in float64 and float32."""
    g = torch.Generator().manual_seed(37)
    logp = -3 * torch.rand(5, 8, generator=g, dtype=torch.float64)
    scale = torch.tensor([3.0, 1e-3], dtype=torch.float64).repeat(4)  # far, near, far, ...
    ref = logp + scale * torch.randn(5, 8, generator=g, dtype=torch.float64)
    expected = ref_kl_k3(logp, ref)
    assert torch.allclose(tc.kl_k3(logp, ref), expected, rtol=1e-10, atol=0)
    assert torch.allclose(tc.kl_k3(logp.float(), ref.float()).double(), expected, rtol=1e-3,
                          atol=1e-6)


def test_kl_k3_is_not_clamped_and_is_exact_near_r_1():
    """No clamp (verl's low_var_kl clamps k3 at 10 and log r at +-20): at log r = 3 k3 = e^3 - 4
    = 16.09 and its gradient w.r.t. logp is 1 - r = -19.09, not 0; at log r = -25 it is 24. In
    float32 near r = 1, r - 1 - log r is ~(log r)^2 / 2, positive: expm1, not exp(.) - 1."""
    logp = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[3.0, -25.0, 0.0]])
    kl = tc.kl_k3(logp, ref)
    assert torch.allclose(kl, ref_kl_k3(logp.detach(), ref).float())
    assert kl[0, 0].item() == pytest.approx(math.exp(3) - 4)  # 16.09
    assert kl[0, 1].item() == pytest.approx(24.0)
    kl.sum().backward()
    assert logp.grad[0, 0].item() == pytest.approx(1 - math.exp(3))  # -19.09
    assert logp.grad[0, 1].item() == pytest.approx(1.0)
    log_r = torch.tensor([[1e-4, -1e-4, 3e-4, -2e-3]])
    near = tc.kl_k3(Z(1, 4), log_r)  # float32
    assert (near > 0).all() and torch.allclose(near, log_r ** 2 / 2, rtol=2e-3, atol=0)


# -----------------------------------------------------------------------------
# 4. aggregation and the losses

def test_token_weights_hand_worked_each_denominator():
    # B = 2 groups of G = 2: lengths 3, 1 | 0, 2 (an empty response in group 1)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]])
    d = {mode: tc._loss_denominators(mask, mode, 2, 5).tolist() for mode in tc.AGGREGATION_MODES}
    assert d["sample"] == [12.0, 4.0, 4.0, 8.0]  # N |o_i|, an empty count clamped to 1
    assert d["token"] == [6.0] * 4  # sum over the batch of |o_j|
    assert d["group_token"] == [8.0, 8.0, 4.0, 4.0]  # B * tokens of i's group
    assert d["constant"] == [20.0] * 4  # N * max_len
    for mode in tc.AGGREGATION_MODES:  # w = mask / d: each real token of response i gets 1 / d_i
        w = tc.token_weights(mask, mode, group_size=2, max_len=5)
        assert w.tolist() == (mask / torch.tensor(d[mode])[:, None]).tolist(), mode
    assert tc.token_weights(mask, "token")[0].tolist() == pytest.approx([1 / 6] * 3)
    w = tc.token_weights(mask, "sample")
    assert w[2].sum() == 0 and w.sum().item() == pytest.approx(0.75)  # the empty row's 1/N is not handed out


def test_token_weights_invariants():
    g = torch.Generator().manual_seed(6)
    mask = random_mask(12, 9, g)
    for mode in ("sample", "token", "group_token"):
        assert tc.token_weights(mask, mode, group_size=4).sum().item() == pytest.approx(1.0)
    one_group = random_mask(5, 7, g)
    assert torch.allclose(tc.token_weights(one_group, "group_token", group_size=5), tc.token_weights(one_group, "token"))
    per_group = tc.token_weights(mask, "group_token", group_size=4).sum(dim=1).view(3, 4).sum(dim=1)
    assert torch.allclose(per_group, torch.full((3,), 1 / 3))  # every prompt gets 1/B, whatever its lengths
    # "constant" divides by max_len, not by the padded width T (verl's default divides by T)
    assert torch.allclose(tc.token_weights(mask, "constant", max_len=23), mask / (12 * 23))
    assert tc.aggregate(torch.tensor([[1, 2, 9]]), torch.tensor([[1, 1, 0]]), "token").item() == 1.5
    assert tc.aggregate(torch.tensor([[True, False]]), O(1, 2), "token").item() == 0.5
    # lengths are counted in at least float32: bf16 would count 257 tokens as 256
    d = tc._loss_denominators(torch.ones(1, 257), "sample", None, None, torch.bfloat16)
    assert d.dtype == torch.float32 and d.item() == 257


def test_the_denominators_in_the_dtype_asked_and_clamped_when_empty():
    """token_weights' d_i comes in the dtype aggregate asks for (float64: max_len 0.1 times N
    exact to float64), and a count of 0 is clamped to 1 in every mode: an empty response, group
    or batch gets weight 0, not NaN."""
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 0, 0], [1, 0, 0]])  # lengths 2, 0 | 0, 1
    d = tc._loss_denominators(mask, "constant", None, 0.1, torch.float64)
    assert d.dtype == torch.float64 and d.tolist() == [4 * 0.1] * 4
    for mode in tc.AGGREGATION_MODES:
        got = tc._loss_denominators(mask, mode, 2, 0.1, torch.float64)
        assert got.dtype == torch.float64
        assert torch.equal(got, ref_loss_denominators(mask, mode, 2, 0.1))
        assert tc._loss_denominators(mask, mode, 2, 3).dtype == torch.float32
        assert tc.token_weights(mask, mode, group_size=2, max_len=3).dtype == torch.float32
    empty_group = torch.tensor([[1, 1], [1, 0], [0, 0], [0, 0]])  # group 1 has no token
    d = tc._loss_denominators(empty_group, "group_token", 2, None)
    assert d.tolist() == [6.0, 6.0, 2.0, 2.0]  # B * 3 tokens | B * 1, not B * 0
    for mode in ("sample", "token", "group_token"):
        w = tc.token_weights(Z(4, 3), mode, group_size=2)  # no token in the batch
        assert torch.equal(w, Z(4, 3)), mode


def test_aggregate_alone_ignores_padding_garbage_and_returns_a_0d_tensor():
    g = torch.Generator().manual_seed(35)
    mask = random_mask(6, 5, g)
    clean = torch.randn(6, 5, generator=g, dtype=torch.float64)
    for mode in tc.AGGREGATION_MODES:
        expected = ref_aggregate(clean, mask, mode, 3, 7.0)
        for fill in (NAN, INF, -INF, 1e300):
            x = clean.clone()
            x[~mask] = fill
            x.requires_grad_()
            got = tc.aggregate(x, mask, mode, group_size=3, max_len=7.0)
            assert got.shape == () and got.dtype == torch.float64
            assert got.item() == pytest.approx(expected, rel=1e-12)
            got.backward()
            assert torch.isfinite(x.grad).all() and (x.grad[~mask] == 0).all()


@pytest.mark.parametrize("mode", tc.AGGREGATION_MODES)
@pytest.mark.parametrize("ratio_level", tc.RATIO_LEVELS)
def test_policy_loss_matches_the_loop_reference(mode, ratio_level):
    g = torch.Generator().manual_seed(7)
    B, G, T = 3, 4, 10
    N = B * G
    mask = random_mask(N, T, g)
    mask[5] = False  # an empty response
    logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 2
    old = logp + 0.4 * torch.randn(N, T, generator=g, dtype=torch.float64)  # ratios on both sides of the clip
    ref_logp = logp + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
    per_response, per_token = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, T, generator=g,
                                                                                          dtype=torch.float64)
    eps = (0.2, 0.28) if ratio_level == "token" else (0.03, 0.04)  # GSPO's sequence ratio moves less
    for adv in (per_response, per_token):
        if ratio_level == "sequence" and adv.dim() == 2:
            continue  # GSPO proper has one advantage per response
        for beta, surrogate in ((0.0, "clip"), (0.04, "clip"), (0.0, "reinforce")):
            if surrogate == "reinforce" and ratio_level != "token":
                continue
            kw = dict(mode=mode, eps_low=eps[0], eps_high=eps[1], group_size=G, max_len=T + 3, ref_logp=ref_logp,
                      beta=beta)
            ours, theirs = logp.clone().requires_grad_(), logp.clone().requires_grad_()
            loss, _ = tc.policy_loss(ours, old, adv, mask, ratio_level=ratio_level, surrogate=surrogate, **kw)
            expected = ref_loss(theirs, old, adv, mask, ratio_level=ratio_level, surrogate=surrogate, **kw)
            assert loss.item() == pytest.approx(expected.item(), rel=1e-9, abs=1e-12)
            loss.backward()
            expected.backward()
            assert torch.allclose(ours.grad, theirs.grad, atol=1e-12)


@pytest.mark.parametrize("mode", tc.AGGREGATION_MODES)
def test_on_policy_gradient_is_minus_weight_times_advantage(mode):
    """On-policy, d loss / d logp = w (-A + beta (1 - pi_ref / pi)) for every surrogate and ratio level:
    GSPO's sequence ratio changes which tokens are clipped off-policy, not the on-policy credit."""
    g = torch.Generator().manual_seed(18)
    N, T, G, beta = 8, 6, 4, 0.3
    mask = random_mask(N, T, g)
    old = -torch.rand(N, T, generator=g, dtype=torch.float64)
    ref_logp = old + 0.5 * torch.randn(N, T, generator=g, dtype=torch.float64)
    w = tc.token_weights(mask, mode, group_size=G, max_len=T + 5).double()
    for adv in (torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, T, generator=g, dtype=torch.float64)):
        A = adv if adv.dim() == 2 else adv[:, None]
        for b in (0.0, beta):
            expected = w * (-A + b * (1 - torch.exp(ref_logp - old)))
            for surrogate, level in (("reinforce", "token"), ("clip", "token"), ("clip", "sequence"),
                                     ("clip", "sequence_token")):
                if level == "sequence" and adv.dim() == 2:
                    continue
                logp = old.clone().requires_grad_()
                loss, stats = tc.policy_loss(logp, old, adv, mask, mode=mode, group_size=G, max_len=T + 5,
                                             ref_logp=ref_logp, beta=b, surrogate=surrogate, ratio_level=level)
                loss.backward()
                assert torch.allclose(logp.grad, expected, atol=1e-12), (surrogate, level, b)
    kl = [float(r - math.log(r) - 1) for r in torch.exp(ref_logp - old)[mask].tolist()]
    assert stats["kl_mean"] == pytest.approx(sum(kl) / len(kl))


def test_gspo_token_equals_gspo_when_a_response_has_one_advantage():
    g = torch.Generator().manual_seed(24)
    N, T = 6, 7
    mask = random_mask(N, T, g)
    old = -torch.rand(N, T, generator=g, dtype=torch.float64)
    logp_true = old + 0.02 * torch.randn(N, T, generator=g, dtype=torch.float64)  # some sequences clipped, some not
    s = tc.importance_ratio(logp_true, old, mask, "sequence")[:, 0]  # (N,) about 1 +- 0.01
    adv = torch.sign(s - 1) * torch.tensor([1.0, -1.0] * (N // 2), dtype=torch.float64)  # even rows are clipped
    results = {}
    for level, A in (("sequence", adv), ("sequence_token", adv[:, None].expand(N, T))):
        logp = logp_true.clone().requires_grad_()
        loss, stats = tc.policy_loss(logp, old, A, mask, mode="sample", eps_low=3e-3, eps_high=4e-3, ratio_level=level)
        loss.backward()
        results[level] = (loss.detach(), logp.grad, stats)
    moved = results["sequence"][1].abs().sum(dim=1) > 0  # (N,) rows whose sequence ratio is not clipped
    assert 0 < moved.sum() < N  # the data holds both cases
    assert torch.allclose(results["sequence"][0], results["sequence_token"][0], atol=1e-14)
    assert torch.allclose(results["sequence"][1], results["sequence_token"][1], atol=1e-14)
    with pytest.raises(ValueError, match=r"'sequence_token': \(N, T\)"):
        tc.policy_loss(logp_true, old, adv[:, None].expand(N, T), mask, ratio_level="sequence")


def test_sequence_ratio_of_a_bf16_answer_is_float32():
    """A 1000-token bf16 answer whose log-probs rose one bf16 step (2^-7 at 1.5) on 474 tokens: the
    ratio s = exp(474 / 1000 * 2^-7) = 1.0037 comes in float32, outside GSPO's 1 + 4e-4; in bf16 it
    would round to 1.0 and the clip would never fire. float64 stays float64."""
    old = torch.full((1, 1000), -1.5, dtype=torch.bfloat16)
    logp = old.clone()
    logp[0, :474] = -1.5 + 2 ** -7
    mask = torch.ones(1, 1000, dtype=torch.bool)
    s = tc.sequence_ratio(logp, old, mask)
    assert s.dtype == torch.float32
    assert s[0, 0].item() == pytest.approx(math.exp(474 / 1000 * 2 ** -7), rel=1e-6)  # 1.0037
    assert (s > 1 + 4e-4).all() and torch.tensor(s[0, 0].item()).bfloat16().item() == 1.0
    for per_token in (False, True):
        s64 = tc.sequence_ratio(logp.double(), old.double(), mask, per_token)
        assert s64.dtype == torch.float64


def test_sequence_ratio_alone_padding_garbage_empty_response_and_constant_old_logp():
    """Padding garbage (NaN, inf) reaches neither the ratio (exactly 1 there) nor the gradient; an
    empty response gets ratio 1 and gradient 0, not NaN; old_logp is a constant: given logp itself,
    d s_i / d logp_{i,t} is still s_i / |o_i| (per_token: s_i), not 0."""
    g = torch.Generator().manual_seed(37)
    mask = random_mask(5, 6, g)
    mask[3] = False  # an empty response
    old = -torch.rand(5, 6, generator=g, dtype=torch.float64)
    clean = old + 0.1 * torch.randn(5, 6, generator=g, dtype=torch.float64)
    expected = ref_sequence_ratio(clean, old, mask)
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1).double()
    for per_token in (False, True):
        for fill in (NAN, INF, -INF):
            logp, old_ = clean.clone(), old.clone()
            logp[~mask], old_[~mask] = fill, -fill
            logp.requires_grad_()
            s = tc.sequence_ratio(logp, old_, mask, per_token)
            assert torch.allclose(s, expected, atol=1e-12) and (s[~mask] == 1).all()
            s.sum().backward()
            assert torch.isfinite(logp.grad).all() and (logp.grad[~mask] == 0).all()
            slope = expected * (1 if per_token else mask.sum(dim=1, keepdim=True) / lengths)
            assert torch.allclose(logp.grad, torch.where(mask, slope, 0.0), atol=1e-12)
        logp = clean.clone().requires_grad_()  # old_logp is logp, graph and all
        s = tc.sequence_ratio(logp, logp, mask, per_token)
        assert torch.equal(s, torch.ones_like(s))
        s[:, :1].sum().backward()  # the first token's ratio
        expected_grad = mask / lengths if not per_token else mask & (torch.arange(6) == 0)
        assert torch.allclose(logp.grad, expected_grad.double(), atol=1e-12)


def test_padding_garbage_reaches_no_loss_and_no_gradient():
    g = torch.Generator().manual_seed(9)
    N, T, V = 6, 8, 4
    mask = random_mask(N, T, g, min_len=2)
    mask[0, :] = True
    logp = -torch.rand(N, T, generator=g)
    inputs = [logp, logp + 0.3 * torch.randn(N, T, generator=g), logp + 0.3 * torch.randn(N, T, generator=g),
              torch.randn(N, T, generator=g)]  # logp, old_logp, ref_logp, per-token advantages
    logits = [torch.randn(N, T, V, generator=g), torch.randn(N, T, V, generator=g)]  # student, teacher
    results = []
    for fill in (None, float("nan"), float("inf"), -float("inf"), 1e30):
        tensors, s, t = [x.clone() for x in inputs], logits[0].clone(), logits[1].clone()
        if fill is not None:
            for x in tensors:
                x[~mask] = fill
            s[~mask], t[~mask] = fill, fill
        leaf, s = tensors[0].requires_grad_(), s.requires_grad_()
        loss, stats = tc.policy_loss(leaf, tensors[1], tensors[3], mask, mode="token", ref_logp=tensors[2], beta=0.1)
        for level in ("sequence", "sequence_token"):
            loss = loss + tc.policy_loss(leaf, tensors[1], tensors[3][:, 0], mask, ratio_level=level)[0]
        loss = loss + tc.self_distillation_loss(s, t, mask)
        for mode in tc.AGGREGATION_MODES:  # and aggregate alone, on padding nobody zeroed
            loss = loss + tc.aggregate(leaf, mask, mode, group_size=2, max_len=T)
        loss.backward()
        results.append((loss.detach(), leaf.grad, s.grad, stats))
    for loss, grad, s_grad, stats in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(grad, results[0][1])
        assert torch.equal(s_grad, results[0][2]) and stats == results[0][3]
    assert torch.isfinite(results[0][1]).all() and (results[0][2][~mask] == 0).all()


def test_clip_fractions_counted_at_both_bounds():
    # rho: 1.5 1.1 0.5 0.6 0.9 1.3 0.7 (padding); A: +1 +1 -1 -1 -1 -1 +1 +1
    # high clip: A > 0 and rho > 1.2 -> token 0; low clip: A < 0 and rho < 0.8 -> tokens 2, 3.
    # Tokens 5 and 6 are outside the range too, but on the side where the unclipped term is the
    # min: not clipped (counting token 6 as low-clipped would give 1/7, not 2/7).
    rho = torch.tensor([[1.5, 1.1, 0.5, 0.6, 0.9, 1.3, 0.7, 3.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])
    _, stats = tc.policy_loss(torch.log(rho), torch.zeros(1, 8), adv, mask, mode="token")
    assert stats["clip_frac_high"] == pytest.approx(1 / 7)
    assert stats["clip_frac_low"] == pytest.approx(2 / 7)
    assert stats["num_tokens"] == 7 and stats["ratio_mean"] == pytest.approx(6.6 / 7)
    _, higher = tc.policy_loss(torch.log(rho), torch.zeros(1, 8), adv, mask, mode="token",
                               eps_high=0.6)
    assert higher["clip_frac_high"] == 0.0  # Clip-Higher lets token 0 through
    _, reinforce = tc.policy_loss(torch.log(rho), None, adv, mask, surrogate="reinforce")
    assert reinforce == dict(num_tokens=7)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("ratio_level", tc.RATIO_LEVELS)
def test_policy_loss_stats_match_the_loop_reference(ratio_level, dtype):
    g = torch.Generator().manual_seed(41)
    N, T = 12, 9
    mask = random_mask(N, T, g)
    mask[3] = False  # an empty response
    old = -torch.rand(N, T, generator=g, dtype=dtype) * 2
    step = 0.4 if ratio_level == "token" else 0.05  # ratios on both sides of the clip
    logp = old + step * torch.randn(N, T, generator=g, dtype=dtype)
    ref_logp = logp + 0.3 * torch.randn(N, T, generator=g, dtype=dtype)
    eps = (0.2, 0.28) if ratio_level == "token" else (0.01, 0.015)
    per_response = torch.randn(N, generator=g, dtype=dtype)
    per_response[0] = 0.0  # A = 0: clipped on neither side
    for adv in (per_response, torch.randn(N, T, generator=g, dtype=dtype)):
        if ratio_level == "sequence" and adv.dim() == 2:
            continue
        for beta in (0.0, 0.1):
            garbage = [x.clone() for x in (logp, old, ref_logp)]
            for x in garbage:
                x[~mask] = NAN  # padding garbage changes no statistic
            _, stats = tc.policy_loss(*garbage[:2], adv, mask, eps_low=eps[0], eps_high=eps[1],
                                      ref_logp=garbage[2], beta=beta, ratio_level=ratio_level)
            want = ref_loss_stats(logp, old, adv, mask, *eps, ratio_level, ref_logp, beta)
            assert stats.keys() == want.keys()
            assert 0 < stats["clip_frac_low"] and 0 < stats["clip_frac_high"]  # both are counted
            for name in ("num_tokens", "clip_frac_low", "clip_frac_high"):
                assert stats[name] == want[name], (name, adv.dim(), beta)  # counts: exact
            rel = 1e-12 if dtype == torch.float64 else 1e-5
            for name in ("ratio_mean", "kl_mean")[:1 + (beta > 0)]:
                assert stats[name] == pytest.approx(want[name], rel=rel), name


def test_policy_loss_stats_kl_mean_only_when_beta_is_positive_and_python_numbers():
    g = torch.Generator().manual_seed(36)
    mask = random_mask(4, 5, g)
    old = -torch.rand(4, 5, generator=g)
    logp, ref_logp, adv = old + 0.1, old - 0.2, torch.randn(4, generator=g)
    clip = {"num_tokens", "clip_frac_low", "clip_frac_high", "ratio_mean"}
    for beta, surrogate, keys in ((0.0, "clip", clip), (0.1, "clip", clip | {"kl_mean"}),
                                  (0.0, "reinforce", {"num_tokens"}),
                                  (0.1, "reinforce", {"num_tokens", "kl_mean"})):
        _, stats = tc.policy_loss(logp, old, adv, mask, ref_logp=ref_logp, beta=beta,
                                  surrogate=surrogate)  # ref_logp given even when beta = 0
        assert set(stats) == keys, (beta, surrogate)
        assert type(stats["num_tokens"]) is int and stats["num_tokens"] == int(mask.sum())
        assert all(type(v) is float for k, v in stats.items() if k != "num_tokens")
    kl = [float(r - math.log(r) - 1) for r in torch.exp(ref_logp - logp)[mask].tolist()]
    assert stats["kl_mean"] == pytest.approx(sum(kl) / len(kl), rel=1e-5)


def test_policy_loss_reads_values_once_and_names_a_bad_one():
    """The values are checked with the statistics in one read: no false alarm when a sum of finite
    inputs overflows, NaN in padding is no error, and a bad value is named after the read."""
    loss, _ = tc.policy_loss(torch.zeros(2, 1), torch.zeros(2, 1), torch.tensor([3e38, 3e38]),
                             torch.ones(2, 1))
    assert loss.item() == pytest.approx(-3e38)
    adv = torch.tensor([[1.0, float("nan")]])
    _, stats = tc.policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), adv, torch.tensor([[1, 0]]))
    assert stats["num_tokens"] == 1
    with pytest.raises(ValueError, match=r"mask must be 0 or 1, got 0.5 at index \(0, 1\)"):
        tc.policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1), torch.tensor([[1, 0.5]]))
    with pytest.raises(ValueError, match=r"old_logp must be finite on real tokens, got nan at index"):
        tc.policy_loss(torch.zeros(1, 2), torch.tensor([[0.0, float("nan")]]), torch.zeros(1),
                       torch.ones(1, 2))


BAD_REAL_VALUES = [  # (what sits on real token (0, 1), or which response, and the name refused)
    (dict(logp=-INF), "logp"), (dict(logp=INF), "logp"), (dict(logp=NAN), "logp"),
    (dict(old_logp=INF), "old_logp"), (dict(old_logp=-INF), "old_logp"),
    (dict(advantages=NAN), "advantages"), (dict(advantages=-INF), "advantages"),
    (dict(ref_logp=NAN), "ref_logp"), (dict(ref_logp=-INF), "ref_logp"),
    (dict(advantages_empty=INF), "advantages"),  # the (N,) advantage of a response with no token
    (dict(old_logp=NAN, surrogate="reinforce"), "old_logp"),  # given, if REINFORCE ignores it
    (dict(logp=-INF, surrogate="reinforce"), "logp"), (dict(logp=INF, ratio_level="sequence"), "logp"),
    (dict(logp=-INF, beta=0.0), "logp"),  # the ratio is exp(-inf) = 0: a finite loss
]


@pytest.mark.parametrize("bad, name", BAD_REAL_VALUES)
def test_policy_loss_names_an_input_not_finite_on_a_real_token(bad, name):
    """Each input is checked where it counts, an (N,) advantage on every response (an empty one's
    too), and the same values in padding are no error."""
    mask = torch.tensor([[True, True, False], [False, False, False]])
    kw = dict(logp=-torch.ones(2, 3), old_logp=-torch.ones(2, 3), ref_logp=-torch.ones(2, 3),
              advantages=torch.tensor([1.0, -1.0]), beta=bad.get("beta", 0.1))
    surrogate, level = bad.get("surrogate", "clip"), bad.get("ratio_level", "token")
    for key, value in bad.items():
        if key == "advantages_empty":
            kw["advantages"] = torch.tensor([1.0, value])  # response 1 has no token
        elif key == "advantages":
            kw[key] = torch.ones(2, 3)
            kw[key][0, 1] = value
        elif key in kw and key != "beta":
            kw[key] = kw[key].clone()
            kw[key][0, 1] = value
    with pytest.raises(ValueError, match=rf"^{name} must be finite"):
        tc.policy_loss(mask=mask, surrogate=surrogate, ratio_level=level, **kw)
    if "advantages_empty" not in bad:  # the same value on a padding token: no error
        for key in kw:
            if torch.is_tensor(kw[key]) and kw[key].dim() == 2:
                kw[key][0, 2], kw[key][0, 1] = kw[key][0, 1].item(), -1.0
        loss, _ = tc.policy_loss(mask=mask, surrogate=surrogate, ratio_level=level, **kw)
        assert torch.isfinite(loss)


def test_policy_loss_no_false_alarm_when_a_ratio_underflows():
    """exp(-200) is 0 in float32, as exp(-inf) is: here logp is finite, so no error."""
    logp, old = torch.tensor([[-200.0, -1.0]]), torch.tensor([[0.0, -1.0]])
    _, stats = tc.policy_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), mode="token")
    assert stats["ratio_mean"] == 0.5 and stats["clip_frac_low"] == 0.5


def test_the_constants_of_the_loss_carry_no_gradient():
    """old_logp, ref_logp and the advantages are constants: passing tensors that still carry a graph
    (policy_loss(logp, logp, ...), say) gives the on-policy gradient, not a silent zero."""
    g = torch.Generator().manual_seed(27)
    mask = random_mask(6, 5, g)
    base = -torch.rand(6, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    grads = []
    for same_tensor in (False, True):
        logp = base.clone().requires_grad_()
        old = logp if same_tensor else logp.detach()
        loss, _ = tc.policy_loss(logp, old, adv.clone().requires_grad_() if same_tensor else adv, mask, mode="token",
                                 ref_logp=old - 0.1, beta=0.2)
        loss.backward()
        grads.append(logp.grad)
    assert torch.equal(grads[0], grads[1]) and grads[0].abs().sum() > 0
    logp = base.clone().requires_grad_()  # importance_ratio alone: the ratio moves with logp only
    tc.importance_ratio(logp, logp, mask).sum().backward()
    assert torch.equal(logp.grad, mask.double())


def test_self_distillation_loss():
    # one token: teacher p = (3/4, 1/4), student p = (1/2, 1/2)
    teacher = torch.log(torch.tensor([[[0.75, 0.25]]]))
    student = torch.zeros(1, 1, 2, requires_grad=True)
    loss = tc.self_distillation_loss(student, teacher, torch.ones(1, 1), mode="token")
    assert loss.item() == pytest.approx(0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5), rel=1e-6)
    loss.backward()
    assert torch.allclose(student.grad, torch.tensor([[[0.5 - 0.75, 0.5 - 0.25]]]))  # p_student - p_teacher
    masked = tc.self_distillation_loss(Z(1, 1, 2), torch.tensor([[[0.0, -INF]]]), O(1, 1))
    assert masked.item() == pytest.approx(math.log(2))  # p_teacher = (1, 0): KL = log 1/(1/2)
    g = torch.Generator().manual_seed(14)
    s_logits = torch.randn(4, 5, 6, generator=g).requires_grad_()
    t_logits = torch.randn(4, 5, 6, generator=g).requires_grad_()
    mask = random_mask(4, 5, g)
    kl = [[sum(pt * (math.log(pt) - math.log(ps))
               for pt, ps in zip(torch.softmax(t_logits[i, t], -1).tolist(), torch.softmax(s_logits[i, t], -1).tolist()))
           for t in range(5)] for i in range(4)]
    for mode in ("sample", "token"):
        got = tc.self_distillation_loss(s_logits, t_logits, mask, mode=mode)
        assert got.item() == pytest.approx(tc.aggregate(torch.tensor(kl), mask, mode).item(), rel=1e-5)
    got.backward()
    assert t_logits.grad is None and s_logits.grad is not None  # no gradient into the teacher
    assert tc.self_distillation_loss(s_logits, s_logits, mask).item() == pytest.approx(0.0, abs=1e-6)


# -----------------------------------------------------------------------------
# 5. which tokens carry the credit: CSCR and the high-entropy mask

def test_counterfactual_shifts_and_sensitivity_hand_worked():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -1.0]])
    pos = torch.tensor([[-0.5, -2.5, -0.5, -1.5]])
    neg = torch.tensor([[-0.8, -1.0, -3.0, -1.2]])
    d_pos, d_neg = tc.counterfactual_shifts(logp, pos, neg, torch.tensor([[1, 1, 0, 1]]))
    assert torch.allclose(d_pos, torch.tensor([[0.5, -0.5, 0.0, -0.5]]))
    assert torch.allclose(d_neg, torch.tensor([[0.2, 1.0, 0.0, -0.2]]))
    # max of the absolute values: both negative gives 0.5, not max(-0.5, -0.2)
    assert torch.allclose(tc.counterfactual_sensitivity(d_pos, d_neg), torch.tensor([[0.5, 1.0, 0.0, 0.5]]))


def test_cscr_weights_match_the_loop_reference_and_keep_budget_and_sign():
    g = torch.Generator().manual_seed(11)
    N, T = 10, 12
    mask = random_mask(N, T, g)
    s = torch.rand(N, T, generator=g) * 3
    for strength, threshold in [(0.5, 0.0), (2.0, 0.5), (0.0, 0.0)]:
        w = tc.cscr_weights(s, mask, strength, threshold)
        assert torch.allclose(w, ref_cscr_weights(s, mask, strength, threshold), atol=1e-5)
        adv = torch.randn(N, generator=g)
        token_adv = tc.cscr_advantages(adv, w)  # A_{i,t} = u~_t A_i
        assert torch.allclose(token_adv, ref_cscr_advantages(adv, w), atol=1e-6)
        assert torch.allclose(token_adv.sum(dim=1), mask.sum(dim=1) * adv, atol=1e-4)  # budget |o_i| A_i
        assert (torch.sign(token_adv)[mask] == torch.sign(adv)[:, None].expand(N, T)[mask]).all()  # sign
        assert (token_adv[~mask] == 0).all()
    w = tc.cscr_weights(s, mask, 1.0, 0.0)  # more sensitive -> less credit, within a response
    for i in range(N):
        real = mask[i].nonzero().squeeze(1)
        assert (w[i, real][s[i, real].argsort()].diff() <= 1e-6).all()
    assert torch.allclose(tc.cscr_weights(torch.full((N, T), 1.7), mask, strength=3.0), mask.float())  # uniform
    mask[2] = False  # a response with no real token
    w = tc.cscr_weights(s, mask, strength=1.0)
    assert torch.isfinite(w).all() and w[2].sum() == 0
    huge = tc.cscr_weights(torch.tensor([[0.0, 1000.0, 2000.0]]), torch.ones(1, 3), strength=50.0)
    assert torch.isfinite(huge).all() and huge.sum().item() == pytest.approx(3.0)  # no underflow to 0/0


def test_cscr_advantages_hand_worked():
    """A_{i,t} = w~_{i,t} A_i: A = (0.5, -1), weights (1.2, 0.8, 1) and (0.5, 1.5, 0 on padding)."""
    got = tc.cscr_advantages(torch.tensor([0.5, -1.0]), torch.tensor([[1.2, 0.8, 1.0], [0.5, 1.5, 0.0]]))
    assert torch.allclose(got, torch.tensor([[0.6, 0.4, 0.5], [-0.5, -1.5, 0.0]]))
    assert got.shape == (2, 3) and tc.cscr_advantages(Z(3), O(3, 0)).shape == (3, 0)  # T = 0


def test_cscr_strength_zero_is_grpo():
    g = torch.Generator().manual_seed(13)
    mask, s = random_mask(8, 7, g), torch.rand(8, 7, generator=g) * 4
    assert torch.equal(tc.cscr_weights(s, mask, strength=0.0), mask.float())  # exactly 1, then
    old, adv = -torch.rand(8, 7, generator=g), torch.randn(8, generator=g)
    per_token = adv[:, None] * tc.cscr_weights(s, mask, 0.0)
    losses = [tc.policy_loss(old + 0.1, old, a, mask, "group_token", group_size=4)[0]
              for a in (adv, per_token)]
    assert torch.equal(losses[0], losses[1])  # GRPO's loss, bit for bit


def test_cscr_weights_T_0_no_token_column_gives_an_empty_N_by_0():
    """T = 0 (a batch with no token column): an empty (N, 0) float32 result, not an error."""
    for strength in (0.0, 1.0):
        w = tc.cscr_weights(Z(3, 0), O(3, 0), strength)
        assert w.shape == (3, 0) and w.dtype == torch.float32


def test_cscr_weights_are_float32_and_ignore_padding_garbage():
    g = torch.Generator().manual_seed(38)
    mask = random_mask(5, 7, g)
    s = torch.rand(5, 7, generator=g) * 2
    expected = ref_cscr_weights(s, mask, 1.5, 0.2)
    for dtype in (torch.float64, torch.bfloat16):
        w = tc.cscr_weights(s.to(dtype), mask, 1.5, 0.2)
        assert w.dtype == torch.float32
        assert torch.allclose(w, ref_cscr_weights(s.to(dtype), mask, 1.5, 0.2), atol=1e-5)
    for fill in (NAN, INF, -1.0):  # padding is not checked: anything may sit there
        dirty = s.clone()
        dirty[~mask] = fill
        w = tc.cscr_weights(dirty, mask, 1.5, 0.2)
        assert torch.allclose(w, expected, atol=1e-5) and (w[~mask] == 0).all()


def test_counterfactual_shifts_are_0_on_padding_whatever_sits_there():
    g = torch.Generator().manual_seed(39)
    mask = random_mask(4, 6, g)
    logp, pos, neg = (-torch.rand(4, 6, generator=g, dtype=torch.float64) for _ in range(3))
    expected = ref_counterfactual_shifts(logp, pos, neg, mask)
    for fill in (NAN, INF, -INF):
        dirty = [x.clone() for x in (logp, pos, neg)]
        for x in dirty:
            x[~mask] = fill
        d_pos, d_neg = tc.counterfactual_shifts(*dirty, mask)
        assert torch.equal(d_pos, expected[0]) and torch.equal(d_neg, expected[1])
    d_pos, d_neg = expected
    assert torch.equal(tc.counterfactual_sensitivity(d_pos, d_neg),
                       ref_counterfactual_sensitivity(d_pos, d_neg))


def test_counterfactual_shifts_hand_worked_two_responses_of_unequal_length_and_an_empty_one():
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -0.5, -9.0], [-1.0, -1.0, -1.0]])
    pos = torch.tensor([[-0.5, -1.0, -4.0], [-1.0, -1.5, 0.0], [0.0, 0.0, 0.0]])
    neg = torch.tensor([[-1.5, -3.0, -1.0], [-2.0, -0.25, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    d_pos, d_neg = tc.counterfactual_shifts(logp, pos, neg, mask)
    # d+ = log pi(. | c+) - log pi: c+ raises token 1 of response 1 (+0.5), lowers its token 3 (-3)
    assert torch.allclose(d_pos, torch.tensor([[0.5, 0.0, -3.0], [1.0, -1.0, 0.0], [0.0] * 3]))
    assert torch.allclose(d_neg, torch.tensor([[-0.5, -2.0, 0.0], [0.0, 0.25, 0.0], [0.0] * 3]))


def test_token_entropy_hand_worked_and_loop():
    logits = torch.tensor([[[0.0, 0.0, -INF], [0.0, 100.0, 0.0]]])  # H = log 2 (the -inf is out), ~0
    assert torch.allclose(tc.token_entropy(logits), torch.tensor([[math.log(2), 0.0]]), atol=1e-6)
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 6, 9, generator=g)
    loop = [[-sum(q * math.log(q) for q in torch.softmax(logits[n, t], -1).tolist()) for t in range(6)] for n in range(4)]
    assert torch.allclose(tc.token_entropy(logits), torch.tensor(loop), atol=1e-5)
    mask = random_mask(4, 6, g)
    mean = sum(loop[n][t] for n in range(4) for t in range(6) if mask[n, t]) / int(mask.sum())
    assert tc.aggregate(tc.token_entropy(logits), mask, "token").item() == pytest.approx(mean, rel=1e-5)


def test_high_entropy_mask_hand_worked():
    # real tokens' entropies: 0.1 0.5 0.9 0.3 | 0.7 0.2 (two padding tokens, one of them huge)
    entropy = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.7, 0.2, 9.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    # top half of the batch: quantile 0.5 of (0.1 0.2 0.3 0.5 0.7 0.9) is 0.4 -> keep 0.5, 0.9, 0.7
    keep = tc.high_entropy_mask(entropy, mask, top_fraction=0.5)
    assert keep.tolist() == [[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]  # per batch, not per response
    # top 20 %: quantile 0.8 is 0.7 (rank 4 of 0..5) -> the two highest; ties at the threshold are kept
    assert tc.high_entropy_mask(entropy, mask).tolist() == [[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert tc.high_entropy_mask(entropy, mask, top_fraction=1.0).tolist() == mask.float().tolist()
    adv = torch.tensor([2.0, -1.0])[:, None] * keep  # no renormalisation: the rest get 0
    assert adv.tolist() == [[0.0, 2.0, 2.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]
    assert tc.high_entropy_mask(entropy, torch.zeros(2, 4)).sum() == 0


def test_high_entropy_mask_matches_the_loop_reference():
    g = torch.Generator().manual_seed(25)
    entropy = torch.rand(9, 11, generator=g) * 2
    mask = random_mask(9, 11, g)
    real = [float(entropy[i, t]) for i in range(9) for t in range(11) if mask[i, t]]
    for q in (0.2, 0.5, 0.8):
        threshold = ref_quantile(real, 1 - q)
        loop = [[1.0 if mask[i, t] and float(entropy[i, t]) >= threshold else 0.0 for t in range(11)] for i in range(9)]
        keep = tc.high_entropy_mask(entropy, mask, q)
        assert keep.tolist() == loop
        assert keep.sum().item() == pytest.approx(q * len(real), abs=1.0)  # the top q fraction, to one token


def test_high_entropy_mask_is_float_and_compares_in_float32():
    """keep is float (a weight: A[:, None] * keep), also with no real token; a bf16 entropy is
    compared with the float32 threshold: of bf16 neighbours 1.0 and 1.0078 the top half is one
    (the threshold 1.0039 rounded to bf16 would be 1.0 and keep both)."""
    entropy = torch.tensor([[1.0, 1.0078125]], dtype=torch.bfloat16)
    keep = tc.high_entropy_mask(entropy, O(1, 2), top_fraction=0.5)
    assert keep.dtype == torch.float32 and keep.tolist() == [[0.0, 1.0]]
    assert torch.equal(keep, ref_high_entropy_mask(entropy, O(1, 2), 0.5))
    nothing = tc.high_entropy_mask(torch.rand(2, 3), Z(2, 3))
    assert nothing.dtype == torch.float32 and torch.equal(nothing, Z(2, 3))
    garbage = tc.high_entropy_mask(torch.tensor([[0.2, 0.9, NAN]]), torch.tensor([[1, 1, 0]]), 0.5)
    assert garbage.dtype == torch.float32 and garbage.tolist() == [[0.0, 1.0, 0.0]]


def test_the_entropy_threshold_is_torch_quantile_bit_for_bit_where_that_works():
    """high_entropy_mask's threshold is computed one way at every size (torch.quantile stops at
    2^24 values): equal to torch.quantile's, bit for bit, at the sizes torch.quantile takes."""
    g = torch.Generator().manual_seed(41)
    for n in (1, 2, 3, 5, 7, 10, 100, 1001, 4097, 65537, 300007):
        x = torch.rand(n, generator=g) * 5
        x[::3] = (x[::3] * 4).round() / 4  # ties
        for q in (0.0, 0.1, 0.2, 0.25, 0.5, 0.7, 0.8, 0.9, 0.999, float(torch.rand(1, generator=g))):
            assert torch.equal(tc._quantile(x, q), torch.quantile(x, q)), (n, q)


def test_high_entropy_mask_past_torch_quantiles_limit_of_2_24_tokens():
    """torch.quantile refuses more than 2^24 values; a batch of 2^24 + 4 real tokens still gets its
    top quarter. Response r has entropy r on every token: quantile 0.75 interpolates 2 and 3 to
    2.25, and only response 3 is kept."""
    n = 2 ** 24 + 4
    entropy = torch.arange(4.0)[:, None].expand(4, n // 4)
    keep = tc.high_entropy_mask(entropy, torch.ones(4, n // 4, dtype=torch.bool), top_fraction=0.25)
    assert keep.dtype == torch.float32 and keep.sum().item() == n // 4
    assert keep[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0] == keep[:, -1].tolist()


# -----------------------------------------------------------------------------
# 6. diagnostics

def test_shift_diagnostics_hand_worked_with_a_threshold():
    d_pos = torch.tensor([[0.5, -0.5, 0.02, -0.3, 7.0]])
    d_neg = torch.tensor([[0.2, 1.0, 0.01, -0.1, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    # min_shift 0.1: token 2 (largest shift 0.02) is not affected; padding never counts
    diag = tc.shift_diagnostics(d_pos, d_neg, mask, min_shift=0.1)
    assert diag["num_tokens"] == 4 and diag["num_affected"] == 3
    assert diag["same_direction"] == pytest.approx(2 / 3) and diag["sign_reversal"] == pytest.approx(1 / 3)
    assert diag["mean_abs_common"] == pytest.approx((0.35 + 0.25 + 0.2) / 3)  # |d+ + d-| / 2
    assert diag["mean_abs_differential"] == pytest.approx((0.15 + 0.75 + 0.1) / 3)  # |d+ - d-| / 2
    assert diag["mean_sensitivity"] == pytest.approx((0.5 + 1.0 + 0.3) / 3)
    assert diag["mean_abs_pos"] == pytest.approx((0.5 + 0.5 + 0.3) / 3)
    everything = tc.shift_diagnostics(d_pos, d_neg, mask)  # min_shift 0: every real token
    assert everything["num_affected"] == 4 and everything["same_direction"] == pytest.approx(3 / 4)
    nothing = tc.shift_diagnostics(d_pos, d_neg, mask, min_shift=100.0)
    assert nothing["num_affected"] == 0 and nothing["same_direction"] == 0.0


def test_shift_diagnostics_matches_the_loop_reference():
    g = torch.Generator().manual_seed(10)
    d_pos, d_neg = torch.randn(7, 9, generator=g), torch.randn(7, 9, generator=g)
    d_neg[0, 0] = 0.0  # counts as neither
    mask = random_mask(7, 9, g)
    pairs = [(float(d_pos[i, t]), float(d_neg[i, t])) for i in range(7) for t in range(9) if mask[i, t]]
    diag = tc.shift_diagnostics(d_pos, d_neg, mask)
    assert diag["same_direction"] == pytest.approx(sum(a * b > 0 for a, b in pairs) / len(pairs))
    assert diag["sign_reversal"] == pytest.approx(sum(a * b < 0 for a, b in pairs) / len(pairs))
    assert diag["mean_abs_neg"] == pytest.approx(sum(abs(b) for _, b in pairs) / len(pairs), rel=1e-5)
    assert diag["mean_sensitivity"] == pytest.approx(sum(max(abs(a), abs(b)) for a, b in pairs) / len(pairs), rel=1e-5)


# -----------------------------------------------------------------------------
# the doors: each public function refuses, with a ValueError that names what was expected and what
# came, every input its math would misread: one argument broken at a time from a call it accepts

N_, T_, V_ = 4, 3, 5
MASK, LOGP = O(N_, T_), Z(N_, T_)
AGG = dict(mode="token", group_size=2, max_len=8.0)
GOOD = dict(  # a call each public function accepts
    overlong_penalty=dict(lengths=Z(N_), max_len=8, cache_len=2),
    group_advantages=dict(rewards=Z(2, 2), scale="std", eps=1e-6, baseline="mean"),
    informative_groups=dict(values=Z(2, 2)),
    fill_batch=dict(sample_groups=lambda: {"correct": torch.tensor([[0.0, 1.0]])}, batch_size=1,
                    max_rounds=1, filter_key="correct"),
    policy_gradient_surrogate=dict(logp=LOGP, advantages=Z(N_)),
    importance_ratio=dict(logp=LOGP, old_logp=LOGP, mask=MASK, level="token"),
    sequence_ratio=dict(logp=LOGP, old_logp=LOGP, mask=MASK, per_token=False),
    clipped_surrogate=dict(ratio=O(N_, T_), advantages=Z(N_), eps_low=0.2, eps_high=0.2),
    kl_k3=dict(logp=LOGP, ref_logp=LOGP),
    token_weights=dict(mask=MASK, **AGG),
    aggregate=dict(per_token=LOGP, mask=MASK, **AGG),
    policy_loss=dict(logp=LOGP, old_logp=LOGP, advantages=Z(N_), mask=MASK, eps_low=0.2,
                     eps_high=0.2, ref_logp=LOGP, beta=0.1, surrogate="clip", ratio_level="token",
                     **AGG),
    self_distillation_loss=dict(student_logits=Z(N_, T_, V_), teacher_logits=Z(N_, T_, V_),
                                mask=MASK, **AGG),
    counterfactual_shifts=dict(logp=LOGP, logp_pos=LOGP, logp_neg=LOGP, mask=MASK),
    counterfactual_sensitivity=dict(d_pos=LOGP, d_neg=LOGP),
    cscr_weights=dict(sensitivity=LOGP, mask=MASK, strength=1.0, threshold=0.0),
    cscr_advantages=dict(advantages=Z(N_), weights=O(N_, T_)),
    token_entropy=dict(logits=Z(N_, T_, V_)),
    high_entropy_mask=dict(entropy=LOGP, mask=MASK, top_fraction=0.2),
    shift_diagnostics=dict(d_pos=LOGP, d_neg=LOGP, mask=MASK, min_shift=0.0),
)
FLOATING = {"logp", "old_logp", "ref_logp", "ratio", "student_logits", "teacher_logits",
            "logp_pos", "logp_neg", "logits"}  # the log-probs and logits: an int would truncate
BAD_NUMBERS = dict(  # name: values its door refuses (a bool is never a number)
    eps=[True, 0.0, NAN, INF], eps_low=[True, -0.1, NAN], eps_high=[True, -0.1, NAN],
    beta=[True, -1.0, NAN, INF], strength=[True, -1.0, NAN, INF],
    min_shift=[True, -1.0, NAN], threshold=[True, NAN, INF], top_fraction=[True, 0.0, 1.5, NAN],
    batch_size=[True, 0, 1.5], max_rounds=[True, 0, 1.5], group_size=[True, 0, 3, 2.0, None],
    max_len=[True, 0.0, -1.0, NAN, INF, None], cache_len=[True, 0, 9, 1.0],
    per_token=[1, None, "yes"])
BAD_CHOICES = dict(mode="tokn", scale="stdd", baseline="loo", level="sequnce",
                   ratio_level="sequnce", surrogate="ppo")
NEEDS_MODE = dict(group_size="group_token", max_len="constant")  # checked when the mode uses it


def broken_arguments(function):
    """(name, a bad value) for every argument of GOOD[function]."""
    good = GOOD[function]
    first = next((name for name, x in good.items() if isinstance(x, torch.Tensor)), None)
    for name, x in good.items():
        if isinstance(x, torch.Tensor):
            yield from [(name, x.tolist()), (name, x[..., None]), (name, None)]
            if x.dim() > 1:
                yield name, x[0]  # one dimension short
            if name != first:  # a size, or the device, that differs from the first tensor's
                new = x.dim() > good[first].dim()  # its last size is its own: differ in N
                yield name, (torch.zeros(x.shape[0] + 1, *x.shape[1:]) if new
                             else torch.zeros(*x.shape[:-1], x.shape[-1] + 1))
                yield name, x.to("meta")
            if name in FLOATING:
                yield name, x.long()
            if name == "mask":
                yield from [(name, torch.full_like(x, 2.0)), (name, torch.full_like(x, 0.5))]
        elif name in BAD_CHOICES:
            yield from [(name, BAD_CHOICES[name]), (name, None)]
        elif name == "max_len" and function == "overlong_penalty":
            yield from [(name, v) for v in (True, 0, 8.0)]
        elif name in BAD_NUMBERS:
            yield from [(name, v) for v in BAD_NUMBERS[name]]
        elif name == "sample_groups":
            yield name, "not a function"


def door(function, name, bad):
    kwargs = dict(GOOD[function], **{name: bad})
    if name in NEEDS_MODE and "mode" in kwargs:
        kwargs["mode"] = NEEDS_MODE[name]
    return P(getattr(tc, function), **kwargs)


def rounds(*results):  # a sampler for fill_batch that returns these rounds in turn
    results = iter(results)
    return lambda: next(results)


R = {"correct": Z(1, 2), "x": Z(1, 5)}  # one uninformative round: fill_batch asks for another
DOORS = [(door(f, name, bad), rf"^{name}\b.* must .+, got ") for f in GOOD
         for name, bad in broken_arguments(f)] + [  # and what only a whole call shows
    (P(tc.group_advantages, torch.tensor([[1, NAN]])), r"rewards must be finite, got nan at index"),
    (P(tc.overlong_penalty, torch.tensor([-1.0]), 4, 2), "lengths must be finite and >= 0, got"),
    (P(tc.overlong_penalty, Z(1), 4, 5), r"cache_len must be an int in \(0, max_len = 4\], got 5"),
    (P(tc.informative_groups, torch.tensor([[INF, 0.0]])), "values must be finite, got inf"),
    (P(tc.fill_batch, rounds({}), 1, 2, "correct"), r"must return a dict of tensors with key 'correct' .*, got \{\}"),
    (P(tc.fill_batch, rounds({**R, "x": Z(3)}), 1, 1, "correct"), r"one leading size b, got \{'correct': \(1, 2\), 'x': \(3,\)\}"),
    (P(tc.fill_batch, rounds(R, {**R, "x": Z(1, 6)}), 1, 2, "correct"), r"shapes \{'correct': \('b', 2\), 'x': \('b', 5\)\} as in the first round, got"),
    (P(tc.fill_batch, rounds(R, {"correct": Z(1, 2)}), 1, 2, "correct"), r"as in the first round, got \{'correct': \(1, 2\)\}"),
    (P(tc.fill_batch, rounds({"correct": Z(2)}), 1, 1, "correct"),  # 1-D verdicts: named as returned
     r"^sample_groups\(\) must return .* 'correct' \(the filter_key\) of shape \(b, G\).*, got \{'correct': \(2,\)\}"),
    (P(tc.policy_loss, LOGP, None, Z(N_), MASK), "old_logp must be a floating-point torch.Tensor .*, got NoneType"),
    (P(tc.policy_loss, LOGP, None, Z(N_), MASK, surrogate="reinforce", ratio_level="sequence"),
     "ratio_level 'sequence' must have surrogate 'clip' .*, got surrogate 'reinforce'"),
    (P(tc.policy_loss, LOGP, LOGP, Z(N_, T_), MASK, ratio_level="sequence"),
     r"advantages must be \(N,\) for ratio_level 'sequence'"),
    (P(tc.policy_loss, LOGP, LOGP, Z(N_), MASK, beta=0.1), "ref_logp must be a floating-point torch.Tensor .*, got NoneType"),
    (P(tc.policy_loss, LOGP, torch.tensor([[NAN] * T_] * N_), Z(N_), MASK),
     "old_logp must be finite on real tokens, got nan at index"),
    (P(tc.cscr_weights, -O(N_, T_), MASK, 1.0), "sensitivity must be finite and >= 0 on real"),
    (P(tc.cscr_advantages, Z(N_), torch.tensor([[1.0] * T_] * (N_ - 1) + [[1.0, NAN] + [1.0] * (T_ - 2)])),
     rf"weights must be finite and >= 0, got nan at index \({N_ - 1}, 1\)"),
    (P(tc.cscr_advantages, Z(N_), -O(N_, T_)), r"weights must be finite and >= 0, got -1.0 at index \(0, 0\)"),
    (P(tc.cscr_advantages, Z(N_, T_), O(N_, T_)), r"advantages must be a torch.Tensor \(N,\)"),
    (P(tc.cscr_advantages, Z(N_), O(N_, T_).long()), r"weights must be a floating-point torch.Tensor"),
    (P(tc.high_entropy_mask, torch.tensor([[0.1, NAN]]), O(1, 2)), "entropy must be finite"),
    (P(tc.token_entropy, torch.full((1, 1, 2), -INF)), "finite value at every position"),
    (P(tc.shift_diagnostics, torch.tensor([[NAN]]), Z(1, 1), O(1, 1)), "d_pos must be finite"),
    (P(tc.self_distillation_loss, torch.tensor([[[-INF, 0]]]), Z(1, 1, 2), O(1, 1)),
     "student_logits must be finite or -inf, and > -inf where teacher_logits are"),
    (P(tc.self_distillation_loss, torch.tensor([[[NAN, 0]]]), Z(1, 1, 2), O(1, 1)),
     "student_logits must be finite or -inf.* on real tokens, got nan"),
]


def test_every_public_function_has_a_door_test_and_accepts_its_good_call():
    public = {name for name, x in vars(tc).items()
              if callable(x) and not name.startswith("_") and x.__module__ == "tokencredit"}
    assert public == set(GOOD)
    assert {name for name in GOOD if "mode" in GOOD[name]} == {  # mode="tokn" refused by each
        "token_weights", "aggregate", "policy_loss", "self_distillation_loss"}
    for function, kwargs in GOOD.items():
        getattr(tc, function)(**kwargs)


@pytest.mark.parametrize("call, message", DOORS, ids=[
    f"{call.func.__name__}-{message[1:].split(chr(92))[0]}-{i}" for i, (call, message) in enumerate(DOORS)])
def test_each_door_refuses_what_its_math_would_misread(call, message):
    with pytest.raises(ValueError, match=message) as refused:
        call()
    bad = [v for k, v in call.keywords.items() if not isinstance(v, (torch.Tensor, list))
           and v is not GOOD.get(call.func.__name__, {}).get(k, v)]
    assert all(repr(v) in str(refused.value) for v in bad if not callable(v))  # what came
