"""The hook warns (once) when an optimizer with momentum runs on top of a sparse method."""

from __future__ import annotations

import warnings

import pytest
import torch

import gssgd.ddp.recipe as recipe
from gssgd.ddp import HookState


@pytest.fixture()
def fresh_warning(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(recipe, "_warned_momentum", False)
    yield


def _step(momentum: float) -> list[warnings.WarningMessage]:
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1, momentum=momentum)
    p.grad = torch.ones(3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opt.step()
    return [w for w in seen if "gssgd" in str(w.message)]


def test_momentum_on_a_sparse_method_warns_once_with_the_fix(fresh_warning) -> None:
    state = HookState("gs", density=0.01)
    first = _step(0.9)
    assert len(first) == 1
    text = str(first[0].message)
    assert "momentum=0.9" in text and "'gs'" in text and "momentum=0" in text
    assert "HookState('gs', ..., momentum=0.9)" in text
    assert _step(0.9) == []  # once per process
    del state


def test_no_warning_for_plain_sgd_or_a_dense_method(fresh_warning) -> None:
    state = HookState("topk", density=0.01)
    assert _step(0.0) == []
    del state
    dense = HookState("dense")
    assert _step(0.9) == []  # no sparse state alive: momentum after an all-reduce is fine
    del dense
