"""One worker process of ``gssgd bench comm``: times every method's aggregation step.

Started by :func:`gssgd_lab.comm_bench.run_comm_bench` as
``python -m gssgd_lab.comm_worker --config CONFIG --out DIR``, one process per rank,
with torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) in
its environment. Each worker:

1. joins a gloo process group and builds every method's aggregator (sharing one copy of
   each sketch shape's hash tables);
2. draws its gradient (:func:`synthetic_gradient`: seeded and heavy-tailed, so that every
   method compresses the same data);
3. runs ``warmup + repeats`` rounds; in each, every method steps once after a barrier,
   timed by wall clock (methods interleaved so that load from elsewhere on the machine
   spreads over all of them alike; the residuals evolve from step to step as in training);
4. closes every timed round with two probes: a latency probe (:func:`latency_probe`) and a
   compute probe (:func:`compute_probe`);
5. writes its per-step times, ``last_stats`` fields and probes to ``DIR/rank{r}.json``.

A worker that fails writes ``DIR/rank{r}.error.json`` (its traceback) for the parent to
report, and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gssgd.costmodel import MethodSpec

if TYPE_CHECKING:
    import torch

__all__ = ["STATS_FIELDS", "compute_probe", "latency_probe", "main", "synthetic_gradient"]

#: The fields of ``agg.last_stats`` each worker records per timed step.
STATS_FIELDS = (
    "bytes_sent",
    "bytes_received",
    "messages",
    "rounds",
    "seconds_compress",
    "seconds_communicate",
    "seconds_decompress",
)


def synthetic_gradient(d: int, rank: int, seed: int, k: int) -> torch.Tensor:
    """A heavy-tailed gradient for ``rank``: what the compressors see in training.

    Gaussian bulk (unit scale), plus ``max(1, k // 2)`` large coordinates shared by every
    rank (same indices and sign, magnitudes 20-60: the signal a global top-k should find)
    and as many large coordinates of this rank alone (magnitudes 10-30, random signs).

    Args:
        d: length; rank: this rank; seed: the run's seed; k: coordinates sent per rank.

    Returns:
        A float32 tensor of length ``d``, the same for the same arguments.
    """
    import torch

    heavy = min(d, max(1, k // 2))
    shared = torch.Generator().manual_seed(seed * 1_000_003 + 7)
    own = torch.Generator().manual_seed(seed * 1_000_003 + 1009 * (rank + 1))
    grad = torch.randn(d, generator=own)
    idx = torch.randperm(d, generator=shared)[:heavy]
    sign = torch.where(torch.rand(heavy, generator=shared) < 0.5, -1.0, 1.0)
    grad[idx] += sign * 20 * (1 + 2 * torch.rand(heavy, generator=own))
    own_idx = torch.randperm(d, generator=own)[:heavy]
    own_sign = torch.where(torch.rand(heavy, generator=own) < 0.5, -1.0, 1.0)
    grad[own_idx] += own_sign * 10 * (1 + 2 * torch.rand(heavy, generator=own))
    return grad


def latency_probe(world: int) -> float:
    """One all-gather of a 4-byte flag after a barrier: the control message every step
    starts with, ``P-1`` latency-bound rounds and no payload to speak of. Its time per
    round measures the cost model's alpha, under the run's own load."""
    import torch
    import torch.distributed as dist

    flag = torch.zeros(1, dtype=torch.int32)
    out = [torch.empty_like(flag) for _ in range(world)]
    dist.barrier()
    start = time.perf_counter()
    dist.all_gather(out, flag)
    return time.perf_counter() - start


def compute_probe(grad: torch.Tensor, k: int) -> tuple[float, float]:
    """How much slower compute runs with every rank computing at once than alone.

    A reference kernel (top-k of ``|grad|``, the core of every sparse method) is timed on
    each rank in turn while the others wait at a barrier (asleep), then on all ranks at
    once. Their ratio is the compute share: about ``workers / cores`` on an
    oversubscribed machine, more under memory-bandwidth contention or load from
    elsewhere, 1 with a core per worker.

    Returns:
        (seconds alone, seconds together) on this rank.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()

    def kernel() -> float:
        start = time.perf_counter()
        torch.topk(grad.abs(), k, sorted=False)
        return time.perf_counter() - start

    alone = 0.0
    for turn in range(world):
        dist.barrier()
        if turn == rank:
            alone = kernel()
    dist.barrier()
    return alone, kernel()


def _timed_rounds(
    cfg: dict[str, Any], specs: Sequence[MethodSpec], aggs: Sequence[Any], grad: torch.Tensor
) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[float]]]:
    """Run the interleaved rounds; returns (per-method records, probe times).

    Each record maps ``"wall"`` and every :data:`STATS_FIELDS` name to one value per timed
    step; warm-up steps are run but not recorded.
    """
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    k = max(1, round(cfg["density"] * cfg["d"]))
    records: dict[str, dict[str, list[float]]] = {
        s.name: {f: [] for f in ("wall", *STATS_FIELDS)} for s in specs
    }
    probes: dict[str, list[float]] = {"latency": [], "alone": [], "together": []}
    torch.topk(grad.abs(), k, sorted=False)  # the compute probe's first call
    for step in range(cfg["warmup"] + cfg["repeats"]):
        for spec, agg in zip(specs, aggs, strict=True):
            dist.barrier()
            start = time.perf_counter()
            agg.step(grad)
            wall = time.perf_counter() - start
            if step < cfg["warmup"]:
                continue
            rec = records[spec.name]
            rec["wall"].append(wall)
            for f in STATS_FIELDS:
                rec[f].append(getattr(agg.last_stats, f))
        if step >= cfg["warmup"]:  # probes in every round: the same load as the steps
            if world > 1:
                probes["latency"].append(latency_probe(world))
            alone, together = compute_probe(grad, k)
            probes["alone"].append(alone)
            probes["together"].append(together)
    return records, probes


def _work(config_path: Path, out_dir: Path) -> None:
    """One rank: join the group, build every method, run the rounds, write the records."""
    import torch
    import torch.distributed as dist

    from gssgd.aggregators import make_aggregator
    from gssgd.sketch import HashCache

    cfg = json.loads(config_path.read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=cfg["collective_timeout_s"]),
    )
    try:
        specs = [MethodSpec(**s) for s in cfg["specs"]]
        hashes = HashCache()  # one copy of each sketch shape's tables for all the methods
        aggs = [
            make_aggregator(s.aggregator, s.d, hashes=hashes, **s.aggregator_options())
            for s in specs
        ]
        k = max(1, round(cfg["density"] * cfg["d"]))
        grad = synthetic_gradient(cfg["d"], rank, cfg["seed"], k)
        records, probes = _timed_rounds(cfg, specs, aggs, grad)
        dist.barrier()
        tmp = out_dir / f"rank{rank}.json.tmp"
        tmp.write_text(json.dumps({"rank": rank, "methods": records, "probes": probes}))
        tmp.replace(out_dir / f"rank{rank}.json")
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    """The worker's command line; returns its exit status (1 after writing its error)."""
    parser = argparse.ArgumentParser(
        prog="python -m gssgd_lab.comm_worker",
        description="A worker of `gssgd bench comm` (started by it; not for direct use). "
        "Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment.",
    )
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "?")
    try:
        _work(args.config, args.out)
    except BaseException as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        err = {"rank": rank, "time": time.time(), "error": repr(exc), "traceback": tb}
        with contextlib.suppress(OSError):
            (args.out / f"rank{rank}.error.json").write_text(json.dumps(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
