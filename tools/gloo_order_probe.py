"""Measure the order in which gloo's all-reduce adds the ranks' tensors, and check the
simulated world's sum (gssgd.simulated.gloo_ring_reduce) against it.

Usage (a few minutes on 2 cores; rerun it on a new torch to see whether gloo changed):

    .venv/bin/python tools/gloo_order_probe.py
    .venv/bin/python tools/gloo_order_probe.py --sizes 16,17 --lengths 1,7,17,33,100,1001

How: max(sizes) real gloo processes (file rendezvous; each smaller size is the subgroup of
the first ranks) all-reduce rank-specific random tensors, float32 and float16, whose
magnitudes are spread over a few powers of two so that the order of the additions shows
in the rounded sum, ``--seeds`` draws each. For every size, dtype and length it prints:

* ``ring``: gloo_ring_reduce equals gloo's result bitwise (every seed);
* ``rank order``: the sum in rank order 0, 1, ..., P-1 does (the simulated world's sum
  before it followed gloo);
* for lengths up to 60, the rank each element's sum starts from, read off the data: the
  one start ``s`` whose ring order (s, s-1, ..., s+1 mod P) matches gloo's result for
  every seed, ``?`` where the seeds leave several. Runs of equal starts are gloo's chunks.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gssgd.simulated import gloo_ring_reduce

DTYPES = (torch.float32, torch.float16)


def summand(rank: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rank ``rank``'s tensor: normal values times 2^e, e uniform in [-4, 4] (float16:
    [-2, 2]), so that most sums of P of them depend on the order of the additions."""
    g = torch.Generator().manual_seed(1_000_003 * seed + 7919 * n + rank)
    spread = 2 if dtype == torch.float16 else 4
    x = torch.randn(n, generator=g, dtype=torch.float64)
    return (x * torch.exp2(torch.randint(-spread, spread + 1, (n,), generator=g))).to(dtype)


def _worker(rank: int, world: int, rendezvous: str, out: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    groups = {p: dist.new_group(list(range(p))) if p < world else None for p in args.sizes}
    sums = {}
    for p, group in groups.items():
        if rank >= p:
            continue
        for dtype in DTYPES:
            for n in args.lengths:
                for seed in range(args.seeds):
                    t = summand(rank, n, dtype, seed)
                    dist.all_reduce(t, group=group)
                    sums[(p, str(dtype), n, seed)] = t
    if rank == 0:
        torch.save(sums, os.path.join(out, "sums.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _ring_order(xs: list[torch.Tensor], start: int) -> torch.Tensor:
    p = len(xs)
    acc = xs[start].clone()
    for step in range(1, p):
        acc += xs[(start - step) % p]
    return acc


def _in_rank_order(xs: list[torch.Tensor]) -> torch.Tensor:
    acc = xs[0].clone()
    for x in xs[1:]:
        acc += x
    return acc


def _starts(p: int, n: int, dtype: torch.dtype, seeds: int, got: dict) -> str:
    """The start rank of every element, as the seeds identify it (runs: ``rank x count``)."""
    alive = torch.ones(p, n, dtype=torch.bool)
    for seed in range(seeds):
        xs = [summand(r, n, dtype, seed) for r in range(p)]
        for s in range(p):
            alive[s] &= _ring_order(xs, s) == got[(p, str(dtype), n, seed)]
    marks = [str(int(alive[:, j].nonzero()[0])) if alive[:, j].sum() == 1 else "?"
             for j in range(n)]
    runs, first = [], 0
    for j in range(1, n + 1):
        if j == n or marks[j] != marks[first]:
            runs.append(f"{marks[first]}x{j - first}")
            first = j
    return " ".join(runs)


def report(args: argparse.Namespace, got: dict) -> None:
    for p in args.sizes:
        for dtype in DTYPES:
            for n in args.lengths:
                ring = rank_order = True
                for seed in range(args.seeds):
                    xs = [summand(r, n, dtype, seed) for r in range(p)]
                    want = got[(p, str(dtype), n, seed)]
                    ring &= torch.equal(gloo_ring_reduce(xs), want)
                    rank_order &= torch.equal(_in_rank_order(xs), want)
                line = f"P={p:3d} {str(dtype)[6:]:8s} n={n:<9d} ring {ring!s:5s} rank order {rank_order}"
                if n <= 60:
                    line += f"  starts: {_starts(p, n, dtype, args.seeds, got)}"
                print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    parser.add_argument("--sizes", type=ints, default=[2, 3, 5, 6, 7],
                        help="world sizes P (default 2,3,5,6,7)")
    parser.add_argument("--lengths", type=ints, default=[1, 2, 3, 7, 13, 37, 59, 1001, 3_000_001],
                        help="tensor lengths (default 1,2,3,7,13,37,59,1001,3000001)")
    parser.add_argument("--seeds", type=int, default=4, help="draws per case (default 4)")
    args = parser.parse_args()
    args.sizes = sorted(set(args.sizes))
    world = max(args.sizes)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(world, os.path.join(tmp, "rendezvous"), tmp, args),
                           nprocs=world, start_method="spawn")
        got = torch.load(os.path.join(tmp, "sums.pt"))
    print(f"torch {torch.__version__}: gloo's all-reduce against gssgd.simulated.gloo_ring_reduce")
    report(args, got)


if __name__ == "__main__":
    main()
