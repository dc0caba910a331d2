"""The ``gssgd`` command: argparse with one small module per subcommand.

Each subcommand module exposes ``add_parser(subparsers)``, which registers its parser and
sets ``run`` as the parser's default, and ``run(args) -> int``, the exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from gssgd import __version__
from gssgd.cli import bench, compare, train

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

#: The subcommands, in the order ``gssgd --help`` lists them. To add one: write
#: gssgd/cli/NAME.py with ``add_parser`` and ``run``, import it above, list it here.
SUBCOMMANDS: list[ModuleType] = [train, compare, bench]

DESCRIPTION = """\
gssgd: communication-efficient data-parallel training with global sketching (gs-SGD)
and the baselines it is measured against (dense, local/global Top-k, Sketched-SGD).

Run `gssgd COMMAND --help` for a command's flags.
"""

EPILOG = """\
examples:
  gssgd compare                                   # the main job: MNIST, 4 workers, 5 methods
  gssgd train --method gs --dataset digits --workers 2 --steps 50
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
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand.

    Args:
        argv: the arguments after the program name.

    Returns:
        The subcommand's exit status (argparse exits with 2 on invalid flags).
    """
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":  # python -m gssgd.cli.main (e.g. under torchrun)
    sys.exit(main())
