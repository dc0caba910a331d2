"""Selection kernels: the threshold count/compact step of the top-k, and the gather.

* :func:`at_least` = ``torch.nonzero(values >= tau).flatten()`` (what
  :func:`gssgd.selection._at_least` computes on the torch path): the survivors of the
  sampled-threshold top-k selection, ascending, in one read of ``values`` per pass.
* :func:`gather` = ``vec[indices]``: the exact values at the candidates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gssgd.kernels.hash import BLOCK, compact

__all__ = ["at_least", "gather"]


@triton.jit(do_not_specialize=["n"])
def _at_least_kernel(
    values_ptr, tau_ptr, counts_ptr, offsets_ptr, out_ptr, n,
    WRITE: tl.constexpr, BLOCK: tl.constexpr,
):
    """Positions with ``values >= tau``: counted per block, or stored in order."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = tl.load(values_ptr + offs, mask=mask, other=0.0)
    tau = tl.load(tau_ptr)
    if values.dtype != tl.float64:  # 16-bit values compare exactly in float32
        values = values.to(tl.float32)
        tau = tau.to(tl.float32)
    keep = mask & (values >= tau)
    if WRITE:
        slot = tl.load(offsets_ptr + pid) + tl.cumsum(keep.to(tl.int64), axis=0) - 1
        tl.store(out_ptr + slot, offs, mask=keep)
    else:
        tl.store(counts_ptr + pid, tl.sum(keep.to(tl.int64), axis=0))


def at_least(values: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Ascending flat indices of ``values >= tau`` (NaN never qualifies).

    Args:
        values: float tensor (read flat; made contiguous if it is not).
        tau: 0-d or one-element tensor on the same device (cast to ``values``' dtype).

    Returns:
        int64 tensor, the same as ``torch.nonzero(values.flatten() >= tau).flatten()``.
    """
    if tau.device != values.device:
        raise ValueError(
            f"tau is on {tau.device} but values are on {values.device}; move one of them."
        )
    flat = values.reshape(-1).contiguous()
    threshold = tau.reshape(1).to(flat.dtype)

    def launch(grid, counts, offsets, out, write):
        _at_least_kernel[grid](
            flat, threshold, counts, offsets, out, flat.numel(), WRITE=write, BLOCK=BLOCK
        )

    return compact(launch, flat.numel(), values.device)


@triton.jit(do_not_specialize=["n"])
def _gather_kernel(vec_ptr, idx_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    idx = tl.load(idx_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, tl.load(vec_ptr + idx, mask=mask), mask=mask)


def gather(vec: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``vec[indices]`` for a 1-D ``vec`` and 1-D integer ``indices`` (not range-checked).

    Raises:
        ValueError: the shapes or devices do not fit.
    """
    if vec.dim() != 1 or indices.dim() != 1 or indices.dtype.is_floating_point:
        raise ValueError(
            f"gather needs a 1-D vec and 1-D integer indices; got shapes {tuple(vec.shape)} "
            f"and {tuple(indices.shape)} ({indices.dtype})."
        )
    if indices.device != vec.device:
        raise ValueError(
            f"indices are on {indices.device} but vec is on {vec.device}; move one of them."
        )
    out = torch.empty(indices.numel(), dtype=vec.dtype, device=vec.device)
    if out.numel():
        grid = (triton.cdiv(out.numel(), BLOCK),)
        _gather_kernel[grid](
            vec.contiguous(), indices.contiguous(), out, out.numel(), BLOCK=BLOCK
        )
    return out
