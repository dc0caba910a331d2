"""The training loop of ``gssgd train``, readable top to bottom.

:func:`run_training` checks a :class:`~gssgd.train.config.TrainConfig`
(:func:`~gssgd.train.rundir.prepare`), launches the workers (:mod:`gssgd.train.launch`)
and returns rank 0's summary; :func:`train_worker` is what each worker runs, in three parts:

1. **setup** (:func:`_setup`): load the data, build the same model on every rank (same
   seed), make the optimizer; with ``--resume`` restore parameters, optimizer, RNG and this
   rank's hook state; wrap the model in ``DistributedDataParallel`` and register the
   method's gradient averaging (:class:`~gssgd.train.sync.GradientSync`);
2. **steps** (:func:`_train_step`): this rank's batch (a pure function of the step),
   forward, agree on a finite loss, backward (DDP averages the gradients through the
   method), optimizer step; rank 0 logs the step; evaluate and checkpoint when due;
3. **summary** (:func:`_summarise`): rank 0 writes ``summary.json``.

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
from typing import Any

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
    run_summary,
    step_record,
    summary_line,
    write_json,
)
from gssgd.train.models import build_model
from gssgd.train.objective import batch_loss, evaluation_sums, train_batch
from gssgd.train.progress import progress_bar as _progress_bar
from gssgd.train.progress import say as _say
from gssgd.train.rundir import prepare
from gssgd.train.simulate import simulate_training
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


def _train_batch(
    data: ImageData | TextData, cfg: TrainConfig, step: int, worker: Worker
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch at ``step``: a pure function of (seed, step, rank)."""
    return train_batch(data, cfg, step, worker.rank, worker.world_size, worker.device)


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


@dataclass
class _Run:
    """What one worker trains with, built by :func:`_setup`."""

    cfg: TrainConfig
    worker: Worker
    data: ImageData | TextData
    model: nn.Module
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    sync: GradientSync
    fingerprint: dict[str, Any]
    d: int
    start_step: int
    totals: RunTotals
    log: MetricsLog | None  # rank 0 only
    bar: Any  # the progress bar (disabled off rank 0)
    scaler: torch.amp.GradScaler | None = None  # --amp fp16's loss scaler
    tensorboard: TensorBoardLog | None = None  # --tensorboard, rank 0 only
    # what the run has come to
    status: str = STATUS_COMPLETED
    message: str = ""
    last_eval: tuple[float | None, float | None] = (None, None)
    last_loss: float | None = None
    wall_start: float = field(default_factory=time.perf_counter)


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
    step = run.start_step
    try:
        for step in range(run.start_step, cfg.steps):
            _inject_faults(cfg, worker.rank, step)
            if not _train_step(run, step):
                break  # every rank stopped at this same step (run.status says why)
    except (RuntimeError, dist.DistBackendError) as err:
        if isinstance(err, FloatingPointError) or not collective_failure(err):
            raise
        raise RuntimeError(
            f"step {step}: a collective failed or waited longer than --timeout {cfg.timeout:g} s "
            f"on rank {worker.rank} ({err}). A peer died or stalled: check the other workers' "
            "output; raise --timeout on slow links, or continue with --resume from the run's --out."
        ) from err
    run.bar.close()
    return _summarise(run) if run.log is not None else None


def _setup(worker: Worker, cfg: TrainConfig) -> _Run:
    """Data, the same initial model on every rank, optimizer, resume, DDP and its method."""
    import_plugins(cfg.plugins)  # a spawned worker registers the user's methods too
    device, out = worker.device, Path(cfg.out)
    torch.set_num_threads(cfg.threads)
    data = load_dataset(cfg.dataset)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data).to(device)
    d = sum(p.numel() for p in model.parameters())
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

    is_main = worker.rank == 0
    if is_main:
        write_json(
            out / "config.json",
            {**dataclasses.asdict(cfg), "world_size": worker.world_size, "d": d},
        )
        _say(
            f"gssgd train: {cfg.method} on {cfg.dataset} ({cfg.model}, d={d:,}), "
            f"{worker.world_size} workers, steps {start_step}..{cfg.steps} -> {out}"
        )
        if sync.note is not None:
            _say(f"gssgd train: {sync.note}")
    bar = _progress_bar(cfg, start_step, show=is_main and cfg.progress)
    tensorboard = TensorBoardLog(cfg.tensorboard, start_step) if is_main and cfg.tensorboard else None
    return _Run(cfg, worker, data, model, ddp, optimizer, sync, fingerprint, d, start_step,
                totals, MetricsLog(out, start_step) if is_main else None, bar, scaler,
                tensorboard)


def _inject_faults(cfg: TrainConfig, rank: int, step: int) -> None:
    """``--fail-at`` / ``--stall-at``: this rank dies or goes silent at this step."""
    if cfg.fail_at == (rank, step):
        _die(f"--fail-at {rank}:{step}: rank {rank} exits abruptly (fault injection)")
    if cfg.stall_at == (rank, step):
        _say(f"gssgd: --stall-at {rank}:{step}: rank {rank} stops answering (fault injection)")
        time.sleep(10**6)


def _train_step(run: _Run, step: int) -> bool:
    """One step on every rank: forward, agree on the loss, backward + averaging, update,
    then log, evaluate and checkpoint when due.

    Returns:
        False when every rank stops here (a non-finite loss, a collapsed sketch).
    """
    cfg, worker = run.cfg, run.worker
    t0 = time.perf_counter()
    x, y = _train_batch(run.data, cfg, step, worker)
    with _alone(run), _autocast(cfg, worker):
        loss, correct, count = batch_loss(run.ddp(x), y)
    t_forward = time.perf_counter() - t0
    loss_sum, correct_sum, count_sum, nonfinite = agree_on_loss(loss, correct, count, worker)
    if nonfinite:
        run.status = STATUS_NONFINITE
        run.message = (
            f"gssgd train: stopped at step {step}: the training loss is not finite (NaN or Inf) "
            f"on {int(nonfinite)} of {worker.world_size} workers; every worker stopped. Lower "
            f"--lr (now {cfg.lr}) or resume an earlier checkpoint with a lower --lr."
        )
        return False
    t1 = time.perf_counter()
    if not _update(run, loss, step):
        return False
    seconds_step = t_forward + (time.perf_counter() - t1)  # the loss all-reduce left out
    run.last_loss = loss_sum / count_sum
    _after_step(run, step, _record(run, step, seconds_step, correct_sum / count_sum))
    return True


def _update(run: _Run, loss: torch.Tensor, step: int) -> bool:
    """Backward (DDP averages the gradients there, through the method's hook; with --amp
    fp16 the loss is scaled, and an overflow comes back as NaN gradients on every rank),
    then the optimizer step. False when the sketch collapsed or the gradients stayed
    non-finite for the method's ``max_consecutive_skips`` steps (on every rank alike)."""
    cfg = run.cfg
    run.optimizer.zero_grad(set_to_none=True)
    try:
        with _alone(run):
            (loss if run.scaler is None else run.scaler.scale(loss)).backward()
        _optimizer_step(run, step)
        run.sync.after_step()  # local steps: every H-th step is the outer step
    except (SketchCollapseError, FloatingPointError) as err:  # on every rank at this step
        saved = checkpoint.list_checkpoints(Path(cfg.out) / checkpoint.CHECKPOINT_DIR)
        collapsed = isinstance(err, SketchCollapseError)
        run.status = STATUS_COLLAPSED if collapsed else STATUS_NONFINITE
        run.message = f"gssgd train: stopped at step {step}: {err}" + (
            f" The weights were not updated; {saved[-1].name} in {cfg.out} is kept."
            if saved
            else " The weights were not updated."
        )
        return False
    return True


def _after_step(run: _Run, step: int, record: dict[str, Any]) -> None:
    """Evaluate when due, log the step (metrics, bar, TensorBoard), checkpoint when due."""
    cfg = run.cfg
    done = step + 1
    if done == cfg.steps or (cfg.eval_every and done % cfg.eval_every == 0):
        run.last_eval = evaluate(run.ddp.module, run.data, cfg, run.worker)
        record["test_loss"], record["test_accuracy"] = run.last_eval
    if run.log is not None:  # before the checkpoint: a resumed run finds every earlier line
        run.log.write(record)
        run.bar.set_postfix(loss=f"{run.last_loss:.3f}", acc=f"{record['train_accuracy']:.3f}",
                            refresh=False)
        run.bar.update(1)
    if run.tensorboard is not None:
        run.tensorboard.write(record, lr=run.optimizer.param_groups[0]["lr"],
                              loss_scale=run.scaler.get_scale() if run.scaler else None)
    if done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0):
        save_run_checkpoint(Path(cfg.out), done, cfg, run.fingerprint, run.model,
                            run.optimizer, run.sync, run.totals, run.worker)


def _no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's argument that stops it copying rank 0's buffers at every forward: torch 2.13
    names it ``forward_sync_buffers`` (and warns on ``broadcast_buffers``), torch 2.11
    ``broadcast_buffers``. Both still copy them once at construction, which local steps
    want (every replica starts equal)."""
    takes = inspect.signature(DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in takes else "broadcast_buffers"
    return {name: False}


def _alone(run: _Run) -> contextlib.AbstractContextManager[Any]:
    """Local steps: DDP's ``no_sync`` (no gradient all-reduce: the outer step averages the
    weights' change); otherwise nothing."""
    return run.ddp.no_sync() if run.cfg.local_steps else contextlib.nullcontext()


def _optimizer_step(run: _Run, step: int) -> None:
    """The optimizer's step at the schedule's learning rate (``--lr-schedule``)."""
    run.cfg.schedule.apply(run.optimizer, run.cfg.lr, step)
    if run.scaler is None:
        run.optimizer.step()
    else:  # skips the step on an overflow (every rank alike) and adapts the scale
        run.scaler.step(run.optimizer)
        run.scaler.update()


def _autocast(cfg: TrainConfig, worker: Worker) -> torch.autocast:
    """The forward pass's ``--amp`` autocast (disabled without ``--amp``)."""
    dtype = AMP_DTYPES[cfg.amp] if cfg.amp is not None else torch.float32
    return torch.autocast(worker.device.type, dtype=dtype, enabled=cfg.amp is not None)


def _record(run: _Run, step: int, seconds_step: float, train_accuracy: float) -> dict[str, Any]:
    """The step's ``metrics.jsonl`` line (bytes gathered over ranks), added to the totals."""
    stats = run.sync.step_stats(step)
    record = step_record(step, run.last_loss, train_accuracy, stats,
                         gather_bytes(stats, run.worker), run.totals.bytes_sent, seconds_step)
    run.totals.add(record, measured=step >= run.cfg.measured_from_step)
    return record


def _summarise(run: _Run) -> dict[str, Any]:
    """Rank 0: write ``summary.json`` and say how the run ended."""
    assert run.log is not None
    run.log.close()
    if run.tensorboard is not None:
        run.tensorboard.close()
    cfg, out = run.cfg, Path(run.cfg.out)
    summary = run_summary(
        cfg,
        status=run.status,
        message=run.message,
        world_size=run.worker.world_size,
        d=run.d,
        totals=run.totals,
        last_loss=run.last_loss,
        last_eval=run.last_eval,
        measured_from_step=cfg.measured_from_step,
        seconds_wall=time.perf_counter() - run.wall_start,
        checkpoint=(
            str(out / checkpoint.CHECKPOINT_DIR / checkpoint.checkpoint_name(cfg.steps))
            if run.status == STATUS_COMPLETED
            else None
        ),
    )
    write_json(out / SUMMARY_FILE, summary)
    _say(run.message if run.message else summary_line(summary))
    return summary


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
    x, y = _train_batch(data, cfg, step, worker)
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
    if cfg.simulate:  # P ranks in this process (gssgd.train.simulate)
        return simulate_training(cfg)
    try:
        return launch(train_worker, cfg.workers, (cfg,), timeout_s=cfg.timeout, device=cfg.device)
    except WorkerFailed as err:
        saved = checkpoint.list_checkpoints(Path(cfg.out) / checkpoint.CHECKPOINT_DIR)
        hint = (
            f"; continue from {saved[-1].name} with --resume {cfg.out}"
            if saved
            else "; no checkpoint was written yet (--checkpoint-every N writes some)"
        )
        raise WorkerFailed(err.rank, err.exit_code, hint) from None
