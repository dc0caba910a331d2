"""``gssgd bench model``: fit the cost model to ``bench comm`` results, report its error on
every measured point, and predict larger clusters
(:func:`gssgd.bench.model_report.model_report`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from gssgd.bench.model_report import PREDICTION_RATES, model_report
from gssgd.cli import bench_args
from gssgd.cli.errors import run_command
from gssgd.costmodel.method_specs import VARIANTS

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Fit the cost model to `gssgd bench comm` results (or use its documented defaults),
report the relative error on every measured point, and predict the time per step for
P = 2..1024 and d up to 1e9.
"""

EXAMPLES = """\
examples:
  gssgd bench model                                  # documented defaults, no measurements
  gssgd bench model --calibrate runs/comm_100mbit runs/comm_1gbit runs/comm_none
  gssgd bench model --calibrate runs/comm_1gbit --check runs/comm_100mbit --d 1e9

model: seconds per step = alpha * rounds       (latency-bound messages, critical path)
                        + beta(rate) * bytes    (busiest link; beta = max(beta0, 8/(eta*rate)))
                        + gamma[method] * d     (compute per element)
Calibration takes alpha from the runs' latency probes (or fits it, --fit-alpha), gamma
from their measured compute (per core: divided by the run's measured compute share),
and fits beta0 and eta to the step times minus their compute. Predictions assume a core
per worker. Writes model.json, tables.txt, model_vs_workers.png, model_vs_d.png and
model_fit.png to --out.

methods (--methods, comma-separated):
{methods}
"""

#: The what-if flags: the parameter and an example value.
_WHAT_IF = (("alpha", "2e-5 (20 us)"), ("beta0", "1e-10"), ("eta", "0.95"))


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench model`` under the ``bench`` group's subparsers."""
    parser = sub.add_parser(
        "model",
        help="fit the cost model to bench comm results and predict larger clusters",
        description=DESCRIPTION,
        epilog=EXAMPLES.format(methods=bench_args.listing(VARIANTS)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    _add_data_flags(parser.add_argument)
    _add_prediction_flags(parser.add_argument)
    return parser


def _add_data_flags(add: Callable[..., object]) -> None:
    """The measured runs: --calibrate (fitted on) and --check (reported on)."""
    add(
        "--calibrate",
        type=Path,
        nargs="+",
        default=[],
        metavar="DIR",
        help="bench comm output directories to fit on",
    )
    add(
        "--check",
        type=Path,
        nargs="+",
        default=[],
        metavar="DIR",
        help="further directories to report the error on (not fitted)",
    )


def _add_prediction_flags(add: Callable[..., object]) -> None:
    """What to predict, with what model, and where to write it: --methods, --density,
    --d, --workers, --rates, --fit-alpha, the what-if values and --out."""
    add(
        "--methods",
        type=bench_args.benchmark_methods(),
        default=None,
        help="comma-separated methods listed below to predict (default: those measured, else all)",
    )
    add(
        "--density",
        type=bench_args.density,
        default=None,
        help="density of the predictions (default: the measured runs', else 0.001)",
    )
    add(
        "--d",
        type=bench_args.count,
        default=10**8,
        help="gradient length of the time-vs-P predictions (default 1e8)",
    )
    add(
        "--workers",
        type=bench_args.count,
        default=64,
        help="P of the time-vs-d predictions (default 64)",
    )
    add(
        "--rates",
        type=bench_args.rates,
        default=PREDICTION_RATES,
        help="link rates to predict (default 100mbit,1gbit,10gbit,100gbit)",
    )
    add(
        "--fit-alpha",
        action="store_true",
        help="fit the per-round latency alpha instead of taking the runs' latency probes "
        "(4-byte all-gathers timed by bench comm)",
    )
    for name, example in _WHAT_IF:
        add(
            f"--{name}",
            type=bench_args.positive,
            default=None,
            help=f"predict with this {name} instead of the calibrated one (what-if), "
            f"e.g. {example}",
        )
    add(
        "--out",
        type=Path,
        default=Path("runs/bench_model"),
        help="output directory (default runs/bench_model)",
    )


def run(args: argparse.Namespace) -> int:
    """Fit, report and predict; 0 done, 2 a missing directory or a bad value."""
    return run_command("gssgd bench model", lambda: _run(args))


def _run(args: argparse.Namespace) -> None:
    model_report(
        args.calibrate,
        args.check,
        args.out,
        methods=args.methods,
        density=args.density,
        d=args.d,
        workers=args.workers,
        rates=args.rates,
        fit_alpha=args.fit_alpha,
        overrides={name: getattr(args, name) for name, _ in _WHAT_IF},
    )
