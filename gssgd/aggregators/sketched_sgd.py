"""Sketched-SGD (Ivkin, Rothchild, Ullah, Braverman, Stoica, Arora; NeurIPS 2019).

The original parameter-server topology: rank 0 is the server (and also a worker).

Steps (per rank p, each step):
    1. Accumulate: ``a_p = e_p + u_p``.
    2. Compress: Count-Sketch ``a_p`` (rows x cols, hashes shared through the seed; with
       ``prefilter`` f: only this rank's ``f * k`` largest coordinates of it).
    3. Every rank sends its sketch to rank 0 (as ``table_dtype``: a 16-bit table is the mean
       over ranks, like the reference's ``transferHalf``); rank 0 sums them (in rank order,
       in float32) and takes the top ``m*k`` candidates by |estimate| (ties by lower
       index), sorted by index.
    4. Rank 0 sends the candidate indices to every rank; every rank sends back ``a_p`` at
       the candidates.
    5. Rank 0 sums the exact values, keeps the top k (ties by lower index), and sends
       (index, value) to every rank.
    6. Update: the k exact sums / P. Error feedback: every rank zeroes those k coordinates
       of ``a_p`` (each rank's contribution is in the exact sum).

The server's link carries P-1 sketches in and P-1 copies of each reply out per step: the
bottleneck gs-SGD removes.

With ``feedback="fetchsgd"`` (FetchSGD, Rothchild et al. 2020, which uses this topology) the
ranks sketch their plain gradients and keep no residual; the server keeps the momentum and
the error in sketch space (:class:`~gssgd.aggregators.feedback.SketchFeedback`), recovers the k
largest estimates and sends (index, value) to every rank: steps 4-5's candidate rounds
are not taken.
"""

from __future__ import annotations

import torch

from gssgd.aggregators.base import index_dtype
from gssgd.aggregators.sketching import SketchedOptions, SketchingAggregator
from gssgd.comm import Payload, Traffic, star_broadcast, star_gather
from gssgd.selection import topk_indices
from gssgd.sketch import CountSketch

__all__ = ["SketchedSGD"]


class SketchedSGD(SketchingAggregator):
    """Sketched-SGD with a star (parameter-server) topology through rank 0."""

    name = "sketched"
    Options = SketchedOptions
    options: SketchedOptions

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: SketchedOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """Four star phases through rank 0: sketches in, candidate indices out, candidate
        values in, the final (index, value) list out as two messages (the step's k and
        sketch shape)."""
        p, i, v = world_size, index_dtype(d).itemsize, 4
        k_t = cls.k_at_step(d, k, options, step)
        cols, c = options.shape_at(d, k, k_t)
        k, table = k_t, options.rows * cols * options.table_dtype.itemsize
        final = star_broadcast(k * (i + v), p, tensors=2)
        if options.feedback == "fetchsgd":  # tables in, (index, value) out
            return cls.control_traffic(p) + star_gather(table, p) + final
        return (
            cls.control_traffic(p)
            + star_gather(table, p)
            + star_broadcast(c * i, p)
            + star_gather(c * v, p)
            + final
        )

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        if self._sends_dense_now():  # a warm-up step that would cost more than dense
            return self._dense_warmup_step(grad)
        skipped = self._begin(grad)
        if skipped is not None:
            return skipped
        is_server = self.rank == 0
        k = self.step_k  # k, or more during a density warm-up
        with self._timed("compress"):
            accumulated = self._error_compensated(grad)
            sketch, num_candidates = self._sketch_of_step(accumulated)
            sketch.accumulate(self._prefiltered(accumulated, k))

        tables = self.comm.gather_to_root([self._table_payload(sketch.table)])
        if self.feedback.tables is not None:  # FetchSGD: recover through the error tables
            return self._fetch_step(sketch, tables, accumulated, k)
        candidates = torch.empty(num_candidates, dtype=index_dtype(self.d), device=grad.device)
        if is_server:
            with self._timed("decompress"):
                summed = self._summed_sketch(sketch, tables)
                found = summed.heavy_hitters(num_candidates, ordered=False)[0]
                candidates = found.sort().values.to(candidates.dtype)  # canonical order
        (candidates,) = self.comm.broadcast_from_root([candidates])

        cand64 = candidates.to(torch.int64)
        values = self.comm.gather_to_root([accumulated[cand64]])
        final = [
            torch.empty(k, dtype=candidates.dtype, device=grad.device),
            torch.empty(k, dtype=accumulated.dtype, device=grad.device),
        ]
        if is_server:
            with self._timed("decompress"):
                exact = values[0][0].clone()
                for (v,) in values[1:]:
                    exact += v
                keep = topk_indices(exact.abs(), k)
                final = [candidates[keep], exact[keep]]
        final_idx, final_vals = self.comm.broadcast_from_root(final)

        with self._timed("decompress"):
            final_idx = final_idx.to(torch.int64)
            update = torch.zeros_like(accumulated)  # in the residual's dtype
            update[final_idx] = final_vals / self.world_size
            self.feedback.keep(accumulated, final_idx)
        return self._finish(update)

    def _summed_sketch(self, sketch: CountSketch, tables: list[Payload]) -> CountSketch:
        """The server's sum of the gathered tables (its own first), in rank order, in the
        sketch's dtype (16-bit tables are summed as float32 means, then times P)."""
        dtype = sketch.table.dtype
        total = tables[0][0].to(dtype)
        for (table,) in tables[1:]:
            total = total + table.to(dtype)
        if tables[0][0].dtype != dtype:  # 16-bit means
            total.mul_(self.world_size)
        return sketch.with_table(total)

    def _fetch_step(self, sketch: CountSketch, tables: list[Payload] | None,
                    accumulated: torch.Tensor, k: int) -> torch.Tensor:
        """FetchSGD's server step: sum the tables in rank order, recover from the error
        sketch (:class:`~gssgd.aggregators.feedback.SketchFeedback`, on rank 0
        only), and send the k (index, value) pairs to every rank."""
        device = accumulated.device
        final = [
            torch.empty(k, dtype=index_dtype(self.d), device=device),
            torch.empty(k, dtype=accumulated.dtype, device=device),
        ]
        if self.rank == 0:
            with self._timed("decompress"):
                summed = self._summed_sketch(sketch, tables)
                error_tables = self.feedback.tables
                assert error_tables is not None
                chosen, values = error_tables.recover(summed, k)
                final = [chosen.to(final[0].dtype), values]
        final_idx, final_vals = self.comm.broadcast_from_root(final)
        with self._timed("decompress"):
            update = torch.zeros_like(accumulated)
            update[final_idx.to(torch.int64)] = final_vals / self.world_size
        return self._finish(update)
