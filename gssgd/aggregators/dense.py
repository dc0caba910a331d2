"""Dense all-reduce: the uncompressed baseline every compressor is measured against.

Steps (per rank, each step):
    1. (16-bit payload only) scale the gradient by 1/P and cast, so the sum cannot overflow.
    2. All-reduce the payload with the backend (a bandwidth-optimal ring: each rank sends
       and receives ``2(P-1)/P * d`` elements); the ranks' ``P`` non-finite flags ride at
       its end, so no separate exchange starts the step.
    3. A step non-finite on any rank takes the ``nonfinite`` policy on every rank; else
       return the average in the gradient's dtype. No residual: nothing is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gssgd.aggregators.base import Aggregator, all_finite, flagged_allreduce
from gssgd.aggregators.options import PAYLOAD_DTYPES, CommonOptions
from gssgd.comm import Traffic, chain
from gssgd.validate import bad_value

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
    flags_ride = True
    starts_async = True
    sends_all = True
    compresses = False
    options: DenseOptions

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: DenseOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """A ring all-reduce of the ``d`` payload values and the ranks' ``P`` non-finite
        flags, the same at every step."""
        return flagged_allreduce(d, world_size, options.dtype.itemsize)

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        summed, finish = self._launch(grad)
        return finish(summed.wait())

    def start_step(self, grad: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """The step as a future that completes when the all-reduce has (:attr:`starts_async`:
        it returns as soon as the all-reduce is started, as DDP's own hook does); bitwise
        :meth:`step`'s update. The rest of the step runs in the future's callback (on the
        backend's thread under gloo); an error there fails the returned future."""
        summed, finish = self._launch(grad)
        return chain(summed, finish, grad.device)

    def _launch(
        self, grad: torch.Tensor
    ) -> tuple[torch.futures.Future[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
        """Start the step's all-reduce; return its future and what turns the summed payload
        into the update (steps 1-2, then 3)."""
        self._start(grad)
        d, low_precision = self.d, self.options.dtype != torch.float32
        with self._timed("compress"):
            payload = torch.empty(d + self.world_size, dtype=self.options.dtype,
                                  device=grad.device)
            bad = not all_finite(grad)
            payload[d:] = self._flag_slots(bad, self.options.dtype, grad.device)
            if low_precision:
                payload[:d] = grad / self.world_size
            else:
                payload[:d] = grad
        started = time.perf_counter()
        summed = self.comm.allreduce_backend_async(payload)

        def finish(summed: torch.Tensor) -> torch.Tensor:
            self.comm.stats.seconds += time.perf_counter() - started
            skipped = self._guard(grad, self._flags_of(summed))
            if skipped is not None:
                return skipped
            with self._timed("decompress"):
                if low_precision:
                    update = summed[:d].to(grad.dtype)
                else:
                    update = summed[:d].div_(self.world_size).to(grad.dtype)
            return self._finish(update)

        return summed, finish
