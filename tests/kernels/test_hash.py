"""The in-kernel hashes are :func:`gssgd.sketch.count_sketch.signed_buckets`, bit for bit."""

from __future__ import annotations

import pytest
import torch

from gssgd.sketch.count_sketch import signed_buckets, sketch_hash_params
from tests.kernels.conftest import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from gssgd.kernels.hash import params_tensor, signed_bucket

    @triton.jit(do_not_specialize=["n", "cols"])
    def _buckets_kernel(idx_ptr, params_ptr, out_ptr, n, cols, ROWS: tl.constexpr,
                        BLOCK: tl.constexpr):
        """out[r, j] = bucket_r(idx[j]) + cols * [sign_r(idx[j]) < 0], as signed_buckets."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        idx = tl.load(idx_ptr + offs, mask=mask, other=0).to(tl.uint64, bitcast=True)
        for r in tl.static_range(ROWS):
            bucket, negative = signed_bucket(idx, params_ptr, r, cols)
            tl.store(out_ptr + r * n + offs, bucket + cols * negative.to(tl.int64), mask=mask)


def _kernel_buckets(idx: torch.Tensor, params: list, cols: int) -> torch.Tensor:
    out = torch.empty(len(params), idx.numel(), dtype=torch.int64, device=idx.device)
    grid = (triton.cdiv(idx.numel(), 256),)
    _buckets_kernel[grid](
        idx, params_tensor(params, idx.device), out, idx.numel(), cols, ROWS=len(params),
        BLOCK=256,
    )
    return out


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**40 + 7])
@pytest.mark.parametrize("cols", [1, 7, 4096, 1_100_000])
def test_kernel_hashes_equal_signed_buckets(device: torch.device, seed: int, cols: int) -> None:
    params = sketch_hash_params(seed, rows=3)
    gen = torch.Generator().manual_seed(seed % 1000)
    idx = torch.cat([
        torch.arange(0, 300),
        torch.randint(0, 2**31 - 1, (300,), generator=gen),
        torch.tensor([2**31 - 1, 2**31, 2**32 + 5, 2**40 + 3, 2**62]),
    ]).to(device)
    expected = signed_buckets(idx, params, cols)
    got = _kernel_buckets(idx, params, cols)
    assert torch.equal(got, expected)
    assert int(got.min()) >= 0 and int(got.max()) < 2 * cols
