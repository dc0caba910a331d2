"""The training loop of ``gssgd train``, readable top to bottom: one loop for real workers
and for a simulated world.

:func:`run_training` checks a :class:`~gssgd.train.config.TrainConfig`
(:func:`~gssgd.train.rundir.prepare`), then trains its ranks (:class:`Ranks`) through the
one loop, :func:`_train`:

* **real workers**: it launches them (:mod:`gssgd.train.launch`); each runs
  :func:`train_worker`, whose setup (:func:`_setup`) loads the data, builds the same model
  on every rank (same seed), makes the optimizer, with ``--resume`` restores parameters,
  optimizer, RNG and this rank's hook state, wraps the model in ``DistributedDataParallel``
  and registers the method's gradient averaging (:class:`~gssgd.train.sync.GradientSync`);
  its :class:`DDPRank` takes a step as one rank of P;
* **simulated workers** (``--simulate``): every rank in this process, on one model
  (:func:`gssgd.train.simulate.simulated_ranks`).

Each step (:func:`_train_step`): every rank's batch (a pure function of the step), forward,
agree on a finite loss, backward with the method's averaging, optimizer step; the logging
process (rank 0) records the step; evaluate and checkpoint when due. At the end it writes
``summary.json`` (:func:`_summarise`).

Example::

    summary = run_training(TrainConfig(method="gs", dataset="digits", workers=2, steps=50,
                                       out="runs/demo"))
    summary["final_test_accuracy"]
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gssgd.aggregators.gs import SketchCollapseError
from gssgd.amp import AMP_DTYPES, make_scaler
from gssgd.ddp.optimizer_watch import pair_adamw
from gssgd.methods import METHODS
from gssgd.optim import FrozenVarianceAdamW
from gssgd.train import checkpoint
from gssgd.train.collectives import agree_on_loss, collective_failure, gather_bytes
from gssgd.train.config import TrainConfig, make_optimizer
from gssgd.train.data import ImageData, TextData, load_dataset
from gssgd.train.launch import Worker, WorkerFailed, launch
from gssgd.train.method_settings import import_plugins
from gssgd.train.metrics import (
    METRICS_FILE,
    STATUS_COLLAPSED,
    STATUS_COMPLETED,
    STATUS_NONFINITE,
    SUMMARY_FILE,
    MetricsLog,
    RunTotals,
    StepBytes,
    StepLoss,
    run_summary,
    step_record,
    summary_line,
    write_json,
)
from gssgd.train.models import build_model, trained_size
from gssgd.train.objective import batch_loss, evaluation_sums, train_batch
from gssgd.train.progress import progress_bar as _progress_bar
from gssgd.train.progress import say as _say
from gssgd.train.rundir import prepare
from gssgd.train.simulate import simulated_ranks
from gssgd.train.snapshot import save_run_checkpoint, set_rng_state
from gssgd.train.sync import GradientSync
from gssgd.train.tensorboard import TensorBoardLog

__all__ = [
    "METHODS",
    "METRICS_FILE",
    "STATUS_COLLAPSED",
    "STATUS_COMPLETED",
    "STATUS_NONFINITE",
    "TrainConfig",
    "evaluate",
    "prepare",
    "run_training",
    "train_worker",
]



# =========================================================================== data and eval


def evaluate(
    model: nn.Module, data: ImageData | TextData, cfg: TrainConfig, worker: Worker
) -> tuple[float, float]:
    """Test loss and accuracy; every rank scores its share
    (:func:`~gssgd.train.objective.evaluation_sums`), the sums are all-reduced.

    Returns:
        ``(test_loss, test_accuracy)``, the same on every rank.
    """
    sums = evaluation_sums(model, data, cfg, worker.rank, worker.world_size, worker.device)
    dist.all_reduce(sums)
    loss_sum, correct, count = sums.tolist()
    return loss_sum / count, correct / count


# =========================================================================== the loop


class Ranks(Protocol):
    """What the loop trains: this process's rank of a real run (:class:`DDPRank`), or every
    rank of a simulated world in this process (:func:`gssgd.train.simulate.simulated_ranks`).
    """

    world_size: int
    #: the optimizer whose learning rate is logged (rank 0's), and --amp fp16's scaler
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None

    def step(self, step: int) -> StepLoss:
        """Every rank's batch, forward, backward, averaging and update at ``step`` (nothing
        updated when a loss is not finite). Raises SketchCollapseError or
        FloatingPointError on every rank alike when the method stops the step."""

    def stats(self, step: int) -> tuple[dict[str, Any], StepBytes]:
        """What the step's averaging cost (rank 0's) and its bytes over the ranks."""

    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy as the real workers compute them."""

    def save(self, done: int, totals: RunTotals) -> None:
        """The checkpoint after ``done`` steps, where the run keeps them."""

    def checkpoint_after(self, done: int) -> Path | None:
        """Where :meth:`save` put the checkpoint of ``done`` steps (None: it keeps none)."""


@dataclass
class _Run:
    """One run as the loop sees it: its ranks and what it has come to."""

    cfg: TrainConfig
    ranks: Ranks
    d: int
    start_step: int
    totals: RunTotals
    log: MetricsLog | None  # the process that logs (rank 0) only
    bar: Any  # the progress bar (disabled off rank 0)
    tensorboard: TensorBoardLog | None = None  # --tensorboard, rank 0 only
    # what the run has come to
    status: str = STATUS_COMPLETED
    message: str = ""
    last_eval: tuple[float | None, float | None] = (None, None)
    last_loss: float | None = None
    step: int = 0  # the step being taken
    wall_start: float = field(default_factory=time.perf_counter)


def _start(cfg: TrainConfig, ranks: Ranks, d: int, start_step: int, totals: RunTotals,
           logs: bool, note: str | None) -> _Run:
    """The run's record before its first step: ``config.json``, the opening line, the
    metrics log, progress bar and TensorBoard (on the process that ``logs``)."""
    out = Path(cfg.out)
    if logs:
        write_json(out / "config.json",
                   {**dataclasses.asdict(cfg), "world_size": ranks.world_size, "d": d})
        workers = f"{ranks.world_size} {'simulated ' if cfg.simulate else ''}workers"
        _say(f"gssgd train: {cfg.method} on {cfg.dataset} ({cfg.model}, d={d:,}), {workers}, "
             f"steps {start_step}..{cfg.steps} -> {out}")
        if note is not None:
            _say(f"gssgd train: {note}")
    return _Run(cfg, ranks, d, start_step, totals,
                MetricsLog(out, start_step) if logs else None,
                _progress_bar(cfg, start_step, show=logs and cfg.progress),
                TensorBoardLog(cfg.tensorboard, start_step) if logs and cfg.tensorboard else None)


def _train(run: _Run) -> dict[str, Any] | None:
    """The loop: every step from the run's first to ``cfg.steps`` (or to the step every
    rank stopped at), then the summary on the process that logs."""
    for step in range(run.start_step, run.cfg.steps):
        run.step = step
        if not _train_step(run, step):
            break  # every rank stopped at this same step (run.status says why)
    run.bar.close()
    return _summarise(run) if run.log is not None else None


def _train_step(run: _Run, step: int) -> bool:
    """One step on every rank, then log, evaluate and checkpoint when due.

    Returns:
        False when every rank stops here (a non-finite loss, a collapsed sketch, a gradient
        that stayed non-finite for the method's ``max_consecutive_skips`` steps).
    """
    cfg = run.cfg
    try:
        taken = run.ranks.step(step)
    except (SketchCollapseError, FloatingPointError) as err:  # on every rank at this step
        saved = _saved_checkpoints(cfg)
        run.status = (STATUS_COLLAPSED if isinstance(err, SketchCollapseError)
                      else STATUS_NONFINITE)
        run.message = f"gssgd train: stopped at step {step}: {err}" + (
            f" The weights were not updated; {saved[-1].name} in {cfg.out} is kept."
            if saved
            else " The weights were not updated."
        )
        return False
    if taken.nonfinite:
        run.status = STATUS_NONFINITE
        run.message = (
            f"gssgd train: stopped at step {step}: the training loss is not finite (NaN or Inf) "
            f"on {int(taken.nonfinite)} of {run.ranks.world_size} workers; every worker stopped. "
            f"Lower --lr (now {cfg.lr})"
            + (" or resume an earlier checkpoint with a lower --lr." if _saved_checkpoints(cfg)
               else ".")
        )
        return False
    run.last_loss = taken.loss_sum / taken.count
    stats, moved = run.ranks.stats(step)
    record = step_record(step, run.last_loss, taken.correct / taken.count, stats, moved,
                         run.totals.bytes_sent, taken.seconds)
    run.totals.add(record, measured=step >= cfg.measured_from_step)
    _after_step(run, step, record)
    return True


def _saved_checkpoints(cfg: TrainConfig) -> list[Path]:
    """The run's checkpoints so far, oldest first (a simulated run writes none)."""
    return checkpoint.list_checkpoints(Path(cfg.out) / checkpoint.CHECKPOINT_DIR)


def _after_step(run: _Run, step: int, record: dict[str, Any]) -> None:
    """Evaluate when due, log the step (metrics, bar, TensorBoard), checkpoint when due."""
    cfg = run.cfg
    done = step + 1
    if done == cfg.steps or (cfg.eval_every and done % cfg.eval_every == 0):
        run.last_eval = run.ranks.evaluate()
        record["test_loss"], record["test_accuracy"] = run.last_eval
    if run.log is not None:  # before the checkpoint: a resumed run finds every earlier line
        run.log.write(record)
        run.bar.set_postfix(loss=f"{run.last_loss:.3f}", acc=f"{record['train_accuracy']:.3f}",
                            refresh=False)
        run.bar.update(1)
    if run.tensorboard is not None:
        scaler = run.ranks.scaler
        run.tensorboard.write(record, lr=run.ranks.optimizer.param_groups[0]["lr"],
                              loss_scale=scaler.get_scale() if scaler else None)
    if done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0):
        run.ranks.save(done, run.totals)


def _summarise(run: _Run) -> dict[str, Any]:
    """The logging process: write ``summary.json`` and say how the run ended."""
    assert run.log is not None
    run.log.close()
    if run.tensorboard is not None:
        run.tensorboard.close()
    cfg, out = run.cfg, Path(run.cfg.out)
    final = run.ranks.checkpoint_after(cfg.steps) if run.status == STATUS_COMPLETED else None
    summary = run_summary(
        cfg,
        status=run.status,
        message=run.message,
        world_size=run.ranks.world_size,
        d=run.d,
        totals=run.totals,
        last_loss=run.last_loss,
        last_eval=run.last_eval,
        measured_from_step=cfg.measured_from_step,
        seconds_wall=time.perf_counter() - run.wall_start,
        checkpoint=None if final is None else str(final),
        **({"simulated": True} if cfg.simulate else {}),
    )
    write_json(out / SUMMARY_FILE, summary)
    _say(run.message if run.message else summary_line(summary))
    return summary


# =========================================================================== the ranks


def build_model_of(cfg: TrainConfig, device: torch.device) -> tuple[ImageData | TextData,
                                                                     nn.Module, int]:
    """What every rank of a run, real or simulated, starts from: the user's methods
    registered, the data, the model (the same on every rank: the run's seed) and its
    trainable parameter count ``d`` (what the method averages)."""
    import_plugins(cfg.plugins)  # a spawned worker registers the user's methods too
    torch.set_num_threads(cfg.threads)
    data = load_dataset(cfg.dataset)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data).to(device)
    return data, model, trained_size(model)


class DDPRank:
    """This process's rank of a real data-parallel run: its batch, forward, backward (DDP
    averages the gradients there, through the method's hook), update, and its share of
    evaluations and checkpoints (:func:`train_worker` builds it)."""

    def __init__(self, cfg: TrainConfig, worker: Worker, data: ImageData | TextData,
                 model: nn.Module, optimizer: torch.optim.Optimizer, ddp: DistributedDataParallel,
                 sync: GradientSync, scaler: torch.amp.GradScaler | None,
                 fingerprint: dict[str, Any]) -> None:
        self.cfg, self.worker, self.data, self.model = cfg, worker, data, model
        self.optimizer, self.ddp, self.sync, self.scaler = optimizer, ddp, sync, scaler
        self.fingerprint, self.world_size = fingerprint, worker.world_size

    def step(self, step: int) -> StepLoss:
        """Forward, agree on a finite loss, backward + averaging, update (with --amp fp16
        the loss is scaled, and an overflow comes back as NaN gradients on every rank);
        its seconds leave the loss's all-reduce out."""
        cfg, worker = self.cfg, self.worker
        _inject_faults(cfg, worker.rank, step)
        t0 = time.perf_counter()
        x, y = train_batch(self.data, cfg, step, worker.rank, worker.world_size, worker.device)
        with self._alone(), _autocast(cfg, worker):
            loss, correct, count = batch_loss(self.ddp(x), y)
        t_forward = time.perf_counter() - t0
        loss_sum, correct_sum, count_sum, nonfinite = agree_on_loss(loss, correct, count, worker)
        if nonfinite:
            return StepLoss(loss_sum, correct_sum, count_sum, int(nonfinite), t_forward)
        t1 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        with self._alone():
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        self._optimizer_step(step)
        self.sync.after_step()  # local steps: every H-th step is the outer step
        return StepLoss(loss_sum, correct_sum, count_sum, 0,
                        t_forward + (time.perf_counter() - t1))

    def stats(self, step: int) -> tuple[dict[str, Any], StepBytes]:
        """This rank's averaging statistics and the bytes gathered over the ranks."""
        stats = self.sync.step_stats(step)
        return stats, gather_bytes(stats, self.worker)

    def evaluate(self) -> tuple[float, float]:
        return evaluate(self.ddp.module, self.data, self.cfg, self.worker)

    def save(self, done: int, totals: RunTotals) -> None:
        save_run_checkpoint(Path(self.cfg.out), done, self.cfg, self.fingerprint, self.model,
                            self.optimizer, self.sync, totals, self.worker)

    def checkpoint_after(self, done: int) -> Path | None:
        return (Path(self.cfg.out) / checkpoint.CHECKPOINT_DIR
                / checkpoint.checkpoint_name(done))

    def _alone(self) -> contextlib.AbstractContextManager[Any]:
        """Local steps: DDP's ``no_sync`` (no gradient all-reduce: the outer step averages
        the weights' change); otherwise nothing."""
        return self.ddp.no_sync() if self.cfg.local_steps else contextlib.nullcontext()

    def _optimizer_step(self, step: int) -> None:
        """The optimizer's step at the schedule's learning rate (``--lr-schedule``)."""
        self.cfg.schedule.apply(self.optimizer, self.cfg.lr, step)
        if self.scaler is None:
            self.optimizer.step()
        else:  # skips the step on an overflow (every rank alike) and adapts the scale
            self.scaler.step(self.optimizer)
            self.scaler.update()


def train_worker(worker: Worker, cfg: TrainConfig) -> dict[str, Any] | None:
    """Train on this rank; every rank runs it in step with the others.

    Args:
        worker: this rank (the process group is initialised).
        cfg: a config completed by :func:`prepare` (``workers``, ``model``, ``out`` set).

    Returns:
        The run summary on rank 0 (also in ``OUT/summary.json``), None elsewhere.

    Raises:
        ValueError: a checkpoint of another run; CheckpointError: an unreadable one.
        RuntimeError: a peer died or timed out (after ``cfg.timeout`` seconds).
    """
    run = _setup(worker, cfg)
    try:
        return _train(run)
    except (RuntimeError, dist.DistBackendError) as err:
        if isinstance(err, FloatingPointError) or not collective_failure(err):
            raise
        raise RuntimeError(
            f"step {run.step}: a collective failed or waited longer than --timeout "
            f"{cfg.timeout:g} s on rank {worker.rank} ({err}). A peer died or stalled: check "
            "the other workers' output; raise --timeout on slow links, or continue with "
            "--resume from the run's --out."
        ) from err


def _setup(worker: Worker, cfg: TrainConfig) -> _Run:
    """Data, the same initial model on every rank, optimizer, resume, DDP and its method."""
    device = worker.device
    data, model, d = build_model_of(cfg, device)
    optimizer = make_optimizer(model, cfg)
    fingerprint = checkpoint.fingerprint(cfg.method, cfg.model, cfg.dataset, worker.world_size, d)

    # Resume: parameters, optimizer, this rank's RNG and (below) hook state, totals.
    start_step, totals, resumed = 0, RunTotals(), None
    if cfg.resume:
        resumed = checkpoint.load_checkpoint(cfg.resume)
        checkpoint.check_fingerprint(
            checkpoint.renamed_fingerprint(resumed, cfg.method), fingerprint, cfg.resume)
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        set_rng_state(resumed["ranks"][worker.rank]["rng"], device)
        totals.load_state_dict(resumed.get("totals", {}))
        start_step = int(resumed["step"])

    ddp = DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        # local steps: each replica trains alone (no_sync); the outer step averages buffers
        **(_no_forward_buffer_sync() if cfg.local_steps else {}),
        **({} if cfg.bucket_cap_mb is None else {"bucket_cap_mb": cfg.bucket_cap_mb}),
    )
    if resumed is not None:
        _rebuild_buckets(ddp, data, cfg, start_step, worker)
    scaler = make_scaler(cfg.amp, device)  # fp16: scaled losses; the hook follows the scale
    sync = GradientSync(ddp, cfg, worker.world_size, scaler=scaler, optimizer=optimizer)
    if resumed is not None:
        sync.load_state_dict(resumed["ranks"][worker.rank]["sync"])
        if sync.hook_state is not None:  # the buckets were rebuilt above, before the hook
            sync.hook_state.note_buckets_rebuilt()
    if isinstance(optimizer, FrozenVarianceAdamW) and sync.hook_state is not None:
        pair_adamw(optimizer, sync.hook_state)  # 1-bit Adam's: the hook says when v freezes
    rank = DDPRank(cfg, worker, data, model, optimizer, ddp, sync, scaler, fingerprint)
    return _start(cfg, rank, d, start_step, totals, logs=worker.rank == 0, note=sync.note)


def _inject_faults(cfg: TrainConfig, rank: int, step: int) -> None:
    """``--fail-at`` / ``--stall-at``: this rank dies or goes silent at this step."""
    if cfg.fail_at == (rank, step):
        _die(f"--fail-at {rank}:{step}: rank {rank} exits abruptly (fault injection)")
    if cfg.stall_at == (rank, step):
        _say(f"gssgd: --stall-at {rank}:{step}: rank {rank} stops answering (fault injection)")
        time.sleep(10**6)


def _no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's argument that stops it copying rank 0's buffers at every forward: torch 2.13
    names it ``forward_sync_buffers`` (and warns on ``broadcast_buffers``), torch 2.11
    ``broadcast_buffers``. Both still copy them once at construction, which local steps
    want (every replica starts equal)."""
    takes = inspect.signature(DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in takes else "broadcast_buffers"
    return {name: False}


def _autocast(cfg: TrainConfig, worker: Worker) -> torch.autocast:
    """The forward pass's ``--amp`` autocast (disabled without ``--amp``)."""
    dtype = AMP_DTYPES[cfg.amp] if cfg.amp is not None else torch.float32
    return torch.autocast(worker.device.type, dtype=dtype, enabled=cfg.amp is not None)


def _rebuild_buckets(
    ddp: DistributedDataParallel,
    data: ImageData | TextData,
    cfg: TrainConfig,
    step: int,
    worker: Worker,
) -> None:
    """One throwaway backward (no hook yet, gradients discarded) on a resumed run.

    DDP lays its buckets out anew after its first backward in a process. Doing that
    backward before the hook is registered gives the hook the same bucket layout the
    uninterrupted run had at this step, so per-bucket state (PowerSGD's error feedback,
    ``--per-bucket`` residuals) lines up with the checkpoint and the resumed run is
    bitwise the uninterrupted one. Parameters, optimizer and RNG are left untouched.
    """
    x, y = train_batch(data, cfg, step, worker.rank, worker.world_size, worker.device)
    with _autocast(cfg, worker):  # autocast's casts change the order gradients get ready in
        loss = batch_loss(ddp(x), y)[0]
    loss.backward()
    ddp.zero_grad(set_to_none=True)


def _die(message: str) -> None:
    print(f"gssgd: {message}", file=sys.stderr, flush=True)
    os._exit(1)


# =========================================================================== entry point


def run_training(cfg: TrainConfig) -> dict[str, Any] | None:
    """Check ``cfg``, start the workers (spawned, or this torchrun rank) and train.

    Args:
        cfg: the settings.

    Returns:
        Rank 0's summary (see ``summary.json``): in the spawning parent and on rank 0
        under torchrun; None on the other torchrun ranks.

    Raises:
        ValueError, CheckpointError, DatasetUnavailableError: from :func:`prepare`.
        WorkerFailed: a spawned worker failed (its message is on stderr).
    """
    cfg = prepare(cfg)
    assert cfg.workers is not None and cfg.out is not None
    if cfg.simulate:  # P ranks in this process, through the same loop
        data, model, d = build_model_of(cfg, torch.device("cpu"))
        ranks = simulated_ranks(cfg, data, model)
        return _train(_start(cfg, ranks, d, 0, RunTotals(), logs=True, note=None))
    try:
        return launch(train_worker, cfg.workers, (cfg,), timeout_s=cfg.timeout, device=cfg.device)
    except WorkerFailed as err:
        saved = _saved_checkpoints(cfg)
        hint = (
            f"; continue from {saved[-1].name} with --resume {cfg.out}"
            if saved
            else "; no checkpoint was written yet (--checkpoint-every N writes some)"
        )
        raise WorkerFailed(err.rank, err.exit_code, hint) from None
