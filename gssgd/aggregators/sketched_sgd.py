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

The ranks' non-finite flags ride along: one more value after each sketch (step 3), and the
server's first reply carries every rank's as bits after its indices, so when a gradient is
not finite on any rank every rank skips the step (its ``nonfinite`` policy) from there.

With ``feedback="fetchsgd"`` (FetchSGD, Rothchild et al. 2020, which uses this topology) the
ranks sketch their plain gradients and keep no residual; the server keeps the momentum and
the error in sketch space (:class:`~gssgd.aggregators.feedback.SketchFeedback`), recovers the k
largest estimates and sends (index, value) to every rank: steps 4-5's candidate rounds
are not taken.
"""

from __future__ import annotations

import torch

from gssgd.aggregators.base import flag_mask_words, index_dtype
from gssgd.aggregators.sketching import SketchedOptions, SketchingAggregator
from gssgd.comm import Payload, Traffic, star_broadcast, star_gather
from gssgd.selection import topk_indices
from gssgd.sketch import CountSketch

__all__ = ["SketchedSGD"]


class SketchedSGD(SketchingAggregator):
    """Sketched-SGD with a star (parameter-server) topology through rank 0."""

    name = "sketched"
    flags_ride = True
    Options = SketchedOptions
    options: SketchedOptions

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: SketchedOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """Four star phases through rank 0: sketches in (each with its rank's non-finite
        flag), candidate indices out (with every rank's flag as bits:
        :func:`flag_mask_words`), candidate values in, the final (index, value) list out as
        two messages (the step's k and sketch shape)."""
        p, i, v = world_size, index_dtype(d).itemsize, 4
        k_t = cls.k_at_step(d, k, options, step)
        cols, c = options.shape_at(d, k, k_t)
        k, item = k_t, options.table_dtype.itemsize
        sketches = star_gather((options.rows * cols + 1) * item, p)
        flags = flag_mask_words(p, i) * i
        if options.feedback == "fetchsgd":  # tables in, (index, value) out
            return sketches + star_broadcast(k * (i + v) + flags, p, tensors=2)
        return (
            sketches
            + star_broadcast(c * i + flags, p)
            + star_gather(c * v, p)
            + star_broadcast(k * (i + v), p, tensors=2)
        )

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        if self._sends_dense_now():  # a warm-up step that would cost more than dense
            return self._dense_warmup_step(grad)
        accumulated, bad = self._begin_riding(grad)
        is_server = self.rank == 0
        k = self.step_k  # k, or more during a density warm-up
        with self._timed("compress"):
            sketch, num_candidates = self._sketch_of_step(accumulated)
            sketch.accumulate(self._prefiltered(accumulated, k))
            table = self._table_payload(sketch.table)
            message = torch.cat([table.reshape(-1), table.new_tensor([int(bad)])])

        gathered = self.comm.gather_to_root([message])  # the last value: the rank's flag
        tables, bad_ranks = self._received(gathered, table)
        if self.feedback.tables is not None:  # FetchSGD: recover through the error tables
            return self._fetch_step(sketch, tables, bad_ranks, accumulated, grad, k)
        candidates = torch.zeros(num_candidates, dtype=index_dtype(self.d), device=grad.device)
        if is_server and not bad_ranks:
            with self._timed("decompress"):
                summed = self._summed_sketch(sketch, tables)
                found = summed.heavy_hitters(num_candidates, ordered=False)[0]
                candidates = found.sort().values.to(candidates.dtype)  # canonical order
        (candidates,), skipped = self._reply_with_flags([candidates], bad_ranks, grad)
        if skipped is not None:
            return skipped

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

    def _received(self, gathered: list[Payload] | None, table: torch.Tensor
                  ) -> tuple[list[Payload] | None, list[int]]:
        """The server's view of the gathered messages: each rank's table (shaped like
        ``table``) and the ranks whose flag was set; ``(None, [])`` on the other ranks."""
        if gathered is None:
            return None, []
        messages = [message for (message,) in gathered]
        tables = [[message[:-1].view_as(table)] for message in messages]
        return tables, self._flags_in_lists(messages)

    def _reply_with_flags(self, reply: list[torch.Tensor], bad_ranks: list[int],
                          grad: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Broadcast the server's first reply (``reply``, indices first), the indices
        followed by every rank's flag (``bad_ranks``, known to the server) as bits; return
        the reply and, when a flag is set, the skipped step's update (:meth:`_guard`, on
        every rank alike)."""
        indices, *rest = reply
        mask = self._flag_mask(bad_ranks, indices.dtype, indices.device)
        packed, *rest = self.comm.broadcast_from_root([torch.cat([indices, mask]), *rest])
        words = mask.numel()
        return [packed[:-words], *rest], self._guard(grad, self._ranks_in_mask(packed[-words:]))

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
                    bad_ranks: list[int], accumulated: torch.Tensor, grad: torch.Tensor,
                    k: int) -> torch.Tensor:
        """FetchSGD's server step: sum the tables in rank order, recover from the error
        sketch (:class:`~gssgd.aggregators.feedback.SketchFeedback`, on rank 0
        only), and send the k (index, value) pairs to every rank, the indices followed by
        the ranks' flags (a step some rank skips leaves the error sketch untouched)."""
        device = accumulated.device
        final_idx = torch.zeros(k, dtype=index_dtype(self.d), device=device)
        final_vals = torch.zeros(k, dtype=accumulated.dtype, device=device)
        if self.rank == 0 and not bad_ranks:
            with self._timed("decompress"):
                summed = self._summed_sketch(sketch, tables)
                error_tables = self.feedback.tables
                assert error_tables is not None
                chosen, final_vals = error_tables.recover(summed, k)
                final_idx = chosen.to(final_idx.dtype)
        (final_idx, final_vals), skipped = self._reply_with_flags(
            [final_idx, final_vals], bad_ranks, grad)
        if skipped is not None:
            return skipped
        with self._timed("decompress"):
            update = torch.zeros_like(accumulated)
            update[final_idx.to(torch.int64)] = final_vals / self.world_size
        return self._finish(update)
