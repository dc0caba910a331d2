"""The ``gssgd`` command: argparse with one small module per subcommand.

Each subcommand module exposes ``add_parser(subparsers)``, which registers its parser and
sets ``run`` as the parser's default, and ``run(args) -> int``, the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from gssgd import __version__
from gssgd.cli import advise, bench, compare, study, train
from gssgd.cli.errors import USAGE
from gssgd.train.plots import CLI_EXTRA

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

#: The subcommands, in the order ``gssgd --help`` lists them. To add one: write
#: gssgd/cli/NAME.py with ``add_parser`` and ``run``, import it above, list it here.
SUBCOMMANDS: list[ModuleType] = [train, compare, study, bench, advise]

#: Packages of the ``gssgd[cli]`` extra a subcommand cannot finish without (its plots),
#: checked before it starts so that a long run never ends in a missing import. ``train``
#: needs none: without tqdm it runs with no progress bar.
NEEDS: dict[str, tuple[str, ...]] = {"compare": ("matplotlib",), "bench": ("matplotlib",),
                                     "study": ("matplotlib", "optuna")}

DESCRIPTION = """\
gssgd: communication-efficient data-parallel training with global sketching (gs-SGD)
and the baselines it is measured against (dense, local/global Top-k, Sketched-SGD).

Run `gssgd COMMAND --help` for a command's flags.
"""

EPILOG = """\
examples:
  gssgd compare                                   # the main job: MNIST, 4 workers, 6 methods
  gssgd train --method gs --dataset digits --workers 2 --steps 50
  gssgd study examples/user_model_study.toml      # every method, equal tuning budgets
  gssgd advise --params 25.6M --workers 64 --link 10gbit    # which method, for your cluster
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``gssgd`` parser with every subcommand of :data:`SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="gssgd",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"gssgd {__version__}")
    subparsers = parser.add_subparsers(
        title="commands", dest="command", metavar="COMMAND", required=True
    )
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand.

    Args:
        argv: the arguments after the program name.

    Returns:
        The subcommand's exit status (argparse exits with 2 on invalid flags; 2 too when a
        package the subcommand needs is missing, see :data:`NEEDS`).
    """
    args = build_parser().parse_args(argv)
    missing = missing_packages(NEEDS.get(args.command, ()))
    if missing:
        print(
            f"gssgd {args.command}: error: it needs {', '.join(missing)}, which is not "
            f"installed; install the command line's extras with {CLI_EXTRA}",
            file=sys.stderr,
        )
        return USAGE
    return args.run(args)


def missing_packages(names: Sequence[str]) -> list[str]:
    """The packages of ``names`` that cannot be imported."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


if __name__ == "__main__":  # python -m gssgd.cli.main (e.g. under torchrun)
    sys.exit(main())
