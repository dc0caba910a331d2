"""Local Top-k with error feedback (Stich et al. 2018; Aji & Heafield 2017).

Steps (per rank p, each step):
    1. Accumulate: ``a_p = e_p + u_p`` (``u_p = rho*u_p + g_p`` with local momentum).
    2. Compress: the k largest ``|a_p|`` (ties by lower index) and their values.
    3. Communicate: all-gather the (index, value) lists of every rank: each rank sends 2k
       numbers and receives 2k(P-1).
    4. Decompress: sum the P lists in rank order; the update is the sum / P.
    5. Error feedback: ``e_p = a_p`` with the k sent coordinates zeroed (all were delivered).

Every rank sends a different index set, so the summed update holds up to P*k coordinates
and the received bytes grow with P.
"""

from __future__ import annotations

import torch

from gssgd._select import topk_indices
from gssgd.aggregators.base import Aggregator, index_dtype
from gssgd.aggregators.options import TopkOptions
from gssgd.comm import Traffic, allgather

__all__ = ["LocalTopk"]


class LocalTopk(Aggregator):
    """Each rank sends its own top-k; the update sums all of them."""

    name = "topk"
    Options = TopkOptions
    options: TopkOptions

    @classmethod
    def traffic(
        cls, d: int, k: int, options: TopkOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """An all-gather of k indices, then one of k values (the step's k: see
        :meth:`~gssgd.aggregators.base.Aggregator.traffic`)."""
        k = cls.k_at_step(d, k, options, step)
        index_bytes = index_dtype(d).itemsize
        return (
            cls.control_traffic(world_size)
            + allgather(k * index_bytes, world_size)
            + allgather(k * 4, world_size)
        )

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        skipped = self._begin(grad)
        if skipped is not None:
            return skipped
        with self._timed("compress"):
            accumulated = self._error_compensated(grad)
            idx = topk_indices(accumulated.abs(), self.step_k)
            vals = accumulated[idx]
        all_idx = self.comm.allgather_backend(idx.to(index_dtype(self.d)))
        all_vals = self.comm.allgather_backend(vals)
        with self._timed("decompress"):
            update = torch.zeros_like(accumulated)  # in the residual's dtype
            for rank_idx, rank_vals in zip(all_idx, all_vals, strict=True):  # rank order
                update.index_add_(0, rank_idx.to(torch.int64), rank_vals)
            update /= self.world_size
            self._keep_residual(accumulated, idx)
        return self._finish(update)
