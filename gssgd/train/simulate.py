"""``gssgd train --simulate``: P workers as a simulated world in one process, trained by
the one loop of :mod:`gssgd.train.loop` (:func:`simulated_ranks` are its ranks).

Large-P studies (P = 16 to 256 and more) on one machine, with the package's own code. The
replicas of a data-parallel run are identical (every rank applies bitwise the same update),
so one model stands for all of them; what differs per rank is the batch, the gradient and
the aggregator's state. Each step:

1. for every rank ``r``: its batch (:func:`~gssgd.train.objective.train_batch` with rank
   ``r`` of ``P``, as a real worker draws it), forward, and its gradient, cut into the
   buckets real DDP would hand the hook at this step
   (:class:`~gssgd.train.ddp_buckets.DDPBuckets`: one bucket in model order at step 0,
   from step 1 on the layout DDP rebuilds in the order the gradients became ready, with
   the same size caps);
2. every rank's own :class:`~gssgd.ddp.HookState`, built from the run's settings on a
   :class:`~gssgd.simulated.SimulatedRank`, runs :func:`~gssgd.ddp.comm_hook` on those
   buckets in DDP's order: the same dense warm-up (``start_iter``, one all-reduce per
   bucket), the same aggregator with its residual (over the whole model, in model order)
   and the same :class:`~gssgd.comm.Communicator` byte accounting as in real processes;
3. the update (the same on every rank; rank 0's is used), put back in model order,
   becomes the model's gradient and the optimizer steps;
4. the step's bytes (mean and busiest rank) are logged as a real run logs them.

The outputs are those of a real run, written by the same loop (``metrics.jsonl``,
``summary.json`` with ``"simulated": true``), so ``gssgd compare --simulate`` tabulates and
plots them alike.
What a simulated run does not give: step times (the ranks take turns on one thread: the
cost model predicts times from the exact bytes), checkpoints to resume, and real workers'
failure modes. The updates are bitwise those of real gloo processes: the aggregators are
the real ones, the simulated world's all-reduce sums in gloo's ring order
(:func:`~gssgd.simulated.gloo_ring_reduce`), and the dense warm-up all-reduces the bucket
buffers DDP would build, so gloo's chunks fall on the same weights
(tests/train/test_simulate.py compares losses and final models with real processes).
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import torch
from torch import nn

from gssgd.ddp import HookState, comm_hook
from gssgd.ddp.optimizer_watch import pair_adamw
from gssgd.optim import FrozenVarianceAdamW
from gssgd.simulated import SimulatedWorld, gloo_ring_reduce
from gssgd.train.config import TrainConfig, make_optimizer
from gssgd.train.data import ImageData, TextData
from gssgd.train.ddp_buckets import DDPBuckets, SimulatedBucket
from gssgd.train.metrics import RunTotals, StepBytes, StepLoss
from gssgd.train.objective import batch_loss, evaluation_sums, train_batch
from gssgd.train.sync import hook_step_stats, local_step_stats, local_steps_for

__all__ = ["simulated_ranks"]

#: A simulated world trains on the CPU (the ranks take turns on one thread).
_DEVICE = torch.device("cpu")


def simulated_ranks(cfg: TrainConfig, data: ImageData | TextData, model: nn.Module
                    ) -> _SharedReplica | _LocalReplicas:
    """Every rank of ``cfg``'s run (``cfg.workers`` of them, completed by
    :func:`~gssgd.train.rundir.prepare`) in this process, for the loop to train: one
    shared replica, or with ``--local-steps`` one replica per rank."""
    assert cfg.workers is not None and cfg.simulate
    world = SimulatedWorld(cfg.workers)
    return (_LocalReplicas if cfg.local_steps else _SharedReplica)(cfg, data, model, world)


def _rank_gradients(
    model: nn.Module, params: list[nn.Parameter], data: Any, cfg: TrainConfig, step: int,
    world_size: int, buckets: DDPBuckets,
) -> tuple[list[torch.Tensor], _LossSums]:
    """Every rank's flat gradient (model order) at ``step`` and the summed loss; rank 0's
    loss also goes to ``buckets`` (DDP reads its ready order there)."""
    grads, sums = [], _LossSums()
    for rank in range(world_size):
        loss = sums.forward(model, data, cfg, step, rank, world_size)
        if rank == 0:
            buckets.watch_backward(loss)  # the first step's only: DDP's gradient-ready order
        parts = torch.autograd.grad(loss, params, allow_unused=True)
        grads.append(torch.cat([
            (g if g is not None else torch.zeros_like(p)).reshape(-1)
            for g, p in zip(parts, params, strict=True)
        ]))
    return grads, sums


class _LossSums:
    """The step's training loss, correct predictions and count summed over the ranks (as
    the real workers' all-reduce sums them), and the ranks whose loss is not finite."""

    def __init__(self) -> None:
        self.loss, self.correct, self.count, self.nonfinite = 0.0, 0, 0, 0
        self.start = time.perf_counter()

    def forward(self, model: nn.Module, data: Any, cfg: TrainConfig, step: int, rank: int,
                world_size: int) -> torch.Tensor:
        """Rank ``rank``'s forward on its batch at ``step``, counted; its loss."""
        x, y = train_batch(data, cfg, step, rank, world_size, _DEVICE)
        loss, correct, count = batch_loss(model(x), y)
        value = float(loss.detach())
        self.nonfinite += not math.isfinite(value)
        self.loss, self.correct, self.count = (self.loss + value * count,
                                               self.correct + correct, self.count + count)
        return loss

    def taken(self) -> StepLoss:
        """The sums as the loop reads them, timed from this step's start."""
        return StepLoss(self.loss, self.correct, self.count, self.nonfinite,
                        time.perf_counter() - self.start)


class _Simulated:
    """What both kinds of simulated ranks share: no loss scaler, no checkpoints, and
    evaluation as the real workers compute it."""

    scaler = None
    models: list[nn.Module]

    def __init__(self, cfg: TrainConfig, data: ImageData | TextData,
                 world: SimulatedWorld) -> None:
        self.cfg, self.data, self.world = cfg, data, world
        self.world_size = world.world_size

    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy as real workers compute them
        (:func:`gssgd.train.loop.evaluate`): each rank scores its share of the test split
        with its replica, and the shares are summed as gloo's all-reduce sums them, so the
        numbers are bitwise a real run's (one pass over the whole split would batch and add
        the losses otherwise)."""
        shares = [evaluation_sums(m, self.data, self.cfg, r, self.world_size, _DEVICE)
                  for r, m in enumerate(self.models)]
        loss_total, right, seen = gloo_ring_reduce(shares).tolist()
        return loss_total / seen, right / seen

    def save(self, done: int, totals: RunTotals) -> None:
        """Nothing: a simulated run keeps no checkpoints (it is rerun, not resumed)."""

    def checkpoint_after(self, done: int) -> None:
        return None


class _SharedReplica(_Simulated):
    """Every step aggregates: the replicas stay bitwise equal, so one model stands for all
    ranks, each rank with its own hook state (the module doc's steps 1-3)."""

    def __init__(self, cfg: TrainConfig, data: ImageData | TextData, model: nn.Module,
                 world: SimulatedWorld) -> None:
        super().__init__(cfg, data, world)
        self.models = [model] * world.world_size
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(model, cfg)
        self.buckets = DDPBuckets(self.params, cfg.bucket_cap_mb)  # rebuilt after step 0
        settings = cfg.hook_settings()
        self.states = [HookState.from_settings(settings, group=world.rank(r), model=model)
                       for r in range(world.world_size)]
        if isinstance(self.optimizer, FrozenVarianceAdamW):
            pair_adamw(self.optimizer, self.states[0])  # 1-bit Adam's: the hook says when

    def step(self, step: int) -> StepLoss:
        """Every rank's gradient, the hooks, the update (none when a loss is not finite)."""
        self.buckets.start_iteration()  # as DDP's forward does
        grads, sums = _rank_gradients(self.models[0], self.params, self.data, self.cfg, step,
                                      self.world_size, self.buckets)
        if sums.nonfinite:
            return sums.taken()
        updates = self.world.run(
            _hook_step(self.states, [self.buckets.split(g) for g in grads], self.buckets))
        for p, piece in zip(self.params, updates[0].split([p.numel() for p in self.params]),
                            strict=True):
            p.grad = piece.view_as(p).clone()
        self.cfg.schedule.apply(self.optimizer, self.cfg.lr, step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return sums.taken()

    def stats(self, step: int) -> tuple[dict[str, Any], StepBytes]:
        """Rank 0's hook statistics and the step's bytes over the ranks."""
        return hook_step_stats(self.states[0].last_stats), StepBytes.of(
            [(s.last_stats.bytes_sent, s.last_stats.bytes_received) for s in self.states])


class _LocalReplicas(_Simulated):
    """``--local-steps H``: the replicas differ between outer steps, so each rank trains its
    own copy of the model with its own optimizer, and every H-th step each rank's
    :class:`~gssgd.local_steps.LocalSteps` (on its simulated rank) takes the outer step."""

    def __init__(self, cfg: TrainConfig, data: ImageData | TextData, model: nn.Module,
                 world: SimulatedWorld) -> None:
        super().__init__(cfg, data, world)
        self.models = [model] + [copy.deepcopy(model) for _ in range(world.world_size - 1)]
        self.optimizers = [make_optimizer(m, cfg) for m in self.models]
        self.optimizer = self.optimizers[0]
        self.local = [local_steps_for(cfg, m, group=world.rank(r), broadcast=False)
                      for r, m in enumerate(self.models)]
        self.outer = False

    def step(self, step: int) -> StepLoss:
        """Each rank's inner step on its replica (as a real worker takes it), then the outer
        step when due (not when a loss is not finite)."""
        sums = _LossSums()
        for rank, (model, opt) in enumerate(zip(self.models, self.optimizers, strict=True)):
            loss = sums.forward(model, self.data, self.cfg, step, rank, self.world_size)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            self.cfg.schedule.apply(opt, self.cfg.lr, step)
            opt.step()
        if not sums.nonfinite:
            self.outer = self.world.run(lambda rank: self.local[rank.rank].step())[0]
        return sums.taken()

    def stats(self, step: int) -> tuple[dict[str, Any], StepBytes]:
        """Rank 0's outer-step statistics (none on an inner step) and the bytes by rank."""
        moved = [(ls.last_stats.bytes_sent, ls.last_stats.bytes_received)
                 if self.outer and ls.last_stats else (0, 0) for ls in self.local]
        return local_step_stats(self.local[0], self.outer), StepBytes.of(moved)


def _hook_step(
    states: list[HookState], rank_buckets: list[list[SimulatedBucket]], buckets: DDPBuckets
) -> Any:
    """What every simulated rank runs in a step: its hook on each of its buckets, in bucket
    order as DDP calls it, then waits for every bucket's future (in whole-model mode the
    earlier buckets' complete at the last); the update, in model order."""

    def rank_step(rank: Any) -> torch.Tensor:
        state = states[rank.rank]
        futures = [comm_hook(state, b) for b in rank_buckets[rank.rank]]  # type: ignore[arg-type]
        return buckets.join([f.wait() for f in futures])

    return rank_step
