"""Time gs-SGD's density warm-up steps and steady steps on one process (the compute a
warm-up adds; a one-rank gloo group, so no link is involved), and count what they send.

Prints one JSON line: the median seconds of a warm-up step and of a steady step, and the
bytes the warm-up's steps would send on P = 16 workers (the traffic formula). Run it with
each version of the package on ``PYTHONPATH`` (``run.sh`` does, alternating them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

import gssgd
from gssgd.aggregators import build_options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--steady-steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'r')}",
                                rank=0, world_size=1)
        options = {"warmup_steps": args.warmup_steps, "warmup_density": 0.25}
        agg = gssgd.make_aggregator("gs", args.d, density=args.density, **options)
        gen = torch.Generator().manual_seed(0)
        times = []
        for _ in range(args.warmup_steps + args.steady_steps):
            grad = torch.randn(args.d, generator=gen)
            start = time.perf_counter()
            agg.step(grad)
            times.append(time.perf_counter() - start)
        dist.destroy_process_group()
    cls, k, opts = build_options("gs", args.d, args.density, 16, **options)
    sent = sum(max(cls.traffic(args.d, k, opts, 16, step=t).sent)
               for t in range(args.warmup_steps))
    print(json.dumps({
        "package": os.path.dirname(gssgd.__file__),
        "warmup_step_s": statistics.median(times[1:args.warmup_steps]),
        "warmup_total_s": sum(times[1:args.warmup_steps]),
        "steady_step_s": statistics.median(times[args.warmup_steps:]),
        "warmup_bytes_p16": sent,
    }))


if __name__ == "__main__":
    main()
