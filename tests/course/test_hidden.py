"""The hidden set: every exercise's functions on random inputs drawn from a seed. One file for
every grade: the instructor's (`grade PATH` in the repository, `grade-all`, the Gradescope
bundle: each file's own seed) and a handout's, which carries it and runs it on seed 0. The
repository is public, so what is hidden is the seed: shapes, lengths, empty responses, values,
ties, eps, strengths, modes ("group_token" included) all come from it.

The checks are strong enough that each planted mistake (course/exercises.py's MISTAKES) fails on
every seed: a surplus, an unequal group, padding beside real tokens, a large k3, each kind of
garbage; and test_inputs_unchanged is the one test the judge shows a child's writes into its
inputs. The fresh tests are named test_hidden_*: the grader calls them "fresh".

    TOKENCREDIT_SEED=20270 python -m pytest -q tests/course/test_hidden.py  # a seed of your own
    python -m pytest -q tests/course/test_hidden.py                          # seed 0, as CI does

The seed is read at each test (`draw`), not at import: the grader's judge collects this file once
and gives each submission's fork its own seed. Each test calls one function of one exercise on its
own and compares it with the plain-loop references of test_tokencredit.py (in a handout, their
outputs recorded at seed 0) and with the invariants its docstring promises. Padding holds NaN or
inf wherever the function promises that padding is ignored.
"""

import itertools
import os

import pytest
import torch

import tokencredit as tc
from test_tokencredit import (NAN, INF, ref_aggregate, ref_clipped_surrogate,
                              ref_counterfactual_sensitivity, ref_counterfactual_shifts,
                              ref_cscr_weights, ref_fill_batch, ref_group_advantages,
                              ref_high_entropy_mask, ref_importance_ratio, ref_informative_groups,
                              ref_kl_k3, ref_loss, ref_loss_denominators, ref_overlong_penalty,
                              ref_policy_gradient_surrogate, ref_sequence_ratio)

F64 = torch.float64


def draw(test_number):
    """The generator of one test: its inputs depend on the seed (read at each test, so that the
    grader can give each submission its own) and on nothing else."""
    seed = int(os.environ.get("TOKENCREDIT_SEED", "0"))
    return torch.Generator().manual_seed(seed * 1009 + test_number)


def integer(g, low, high):
    """A random int in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=g))


def batch_mask(g, N, T):
    """Right-padded mask (N, T), lengths in [0, T]: at least one full response, an empty one when
    N > 2 and one cut short (0 < length < T) when N > 1 and T > 1, on every seed."""
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    full = integer(g, 0, N - 1)
    others = [(full + k) % N for k in range(1, N)]
    lengths[full] = T
    if N > 2:
        lengths[others[0]] = 0
    if others and T > 1:
        lengths[others[-1]] = integer(g, 1, T - 1)
    return torch.arange(T)[None, :] < lengths[:, None]


def with_garbage(x, mask, g):
    """x with NaN, inf or -inf on its padding (a copy)."""
    x = x.clone()
    x[~mask] = [NAN, INF, -INF][integer(g, 0, 2)]
    return x


def shapes(g):
    B, G, T = integer(g, 1, 4), integer(g, 2, 5), integer(g, 1, 9)
    return B, G, B * G, T


# -----------------------------------------------------------------------------
# every exercise: a function leaves the tensors it is given as they were (the reference does);
# the grader hands this test, and no other, what a student's function writes into its inputs

def inputs(g):
    """One call of each public function on drawn inputs: {name: (args, kwargs)}."""
    _, G, N, T = shapes(g)
    mask = batch_mask(g, N, T)
    x = [-2 * torch.rand(N, T, generator=g, dtype=F64) for _ in range(4)]
    adv, rewards = torch.randn(N, generator=g, dtype=F64), torch.rand(N // G, G, generator=g)
    return dict(
        overlong_penalty=((torch.randint(0, 12, (N,), generator=g), 10, 4), {}),
        group_advantages=((rewards,), dict(baseline="leave_one_out")),
        informative_groups=((rewards.round(),), {}),
        fill_batch=((lambda: {"v": rewards.round()}, 2, 2, "v"), {}),
        policy_gradient_surrogate=((x[0], adv), {}),
        importance_ratio=((x[0], x[1], mask, "token"), {}),
        clipped_surrogate=((x[0].exp(), adv), {}),
        kl_k3=((x[0], x[2]), {}),
        token_weights=((mask.double(), "group_token"), dict(group_size=G)),
        aggregate=((x[3], mask, "sample"), {}),
        policy_loss=((x[0], x[1], adv, mask), dict(ref_logp=x[2], beta=0.1, mode="token")),
        sequence_ratio=((x[0], x[1], mask), {}),
        counterfactual_shifts=((x[0], x[1], x[2], mask), {}),
        counterfactual_sensitivity=((x[1] - x[0], x[2] - x[0]), {}),
        cscr_weights=((x[3].abs(), mask, 1.5), {}),
        high_entropy_mask=((-x[3], mask, 0.5), {}))


@pytest.mark.parametrize("name", list(inputs(draw(0))))
def test_inputs_unchanged(name):
    args, kwargs = inputs(draw(40))[name]
    given = [x for x in list(args) + list(kwargs.values()) if isinstance(x, torch.Tensor)]
    before = [x.clone() for x in given]
    getattr(tc, name)(*args, **kwargs)
    for x, was in zip(given, before):
        assert torch.equal(x, was), f"{name} changed a tensor it was given, in place"


# -----------------------------------------------------------------------------
# exercise 1: advantages

def test_hidden_overlong_penalty():
    g = draw(1)
    for _ in range(5):
        max_len = integer(g, 1, 40)
        cache_len = integer(g, 1, max_len)
        lengths = torch.randint(0, max_len + 6, (integer(g, 1, 30),), generator=g)
        got = tc.overlong_penalty(lengths, max_len, cache_len)
        assert got.dtype == torch.float32 and got.min() >= -1 and got.max() <= 0
        assert torch.allclose(got, ref_overlong_penalty(lengths, max_len, cache_len), atol=1e-6)


def test_hidden_group_advantages():
    g = draw(2)
    for round_ in range(4):
        B, G = integer(g, 1 + (round_ == 0), 6), integer(g, 1 + 2 * (round_ == 0), 8)
        G = 2 if B * G == 1 else G  # "batch" needs two rewards for its std
        levels = torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0], dtype=F64)  # ties, of both signs
        rewards = levels[torch.randint(0, 5, (B, G), generator=g)]
        i = integer(g, 0, B - 1)
        rewards[i] = levels[integer(g, 0, 4)]  # an all-equal group
        if round_ == 0:  # and, on every seed, a group of G >= 3 rewards not all equal
            rewards[(i + 1) % B, :2] = torch.tensor([-1.0, 2.0], dtype=F64)
        eps = [1e-6, 0.1, 0.5][integer(g, 0, 2)]
        for scale, baseline in itertools.product(tc.ADVANTAGE_SCALES, tc.BASELINES):
            got = tc.group_advantages(rewards, scale, eps, baseline)
            expected = ref_group_advantages(rewards, scale, eps, baseline)
            assert torch.allclose(got, expected, atol=1e-12), (scale, baseline, eps)
            assert torch.allclose(got.sum(dim=1), torch.zeros(B, dtype=F64), atol=1e-9)


# -----------------------------------------------------------------------------
# exercise 2: dynamic sampling

def test_hidden_informative_groups():
    g = draw(3)
    B, G = integer(g, 5, 20), integer(g, 2, 9)
    correct = torch.randint(0, 2, (B, G), generator=g).bool()
    floats = torch.rand(B, G, generator=g)
    floats[::2] = torch.rand(1, generator=g)  # every other group: one float G times
    close = torch.ones(B, G, dtype=F64)
    close[1::2, -1] += 1e-12  # not all equal, though equal in float32
    for values in (correct, floats, close):
        keep = tc.informative_groups(values)
        assert keep.dtype == torch.bool and torch.equal(keep, ref_informative_groups(values))
        alone = torch.cat([tc.informative_groups(row[None]) for row in values])  # b = 1 rounds
        assert torch.equal(alone, keep)


def test_hidden_fill_batch():
    g = draw(4)
    G = integer(g, 2, 5)
    rounds = []
    for i in range(8):
        values = torch.randint(0, 2, (integer(g, 1 + (i == 0), 5), G), generator=g).float()
        values[torch.rand(len(values), generator=g) < 0.3] = 0.1  # some groups of equal floats
        rounds.append(values)
    rounds[0][:2, 0], rounds[0][:2, 1:] = 1.0, 0.0  # two informative groups in round 1
    for case in range(4):  # the first with a surplus on every seed: batch_size 1, 2 informative
        batch_size, max_rounds = integer(g, 1, 20), integer(g, 1, 8)
        batch_size = 1 if case == 0 else batch_size
        results = iter(rounds)
        batch, stats = tc.fill_batch(lambda: {"v": next(results)}, batch_size, max_rounds, "v")
        kept, expected = ref_fill_batch([r.tolist() for r in rounds], batch_size, max_rounds)
        assert stats == expected and all(type(v) is int for v in stats.values())
        assert torch.equal(batch["v"], torch.cat(rounds)[kept])


# -----------------------------------------------------------------------------
# exercise 3: the surrogate and the clip

def test_hidden_policy_gradient_surrogate():
    g = draw(5)
    _, _, N, T = shapes(g)
    for adv in (torch.randn(N, generator=g, dtype=F64), torch.randn(N, T, generator=g, dtype=F64)):
        logp = (-2 * torch.rand(N, T, generator=g, dtype=F64)).requires_grad_()
        loss = tc.policy_gradient_surrogate(logp, adv)
        assert torch.allclose(loss, ref_policy_gradient_surrogate(logp.detach(), adv), atol=1e-12)
        loss.sum().backward()
        assert torch.allclose(logp.grad, -(adv if adv.dim() == 2 else adv[:, None].expand(N, T)))


def test_hidden_importance_ratio():
    g = draw(6)
    _, _, N, T = shapes(g)
    mask = batch_mask(g, N, T)
    old = -2 * torch.rand(N, T, generator=g, dtype=F64)
    clean = old + 0.4 * torch.randn(N, T, generator=g, dtype=F64)
    expected = ref_importance_ratio(clean, old, mask)
    logp = with_garbage(clean, mask, g).requires_grad_()
    ratio = tc.importance_ratio(logp, with_garbage(old, mask, g), mask, "token")
    assert torch.allclose(ratio, expected, atol=1e-12)
    ratio.sum().backward()
    assert torch.allclose(logp.grad, torch.where(mask, expected, 0.0), atol=1e-12)


def test_hidden_clipped_surrogate():
    g = draw(7)
    _, _, N, T = shapes(g)
    ratio = torch.exp(0.5 * torch.randn(N, T, generator=g, dtype=F64))
    for adv in (torch.randn(N, generator=g, dtype=F64), torch.randn(N, T, generator=g, dtype=F64)):
        eps_low, eps_high = [0.1, 0.2, 0.3][integer(g, 0, 2)], [0.2, 0.28, 0.5][integer(g, 0, 2)]
        got = tc.clipped_surrogate(ratio, adv, eps_low, eps_high)
        assert torch.allclose(got, ref_clipped_surrogate(ratio, adv, eps_low, eps_high), atol=1e-12)


# -----------------------------------------------------------------------------
# exercise 4: KL

def test_hidden_kl_k3():
    g = draw(8)
    _, _, N, T = shapes(g)
    logp = (-3 * torch.rand(N, T, generator=g, dtype=F64)).requires_grad_()
    ref_logp = logp.detach() + 4 * torch.randn(N, T, generator=g, dtype=F64)  # log r up to ~+-10
    ref_logp[0, 0] = logp[0, 0].detach() + 5  # and one k3 = e^5 - 6 ~ 142 on every seed
    kl = tc.kl_k3(logp, ref_logp)
    assert (kl >= 0).all() and torch.allclose(kl, ref_kl_k3(logp.detach(), ref_logp), rtol=1e-12)
    kl.sum().backward()
    assert torch.allclose(logp.grad, 1 - torch.exp(ref_logp - logp.detach()), rtol=1e-12)


# -----------------------------------------------------------------------------
# exercise 5: aggregation

def test_hidden_loss_denominators_and_token_weights():
    g = draw(9)
    _, G, N, T = shapes(g)
    mask = batch_mask(g, N, T)
    max_len = T + integer(g, 0, 5) + 0.5
    for mode in tc.AGGREGATION_MODES:
        d = tc._loss_denominators(mask, mode, G, max_len, F64)  # token_weights' d_i
        assert d.dtype == F64 and torch.equal(d, ref_loss_denominators(mask, mode, G, max_len))
        w = tc.token_weights(mask, mode, group_size=G, max_len=max_len)
        assert torch.allclose(w.double(), mask / d[:, None]) and (w[~mask] == 0).all()


def test_hidden_aggregate():
    g = draw(10)
    _, G, N, T = shapes(g)
    mask = batch_mask(g, N, T)
    clean = torch.randn(N, T, generator=g, dtype=F64)
    for mode in tc.AGGREGATION_MODES:
        x = with_garbage(clean, mask, g).requires_grad_()
        got = tc.aggregate(x, mask, mode, group_size=G, max_len=T + 2)
        assert got.shape == () and got.item() == pytest.approx(
            ref_aggregate(clean, mask, mode, G, T + 2), rel=1e-12, abs=1e-15)
        got.backward()
        assert torch.isfinite(x.grad).all() and (x.grad[~mask] == 0).all()


@pytest.mark.parametrize("mode", tc.AGGREGATION_MODES)
@pytest.mark.parametrize("ratio_level", tc.RATIO_LEVELS)
def test_hidden_policy_loss(mode, ratio_level):
    g = draw(11 + 3 * tc.AGGREGATION_MODES.index(mode) + tc.RATIO_LEVELS.index(ratio_level))
    _, G, N, T = shapes(g)
    mask = batch_mask(g, N, T)
    logp = -2 * torch.rand(N, T, generator=g, dtype=F64)
    spread = 0.4 if ratio_level == "token" else 0.05
    old = logp + spread * torch.randn(N, T, generator=g, dtype=F64)
    ref_logp = logp + 0.3 * torch.randn(N, T, generator=g, dtype=F64)
    eps = (0.2, 0.28) if ratio_level == "token" else (0.01, 0.02)
    for adv in (torch.randn(N, generator=g, dtype=F64), torch.randn(N, T, generator=g, dtype=F64)):
        if ratio_level == "sequence" and adv.dim() == 2:
            continue
        for beta, surrogate in ((0.0, "clip"), (0.05, "clip"), (0.05, "reinforce")):
            if surrogate == "reinforce" and ratio_level != "token":
                continue
            kw = dict(mode=mode, eps_low=eps[0], eps_high=eps[1], group_size=G, max_len=T + 1,
                      ref_logp=ref_logp, beta=beta, ratio_level=ratio_level, surrogate=surrogate)
            ours, theirs = logp.clone().requires_grad_(), logp.clone().requires_grad_()
            loss, stats = tc.policy_loss(ours, old, adv, mask, **kw)
            expected = ref_loss(theirs, old, adv, mask, **kw)
            assert loss.item() == pytest.approx(expected.item(), rel=1e-9, abs=1e-12)
            loss.backward()
            expected.backward()
            assert torch.allclose(ours.grad, theirs.grad, atol=1e-12)
            assert stats["num_tokens"] == int(mask.sum()) and ("kl_mean" in stats) == (beta > 0)


# -----------------------------------------------------------------------------
# exercise 6: GSPO

def test_hidden_sequence_ratio():
    g = draw(30)
    _, _, N, T = shapes(g)
    mask = batch_mask(g, N, T)
    old = -2 * torch.rand(N, T, generator=g, dtype=F64)
    clean = old + 0.05 * torch.randn(N, T, generator=g, dtype=F64)
    expected = ref_sequence_ratio(clean, old, mask)
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1)
    for per_token in (False, True):
        logp = with_garbage(clean, mask, g).requires_grad_()
        s = tc.sequence_ratio(logp, with_garbage(old, mask, g), mask, per_token)
        assert torch.allclose(s, expected, atol=1e-12)
        s.sum().backward()  # d (sum_t s_i) / d logp_{i,t} = s_i either way
        assert torch.allclose(logp.grad, torch.where(mask, expected, 0.0), atol=1e-12)
        logp = clean.clone().requires_grad_()
        tc.sequence_ratio(logp, old, mask, per_token)[:, 0].sum().backward()  # token 0's s_i
        if per_token:  # GSPO-token: only the token's own log-prob moves it, with slope s_i
            slope = torch.where(mask & (torch.arange(T) == 0), expected[:, :1], 0.0)
        else:  # GSPO: every token of the response, with slope s_i / |o_i|
            slope = torch.where(mask, expected[:, :1] / lengths, 0.0)
        assert torch.allclose(logp.grad, slope, atol=1e-12)


# -----------------------------------------------------------------------------
# exercise 7: CSCR

def test_hidden_counterfactual_shifts():
    g = draw(31)
    _, _, N, T = shapes(g)
    mask = batch_mask(g, N, T)
    logp, pos, neg = (-2 * torch.rand(N, T, generator=g, dtype=F64) for _ in range(3))
    got = tc.counterfactual_shifts(*(with_garbage(x, mask, g) for x in (logp, pos, neg)), mask)
    expected = ref_counterfactual_shifts(logp, pos, neg, mask)
    assert torch.allclose(got[0], expected[0]) and torch.allclose(got[1], expected[1])


def test_hidden_counterfactual_sensitivity():
    g = draw(32)
    _, _, N, T = shapes(g)
    d_pos, d_neg = torch.randn(N, T, generator=g), torch.randn(N, T, generator=g)
    got = tc.counterfactual_sensitivity(d_pos, d_neg)
    assert (got >= 0).all()
    assert torch.allclose(got.double(), ref_counterfactual_sensitivity(d_pos, d_neg))


def test_hidden_cscr_weights():
    g = draw(33)
    _, _, N, T = shapes(g)
    T = max(T, 2)  # a response cut short: padding beside real tokens
    mask = batch_mask(g, N, T)
    s = 3 * torch.rand(N, T, generator=g)
    for garbage in (NAN, INF, -INF, 0.0):  # each kind, on every seed; 0: the least sensitive
        strength, threshold = (float(x) for x in torch.rand(2, generator=g) * torch.tensor([4, 1]))
        w = tc.cscr_weights(torch.where(mask, s, garbage), mask, strength, threshold)
        assert w.dtype == torch.float32
        assert torch.allclose(w, ref_cscr_weights(s, mask, strength, threshold), atol=1e-5)
        assert torch.allclose(w.sum(dim=1), mask.sum(dim=1).float(), atol=1e-4)  # mean 1


# -----------------------------------------------------------------------------
# exercise 8: the entropy mask

def test_hidden_high_entropy_mask():
    g = draw(35)
    _, _, N, T = shapes(g)
    T = max(T, 2)  # a response cut short: padding beside real tokens, on every seed
    mask = batch_mask(g, N, T)
    entropy = torch.rand(N, T, generator=g) * 3
    entropy[:, ::2] = (entropy[:, ::2] * 4).round() / 4  # ties
    for top_fraction in (0.2, float(torch.rand(1, generator=g)) * 0.9 + 0.05, 1.0):
        keep = tc.high_entropy_mask(with_garbage(entropy, mask, g), mask, top_fraction)
        assert keep.dtype == torch.float32
        assert torch.equal(keep, ref_high_entropy_mask(entropy, mask, top_fraction))
    # distinct entropies, the quantile halfway between the real tokens of rank m and m + 1 (of
    # n, m >= (n - 1) / 2, so q > 1/2): one padding token or more counted in the quantile as high
    # (inf, NaN) moves it past rank m + 1, and the token of rank m + 1 is lost, on every seed
    n = int(mask.sum())  # >= 3: a full response of T >= 2 tokens and one cut short
    distinct = torch.randperm(N * T, generator=g).reshape(N, T).float() / (N * T)
    top_fraction = 1 - (integer(g, n // 2, n - 2) + 0.5) / (n - 1)
    for garbage in (NAN, INF, -INF):
        keep = tc.high_entropy_mask(torch.where(mask, distinct, garbage), mask, top_fraction)
        assert torch.equal(keep, ref_high_entropy_mask(distinct, mask, top_fraction)), garbage
