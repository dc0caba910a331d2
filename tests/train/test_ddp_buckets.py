"""The simulated trainer's DDP buckets (gssgd.train.ddp_buckets) against real DDP's: the
same parameters in the same buckets, in the same order, at every iteration."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gssgd.train.data import load_dataset
from gssgd.train.ddp_buckets import DDPBuckets, bucket_size_limits
from gssgd.train.models import build_model
from tests.dist_utils import raise_worker_errors, run_each, run_workers

#: name: (model, bucket_cap_mb); the model's input shape follows the name
CASES: dict[str, tuple[str, float | None]] = {
    "cnn": ("cnn", None),  # digits' CNN, 12k weights: one bucket, rebuilt in ready order
    "cnn-small-caps": ("cnn", 0.004),  # 4 KiB limits: three buckets, the second conv weight alone
    "wide": ("wide", None),  # 1.3 MB: the 1 MiB first bucket, then the rest
}


def _model(name: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "wide":  # a weight past 1 MiB between small ones
        return nn.Sequential(nn.Linear(64, 320), nn.ReLU(), nn.Linear(320, 1000),
                             nn.Tanh(), nn.Linear(1000, 10)), torch.randn(4, 64)
    data = load_dataset("digits")
    return build_model(name, data), torch.randn(4, 1, 8, 8)


def _ddp_layouts(rank: int, world_size: int, model_name: str, cap: float | None) -> list:
    """Real DDP: each iteration's buckets, as lists of parameter names, in hook order."""
    model, x = _model(model_name)
    names = {id(p): n for n, p in model.named_parameters()}
    ddp = DistributedDataParallel(model, **({} if cap is None else {"bucket_cap_mb": cap}))
    seen: list[list[list[str]]] = []

    # No annotations: under ``from __future__ import annotations`` they are strings, and
    # DDP's register_comm_hook rejects a bucket annotation that is not dist.GradBucket.
    def hook(state, bucket):
        if bucket.index() == 0:
            seen.append([])
        seen[-1].append([names[id(p)] for p in bucket.parameters()])
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, hook)
    for _ in range(3):
        ddp(x).square().sum().backward()
    return seen


def _simulated_layouts(model_name: str, cap: float | None) -> list[list[list[str]]]:
    model, x = _model(model_name)
    names = [n for n, _ in model.named_parameters()]
    buckets = DDPBuckets(list(model.parameters()), cap)
    layouts = []
    for it in range(3):
        buckets.start_iteration()
        layouts.append([[names[i] for i in bucket] for bucket in buckets.buckets])
        if it == 0:
            buckets.watch_backward(model(x).square().sum())
    return layouts


@pytest.fixture(scope="module")
def ddp_layouts() -> dict[str, list]:
    """Every case's real layouts from one spawn of two gloo processes (rank 0's)."""
    results = run_workers(2, run_each, _ddp_layouts, CASES)
    raise_worker_errors(results)
    for name in CASES:
        raise_worker_errors([r[name] for r in results])
    return results[0]


@pytest.mark.parametrize("case", list(CASES))
def test_the_simulated_buckets_are_ddps_at_every_iteration(ddp_layouts: dict, case: str) -> None:
    """Iteration 0: one bucket in model order; from iteration 1: DDP's rebuilt buckets, in
    the order the gradients became ready, cut at 1 MiB and then 25 MiB (or bucket_cap_mb)."""
    real = ddp_layouts[case]
    assert _simulated_layouts(*CASES[case]) == real
    assert len(real[0]) == 1 and len(real[1]) == {"cnn": 1, "cnn-small-caps": 3, "wide": 2}[case]


def test_bucket_size_limits_follow_ddps_rule() -> None:
    assert bucket_size_limits() == [1 << 20, 25 << 20]
    assert bucket_size_limits(0.5) == [1 << 19, 1 << 19]


def test_split_and_join_give_each_bucket_its_gradients_and_the_model_order_back() -> None:
    model, x = _model("cnn")
    params = list(model.parameters())
    buckets = DDPBuckets(params, 0.004)
    buckets.watch_backward(model(x).sum())
    buckets.start_iteration()
    flat = torch.arange(sum(p.numel() for p in params), dtype=torch.float32)
    split = buckets.split(flat)
    assert [b.index() for b in split] == list(range(len(buckets.buckets)))
    assert [b.is_last() for b in split] == [False] * (len(split) - 1) + [True]
    starts = torch.tensor([0] + [p.numel() for p in params]).cumsum(0)
    for b, bucket in zip(split, buckets.buckets, strict=True):
        assert [id(p) for p in b.parameters()] == [id(params[i]) for i in bucket]
        for g, i in zip(b.gradients(), bucket, strict=True):
            assert torch.equal(g.reshape(-1), flat[starts[i]:starts[i + 1]])
    assert torch.equal(buckets.join([b.buffer() for b in split]), flat)
