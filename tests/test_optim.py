"""FrozenVarianceAdamW: AdamW until the freeze, then a step on the arriving momentum with
the variance it had at the freeze."""

from __future__ import annotations

import pytest
import torch

from gssgd.optim import FrozenVarianceAdamW

FREEZE = 4


def _grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(5, 3, generator=gen), torch.randn(3, generator=gen)]


def _params() -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(99)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=gen)),
            torch.nn.Parameter(torch.randn(3, generator=gen))]


def _step(opt: torch.optim.Optimizer, params: list, grads: list[torch.Tensor]) -> None:
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    opt.step()


def test_before_the_freeze_it_is_adamw() -> None:
    ours, theirs = _params(), _params()
    settings = dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    frozen = FrozenVarianceAdamW(ours, freeze_step=FREEZE, **settings)
    adamw = torch.optim.AdamW(theirs, **settings)
    for t in range(FREEZE):
        _step(frozen, ours, _grads(t))
        _step(adamw, theirs, _grads(t))
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_after_the_freeze_it_steps_on_the_momentum_with_the_frozen_variance() -> None:
    lr, wd, eps, (b1, b2) = 0.01, 0.1, 1e-8, (0.9, 0.99)
    params = _params()
    opt = FrozenVarianceAdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                              freeze_step=FREEZE)
    v = [torch.zeros_like(p) for p in params]
    for t in range(FREEZE):
        _step(opt, params, _grads(t))
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, _grads(t), strict=True)]
    frozen = [opt.state[p]["exp_avg_sq"].clone() for p in params]
    for vi, f in zip(v, frozen, strict=True):
        torch.testing.assert_close(vi, f)
    for t in range(FREEZE, FREEZE + 3):
        before = [p.detach().clone() for p in params]
        momentum = _grads(100 + t)  # what the hook returns: the compressed momentum m
        _step(opt, params, momentum)
        for p, x, m, vi in zip(params, before, momentum, v, strict=True):
            want = x * (1 - lr * wd) - lr * m / ((vi / (1 - b2**FREEZE)).sqrt() + eps)
            torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
        for p, f in zip(params, frozen, strict=True):
            assert torch.equal(opt.state[p]["exp_avg_sq"], f)  # the variance stays frozen


def test_a_moving_variance_follows_the_gradient_the_momentum_implies() -> None:
    """variance="moving": after the freeze v keeps moving on g_hat = (m - b1*m_prev)/(1-b1),
    with m_prev = 0 at the switch (the aggregator's momentum starts there), and the step
    divides by v's bias correction at the current step."""
    lr, wd, eps, (b1, b2) = 0.01, 0.1, 1e-8, (0.9, 0.99)
    params = _params()
    opt = FrozenVarianceAdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                              freeze_step=FREEZE, variance="moving")
    v = [torch.zeros_like(p) for p in params]
    for t in range(FREEZE):
        _step(opt, params, _grads(t))
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, _grads(t), strict=True)]
    previous = [torch.zeros_like(p) for p in params]
    for t in range(FREEZE, FREEZE + 3):
        before = [p.detach().clone() for p in params]
        momentum = _grads(100 + t)
        _step(opt, params, momentum)
        implied = [(m - b1 * m0) / (1 - b1) for m, m0 in zip(momentum, previous, strict=True)]
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, implied, strict=True)]
        for p, x, m, vi in zip(params, before, momentum, v, strict=True):
            want = x * (1 - lr * wd) - lr * m / ((vi / (1 - b2 ** (t + 1))).sqrt() + eps)
            torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
        previous = momentum


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"freeze_step": 0}, r"freeze_step=0 is invalid: it must be an integer >= 1"),
        ({"lr": 0.0}, r"lr=0.0 is invalid"),
        ({"betas": (0.9, 1.0)}, r"betas=\(0.9, 1.0\) is invalid"),
        ({"variance": "slow"}, r"variance='slow' is invalid: it must be one of \('frozen', "),
    ],
)
def test_bad_settings_are_refused(settings: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FrozenVarianceAdamW(_params(), **settings)
