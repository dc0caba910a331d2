"""Each error-feedback rule on its own, one rank, against the formulas it documents: what it
compresses, what it keeps, what it returns; its state through ``rescale`` and a
``state_dict`` round trip; and, for the rules that stream, that compensating piece by piece
gives what compensating the whole vector gives."""

from __future__ import annotations

import pytest
import torch

from gssgd.aggregators.feedback import (
    RULES,
    EF21Feedback,
    ErrorFeedback,
    GlobalMomentumFeedback,
    OneBitFeedback,
    OneBitQuantisedFeedback,
    QuantisedFeedback,
)

RHO = 0.9


def _grads(steps: int = 3, d: int = 6) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(d, dtype=torch.float64, generator=g) for _ in range(steps)]


def test_classic_feedback_keeps_what_was_not_delivered_and_masks_the_velocity() -> None:
    rule, e, u = ErrorFeedback(RHO, masking=True), torch.zeros(6, dtype=torch.float64), None
    for g in _grads():
        u = g.clone() if u is None else RHO * u + g
        a = rule.compensate(g)
        assert torch.allclose(a, e + u)
        delivered = torch.tensor([0, 3])
        rule.keep(a, delivered)
        e = (e + u).index_fill(0, delivered, 0.0)
        u = u.index_fill(0, delivered, 0.0)  # DGC's masking
        assert torch.allclose(rule.residual, e) and torch.allclose(rule.velocity, u)
        update = torch.ones(6, dtype=torch.float64)
        assert rule.returned(update) is update


def test_ef21_returns_the_running_estimate_of_the_mean_velocity() -> None:
    rule, v, estimate = EF21Feedback(RHO), torch.zeros(6, dtype=torch.float64), None
    e = torch.zeros(6, dtype=torch.float64)
    for g in _grads():
        change = (RHO * v + g) - v
        v = RHO * v + g
        a = rule.compensate(g)
        assert torch.allclose(a, e + change)
        rule.keep(a, torch.tensor([1]))
        e = (e + change).index_fill(0, torch.tensor([1]), 0.0)
        assert torch.allclose(rule.velocity, v)  # never masked
        delta = torch.full((6,), 0.5, dtype=torch.float64)
        estimate = delta.clone() if estimate is None else estimate + delta
        assert torch.allclose(rule.returned(delta), estimate)


def test_global_momentum_masks_where_the_update_carries_coordinates() -> None:
    rule = GlobalMomentumFeedback(RHO)
    first = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    assert torch.equal(rule.returned(first), first)
    second = torch.tensor([0.0, 3.0, 1.0], dtype=torch.float64)
    # M[update != 0] = 0, then M = rho*M + update: coordinate 0 keeps its velocity
    assert torch.allclose(rule.returned(second), torch.tensor([RHO * 1.0, 3.0, 1.0],
                                                               dtype=torch.float64))
    g = torch.ones(3, dtype=torch.float64)
    assert torch.allclose(rule.compensate(g), g)  # no local momentum: a = e + g


def test_onebit_compresses_the_moving_average_and_returns_it_as_m() -> None:
    rule, (g1, g2) = OneBitFeedback(RHO), _grads(2)
    a = rule.compensate(g1)
    assert torch.allclose(a, (1 - RHO) * g1)
    rule.keep(a, torch.arange(6))  # all delivered
    m = rule.returned(a.clone())
    assert torch.allclose(rule.velocity, m)
    assert torch.allclose(rule.compensate(g2), RHO * m + (1 - RHO) * g2)


@pytest.mark.parametrize("rule_class", [QuantisedFeedback, OneBitQuantisedFeedback])
def test_a_quantisers_residual_is_what_its_message_got_wrong(rule_class) -> None:
    rule = rule_class(0.0)
    a = rule.compensate(torch.tensor([1.0, -2.0, 0.5]))
    sent = torch.tensor([1.0, -1.0, 0.0])
    rule.keep(a, sent)
    assert torch.equal(rule.residual, a - sent)
    assert torch.allclose(rule.compensate(torch.zeros(3)), a - sent)


@pytest.mark.parametrize("name", [n for n in RULES if n != "fetchsgd"])
def test_compensate_leaves_the_state_so_a_skipped_step_leaves_no_trace(name: str) -> None:
    """A step whose flags say some rank's gradient was not finite is skipped after its
    first message: compensate has run, keep never does. The state must be as before, and
    the next step what it would have been without the skipped one."""
    rule, twin = RULES[name](RHO), RULES[name](RHO)
    g1, g2, g3 = _grads(3)
    for r in (rule, twin):
        r.keep(r.compensate(g1), torch.tensor([2]))
        r.returned(torch.linspace(0, 1, 6, dtype=torch.float64))
    before = {k: v.clone() for k, v in rule.tensors().items() if v is not None}
    rule.compensate(g2)
    assert {k: v for k, v in rule.tensors().items() if v is not None}.keys() == before.keys()
    assert all(torch.equal(rule.tensors()[k], v) for k, v in before.items())
    rule.drop_step()
    a, b = rule.compensate(g3), twin.compensate(g3)
    assert torch.equal(a, b)
    rule.keep(a, torch.tensor([4]))
    twin.keep(b, torch.tensor([4]))
    assert all(torch.equal(rule.tensors()[k], v) for k, v in twin.tensors().items()
               if v is not None)


@pytest.mark.parametrize("name", list(RULES))
def test_state_survives_rescale_and_a_state_dict_round_trip(name: str) -> None:
    rule = RULES[name](RHO)
    if name == "fetchsgd":
        pytest.skip("its state is in sketch space (tests/aggregators/feedback/test_fetchsgd.py)")
    for g in _grads(2):
        a = rule.compensate(g)
        rule.keep(a, torch.tensor([2]))
        rule.returned(torch.linspace(0, 1, 6, dtype=torch.float64))
    before = {k: v.clone() for k, v in rule.tensors().items() if v is not None}
    rule.rescale(4.0)
    assert all(torch.equal(rule.tensors()[k], 4.0 * v) for k, v in before.items())
    copy = RULES[name](RHO)
    copy.load_state_dict(rule.state_dict())
    assert {k: v for k, v in copy.tensors().items() if v is not None}.keys() == before.keys()
    assert all(torch.equal(copy.tensors()[k], rule.tensors()[k]) for k in before)


@pytest.mark.parametrize("name", [n for n, r in RULES.items() if r.streams])
def test_compensating_piece_by_piece_equals_compensating_the_whole(name: str) -> None:
    whole, pieces = RULES[name](RHO), RULES[name](RHO)
    parts = [slice(0, 2), slice(2, 5), slice(5, 6)]
    for g in _grads():
        a = whole.compensate(g)
        out = torch.empty_like(g)
        velocity = torch.empty_like(g) if pieces.keeps_step_velocity else None
        for part in parts:
            pieces.compensate_part(g[part], part, out, velocity)
        if velocity is not None:
            pieces.velocity = velocity  # the taken step stores the new velocity
        # classic: the same additions, so the same bits; 1-bit Adam's streamed form adds
        # (1 - rho)*g + rho*m before the residual, so equal up to rounding
        assert torch.equal(out, a) if name == "ef" else torch.allclose(out, a, rtol=1e-12)
        whole.keep(a, torch.tensor([4]))
        pieces.keep(out, torch.tensor([4]))
        m = torch.full((6,), 0.25, dtype=torch.float64)
        whole.returned(m.clone())
        pieces.returned(m.clone())
    assert torch.allclose(whole.residual, pieces.residual, rtol=1e-12)


def test_the_rules_that_cannot_stream_say_so() -> None:
    assert sorted(n for n, r in RULES.items() if r.streams) == ["ef", "onebit"]


class _KeepWithoutSuper(ErrorFeedback):
    """A rule of a user's that writes its own ``keep`` and never calls the base's."""

    def keep(self, accumulated: torch.Tensor, delivered: torch.Tensor) -> None:
        accumulated[delivered] = 0
        self.residual = accumulated


def test_a_rule_whose_keep_skips_the_base_still_keeps_its_velocity() -> None:
    """compensate only computes the new velocity; the aggregator stores it once the step is
    taken, whatever the rule's keep does."""
    from gssgd import make_aggregator
    from gssgd.simulated import SimulatedWorld

    world = SimulatedWorld(2)
    aggs = [make_aggregator("topk", 6, k=2, momentum=RHO, group=world.rank(r)) for r in range(2)]
    for agg in aggs:
        agg.feedback = _KeepWithoutSuper(RHO)
    grads = _grads(2)
    world.run(lambda rank: [aggs[rank.rank].step(g.float()) for g in grads])
    u = RHO * grads[0].float() + grads[1].float()  # never masked by this rule
    for agg in aggs:
        assert torch.allclose(agg.feedback.velocity, u)
