"""The Count Sketch hashes inside a Triton kernel, bit for bit those of :mod:`gssgd.sketch.count_sketch`.

Row ``r``'s constants ``(a, b, c, e)`` come from :func:`gssgd.sketch.count_sketch.sketch_hash_params`
as a ``(rows, 4)`` int64 tensor (:func:`params_tensor`); the kernel reads them as unsigned
64-bit integers, where multiplication and addition wrap mod 2^64 exactly as torch's int64
arithmetic does in :func:`gssgd.sketch.count_sketch.signed_buckets`::

    bucket = (((a * i + b) mod 2^64) >> 32) * cols >> 32
    negative = top bit of (c * i + e) mod 2^64

(``(h >> 32) * cols`` is below ``2^32 * cols``, so with ``cols < 2^31`` it cannot wrap,
and the logical shift of the unsigned value equals torch's arithmetic shift masked to 32
bits.) No d-sized hash tensor exists anywhere: each coordinate's hashes are computed where
they are used.

Also here: :func:`compact`, the two-pass count/compact step the screening kernels share.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch
import triton
import triton.language as tl

__all__ = ["BLOCK", "compact", "params_tensor", "row_value", "signed_bucket"]

#: Coordinates per program of the element-wise kernels.
BLOCK = 1024


@lru_cache(maxsize=16)
def _params_on(params: tuple[tuple[int, int, int, int], ...], device: str) -> torch.Tensor:
    return torch.tensor(params, dtype=torch.int64, device=device)


def params_tensor(params: list[tuple[int, int, int, int]], device: torch.device) -> torch.Tensor:
    """``sketch_hash_params(seed, rows)`` as a ``(rows, 4)`` int64 tensor on ``device``.

    Memoised (a few recent parameter sets per device) so a step does not pay a host-to-device
    copy per kernel launch; the tensors are constants and never written.
    """
    return _params_on(tuple(tuple(p) for p in params), str(device))


@triton.jit
def signed_bucket(idx, params_ptr, row, cols):
    """Bucket (int64, in ``[0, cols)``) and sign (True: negative) of coordinates ``idx``
    (uint64) in row ``row``."""
    a = tl.load(params_ptr + 4 * row).to(tl.uint64, bitcast=True)
    b = tl.load(params_ptr + 4 * row + 1).to(tl.uint64, bitcast=True)
    c = tl.load(params_ptr + 4 * row + 2).to(tl.uint64, bitcast=True)
    e = tl.load(params_ptr + 4 * row + 3).to(tl.uint64, bitcast=True)
    high = (idx * a + b) >> 32
    bucket = ((high * cols.to(tl.uint64)) >> 32).to(tl.int64)
    negative = ((idx * c + e) >> 63) != 0
    return bucket, negative


@triton.jit
def row_value(table_ptr, params_ptr, idx, row, cols, mask):
    """``sign_r(i) * table[r, bucket_r(i)]`` for coordinates ``idx`` (uint64): what row
    ``row`` says about them (0 where ``mask`` is False), in float32 (float64 for a float64
    table)."""
    bucket, negative = signed_bucket(idx, params_ptr, row, cols)
    # float32 holds every 16-bit value exactly, so min/max/compare in float32 give the same
    # order statistic as in the table's dtype (and 16-bit arithmetic is not everywhere).
    value = tl.load(table_ptr + row * cols + bucket, mask=mask, other=0.0)
    if value.dtype != tl.float64:
        value = value.to(tl.float32)
    return tl.where(negative, -value, value)


def compact(launch: Callable[..., None], n: int, device: torch.device) -> torch.Tensor:
    """The ascending positions a screening kernel keeps, in two passes (deterministic).

    ``launch(grid, counts, offsets, out, write)`` runs the kernel over ``n`` positions in
    blocks of :data:`BLOCK`: with ``write=False`` each program stores how many of its
    positions it keeps into ``counts``; with ``write=True`` it stores them, in order, from
    ``out[offsets[program]]`` on. Between the passes an exclusive prefix sum of the counts
    places every block, so the result is sorted without a sort and the same on every run.

    Returns:
        int64 tensor of the kept positions, ascending.
    """
    grid = (triton.cdiv(n, BLOCK),)
    counts = torch.empty(grid[0], dtype=torch.int64, device=device)
    launch(grid, counts, counts, counts, False)
    ends = torch.cumsum(counts, 0)
    total = int(ends[-1])
    out = torch.empty(total, dtype=torch.int64, device=device)
    if total:
        launch(grid, counts, ends - counts, out, True)
    return out
