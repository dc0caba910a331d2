"""``gssgd bench``: benchmarks, one module per subcommand.

The wheel holds the one a user runs on their own machine:

* ``gssgd bench device`` (:mod:`gssgd.cli.bench_device`): measure the device's compute
  constants of the cost model (``gssgd advise --device`` reads the record).

The benchmarks that reproduce the project's studies (``comm``, ``train`` and ``kernels``:
every method on emulated rate-limited links in network namespaces, the Triton kernels
against the torch path) live in the lab beside the package (``lab/`` in the repository,
installed by ``bash scripts/setup.sh --dev``), and join this group through the entry points
of :data:`ENTRY_POINTS`: each names a module with ``add_parser(sub)``, which registers the
subcommand's parser, and ``run(args)``, which runs it and returns the exit status. A lab
command typed where the lab is not installed answers with how to install it.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from types import ModuleType

from gssgd.cli import bench_device
from gssgd.cli.errors import USAGE

__all__ = ["ENTRY_POINTS", "LAB", "add_parser", "run", "subcommands"]

#: The entry-point group through which installed packages add ``gssgd bench`` subcommands.
ENTRY_POINTS = "gssgd.bench"

#: The lab's subcommands and their lines in ``gssgd bench --help`` where it is missing.
LAB: dict[str, str] = {
    "comm": "time one aggregation step of every method on P local workers (lab)",
    "train": "train every method on the same emulated links (lab)",
    "kernels": "time the Triton kernels against the torch path (lab)",
}

LAB_MISSING = (
    "it comes with the lab, which is not installed: in a clone of the repository run "
    "`bash scripts/setup.sh --dev` (or `pip install -e lab/`)"
)

DESCRIPTION = """\
Benchmarks. In the wheel:

  gssgd bench device  measure this device's compute constants for the cost model
                      (top-k, sketching, PowerSGD's products, forward + backward)

With the lab (a clone's `bash scripts/setup.sh --dev`):

  gssgd bench comm    time one aggregation step of every method on P local workers, on
                      loopback or on emulated rate-limited links (network namespaces;
                      needs root), and write DIR/results.json, table.txt and comm.png
  gssgd bench kernels time the Triton kernels (sketch, recovery, query, gather, top-k)
                      against the torch path, with CUDA events, and check their output
  gssgd bench train   train the same model once per method on the same emulated links
                      and report samples/s, compute vs overhead per step, bytes, final
                      accuracy and time to a target accuracy, with gs's ratios
"""


def subcommands() -> dict[str, ModuleType]:
    """Subcommand name -> its module: ``device`` and every installed entry point's."""
    found = {"device": bench_device}
    for point in sorted(entry_points(group=ENTRY_POINTS), key=lambda p: p.name):
        found.setdefault(point.name, point.load())
    return found


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    """Add ``bench`` (with its subcommands) to the main program's subcommands.

    Args:
        subparsers: what ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The ``bench`` parser (its namespace gets ``run=run``: the main program calls
        ``args.run(args)``).
    """
    bench = subparsers.add_parser(
        "bench",
        help=summary,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    modules = subcommands()
    names = [*modules, *(name for name in LAB if name not in modules)]
    sub = bench.add_subparsers(dest="bench_command", metavar="{" + ",".join(names) + "}",
                               required=True)
    for module in modules.values():
        module.add_parser(sub)
    for name, line in LAB.items():
        if name not in modules:  # answers with how to install the lab, whatever the flags
            # (no prefix characters: every flag typed is one of its positional words)
            missing = sub.add_parser(name, help=line, add_help=False, prefix_chars="\0")
            missing.add_argument("words", nargs="*")
    bench.set_defaults(run=run)
    return bench


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``gssgd bench`` subcommand and return its exit status."""
    modules = subcommands()
    if args.bench_command not in modules:
        print(f"gssgd bench {args.bench_command}: error: {LAB_MISSING}", file=sys.stderr)
        return USAGE
    return modules[args.bench_command].run(args)
