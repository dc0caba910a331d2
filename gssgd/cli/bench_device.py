"""``gssgd bench device``: measure this machine's compute constants for the cost model
(:func:`gssgd.bench.device_bench.measure_device`) and store them as a device record."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gssgd.cli import bench_args
from gssgd.cli.errors import run_command

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Measure the compute constants the cost model prices a method's compression with, on this
machine's GPU (or CPU): a pass over the vector, top-k, a sketch row, the sketch's recovery,
PowerSGD's products per unit of rank, and forward + backward per parameter of a reference
model (torchvision's ResNet-50 on a GPU). Prints the record; --write NAME stores it as
device NAME in the package's gssgd/costmodel/data/devices.json (a source checkout), which
`gssgd advise --device NAME` then uses.
"""

EXAMPLES = """\
examples:
  gssgd bench device                           # print this machine's record
  gssgd bench device --write h200              # store it (run on the H200)
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench device`` under the ``bench`` group's subparsers."""
    parser = sub.add_parser(
        "device",
        help="measure this device's compute constants for the cost model",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--device", choices=("cuda", "cpu"), default=None, help="default: CUDA if available")
    add("--d", type=bench_args.count, default=25_557_032,
        help="gradient length the constants are measured at (default ResNet-50's)")
    add("--repeats", type=bench_args.count, default=20, help="timed runs per operation")
    add("--warmup", type=int, default=3, help="untimed runs first")
    add("--write", metavar="NAME", default=None,
        help="store the record as device NAME in gssgd/costmodel/data/devices.json")
    add("--json", type=Path, default=None, help="also write the record to this file")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Measure, print, store; 0 done, 2 a bad value."""
    return run_command("gssgd bench device", lambda: _run(args))


def _run(args: argparse.Namespace) -> None:
    from gssgd.bench.device_bench import measure_device
    from gssgd.costmodel import store

    record = measure_device(args.device, args.d, args.repeats, args.warmup)
    text = json.dumps(record, indent=1, sort_keys=True)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    if args.write:
        data = json.loads((store.DATA_DIR / "devices.json").read_text())
        old = data["devices"].get(args.write, {})
        kept = {k: v for k, v in old.items() if k in ("overlap_efficiency", "fwdbwd_s")}
        data["devices"][args.write] = {**kept, **record}
        print(f"wrote device {args.write!r} to {store.write('devices.json', data)}")
