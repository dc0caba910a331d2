"""``gssgd bench comm``: time one aggregation step of every method on P local workers, on
loopback or on emulated rate-limited links, and write DIR/results.json, table.txt and
comm.png (:func:`gssgd_lab.comm_bench.run_comm_bench`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from gssgd.aggregators.sketching import DEFAULT_ROWS
from gssgd.cli import bench_args
from gssgd.cli.errors import run_command
from gssgd.costmodel.architectures import ARCHITECTURES
from gssgd.costmodel.method_specs import VARIANTS

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Time agg.step of every method on P local gloo workers, on loopback or on emulated
rate-limited links, all in one run, and write DIR/results.json (per method:
seconds_per_step, its split, bytes per step, speedup_of_gs; plus _meta), DIR/table.txt
and DIR/comm.png.
"""

EXAMPLES = """\
examples:
  gssgd bench comm --workers 4 --d 1000000 --density 0.001 --link 100mbit --out runs/comm_100mbit
  gssgd bench comm --workers 2 --d 1e5 --link none --methods dense,topk,gs --repeats 5

methods (--methods, comma-separated):
{methods}

Each method runs --warmup untimed then --repeats timed steps, interleaved with the others
and after a barrier. time/step is the median over steps of the slowest rank's agg.step;
'gs speed-up' is each method's time divided by gs's (> 1: gs is faster). With a link rate
every worker runs in its own network namespace behind a tbf-shaped veth (needs root;
without root the run says so and uses loopback instead). Compute is slower when there are
more workers than cores: compare methods within one run.
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench comm`` under the ``bench`` group's subparsers."""
    parser = sub.add_parser(
        "comm",
        help="time one aggregation step of every method on P local workers",
        description=DESCRIPTION,
        epilog=EXAMPLES.format(methods=bench_args.listing(VARIANTS)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    _add_workload_flags(parser.add_argument)
    _add_step_and_sketch_flags(parser.add_argument)
    _add_run_flags(parser.add_argument)
    return parser


def _add_workload_flags(add: Callable[..., object]) -> None:
    """What is exchanged and over what: --workers, --d, --density, --link, --methods."""
    add("--workers", type=bench_args.count, default=4, help="worker processes P (default 4)")
    add(
        "--d",
        type=bench_args.count,
        default=1_000_000,
        help="gradient length (default 1e6; 1e6 and 1_000_000 work)",
    )
    add(
        "--density",
        type=bench_args.density,
        default=0.001,
        help="fraction of coordinates the sparse methods send (default 0.001)",
    )
    add(
        "--link",
        type=bench_args.link,
        default="1gbit",
        help="every worker's link rate in each direction: 100mbit, 1gbit, 10gbit, ... or "
        "none for loopback (default 1gbit; a rate needs root)",
    )
    default = tuple(VARIANTS)
    add(
        "--methods",
        type=bench_args.benchmark_methods(),
        default=default,
        help=f"comma-separated methods (default: all, {','.join(default)})",
    )


def _add_step_and_sketch_flags(add: Callable[..., object]) -> None:
    """How many steps, and the sketch's shape: --repeats, --warmup, --rows, --cols,
    --candidates."""
    add("--repeats", type=bench_args.count, default=20, help="timed steps per method (default 20)")
    add(
        "--warmup",
        type=int,
        default=2,
        help="untimed steps per method first; the first step also checks that the ranks "
        "agree (default 2)",
    )
    add("--rows", type=int, default=DEFAULT_ROWS, help=f"sketch rows, odd (default {DEFAULT_ROWS})")
    add(
        "--cols",
        type=bench_args.count,
        default=None,
        help="sketch columns (default: the aggregators' default, 40·k capped at d/(4 rows); "
        "gs-small uses a quarter)",
    )
    add(
        "--candidates",
        type=bench_args.count,
        default=None,
        help="m: the sketch proposes m*k candidates (default: the aggregators' default, 32 "
        "capped so m*k <= d/8)",
    )
    add(
        "--arch",
        choices=ARCHITECTURES,
        default=None,
        help="the layer shapes of this architecture at --d, which PowerSGD compresses "
        "matrix by matrix as it would the model's (default: one near-square matrix)",
    )


def _add_run_flags(add: Callable[..., object]) -> None:
    """The run itself: --threads, --seed, --timeout, --out."""
    add("--threads", type=bench_args.count, default=1, help="torch threads per worker (default 1)")
    add("--seed", type=int, default=0, help="seed of gradients and hashes (default 0)")
    add(
        "--timeout",
        type=bench_args.seconds,
        default=None,
        help="seconds before the whole run is stopped (default: from the cost model's "
        "estimate of the run, with a wide margin)",
    )
    add(
        "--out",
        type=Path,
        default=Path("runs/bench_comm"),
        help="output directory (default runs/bench_comm)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 done, 1 a worker failed or timed out or the emulated cluster
    could not be built, 2 a bad setting, 130 interrupted."""
    return run_command(
        "gssgd bench comm",
        lambda: _run(args),
        failures=(RuntimeError,),  # the emulated cluster could not be built
        interrupted="the workers were stopped",
    )


def _run(args: argparse.Namespace) -> None:
    from gssgd_lab.comm_bench import run_comm_bench
    from gssgd_lab.comm_config import CommBenchConfig

    cfg = CommBenchConfig(
        workers=args.workers,
        d=args.d,
        density=args.density,
        link=args.link,
        methods=tuple(args.methods),
        repeats=args.repeats,
        warmup=args.warmup,
        rows=args.rows,
        cols=args.cols,
        candidates=args.candidates,
        arch=args.arch,
        threads=args.threads,
        seed=args.seed,
        timeout_s=args.timeout,
    )
    run_comm_bench(cfg, args.out)
