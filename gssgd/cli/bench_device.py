"""``gssgd bench device``: measure this device's compute constants for the cost model and
store them as a device record (``gssgd advise --device NAME`` reads it).

Each constant is a median time over repeated runs (CUDA events on a GPU), divided into a
per-element figure at one gradient length ``d`` (default ResNet-50's, 25,557,032), with
k = d/1000 and the sketch as gs runs it on the device (its default shape; the Triton
kernels where dispatch takes them):

* ``pass_s_per_elem``: ``y.copy_(x)`` over ``d`` float32 elements, halved (one read or one
  write of the vector);
* ``topk_s_per_elem``: the package's top-k of ``|g|`` (:func:`gssgd.selection.topk_indices`);
* ``sketch_s_per_elem_row``: :meth:`~gssgd.sketch.CountSketch.accumulate`, per row;
* ``recover_s_per_elem``: the sketch's ``heavy_hitters(m * k, ordered=False)``;
* ``lowrank_s_per_elem_rank``: PowerSGD's three products (``M Q``, ``M^T P``, ``P Q^T``) on a
  near-square matrix of ``d`` elements, at ranks 1, 2 and 4: the median of ``t / (r d)``;
* ``fwdbwd_s_per_param``: forward + backward of torchvision's ResNet-50 at batch 64 (fp32)
  on a GPU where torchvision is importable, else of the shipped ``wresnet`` at batch 32,
  per parameter.

The record is what ``gssgd/costmodel/data/devices.json`` holds for a measured device.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from gssgd.cli import bench_args
from gssgd.cli.errors import run_command

__all__ = ["add_parser", "measure_device", "run"]


DESCRIPTION = """\
Measure the compute constants the cost model prices a method's compression with, on this
machine's GPU (or CPU): a pass over the vector, top-k, a sketch row, the sketch's recovery,
PowerSGD's products per unit of rank, and forward + backward per parameter of a reference
model (torchvision's ResNet-50 on a GPU). Prints the record; --write NAME stores it as
device NAME in the package's gssgd/costmodel/data/devices.json (a source checkout), which
`gssgd advise --device NAME` then uses.
"""

EXAMPLES = """\
examples:
  gssgd bench device                           # print this machine's record
  gssgd bench device --write h200              # store it (run on the H200)
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench device`` under the ``bench`` group's subparsers."""
    parser = sub.add_parser(
        "device",
        help="measure this device's compute constants for the cost model",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--device", choices=("cuda", "cpu"), default=None, help="default: CUDA if available")
    add("--d", type=bench_args.count, default=25_557_032,
        help="gradient length the constants are measured at (default ResNet-50's)")
    add("--repeats", type=bench_args.count, default=20, help="timed runs per operation")
    add("--warmup", type=int, default=3, help="untimed runs first")
    add("--write", metavar="NAME", default=None,
        help="store the record as device NAME in gssgd/costmodel/data/devices.json")
    add("--json", type=Path, default=None, help="also write the record to this file")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Measure, print, store; 0 done, 2 a bad value."""
    return run_command("gssgd bench device", lambda: _run(args))


def _run(args: argparse.Namespace) -> None:
    from gssgd.costmodel import store

    record = measure_device(args.device, args.d, args.repeats, args.warmup)
    text = json.dumps(record, indent=1, sort_keys=True)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    if args.write:
        data = json.loads((store.DATA_DIR / "devices.json").read_text())
        old = data["devices"].get(args.write, {})
        kept = {k: v for k, v in old.items() if k in ("overlap_efficiency", "fwdbwd_s")}
        data["devices"][args.write] = {**kept, **record}
        print(f"wrote device {args.write!r} to {store.write('devices.json', data)}")


#: ResNet-50's parameter count: the default gradient length of the measurement.
RESNET50_D = 25_557_032


def _median_s(fn: Callable[[], object], device: str, repeats: int, warmup: int) -> float:
    """Median seconds of ``fn()`` (CUDA events on a GPU)."""
    times = []
    for i in range(warmup + repeats):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - t0
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def _fwdbwd_per_param(device: str, repeats: int, warmup: int) -> tuple[float, str]:
    """Forward + backward seconds per parameter of the reference model, and its name."""
    if device == "cuda":
        try:
            import torchvision

            model = torchvision.models.resnet50().cuda()
            x = torch.randn(64, 3, 224, 224, device=device)
            y = torch.randint(0, 1000, (64,), device=device)
            name = "torchvision resnet50, batch 64, fp32"
        except ImportError:
            model = None
    if device != "cuda" or model is None:
        from gssgd.train.data import ImageData
        from gssgd.train.models import build_model

        stand_in = torch.zeros(2, 1, 28, 28)
        data = ImageData(x_train=stand_in, y_train=torch.arange(2), x_test=stand_in,
                         y_test=torch.arange(2), num_classes=10, name="stand-in")
        model = build_model("wresnet", data).to(device)
        x = torch.randn(32, 1, 28, 28, device=device)
        y = torch.randint(0, 10, (32,), device=device)
        name = "gssgd wresnet, batch 32 of 28x28"
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    params = sum(p.numel() for p in model.parameters())
    return _median_s(step, device, repeats, warmup) / params, name


def measure_device(device: str | None = None, d: int = RESNET50_D, repeats: int = 20,
                   warmup: int = 3) -> dict[str, Any]:
    """Measure the constants of this machine's ``device`` (see the module doc).

    Args:
        device: "cuda" or "cpu" (None: CUDA when available).
        d: the gradient length the per-element figures are measured at.
        repeats, warmup: timed and untimed runs of each operation.

    Returns:
        The device record (constants, ``summary``, ``source``, ``date``, ``details``).

    Raises:
        ValueError: ``cuda`` without a CUDA device, or bad sizes.
    """
    from gssgd.aggregators.sketching import default_candidates, default_sketch_cols

    device = _checked_device(device, d, repeats, warmup)
    gen = torch.Generator(device=device).manual_seed(0)
    g = torch.randn(d, generator=gen, device=device)
    k = max(1, round(0.001 * d))
    cols, m = default_sketch_cols(d, k, 1), default_candidates(d, k)
    t = _primitive_seconds(g, k, cols, m, device, repeats, warmup)
    lowrank = _lowrank_per_elem_rank(g, gen, device, repeats, warmup)
    fwdbwd, reference = _fwdbwd_per_param(device, max(3, repeats // 4), warmup)
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    return {
        "summary": f"{name} (torch {torch.__version__}; measured by gssgd bench device)",
        "source": f"gssgd bench device --d {d}, {datetime.now(timezone.utc):%Y-%m-%d}",
        "pass_s_per_elem": t["copy"] / (2 * d),
        "topk_s_per_elem": t["topk"] / d,
        "sketch_s_per_elem_row": t["sketch"] / d,
        "recover_s_per_elem": t["recover"] / d,
        "lowrank_s_per_elem_rank": statistics.median(lowrank),
        "fwdbwd_s_per_param": fwdbwd,
        "details": {"device": name, "d": d, "k": k, "cols": cols, "candidates": m,
                    "milliseconds": {key: 1e3 * v for key, v in t.items()},
                    "lowrank_s_per_elem_rank_at_1_2_4": lowrank,
                    "fwdbwd_reference": reference, "torch": torch.__version__},
    }


def _checked_device(device: str | None, d: int, repeats: int, warmup: int) -> str:
    """The device to measure ("cuda" when available if None).

    Raises:
        ValueError: ``cuda`` without a CUDA device, or bad sizes.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device; use --device cpu")
    if d < 1000 or repeats < 1 or warmup < 0:
        raise ValueError(f"d={d} must be >= 1000, repeats={repeats} >= 1, warmup={warmup} >= 0")
    return device


def _primitive_seconds(g: torch.Tensor, k: int, cols: int, m: int, device: str, repeats: int,
                       warmup: int) -> dict[str, float]:
    """Median seconds of a copy of ``g``, the top-k of ``|g|``, sketching ``g`` into one
    row of ``cols`` columns, and recovering ``m * k`` candidates from that sketch."""
    from gssgd.selection import topk_indices
    from gssgd.sketch import CountSketch

    out = torch.empty_like(g)
    sketch = CountSketch(g.numel(), rows=1, cols=cols, seed=0, device=device)
    sketch.accumulate(g)
    timed = {
        "copy": lambda: out.copy_(g),
        "topk": lambda: topk_indices(g.abs(), k),
        "sketch": lambda: sketch.accumulate(g),
        "recover": lambda: sketch.heavy_hitters(m * k, ordered=False),
    }
    return {name: _median_s(fn, device, repeats, warmup) for name, fn in timed.items()}


def _lowrank_per_elem_rank(g: torch.Tensor, gen: torch.Generator, device: str, repeats: int,
                           warmup: int) -> list[float]:
    """PowerSGD's three products on ``g`` viewed as a near-square matrix, at ranks 1, 2 and
    4: seconds per element and rank of each."""
    d = g.numel()
    n = math.isqrt(d)
    matrix = g[: n * (d // n)].view(n, d // n)
    lowrank = []
    for r in (1, 2, 4):
        q = torch.randn(d // n, r, generator=gen, device=device)
        p = torch.randn(n, r, generator=gen, device=device)
        seconds = _median_s(lambda q=q, p=p: (matrix @ q, matrix.T @ p, p @ q.T),
                            device, repeats, warmup)
        lowrank.append(seconds / (r * matrix.numel()))
    return lowrank
