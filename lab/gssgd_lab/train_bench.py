"""``gssgd bench train``: end-to-end training of every method on the same emulated links.

``gssgd bench comm`` times one aggregation step in isolation; this benchmark trains the
real model, so that what a method saves on the wire is weighed against what it costs in
compression and in accuracy per step. It answers: how many samples per second does each
method train on a slow network, and how soon does each reach a target test accuracy?

Steps:
    1. The parent checks every method's settings
       (:class:`~gssgd_lab.train_bench_config.TrainBenchConfig`: one
       :class:`gssgd.train.loop.TrainConfig` each, the same model, data, batch, steps, seed
       and density for all), loads the data once to learn the model's size, and builds one
       :class:`gssgd_lab.cluster.EmulatedCluster` of P namespaces on links of the given
       rate, kept for all methods (needs root; without root it says so and uses loopback).
    2. For each method in turn, one ``gssgd train`` run into ``DIR/METHOD/``: P
       processes ``python -m gssgd.cli.main train ...``, rank r inside namespace r with
       torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_PORT``,
       ``MASTER_ADDR`` = rank 0's address, ``GLOO_SOCKET_IFNAME`` = its veth), so that
       the trainer joins their group and all its traffic crosses the shaped links. With
       ``--link none`` it is a single ``gssgd train --workers P`` that spawns its own
       workers on loopback. Logs go to ``DIR/METHOD/logs/``; a failing or stalled
       run is stopped (:mod:`gssgd_lab.workers`) and the next method runs.
    3. Each run's ``metrics.jsonl`` and ``summary.json`` become its row
       (:mod:`gssgd_lab.train_summary`, which documents the fields and the training
       clock).
    4. ``DIR/results.json`` (those per method, plus ``_meta``: command, machine, date,
       load averages), ``DIR/table.txt`` (also printed) and ``DIR/train.png`` (test
       accuracy against training time per method; time per step split into compute and
       overhead; :mod:`gssgd_lab.train_report`).

Methods run one after another, so load from elsewhere on the machine can favour some;
``_meta`` and every method's row record the load average around it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gssgd_lab.cluster import EmulatedCluster, have_root
from gssgd_lab.train_bench_config import TrainBenchConfig, train_argv
from gssgd_lab.train_summary import NO_SUMMARY, summarize, summarize_run
from gssgd_lab.workers import (
    MASTER_PORT_NETNS,
    WorkerError,
    namespaces_or_loopback,
    run_process,
    run_ranks,
)

__all__ = ["run_train_bench"]

#: How the figures of ``results.json`` are made, recorded in its ``_meta``.
TIMING_NOTE = (
    "seconds_per_step: median over the measured steps (after the trainer's "
    "warm-up) of rank 0's seconds_step; compute: median of seconds_compute (step minus "
    "the comm hook's time; for DDP's built-in all-reduce it includes the communication, "
    "and the overhead is estimated from the other methods' compute); seconds_to_target: "
    "running sum of seconds_step from step 0 to the first evaluation >= the target "
    "(evaluations left out); bytes: mean over measured steps of the mean over workers"
)


def _model_size(cfg: TrainBenchConfig) -> tuple[int, str]:
    """(d, model name) of the run's model; loads the data (which checks it is there)."""
    from gssgd.train.data import load_dataset
    from gssgd.train.models import build_model, default_model

    data = load_dataset(cfg.settings.get("dataset", "mnist"))
    name = cfg.settings.get("model") or default_model(data)
    return sum(p.numel() for p in build_model(name, data).parameters()), name


def _timeout(cfg: TrainBenchConfig, method: str, d: int, link_bps: int | None) -> float:
    """A method's limit: generous, from the step model's time per step on this machine's
    emulated link plus an allowance for compute and evaluation (it only catches stalls)."""
    if cfg.timeout_s is not None:
        return cfg.timeout_s
    from gssgd.costmodel import VARIANTS, emulated_step_seconds, method_spec

    tcfg = cfg.configs[method]
    share = max(1.0, cfg.workers * tcfg.threads / (os.cpu_count() or 1))
    try:
        opt = tcfg.option
        sizes = {"rows": opt("rows")} if opt("rows") is not None else {}
        # a DDP built-in (ddp-allreduce, ddp-fp16, powersgd) is bounded by a dense all-reduce
        spec = method_spec(method if method in VARIANTS else "dense", d, opt("density"),
                           k=opt("k"), cols=opt("cols"), candidates=opt("candidates"),
                           **sizes)  # fmt: skip
        comm = emulated_step_seconds(spec, cfg.workers, link_bps, share)
    except ValueError:
        comm = 1.0
    evaluations = tcfg.steps // tcfg.eval_every + 1 if tcfg.eval_every else 1
    return 300.0 + tcfg.steps * (1.0 * share + 10.0 * comm) + evaluations * 10.0 * share


def _run_method(
    cfg: TrainBenchConfig,
    method: str,
    run_dir: Path,
    index: int,
    cluster: EmulatedCluster | None,
    timeout_s: float,
) -> None:
    """One ``gssgd train`` run of ``method`` into ``run_dir``; raises WorkerError."""
    tcfg = cfg.train_config(method, run_dir)
    argv = [sys.executable, "-m", "gssgd.cli.main", *train_argv(tcfg)]
    hint = "Raise --method-timeout, or lower --steps."
    logs = run_dir / "logs"
    if cluster is not None:
        run_ranks(cfg.workers, argv, logs, timeout_s, cluster=cluster,
                  port=MASTER_PORT_NETNS + index, threads=tcfg.threads,
                  what=f"gssgd train worker ({method})", hint=hint)  # fmt: skip
    else:
        run_process(argv, logs, timeout_s, label="train", threads=tcfg.threads,
                    what=f"gssgd train ({method})", hint=hint)  # fmt: skip


def _bench_one_method(
    cfg: TrainBenchConfig,
    index: int,
    method: str,
    run_dir: Path,
    cluster: EmulatedCluster | None,
    d: int,
    echo: Callable[[str], None],
) -> dict[str, Any]:
    """Train ``method`` once and return its row (a failed run's row says why)."""
    from gssgd.train.checkpoint import CHECKPOINT_DIR
    from gssgd.train.metrics import METRICS_FILE, SUMMARY_FILE, read_metrics
    from gssgd_lab.train_report import train_progress_line

    timeout_s = _timeout(cfg, method, d, cfg.link_bps)
    echo(f"[{index + 1}/{len(cfg.methods)}] {method} -> {run_dir} (limit {timeout_s:.0f} s)")
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    error = None
    try:
        _run_method(cfg, method, run_dir, index, cluster, timeout_s)
    except WorkerError as exc:
        error = str(exc)
        echo(f"  {method} failed: {error}")
    records = read_metrics(run_dir / METRICS_FILE)
    summary_path = run_dir / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    tcfg = cfg.configs[method]
    row = summarize_run(records, summary, workers=cfg.workers, batch_size=tcfg.batch_size,
                        target=cfg.target_accuracy)
    if error is not None:  # a non-finite stop keeps the trainer's own status
        if row["status"] in ("completed", NO_SUMMARY):
            row["status"] = "failed"
        row["error"] = error[-4000:]
    row["seconds_run"] = round(time.monotonic() - t0, 2)
    row["load_average_1min_before"] = round(load, 2)
    row["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    row["run_dir"] = str(run_dir)
    if not cfg.keep_checkpoints:
        shutil.rmtree(run_dir / CHECKPOINT_DIR, ignore_errors=True)
    echo("  " + train_progress_line(method, row, cfg.target_accuracy))
    return row


def run_train_bench(
    cfg: TrainBenchConfig,
    out_dir: str | Path,
    *,
    command: str | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train every method in turn and write ``results.json``, ``table.txt``, ``train.png``.

    Args:
        cfg: the run.
        out_dir: created if missing; ``out_dir/METHOD/`` holds each method's
            ``gssgd train`` output and its workers' logs (replaced when run again).
        command: the command line to record in ``_meta`` (default: the one that reproduces
            the run, :meth:`TrainBenchConfig.command_line`).
        echo: where progress and the table go.

    Returns:
        The results mapping (as written to results.json). A method whose run failed has
        its ``status`` say so (with what its metrics hold, if any); the others go on.

    Raises:
        ValueError, DatasetUnavailableError, FileNotFoundError: the data or model are not
            usable (before anything runs).
        RuntimeError, PermissionError: the emulated cluster could not be built.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    d, model = _model_size(cfg)
    cfg_run, namespaces = namespaces_or_loopback(cfg, echo, have_root())
    where = f"namespaces on {cfg_run.link} links" if namespaces else "loopback"
    s = cfg_run.settings
    echo(
        f"bench train: {cfg_run.workers} workers ({where}), {s.get('dataset', 'mnist')} {model} "
        f"(d={d:,}), {len(cfg_run.methods)} methods x {cfg_run.configs[cfg_run.methods[0]].steps} "
        f"steps; target test accuracy {cfg_run.target_accuracy:g}"
    )
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    rows: dict[str, dict[str, Any]] = {}
    cluster_or_not = (
        EmulatedCluster(cfg_run.workers, cfg_run.link) if namespaces else contextlib.nullcontext()
    )
    with cluster_or_not as cluster:
        for i, method in enumerate(cfg_run.methods):
            rows[method] = _bench_one_method(cfg_run, i, method, out / method, cluster, d, echo)
    elapsed = time.monotonic() - start
    meta = run_meta(cfg_run, cfg.link, namespaces, command or cfg.command_line(out), elapsed,
                    d, model)  # fmt: skip
    meta["load_average_1min_before"] = round(load_before, 2)
    results = summarize(rows, meta)
    _write_outputs(results, out, echo)
    return results


def _write_outputs(results: dict[str, Any], out: Path, echo: Callable[[str], None]) -> None:
    """Write ``results.json``, ``table.txt`` and ``train.png``, and echo the table."""
    from gssgd.train.metrics import write_json
    from gssgd_lab.train_report import plot_train, train_table

    write_json(out / "results.json", results)
    table = train_table(results)
    (out / "table.txt").write_text(table + "\n")
    plot_train(results, out / "train.png")
    echo(table)
    echo(f"wrote {out / 'results.json'}, {out / 'table.txt'}, {out / 'train.png'}")


def run_meta(
    cfg: TrainBenchConfig,
    link_requested: str,
    namespaces: bool,
    command: str,
    elapsed: float,
    d: int,
    model: str,
) -> dict[str, Any]:
    """The ``_meta`` entry of a run: its settings, where it ran, versions and timing."""
    import torch

    first = cfg.configs[cfg.methods[0]]
    density = cfg.settings.get("density")
    return {
        "command": command,
        "workers": cfg.workers,
        "link": cfg.link,
        "link_requested": link_requested,
        "link_bps": cfg.link_bps,
        "mode": "namespaces" if namespaces else "loopback",
        "dataset": first.dataset,
        "model": model,
        "d": d,
        "density": density,
        "k": cfg.settings.get("k") or (max(1, round(density * d)) if density else None),
        "batch_size": first.batch_size,
        "steps": first.steps,
        "eval_every": first.eval_every,
        "target_accuracy": cfg.target_accuracy,
        "methods": list(cfg.methods),
        "settings": dict(cfg.settings),
        "threads": first.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)",
        "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds_total": round(elapsed, 2),
        "load_average_1min_after": round(os.getloadavg()[0], 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "timing": TIMING_NOTE,
    }
