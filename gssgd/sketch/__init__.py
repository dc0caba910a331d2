"""Count Sketch: a linear summary of a long vector, whose table is a plain tensor.

A Count Sketch (Charikar, Chen, Farach-Colton 2002) of a vector ``x`` of length ``d`` is a
``rows x cols`` table. Row ``r`` owns two hash functions: a bucket ``h_r(i)`` in
``[0, cols)`` and a sign ``s_r(i)`` in ``{-1, +1}``. Sketching adds ``s_r(i) * x[i]`` to
``table[r, h_r(i)]`` for every coordinate and row. Querying coordinate ``i`` reads
``s_r(i) * table[r, h_r(i)]`` in every row and takes the median, which is an unbiased-ish
estimate of ``x[i]`` with error about ``||x||_2 / sqrt(cols)``.

The sketch is **linear**: ``sketch(x) + sketch(y) == sketch(x + y)`` when both use the same
hashes. gs-SGD relies on this: every worker sketches its own gradient with hashes derived
from one shared seed, and an all-reduce of the tables is the sketch of the global gradient.

Hashes are never drawn from the global RNG and are never stored by default. They are
computed on the fly, in chunks, from the seed with a multiply-add-shift hash
(Dietzfelbinger 1996): ``bucket = ((a_r * i + b_r) mod 2^64) >> 32 scaled to [0, cols)``,
``sign = top bit of (c_r * i + e_r) mod 2^64``. The 64-bit multipliers come from a
SplitMix64 stream of the seed, so every process computes identical hashes on CPU and CUDA.
Sketching a 100M-element vector therefore needs only a chunk of hash work space beyond the
vector; ``cache_hashes=True`` trades ``hash_cache_bytes(d, rows)`` bytes of memory for speed.
The cached tables live in a :class:`HashCache` that its owner creates and passes: every
sketch given the same cache shares the tables of its shape (an aggregator shares one among
its sketches; a benchmark running several aggregators of one shape passes one to all).
Nothing is kept in module state.

Modules, from the bottom up:

* :mod:`gssgd.sketch.count_sketch`: the hashes and the :class:`HashCache` that keeps them;
  :class:`CountSketch`, the table, its queries (the median of the rows) and the recovery of
  the ``k`` heaviest coordinates.
* :mod:`gssgd.sketch.partitioned`: a sketch whose table is cut into one region per piece
  of the vector (streaming gs).

Example:
    >>> import torch, gssgd
    >>> x = torch.zeros(10_000); x[[3, 77]] = torch.tensor([5.0, -4.0])
    >>> sk = gssgd.CountSketch(10_000, rows=5, cols=128, seed=0)
    >>> sk.accumulate(x)
    >>> sk.heavy_hitters(2)[0].tolist()
    [3, 77]
"""

from __future__ import annotations

from gssgd.sketch.count_sketch import (
    CountSketch,
    HashCache,
    hash_cache_bytes,
    median_of_rows,
    sketch_hash_params,
)

__all__ = ["CountSketch", "HashCache", "hash_cache_bytes", "median_of_rows", "sketch_hash_params"]

# The class's public home (what pickles and the API reference name).
CountSketch.__module__ = __name__
