"""Tests for kernelzero.py's pure functions: the worked numbers of the loss docstrings (group_advantages,
clipped_surrogate_loss, the k3 KL), CA-GRPO rewards and their invariants, masking, the frontier reward, the Proposer's
statistics, and the metrics (harness seconds, pass@k, fast_p)."""
import math

import pytest
import torch

import kernelzero as kz
from plumbing import report
from tests.common import values_close


# ---- group_advantages (the worked numbers in its docstring)

def test_group_advantages_numbers():
    values_close(kz.group_advantages(torch.tensor([1., 0, 0, 1]), 4), [0.865875, -0.865875, -0.865875, 0.865875])
    values_close(kz.group_advantages(torch.tensor([1., 0, 0, 1]), 4, scale="none"), [0.5, -0.5, -0.5, 0.5])
    values_close(kz.group_advantages(torch.tensor([1., 0, 0, 0]), 4), [1.499700, -0.499900, -0.499900, -0.499900])
    values_close(kz.group_advantages(torch.tensor([1., 0, 0, 0]), 4, scale="none"), [0.75, -0.25, -0.25, -0.25])
    values_close(kz.group_advantages(torch.tensor([1., 1, 1, 1]), 4), [0, 0, 0, 0])
    values_close(kz.group_advantages(torch.tensor([1.8, 1.3, 0, 2.3]), 4),
                   [0.455298, -0.050589, -1.365893, 0.961184])
    two = kz.group_advantages(torch.tensor([1., 0, 0, 1, 1, 1, 1, 0]), 4)
    values_close(two, [0.865875, -0.865875, -0.865875, 0.865875, 0.4999, 0.4999, 0.4999, -1.4997], atol=1e-4)
    values_close(kz.group_advantages(torch.tensor([3., 1.]), 1), [0, 0])  # G == 1 -> 0
    with pytest.raises(ValueError):
        kz.group_advantages(torch.tensor([1., 0]), 2, scale="batch")


# ---- clipped_surrogate_loss (its docstring: the policy-loss table, aggregation, gradients, KL)

def _trainer_token_loss(rho, adv, clip_high):
    logp = torch.tensor([[math.log(rho)]], requires_grad=True)
    loss, _ = kz.clipped_surrogate_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1),
                              clip_low=0.2, clip_high=clip_high)
    loss.backward()
    return loss.item(), logp.grad.item()


@pytest.mark.parametrize("rho,adv,sym,dapo,flows_sym,flows_dapo", [
    (1.5, 1, -1.2, -1.28, False, False),
    (1.5, -1, 1.5, 1.5, True, True),
    (0.5, -1, 0.8, 0.8, False, False),
    (0.5, 1, -0.5, -0.5, True, True),
    (1.25, 1, -1.2, -1.25, False, True),
])
def test_loss_clip_table(rho, adv, sym, dapo, flows_sym, flows_dapo):
    loss, grad = _trainer_token_loss(rho, adv, 0.2)
    assert loss == pytest.approx(sym, abs=1e-6) and (grad != 0) == flows_sym
    loss, grad = _trainer_token_loss(rho, adv, 0.28)
    assert loss == pytest.approx(dapo, abs=1e-6) and (grad != 0) == flows_dapo
    if flows_dapo:  # d(-rho A)/d logp = -rho A
        assert grad == pytest.approx(-rho * adv, rel=1e-5)


def _trainer_agg_case(agg):
    adv = kz.group_advantages(torch.tensor([1., 0, 0, 1]), 4)
    lengths = [3, 1, 2, 4]
    mask = torch.tensor([[1. if t < n else 0. for t in range(4)] for n in lengths])
    logp = torch.randn(4, 4).requires_grad_(True)
    loss, stats = kz.clipped_surrogate_loss(logp, logp.detach(), adv, mask, loss_agg=agg)
    loss.backward()
    return loss.item(), logp.grad, mask, stats


def test_loss_aggregation_values_and_gradients():
    loss, grad, mask, stats = _trainer_agg_case("token-mean")
    assert loss == pytest.approx(-0.346350, abs=1e-6)
    values_close(grad[mask == 1], [-0.086588] * 3 + [0.086588] + [0.086588] * 2 + [-0.086588] * 4)
    assert stats["clip_frac"] == 0 and stats["ratio_mean"] == pytest.approx(1.0) and stats["tokens"] == 10
    loss, grad, mask, _ = _trainer_agg_case("seq-mean-token-mean")
    assert loss == pytest.approx(0.0, abs=1e-6)
    for row, value in enumerate([-0.072156, 0.216469, 0.108234, -0.054117]):
        values_close(grad[row][mask[row] == 1], [value] * int(mask[row].sum()))
    loss, grad, mask, _ = _trainer_agg_case("seq-mean-token-sum-norm")
    assert loss == pytest.approx(-0.216469, abs=1e-6)
    values_close(grad[mask == 1].abs(), [0.054117] * 10)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        _, grad, mask, _ = _trainer_agg_case(agg)
        assert torch.all(grad[mask == 0] == 0)  # padded positions: exactly 0
    with pytest.raises(ValueError):
        _trainer_agg_case("sum")


def test_k3_kl_values_and_gradient():
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]])
    loss, stats = kz.clipped_surrogate_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 1), ref_logprobs=ref, kl_coef=1.0)
    loss.backward()
    assert stats["kl"] == pytest.approx(0.193147, abs=1e-6) and loss.item() == pytest.approx(0.193147, abs=1e-6)
    assert logp.grad.item() == pytest.approx(0.5, abs=1e-6)
    logp = torch.tensor([[math.log(0.3)]], requires_grad=True)
    loss, stats = kz.clipped_surrogate_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 1), ref_logprobs=logp.detach(),
                                  kl_coef=1.0)
    loss.backward()
    assert stats["kl"] == 0 and logp.grad.item() == 0
    # E_pi[k3] = KL(pi || ref) for pi = [.5, .5], ref = [.25, .75]
    pi, ref = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    k3 = ref / pi - torch.log(ref / pi) - 1
    assert float((pi * k3).sum()) == pytest.approx(0.143841, abs=1e-6)
    _, stats = kz.clipped_surrogate_loss(torch.log(pi)[None], torch.log(pi)[None], torch.zeros(1), pi[None] * 0 + 1,
                               ref_logprobs=torch.log(ref)[None], kl_coef=0.5)
    assert stats["kl"] == pytest.approx(float(k3.mean()), abs=1e-6)


def test_loss_clip_stats_and_ratio_clamp():
    logp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0]])
    loss, stats = kz.clipped_surrogate_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3))
    assert stats["clip_frac_high"] == pytest.approx(1 / 3) and stats["clip_frac_low"] == 0
    loss, stats = kz.clipped_surrogate_loss(logp, torch.zeros(1, 3), torch.tensor([-1.0]), torch.ones(1, 3))
    assert stats["clip_frac_low"] == pytest.approx(1 / 3) and stats["clip_frac_high"] == 0
    loss, _ = kz.clipped_surrogate_loss(torch.tensor([[100.0]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert torch.isfinite(loss) and loss.item() == pytest.approx(math.exp(20), rel=1e-5)  # log-ratio clamped at 20


# ---- masking

def test_completion_mask():
    X, Y, EOS, PAD = 5, 6, 2, 0
    ids = torch.tensor([[X, Y, EOS, PAD, PAD], [X, Y, X, Y, X], [EOS, EOS, EOS, EOS, EOS], [X, 9, X, 9, 9]])
    values_close(kz.completion_mask(ids, [EOS, 9]), [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0],
                                                       [1, 1, 0, 0, 0]])
    values_close(kz.completion_mask(ids[:2], [EOS]), [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])


# ---- CA-GRPO rewards: docstring numbers and invariants

def test_ca_grpo_rewards_numbers():
    r, g = kz.ca_grpo_rewards(torch.tensor([1., 1, 0, 1]), torch.tensor([2.0, 0.5, float("nan"), 1.0]), 4)
    values_close(r, [1.207944, 0.792056, 0, 1])
    values_close(g, [1, 1, 1, 1])
    r, g = kz.ca_grpo_rewards(torch.tensor([1., 0, 0, 0]), torch.tensor([3.0, 1, 1, 1]), 4)
    values_close(r, [1, 0, 0, 0])
    values_close(g, [0, 0, 0, 0])
    # clip at L = 2: speedup e^5 earns the same as e^2; unknown / broken speedups earn no bonus
    r, _ = kz.ca_grpo_rewards(torch.ones(4), torch.tensor([math.exp(5), math.exp(-5), float("inf"), 0.0]), 4)
    values_close(r, [1.6, 0.4, 1, 1], atol=1e-5)


def test_correct_always_outranks_incorrect():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        G = 8
        correct = (torch.rand(4 * G, generator=gen) < torch.rand(1, generator=gen)).float()
        speedup = torch.exp(torch.randn(4 * G, generator=gen) * 3)  # far beyond the clip range, both ways
        r, _ = kz.ca_grpo_rewards(correct, speedup, G)
        if correct.any() and (1 - correct).any():
            assert r[correct == 1].min() > r[correct == 0].max()
        assert torch.all(r[correct == 0] == 0) and torch.all(r[correct == 1] >= 1 - 0.3 * 2 - 1e-6)


def test_below_tau_speed_is_ignored():
    correct = torch.tensor([1., 0, 0, 0, 1, 1, 0, 0])  # rates 1/4 (< tau) and 2/4 (== tau)
    a1 = kz.group_advantages(kz.ca_grpo_rewards(correct, torch.tensor([5., 1, 1, 1, 1, 1, 1, 1]), 4)[0], 4)
    a2 = kz.group_advantages(kz.ca_grpo_rewards(correct, torch.tensor([0.2, 3, 3, 3, 1, 1, 1, 1]), 4)[0], 4)
    assert torch.equal(a1[:4], a2[:4])  # below tau: speedups change nothing
    a3 = kz.group_advantages(kz.ca_grpo_rewards(correct, torch.tensor([1., 1, 1, 1, 2.0, 1, 1, 1]), 4)[0], 4)
    assert not torch.equal(a1[4:], a3[4:])  # at tau: they do


def test_all_correct_group_learns_speed_exactly_when_speedups_differ():
    for speedups in ([1.0, 1.0, 1.0, 1.0], [1.5, 1.5, 1.5, 1.5], [1.0, 1.2, 1.0, 1.0], [0.5, 2.0, 1.0, 4.0]):
        r, gate = kz.ca_grpo_rewards(torch.ones(4), torch.tensor(speedups), 4)
        a = kz.group_advantages(r, 4)
        assert torch.all(gate == 1)
        assert bool(a.abs().sum() > 0) == (len(set(speedups)) > 1)
        if len(set(speedups)) > 1:  # faster kernels get larger advantages
            order = sorted(range(4), key=lambda i: speedups[i])
            assert all(a[order[i]] <= a[order[i + 1]] for i in range(3))


# ---- frontier reward (its docstring: the uncertainty-band reward)

def test_frontier_reward():
    values_close(kz.frontier_reward(torch.tensor([0.3, 0.5, 0.0, 1.0, 0.7]), torch.ones(5, dtype=torch.bool)),
                   [0.6, 1.0, 0.0, 0.0, 0.6])
    values_close(kz.frontier_reward(torch.tensor([0.5, float("nan")]), torch.tensor([False, False])), [-1, -1])
    values_close(kz.frontier_reward(torch.tensor([0.5, 0.5]), torch.tensor([True, True]), torch.tensor([0.25, 0.0])),
                   [0.75, 1.0])
    p = torch.linspace(0, 1, 101)
    r = kz.frontier_reward(p, torch.ones(101, dtype=torch.bool))
    assert int(r.argmax()) == 50 and float(r.max()) == pytest.approx(1.0) and torch.all(r >= 0)


def test_frontier_reward_ladder_for_invalid_modules():
    """An invalid module earns -1 + stage / 4 (frontier_reward's docstring): no code or a held-out copy -1, code that
    does not load or run (or misses an API, or repeats the pool) -0.75, a module that runs but breaks a task rule
    -0.5; every valid module at p = 1/2 still earns more than any invalid one."""
    why = ["format", "held_out", "apis", "in_pool", "lint: does not load", "lint: does not run", "lint: timeout",
           "lint: eager time", "lint: degenerate", "lint: not deterministic", None]
    stage = [kz.invalid_stage(w) for w in why]
    assert stage == [0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 1]
    valid = torch.tensor([w is None for w in why])
    r = kz.frontier_reward(torch.full((len(why),), 0.5), valid, stage=torch.tensor(stage))
    values_close(r, [-1, -1, -0.75, -0.75, -0.75, -0.75, -0.75, -0.5, -0.5, -0.5, 1.0])
    # a batch of invalid modules at different stages has reward spread: the Proposer gets a gradient
    adv = kz.group_advantages(r[[0, 5, 7, 8]], 4)
    assert adv[0] < adv[1] < adv[2] == adv[3]


def test_drop_zero_std_groups():
    keep = kz.drop_zero_std_groups(torch.tensor([1., 1, 1, 1, 0, 1, 0, 0, 0.5, 0.5, 0.5, 0.5]), 4)
    assert keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4
    assert kz.drop_zero_std_groups(torch.tensor([1., 0]), 1).tolist() == [True, True]


def test_repetition_penalty():
    pen = kz.repetition_penalty(["a", "a", "b", None], [True, True, True, False])
    values_close(pen, [0.25, 0.25, 0.0, 0.0])


def test_api_stats_and_weights():
    stats = {}
    kz.update_api_stats(stats, ["gelu", "sum"], [1, 0, 0, 0], ema=0.5)
    assert stats["gelu"] == {"pass_rate": 0.25, "attempts": 4}
    kz.update_api_stats(stats, ["gelu"], [1, 1, 1, 1], ema=0.5)
    assert stats["gelu"]["pass_rate"] == pytest.approx(0.625) and stats["gelu"]["attempts"] == 8
    stats["never"] = {"pass_rate": 0.0, "attempts": 8}
    stats["half"] = {"pass_rate": 0.5, "attempts": 8}
    w = kz.api_weights(stats)
    assert w["half"] > w["gelu"] > w["sum"] > w["never"] > 0


# ---- metrics

def test_harness_seconds_sums_phases_and_waits():
    from eval_harness import KernelResult
    a = KernelResult(compiled=True, correct=True, error_kind="ok",
                     details={"phase_s": {"startup": 1.0, "reference": 2.0, "run": 0.5}, "gpu_wait_s": 0.25})
    b = KernelResult(compiled=True, correct=False, error_kind="mismatch",
                     details={"phase_s": {"startup": 0.5, "reference": 1.5}, "gpu_wait_s": 1.0, "mem_wait_s": 2.0})
    fmt = KernelResult(compiled=False, correct=False, error_kind="format")   # never reached the harness
    assert kz.harness_seconds([a, b, fmt]) == {"startup": 1.5, "reference": 3.5, "run": 0.5, "gpu_wait": 1.25,
                                               "mem_wait": 2.0}
    assert kz.harness_seconds([fmt]) == {}


def test_pass_at_k():
    assert report.pass_at_k(10, 0, 1) == 0.0 and report.pass_at_k(10, 10, 5) == 1.0
    assert report.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert report.pass_at_k(10, 3, 10) == 1.0  # n - c < k
    assert report.pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert report.pass_at_k(200, 13, 100) == pytest.approx(1 - math.comb(187, 100) / math.comb(200, 100))
    with pytest.raises(ValueError):
        report.pass_at_k(3, 1, 4)
    with pytest.raises(ValueError):
        report.pass_at_k(3, 4, 1)


def test_fast_p():
    correct = [True, True, False, True]
    speedup = [1.0, 2.5, 9.0, None]
    assert report.fast_p(correct, speedup, 0) == pytest.approx(0.5)  # missing speedup: not counted as fast
    assert report.fast_p(correct, speedup, 1.0) == pytest.approx(0.25)  # strict: 1.0 is not > 1.0
    assert report.fast_p(correct, speedup, 2.5) == 0.0
    assert report.fast_p([False, False], [5.0, 5.0], 0) == 0.0  # incorrect kernels never count
    assert report.fast_p([], [], 1.0) == 0.0
    assert kz.geomean_speedup(correct, speedup) == pytest.approx(math.sqrt(2.5))
    assert kz.geomean_speedup([False], [2.0]) is None
