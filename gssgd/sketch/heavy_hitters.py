"""Recovery: the ``k`` heaviest coordinates of a Count Sketch, without estimating all ``d``.

:class:`HeavyHitters` is the recovery half of :class:`~gssgd.sketch.CountSketch` (which
inherits it): :meth:`HeavyHitters.heavy_hitters` screens the coordinates against a
threshold sampled from the table and estimates only the survivors; a one-row sketch with
cached hashes walks its buckets instead (:meth:`HeavyHitters._heavy_hitters_one_row`).
Every route gives the same set as ranking all ``d`` estimates, ties to the lower index.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from gssgd import kernels
from gssgd._select import topk_indices
from gssgd.sketch.checks import check_int
from gssgd.sketch.estimates import nonfinite_as_largest

if TYPE_CHECKING:
    from gssgd.sketch.hashing import _HashIndex

__all__ = ["HeavyHitters"]


class HeavyHitters:
    """Heavy-hitter recovery over a sketch's table and hashes (a mixin of CountSketch)."""

    if TYPE_CHECKING:  # what the sketch provides (gssgd.sketch.count_sketch.CountSketch)
        d: int
        rows: int
        cols: int
        table: torch.Tensor
        _params: list[tuple[int, int, int, int]]
        _index: _HashIndex | None
        _cache: torch.Tensor | None
        _cache32: torch.Tensor | None
        _occupancy: torch.Tensor | None
        _by_bucket: torch.Tensor | None

        @property
        def device(self) -> torch.device: ...
        def query(self, indices: torch.Tensor | None = None) -> torch.Tensor: ...
        def _signed_buckets(self, idx: torch.Tensor) -> torch.Tensor: ...
        def _doubled(self) -> torch.Tensor: ...
        def _estimates(self, buckets: torch.Tensor, doubled: torch.Tensor) -> torch.Tensor: ...
        def _chunks(
            self, indices: torch.Tensor | None, for_gather: bool = False
        ) -> Iterator[tuple[slice, torch.Tensor]]: ...

    def heavy_hitters(self, k: int, ordered: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` coordinates with the largest ``|estimate|``.

        Ties are broken by the lower index, so every process holding the same table selects
        the same set. The result equals ranking all ``d`` estimates, but is found without
        estimating every coordinate (unless the table holds NaN or Inf, below):

        1. Estimate a strided sample of the coordinates and take a threshold ``tau`` a
           little below where the k-th largest ``|estimate|`` should lie.
        2. A coordinate whose median estimate reaches ``tau`` has a bucket with
           ``|value| >= tau`` in a majority of rows. Keep the coordinates that do (one byte
           gather per row; no medians).
        3. Estimate only the survivors. If at least k of them reach ``tau``, their top k is
           exactly the top k of all d; otherwise fall back to estimating everything.

        A table with NaN or ±Inf buckets (a float16 table that overflowed on the wire, where
        ``+inf + -inf`` is NaN) is ranked by estimating all ``d`` coordinates, and a
        non-finite ``|estimate|`` counts as the largest: such coordinates come first, ties
        among them (and among all equal values) to the lower index, so every rank holding the
        same table selects the same set, whatever its NaNs' bits. Overflow means huge values,
        so these are the heaviest coordinates; their returned estimates are the non-finite
        values themselves (gs-SGD's exact round replaces them with exact sums).

        Args:
            k: how many coordinates, ``1 <= k <= d``.
            ordered: sort the result; False returns the same set in an unspecified order.

        Returns:
            ``(indices, estimates)``: int64 indices ordered by decreasing ``|estimate|`` (ties:
            lower index first) and their estimates.

        Raises:
            ValueError: ``k`` is out of range.
        """
        check_int("k", k, 1, self.d, "the number of heavy coordinates to recover")
        if not bool(torch.isfinite(self.table).all()):
            return self._rank_all(k, ordered, nonfinite_first=True)
        # Sample every stride-th coordinate, sparsely enough to be cheap yet holding a few
        # dozen of the k heaviest; with k above d/16 screening cannot pay, estimate all.
        stride = min(16, self.d // (8 * k))
        if self.d < 1024 or stride < 2:
            return self._rank_all(k, ordered)
        fused = kernels.use_kernels(self.table)  # screening and queries in Triton kernels
        if self._by_bucket is not None and not fused:
            return self._heavy_hitters_one_row(k, ordered)
        tau = self._sample_threshold(k, stride, fused)
        cand, est = self._screen(tau, fused)
        est_abs = est.abs()
        if int((est_abs >= tau).sum()) < k:  # too few survivors reach tau: rank all d
            return self._rank_all(k, ordered)
        keep = topk_indices(est_abs, k, ordered)
        return cand[keep], est[keep]

    def _rank_all(
        self, k: int, ordered: bool, nonfinite_first: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``heavy_hitters`` by estimating all ``d`` coordinates and ranking them.

        ``nonfinite_first``: a NaN or infinite ``|estimate|`` ranks as the largest (ties
        among them to the lower index), for tables holding non-finite buckets.
        """
        est = self.query()
        score = est.abs()
        if nonfinite_first:
            score = nonfinite_as_largest(score)
        idx = topk_indices(score, k, ordered)
        return idx, est[idx]

    def _sample_threshold(self, k: int, stride: int, fused: bool) -> torch.Tensor:
        """Step 1 of ``heavy_hitters``: ``tau``, a little below the k-th largest
        ``|estimate|`` as seen in the estimates of every ``stride``-th coordinate (a 0-d
        tensor in the table's dtype)."""
        if fused:  # in range by construction: no index check (it would sync the GPU)
            sample = torch.arange(0, self.d, stride, device=self.device)
            sample_abs = kernels.query(self.table, self._params, self.d, sample).abs()
        else:
            if self._cache is not None:  # a strided view of the cache: no gather, no hashing
                cached = self._cache if self._cache32 is None else self._cache32
                sample_buckets = cached[:, ::stride]
            else:
                sample_buckets = self._signed_buckets(
                    torch.arange(0, self.d, stride, device=self.device)
                )
            sample_abs = self._estimates(sample_buckets, self._doubled()).abs()
        want = min(sample_abs.numel(), 2 * -(-k // stride) + 16)
        return torch.topk(sample_abs, want, sorted=False).values.min()

    def _screen(self, tau: torch.Tensor, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 2 and 3 of ``heavy_hitters``: the coordinates with a bucket of
        ``|value| >= tau`` in a majority of rows (ascending) and their estimates."""
        majority = (self.rows + 1) // 2
        if fused:  # candidates lie in [0, d) by construction: queried without a check
            cand = kernels.candidates(self.table, self._params, self.d, tau, majority)
            return cand, kernels.query(self.table, self._params, self.d, cand)
        cand = self._screen_torch(tau, majority)
        return cand, self.query(cand) if cand.numel() else cand.to(self.table.dtype)

    def _screen_torch(self, tau: torch.Tensor, majority: int) -> torch.Tensor:
        """The screening of :meth:`_screen` on the torch path: per chunk of coordinates,
        count the rows whose bucket reaches ``tau`` (one byte gather per row, no medians)."""
        heavy = torch.cat([self.table.abs() >= tau] * 2, dim=1).to(torch.uint8)
        survivors = []
        for part, buckets in self._chunks(None, for_gather=True):
            votes = heavy[0].index_select(0, buckets[0])
            for r in range(1, self.rows):
                votes += heavy[r].index_select(0, buckets[r])
            survivors.append(torch.nonzero(votes >= majority).flatten() + part.start)
        return torch.cat(survivors)

    def _heavy_hitters_one_row(self, k: int, ordered: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``heavy_hitters`` of a one-row sketch with cached hashes, in O(cols + candidates).

        With one row a coordinate's estimate is its bucket's signed value, so the top k are
        found from the buckets alone:

        1. Walk the buckets by decreasing ``|value|`` until they hold ``k`` coordinates
           (bucket occupancy is known): that bucket's ``|value|`` is the exact threshold
           ``tau`` of the k-th largest ``|estimate|``.
        2. Take every coordinate of the buckets with ``|value| > tau`` and, from the
           buckets at exactly ``tau``, the lowest coordinates up to k (ties go to the lower
           index, as ranking all d would), read from an index of the coordinates sorted by
           bucket (built with the hash cache): no pass over all ``d`` coordinates.
        3. With ``ordered``, sort them by decreasing ``|estimate|`` (ties: lower index).
        """
        cols = self.cols
        size = self.table[0].abs()
        guess = min(cols, 2 * -(-k * cols // self.d) + 16)  # buckets to hold k coordinates
        while True:
            order = torch.topk(size, guess).indices
            held = torch.cumsum(self._occupancy[order], 0)
            if int(held[-1]) >= k or guess == cols:
                break
            guess = min(cols, 4 * guess)
        tau = size[order[int(torch.searchsorted(held, k))]]
        # Buckets above tau are taken whole; of those exactly at tau (one, unless values
        # tie), the lowest coordinates fill up to k, as ranking all d would pick them.
        above = self._coords_of_buckets(torch.nonzero(size > tau).flatten())
        at_tau = self._coords_of_buckets(torch.nonzero(size == tau).flatten())
        at_tau = torch.sort(at_tau).values[: k - above.numel()]
        chosen = torch.cat([above, at_tau])
        if ordered:  # by decreasing |estimate|, ties to the lower index
            chosen = torch.sort(chosen).values
            est = self.query(chosen)
            keep = topk_indices(est.abs(), k, ordered=True)
            return chosen[keep], est[keep]
        return chosen, self.query(chosen)

    def _coords_of_buckets(self, buckets: torch.Tensor) -> torch.Tensor:
        """The coordinates hashed (in row 0) to ``buckets``, bucket after bucket."""
        counts = self._occupancy[buckets]
        starts = self._index.bucket_starts[buckets]  # where each bucket's group begins
        shift = torch.repeat_interleave(starts - (torch.cumsum(counts, 0) - counts), counts)
        return self._by_bucket[torch.arange(shift.numel(), device=self.device) + shift]
