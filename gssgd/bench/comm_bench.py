"""``gssgd bench comm``: the time of one aggregation step of every method, in one run.

(Longer than the project's ~500-line guide only by its docstrings, about 120 lines that
document results.json's fields; the code, one benchmark, is under 470 lines.)

What it measures: ``agg.step(grad)`` alone (no model, no optimizer) on P worker processes,
for every method, on a fixed synthetic gradient per rank, so that the only differences
between methods are their compression and their message patterns.

Steps:
    1. The parent resolves the methods (:func:`gssgd.costmodel.method_spec`), writes
       the configuration to ``DIR/workers/config.json`` and starts P worker processes of
       this module (``python -m gssgd.bench.comm_bench --config ... --out ...``):
       on loopback (``--link none``: rendezvous on 127.0.0.1) or each inside its own
       network namespace on a rate-limited link (:class:`gssgd.bench.netns.EmulatedCluster`).
    2. Every worker joins a gloo process group, builds every method's aggregator, and
       draws its gradient (seeded, heavy-tailed: Gaussian bulk plus a few large
       coordinates, some shared by all ranks and some its own). The residuals evolve from
       step to step as in training.
    3. ``warmup + repeats`` rounds; in each round every method runs one step, after a
       barrier, timed by wall clock on every rank. Methods are interleaved so that load
       from elsewhere on the machine spreads over all of them alike.
    4. Each worker writes its per-step times and ``last_stats`` to ``rank{r}.json``; the
       parent combines them: a step takes the slowest rank's wall time, and a method's
       ``seconds_per_step`` is the median of that over the timed steps. The split into
       compress / communicate / decompress / other is that of the rank with the most time
       outside collectives in each step (the critical path), median over steps; ``other``
       is the rest of its step (the non-finite guard, bookkeeping). Bytes per step are the
       mean over ranks (as ``gssgd compare`` reports them), the busiest rank's in
       ``*_max_per_step`` and every rank's in ``*_per_rank``.
    5. Two probes close every timed round: an all-gather of a 4-byte flag, whose time per
       round (``_meta.latency_probe.alpha``) is the cost model's per-message latency; and a
       top-k kernel timed on each rank alone and on all at once, whose ratio
       (``_meta.compute_probe.share``) says how much sharing the cores slowed compute.

A worker failure ends the run at once: the others are stopped and the earliest error (the
failing rank's traceback) is raised as :class:`WorkerError`. A stall ends at the timeout.

``DIR/results.json`` maps each method to ``seconds_per_step``, ``bytes_sent_per_step``,
``bytes_received_per_step`` (means over ranks), ``seconds_compress``,
``seconds_communicate``, ``seconds_decompress``, ``seconds_other`` and ``speedup_of_gs``
(this method's seconds / gs's: gs's speed-up over it; None when gs was not run), plus
``*_max_per_step``, ``*_per_rank``, ``rounds``, ``messages``, ``seconds_per_step_all``
and the method's ``spec`` (what :mod:`gssgd.costmodel` needs). ``_meta`` holds the
command line, P, d, k, density, link, threads, versions, machine, date and the probes.

Interpreting the numbers: on a machine with fewer cores than workers, compute times are
inflated (the workers share cores), and a rank that waits for a descheduled peer counts
the wait as communication. ``_meta`` records the core count, the load average and the
measured compute share.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gssgd.aggregators import build_options
from gssgd.aggregators.options import DEFAULT_ROWS
from gssgd.bench.netns import EmulatedCluster, have_root, parse_link_rate
from gssgd.bench.workers import WorkerError, namespaces_or_loopback, run_ranks
from gssgd.costmodel import (
    DEFAULT_METHODS,
    VARIANTS,
    CostModel,
    MethodSpec,
    method_spec,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "CommBenchConfig",
    "WorkerError",
    "run_comm_bench",
    "summarize",
    "synthetic_gradient",
]

_FIELDS = (
    "bytes_sent",
    "bytes_received",
    "messages",
    "rounds",
    "seconds_compress",
    "seconds_communicate",
    "seconds_decompress",
)


@dataclass(frozen=True)
class CommBenchConfig:
    """One ``gssgd bench comm`` run.

    Attributes:
        workers: P, the number of worker processes (>= 1).
        d: gradient length.
        density: fraction of coordinates the sparse methods send (k = round(density*d)).
        link: every worker's link rate ("100mbit", "1gbit", ...) or "none" for loopback.
        methods: benchmark method names (keys of :data:`gssgd.costmodel.VARIANTS`).
        repeats: timed steps per method; warmup: untimed steps before them.
        rows, cols, candidates: sketch shape and m (None: the aggregators' defaults).
        threads: torch intra-op threads per worker.
        seed: seed of the synthetic gradients and of the sketch hashes.
        timeout_s: the whole run's limit; None derives one from the cost model's defaults.

    Raises:
        ValueError: a value out of range; the message names it and the fix.
    """

    workers: int = 4
    d: int = 1_000_000
    density: float = 0.001
    link: str = "none"
    methods: tuple[str, ...] = DEFAULT_METHODS
    repeats: int = 20
    warmup: int = 2
    rows: int = DEFAULT_ROWS
    cols: int | None = None
    candidates: int | None = None
    threads: int = 1
    seed: int = 0
    timeout_s: float | None = None
    specs: tuple[MethodSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_int("workers", self.workers, 1, 254, "e.g. --workers 4")
        _check_int("d", self.d, 1, None, "e.g. --d 1000000")
        _check_int("repeats", self.repeats, 1, 100_000, "e.g. --repeats 10")
        _check_int("warmup", self.warmup, 0, 100_000, "e.g. --warmup 2")
        _check_int("threads", self.threads, 1, 1024, "e.g. --threads 1")
        _check_int("seed", self.seed, 0, None, "e.g. --seed 0")
        parse_link_rate(self.link)  # raises with the valid forms
        if not self.methods:
            raise ValueError(f"methods is empty; choose among {', '.join(VARIANTS)}")
        dupes = sorted({m for m in self.methods if self.methods.count(m) > 1})
        if dupes:
            raise ValueError(f"methods {dupes} are listed twice; list each method once")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s!r} must be > 0 seconds (or None)")
        specs = tuple(
            method_spec(
                name,
                self.d,
                self.density,
                rows=self.rows,
                cols=self.cols,
                candidates=self.candidates,
                seed=self.seed,
            )
            for name in self.methods
        )  # validates names, density, rows, cols
        for spec in specs:  # validates the options exactly as the workers will
            build_options(spec.aggregator, spec.d, None, **spec.aggregator_options())
        object.__setattr__(self, "specs", specs)

    @property
    def link_bps(self) -> int | None:
        return parse_link_rate(self.link)

    @property
    def k(self) -> int:
        return max(1, round(self.density * self.d))

    def command_line(self) -> str:
        """The ``gssgd bench comm`` command that reproduces this run."""
        parts = [
            f"gssgd bench comm --workers {self.workers} --d {self.d} --density {self.density:g}",
            f"--link {self.link} --methods {','.join(self.methods)}",
            f"--repeats {self.repeats} --warmup {self.warmup} --rows {self.rows}",
            *([f"--cols {self.cols}"] if self.cols is not None else []),
            *([f"--candidates {self.candidates}"] if self.candidates is not None else []),
            f"--threads {self.threads} --seed {self.seed}",
        ]
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("specs", None)
        out["methods"] = list(self.methods)
        return out


def _check_int(name: str, value: object, low: int, high: int | None, fix: str) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        valid = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"{name}={value!r} is invalid: it must be {valid}; {fix}")


# --------------------------------------------------------------------------- the worker


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


def _worker(config_path: Path, out_dir: Path) -> None:
    """One rank: join the group, build every method, run the interleaved timed steps."""
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
        records: dict[str, dict[str, list[float]]] = {
            s.name: {f: [] for f in ("wall", *_FIELDS)} for s in specs
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
                for f in _FIELDS:
                    rec[f].append(getattr(agg.last_stats, f))
            if step >= cfg["warmup"]:  # probes in every round: the same load as the steps
                if world > 1:
                    probes["latency"].append(_latency_probe(world))
                alone, together = _compute_probe(grad, k)
                probes["alone"].append(alone)
                probes["together"].append(together)
        dist.barrier()
        tmp = out_dir / f"rank{rank}.json.tmp"
        tmp.write_text(json.dumps({"rank": rank, "methods": records, "probes": probes}))
        tmp.replace(out_dir / f"rank{rank}.json")
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _latency_probe(world: int) -> float:
    """One all-gather of a 4-byte flag after a barrier: the control message every step
    starts with, ``P-1`` latency-bound rounds and no payload to speak of. Its time per
    round measures the model's alpha, under the run's own load."""
    import torch
    import torch.distributed as dist

    flag = torch.zeros(1, dtype=torch.int32)
    out = [torch.empty_like(flag) for _ in range(world)]
    dist.barrier()
    start = time.perf_counter()
    dist.all_gather(out, flag)
    return time.perf_counter() - start


def _compute_probe(grad: torch.Tensor, k: int) -> tuple[float, float]:
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


def _worker_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gssgd.bench.comm_bench",
        description="A worker of `gssgd bench comm` (started by it; not for direct use). "
        "Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment.",
    )
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "?")
    try:
        _worker(args.config, args.out)
    except BaseException as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        err = {"rank": rank, "time": time.time(), "error": repr(exc), "traceback": tb}
        with contextlib.suppress(OSError):
            (args.out / f"rank{rank}.error.json").write_text(json.dumps(err))
        return 1
    return 0


# --------------------------------------------------------------------------- the parent


def _estimates(cfg: CommBenchConfig) -> tuple[float, float]:
    """(whole-run timeout, collective timeout) in seconds, from the default cost model,
    with compute slowed by the workers sharing the cores."""
    model = CostModel.default()
    share = max(1.0, cfg.workers * cfg.threads / (os.cpu_count() or 1))
    step_s = [model.predict(s, cfg.workers, cfg.link_bps, share).total for s in cfg.specs]
    run_s = (cfg.warmup + cfg.repeats) * sum(step_s) + 2.0 * share * len(step_s)  # + setup
    whole = cfg.timeout_s if cfg.timeout_s is not None else 120.0 + 5.0 * run_s
    collective = max(60.0, 20.0 * max(step_s))
    return whole, collective


def _launch(
    cfg: CommBenchConfig, work: Path, argv: list[str], namespaces: bool, timeout_s: float
) -> None:
    """Run the P workers to completion, in their namespaces or on loopback."""
    hint = "Raise --timeout, or lower --repeats/--d."
    if namespaces:
        with EmulatedCluster(cfg.workers, cfg.link) as cluster:
            run_ranks(cfg.workers, argv, work, timeout_s, cluster=cluster, threads=cfg.threads,
                      hint=hint)  # fmt: skip
    else:
        run_ranks(cfg.workers, argv, work, timeout_s, threads=cfg.threads, hint=hint)


def run_comm_bench(
    cfg: CommBenchConfig,
    out_dir: str | Path,
    *,
    command: str | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the benchmark and write ``out_dir/results.json``, ``table.txt`` and ``comm.png``.

    Args:
        cfg: the run.
        out_dir: created if missing; ``out_dir/workers/`` keeps the workers' logs and raw
            per-rank records.
        command: the command line to record in ``_meta`` (default: the ``gssgd bench comm``
            command that reproduces the run, see :meth:`CommBenchConfig.command_line`).
        echo: where progress and the table go.

    Returns:
        The results mapping (as written to results.json).

    Raises:
        WorkerError: a worker failed (its traceback is in the message) or the run timed out.
    """
    from gssgd.bench import report

    out = Path(out_dir)
    work = out / "workers"
    work.mkdir(parents=True, exist_ok=True)
    for stale in (*work.glob("rank*.json"), *work.glob("rank*.error.json")):
        stale.unlink()
    link_requested = cfg.link
    cfg_run, namespaces = namespaces_or_loopback(cfg, echo, have_root())
    timeout_s, collective_s = _estimates(cfg_run)
    payload = {
        **cfg_run.to_json(),
        "specs": [s.as_dict() for s in cfg_run.specs],
        "collective_timeout_s": collective_s,
    }
    (work / "config.json").write_text(json.dumps(payload, indent=1))
    argv = [
        sys.executable,
        "-m",
        "gssgd.bench.comm_bench",
        "--config",
        str((work / "config.json").resolve()),
        "--out",
        str(work.resolve()),
    ]
    where = f"namespaces on {cfg_run.link} links" if namespaces else "loopback"
    echo(
        f"bench comm: {cfg_run.workers} workers ({where}), d={cfg_run.d:,}, k={cfg_run.k:,}, "
        f"{len(cfg_run.methods)} methods x ({cfg_run.warmup} warm-up + {cfg_run.repeats} timed) "
        f"steps; timeout {timeout_s:.0f} s"
    )
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    _launch(cfg_run, work, argv, namespaces, timeout_s)
    elapsed = time.monotonic() - start
    ranks = [json.loads((work / f"rank{r}.json").read_text()) for r in range(cfg_run.workers)]
    meta = _meta(cfg_run, link_requested, namespaces, command or cfg.command_line(), elapsed)
    meta["load_average_1min_before"] = round(load_before, 2)
    results = summarize(ranks, cfg_run.specs, meta)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    table = report.comm_table(results)
    (out / "table.txt").write_text(table + "\n")
    report.plot_comm(results, out / "comm.png")
    echo(table)
    echo(f"wrote {out / 'results.json'}, {out / 'table.txt'}, {out / 'comm.png'}")
    return results


def _meta(
    cfg: CommBenchConfig,
    link_requested: str,
    namespaces: bool,
    command: str,
    elapsed: float,
) -> dict[str, Any]:
    import torch

    return {
        "command": command,
        "workers": cfg.workers,
        "d": cfg.d,
        "k": cfg.k,
        "density": cfg.density,
        "link": cfg.link,
        "link_requested": link_requested,
        "link_bps": cfg.link_bps,
        "mode": "namespaces" if namespaces else "loopback",
        "threads": cfg.threads,
        "repeats": cfg.repeats,
        "warmup": cfg.warmup,
        "rows": cfg.rows,
        "cols": cfg.cols,
        "candidates": cfg.candidates,
        "seed": cfg.seed,
        "methods": list(cfg.methods),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds_total": round(elapsed, 2),
        "load_average_1min_after": round(os.getloadavg()[0], 2),
        "timing": "seconds_per_step: median over timed steps of the slowest rank's wall time "
        "of agg.step; compress/communicate/decompress/other: median of the split of the rank "
        "with the most time outside collectives in each step; bytes: mean over ranks "
        "(*_max_per_step: the busiest rank), median over steps",
    }


def _method_row(recs: Sequence[dict[str, list[float]]], spec: MethodSpec) -> dict[str, Any]:
    """One method's ``results.json`` entry from every rank's per-step records."""
    steps = len(recs[0]["wall"])
    wall = [max(rec["wall"][s] for rec in recs) for s in range(steps)]
    split: dict[str, list[float]] = {p: [] for p in ("compress", "communicate", "decompress")}
    other = []
    for s in range(steps):
        # The critical path's rank: the most time outside collectives in this step.
        rep = max(recs, key=lambda rec: rec["wall"][s] - rec["seconds_communicate"][s])
        for part in split:
            split[part].append(rep[f"seconds_{part}"][s])
        other.append(max(0.0, rep["wall"][s] - sum(rep[f"seconds_{p}"][s] for p in split)))
    sent = [int(statistics.median(rec["bytes_sent"])) for rec in recs]
    received = [int(statistics.median(rec["bytes_received"])) for rec in recs]
    return {
        "seconds_per_step": statistics.median(wall),
        "bytes_sent_per_step": statistics.mean(sent),
        "bytes_received_per_step": statistics.mean(received),
        "bytes_sent_max_per_step": max(sent),
        "bytes_received_max_per_step": max(received),
        "seconds_compress": statistics.median(split["compress"]),
        "seconds_communicate": statistics.median(split["communicate"]),
        "seconds_decompress": statistics.median(split["decompress"]),
        "seconds_other": statistics.median(other),
        "speedup_of_gs": None,
        "rounds": max(int(statistics.median(rec["rounds"])) for rec in recs),
        "messages": max(int(statistics.median(rec["messages"])) for rec in recs),
        "bytes_sent_per_rank": sent,
        "bytes_received_per_rank": received,
        "seconds_per_step_all": wall,
        "description": VARIANTS[spec.name],
        "spec": spec.as_dict(),
    }


def _probe_summaries(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The latency and compute probes' summaries, for ``_meta`` (where they ran)."""
    out: dict[str, Any] = {}
    probes = [r.get("probes") or {} for r in ranks]
    latency = [p.get("latency") or [] for p in probes]
    if len(ranks) > 1 and all(latency):
        per_step = [max(p[s] for p in latency) for s in range(min(map(len, latency)))]
        seconds = statistics.median(per_step)
        out["latency_probe"] = {
            "what": "all-gather of a 4-byte flag after a barrier, once per timed round: "
            "median over rounds of the slowest rank; alpha = seconds / rounds",
            "seconds": seconds,
            "rounds": len(ranks) - 1,
            "alpha": seconds / (len(ranks) - 1),
        }
    if all(p.get("alone") and p.get("together") for p in probes):
        alone = statistics.median(t for p in probes for t in p["alone"])
        together = statistics.median(t for p in probes for t in p["together"])
        out["compute_probe"] = {
            "what": "top-k of |grad| timed on each rank alone, then on all ranks at once, "
            "once per timed round (medians over ranks and rounds); share = together / alone",
            "seconds_alone": alone,
            "seconds_together": together,
            "share": max(1.0, together / alone) if alone > 0 else 1.0,
        }
    return out


def summarize(
    ranks: Sequence[dict[str, Any]], specs: Sequence[MethodSpec], meta: dict[str, Any]
) -> dict[str, Any]:
    """Combine the workers' records into ``results.json``'s mapping.

    Args:
        ranks: each rank's ``{"rank": r, "methods": {name: {field: [per step]}}}``.
        specs: the methods, in run order.
        meta: the ``_meta`` entry.

    Returns:
        ``{method: {...}, "_meta": meta}``; see :mod:`gssgd.bench.comm_bench`.
    """
    ranks = sorted(ranks, key=lambda r: r["rank"])
    results: dict[str, Any] = {
        spec.name: _method_row([r["methods"][spec.name] for r in ranks], spec) for spec in specs
    }
    if "gs" in results:
        gs_s = results["gs"]["seconds_per_step"]
        for row in results.values():
            ratio = row["seconds_per_step"] / gs_s if gs_s > 0 else math.inf
            row["speedup_of_gs"] = ratio
    meta = {**meta, **_probe_summaries(ranks)}
    results["_meta"] = meta
    return results


if __name__ == "__main__":
    sys.exit(_worker_main())
