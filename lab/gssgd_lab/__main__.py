"""``python -m gssgd_lab COMMAND ...``: the lab's ``gssgd bench`` commands (``comm``,
``kernels``, ``train``) where the lab is on ``sys.path`` but not installed, so that no entry
point joins them to ``gssgd bench``: ``tools/gpu_check.sh`` runs ``kernels`` so on a machine
that has only torch and Triton."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gssgd_lab.cli import bench_comm, bench_kernels, bench_train

COMMANDS = {"comm": bench_comm, "kernels": bench_kernels, "train": bench_train}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` as ``gssgd bench`` would and run the command; its exit status."""
    parser = argparse.ArgumentParser(prog="python -m gssgd_lab", allow_abbrev=False)
    sub = parser.add_subparsers(dest="bench_command", metavar="{comm,kernels,train}",
                                required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return COMMANDS[args.bench_command].run(args)


if __name__ == "__main__":
    sys.exit(main())
