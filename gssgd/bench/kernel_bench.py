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
median is reported. On CUDA the timer is a pair of CUDA events around the operation and both
paths run, the kernel's output checked against the torch path's (same table up to float
rounding, same indices, same estimates bit for bit). Without CUDA only the torch path runs,
timed by ``time.perf_counter``, and the report says so.

The measured H200 numbers of the naive torch implementations (``gssgd/costmodel/data/h200_anchor.json``, torch
2.11, 5 rows × 10·k, 2026-11-29) are printed beside the d they were measured at, with the
issue's targets (:data:`TARGETS_MS`).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from gssgd import kernels
from gssgd._select import exact_topk_indices, sampled_topk_indices
from gssgd.aggregators.options import default_candidates, resolve_k
from gssgd.costmodel import store
from gssgd.sketch import CountSketch

__all__ = [
    "CUDA_SIZES",
    "CPU_SIZES",
    "H200_ANCHOR",
    "KernelBenchConfig",
    "Layout",
    "RESNET50_D",
    "TARGETS_MS",
    "compression_shares",
    "format_report",
    "run_kernel_bench",
    "write_json",
]

#: ResNet-50's parameter count, the size the anchors and the step shares are measured at.
RESNET50_D = 25_557_032
#: The H200 anchors of 2026-11-29 (naive torch ops): ``data/h200_anchor.json``, sizes by d.
H200_ANCHOR: dict = {**store.load("h200_anchor.json"), "sizes": {
    int(d): v for d, v in store.load("h200_anchor.json")["sizes"].items()}}

#: Default sizes: ResNet-50's 25.6M and BERT-base's 110M parameters, and 1M.
CUDA_SIZES: tuple[int, ...] = (1_000_000, 25_557_032, 110_000_000)
#: Without CUDA (the torch path on CPU): one size that finishes in about a minute.
CPU_SIZES: tuple[int, ...] = (1_000_000,)

#: The issue's targets on an H200 at d = 25.6M (milliseconds).
TARGETS_MS: dict[str, float] = {"sketch": 0.1, "recover+select": 1.0}


@dataclass(frozen=True)
class Layout:
    """A sketch shape: ``rows`` rows of ``cols_per_k · k`` columns."""

    rows: int
    cols_per_k: int

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.cols_per_k}k"

    @classmethod
    def parse(cls, text: str) -> Layout:
        """``"5x10"`` (or ``"5x10k"``): 5 rows of 10·k columns.

        Raises:
            ValueError: not of that form, or rows even / below 1.
        """
        try:
            rows, per_k = (int(part) for part in text.lower().rstrip("k").split("x"))
        except ValueError:
            raise ValueError(
                f"layout {text!r} is invalid: write ROWSxCOLS_PER_K, e.g. 1x40 or 5x10"
            ) from None
        if rows < 1 or rows % 2 == 0 or per_k < 1:
            raise ValueError(
                f"layout {text!r} is invalid: rows must be odd and >= 1, columns per k >= 1"
            )
        return cls(rows, per_k)


@dataclass
class KernelBenchConfig:
    """What ``gssgd bench kernels`` runs.

    Attributes:
        sizes: gradient lengths (None: :data:`CUDA_SIZES` on CUDA, :data:`CPU_SIZES` else).
        layouts: sketch shapes; gs's default (1 row of 40·k) and the anchors' (5 of 10·k).
        density: k = round(density · d).
        repeats: timed runs per operation (the median is reported).
        warmup: untimed runs first (compilation, allocator).
        device: "cuda" or "cpu" (None: CUDA when available).
        seed: of the random gradients and the hashes.
    """

    sizes: tuple[int, ...] | None = None
    layouts: tuple[Layout, ...] = (Layout(1, 40), Layout(5, 10))
    density: float = 0.001
    repeats: int = 20
    warmup: int = 3
    device: str | None = None
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(
                f"repeats={self.repeats} must be >= 1 and warmup={self.warmup} >= 0"
            )
        if not 0 < self.density <= 1:
            raise ValueError(f"density={self.density} must be in (0, 1]")
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device={self.device!r} must be 'cuda' or 'cpu'")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device; use device='cpu'")
        if self.sizes is None:
            self.sizes = CUDA_SIZES if self.device == "cuda" else CPU_SIZES


@contextlib.contextmanager
def _kernel_mode(value: str) -> Iterator[None]:
    """``GSSGD_KERNELS=value`` inside the block (restored after)."""
    old = os.environ.get(kernels.MODE_ENV)
    os.environ[kernels.MODE_ENV] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(kernels.MODE_ENV, None)
        else:
            os.environ[kernels.MODE_ENV] = old


def _median_ms(
    fn: Callable[[int], object], prepare: Callable[[int], None], cfg: KernelBenchConfig
) -> float:
    """Median milliseconds of ``fn(i)``; ``prepare(i)`` (untimed) sets up run ``i``."""
    cuda = cfg.device == "cuda"
    times = []
    for i in range(cfg.warmup + cfg.repeats):
        prepare(i)
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn(i)
            elapsed = 1e3 * (time.perf_counter() - t0)
        if i >= cfg.warmup:
            times.append(elapsed)
    return statistics.median(times)


def _entry(torch_ms: float, kernel_ms: float | None, nbytes: float, check: str) -> dict:
    best = torch_ms if kernel_ms is None else kernel_ms
    return {
        "torch_ms": torch_ms,
        "kernel_ms": kernel_ms,
        "speedup": None if kernel_ms is None else torch_ms / kernel_ms,
        "bytes": int(nbytes),
        "GBps": nbytes / (best * 1e6),
        "check": check,
    }


def _bench_size(d: int, cfg: KernelBenchConfig, fused: bool) -> dict:
    """Every operation at one gradient length."""
    device = torch.device(cfg.device)
    k = resolve_k(d, cfg.density, None)
    m = default_candidates(d, k)
    gen = torch.Generator(device=device).manual_seed(cfg.seed + d)
    pool = [torch.randn(d, generator=gen, device=device) for _ in range(2)]
    out: dict = {"d": d, "k": k, "m": m, "layouts": {}}

    dst = torch.empty_like(pool[0])
    copy_ms = _median_ms(lambda i: dst.copy_(pool[i % 2]), lambda i: None, cfg)
    out["copy"] = _entry(copy_ms, None, 8 * d, "-")
    out["copy_TBps"] = 8 * d / (copy_ms * 1e9)
    out["read_floor_ms"] = 4 * d / (out["copy_TBps"] * 1e9)

    for layout in cfg.layouts:
        cols = min(layout.cols_per_k * k, d)
        out["layouts"][layout.name] = _bench_layout(d, k, m, cols, layout.rows, pool, cfg, fused)

    candidates = torch.randperm(d, device=device)[: m * k].sort().values
    mags = [g.abs() for g in pool]
    gather_bytes = 16 * candidates.numel()
    torch_ms = _median_ms(lambda i: pool[i % 2][candidates], lambda i: None, cfg)
    kernel_ms, check = None, "torch path only"
    if fused:
        got = kernels.gather(pool[0], candidates)
        check = "ok" if torch.equal(got, pool[0][candidates]) else "MISMATCH"
        kernel_ms = _median_ms(lambda i: kernels.gather(pool[i % 2], candidates), _noop, cfg)
    out["gather"] = _entry(torch_ms, kernel_ms, gather_bytes, check)

    torch_ms = _median_ms(lambda i: exact_topk_indices(mags[i % 2], k, False), _noop, cfg)
    kernel_ms, check = None, "torch path only"
    if fused:
        with _kernel_mode("on"):
            got, path = sampled_topk_indices(mags[0], k, ordered=False)
            want = exact_topk_indices(mags[0], k, ordered=False)
            same = torch.equal(got.sort().values, want.sort().values)
            check = ("ok" if same else "MISMATCH") + ("" if path == "sampled" else f" ({path})")
            kernel_ms = _median_ms(
                lambda i: sampled_topk_indices(mags[i % 2], k, ordered=False), _noop, cfg
            )
    out["select"] = _entry(torch_ms, kernel_ms, 4 * d, check)
    return out


def _noop(i: int) -> None:
    return None


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
        with _kernel_mode(mode):
            sk = CountSketch(d, rows=rows, cols=cols, seed=cfg.seed, device=device)
            times["sketch"][mode] = _median_ms(
                lambda i, sk=sk: sk.accumulate(pool[i % 2]), lambda i, sk=sk: sk.zero_(), cfg
            )
            sk.zero_()
            sk.accumulate(pool[0])
            sketches[mode] = sk
    summed = sketches["off"]  # recover and query read the same table on both paths
    cand = {}
    for mode in modes:
        with _kernel_mode(mode):
            times["recover"][mode] = _median_ms(
                lambda i: summed.heavy_hitters(m * k, ordered=False), _noop, cfg
            )
            cand[mode] = summed.heavy_hitters(m * k, ordered=False)[0]
    idx = cand["off"].sort().values
    estimates = {}
    for mode in modes:
        with _kernel_mode(mode):
            times["query"][mode] = _median_ms(lambda i: summed.query(idx), _noop, cfg)
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
        result[op] = _entry(by_mode["off"], by_mode.get("on"), nbytes[op], checks[op])
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


_OPS = ("sketch", "recover", "query", "gather", "select", "copy")


def format_report(report: dict) -> str:
    """The report as a table: per size and operation, torch and kernel times, speed-up,
    effective GB/s and the check; then the anchors and targets where they apply."""
    lines = [
        f"gssgd bench kernels on {report['device']} (torch {report['torch']}, triton "
        f"{report['triton'] or 'absent'})",
        *(f"note: {note}" for note in report["notes"]),
    ]
    head = f"{'d':>12} {'layout':>7} {'op':>8} {'torch ms':>10} {'kernel ms':>10} " \
           f"{'speedup':>8} {'GB/s':>8}  check"
    lines.append(head)
    for size in report["sizes"]:
        rows = []
        for name, layout in size["layouts"].items():
            rows += [(name, op, layout[op]) for op in ("sketch", "recover", "query")]
        rows += [("-", op, size[op]) for op in ("gather", "select", "copy")]
        for name, op, e in rows:
            kernel = "-" if e["kernel_ms"] is None else f"{e['kernel_ms']:.4f}"
            speed = "-" if e["speedup"] is None else f"{e['speedup']:.1f}x"
            lines.append(
                f"{size['d']:>12,} {name:>7} {op:>8} {e['torch_ms']:>10.4f} {kernel:>10} "
                f"{speed:>8} {e['GBps']:>8.3g}  {e['check']}"
            )
        lines.append(
            f"{'':>12} floor: copy {size['copy_TBps']:.3g} TB/s, one read of the gradient "
            f"{size['read_floor_ms']:.4f} ms; k={size['k']:,}, m={size['m']}"
        )
        anchor = report["anchor"]["sizes"].get(size["d"])
        if anchor and report["kernels_timed"]:
            lines += _against_anchor(size, anchor, report)
    return "\n".join(lines)


def _against_anchor(size: dict, anchor: dict, report: dict) -> list[str]:
    """Lines comparing one size with the H200 anchor (and the targets at 25.6M)."""
    lines = [
        f"{'':>12} H200 anchor ({anchor['name']}, naive torch, 5x10k): sketch "
        f"{anchor['sketch_onthefly_hash_ms']:.2f} ms on the fly / "
        f"{anchor['sketch_precomputed_hash_ms']:.2f} ms cached hashes, query+top-k "
        f"{anchor['query_median_topk_ms']:.2f} ms, topk {anchor['topk_ms']:.3f} ms, read floor "
        f"{anchor['read_floor_ms']:.4f} ms"
    ]
    if size["d"] == 25_557_032:
        for name, layout in size["layouts"].items():
            sketch = layout["sketch"]["kernel_ms"]
            recover = layout["recover"]["kernel_ms"]  # screening, query, top m·k of them
            lines.append(
                f"{'':>12} targets ({name}): sketch {sketch:.3f} ms (target <= "
                f"{TARGETS_MS['sketch']} ms), recovery+selection {recover:.3f} ms (target "
                f"<= {TARGETS_MS['recover+select']} ms)"
            )
    return lines


def write_json(report: dict, path: Path) -> None:
    """Write the report as JSON (sizes' keys stay strings; NaN never occurs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")



#: ResNet-50's parameter count: the d of the per-step compression timing.


def compression_shares(
    d: int = RESNET50_D, density: float = 0.001, repeats: int = 20, warmup: int = 3,
    fwdbwd_ms: float | None = None,
) -> dict:
    """Each method's per-step compression compute at length ``d`` on CUDA, and its share of
    a forward + backward step (the project's defaults: gs and Sketched-SGD with their default
    sketch and candidates; topk and gtopk the local top-k; dense nothing).

    Timed with the kernels as dispatch chooses them (``GSSGD_KERNELS``), CUDA events, the
    median of ``repeats`` on two alternating gradients. What is timed per method:

    * gs: sketch the gradient, recover m·k candidates (``heavy_hitters(m·k,
      ordered=False)``), gather the exact values at them, top-k of those;
    * sketched: the same compute (the server's recovery; its rows and columns are gs's);
    * topk, gtopk: ``topk_indices(|a|, k)`` (gtopk's merges are communication);
    * dense: none.

    Args:
        fwdbwd_ms: the step to compare with; None measures torchvision's ResNet-50 at batch
            64 (fp32) when torchvision is importable, else uses the H200 anchor (32.8 ms).

    Returns:
        ``{"d", "k", "fwdbwd_ms", "fwdbwd_source", "methods": {name: {"ms", "share"}}}``.
    """
    from gssgd._select import topk_indices
    from gssgd.aggregators.options import DEFAULT_ROWS, default_sketch_cols

    cfg = KernelBenchConfig(sizes=(d,), repeats=repeats, warmup=warmup, device="cuda")
    k = resolve_k(d, density, None)
    m = default_candidates(d, k)
    rows, cols = DEFAULT_ROWS, default_sketch_cols(d, k, DEFAULT_ROWS)
    gen = torch.Generator(device="cuda").manual_seed(0)
    pool = [torch.randn(d, generator=gen, device="cuda") for _ in range(2)]
    sketch = CountSketch(d, rows=rows, cols=cols, seed=0, device="cuda")

    def sketch_recover(i: int) -> None:
        a = pool[i % 2]
        sketch.zero_()
        sketch.accumulate(a)
        cand = sketch.heavy_hitters(m * k, ordered=False)[0]
        exact = a[cand]
        topk_indices(exact.abs(), k)

    def local_topk(i: int) -> None:
        topk_indices(pool[i % 2].abs(), k)

    timed = {"gs": sketch_recover, "sketched": sketch_recover, "topk": local_topk,
             "gtopk": local_topk}
    source = "given"
    if fwdbwd_ms is None:
        fwdbwd_ms, source = _resnet50_fwdbwd_ms(cfg)
    methods = {"dense": {"ms": 0.0, "share": 0.0}}
    for name, fn in timed.items():
        ms = _median_ms(fn, _noop, cfg)
        methods[name] = {"ms": ms, "share": ms / fwdbwd_ms}
    return {"d": d, "k": k, "m": m, "rows": rows, "cols": cols, "fwdbwd_ms": fwdbwd_ms,
            "fwdbwd_source": source, "methods": methods}


def _resnet50_fwdbwd_ms(cfg: KernelBenchConfig) -> tuple[float, str]:
    """torchvision's ResNet-50, batch 64, fp32, forward + backward (median ms), or the H200
    anchor's figure when torchvision is absent."""
    try:
        import torchvision
    except ImportError:
        return H200_ANCHOR["resnet50_b64_fp32_fwdbwd_ms"], "H200 anchor (no torchvision)"
    model = torchvision.models.resnet50().cuda()
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i: int) -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    return _median_ms(step, _noop, cfg), "measured (torchvision resnet50, batch 64, fp32)"
