"""Time gs-SGD's compression path against the Top-k selection of the same vector.

The path, per step and rank, without communication: sketch the accumulated vector,
recover the m*k candidates from a (here: the same) summed table, gather the vector at the
candidates, and pick the top k of the exact values. Its reference is what every Top-k
method pays at least, the deterministic selection ``topk_indices(a.abs(), k)`` of
:mod:`gssgd.selection`, timed both ways: ``exact`` (``torch.topk`` over all d) and
``sampled`` (a sampled threshold, then the top k of the survivors; the same result). The
rivals are compared at the faster of the two (``x best``); ``x topk`` keeps the old
reference, a plain ``torch.topk(a.abs(), k)`` without the tie rule.

Run: ``python -m gssgd_lab.compress_bench --d 1000000 10000000 --density 0.01 0.001``
(one thread by default); ``--select-only`` times the two selections alone (e.g. over a
range of d, to place ``gssgd.selection.SAMPLED_MIN_N``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch

from gssgd.selection import sampled_topk_indices, topk_indices
from gssgd.sketch import CountSketch

__all__ = ["time_compression", "main"]


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` runs, after one untimed run."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def time_compression(
    d: int,
    density: float = 0.001,
    rows: int = 5,
    cols_per_k: int = 10,
    candidates: int = 4,
    repeats: int = 7,
    cache: bool = True,
    seed: int = 0,
    select_only: bool = False,
) -> dict[str, float]:
    """Median milliseconds of each part of the gs compression path and of the selections.

    Args:
        d: vector length. density: k = max(1, round(density * d)). rows, cols_per_k:
        sketch shape rows x (cols_per_k * k). candidates: m. repeats: timed runs.
        cache: use the hash cache. seed: data and hash seed. select_only: time only the
        selections (no sketch).

    Returns:
        A dict: d, density, k, the milliseconds of topk (plain ``torch.topk``),
        select_exact, select_sampled (``topk_indices`` by either method; the path the
        sampled one took is ``sampled_path``), select_best (the faster), and unless
        ``select_only``: sketch, candidates, exact_topk, gs_total and the ratios
        gs_total / topk and gs_total / select_best.
    """
    k = max(1, round(density * d))
    gen = torch.Generator().manual_seed(seed)
    vec = torch.randn(d, generator=gen)
    vec[torch.randperm(d, generator=gen)[:k]] *= 20  # a heavy tail, as in real gradients
    out: dict = {"d": d, "density": density, "k": k, **_selection_times(vec, k, repeats)}
    if select_only:
        return out
    sketch = CountSketch(d, rows=rows, cols=cols_per_k * k, seed=seed, cache_hashes=cache)
    out.update(_sketch_path_times(vec, sketch, k, min(candidates * k, d), repeats))
    out["gs_total"] = out["sketch"] + out["candidates"] + out["exact_topk"]
    out["ratio_to_topk"] = out["gs_total"] / out["topk"]
    out["ratio_to_best"] = out["gs_total"] / out["select_best"]
    return out


def _selection_times(vec: torch.Tensor, k: int, repeats: int) -> dict:
    """Milliseconds of a plain ``torch.topk`` of ``|vec|`` and of ``topk_indices`` by either
    method (checked to agree first), the faster of the two, and the sampled one's path."""
    chosen, path = sampled_topk_indices(vec.abs(), k)
    if not torch.equal(chosen, topk_indices(vec.abs(), k, method="exact")):
        raise AssertionError("the sampled selection differs from the exact one")
    out: dict = {
        "topk": _median_ms(lambda: torch.topk(vec.abs(), k), repeats),
        "select_exact": _median_ms(lambda: topk_indices(vec.abs(), k, method="exact"), repeats),
        "select_sampled": _median_ms(lambda: topk_indices(vec.abs(), k, method="sampled"), repeats),
        "sampled_path": path,
    }
    out["select_best"] = min(out["select_exact"], out["select_sampled"])
    return out


def _sketch_path_times(vec: torch.Tensor, sketch: CountSketch, k: int, m_k: int,
                       repeats: int) -> dict[str, float]:
    """Milliseconds of gs's compression steps: sketch ``vec``, recover ``m_k`` candidates,
    and the exact top-k among them."""

    def do_sketch() -> None:
        sketch.zero_()
        sketch.accumulate(vec)

    do_sketch()
    cand = sketch.heavy_hitters(m_k)[0]
    return {
        "sketch": _median_ms(do_sketch, repeats),
        "candidates": _median_ms(lambda: sketch.heavy_hitters(m_k, ordered=False), repeats),
        "exact_topk": _median_ms(lambda: topk_indices(vec[cand].abs(), k), repeats),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--density", type=float, nargs="+", default=[0.001])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-cache", action="store_true", help="hash on the fly")
    parser.add_argument("--rows", type=int, default=1, help="sketch rows (default 1)")
    parser.add_argument("--cols-per-k", type=int, default=40, help="columns per k (default 40)")
    parser.add_argument("--candidates", type=int, default=32, help="m (default 32)")
    parser.add_argument(
        "--select-only", action="store_true", help="time only the exact and sampled selections"
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [
        time_compression(
            d,
            density,
            rows=args.rows,
            cols_per_k=args.cols_per_k,
            candidates=args.candidates,
            repeats=args.repeats,
            cache=not args.no_cache,
            select_only=args.select_only,
        )
        for density in args.density
        for d in args.d
    ]
    print(
        f"threads={args.threads} cache={not args.no_cache} rows={args.rows} "
        f"cols={args.cols_per_k}k m={args.candidates} cpu={platform.processor() or '?'}"
    )
    print("selection ms: topk = torch.topk; exact, sampled = topk_indices by either method")
    head = f"{'d':>11} {'density':>8} {'topk':>8} {'exact':>8} {'sampled':>8} {'x faster':>8}"
    if not args.select_only:
        head += f" {'sketch':>8} {'cands':>8} {'gs exact':>8} {'gs total':>9} {'x topk':>7}"
        head += f" {'x best':>7}"
    print(head)
    for r in rows:
        line = (
            f"{r['d']:>11,} {r['density']:8g} {r['topk']:8.1f} {r['select_exact']:8.1f} "
            f"{r['select_sampled']:8.1f} {r['select_exact'] / r['select_sampled']:8.2f}"
        )
        if r["sampled_path"] != "sampled":
            line += f" (sampled fell back: {r['sampled_path']})"
        if not args.select_only:
            line += (
                f" {r['sketch']:8.1f} {r['candidates']:8.1f} {r['exact_topk']:8.2f} "
                f"{r['gs_total']:9.1f} {r['ratio_to_topk']:7.2f} {r['ratio_to_best']:7.2f}"
            )
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
