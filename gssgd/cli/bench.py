"""``gssgd bench``: communication benchmarks and the cost model fitted to them.

Subcommands:

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


def _methods(text: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in names if m not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown method(s) {unknown or text!r}; choose among {','.join(VARIANTS)}"
        )
    return names


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
    sub = bench.add_subparsers(dest="bench_command", metavar="{comm,model}", required=True)

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
    comm.add_argument("--rows", type=int, default=5, help="sketch rows, odd (default 5)")
    comm.add_argument("--cols", type=_count, default=None,
                      help="sketch columns (default: the aggregators' default, 10k capped at "
                           "d/(4 rows); gs-small uses a quarter)")  # fmt: skip
    comm.add_argument("--candidates", type=_count, default=None,
                      help="m: the sketch proposes m*k candidates (default: the aggregators' "
                           "default, 16 capped so m*k <= d/8)")  # fmt: skip
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
    bench.set_defaults(run=run)
    return bench


def run(args: argparse.Namespace) -> int:
    """Run ``gssgd bench comm`` or ``gssgd bench model``.

    Returns:
        0 on success, 1 when a worker failed or timed out, 2 for a bad argument or input.
    """
    if args.bench_command == "comm":
        return _run_comm(args)
    if args.bench_command == "model":
        return _run_model(args)
    print(f"unknown bench subcommand {args.bench_command!r}; use comm or model", file=sys.stderr)
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
