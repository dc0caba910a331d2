"""``gssgd bench kernels``: time the Triton kernels against the torch path and check them
(:func:`gssgd_lab.kernel_bench.run_kernel_bench`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gssgd.cli import bench_args
from gssgd.cli.errors import run_command

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Time every gssgd kernel (sketch, recover, query, gather, select) against the torch path it
replaces, at d = 1M, 25.6M (ResNet-50) and 110M (BERT-base): CUDA events, warm-up, the
median of --repeats runs on fresh inputs, each kernel's output checked against the torch
path's. Prints time, speed-up and effective bandwidth per operation, the copy bandwidth
floor, and the measured H200 anchors and targets. Without CUDA it times the torch path on
the CPU (default size 1M only) and says so.
"""

EXAMPLES = """\
examples:
  gssgd bench kernels                          # CUDA: 1M, 25.6M, 110M; CPU: 1M
  gssgd bench kernels --sizes 1e6,25557032 --json runs/kernels.json
  gssgd bench kernels --layouts 1x40 --repeats 50

layouts: ROWSxCOLS_PER_K; 1x40 is gs's default sketch (1 row of 40·k columns), 5x10 the
shape of the H200 anchors. GSSGD_KERNELS=off makes CountSketch use the torch path
everywhere; this benchmark sets it itself for each path it times.
"""


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(bench_args.count(part) for part in text.split(",") if part.strip())


def _layouts(text: str) -> tuple:
    from gssgd_lab.kernel_config import Layout

    try:
        return tuple(Layout.parse(part) for part in text.split(",") if part.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench kernels`` under the ``bench`` group's subparsers."""
    parser = sub.add_parser(
        "kernels",
        help="time the Triton kernels against the torch path, and check them",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add = parser.add_argument
    add(
        "--sizes",
        type=_sizes,
        default=None,
        help="comma-separated gradient lengths (default: 1e6,25557032,1.1e8 on CUDA, 1e6 on CPU)",
    )
    add(
        "--layouts",
        type=_layouts,
        default=None,
        help="comma-separated sketch shapes ROWSxCOLS_PER_K (default 1x40,5x10)",
    )
    add(
        "--density",
        type=bench_args.density,
        default=0.001,
        help="k = density * d (default 0.001)",
    )
    add("--repeats", type=bench_args.count, default=None,
        help="timed runs per operation (default 20 on CUDA, 5 on CPU)")
    add("--warmup", type=int, default=None, help="untimed runs first (default 3 on CUDA, 1 on CPU)")
    add("--device", choices=("cuda", "cpu"), default=None,
        help="where to run (default: cuda when available)")
    add("--seed", type=int, default=0, help="seed of the gradients and hashes (default 0)")
    add("--json", type=Path, default=None, help="also write the report as JSON to this path")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 done (every check passed), 1 a kernel's output differed from
    the torch path's, 2 a bad setting."""
    return run_command("gssgd bench kernels", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    import torch

    from gssgd_lab.kernel_bench import run_kernel_bench
    from gssgd_lab.kernel_config import KernelBenchConfig
    from gssgd_lab.kernel_report import format_report, write_json

    cuda = args.device == "cuda" or (args.device is None and torch.cuda.is_available())
    options = {"layouts": args.layouts} if args.layouts else {}
    cfg = KernelBenchConfig(
        sizes=args.sizes,
        density=args.density,
        repeats=args.repeats or (20 if cuda else 5),
        warmup=(3 if cuda else 1) if args.warmup is None else args.warmup,
        device=args.device,
        seed=args.seed,
        **options,
    )
    report = run_kernel_bench(cfg)
    print(format_report(report), flush=True)
    if args.json is not None:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    failed = [
        check for size in report["sizes"] for check in _checks(size) if "MISMATCH" in check
    ]
    if failed:
        print(f"{len(failed)} kernel check(s) differ from the torch path: see 'check' above")
        return 1
    return 0


def _checks(size: dict) -> list[str]:
    per_layout = [
        entry["check"] for layout in size["layouts"].values()
        for key, entry in layout.items() if isinstance(entry, dict)
    ]
    return per_layout + [size[op]["check"] for op in ("gather", "select", "copy")]
