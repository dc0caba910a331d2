"""``gssgd bench train``: train the same model once per method on the same emulated links
(or loopback) and report throughput, compute vs overhead per step, bytes, final accuracy
and time to a target accuracy, with gs's ratios to every other method
(:func:`gssgd_lab.train_bench.run_train_bench`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gssgd.cli import bench_args
from gssgd.cli.errors import FAILED, CommandError, run_command
from gssgd.methods import METHODS, applies_to

__all__ = ["DEFAULT_DENSITY", "DEFAULTS", "add_parser", "run"]

DESCRIPTION = """\
End-to-end training on emulated links: one `gssgd train` run per method, every method
with the same model, data, batch, steps, seed and density. With a link rate each of the
P workers runs in its own network namespace behind a tbf-shaped veth, joined as a
torchrun-style group (needs root; without root the run says so and uses loopback); with
--link none, `gssgd train` spawns its workers on loopback itself. Writes
DIR/results.json (per method: seconds_per_step, samples_per_second,
seconds_compute_per_step, bytes_sent_per_step, final_test_accuracy, seconds_to_target,
gs's speed-ups; plus _meta), DIR/table.txt (also printed), DIR/train.png and each
method's run in DIR/METHOD/ (metrics.jsonl, summary.json, logs/).
"""

EXAMPLES = """\
examples:
  gssgd bench train --workers 4 --link 100mbit --dataset mnist --model cnn --density 0.001 \\
                    --steps 400 --eval-every 25 --target-accuracy 0.9 --out runs/train_100mbit
  gssgd bench train --workers 2 --link none --dataset digits --steps 20 --methods dense,gs

methods (--methods, comma-separated; a --plugin may register more):
{methods}

Methods run one after another (load from elsewhere on the machine is recorded in each
row). time/step is the median of rank 0's step (forward, backward with the exchange,
optimizer) over the steps after the trainer's warm-up; time to target is the running sum
of step times up to the first evaluation at or above the target (evaluations left out),
so --eval-every sets its resolution. Compute is slower when there are more workers than
cores: compare methods within one run.
"""

#: bench train's defaults where they differ from gssgd train's: MNIST CNN to 90% test accuracy at P = 4, sized
#: to finish in about ten minutes on a 2-core machine at 100mbit.
DEFAULTS: dict[str, Any] = {
    "workers": 4,
    "dataset": "mnist",
    "steps": 400,
    "eval_every": 25,
    "device": "cpu",
}
#: The density of the sparse methods unless --density or --k is given.
DEFAULT_DENSITY = 0.001


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench train`` under the ``bench`` group's subparsers: its own flags, then
    every ``gssgd train`` flag that applies to a comparison."""
    from gssgd.cli.train import Formatter, add_training_flags
    from gssgd_lab.train_bench_config import DEFAULT_METHODS

    parser = sub.add_parser(
        "train",
        help="train every method on the same emulated links: throughput and time to accuracy",
        description=DESCRIPTION,
        epilog=EXAMPLES.format(
            methods=bench_args.listing({m.name: m.summary for m in METHODS.values()})
        ),
        formatter_class=Formatter,
        allow_abbrev=False,
    )
    group = parser.add_argument_group("benchmark")
    add = group.add_argument
    add(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated methods listed below, run in this order (default "
        f"{','.join(DEFAULT_METHODS)})",
    )
    add(
        "--link",
        type=bench_args.link,
        default="100mbit",
        help="every worker's link rate in each direction: 100mbit, 1gbit, ... or none for "
        "loopback (default 100mbit; a rate needs root)",
    )
    add(
        "--target-accuracy",
        type=bench_args.accuracy,
        default=0.9,
        help="the test accuracy whose first reaching is timed (default 0.9)",
    )
    add(
        "--method-timeout",
        type=bench_args.seconds,
        default=None,
        metavar="SECONDS",
        help="stop a method's run after this long (default: from the run's size, "
        "generously; it only catches stalls)",
    )
    add(
        "--keep-checkpoints",
        action="store_true",
        help="keep each run's final checkpoint (deleted by default)",
    )
    add(
        "--out",
        type=Path,
        default=Path("runs/bench_train"),
        help="output directory (default runs/bench_train)",
    )
    add_training_flags(parser, compare=True)
    _retell_training_flags(parser)
    parser.set_defaults(parser=parser, **DEFAULTS)
    return parser


def _retell_training_flags(parser: argparse.ArgumentParser) -> None:
    """The trainer's flags whose help names its own defaults get bench train's."""
    sparse = ", ".join(applies_to("density"))
    for action in parser._actions:
        if action.dest == "density":
            action.help = (
                f"fraction of coordinates sent, k = max(1, round(density*d)) ({sparse}; "
                f"default {DEFAULT_DENSITY})"
            )
        elif action.dest == "workers":
            action.help = "P, the worker processes (default 4)"
        elif action.dest == "progress":
            action.help = argparse.SUPPRESS  # the runs never show a progress bar


def run(args: argparse.Namespace) -> int:
    """Train every method and report; 0 every method completed, 1 one did not (or the
    emulated cluster could not be built), 2 a bad setting, 130 interrupted.

    ``--methods`` is checked here, after ``--plugin`` modules registered their methods;
    a bad list exits through the parser (status 2), as a bad flag does.
    """
    from gssgd.cli.train import settings_from_args
    from gssgd.train.method_settings import import_plugins

    try:
        import_plugins(settings_from_args(args).get("plugins", ()))
        args.methods = bench_args.check_methods(args.methods, METHODS)
    except ValueError as exc:
        args.parser.error(str(exc))
    return run_command(
        "gssgd bench train",
        lambda: _run(args),
        failures=(RuntimeError,),  # the emulated cluster could not be built
        interrupted="the workers were stopped",
    )


def _run(args: argparse.Namespace) -> None:
    from gssgd.cli.train import settings_from_args
    from gssgd.train.method_settings import check_settings_apply
    from gssgd_lab.train_bench import run_train_bench
    from gssgd_lab.train_bench_config import TrainBenchConfig

    settings = settings_from_args(args)
    settings.pop("out", None)  # bench train's --out is the parent of the runs
    if settings.get("density") is None and settings.get("k") is None:
        settings["density"] = DEFAULT_DENSITY
    # A flag none of the methods takes is a mistake; the density is bench train's default.
    check_settings_apply({k: v for k, v in settings.items() if k != "density"}, args.methods)
    cfg = TrainBenchConfig(
        settings=settings,
        methods=tuple(args.methods),
        link=args.link,
        target_accuracy=args.target_accuracy,
        timeout_s=args.method_timeout,
        keep_checkpoints=args.keep_checkpoints,
    )
    results = run_train_bench(cfg, args.out)
    failed = [m for m in cfg.methods if results[m].get("status") != "completed"]
    if failed:
        raise CommandError(
            f"{', '.join(failed)} did not complete; see {args.out}/METHOD/logs/", FAILED
        )
