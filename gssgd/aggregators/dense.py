"""Dense all-reduce: the uncompressed baseline every compressor is measured against.

Steps (per rank, each step):
    1. (16-bit payload only) scale the gradient by 1/P and cast, so the sum cannot overflow.
    2. All-reduce the payload with the backend (a bandwidth-optimal ring: each rank sends
       and receives ``2(P-1)/P * d`` elements).
    3. Return the average in the gradient's dtype. No residual: nothing is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gssgd._validate import bad_value
from gssgd.aggregators.base import Aggregator
from gssgd.aggregators.options import PAYLOAD_DTYPES, CommonOptions
from gssgd.comm import Traffic, ring_allreduce

__all__ = ["DenseAllReduce", "DenseOptions"]


@dataclass(frozen=True)
class DenseOptions(CommonOptions):
    """Dense all-reduce. ``dtype``: payload dtype (float32, float16 or bfloat16)."""

    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in PAYLOAD_DTYPES.values():
            raise bad_value(
                "dtype",
                self.dtype,
                "it must be torch.float32, torch.float16 or torch.bfloat16",
                "Use torch.float16 for a 16-bit payload.",
            )


class DenseAllReduce(Aggregator):
    """All-reduce of the full gradient, optionally with a float16/bfloat16 payload.

    Example:
        >>> agg = gssgd.make_aggregator("dense", d, dtype=torch.float16)  # doctest: +SKIP
        >>> update = agg.step(grad)  # the average gradient over ranks
    """

    name = "dense"
    Options = DenseOptions
    has_residual = False
    sends_all = True
    compresses = False
    options: DenseOptions

    @classmethod
    def traffic(
        cls, d: int, k: int, options: DenseOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """A ring all-reduce of the ``d`` payload values, the same at every step."""
        size = options.dtype.itemsize
        return cls.control_traffic(world_size) + ring_allreduce(d * size, world_size, size)

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        skipped = self._begin(grad)
        if skipped is not None:
            return skipped
        low_precision = self.options.dtype != torch.float32
        with self._timed("compress"):
            if low_precision:
                payload = (grad / self.world_size).to(self.options.dtype)
            else:
                payload = grad.to(torch.float32, copy=True)
        summed = self.comm.allreduce_backend(payload)
        with self._timed("decompress"):
            if low_precision:
                update = summed.to(grad.dtype)
            else:
                update = (summed / self.world_size).to(grad.dtype)
        return self._finish(update)
