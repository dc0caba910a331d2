"""Before any worker starts: the run directory, elastic restarts, and the checks that
need the data and the model (:func:`prepare`).

A run directory holds one run: ``config.json``, ``metrics.jsonl``, ``summary.json`` and
``checkpoints/``. :func:`claim_out` refuses to mix a run into another's files;
:func:`after_elastic_restart` makes a worker that torchrun restarted continue from the
newest checkpoint of its ``--out``.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import datetime
from pathlib import Path

from gssgd.aggregators import build_options
from gssgd.methods import get_method
from gssgd.train import checkpoint
from gssgd.train.config import DEFAULT_WORKERS, TrainConfig
from gssgd.train.data import TextData, lm_batch, load_dataset
from gssgd.train.launch import torchrun_world_size
from gssgd.train.metrics import METRICS_FILE, SUMMARY_FILE
from gssgd.train.models import build_model, default_model, trained_size

__all__ = ["after_elastic_restart", "claim_out", "default_out", "prepare", "run_dir_of"]


def default_out(cfg: TrainConfig) -> Path:
    """``runs/<method>-<dataset>-<YYYYmmdd-HHMMSS>`` (the dataset's path separators as -)."""
    dataset = cfg.dataset.replace(":", "-").replace("/", "-").strip("-")
    return Path("runs") / f"{cfg.method}-{dataset}-{datetime.now():%Y%m%d-%H%M%S}"


def prepare(cfg: TrainConfig) -> TrainConfig:
    """Check what can be checked before any worker starts; fill in the defaults.

    Loads the data, builds the model once for its size, validates the aggregator's
    options, the output directory and the checkpoint to resume.

    Returns:
        A copy with ``workers``, ``model``, ``out`` and ``resume`` (the checkpoint file)
        filled in.

    Raises:
        ValueError: an invalid combination (the message names the flags and the fix),
            a checkpoint of another run, or an ``--out`` that holds a run already.
        CheckpointError: the checkpoint to resume is unreadable.
        DatasetUnavailableError, FileNotFoundError: the data are not there.
    """
    cfg = after_elastic_restart(cfg)
    world = torchrun_world_size()
    if world is not None and cfg.workers is not None and cfg.workers != world:
        raise ValueError(
            f"--workers {cfg.workers} but torchrun started {world} workers; "
            "leave --workers out under torchrun"
        )
    workers = world or cfg.workers or DEFAULT_WORKERS
    if cfg.global_batch is not None:
        cfg = dataclasses.replace(cfg, batch_size=batch_per_worker(cfg.global_batch, workers))
    data = load_dataset(cfg.dataset)
    model_name = cfg.model or default_model(data)
    model = build_model(model_name, data)
    d = trained_size(model)
    if isinstance(data, TextData):
        lm_batch(data.train, 0, 0, workers, cfg.batch_size, cfg.seq_len, cfg.seed)
        lm_batch(data.test, 0, 0, 1, 1, cfg.seq_len, cfg.seed)
    elif len(data.y_train) < workers * cfg.batch_size:
        raise ValueError(
            f"dataset {cfg.dataset!r} has {len(data.y_train)} training samples, fewer than "
            f"--workers {workers} x --batch-size {cfg.batch_size}; lower either"
        )
    if get_method(cfg.method).aggregator is not None:
        where = "the model" if not cfg.per_bucket else "the model (its largest bucket may be smaller)"
        cfg.hook_settings().check_k(d, where)
        build_options(cfg.method, d, cfg.option("density"), **cfg.aggregator_options())
    resume = _checkpoint_to_resume(cfg, model_name, workers, d)
    out = Path(cfg.out) if cfg.out else run_dir_of(resume) if resume else default_out(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 alone touches --out
        continuing = resume is not None and out.resolve() == run_dir_of(resume).resolve()
        claim_out(out, continuing=continuing, overwrite=cfg.overwrite)
    return dataclasses.replace(
        cfg, workers=workers, model=model_name, out=str(out), resume=str(resume) if resume else None
    )


def _checkpoint_to_resume(cfg: TrainConfig, model_name: str, workers: int, d: int
                          ) -> Path | None:
    """The checkpoint file ``--resume`` names, checked to belong to this run and to leave
    steps to train (None without ``--resume``)."""
    resume = None
    if cfg.resume:
        resume = checkpoint.resolve_checkpoint(cfg.resume)
        saved = checkpoint.load_checkpoint(resume)
        checkpoint.check_fingerprint(
            checkpoint.renamed_fingerprint(saved, cfg.method),
            checkpoint.fingerprint(cfg.method, model_name, cfg.dataset, workers, d),
            resume,
        )
        if saved["step"] >= cfg.steps:
            raise ValueError(
                f"{resume} is at step {saved['step']} and --steps is {cfg.steps}: nothing to "
                f"train. --steps is the total; pass a larger one, e.g. --steps {saved['step'] * 2}"
            )
    return resume


def batch_per_worker(global_batch: int, workers: int) -> int:
    """``--global-batch`` split over the workers: a fixed global batch keeps the
    optimisation the same when the number of workers changes.

    Raises:
        ValueError: ``global_batch`` is not a multiple of ``workers``.
    """
    if global_batch % workers:
        lower, upper = workers * (global_batch // workers), workers * (global_batch // workers + 1)
        raise ValueError(
            f"--global-batch {global_batch} does not split evenly over --workers {workers}: it "
            f"must be a multiple of the workers, e.g. {lower or upper} or {upper}"
        )
    return global_batch // workers


def run_dir_of(checkpoint_file: Path) -> Path:
    """The run directory a checkpoint file belongs to."""
    parent = checkpoint_file.parent
    return parent.parent if parent.name == checkpoint.CHECKPOINT_DIR else parent


def after_elastic_restart(cfg: TrainConfig) -> TrainConfig:
    """Under ``torchrun --max-restarts``, a restarted worker continues from ``--out``.

    torchrun restarts every worker when one dies (``TORCHELASTIC_RESTART_COUNT`` counts the
    restarts). The restarted run resumes from the newest checkpoint in ``--out``, with every
    rank's aggregator state, or starts afresh there if none was written yet; the fault that
    ``--fail-at`` / ``--stall-at`` inject fires in the first attempt only.
    """
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
        return cfg
    cfg = dataclasses.replace(cfg, fail_at=None, stall_at=None)
    if cfg.resume is not None or cfg.out is None:
        return cfg
    try:
        checkpoint.resolve_checkpoint(cfg.out)
    except (checkpoint.CheckpointError, FileNotFoundError, ValueError):
        return dataclasses.replace(cfg, overwrite=True)  # died before its first checkpoint
    return dataclasses.replace(cfg, resume=cfg.out, overwrite=False)


def claim_out(out: Path, continuing: bool, overwrite: bool) -> None:
    """Make ``out``; refuse to mix a run into another run's files.

    Args:
        out: the run directory.
        continuing: this run resumes the run that wrote ``out``.
        overwrite: delete an earlier run's files there (``--overwrite``).
    """
    ours = [out / METRICS_FILE, out / SUMMARY_FILE, out / "config.json"]
    ckpt_dir = out / checkpoint.CHECKPOINT_DIR
    earlier = [p for p in ours if p.exists()] + checkpoint.list_checkpoints(ckpt_dir)
    if earlier and not continuing:
        if not overwrite:
            raise ValueError(
                f"--out {out} already holds a run ({', '.join(p.name for p in earlier[:3])}); "
                f"pass --resume {out} to continue it, --overwrite to start afresh there, or "
                "another --out"
            )
        for p in earlier + [ckpt_dir / checkpoint.LATEST]:
            p.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
