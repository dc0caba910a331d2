"""``gssgd bench``: communication benchmarks and the cost model fitted to them.

Subcommands:

* ``gssgd bench train``: train the same model once per method on the same emulated links
  (or loopback) and report throughput, compute vs communication per step, bytes, final
  accuracy and time to a target accuracy, with gs's ratios to every other method; write
  ``DIR/results.json``, ``DIR/table.txt`` and ``DIR/train.png``.
* ``gssgd bench comm``: time one aggregation step of every method on P local workers, on
  loopback or on emulated rate-limited links (network namespaces; needs root), and write
  ``DIR/results.json``, ``DIR/table.txt`` and ``DIR/comm.png``.
* ``gssgd bench model``: fit the cost model ``alpha * rounds + beta * bytes + gamma * d`` to
  ``bench comm`` results, report its error on every measured point, and predict the time
  per step for P = 2..1024 and d up to 1e9 at 0.1, 1, 10 and 100 Gbit/s.

The main program registers this module with ``add_parser(subparsers)``, which sets
``run`` as the parser's default, and calls ``args.run(args)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gssgd.aggregators.options import DEFAULT_ROWS
from gssgd.bench.cost_model import DEFAULT_METHODS, VARIANTS

__all__ = ["add_parser", "run"]

_BENCH_DESCRIPTION = """\
Communication benchmarks and their cost model:

  gssgd bench comm    time one aggregation step of every method on P local workers, on
                      loopback or on emulated rate-limited links (network namespaces;
                      needs root), and write DIR/results.json, table.txt and comm.png
  gssgd bench model   fit alpha*rounds + beta*bytes + gamma*d to bench comm results,
                      report its error on every measured point, and predict the time
                      per step for P = 2..1024 and d up to 1e9 at 0.1 to 100 Gbit/s
  gssgd bench train   train the same model once per method on the same emulated links
                      and report samples/s, compute vs overhead per step, bytes, final
                      accuracy and time to a target accuracy, with gs's ratios
"""

_TRAIN_DESCRIPTION = """\
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

_TRAIN_EXAMPLES = """\
examples:
  gssgd bench train --workers 4 --link 100mbit --dataset mnist --model cnn --density 0.001 \\
                    --steps 400 --eval-every 25 --target-accuracy 0.9 --out runs/train_100mbit
  gssgd bench train --workers 2 --link none --dataset digits --steps 20 --methods dense,gs

Methods run one after another (load from elsewhere on the machine is recorded in each
row). time/step is the median of rank 0's step (forward, backward with the exchange,
optimizer) over the steps after the trainer's warm-up; time to target is the running sum
of step times up to the first evaluation at or above the target (evaluations left out),
so --eval-every sets its resolution. Compute is slower when there are more workers than
cores: compare methods within one run.
"""

_COMM_DESCRIPTION = """\
Time agg.step of every method on P local gloo workers, on loopback or on emulated
rate-limited links, all in one run, and write DIR/results.json (per method:
seconds_per_step, its split, bytes per step, speedup_of_gs; plus _meta), DIR/table.txt
and DIR/comm.png.
"""

_MODEL_DESCRIPTION = """\
Fit the cost model to `gssgd bench comm` results (or use its documented defaults),
report the relative error on every measured point, and predict the time per step for
P = 2..1024 and d up to 1e9.
"""

_COMM_EXAMPLES = (
    """\
examples:
  gssgd bench comm --workers 4 --d 1000000 --density 0.001 --link 100mbit --out runs/comm_100mbit
  gssgd bench comm --workers 2 --d 1e5 --link none --methods dense,topk,gs --repeats 5

methods (--methods, comma-separated):
"""
    + "\n".join(f"  {name:<12} {text}" for name, text in VARIANTS.items())
    + """

Each method runs --warmup untimed then --repeats timed steps, interleaved with the others
and after a barrier. time/step is the median over steps of the slowest rank's agg.step;
'gs speed-up' is each method's time divided by gs's (> 1: gs is faster). With a link rate
every worker runs in its own network namespace behind a tbf-shaped veth (needs root;
without root the run says so and uses loopback instead). Compute is slower when there are
more workers than cores: compare methods within one run.
"""
)

_MODEL_EXAMPLES = """\
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
"""


def _count(text: str) -> int:
    """An integer that may be written 1000000, 1_000_000 or 1e6."""
    cleaned = text.strip().replace("_", "")
    try:
        value = float(cleaned) if "e" in cleaned.lower() else int(cleaned)
        whole = value == int(value)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number; write e.g. 1000000, 1_000_000 or 1e6"
        ) from None
    if not whole or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(value)


def _density(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"density {text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"density {text!r} must lie in (0, 1], e.g. 0.001 (k = round(density * d))"
        )
    return value


def _choose(text: str, valid: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in names if m not in valid]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown method(s) {unknown or text!r}; choose among {','.join(valid)}"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r} names a method twice; list each once")
    return names


def _methods(text: str) -> tuple[str, ...]:
    return _choose(text, list(VARIANTS))


def _train_methods(text: str) -> tuple[str, ...]:
    from gssgd.train.loop import METHODS

    return _choose(text, METHODS)


def _accuracy(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"target accuracy {text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"target accuracy {text!r} must lie in (0, 1], e.g. 0.9 for 90%"
        )
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0 seconds")
    return value


def _link(text: str) -> str:
    from gssgd.bench.netns import parse_link_rate

    try:
        parse_link_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip().lower()


def _rates(text: str) -> tuple[int, ...]:
    from gssgd.bench.netns import parse_link_rate

    out = []
    for part in text.split(","):
        try:
            rate = parse_link_rate(part)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if rate is None:
            raise argparse.ArgumentTypeError("--rates takes link rates such as 1gbit, not 'none'")
        out.append(rate)
    return tuple(out)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``bench`` (with ``comm`` and ``model``) to the main program's subcommands.

    Args:
        subparsers: what ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The ``bench`` parser (its namespace gets ``run=run``: the main program calls
        ``args.run(args)``).
    """
    bench = subparsers.add_parser(
        "bench",
        help="communication benchmarks and their cost model",
        description=_BENCH_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    sub = bench.add_subparsers(dest="bench_command", metavar="{comm,model,train}", required=True)

    comm = sub.add_parser(
        "comm",
        help="time one aggregation step of every method on P local workers",
        description=_COMM_DESCRIPTION,
        epilog=_COMM_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    comm.add_argument("--workers", type=_count, default=4, help="worker processes P (default 4)")
    comm.add_argument("--d", type=_count, default=1_000_000,
                      help="gradient length (default 1e6; 1e6 and 1_000_000 work)")  # fmt: skip
    comm.add_argument("--density", type=_density, default=0.001,
                      help="fraction of coordinates the sparse methods send (default 0.001)")  # fmt: skip
    comm.add_argument("--link", type=_link, default="1gbit",
                      help="every worker's link rate in each direction: 100mbit, 1gbit, 10gbit, "
                           "... or none for loopback (default 1gbit; a rate needs root)")  # fmt: skip
    comm.add_argument("--methods", type=_methods, default=DEFAULT_METHODS,
                      help=f"comma-separated methods (default: all, {','.join(DEFAULT_METHODS)})")  # fmt: skip
    comm.add_argument("--repeats", type=_count, default=20, help="timed steps per method (default 20)")  # fmt: skip
    comm.add_argument("--warmup", type=int, default=2,
                      help="untimed steps per method first; the first step also checks that "
                           "the ranks agree (default 2)")  # fmt: skip
    comm.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                      help=f"sketch rows, odd (default {DEFAULT_ROWS})")  # fmt: skip
    comm.add_argument("--cols", type=_count, default=None,
                      help="sketch columns (default: the aggregators' default, 40k capped at "
                           "d/(4 rows); gs-small uses a quarter)")  # fmt: skip
    comm.add_argument("--candidates", type=_count, default=None,
                      help="m: the sketch proposes m*k candidates (default: the aggregators' "
                           "default, 32 capped so m*k <= d/8)")  # fmt: skip
    comm.add_argument("--threads", type=_count, default=1, help="torch threads per worker (default 1)")  # fmt: skip
    comm.add_argument("--seed", type=int, default=0, help="seed of gradients and hashes (default 0)")  # fmt: skip
    comm.add_argument("--timeout", type=float, default=None,
                      help="seconds before the whole run is stopped (default: from the cost "
                           "model's estimate of the run, with a wide margin)")  # fmt: skip
    comm.add_argument("--out", type=Path, default=Path("runs/bench_comm"),
                      help="output directory (default runs/bench_comm)")  # fmt: skip

    model = sub.add_parser(
        "model",
        help="fit the cost model to bench comm results and predict larger clusters",
        description=_MODEL_DESCRIPTION,
        epilog=_MODEL_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    model.add_argument("--calibrate", type=Path, nargs="+", default=[], metavar="DIR",
                       help="bench comm output directories to fit on")  # fmt: skip
    model.add_argument("--check", type=Path, nargs="+", default=[], metavar="DIR",
                       help="further directories to report the error on (not fitted)")  # fmt: skip
    model.add_argument("--methods", type=_methods, default=None,
                       help="methods to predict (default: those measured, else all)")  # fmt: skip
    model.add_argument("--density", type=_density, default=None,
                       help="density of the predictions (default: the measured runs', else 0.001)")  # fmt: skip
    model.add_argument("--d", type=_count, default=10**8,
                       help="gradient length of the time-vs-P predictions (default 1e8)")  # fmt: skip
    model.add_argument("--workers", type=_count, default=64,
                       help="P of the time-vs-d predictions (default 64)")  # fmt: skip
    model.add_argument("--rates", type=_rates, default=(10**8, 10**9, 10**10, 10**11),
                       help="link rates to predict (default 100mbit,1gbit,10gbit,100gbit)")  # fmt: skip
    model.add_argument("--fit-alpha", action="store_true",
                       help="fit the per-round latency alpha instead of taking the runs' "
                            "latency probes (4-byte all-gathers timed by bench comm)")  # fmt: skip
    for name, example in (("alpha", "2e-5 (20 us)"), ("beta0", "1e-10"), ("eta", "0.95")):
        model.add_argument(f"--{name}", type=float, default=None,
                           help=f"predict with this {name} instead of the calibrated one "
                                f"(what-if), e.g. {example}")  # fmt: skip
    model.add_argument("--out", type=Path, default=Path("runs/bench_model"),
                       help="output directory (default runs/bench_model)")  # fmt: skip
    _add_train_parser(sub)
    bench.set_defaults(run=run)
    return bench


#: bench train's defaults where they differ from gssgd train's: the issue's setting, sized
#: to finish in about ten minutes on a 2-core machine at 100mbit.
TRAIN_DEFAULTS = {
    "workers": 4,
    "dataset": "mnist",
    "steps": 400,
    "eval_every": 25,
    "device": "cpu",
}
DEFAULT_TRAIN_DENSITY = 0.001


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    from gssgd.bench.train_bench import DEFAULT_METHODS as TRAIN_METHODS
    from gssgd.cli.train import Formatter, add_training_flags

    train = sub.add_parser(
        "train",
        help="train every method on the same emulated links: throughput and time to accuracy",
        description=_TRAIN_DESCRIPTION,
        epilog=_TRAIN_EXAMPLES,
        formatter_class=Formatter,
        allow_abbrev=False,
    )
    bench_group = train.add_argument_group("benchmark")
    bench_group.add_argument("--methods", type=_train_methods, default=TRAIN_METHODS,
                             help="comma-separated `gssgd train` methods, run in this order "
                                  f"(default {','.join(TRAIN_METHODS)})")  # fmt: skip
    bench_group.add_argument("--link", type=_link, default="100mbit",
                             help="every worker's link rate in each direction: 100mbit, 1gbit, "
                                  "... or none for loopback (default 100mbit; a rate needs root)")  # fmt: skip
    bench_group.add_argument("--target-accuracy", type=_accuracy, default=0.9,
                             help="the test accuracy whose first reaching is timed (default 0.9)")  # fmt: skip
    bench_group.add_argument("--method-timeout", type=_seconds, default=None, metavar="SECONDS",
                             help="stop a method's run after this long (default: from the run's "
                                  "size, generously; it only catches stalls)")  # fmt: skip
    bench_group.add_argument("--keep-checkpoints", action="store_true",
                             help="keep each run's final checkpoint (deleted by default)")  # fmt: skip
    bench_group.add_argument("--out", type=Path, default=Path("runs/bench_train"),
                             help="output directory (default runs/bench_train)")  # fmt: skip
    add_training_flags(train, compare=True)
    for action in train._actions:  # the trainer's help names its own defaults
        if action.dest == "density":
            action.help = (f"fraction of coordinates sent, k = max(1, round(density*d)) "
                           f"(topk, gtopk, sketched, gs; default {DEFAULT_TRAIN_DENSITY})")  # fmt: skip
        elif action.dest == "workers":
            action.help = "P, the worker processes (default 4)"
        elif action.dest == "progress":
            action.help = argparse.SUPPRESS  # the runs never show a progress bar
    train.set_defaults(**TRAIN_DEFAULTS)


def run(args: argparse.Namespace) -> int:
    """Run ``gssgd bench comm`` or ``gssgd bench model``.

    Returns:
        0 on success, 1 when a worker failed or timed out, 2 for a bad argument or input.
    """
    if args.bench_command == "comm":
        return _run_comm(args)
    if args.bench_command == "model":
        return _run_model(args)
    if args.bench_command == "train":
        return _run_train(args)
    print(f"unknown bench subcommand {args.bench_command!r}; use comm, model or train",
          file=sys.stderr)  # fmt: skip
    return 2


def _run_comm(args: argparse.Namespace) -> int:
    from gssgd.bench.comm_bench import CommBenchConfig, WorkerError, run_comm_bench

    try:
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
            threads=args.threads,
            seed=args.seed,
            timeout_s=args.timeout,
        )
    except ValueError as exc:
        print(f"gssgd bench comm: {exc}", file=sys.stderr)
        return 2
    try:
        run_comm_bench(cfg, args.out)
    except WorkerError as exc:
        print(f"gssgd bench comm failed: {exc}", file=sys.stderr)
        return 1
    except (RuntimeError, PermissionError) as exc:  # the emulated cluster could not be built
        print(f"gssgd bench comm could not set up the workers: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gssgd bench comm: interrupted; the workers were stopped", file=sys.stderr)
        return 130
    return 0


def _run_model(args: argparse.Namespace) -> int:
    from gssgd.bench.cost_model import model_report

    try:
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
            overrides={"alpha": args.alpha, "beta0": args.beta0, "eta": args.eta},
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"gssgd bench model: {exc}", file=sys.stderr)
        return 2
    return 0


def _run_train(args: argparse.Namespace) -> int:
    from gssgd.bench.train_bench import TrainBenchConfig, run_train_bench
    from gssgd.cli.train import settings_from_args
    from gssgd.train.launch import is_user_error
    from gssgd.train.loop import applies_to

    settings = settings_from_args(args)
    settings.pop("out", None)  # bench train's --out is the parent of the runs
    if settings.get("density") is None and settings.get("k") is None:
        settings["density"] = DEFAULT_TRAIN_DENSITY
    for name, value in settings.items():  # a flag none of the methods takes is a mistake
        if (
            value not in (None, False)
            and name != "density"
            and not (set(args.methods) & set(applies_to(name)))
        ):
            flag = "--" + name.replace("_", "-")
            print(f"gssgd bench train: {flag} applies to {', '.join(applies_to(name))}, none "
                  f"of which is in --methods {','.join(args.methods)}; drop {flag} or add such "
                  "a method", file=sys.stderr)  # fmt: skip
            return 2
    try:
        cfg = TrainBenchConfig(
            settings=settings,
            methods=tuple(args.methods),
            link=args.link,
            target_accuracy=args.target_accuracy,
            timeout_s=args.method_timeout,
            keep_checkpoints=args.keep_checkpoints,
        )
        results = run_train_bench(cfg, args.out)
    except (RuntimeError, PermissionError) as exc:  # the emulated cluster could not be built
        if not isinstance(exc, PermissionError) and is_user_error(exc):
            print(f"gssgd bench train: {exc}", file=sys.stderr)
            return 2
        print(f"gssgd bench train could not set up the workers: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gssgd bench train: interrupted; the workers were stopped", file=sys.stderr)
        return 130
    except Exception as exc:
        if not is_user_error(exc):
            raise
        print(f"gssgd bench train: {exc}", file=sys.stderr)
        return 2
    failed = [m for m in cfg.methods if results[m].get("status") != "completed"]
    if failed:
        print(f"gssgd bench train: {', '.join(failed)} did not complete; see "
              f"{args.out}/METHOD/logs/", file=sys.stderr)  # fmt: skip
        return 1
    return 0
