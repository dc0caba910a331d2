"""FetchSGD's sketch-space feedback (gssgd.aggregators.feedback): the authors' rule.

The error sketch is zeroed in the buckets the delivered coordinates touch (the authors'
code), not reduced by their sketch (the paper's formula, which diverges): both rules run
on the same noisy quadratic, the library's trains and the subtracting one, written out
here, blows up.
"""

from __future__ import annotations

import torch

from gssgd.aggregators.feedback import SketchFeedback
from gssgd.sketch import CountSketch

D, ROWS, COLS, K, WORKERS, RHO, LR, STEPS = 4000, 5, 800, 40, 4, 0.9, 0.01, 300


def _subtracting(state: dict, summed: CountSketch, k: int):
    """The paper's step 4: ``S_e -= sketch(delta)``, ``S_u = 0`` where it is nonzero."""
    table = summed.table
    if not state:
        state["u"], state["e"] = torch.zeros_like(table), torch.zeros_like(table)
    state["u"].mul_(RHO).add_(table)
    state["e"].add_(state["u"])
    indices, values = summed.with_table(state["e"]).heavy_hitters(k)
    delta = torch.zeros(summed.d)
    delta[indices] = values
    delivered = summed.with_table(torch.zeros_like(table))
    delivered.accumulate(delta)
    state["e"].sub_(delivered.table)
    state["u"][delivered.table != 0] = 0
    return indices, values


def _train(recover) -> tuple[float, float]:
    """SGD on ``0.5 * sum(h * (x - x*)^2)`` with noisy gradients from four workers,
    aggregated through a 5 x 800 sketch, k = 40 of d = 4000. Returns (first, last) loss."""
    gen = torch.Generator().manual_seed(0)
    target, curvature = torch.randn(D, generator=gen), 2 * torch.rand(D, generator=gen) ** 2
    x, losses = torch.zeros(D), []
    for _ in range(STEPS):
        summed = CountSketch(D, ROWS, COLS, seed=1)
        for _ in range(WORKERS):
            summed.accumulate((x - target) * curvature + 0.3 * torch.randn(D, generator=gen))
        indices, values = recover(summed, K)
        x[indices] -= LR * values / WORKERS
        losses.append(float(0.5 * ((x - target) ** 2 * curvature).sum()))
    return losses[0], losses[-1]


def test_zeroing_the_touched_buckets_trains_where_subtracting_diverges() -> None:
    first, last = _train(SketchFeedback(RHO).recover)
    assert last < 0.2 * first, (first, last)
    state: dict = {}
    first_sub, last_sub = _train(lambda s, k: _subtracting(state, s, k))
    assert first_sub == first  # the same first step
    assert not last_sub < 10 * first, (first_sub, last_sub)  # diverged (inf or nan too)


def test_touched_buckets_leave_the_error_and_the_velocity() -> None:
    feedback = SketchFeedback(0.5)
    summed = CountSketch(50, 3, 16, seed=2)
    summed.accumulate(torch.linspace(-1, 1, 50))
    indices, _ = feedback.recover(summed, 3)
    touched = CountSketch(50, 3, 16, seed=2)
    delta = torch.zeros(50)
    delta[indices] = 1.0
    touched.accumulate(delta)
    mask = touched.table != 0
    assert mask.any() and (~mask).any()
    assert torch.all(feedback.error[mask] == 0) and torch.all(feedback.velocity[mask] == 0)
    assert torch.equal(feedback.error[~mask], summed.table[~mask])  # S_e = S_u = S elsewhere
