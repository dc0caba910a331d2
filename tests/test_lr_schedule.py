"""The learning-rate schedule's rule (gssgd.lr_schedule): warm-up, constant, cosine, and
its torch scheduler giving the same numbers."""

from __future__ import annotations

import math

import pytest
import torch

from gssgd.lr_schedule import LrSchedule


def test_the_warm_up_rises_linearly_to_the_peak() -> None:
    schedule = LrSchedule("constant", warmup_steps=4, total_steps=10)
    assert [schedule.factor(t) for t in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_the_cosine_falls_from_the_peak_to_zero_over_the_rest_of_the_run() -> None:
    schedule = LrSchedule("cosine", warmup_steps=2, total_steps=12)
    factors = [schedule.factor(t) for t in range(12)]
    assert factors[:3] == [0.5, 1.0, 1.0]
    assert factors[7] == pytest.approx(0.5)  # half way through the decay (t - 2 = 5 of 10)
    assert all(a > b for a, b in zip(factors[2:-1], factors[3:], strict=True))
    assert factors[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 9 / 10)))
    assert schedule.factor(12) == 0.0 and schedule.factor(50) == 0.0


def test_constant_without_warm_up_leaves_the_optimizer_alone() -> None:
    optimizer = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.3)
    LrSchedule("constant", 0, 5).apply(optimizer, 0.1, 3)
    assert optimizer.param_groups[0]["lr"] == 0.3


def test_the_torch_scheduler_gives_the_numbers_apply_sets() -> None:
    """The one-call API's LambdaLR and the trainer's apply() agree bit for bit."""
    schedule = LrSchedule("cosine", warmup_steps=3, total_steps=20)
    by_torch = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.05)
    by_hand = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.05)
    scheduler = schedule.scheduler(by_torch)
    for step in range(20):
        schedule.apply(by_hand, 0.05, step)
        assert by_torch.param_groups[0]["lr"] == by_hand.param_groups[0]["lr"], step
        by_torch.step()
        scheduler.step()


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"kind": "linear"}, r"lr_schedule='linear' is invalid: it must be one of constant, cosine"),
    ({"warmup_steps": -1}, r"warmup_steps=-1 is invalid: it must be an integer >= 0"),
    ({"total_steps": 0}, r"total_steps=0 is invalid"),
    ({"warmup_steps": 10, "total_steps": 10}, r"lr_warmup_steps=10 is invalid: it must be "
     r"below the run's 10 steps"),
])
def test_bad_settings_are_refused_by_name(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LrSchedule(**{"total_steps": 5, **kwargs})
