"""How a training run averages its gradients: DDP's built-ins or a gssgd comm hook.

:class:`GradientSync` registers the method's hook on the DDP model, reports what each step's
averaging cost, and saves and restores the hook's state for checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

from gssgd.aggregators import StepStats
from gssgd.comm import ring_allreduce_bytes
from gssgd.ddp import HookState, comm_hook
from gssgd.local_steps import LocalSteps
from gssgd.methods import METHODS, get_method
from gssgd.train.config import DEFAULT_POWERSGD_RANK, TrainConfig

__all__ = ["GradientSync", "builtin_hook_bytes", "hook_step_stats", "local_step_stats",
           "local_steps_for"]


def builtin_hook_bytes(
    method: str,
    shapes: Iterable[torch.Size],
    world_size: int,
    compressed: bool,
    powersgd_rank: int = 2,
    min_compression_rate: float = 2.0,
) -> int:
    """Payload bytes one rank sends per step with DDP's built-in communication.

    Args:
        method: ``"ddp-allreduce"`` (float32 all-reduce), ``"ddp-fp16"``
            (``fp16_compress_hook``) or ``"torch-powersgd"`` (PyTorch's PowerSGD hook).
        shapes: the shapes of the model's gradients (float32).
        world_size: the number of ranks P.
        compressed: for PowerSGD, whether this step is past ``start_powerSGD_iter`` (before
            it, PowerSGD all-reduces the dense gradient).
        powersgd_rank: PowerSGD's ``matrix_approximation_rank``.
        min_compression_rate: PowerSGD's rule for which tensors it compresses.

    Returns:
        Bytes sent (the same number is received), by the ring figure per all-reduce.
        PowerSGD is counted as its hook works: 1-D and small tensors are all-reduced
        uncompressed; every other tensor, viewed as an ``n x m`` matrix, sends its
        ``P`` factor (``n·r``) and its ``Q`` factor (``m·r``) in two further all-reduces.

    Raises:
        ValueError: an unknown method.
    """
    shapes = [torch.Size(s) for s in shapes]
    numel = sum(s.numel() for s in shapes)
    hook = METHODS[method].ddp_hook if method in METHODS else ""
    if hook == "allreduce" or (hook == "powerSGD_hook" and not compressed):
        return ring_allreduce_bytes(4 * numel, world_size)
    if hook == "fp16_compress_hook":
        return ring_allreduce_bytes(2 * numel, world_size)
    if hook != "powerSGD_hook":
        builtins = ", ".join(m.name for m in METHODS.values() if m.ddp_hook)
        raise ValueError(
            f"method {method!r} has no built-in DDP hook; use one of {builtins} (gssgd's own "
            "methods count their bytes in their hook's last_stats)"
        )
    uncompressed = ps = qs = 0
    for shape in shapes:
        n = shape[0] if len(shape) else 1
        m = shape.numel() // n if n else 0
        r = min(n, m, powersgd_rank)
        if len(shape) > 1 and (n + m) * r * min_compression_rate < n * m:
            ps, qs = ps + n * r, qs + m * r
        else:
            uncompressed += shape.numel()
    return sum(ring_allreduce_bytes(4 * count, world_size) for count in (uncompressed, ps, qs))


def hook_step_stats(s: StepStats) -> dict[str, Any]:
    """A comm hook's statistics of one iteration, in the fields of a metrics line."""
    return {
        "bytes_sent": s.bytes_sent,
        "bytes_received": s.bytes_received,
        "seconds_compress": s.seconds_compress,
        "seconds_communicate": s.seconds_communicate,
        "seconds_decompress": s.seconds_decompress,
        "delivered_fraction": s.delivered_fraction,
        "audited_recall": s.audited_recall,
        "skipped": bool(s.skipped),
        "k": s.k,
        "seconds_blocked": s.seconds_blocked,
    }


def local_steps_for(cfg: TrainConfig, model: torch.nn.Module, group: Any = None,
                    broadcast: bool = True) -> LocalSteps:
    """The run's :class:`~gssgd.local_steps.LocalSteps` (``--local-steps``, ``--outer-lr``,
    ``--outer-momentum``, ``--outer-error-decay``, the method and its options), on ``group``
    (a simulated rank, or None: the default group)."""
    assert cfg.local_steps and cfg.outer_lr is not None and cfg.outer_momentum is not None
    return LocalSteps(model, cfg.method, local_steps=cfg.local_steps,
                      density=cfg.option("density"),
                      outer_lr=cfg.outer_lr, outer_momentum=cfg.outer_momentum,
                      error_decay=cfg.outer_error_decay or 1.0, group=group,
                      broadcast=broadcast, **cfg.aggregator_options())


def local_step_stats(local: LocalSteps, outer: bool) -> dict[str, Any]:
    """A step's fields of a metrics line under local steps: the outer step's statistics
    when this step took one (``outer``), nothing moved on an inner step."""
    stats = local.last_stats if outer and local.last_stats is not None else StepStats()
    return hook_step_stats(stats)


#: Why PyTorch's PowerSGD hook runs bucket by bucket on gloo (printed by the run).
GLOO_POWERSGD_NOTE = (
    "torch-powersgd on gloo: each bucket's hook completes before the backward goes on. "
    "PyTorch's hook issues its P and Q all-reduces from future callbacks, which gloo runs "
    "on its own threads, so with several buckets the ranks would issue collectives in "
    "different orders (gloo: \"Received data size doesn't match expected size\"); on NCCL "
    "the hook is registered as PyTorch wrote it, overlapping the backward."
)


def bucket_by_bucket(hook: Callable[[Any, dist.GradBucket], torch.futures.Future]
                     ) -> Callable[[Any, dist.GradBucket], torch.futures.Future]:
    """``hook``, each bucket's future waited for inside the hook: the next bucket's first
    collective is issued only after this bucket's chain has issued all of its own, so every
    rank issues them in one order, whatever thread runs the chain's callbacks."""
    def finished_in_order(state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
        fut = hook(state, bucket)
        fut.wait()
        return fut
    # DDP's register_comm_hook compares these with the classes (this module's annotations
    # are strings under ``from __future__ import annotations``).
    finished_in_order.__annotations__ = {"bucket": dist.GradBucket,
                                         "return": torch.futures.Future[torch.Tensor]}
    return finished_in_order


class GradientSync:
    """How DDP averages the gradients for ``cfg.method``, what that cost, and its state.

    * ``ddp-allreduce``: DDP's own all-reduce (no hook); ``ddp-fp16``: DDP's
      ``fp16_compress_hook``;
    * ``torch-powersgd``: PyTorch's PowerSGD hook (rank ``--powersgd-rank``, error
      feedback, warm start, ``start_powerSGD_iter = --start-iter``);
    * every aggregator method of the registry (``dense``, ``topk``, ``gtopk``,
      ``sketched``, ``gs``, ``powersgd``, and any registered one), with the parameters'
      shapes for a method that needs them: :class:`gssgd.ddp.HookState` with
      :func:`gssgd.ddp.comm_hook`, over the whole model unless ``--per-bucket``;
    * with ``--local-steps H``: no hook (the loop trains under ``no_sync``); every H-th
      :meth:`after_step` is the outer step of :class:`gssgd.local_steps.LocalSteps`,
      which aggregates the pseudo-gradient with the method.

    Args:
        ddp: the wrapped model.
        cfg: the run's settings.
        world_size: number of workers.
        scaler: the run's GradScaler (``--amp fp16``), or None; the hook follows its loss
            scale, and its state is saved with the hook's.
        optimizer: the run's optimizer; with local steps its state and the model's differ
            by rank between outer steps, so each rank's are saved with its sync state.
    """

    def __init__(
        self,
        ddp: DistributedDataParallel,
        cfg: TrainConfig,
        world_size: int,
        scaler: torch.amp.GradScaler | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.method, self.world_size = cfg.method, world_size
        self.ddp_hook = get_method(cfg.method).ddp_hook
        self.module, self.optimizer = ddp.module, optimizer
        self.scaler = scaler
        self.shapes = [p.shape for p in ddp.module.parameters() if p.requires_grad]
        self.start_iter = cfg.resolved_start_iter
        self.powersgd_rank = cfg.option("rank") or DEFAULT_POWERSGD_RANK
        self.hook_state: Any = None
        self.powersgd: powersgd.PowerSGDState | None = None
        self.local: LocalSteps | None = None
        self.outer_now = False  # the last after_step took the outer step
        self.note: str | None = None  # how the run departs from the method's usual way
        if cfg.local_steps:
            self.local = local_steps_for(cfg, ddp.module)
        elif self.ddp_hook == "fp16_compress_hook":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.ddp_hook == "powerSGD_hook":
            self.powersgd = powersgd.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=self.start_iter,
                random_seed=cfg.seed,
            )
            hook = powersgd.powerSGD_hook
            if torch.distributed.get_backend() == "gloo":
                hook = bucket_by_bucket(hook)
                self.note = GLOO_POWERSGD_NOTE
            ddp.register_comm_hook(self.powersgd, hook)
        elif get_method(cfg.method).aggregator is not None:
            self.hook_state = HookState.from_settings(
                cfg.hook_settings(), model=None if cfg.per_bucket else ddp.module, scaler=scaler
            )
            ddp.register_comm_hook(self.hook_state, comm_hook)

    def after_step(self) -> bool:
        """After the optimizer's step: with local steps, count it, and take the outer step
        on every H-th (True then); otherwise nothing (False).

        Raises:
            SketchCollapseError: gs's guard stopped the outer step (on every rank)."""
        self.outer_now = self.local is not None and self.local.step()
        return self.outer_now

    def step_stats(self, step: int) -> dict[str, Any]:
        """What the last step's gradient averaging cost this rank (None: not measurable);
        with local steps, the outer step's on an outer step and nothing on the others."""
        if self.local is not None:
            return local_step_stats(self.local, self.outer_now)
        if self.hook_state is not None and self.hook_state.last_stats is not None:
            return hook_step_stats(self.hook_state.last_stats)
        compressed = self.ddp_hook == "powerSGD_hook" and step >= self.start_iter
        sent = builtin_hook_bytes(
            self.method, self.shapes, self.world_size, compressed, self.powersgd_rank
        )
        return {
            "bytes_sent": sent,
            "bytes_received": sent,
            "seconds_compress": None,
            "seconds_communicate": None,
            "seconds_decompress": None,
            "delivered_fraction": None,
            "audited_recall": None,
            "skipped": False,
            "k": None,
        }

    def state_dict(self) -> dict[str, Any]:
        """This rank's hook state (residuals, PowerSGD's memories) and the GradScaler's
        state, weights_only-safe."""
        sd = self._hook_state_dict()
        if self.scaler is not None:
            sd["scaler"] = self.scaler.state_dict()
        return sd

    def _hook_state_dict(self) -> dict[str, Any]:
        if self.local is not None:  # this rank's replica too: it differs between outer steps
            replica = {"model": self.module.state_dict()}
            if self.optimizer is not None:
                replica["optimizer"] = self.optimizer.state_dict()
            return {"local_steps": self.local.state_dict(), "replica": replica}
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
        if self.scaler is not None and "scaler" in sd:
            self.scaler.load_state_dict(sd["scaler"])
        if ("local_steps" in sd) != (self.local is not None):
            raise ValueError(
                "the checkpoint was saved " + ("with" if "local_steps" in sd else "without")
                + " --local-steps and this run is " + ("with" if self.local else "without")
                + " it; resume with the run's own settings (its config.json).")
        if self.local is not None:
            self.local.load_state_dict(sd["local_steps"])
            self.module.load_state_dict(sd["replica"]["model"])
            if self.optimizer is not None:
                self.optimizer.load_state_dict(sd["replica"]["optimizer"])
        elif self.hook_state is not None:
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
