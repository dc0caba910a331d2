"""Selection kernels against torch: the threshold compaction, the sampled top-k, the gather."""

from __future__ import annotations

import pytest
import torch

from gssgd.selection import exact_topk_indices, sampled_topk_indices, topk_indices
from tests.kernels.conftest import HAVE_TRITON

if HAVE_TRITON:
    from gssgd.kernels import select_ops

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _values(n: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 1000, 1024, 3001])
def test_at_least_is_nonzero_of_the_mask(device: torch.device, dtype, n: int) -> None:
    values = _values(n, dtype=dtype)
    values[::7] = values[3 % n]  # many entries tie with ...
    tau = values[3 % n].clone()  # ... the threshold itself: ties count
    got = select_ops.at_least(values.to(device), tau.to(device))
    assert torch.equal(got.cpu(), torch.nonzero(values >= tau).flatten())


def test_at_least_skips_nan_and_handles_none_and_all(device: torch.device) -> None:
    values = _values(2500)
    values[[5, 700, 2400]] = float("nan")
    got = select_ops.at_least(values.to(device), torch.tensor(0.5, device=device))
    assert torch.equal(got.cpu(), torch.nonzero(values >= 0.5).flatten())
    assert select_ops.at_least(values.to(device), torch.tensor(100.0, device=device)).numel() == 0
    finite = values.nan_to_num(0.0).to(device)
    all_ = select_ops.at_least(finite, torch.tensor(-100.0, device=device))
    assert torch.equal(all_.cpu(), torch.arange(2500))


def test_at_least_reads_a_matrix_flat(device: torch.device) -> None:
    values = _values(60 * 50).reshape(60, 50).t()  # not contiguous
    got = select_ops.at_least(values.to(device), torch.tensor(1.0, device=device))
    assert torch.equal(got.cpu(), torch.nonzero(values.reshape(-1) >= 1.0).flatten())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ordered", [True, False])
def test_sampled_topk_with_kernels_is_the_exact_selection(
    kernels_on: torch.device, dtype, ordered: bool
) -> None:
    n, k = 40_000, 37
    values = _values(n, seed=1, dtype=dtype).abs()
    values[1000:1400] = values.max()  # a block of ties at the top: lower indices win
    values = values.to(kernels_on)
    got, path = sampled_topk_indices(values, k, ordered)
    assert path == "sampled"
    want = exact_topk_indices(values.cpu(), k, ordered=True)
    if ordered:
        assert torch.equal(got.cpu(), want)
    else:
        assert torch.equal(got.sort().values.cpu(), want.sort().values)


def test_topk_indices_falls_back_when_the_sample_misleads(kernels_on: torch.device) -> None:
    n, k = 40_000, 50
    values = torch.zeros(n)
    values[-k:] = torch.arange(1, k + 1, dtype=torch.float32)  # the top k all outside the sample
    got = topk_indices(values.to(kernels_on), k, method="sampled")
    assert torch.equal(got.cpu(), exact_topk_indices(values, k))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_is_indexing(device: torch.device, dtype) -> None:
    vec = _values(3001, dtype=dtype)
    idx = torch.tensor([3000, 0, 5, 5, 1024, 2047])
    assert torch.equal(select_ops.gather(vec.to(device), idx.to(device)).cpu(), vec[idx])
    assert select_ops.gather(vec.to(device), idx[:0].to(device)).numel() == 0


def test_gather_rejects_float_indices(device: torch.device) -> None:
    with pytest.raises(ValueError, match="1-D integer indices"):
        select_ops.gather(torch.zeros(4, device=device), torch.zeros(2, device=device))
