"""``gssgd bench``: communication, device and training benchmarks.

The group only wires its subcommands, one module each (``add_parser(sub)`` registers the
subcommand's parser, ``run(args)`` runs it and returns the exit status through
:func:`gssgd.cli.errors.run_command`):

* ``gssgd bench comm`` (:mod:`gssgd.cli.bench_comm`): time one aggregation step of every
  method on P local workers;
* ``gssgd bench device`` (:mod:`gssgd.cli.bench_device`): measure the device's compute
  constants of the cost model;
* ``gssgd bench kernels`` (:mod:`gssgd.cli.bench_kernels`): time the Triton kernels against
  the torch path they replace;
* ``gssgd bench train`` (:mod:`gssgd.cli.bench_train`): train every method on the same
  emulated links.

The main program registers this module with ``add_parser(subparsers)``, which sets
``run`` as the parser's default, and calls ``args.run(args)``.
"""

from __future__ import annotations

import argparse
from types import ModuleType

from gssgd.cli import bench_comm, bench_device, bench_kernels, bench_train

__all__ = ["SUBCOMMANDS", "add_parser", "run"]

#: Subcommand name -> its module, in the order ``gssgd bench --help`` lists them.
SUBCOMMANDS: dict[str, ModuleType] = {
    "comm": bench_comm,
    "device": bench_device,
    "kernels": bench_kernels,
    "train": bench_train,
}

DESCRIPTION = """\
Communication, device and training benchmarks (the step model they feed is fitted by
`gssgd advise --calibrate` on bench comm runs):

  gssgd bench comm    time one aggregation step of every method on P local workers, on
                      loopback or on emulated rate-limited links (network namespaces;
                      needs root), and write DIR/results.json, table.txt and comm.png
  gssgd bench device  measure this device's compute constants for the cost model
                      (top-k, sketching, PowerSGD's products, forward + backward)
  gssgd bench kernels time the Triton kernels (sketch, recovery, query, gather, top-k)
                      against the torch path, with CUDA events, and check their output
  gssgd bench train   train the same model once per method on the same emulated links
                      and report samples/s, compute vs overhead per step, bytes, final
                      accuracy and time to a target accuracy, with gs's ratios
"""


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
    sub = bench.add_subparsers(
        dest="bench_command", metavar="{" + ",".join(SUBCOMMANDS) + "}", required=True
    )
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    bench.set_defaults(run=run)
    return bench


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``gssgd bench`` subcommand and return its exit status."""
    return SUBCOMMANDS[args.bench_command].run(args)
