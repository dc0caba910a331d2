"""Single-process references of every aggregator's math, written independently of gssgd
(plain numpy and Python integers), for the distributed tests to compare with.

The Count Sketch here does not use :class:`gssgd.CountSketch`: its hashes are computed from
the scheme gssgd documents (``gssgd/sketch/``), reimplemented below, so a hashing bug in
gssgd shows up as a mismatch instead of cancelling out.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------------------- hashing
def splitmix64(seed: int):
    """The SplitMix64 stream gssgd draws its hash constants from (an infinite generator).

    The state starts at ``seed * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019 (mod 2^64)``; each
    output is the SplitMix64 finaliser (Steele, Lea, Flood 2014) of the state advanced by
    the golden-ratio increment.
    """
    state = (seed * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        yield z ^ (z >> 31)


def hash_constants(seed: int, rows: int) -> list[tuple[int, int, int, int]]:
    """Per row, the unsigned 64-bit ``(a, b, c, e)``: four stream outputs, a and c made odd."""
    stream = splitmix64(seed)
    out = []
    for _ in range(rows):
        a, b, c, e = (next(stream) for _ in range(4))
        out.append((a | 1, b, c | 1, e))
    return out


def bucket_and_sign(i: int, seed: int, rows: int, cols: int) -> list[tuple[int, int]]:
    """``(h_r(i), s_r(i))`` of one coordinate for every row, in plain Python integers:
    ``h = (((a*i + b) mod 2^64) >> 32) * cols >> 32``, ``s = -1`` iff the top bit of
    ``(c*i + e) mod 2^64`` is set."""
    out = []
    for a, b, c, e in hash_constants(seed, rows):
        top32 = ((a * i + b) & MASK64) >> 32
        negative = ((c * i + e) & MASK64) >> 63
        out.append(((top32 * cols) >> 32, -1 if negative else 1))
    return out


@cache
def buckets_and_signs(d: int, seed: int, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """The same for coordinates ``0..d-1`` with numpy uint64 (which wraps mod 2^64):
    int64 buckets and float64 signs, each of shape (rows, d). Read-only (cached)."""
    assert cols < 1 << 32
    i = np.arange(d, dtype=np.uint64)
    buckets = np.empty((rows, d), dtype=np.int64)
    signs = np.empty((rows, d), dtype=np.float64)
    with np.errstate(over="ignore"):
        for r, (a, b, c, e) in enumerate(hash_constants(seed, rows)):
            top32 = (i * np.uint64(a) + np.uint64(b)) >> np.uint64(32)
            buckets[r] = ((top32 * np.uint64(cols)) >> np.uint64(32)).astype(np.int64)
            negative = (i * np.uint64(c) + np.uint64(e)) >> np.uint64(63)
            signs[r] = np.where(negative == 1, -1.0, 1.0)
    buckets.flags.writeable = signs.flags.writeable = False
    return buckets, signs


class RefSketch:
    """A float64 Count Sketch of length-d vectors with the hashes above."""

    def __init__(self, d: int, rows: int, cols: int, seed: int) -> None:
        self.d, self.rows, self.cols = d, rows, cols
        self.buckets, self.signs = buckets_and_signs(d, seed, rows, cols)
        self.table = np.zeros((rows, cols))

    def accumulate(self, x: np.ndarray) -> None:
        for r in range(self.rows):
            self.table[r] += np.bincount(
                self.buckets[r], weights=self.signs[r] * x, minlength=self.cols
            )

    def query(self) -> np.ndarray:
        """Median over rows of ``s_r(i) * table[r, h_r(i)]`` for every coordinate."""
        per_row = np.stack(
            [self.signs[r] * self.table[r, self.buckets[r]] for r in range(self.rows)]
        )
        return np.median(per_row, axis=0)  # rows is odd: the middle value itself

    def heavy_hitters(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The n coordinates of largest |estimate| (ties: lower index), by ranking all d."""
        est = self.query()
        idx = ref_topk(np.abs(est), n)
        return idx, est[idx]


# ---------------------------------------------------------------------------- defaults
def default_sketch(d: int, k: int, world_size: int = 1) -> dict:
    """The sketch shape gssgd ships as its default, from its documentation (docs/sizing.md,
    ``SketchedOptions``), restated here.

    At every P: one row, the ranks sketching only their own ``8 k`` largest coordinates
    (both methods: one rule sizes both), float16 tables on the wire (and, for gs, the
    backend's all-reduce). Below 16 workers ``40 k`` columns and ``m = 32`` candidates per
    selected coordinate, from 16 on ``16 k`` and ``m = 8``; columns capped at
    ``max(256, d / 4)``, candidates so that ``m k <= d / 8``."""
    per_k, m = (40, 32) if world_size < 16 else (16, 8)
    return {
        "rows": 1,
        "cols": max(1, min(per_k * k, max(256, d // 4))),
        "candidates": max(1, min(m, d // (8 * k))),
        "prefilter": 8,
        "table16": True,
    }


def _summed_table(tables: list[np.ndarray], wire16: bool, server: bool = False) -> np.ndarray:
    """The sum of the ranks' tables: exact (float64), or as a float16 wire carries it: each
    table scaled by 1/P and rounded to float16, summed in float16 in the order of gloo's
    ring all-reduce (:func:`_ring_sum`, the simulated world's order; the ranks' ``P``
    non-finite flags, all 0 here, ride after the table and so move the ring's cuts), widened
    and scaled back by P; ``server`` (Sketched-SGD): the float16 tables widened to float32
    and summed there, in rank order."""
    if not wire16:
        return sum(tables)
    world = len(tables)
    wire = [(t.astype(np.float32) / np.float32(world)).astype(np.float16) for t in tables]
    if server:
        acc = wire[0].astype(np.float32)
        for m in wire[1:]:
            acc = acc + m.astype(np.float32)
        return acc * np.float32(world)
    flags = np.zeros(world, dtype=np.float16)
    summed = _ring_sum([np.concatenate([w.reshape(-1), flags]) for w in wire])
    return summed[: tables[0].size].reshape(tables[0].shape).astype(np.float32) * np.float32(world)


def _ring_sum(parts: list[np.ndarray]) -> np.ndarray:
    """Sum the ranks' arrays element by element in gloo's ring order (restated from gloo's
    ``allreduce.cc``): the flat array is cut into S segments, S the least multiple of P that
    is >= max(ceil(bytes / 1 MiB), 2P), of ceil(bytes / S) bytes rounded up to whole
    elements; chunk c (S / P segments) is summed starting at rank c - 1, then c - 2, ...
    down to rank c (mod P), one add in the arrays' dtype at a time."""
    def up(a: int, b: int) -> int:  # ceil(a / b)
        return (a + b - 1) // b

    world, flat = len(parts), [x.reshape(-1) for x in parts]
    n, size = flat[0].size, flat[0].itemsize
    segments = up(max(up(n * size, 1 << 20), 2 * world), world) * world
    chunk = up(up(n * size, segments), size) * (segments // world)
    out = np.empty_like(flat[0])
    for c in range(world):
        lo, hi = c * chunk, min(n, (c + 1) * chunk)
        acc = flat[(c - 1) % world][lo:hi].copy()
        for step in range(1, world):
            acc = (acc + flat[(c - 1 - step) % world][lo:hi]).astype(acc.dtype)
        out[lo:hi] = acc
    return out.reshape(parts[0].shape)


# ---------------------------------------------------------------------------- selection
def ref_topk(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, ties by lower index (by a lexicographic sort)."""
    order = np.lexsort((np.arange(values.size), -values))
    return order[:k]


def ref_shares(total: int, sizes: list[int]) -> list[int]:
    """Largest-remainder shares of ``total`` in proportion to ``sizes``; ties to the lower
    group (exact fractions)."""
    from fractions import Fraction

    exact = [Fraction(total * n, sum(sizes)) for n in sizes]
    quotas = [int(x) for x in exact]  # floor: the shares are >= 0
    by_remainder = sorted(range(len(sizes)), key=lambda c: (-(exact[c] - quotas[c]), c))
    for c in by_remainder[: total - sum(quotas)]:
        quotas[c] += 1
    return quotas


def ref_chunked_topk(values: np.ndarray, coords: np.ndarray, chunk: int, total: int,
                     d: int) -> np.ndarray:
    """Positions of each chunk's share of the ``total`` largest ``values`` (``coords``: the
    coordinate of each value; a chunk's share in proportion to how many of ``coords`` it
    holds), chunk by chunk with :func:`ref_topk`, sorted."""
    members = [np.flatnonzero(coords // chunk == c) for c in range(-(-d // chunk))]
    chosen = []
    for inside, quota in zip(members, ref_shares(total, [m.size for m in members]),
                             strict=True):
        if quota:
            chosen.extend(inside[ref_topk(values[inside], quota)])
    return np.sort(np.array(chosen, dtype=np.int64))


def _merge(a: dict, b: dict, k: int) -> dict:
    """gTop-k merge of {index: (value, contributors)} lists (values keep their dtype)."""
    out: dict[int, tuple] = {}
    for lst in (a, b):
        for i, (v, who) in lst.items():
            if i in out:
                out[i] = (out[i][0] + v, out[i][1] | who)
            else:
                out[i] = (v, who)
    keys = np.array(sorted(out))
    vals = np.array([abs(out[i][0]) for i in keys])
    keep = keys[ref_topk(vals, min(k, keys.size))]
    return {int(i): out[int(i)] for i in keep}


# ---------------------------------------------------------------------------- the methods
def reference_run(
    method: str, grads: list[list[torch.Tensor]], k: int, opts: dict, dtype=np.float64
):
    """Replay ``method`` on grads[t][p] in one process.

    ``dtype``: the arithmetic of the error feedback, momentum and gTop-k merges. float32
    repeats gssgd's roundings where its order of operations is fixed by the algorithm (gTop-k:
    pairwise sums in the recursive-doubling order), so those results can be compared
    bitwise; float64 is the exact math, for comparisons with a tolerance.

    ``opts["feedback"] == "ef21"``: EF21(-SGDM) as its paper states it, per rank ``v = rho*v
    + g`` and the estimate ``g_p``; the method compresses ``v - g_p`` (a sum over ranks
    for the global selections); ``g_p += ``what rank p delivered; the update is the
    ranks' mean estimate.

    ``opts["feedback"] == "global"``: classic error feedback, then a velocity ``M`` kept on
    the averaged update: zeroed where the update is nonzero, ``M = rho*M + update``; the
    step returns ``M``.

    ``opts["feedback"] == "onebit"``: 1-bit Adam's compression stage: rank p compresses
    ``e_p + rho*m + (1-rho)*g_p`` with ``m`` the last averaged update, shared.

    ``opts["reuse"]`` R (gs; no warm-up): steps t with t % R != 0 skip the sketch and take
    the top k of the exact sums at the last sketched step's candidates.

    ``opts["feedback"] == "fetchsgd"`` (sketched, gs): FetchSGD as its authors' code runs
    it: the summed sketch ``S`` of the gradients, ``S_u = rho*S_u + S``, ``S_e += S_u``,
    deliver the sketch's top k of ``S_e`` (estimates), then ``S_e = 0`` and ``S_u = 0``
    wherever ``S(delta)`` is nonzero (the paper's ``S_e -= S(delta)`` diverges, as the
    authors' code notes); no residual on the ranks (returned as zeros).

    Returns:
        (updates per step as arrays, final residual per rank as arrays), in ``dtype``; under
        EF21 the "residual" is ``v - g_p``, what rank p has not yet delivered.
    """
    steps, world = len(grads), len(grads[0])
    d = grads[0][0].numel()
    rho = dtype(opts.get("momentum", 0.0))
    feedback = opts.get("feedback", "ef")
    ef21 = feedback == "ef21"
    velocity = np.zeros(d, dtype)  # feedback="global": M; "onebit": m
    if feedback == "fetchsgd":
        sketch_u = np.zeros((opts["rows"], opts["cols"]))
        sketch_e = np.zeros((opts["rows"], opts["cols"]))
    e = [np.zeros(d, dtype) for _ in range(world)]
    u = [np.zeros(d, dtype) for _ in range(world)]
    estimate = [np.zeros(d, dtype) for _ in range(world)]  # EF21's g_p
    updates = []
    kept = np.array([], dtype=np.int64)  # gs's last sketched candidates (reuse)
    for t in range(steps):
        g = [grads[t][p].numpy().astype(dtype) for p in range(world)]
        if method == "dense":
            updates.append(sum(g) / world)
            continue
        if feedback == "fetchsgd":
            summed = RefSketch(d, opts["rows"], opts["cols"], opts.get("seed", 0))
            for p in range(world):
                summed.accumulate(g[p].astype(np.float64))
            sketch_u = rho * sketch_u + summed.table
            sketch_e = sketch_e + sketch_u
            summed.table = sketch_e
            chosen, values = summed.heavy_hitters(k)
            delta = np.zeros(d)
            delta[chosen] = values
            delivered_sketch = RefSketch(d, opts["rows"], opts["cols"], opts.get("seed", 0))
            delivered_sketch.accumulate(delta)
            sketch_e[delivered_sketch.table != 0] = 0
            sketch_u[delivered_sketch.table != 0] = 0
            updates.append((delta / world).astype(dtype))
            continue
        a = []
        for p in range(world):
            local = rho > 0 and feedback == "ef"
            u[p] = rho * u[p] + g[p] if local or ef21 else g[p]
            if feedback == "onebit":  # 1-bit Adam: m_p = rho*m + (1-rho)*g_p, m shared
                a.append(e[p] + rho * velocity + (1 - rho) * g[p])
                continue
            a.append(u[p] - estimate[p] if ef21 else e[p] + u[p])
        update = np.zeros(d, dtype)
        delivered: list[np.ndarray] = [np.array([], dtype=np.int64)] * world
        if method == "topk":
            for p in range(world):
                idx = ref_topk(np.abs(a[p]), k)
                update[idx] += a[p][idx]
                delivered[p] = idx
        elif method == "gtopk":
            lists = []
            for p in range(world):
                idx = ref_topk(np.abs(a[p]), k)
                lists.append({int(i): (a[p][i], frozenset([p])) for i in idx})
            power = 1 << (world.bit_length() - 1)
            for r in range(power, world):
                lists[r - power] = _merge(lists[r - power], lists[r], k)
            step = 1
            while step < power:
                for p in range(power):
                    q = p ^ step
                    if p < q:
                        lists[p] = lists[q] = _merge(lists[p], lists[q], k)
                step <<= 1
            final = lists[0]
            for i, (v, _who) in final.items():
                update[i] = v
            delivered = [
                np.array([i for i, (_, w) in final.items() if p in w], dtype=np.int64)
                for p in range(world)
            ]
        elif method == "gs" and t % opts.get("reuse", 1):  # reuse the last candidates
            exact = sum(a[p][kept] for p in range(world))
            keep = (ref_chunked_topk(np.abs(exact), kept, opts["chunk"], k, d)
                    if opts.get("chunk") else ref_topk(np.abs(exact), k))
            update[kept[keep]] = exact[keep]
            delivered = [kept[keep]] * world
        elif method in ("sketched", "gs"):
            summed = RefSketch(d, opts["rows"], opts["cols"], opts.get("seed", 0))
            f, tables = opts.get("prefilter", 0), []
            for p in range(world):  # linearity: the sketch of the sum is the sum of sketches
                part = a[p].astype(np.float64)
                if f and f * k < d:  # a local pre-filter: only this rank's f*k largest
                    keep = ref_topk(np.abs(part), f * k)
                    part = np.zeros(d)
                    part[keep] = a[p][keep]
                one = RefSketch(d, opts["rows"], opts["cols"], opts.get("seed", 0))
                one.accumulate(part)
                tables.append(one.table)
            wire16 = opts.get("table16", False) or str(opts.get("table_dtype")) == "torch.float16"
            summed.table = _summed_table(tables, wire16, server=method == "sketched")
            chunk = opts.get("chunk", 0)
            if opts.get("exact", True) and chunk:  # each chunk its share of m*k, then of k
                cand = kept = ref_chunked_topk(np.abs(summed.query()), np.arange(d), chunk,
                                               min(opts["candidates"] * k, d), d)
                exact = sum(a[p][cand] for p in range(world))
                keep = ref_chunked_topk(np.abs(exact), cand, chunk, k, d)
                chosen, values = cand[keep], exact[keep]
            elif opts.get("exact", True):
                cand, _ = summed.heavy_hitters(min(opts["candidates"] * k, d))
                cand = kept = np.sort(cand)  # canonical order: exact ties go to the lower index
                exact = sum(a[p][cand] for p in range(world))
                keep = ref_topk(np.abs(exact), k)
                chosen, values = cand[keep], exact[keep]
            else:
                chosen, values = summed.heavy_hitters(k)
            update[chosen] = values
            delivered = [chosen] * world
        else:
            raise ValueError(method)
        for p in range(world):
            if ef21:  # rank p's estimate takes what it delivered (a global choice: its part)
                estimate[p][delivered[p]] += a[p][delivered[p]]
            a[p][delivered[p]] = 0
            e[p] = a[p]
            if rho > 0 and feedback == "ef":
                u[p][delivered[p]] = 0
        if feedback == "onebit":
            velocity = update / world
        if feedback == "global":
            velocity[update != 0] = 0
            velocity = rho * velocity + update / world
            updates.append(velocity.copy())
            continue
        updates.append(sum(estimate) / world if ef21 else update / world)
    return updates, e
