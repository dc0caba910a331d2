"""The training loop of ``gssgd train``, readable top to bottom.

:class:`TrainConfig` holds every setting (one comment each); :func:`run_training` checks
it, launches the workers (:mod:`gssgd.train.launch`) and returns rank 0's summary;
:func:`train_worker` is what each worker runs:

1. load the data, build the same model on every rank (same seed), make the optimizer;
2. with ``--resume``: restore parameters, optimizer, RNG and this rank's hook state;
3. wrap the model in ``DistributedDataParallel`` and register the method's comm hook
   (:class:`GradientSync`);
4. every step: this rank's batch (a pure function of the step), forward, agree on a
   finite loss, backward (DDP averages the gradients through the hook), optimizer step;
   rank 0 logs the step; evaluate and checkpoint when due;
5. rank 0 writes ``summary.json``.

Example::

    summary = run_training(TrainConfig(method="gs", dataset="digits", workers=2, steps=50,
                                       out="runs/demo"))
    summary["final_test_accuracy"]
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from gssgd.aggregators import build_options
from gssgd.aggregators.guard import SketchCollapseError
from gssgd.aggregators.options import PAYLOAD_DTYPES
from gssgd.ddp import HookState, comm_hook
from gssgd.train import checkpoint
from gssgd.train.data import ImageData, TextData, batch_indices, lm_batch, load_dataset
from gssgd.train.launch import DEVICES, Worker, WorkerFailed, launch, torchrun_world_size
from gssgd.train.metrics import (
    METRICS_FILE,
    SUMMARY_FILE,
    MetricsLog,
    RunTotals,
    builtin_hook_bytes,
    write_json,
)
from gssgd.train.models import MODELS, build_model, default_model

__all__ = [
    "HOOK_METHODS",
    "METHODS",
    "GradientSync",
    "TrainConfig",
    "default_out",
    "evaluate",
    "prepare",
    "run_training",
    "applies_to",
    "settings_for",
    "train_worker",
]

#: Every ``--method``: DDP's all-reduce, its fp16 hook, the gssgd aggregators, PowerSGD.
METHODS: tuple[str, ...] = ("dense", "dense16", "topk", "gtopk", "sketched", "gs", "powersgd")
#: The methods that go through :class:`gssgd.ddp.HookState` and an aggregator.
HOOK_METHODS: tuple[str, ...] = ("topk", "gtopk", "sketched", "gs")
#: Workers spawned when neither ``--workers`` nor torchrun says how many.
DEFAULT_WORKERS = 4
#: Start iteration of the compressing hooks when ``--start-iter`` is not given.
DEFAULT_START_ITER = 2
#: PowerSGD's matrix approximation rank when ``--powersgd-rank`` is not given.
DEFAULT_POWERSGD_RANK = 2
#: Test windows of a text evaluation (drawn once from the test split, shared by ranks).
TEXT_EVAL_WINDOWS = 512
#: ``summary["status"]`` of a finished run, and of runs that stopped early on every rank.
STATUS_COMPLETED, STATUS_NONFINITE = "completed", "stopped: non-finite loss"
STATUS_COLLAPSED = "stopped: sketch collapsed"

# Which methods each method-specific setting applies to (None = not given = the default).
_APPLIES_TO: dict[str, tuple[str, ...]] = {
    "density": HOOK_METHODS,
    "k": HOOK_METHODS,
    "local_momentum": HOOK_METHODS,
    "rows": ("sketched", "gs"),
    "cols": ("sketched", "gs"),
    "candidates": ("sketched", "gs"),
    "exact": ("gs",),
    "allreduce": ("gs",),
    "table_dtype": ("gs",),
    "guard": ("gs",),
    "powersgd_rank": ("powersgd",),
    "start_iter": (*HOOK_METHODS, "powersgd"),
    "per_bucket": HOOK_METHODS,
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _bad(name: str, value: object, valid: str, fix: str = "") -> ValueError:
    return ValueError(f"{_flag(name)}={value!r} is invalid: {valid}.{' ' + fix if fix else ''}")


@dataclass
class TrainConfig:
    """Every setting of a training run; ``gssgd train --help`` shows the same as flags.

    Values are checked on construction (``ValueError`` naming the flag, the valid range
    and a fix); ``None`` means "the default", which may depend on the data or the launcher.
    """

    # -- what to train
    method: str = "gs"  # how gradients are aggregated: one of METHODS
    dataset: str = "mnist"  # digits, mnist, fashion-mnist, shakespeare, npz:PATH or text:PATH
    model: str | None = None  # mlp, cnn, resnet or lm; None: the dataset's default (cnn, lm)
    # -- optimisation
    steps: int = 500  # total steps; a resumed run continues up to this many
    batch_size: int = 32  # samples (text: windows) per worker per step
    lr: float = 0.05  # SGD learning rate (constant)
    momentum: float = 0.9  # SGD momentum, applied to the aggregated update
    weight_decay: float = 0.0  # SGD weight decay
    seq_len: int = 64  # characters per window (text data)
    seed: int = 0  # seeds the model init, the batches and the sketch hashes
    # -- workers
    workers: int | None = None  # processes; None: WORLD_SIZE under torchrun, else 4
    device: str = "auto"  # cpu, cuda, or auto (cuda when available)
    threads: int = 1  # torch threads per worker
    timeout: float = 300.0  # seconds a collective waits for a peer before the run fails
    # -- aggregation (design.md); None: the method's own default
    density: float | None = None  # fraction of coordinates sent (default 0.01), or give k
    k: int | None = None  # coordinates sent per worker, instead of density
    local_momentum: float | None = None  # aggregator momentum with momentum stopping (0: off)
    rows: int | None = None  # sketch rows, odd (sketched, gs; default 1)
    cols: int | None = None  # sketch columns (sketched, gs; default 40k, capped at d/(4 rows))
    candidates: int | None = None  # m: the sketch proposes m*k candidates (default 32, m*k <= d/8)
    exact: bool | None = None  # gs: fetch exact values of the candidates (default True)
    allreduce: str | None = None  # gs: recursive_doubling (default) or backend
    table_dtype: str | None = None  # gs: sketch tables on the wire: float32 (default), float16, bfloat16
    guard: str | None = None  # gs: on a collapsed sketch grow it (default), raise, or off
    powersgd_rank: int | None = None  # powersgd: matrix approximation rank (default 2)
    start_iter: int | None = None  # steps of plain all-reduce before compression (default 2)
    per_bucket: bool = False  # aggregate each DDP bucket apart, not the whole model at once
    bucket_cap_mb: float | None = None  # DDP's bucket size in MB (None: DDP's default, 25)
    # -- output
    out: str | None = None  # run directory; None: runs/<method>-<dataset>-<time>
    eval_every: int = 100  # evaluate every N steps and after the last (0: after the last only)
    checkpoint_every: int = 0  # checkpoint every N steps (0: after the last only)
    resume: str | None = None  # a run directory or checkpoint file to continue from
    overwrite: bool = False  # start afresh in an --out that holds an earlier run
    progress: bool = True  # show a progress bar on rank 0
    # -- fault injection (reliability tests)
    fail_at: tuple[int, int] | None = None  # (rank, step): that rank exits abruptly there
    stall_at: tuple[int, int] | None = None  # (rank, step): that rank hangs there (a stalled peer)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise _bad("method", self.method, f"it must be one of {', '.join(METHODS)}")
        if not isinstance(self.dataset, str) or not self.dataset:
            raise _bad("dataset", self.dataset, "it must name a dataset", "For example digits.")
        if self.model is not None and self.model not in MODELS:
            raise _bad(
                "model",
                self.model,
                f"it must be one of {', '.join(MODELS)}",
                "Leave it out for the dataset's default.",
            )
        for name in ("steps", "batch_size", "seq_len", "threads"):
            _check_int(name, getattr(self, name), 1)
        for name in ("seed", "eval_every", "checkpoint_every"):
            _check_int(name, getattr(self, name), 0)
        if self.workers is not None:
            _check_int("workers", self.workers, 1)
        _check_real("lr", self.lr, "> 0", lambda v: v > 0, "For example 0.05.")
        _check_real("momentum", self.momentum, "in [0, 1)", lambda v: 0 <= v < 1, "Or 0 for none.")
        _check_real("weight_decay", self.weight_decay, ">= 0", lambda v: v >= 0)
        _check_real("timeout", self.timeout, "> 0 seconds", lambda v: v > 0, "Default: 300.")
        if self.device not in DEVICES:
            raise _bad("device", self.device, f"it must be one of {', '.join(DEVICES)}")
        self._check_method_settings()
        self.fail_at = _rank_step("fail_at", self.fail_at)
        self.stall_at = _rank_step("stall_at", self.stall_at)

    def _check_method_settings(self) -> None:
        """Refuse a method-specific setting the method would silently ignore."""
        for name, methods in _APPLIES_TO.items():
            value = getattr(self, name)
            if value not in (None, False) and self.method not in methods:
                raise ValueError(
                    f"{_flag(name)} does not apply to --method {self.method}; it applies to "
                    f"{', '.join(methods)}. Drop {_flag(name)} or pick one of those methods."
                )
        if self.density is not None and self.k is not None:
            raise ValueError(
                f"both --density={self.density} and --k={self.k} were given; give only one "
                "(k = max(1, round(density * d)) otherwise)"
            )
        if self.density is not None:
            _check_real(
                "density", self.density, "in (0, 1]", lambda v: 0 < v <= 1, "For example 0.01."
            )
        if self.local_momentum is not None:
            _check_real(
                "local_momentum",
                self.local_momentum,
                "in [0, 1)",
                lambda v: 0 <= v < 1,
                "For example 0.9, or 0 for none.",
            )
        for name in ("k", "cols", "candidates", "powersgd_rank"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        if self.rows is not None:
            _check_int("rows", self.rows, 1)
            if self.rows % 2 == 0:
                raise _bad(
                    "rows",
                    self.rows,
                    "it must be odd, so the median of the rows is one of them",
                    f"Use {self.rows + 1}.",
                )
        if self.exact is not None and not isinstance(self.exact, bool):
            raise _bad("exact", self.exact, "it must be True or False")
        if self.allreduce not in (None, "recursive_doubling", "backend"):
            raise _bad("allreduce", self.allreduce, "it must be recursive_doubling or backend")
        if self.bucket_cap_mb is not None and (
            isinstance(self.bucket_cap_mb, bool)
            or not isinstance(self.bucket_cap_mb, (int, float))
            or not 0 < self.bucket_cap_mb <= 1024
        ):
            raise _bad("bucket_cap_mb", self.bucket_cap_mb, "it must be a number in (0, 1024]")
        if self.table_dtype is not None and self.table_dtype not in PAYLOAD_DTYPES:
            raise _bad("table_dtype", self.table_dtype, "it must be float32, float16 or bfloat16")
        if self.guard not in (None, "grow", "raise", "off"):
            raise _bad("guard", self.guard, "it must be grow, raise or off")
        if self.start_iter is not None:
            # DDP rebuilds its buckets after step 0; PowerSGD also needs one more dense step
            _check_int("start_iter", self.start_iter, 2 if self.method == "powersgd" else 1)

    # ---------------------------------------------------------------- derived settings
    def aggregator_options(self) -> dict[str, Any]:
        """The keyword options of the aggregator (``k`` included), defaults left out."""
        names = {
            "k": "k",
            "local_momentum": "momentum",
            "rows": "rows",
            "cols": "cols",
            "candidates": "candidates",
            "exact": "exact",
            "allreduce": "allreduce",
            "guard": "guard",
        }
        opts = {
            opt: getattr(self, field)
            for field, opt in names.items()
            if getattr(self, field) is not None
        }
        if self.method in ("sketched", "gs"):
            opts["seed"] = self.seed
        if self.table_dtype is not None:
            opts["table_dtype"] = PAYLOAD_DTYPES[self.table_dtype]
        return opts

    @property
    def resolved_start_iter(self) -> int:
        """``start_iter``, or its default."""
        return DEFAULT_START_ITER if self.start_iter is None else self.start_iter


def settings_for(method: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` (TrainConfig keyword arguments) without those ``method`` does not take.

    ``gssgd compare`` builds one config per method from the same flags this way.
    """
    return {
        name: value
        for name, value in settings.items()
        if name not in _APPLIES_TO or method in _APPLIES_TO[name]
    }


def applies_to(name: str) -> tuple[str, ...]:
    """The methods a method-specific setting applies to (all methods for the others)."""
    return _APPLIES_TO.get(name, METHODS)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(name, value, f"it must be an integer >= {minimum}")


def _check_real(name: str, value: object, valid: str, ok: Any, fix: str = "") -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not ok(value)
    ):
        raise _bad(name, value, f"it must be a number {valid}", fix)


# =========================================================================== gradient sync


class GradientSync:
    """How DDP averages the gradients for ``cfg.method``, what that cost, and its state.

    * ``dense``: DDP's own all-reduce (no hook); ``dense16``: DDP's ``fp16_compress_hook``;
    * ``powersgd``: PyTorch's PowerSGD hook (rank ``--powersgd-rank``, error feedback,
      warm start, ``start_powerSGD_iter = --start-iter``);
    * ``topk``, ``gtopk``, ``sketched``, ``gs``: :class:`gssgd.ddp.HookState` with
      :func:`gssgd.ddp.comm_hook`, over the whole model unless ``--per-bucket``.

    Args:
        ddp: the wrapped model.
        cfg: the run's settings.
        world_size: number of workers.
    """

    def __init__(self, ddp: DistributedDataParallel, cfg: TrainConfig, world_size: int) -> None:
        self.method, self.world_size = cfg.method, world_size
        self.shapes = [p.shape for p in ddp.module.parameters() if p.requires_grad]
        self.start_iter = cfg.resolved_start_iter
        self.powersgd_rank = cfg.powersgd_rank or DEFAULT_POWERSGD_RANK
        self.hook_state: Any = None
        self.powersgd: powersgd.PowerSGDState | None = None
        if cfg.method == "dense16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif cfg.method == "powersgd":
            self.powersgd = powersgd.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=self.start_iter,
                random_seed=cfg.seed,
            )
            ddp.register_comm_hook(self.powersgd, powersgd.powerSGD_hook)
        elif cfg.method in HOOK_METHODS:
            self.hook_state = HookState(
                cfg.method,
                density=cfg.density,
                start_iter=self.start_iter,
                whole_model=not cfg.per_bucket,
                model=None if cfg.per_bucket else ddp.module,
                **cfg.aggregator_options(),
            )
            ddp.register_comm_hook(self.hook_state, comm_hook)

    def step_stats(self, step: int) -> dict[str, Any]:
        """What the last step's gradient averaging cost this rank (None: not measurable)."""
        if self.hook_state is not None:
            s = self.hook_state.last_stats
            if s is not None:
                return {
                    "bytes_sent": s.bytes_sent,
                    "bytes_received": s.bytes_received,
                    "seconds_compress": s.seconds_compress,
                    "seconds_communicate": s.seconds_communicate,
                    "seconds_decompress": s.seconds_decompress,
                    "delivered_fraction": s.delivered_fraction,
                    "skipped": bool(s.skipped),
                    "k": s.k,
                }
        compressed = self.method == "powersgd" and step >= self.start_iter
        method = self.method if self.method in ("dense16", "powersgd") else "dense"
        sent = builtin_hook_bytes(
            method, self.shapes, self.world_size, compressed, self.powersgd_rank
        )
        return {
            "bytes_sent": sent,
            "bytes_received": sent,
            "seconds_compress": None,
            "seconds_communicate": None,
            "seconds_decompress": None,
            "delivered_fraction": None,
            "skipped": False,
            "k": None,
        }

    def state_dict(self) -> dict[str, Any]:
        """This rank's hook state (residuals, PowerSGD's memories), weights_only-safe."""
        if self.hook_state is not None:
            return {"hook": self.hook_state.state_dict()}
        if self.powersgd is not None:
            p = self.powersgd
            _, keys, pos, has_gauss, cached = p.rng.get_state()
            return {
                "powersgd": {
                    "iter": p.iter,
                    "error": dict(p.error_dict),
                    "p": dict(p.p_memory_dict),
                    "q": dict(p.q_memory_dict),
                    "rng": {
                        "keys": torch.from_numpy(keys.astype(np.int64)),
                        "pos": int(pos),
                        "has_gauss": int(has_gauss),
                        "cached": float(cached),
                    },
                }
            }
        return {}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output of the same method."""
        if self.hook_state is not None:
            self.hook_state.load_state_dict(sd["hook"])
        elif self.powersgd is not None:
            p, saved = self.powersgd, sd["powersgd"]
            p.iter = int(saved["iter"])
            p.error_dict = dict(saved["error"])
            p.p_memory_dict = dict(saved["p"])
            p.q_memory_dict = dict(saved["q"])
            rng = saved["rng"]
            p.rng.set_state(
                (
                    "MT19937",
                    rng["keys"].numpy().astype(np.uint32),
                    rng["pos"],
                    rng["has_gauss"],
                    rng["cached"],
                )
            )


# =========================================================================== data and eval


def _train_batch(
    data: ImageData | TextData, cfg: TrainConfig, step: int, worker: Worker
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch at ``step``: a pure function of (seed, step, rank)."""
    if isinstance(data, TextData):
        x, y = lm_batch(
            data.train, step, worker.rank, worker.world_size, cfg.batch_size, cfg.seq_len, cfg.seed
        )
    else:
        idx = batch_indices(
            step, worker.rank, worker.world_size, cfg.batch_size, len(data.y_train), cfg.seed
        )
        x, y = data.x_train[idx], data.y_train[idx]
    return x.to(worker.device), y.to(worker.device)


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Mean cross-entropy, correct predictions and count (text: per character)."""
    logits = logits.reshape(-1, logits.shape[-1])
    targets = targets.reshape(-1)
    loss = F.cross_entropy(logits, targets)
    correct = int((logits.detach().argmax(dim=1) == targets).sum())
    return loss, correct, targets.numel()


@torch.no_grad()
def evaluate(
    model: nn.Module, data: ImageData | TextData, cfg: TrainConfig, worker: Worker
) -> tuple[float, float]:
    """Test loss and accuracy; every rank scores its share, the sums are all-reduced.

    Images: the whole test split (rank ``r`` scores samples ``r, r+P, ...``). Text:
    :data:`TEXT_EVAL_WINDOWS` windows drawn once from the test split.

    Returns:
        ``(test_loss, test_accuracy)``, the same on every rank.
    """
    model.eval()
    if isinstance(data, TextData):
        x, y = lm_batch(data.test, 0, 0, 1, TEXT_EVAL_WINDOWS, cfg.seq_len, cfg.seed)
    else:
        x, y = data.x_test, data.y_test
    x, y = x[worker.rank :: worker.world_size], y[worker.rank :: worker.world_size]
    sums = torch.zeros(3, dtype=torch.float64)
    chunk = 64 if isinstance(data, TextData) else 1000
    for i in range(0, len(y), chunk):
        logits = model(x[i : i + chunk].to(worker.device))
        targets = y[i : i + chunk].to(worker.device)
        loss, correct, count = _loss(logits, targets)
        sums += torch.tensor([float(loss) * count, correct, count], dtype=torch.float64)
    model.train()
    sums = sums.to(worker.device)
    dist.all_reduce(sums)
    loss_sum, correct, count = sums.tolist()
    return loss_sum / count, correct / count


# =========================================================================== the loop


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
    rank, world_size, device = worker.rank, worker.world_size, worker.device
    is_main = rank == 0
    out = Path(cfg.out)
    torch.set_num_threads(cfg.threads)

    # 1. Data, the same initial model on every rank, the optimizer.
    data = load_dataset(cfg.dataset)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data).to(device)
    d = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    fingerprint = checkpoint.fingerprint(cfg.method, cfg.model, cfg.dataset, world_size, d)

    # 2. Resume: parameters, optimizer, this rank's RNG and (below) hook state, totals.
    start_step, totals, resumed = 0, RunTotals(), None
    if cfg.resume:
        resumed = checkpoint.load_checkpoint(cfg.resume)
        checkpoint.check_fingerprint(resumed["fingerprint"], fingerprint, cfg.resume)
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        _set_rng_state(resumed["ranks"][rank]["rng"], device)
        totals.load_state_dict(resumed.get("totals", {}))
        start_step = int(resumed["step"])

    # 3. DDP and the method's gradient averaging.
    ddp = DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        **({} if cfg.bucket_cap_mb is None else {"bucket_cap_mb": cfg.bucket_cap_mb}),
    )
    if resumed is not None:
        _rebuild_buckets(ddp, data, cfg, start_step, worker)
    sync = GradientSync(ddp, cfg, world_size)
    if resumed is not None:
        sync.load_state_dict(resumed["ranks"][rank]["sync"])
    del resumed
    warmup = max(cfg.resolved_start_iter, 1)  # steps left out of the per-step averages

    log = MetricsLog(out, start_step) if is_main else None
    if is_main:
        write_json(
            out / "config.json", {**dataclasses.asdict(cfg), "world_size": world_size, "d": d}
        )
        _say(
            f"gssgd train: {cfg.method} on {cfg.dataset} ({cfg.model}, d={d:,}), "
            f"{world_size} workers, steps {start_step}..{cfg.steps} -> {out}"
        )
    bar = tqdm(
        total=cfg.steps,
        initial=start_step,
        desc=cfg.method,
        unit="step",
        disable=not (is_main and cfg.progress),
        dynamic_ncols=True,
        mininterval=0.5,
    )
    status, message, last_eval, last_loss = STATUS_COMPLETED, "", (None, None), None
    wall_start = time.perf_counter()

    # 4. The loop.
    step = start_step
    try:
        for step in range(start_step, cfg.steps):
            if cfg.fail_at == (rank, step):
                _die(f"--fail-at {rank}:{step}: rank {rank} exits abruptly (fault injection)")
            if cfg.stall_at == (rank, step):
                _say(
                    f"gssgd: --stall-at {rank}:{step}: rank {rank} stops answering (fault injection)"
                )
                time.sleep(10**6)
            t0 = time.perf_counter()
            x, y = _train_batch(data, cfg, step, worker)
            loss, correct, count = _loss(ddp(x), y)
            t_forward = time.perf_counter() - t0

            # Every rank learns whether any loss is non-finite, and stops together if so.
            value = float(loss.detach())
            seen = torch.tensor(
                [value * count, correct, count, not math.isfinite(value)],
                dtype=torch.float64,
                device=device,
            )
            dist.all_reduce(seen)
            loss_sum, correct_sum, count_sum, nonfinite = seen.tolist()
            if nonfinite:
                status = STATUS_NONFINITE
                message = (
                    f"gssgd train: stopped at step {step}: the training loss is not finite (NaN "
                    f"or Inf) on {int(nonfinite)} of "
                    f"{world_size} workers; every worker stopped. Lower --lr (now {cfg.lr}) or "
                    "resume an earlier checkpoint with a lower --lr."
                )
                break

            t1 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            try:
                loss.backward()  # DDP averages the gradients here, through the method's hook
            except SketchCollapseError as err:  # raised on every rank at this same step
                status = STATUS_COLLAPSED
                saved = checkpoint.list_checkpoints(out / checkpoint.CHECKPOINT_DIR)
                message = f"gssgd train: stopped at step {step}: {err}" + (
                    f" The weights were not updated; {saved[-1].name} in {out} is kept."
                    if saved
                    else " The weights were not updated."
                )
                break
            optimizer.step()
            t_end = time.perf_counter()

            seconds_step = t_forward + (t_end - t1)  # the loss all-reduce left out
            stats = sync.step_stats(step)
            hook_seconds = sum(
                stats[k] or 0.0
                for k in ("seconds_compress", "seconds_communicate", "seconds_decompress")
            )
            sent = _gather_bytes(stats, worker)  # (mean sent, max sent, mean received) over ranks
            last_loss = loss_sum / count_sum
            record = {
                "step": step,
                "loss": last_loss,
                "train_accuracy": correct_sum / count_sum,
                "bytes_sent": sent[0],
                "bytes_sent_max": sent[1],
                "bytes_received": sent[2],
                "bytes_sent_total": totals.bytes_sent + sent[0],
                "seconds_compute": seconds_step - hook_seconds,
                "seconds_compress": stats["seconds_compress"],
                "seconds_communicate": stats["seconds_communicate"],
                "seconds_decompress": stats["seconds_decompress"],
                "seconds_step": seconds_step,
                "delivered_fraction": stats["delivered_fraction"],
                "skipped": stats["skipped"],
                "k": stats["k"],
            }
            totals.add(record, measured=step >= warmup)

            done = step + 1
            if done == cfg.steps or (cfg.eval_every and done % cfg.eval_every == 0):
                last_eval = evaluate(ddp.module, data, cfg, worker)
                record["test_loss"], record["test_accuracy"] = last_eval
            if log is not None:  # before the checkpoint: a resumed run finds every earlier line
                log.write(record)
                bar.set_postfix(
                    loss=f"{last_loss:.3f}", acc=f"{record['train_accuracy']:.3f}", refresh=False
                )
                bar.update(1)
            if done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0):
                _save_checkpoint(
                    out, done, cfg, fingerprint, model, optimizer, sync, totals, worker
                )
    except (RuntimeError, dist.DistBackendError) as err:
        if isinstance(err, FloatingPointError) or not _collective_failure(err):
            raise
        raise RuntimeError(
            f"step {step}: a collective failed or waited longer than --timeout {cfg.timeout:g} s "
            f"on rank {rank} ({err}). A peer died or stalled: check the other workers' output; "
            "raise --timeout on slow links, or continue with --resume from the run's --out."
        ) from err
    bar.close()

    # 5. Rank 0 sums the run up.
    if log is None:
        return None
    log.close()
    summary = {
        "status": status,
        "message": message,
        "method": cfg.method,
        "dataset": cfg.dataset,
        "model": cfg.model,
        "world_size": world_size,
        "d": d,
        "steps": totals.steps,
        "final_train_loss": last_loss,
        "final_test_loss": last_eval[0],
        "final_test_accuracy": last_eval[1],
        **totals.per_step(),
        "bytes_sent_total": totals.bytes_sent,
        "measured_from_step": warmup,
        "seconds_wall": time.perf_counter() - wall_start,
        "checkpoint": (
            str(out / checkpoint.CHECKPOINT_DIR / checkpoint.checkpoint_name(cfg.steps))
            if status == STATUS_COMPLETED
            else None
        ),
        "config": dataclasses.asdict(cfg),
    }
    write_json(out / SUMMARY_FILE, summary)
    _say(message if message else _one_line(summary))
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
    _loss(ddp(x), y)[0].backward()
    ddp.zero_grad(set_to_none=True)


def _gather_bytes(stats: dict[str, Any], worker: Worker) -> tuple[float, float, float]:
    """(mean bytes sent, max bytes sent, mean bytes received) over the ranks."""
    mine = torch.tensor(
        [stats["bytes_sent"], stats["bytes_received"]], dtype=torch.float64, device=worker.device
    )
    everyone = [torch.empty_like(mine) for _ in range(worker.world_size)]
    dist.all_gather(everyone, mine)
    table = torch.stack(everyone).cpu()
    return float(table[:, 0].mean()), float(table[:, 0].max()), float(table[:, 1].mean())


def _save_checkpoint(
    out: Path,
    step: int,
    cfg: TrainConfig,
    fingerprint: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sync: GradientSync,
    totals: RunTotals,
    worker: Worker,
) -> None:
    """Gather every rank's RNG and hook state to rank 0, which writes the checkpoint.

    A collective: every rank learns whether rank 0's write succeeded and raises if not.
    """
    mine = {"rng": _rng_state(worker.device), "sync": _to_cpu(sync.state_dict())}
    everyone: list[Any] | None = [None] * worker.world_size if worker.rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    ok, error = torch.ones(1, device=worker.device), None
    if worker.rank == 0:
        try:
            checkpoint.save_checkpoint(
                out,
                step,
                {
                    "fingerprint": fingerprint,
                    "config": dataclasses.asdict(cfg),
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "ranks": everyone,
                    "totals": totals.state_dict(),
                },
            )
        except OSError as err:
            ok.zero_()
            error = err
    dist.broadcast(ok, src=0)
    if error is not None:
        raise OSError(f"writing the checkpoint of step {step} to {out} failed: {error}") from error
    if not bool(ok.item()):
        raise RuntimeError(f"rank 0 could not write the checkpoint of step {step} (see its error)")


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _to_cpu(value: Any) -> Any:
    """Tensors to the CPU, containers rebuilt as plain dicts/lists (for gather_object)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _collective_failure(err: BaseException) -> bool:
    """Whether an error came from a collective (gloo/NCCL timeouts, closed connections)."""
    if isinstance(err, dist.DistBackendError):
        return True
    text = str(err).lower()
    return any(w in text for w in ("timed out", "timeout", "connection", "gloo", "nccl", "peer"))


def _die(message: str) -> None:
    print(f"gssgd: {message}", file=sys.stderr, flush=True)
    os._exit(1)


def _say(message: str) -> None:
    tqdm.write(message, file=sys.stderr)


def _one_line(summary: dict[str, Any]) -> str:
    acc = summary["final_test_accuracy"]
    bytes_ = summary["bytes_sent_per_step"]
    return (
        f"gssgd train: done after {summary['steps']} steps: test loss "
        f"{summary['final_test_loss']:.4f}, test accuracy {acc:.4f}, "
        + (f"{bytes_:,.0f} bytes sent per worker per step, " if bytes_ is not None else "")
        + (
            f"{summary['seconds_per_step'] * 1e3:.1f} ms per step"
            if summary["seconds_per_step"] is not None
            else ""
        )
    )


# =========================================================================== entry points


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
    cfg = _after_elastic_restart(cfg)
    world = torchrun_world_size()
    if world is not None and cfg.workers is not None and cfg.workers != world:
        raise ValueError(
            f"--workers {cfg.workers} but torchrun started {world} workers; "
            "leave --workers out under torchrun"
        )
    workers = world or cfg.workers or DEFAULT_WORKERS
    data = load_dataset(cfg.dataset)
    model_name = cfg.model or default_model(data)
    model = build_model(model_name, data)
    d = sum(p.numel() for p in model.parameters())
    if isinstance(data, TextData):
        lm_batch(data.train, 0, 0, workers, cfg.batch_size, cfg.seq_len, cfg.seed)
        lm_batch(data.test, 0, 0, 1, 1, cfg.seq_len, cfg.seed)
    elif len(data.y_train) < workers * cfg.batch_size:
        raise ValueError(
            f"dataset {cfg.dataset!r} has {len(data.y_train)} training samples, fewer than "
            f"--workers {workers} x --batch-size {cfg.batch_size}; lower either"
        )
    if cfg.method in HOOK_METHODS:
        build_options(cfg.method, d, cfg.density, **cfg.aggregator_options())

    resume = None
    if cfg.resume:
        resume = checkpoint.resolve_checkpoint(cfg.resume)
        saved = checkpoint.load_checkpoint(resume)
        checkpoint.check_fingerprint(
            saved["fingerprint"],
            checkpoint.fingerprint(cfg.method, model_name, cfg.dataset, workers, d),
            resume,
        )
        if saved["step"] >= cfg.steps:
            raise ValueError(
                f"{resume} is at step {saved['step']} and --steps is {cfg.steps}: nothing to "
                f"train. --steps is the total; pass a larger one, e.g. --steps {saved['step'] * 2}"
            )
    out = Path(cfg.out) if cfg.out else _run_dir_of(resume) if resume else default_out(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 alone touches --out
        continuing = resume is not None and out.resolve() == _run_dir_of(resume).resolve()
        _claim_out(out, continuing=continuing, overwrite=cfg.overwrite)
    return dataclasses.replace(
        cfg, workers=workers, model=model_name, out=str(out), resume=str(resume) if resume else None
    )


def _run_dir_of(checkpoint_file: Path) -> Path:
    parent = checkpoint_file.parent
    return parent.parent if parent.name == checkpoint.CHECKPOINT_DIR else parent


def _rank_step(name: str, value: object) -> tuple[int, int] | None:
    """Validate a fault-injection ``(rank, step)`` pair (None passes)."""
    if value is None:
        return None
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value)
    ):
        flag = "--" + name.replace("_", "-")
        raise _bad(
            name, value, "it must be RANK:STEP with integers >= 0", f"For example {flag} 1:10."
        )
    return (int(value[0]), int(value[1]))


def _after_elastic_restart(cfg: TrainConfig) -> TrainConfig:
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


def _claim_out(out: Path, continuing: bool, overwrite: bool) -> None:
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
