"""The ``gssgd`` command: argparse with one small module per subcommand.

Each subcommand module exposes ``add_parser(subparsers, help)``, which registers its parser
(``help`` is its line in ``gssgd --help``) and sets ``run`` as the parser's default, and
``run(args) -> int``, the exit status.

Only the command typed is imported: ``gssgd --help``, ``gssgd --version`` and a mistyped
command answer without importing torch (a subcommand's module imports the training stack).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Collection, Sequence
from types import ModuleType

from gssgd import __version__
from gssgd.cli.errors import USAGE, Parser
from gssgd.plots import CLI_EXTRA

__all__ = ["SUBCOMMANDS", "build_parser", "main", "subcommand"]

#: The subcommands, in the order ``gssgd --help`` lists them, and each one's line there. To
#: add one: write gssgd/cli/NAME.py with ``add_parser`` and ``run``, list it here.
SUBCOMMANDS: dict[str, str] = {
    "train": "train with one method (spawns workers, or joins torchrun)",
    "compare": "train once per method and compare accuracy, bytes and time",
    "study": "compare methods on your model with an equal tuning budget each",
    "bench": "communication benchmarks and their cost model",
    "advise": "which method is fastest on your cluster, with the flags to use it",
}

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


def subcommand(name: str) -> ModuleType:
    """The module of subcommand ``name`` (imported now: it may import torch)."""
    return importlib.import_module(f"gssgd.cli.{name}")


def build_parser(full: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``gssgd`` parser.

    Args:
        full: the subcommands to give their flags (their modules are imported); the others
            are listed by name and line only. None: every one.
    """
    parser = Parser(
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
    for name, line in SUBCOMMANDS.items():
        if full is None or name in full:
            subcommand(name).add_parser(subparsers, line)
        else:
            subparsers.add_parser(name, help=line, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand.

    Args:
        argv: the arguments after the program name.

    Returns:
        The subcommand's exit status (argparse exits with 2 on invalid flags; 2 too when a
        package the subcommand needs is missing, see :data:`NEEDS`).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    typed = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    args = build_parser(() if typed is None else (typed,)).parse_args(argv)
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
