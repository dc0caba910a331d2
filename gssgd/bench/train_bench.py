"""``gssgd bench train``: end-to-end training of every method on the same emulated links.

(Longer than the project's ~500-line guide only by its docstrings, about 150 lines that
document the pipeline and results.json's fields; the code, one benchmark, is under 460 lines.)

``gssgd bench comm`` times one aggregation step in isolation; this benchmark trains the
real model, so that what a method saves on the wire is weighed against what it costs in
compression and in accuracy per step. It answers: how many samples per second does each
method train on a slow network, and how soon does each reach a target test accuracy?

Steps:
    1. The parent checks every method's settings (one :class:`gssgd.train.loop.TrainConfig`
       each: the same model, data, batch, steps, seed and density for all), loads the data
       once to learn the model's size, and builds one
       :class:`gssgd.bench.netns.EmulatedCluster` of P namespaces on links of the given
       rate, kept for all methods (needs root; without root it says so and uses loopback).
    2. For each method in turn, one ``gssgd train`` run into ``DIR/METHOD/``: P
       processes ``python -m gssgd.cli.main train ...``, rank r inside namespace r with
       torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_PORT``,
       ``MASTER_ADDR`` = rank 0's address, ``GLOO_SOCKET_IFNAME`` = its veth), so that
       the trainer joins their group and all its traffic crosses the shaped links. With
       ``--link none`` it is a single ``gssgd train --workers P`` that spawns its own
       workers on loopback. Logs go to ``DIR/METHOD/logs/``; a failing or stalled
       run is stopped (:mod:`gssgd.bench.workers`) and the next method runs.
    3. From each run's ``metrics.jsonl`` and ``summary.json`` (:func:`summarize_run`):

       * ``seconds_per_step``: median over the measured steps (those after the trainer's
         warm-up, ``summary.measured_from_step``) of rank 0's ``seconds_step`` (batch,
         forward, backward with the gradient exchange, optimizer step);
       * ``samples_per_second`` = P * batch / ``seconds_per_step``;
       * ``seconds_compute_per_step``: median of ``seconds_compute`` (the step minus the
         time the comm hook reported: forward, backward, optimizer), and
         ``seconds_overhead_per_step`` = step - compute (compression and communication).
         DDP's built-in all-reduce (``ddp-allreduce``, ``ddp-fp16``, ``powersgd``) runs inside the
         backward pass untimed, so their ``seconds_compute`` includes the communication;
         their overhead is estimated with the median compute of the methods that do
         separate it (``overhead_estimated``);
       * ``bytes_sent_per_step``: mean over the measured steps of the bytes a worker sent;
       * ``final_test_accuracy``; ``seconds_to_target`` (:func:`time_to_target`): the
         training clock from the start of step 0 to the end of the first step whose
         evaluation reached the target, null when none did;
       * ``gs_throughput_speedup`` = gs's samples/s / this method's, and
         ``gs_time_to_target_speedup`` = this method's seconds to target / gs's (both > 1:
         gs is better), from the same run; when gs reached the target and a method did
         not, ``gs_time_to_target_speedup_at_least`` = that method's whole training time
         / gs's time to target.

    4. ``DIR/results.json`` (those per method, plus ``_meta``: command, machine, date,
       load averages), ``DIR/table.txt`` (also printed) and ``DIR/train.png`` (test
       accuracy against training time per method; time per step split into compute and
       overhead).

The training clock: metrics.jsonl carries each step's ``seconds_step``, not a wall clock,
so the clock is their running sum. It leaves out the evaluations (whose cost depends on
``--eval-every``, not on the method), start-up, and the trainer's two small bookkeeping
collectives per step (the loss check and the byte count). Should the trainer log a
per-step ``seconds_elapsed`` (seconds since the start of step 0 at the end of the step,
evaluations excluded), that is used instead.

Methods run one after another, so load from elsewhere on the machine can favour some;
``_meta`` and every method's row record the load average around it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gssgd.bench.netns import EmulatedCluster, have_root, parse_link_rate
from gssgd.bench.train_summary import (
    ELAPSED_FIELD,
    NO_SUMMARY,
    summarize,
    summarize_run,
    time_to_target,
)
from gssgd.bench.workers import (
    MASTER_PORT_NETNS,
    WorkerError,
    namespaces_or_loopback,
    run_process,
    run_ranks,
)

__all__ = [
    "DEFAULT_METHODS",
    "ELAPSED_FIELD",
    "TrainBenchConfig",
    "WorkerError",
    "run_train_bench",
    "summarize",
    "summarize_run",
    "time_to_target",
    "train_argv",
]

#: What ``gssgd bench train`` runs unless told otherwise: the fastest dense baseline (DDP's
#: own all-reduce, which overlaps with the backward pass) and the sparse methods.
DEFAULT_METHODS: tuple[str, ...] = ("ddp-allreduce", "topk", "gtopk", "sketched", "gs")
#: Settings always written into the reproducing command (bench train's own defaults).
_ALWAYS = ("workers", "dataset", "model", "steps", "batch_size", "eval_every", "device")
#: TrainConfig fields a benchmark sets per method itself.
_PER_METHOD = ("method", "out", "resume", "overwrite", "fail_at", "stall_at")


@dataclass(frozen=True)
class TrainBenchConfig:
    """One ``gssgd bench train`` run.

    Attributes:
        settings: :class:`gssgd.train.loop.TrainConfig` keyword arguments shared by every
            method (``workers``, ``dataset``, ``model``, ``steps``, ``batch_size``,
            ``density``, ``eval_every``, ...); method-specific ones go to the methods that
            take them. Not ``method``, ``out``, ``resume``, ``overwrite``, ``fail_at``.
        methods: ``gssgd train --method`` names, run in this order.
        link: every worker's link rate ("100mbit", "1gbit", ...) or "none" for loopback.
        target_accuracy: the test accuracy whose first reaching is timed, in (0, 1].
        timeout_s: each method's limit in seconds; None derives one from the size of the
            run (generous: it only catches a stall).
        keep_checkpoints: keep the final checkpoint the trainer writes (deleted by default:
            the benchmark needs only the metrics).

    Raises:
        ValueError: an unknown or repeated method, a bad link or target, or a setting the
            trainer refuses (its own message, naming the flag).
    """

    settings: Mapping[str, Any]
    methods: tuple[str, ...] = DEFAULT_METHODS
    link: str = "100mbit"
    target_accuracy: float = 0.9
    timeout_s: float | None = None
    keep_checkpoints: bool = False
    configs: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from gssgd.methods import parse_methods
        from gssgd.train.config import TrainConfig, settings_for

        settings = dict(self.settings)
        settings.pop("progress", None)  # the runs never show a progress bar
        given = sorted(set(settings) & set(_PER_METHOD))
        if given:
            raise ValueError(f"settings {given} are set per method by the benchmark; drop them")
        for name, default in (("workers", 4), ("device", "cpu")):
            if settings.get(name) is None:
                settings[name] = default
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "methods", parse_methods(self.methods))
        parse_link_rate(self.link)  # raises with the valid forms
        if self.link_bps is not None and settings["device"] != "cpu":
            raise ValueError(
                f"--device {settings['device']} with --link {self.link}: the emulated links "
                "shape gloo's TCP traffic only (NCCL between local GPUs bypasses them); use "
                "--device cpu, or --link none"
            )
        target = self.target_accuracy
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
            raise ValueError(
                f"target_accuracy={target!r} must be a number in (0, 1], e.g. 0.9 "
                "(--target-accuracy)"
            )
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s!r} must be > 0 seconds (or None)")
        # The trainer's own checks, method by method, before anything runs.
        configs = {
            m: TrainConfig(
                method=m, **settings_for(m, settings), out=m, overwrite=True, progress=False
            )  # fmt: skip
            for m in self.methods
        }
        object.__setattr__(self, "configs", configs)

    @property
    def link_bps(self) -> int | None:
        return parse_link_rate(self.link)

    @property
    def workers(self) -> int:
        return int(self.settings["workers"])

    def train_config(self, method: str, run_dir: Path) -> Any:
        """The :class:`~gssgd.train.loop.TrainConfig` of ``method``, writing to ``run_dir``."""
        return dataclasses.replace(self.configs[method], out=str(run_dir))

    def command_line(self, out: Path | str) -> str:
        """The ``gssgd bench train`` command that reproduces this run into ``out``."""
        return shlex.join([
            "gssgd", "bench", "train",
            "--methods", ",".join(self.methods),
            "--link", self.link,
            "--target-accuracy", f"{self.target_accuracy:g}",
            *_flags(self.settings, always=_ALWAYS),
            *(["--method-timeout", f"{self.timeout_s:g}"] if self.timeout_s is not None else []),
            *(["--keep-checkpoints"] if self.keep_checkpoints else []),
            "--out", str(out),
        ])  # fmt: skip


def _flags(settings: Mapping[str, Any], always: Sequence[str] = ()) -> list[str]:
    """``gssgd train`` arguments for TrainConfig settings: those that differ from its
    defaults, and those named in ``always`` when they are not None."""
    from gssgd.train.loop import TrainConfig

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    out: list[str] = []
    for name, value in settings.items():
        if value is None or (value == defaults.get(name) and name not in always):
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + name.replace("_", "-"))  # --no-progress, --no-exact
        elif name in ("fail_at", "stall_at"):
            out += [flag, f"{value[0]}:{value[1]}"]
        else:
            out += [flag, str(value)]
    return out


def train_argv(cfg: Any) -> list[str]:
    """The arguments after ``gssgd`` that make ``gssgd train`` run ``cfg`` (a TrainConfig).

    Every field that differs from TrainConfig's default becomes its flag (the flags map
    one to one onto the fields); ``--method`` and ``--workers`` are always given.
    """
    settings = dataclasses.asdict(cfg)
    method = settings.pop("method")
    return ["train", "--method", method, *_flags(settings, always=("workers",))]


# --------------------------------------------------------------------------- summaries


def _model_size(cfg: TrainBenchConfig) -> tuple[int, str]:
    """(d, model name) of the run's model; loads the data (which checks it is there)."""
    from gssgd.train.data import load_dataset
    from gssgd.train.models import build_model, default_model

    data = load_dataset(cfg.settings.get("dataset", "mnist"))
    name = cfg.settings.get("model") or default_model(data)
    return sum(p.numel() for p in build_model(name, data).parameters()), name


def _timeout(cfg: TrainBenchConfig, method: str, d: int, link_bps: int | None) -> float:
    """A method's limit: generous, from the default cost model's time per step at the
    link's rate plus an allowance for compute and evaluation (it only catches stalls)."""
    if cfg.timeout_s is not None:
        return cfg.timeout_s
    from gssgd.costmodel import VARIANTS, CostModel, method_spec

    tcfg = cfg.configs[method]
    share = max(1.0, cfg.workers * tcfg.threads / (os.cpu_count() or 1))
    try:
        sizes = {"rows": tcfg.rows} if tcfg.rows is not None else {}
        # a DDP built-in (ddp-allreduce, ddp-fp16, powersgd) is bounded by a dense all-reduce
        spec = method_spec(method if method in VARIANTS else "dense", d, tcfg.density,
                           k=tcfg.k, cols=tcfg.cols, candidates=tcfg.candidates,
                           **sizes)  # fmt: skip
        comm = CostModel.default().predict(spec, cfg.workers, link_bps, share).total
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
    from gssgd.bench import report
    from gssgd.train.checkpoint import CHECKPOINT_DIR
    from gssgd.train.metrics import METRICS_FILE, SUMMARY_FILE, read_metrics

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
    echo("  " + report.train_progress_line(method, row, cfg.target_accuracy))
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
    from gssgd.bench import report
    from gssgd.train.metrics import write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    d, model = _model_size(cfg)
    link_requested = cfg.link
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
    meta = _meta(cfg_run, link_requested, namespaces, command or cfg.command_line(out), elapsed,
                 d, model)  # fmt: skip
    meta["load_average_1min_before"] = round(load_before, 2)
    results = summarize(rows, meta)
    write_json(out / "results.json", results)
    table = report.train_table(results)
    (out / "table.txt").write_text(table + "\n")
    report.plot_train(results, out / "train.png")
    echo(table)
    echo(f"wrote {out / 'results.json'}, {out / 'table.txt'}, {out / 'train.png'}")
    return results


def _meta(
    cfg: TrainBenchConfig,
    link_requested: str,
    namespaces: bool,
    command: str,
    elapsed: float,
    d: int,
    model: str,
) -> dict[str, Any]:
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
        "timing": "seconds_per_step: median over the measured steps (after the trainer's "
        "warm-up) of rank 0's seconds_step; compute: median of seconds_compute (step minus "
        "the comm hook's time; for DDP's built-in all-reduce it includes the communication, "
        "and the overhead is estimated from the other methods' compute); seconds_to_target: "
        "running sum of seconds_step from step 0 to the first evaluation >= the target "
        "(evaluations left out); bytes: mean over measured steps of the mean over workers",
    }
