"""``gssgd study SPEC.toml``: a fair study of methods on your model, with one trial budget
for every method (:mod:`gssgd.study`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gssgd.cli.errors import run_command

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Search every method of a spec with the same number of trials (Optuna), re-run each
method's best setting at every seed, and write which method reaches the target with the
fewest bytes and in the least modeled time at 1 and 10 Gbit/s (summary.json, summary.md,
curves.png). Running the same command again continues a killed study where it stopped.
"""

EPILOG = """\
examples:
  gssgd study examples/user_model_study.toml            # a small one, about a minute
  gssgd study studies/equal_budget/specs/mnist_p16.toml
A spec names the data and model (as --dataset/--model, MODULE:FUNCTION too), workers,
steps, the target and each method's knobs (the commented example shows every key).
"""


def add_parser(sub: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    """Register ``study``."""
    parser = sub.add_parser(
        "study", help=summary,
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("spec", type=Path, help="the study's spec file (TOML)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the study's directory (default runs/study-<name>)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="train N runs at once (N methods for a TPE search), each in "
                             "its own process (default 1; the summary is the same; each "
                             "real-process run starts its workers, so N multiplies them)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the study; exit 0 with the summary's path, 1 when a trial fails, 2 on a bad
    spec."""
    return run_command("gssgd study", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from gssgd.study.runner import run_study, runs_cost
    from gssgd.study.spec import load_spec

    spec = load_spec(args.spec)
    out = args.out or Path("runs") / f"study-{spec.name}"
    print(f"gssgd study: {spec.name}: {spec.trials} runs planned ({spec.sampler}"
          + (", more where a best sits on an edge of the lr grid" if spec.lr_grid else "")
          + ")", flush=True)
    run_study(spec, out, progress=args.progress, jobs=args.jobs)
    print((out / "summary.md").read_text())
    runs, hours = runs_cost(out)
    print(f"gssgd study: {runs} runs, {hours:.2f} CPU-hours (each run's wall time x its "
          "processes)")
    print(f"gssgd study: wrote {out / 'summary.json'}, {out / 'summary.md'}, "
          f"{out / 'curves.png'}")
    return 0
