"""gs-SGD: global-sketching SGD (Dai, Diao, Li, Xu; arXiv 2108.06004).

No parameter server: since a Count Sketch is linear, summing the workers' sketch tables with
an all-reduce yields the sketch of the global accumulated gradient on every rank.

Steps (per rank p, each step):
    1. Accumulate: ``a_p = e_p + u_p``.
    2. Compress: Count-Sketch ``a_p`` with hashes every rank derives from the same seed.
    3. Communicate: all-reduce the tables (recursive doubling: log2(P) rounds of rows*cols
       numbers and no indices; or the backend's ring all-reduce).
    4. Recover: every rank takes the same top ``m*k`` candidates by |estimate| from the
       summed sketch (ties by lower index).
    5. Exact round (``exact=True``): all-reduce ``a_p`` at the candidates (m*k numbers, no
       indices: every rank knows them), keep the top k of the exact sums. Estimate mode
       (``exact=False``): keep the sketch's top k and their estimates (one round).
    6. Update: the k values / P. Error feedback: ``e_p = a_p`` with those k coordinates
       zeroed on every rank.

Communication per rank is ``O((rows*cols + m*k) * log P)``, independent of ``d``.

Tuning: ``cols`` sets the recovery noise (about ``||a|| / sqrt(cols)``); ``candidates`` m
lets the exact round repair the sketch's mistakes at the price of m*k numbers per round.
``last_stats.delivered_fraction`` reports the share of the accumulated mass (squared l2,
from the sketch's norm estimate) that each step delivered.
"""

from __future__ import annotations

import torch

from gssgd._select import topk_indices
from gssgd.aggregators.base import Aggregator
from gssgd.aggregators.options import GSOptions
from gssgd.sketch import CountSketch

__all__ = ["GlobalSketchSGD"]


class GlobalSketchSGD(Aggregator):
    """gs-SGD: all-reduced Count Sketches, shared heavy-hitter recovery, exact top-k."""

    name = "gs"
    Options = GSOptions
    options: GSOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.sketch = CountSketch(
            self.d, rows=o.rows, cols=o.cols, seed=o.seed, cache_hashes=o.use_hash_cache(self.d)
        )
        self.num_candidates = min(o.candidates * self.k, self.d)

    def _allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.options.allreduce == "backend":
            return self.comm.allreduce_backend(tensor.clone())
        return self.comm.allreduce_recursive_doubling(tensor)

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        skipped = self._begin(grad)
        if skipped is not None:
            return skipped
        with self._timed("compress"):
            accumulated = self._error_compensated(grad)
            self.sketch = self.sketch.to(grad.device, grad.dtype).zero_()
            self.sketch.accumulate(accumulated)

        summed = self.sketch.copy()
        summed.table = self._allreduce(self.sketch.table)

        if self.options.exact:
            with self._timed("decompress"):
                candidates = summed.heavy_hitters(self.num_candidates)[0]
            exact = self._allreduce(accumulated[candidates])
            with self._timed("decompress"):
                keep = topk_indices(exact.abs(), self.k)
                chosen, values = candidates[keep], exact[keep]
        else:
            with self._timed("decompress"):
                chosen, values = summed.heavy_hitters(self.k)

        with self._timed("decompress"):
            update = torch.zeros_like(grad)
            update[chosen] = values / self.world_size
            self._keep_residual(accumulated, chosen)
            total = summed.l2_estimate() ** 2
            delivered = float(values.double().pow(2).sum()) / total if total > 0 else 1.0
        return self._finish(update, delivered_fraction=delivered)
