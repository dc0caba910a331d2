"""``gssgd bench kernels``: time the Triton kernels against the torch path they replace.

For every gradient length ``d`` (k = density·d, m = the gs default candidates) and sketch
layout (rows × columns per k), on fresh inputs:

====================  ==========================================================  ===========
operation             what is timed                                                bytes (GB/s)
====================  ==========================================================  ===========
``sketch``            ``CountSketch.accumulate(g)`` into a zeroed table            4·d
``recover``           ``heavy_hitters(m·k, ordered=False)`` of a summed table:     4·d
                      screening, query, top m·k (gs's recovery + selection)
``query``             ``query(candidates)`` at the m·k candidates                  m·k·(12+4·rows)
``gather``            ``g[candidates]`` (the exact values)                         m·k·16
``select``            top-k of ``|g|``: sampled threshold + count/compact kernel   4·d
                      against ``torch.topk`` (the torch path's choice on CUDA)
``copy``              ``dst.copy_(g)``: the bandwidth floor (one read, one write)  8·d
====================  ==========================================================  ===========

"bytes" is what the operation must at least move, so GB/s against the copy's says how far
from the bandwidth floor it runs (the hash work of ``sketch`` and ``recover`` is compute,
not bytes). Each operation runs ``warmup`` untimed times, then ``repeats`` timed ones on
inputs drawn afresh from a pool of two (so no run finds the last one's data in cache); the
median is reported (:mod:`gssgd_lab.kernel_timing`). On CUDA the timer is a pair of CUDA
events around the operation and both paths run, the kernel's output checked against the
torch path's (same table up to float rounding, same indices, same estimates bit for bit).
Without CUDA only the torch path runs, timed by ``time.perf_counter``, and the report says
so.

The report (:mod:`gssgd_lab.kernel_report`) prints the naive torch operations' H200
anchors (:data:`~gssgd_lab.kernel_config.H200_ANCHOR`) beside the d they were timed at,
with the targets (:data:`~gssgd_lab.kernel_config.TARGETS_MS`).
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from gssgd import kernels
from gssgd.aggregators.options import resolve_k
from gssgd.aggregators.sketching import default_candidates
from gssgd.selection import exact_topk_indices, sampled_topk_indices
from gssgd.sketch import CountSketch
from gssgd_lab.kernel_config import H200_ANCHOR, TARGETS_MS, KernelBenchConfig
from gssgd_lab.kernel_timing import kernel_mode, median_ms, no_setup, timing_entry

__all__ = ["run_kernel_bench"]


def _bench_size(d: int, cfg: KernelBenchConfig, fused: bool) -> dict:
    """Every operation at one gradient length."""
    device = torch.device(cfg.device)
    k = resolve_k(d, cfg.density, None)
    m = default_candidates(d, k)
    gen = torch.Generator(device=device).manual_seed(cfg.seed + d)
    pool = [torch.randn(d, generator=gen, device=device) for _ in range(2)]
    out: dict = {"d": d, "k": k, "m": m, "layouts": {}}

    dst = torch.empty_like(pool[0])
    copy_ms = median_ms(lambda i: dst.copy_(pool[i % 2]), no_setup, cfg)
    out["copy"] = timing_entry(copy_ms, None, 8 * d, "-")
    out["copy_TBps"] = 8 * d / (copy_ms * 1e9)
    out["read_floor_ms"] = 4 * d / (out["copy_TBps"] * 1e9)

    for layout in cfg.layouts:
        cols = min(layout.cols_per_k * k, d)
        out["layouts"][layout.name] = _bench_layout(d, k, m, cols, layout.rows, pool, cfg, fused)

    candidates = torch.randperm(d, device=device)[: m * k].sort().values
    mags = [g.abs() for g in pool]
    gather_bytes = 16 * candidates.numel()
    torch_ms = median_ms(lambda i: pool[i % 2][candidates], no_setup, cfg)
    kernel_ms, check = None, "torch path only"
    if fused:
        got = kernels.gather(pool[0], candidates)
        check = "ok" if torch.equal(got, pool[0][candidates]) else "MISMATCH"
        kernel_ms = median_ms(lambda i: kernels.gather(pool[i % 2], candidates), no_setup, cfg)
    out["gather"] = timing_entry(torch_ms, kernel_ms, gather_bytes, check)

    torch_ms = median_ms(lambda i: exact_topk_indices(mags[i % 2], k, False), no_setup, cfg)
    kernel_ms, check = None, "torch path only"
    if fused:
        with kernel_mode("on"):
            got, path = sampled_topk_indices(mags[0], k, ordered=False)
            want = exact_topk_indices(mags[0], k, ordered=False)
            same = torch.equal(got.sort().values, want.sort().values)
            check = ("ok" if same else "MISMATCH") + ("" if path == "sampled" else f" ({path})")
            kernel_ms = median_ms(
                lambda i: sampled_topk_indices(mags[i % 2], k, ordered=False), no_setup, cfg
            )
    out["select"] = timing_entry(torch_ms, kernel_ms, 4 * d, check)
    return out


def _bench_layout(
    d: int, k: int, m: int, cols: int, rows: int, pool: list[torch.Tensor],
    cfg: KernelBenchConfig, fused: bool,
) -> dict:
    """sketch, recover and query for one sketch shape."""
    device = torch.device(cfg.device)
    result: dict = {"rows": rows, "cols": cols}
    sketches = {}
    times: dict[str, dict[str, float]] = {"sketch": {}, "recover": {}, "query": {}}
    modes = ("off", "on") if fused else ("off",)
    for mode in modes:
        with kernel_mode(mode):
            sk = CountSketch(d, rows=rows, cols=cols, seed=cfg.seed, device=device)
            times["sketch"][mode] = median_ms(
                lambda i, sk=sk: sk.accumulate(pool[i % 2]), lambda i, sk=sk: sk.zero_(), cfg
            )
            sk.zero_()
            sk.accumulate(pool[0])
            sketches[mode] = sk
    summed = sketches["off"]  # recover and query read the same table on both paths
    cand = {}
    for mode in modes:
        with kernel_mode(mode):
            times["recover"][mode] = median_ms(
                lambda i: summed.heavy_hitters(m * k, ordered=False), no_setup, cfg
            )
            cand[mode] = summed.heavy_hitters(m * k, ordered=False)[0]
    idx = cand["off"].sort().values
    estimates = {}
    for mode in modes:
        with kernel_mode(mode):
            times["query"][mode] = median_ms(lambda i: summed.query(idx), no_setup, cfg)
            estimates[mode] = summed.query(idx)

    checks = dict.fromkeys(times, "torch path only")
    if fused:
        table_ok = torch.allclose(
            sketches["on"].table, sketches["off"].table, rtol=1e-4, atol=1e-4
        )
        checks["sketch"] = "ok" if table_ok else "MISMATCH"
        same = torch.equal(cand["on"].sort().values, idx)
        checks["recover"] = "ok" if same else "MISMATCH"
        checks["query"] = "ok" if torch.equal(estimates["on"], estimates["off"]) else "MISMATCH"
    nbytes = {"sketch": 4 * d, "recover": 4 * d, "query": idx.numel() * (12 + 4 * rows)}
    for op, by_mode in times.items():
        result[op] = timing_entry(by_mode["off"], by_mode.get("on"), nbytes[op], checks[op])
    return result


def run_kernel_bench(cfg: KernelBenchConfig) -> dict:
    """Run every operation at every size; returns the report (see :func:`format_report`)."""
    # Kernels on CUDA; on the CPU only in Triton's interpreter (a check of this benchmark's
    # own code, as the tests run it: interpreted kernel times mean nothing).
    fused = kernels.available() and (cfg.device == "cuda" or kernels.interpreted())
    notes = list(cfg.notes)
    if cfg.device != "cuda" and fused:
        notes.append(
            "TRITON_INTERPRET=1: the kernels ran in Triton's CPU interpreter; their times "
            "are meaningless, only the checks count"
        )
    elif cfg.device != "cuda":
        notes.append(
            "no CUDA device: timed the torch path on the CPU only (the kernels need a GPU; "
            "tests/kernels checks them on the CPU in Triton's interpreter)"
        )
    elif not fused:
        notes.append("Triton is not installed: timed the torch path only")
    report = {
        "device": torch.cuda.get_device_name() if cfg.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": _triton_version(),
        "kernels_timed": fused,
        "config": {**asdict(cfg), "layouts": [lay.name for lay in cfg.layouts]},
        "notes": notes,
        "sizes": [_bench_size(d, cfg, fused) for d in cfg.sizes],
        "anchor": H200_ANCHOR,
        "targets_ms": TARGETS_MS,
    }
    report["config"].pop("notes")
    return report


def _triton_version() -> str | None:
    if not kernels.available():
        return None
    import triton

    return triton.__version__
