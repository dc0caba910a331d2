"""``gssgd bench comm``: the time of one aggregation step of every method, in one run.

What it measures: ``agg.step(grad)`` alone (no model, no optimizer) on P worker processes,
for every method, on a fixed synthetic gradient per rank, so that the only differences
between methods are their compression and their message patterns.

Steps:
    1. The parent resolves the methods (:class:`~gssgd_lab.comm_config.CommBenchConfig`),
       writes the configuration to ``DIR/workers/config.json`` and starts P worker
       processes (:mod:`gssgd_lab.comm_worker`): on loopback (``--link none``:
       rendezvous on 127.0.0.1) or each inside its own network namespace on a
       rate-limited link (:class:`gssgd_lab.cluster.EmulatedCluster`).
    2. Every worker times ``warmup + repeats`` interleaved rounds of every method, closes
       each timed round with a latency and a compute probe, and writes its records to
       ``rank{r}.json``.
    3. The parent combines the records into ``DIR/results.json``
       (:mod:`gssgd_lab.comm_summary`, which documents its fields), prints the table and
       draws ``DIR/comm.png`` (:mod:`gssgd_lab.comm_report`).

A worker failure ends the run at once: the others are stopped and the earliest error (the
failing rank's traceback) is raised as :class:`~gssgd_lab.workers.WorkerError`. A stall
ends at the timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gssgd.costmodel import emulated_step_seconds
from gssgd_lab.cluster import EmulatedCluster, have_root
from gssgd_lab.comm_config import CommBenchConfig
from gssgd_lab.comm_summary import run_meta, summarize
from gssgd_lab.workers import namespaces_or_loopback, run_ranks

__all__ = ["run_comm_bench"]


def _estimates(cfg: CommBenchConfig) -> tuple[float, float]:
    """(whole-run timeout, collective timeout) in seconds, from the step model's time on
    this machine's emulated links, with compute slowed by the workers sharing the cores."""
    share = max(1.0, cfg.workers * cfg.threads / (os.cpu_count() or 1))
    step_s = [emulated_step_seconds(s, cfg.workers, cfg.link_bps, share) for s in cfg.specs]
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


def _prepare_workers(cfg: CommBenchConfig, work: Path, collective_s: float) -> list[str]:
    """Clear ``work`` of an earlier run's records, write the workers' ``config.json``, and
    return the command every worker runs."""
    work.mkdir(parents=True, exist_ok=True)
    for stale in (*work.glob("rank*.json"), *work.glob("rank*.error.json")):
        stale.unlink()
    payload = {
        **cfg.to_json(),
        "specs": [s.as_dict() for s in cfg.specs],
        "collective_timeout_s": collective_s,
    }
    (work / "config.json").write_text(json.dumps(payload, indent=1))
    return [
        sys.executable,
        "-m",
        "gssgd_lab.comm_worker",
        "--config",
        str((work / "config.json").resolve()),
        "--out",
        str(work.resolve()),
    ]


def _write_outputs(results: dict[str, Any], out: Path, echo: Callable[[str], None]) -> None:
    """Write ``results.json``, ``table.txt`` and ``comm.png``, and echo the table."""
    from gssgd_lab.comm_report import comm_table, plot_comm

    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    table = comm_table(results)
    (out / "table.txt").write_text(table + "\n")
    plot_comm(results, out / "comm.png")
    echo(table)
    echo(f"wrote {out / 'results.json'}, {out / 'table.txt'}, {out / 'comm.png'}")


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
    out = Path(out_dir)
    work = out / "workers"
    cfg_run, namespaces = namespaces_or_loopback(cfg, echo, have_root())
    timeout_s, collective_s = _estimates(cfg_run)
    argv = _prepare_workers(cfg_run, work, collective_s)
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
    meta = run_meta(cfg_run, cfg.link, namespaces, command or cfg.command_line(), elapsed)
    meta["load_average_1min_before"] = round(load_before, 2)
    results = summarize(ranks, cfg_run.specs, meta)
    _write_outputs(results, out, echo)
    return results
