"""The DDP communication hook: its state (:class:`HookState`, the analogue of PyTorch's
``PowerSGDState``), its modes and :func:`comm_hook`, in PyTorch's ``powerSGD_hook.py`` shape:
one gradient's path through the hook reads in this one module. The algorithm, per bucket
and per iteration, is described in :mod:`gssgd.ddp`.

In reading order:

* what an iteration cost (:class:`IterationStats`, :attr:`HookState.last_stats`) and since
  the run began (:class:`RunningTotals`, :attr:`HookState.totals`, part of the checkpoint);
* :class:`HookCore`, the runtime: the settings and runtime state (aggregators, layouts,
  the iteration's statistics, buckets waiting for the last), the pieces every mode is built
  from (the dense warm-up's all-reduce, the non-finite check, statistics) and the modes:
  per bucket (:meth:`HookCore.bucket_step`, overlapped
  :meth:`HookCore.overlapped_bucket_step` on a :class:`~gssgd.ddp.bucket_lane.BucketLane`,
  :meth:`HookCore.bucket_iteration`), over the
  whole model (:meth:`HookCore.whole_model_step`) and streaming gs
  (:meth:`HookCore.stream_step`; its algorithm: :mod:`gssgd.ddp.streaming_gs`);
* :class:`HookState`, the public state (it installs the optimizer step pre-hook of
  :mod:`gssgd.ddp.optimizer_watch`, which pairs a hand-built 1-bit Adam with it and warns
  about recipes that train badly): construction and validation, the model binding that
  fixes the whole-model order, checkpoints (:meth:`HookState.state_dict`, pickling), the
  GradScaler (:meth:`HookState.use_scaler`) and the routing of each bucket to its mode
  (:meth:`HookState.average`);
* :func:`comm_hook`, the hook DDP calls.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
import weakref
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gssgd.aggregators import AGGREGATORS, Aggregator, StepStats, build_options, make_aggregator
from gssgd.aggregators.base import all_finite
from gssgd.aggregators.options import resolve_k
from gssgd.aggregators.sketching import streaming_options
from gssgd.amp import LossScaleFollower, scaler_options
from gssgd.comm import Communicator, completed_future, new_future
from gssgd.ddp.bucket_lane import BucketLane
from gssgd.ddp.optimizer_watch import note_iteration_ended, watch
from gssgd.ddp.settings import HookSettings
from gssgd.ddp.streaming_gs import StreamingGS
from gssgd.log import logger
from gssgd.validate import is_int

__all__ = [
    "HookCore",
    "HookState",
    "ITERATION_KINDS",
    "IterationStats",
    "Layout",
    "Pending",
    "RunningTotals",
    "StreamSession",
    "WHOLE_MODEL",
    "comm_hook",
    "layout_str",
]


class IterationStats:
    """Sums the StepStats of one iteration's aggregator steps and dense all-reduces (the
    delivered fraction weighted by bucket size, the audited recall the lowest)."""

    def __init__(self) -> None:
        self.total = StepStats()
        self._fraction_sum = 0.0
        self._fraction_weight = 0

    def add(self, stats: StepStats) -> None:
        t = self.total
        for f in dataclasses.fields(StepStats):
            if f.name not in ("skipped", "delivered_fraction", "audited_recall",
                              "seconds_blocked"):
                setattr(t, f.name, getattr(t, f.name) + getattr(stats, f.name))
        t.skipped = t.skipped or stats.skipped
        if stats.audited_recall is not None:  # the worst audited bucket
            seen = t.audited_recall
            t.audited_recall = stats.audited_recall if seen is None else min(
                seen, stats.audited_recall)
        if stats.delivered_fraction is not None:
            self._fraction_sum += stats.delivered_fraction * stats.d
            self._fraction_weight += stats.d
            t.delivered_fraction = self._fraction_sum / self._fraction_weight


@dataclass
class RunningTotals:
    """Sums over a hook's iterations (this rank's).

    Attributes:
        iterations: DDP iterations the hook has ended.
        dense_iterations: of those, the warm-up's plain all-reduces.
        compressed_iterations: of those, the ones the method compressed.
        skipped_iterations: of those, compressed ones every vector of which was skipped for
            a non-finite gradient.
        bytes_sent, bytes_received: payload bytes this rank put on and took off the wire
            (the same accounting as :class:`~gssgd.StepStats`).
        messages: point-to-point messages this rank sent.

    Only counts: a resumed run's totals go on from the saved ones (plus what its fresh
    aggregators' rank-agreement check sends again), while seconds are in ``last_stats``.
    """

    iterations: int = 0
    dense_iterations: int = 0
    compressed_iterations: int = 0
    skipped_iterations: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    messages: int = 0

    def add(self, stats: StepStats, kind: str) -> None:
        """Count one ended iteration of ``kind`` ("dense", "compressed" or "skipped")
        whose summed statistics are ``stats``."""
        self.iterations += 1
        if kind == DENSE_ITERATION:
            self.dense_iterations += 1
        else:
            self.compressed_iterations += 1
            self.skipped_iterations += kind == SKIPPED_ITERATION
        for name in ("bytes_sent", "bytes_received", "messages"):
            setattr(self, name, getattr(self, name) + getattr(stats, name))

    def state_dict(self) -> dict[str, Any]:
        """The totals as plain numbers (what ``HookState.state_dict()["totals"]`` holds)."""
        return asdict(self)

    @classmethod
    def from_state_dict(cls, sd: dict[str, Any] | None) -> RunningTotals:
        """Totals from :meth:`state_dict` output (None or missing fields: zeros; a state
        saved before totals existed)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (sd or {}).items() if k in known})


#: What :attr:`HookCore.last_iteration` says of the iteration that ended last: none yet, a
#: dense all-reduce, a compressed step, or a compressed step whose every vector was skipped
#: for a non-finite gradient (``nonfinite="skip"``: zeros returned, state kept; under a
#: scaler's ``"propagate"`` the scaler skips the optimizer step instead). In per-bucket
#: mode buckets skip on their own: :attr:`HookCore.last_skipped` names their parameters.
ITERATION_KINDS: tuple[str, ...] = ("none", "dense", "compressed", "skipped")
NO_ITERATION, DENSE_ITERATION, COMPRESSED_ITERATION, SKIPPED_ITERATION = ITERATION_KINDS

#: Key of the single aggregator in whole-model mode (in ``state_dict()["buckets"]``).
WHOLE_MODEL = 0

#: A layout, one entry per parameter: ``[position in the model (-1 when no model is bound), numel]``.
Layout = list[list[int]]


def layout_str(layout: Layout) -> str:
    if all(pos >= 0 for pos, _ in layout):
        return "parameters " + str([pos for pos, _ in layout])
    return "unbound parameters of sizes " + str([n for _, n in layout])


@dataclass
class Pending:
    """A bucket whose future waits for the last bucket (whole-model mode)."""

    index: int
    params: list[torch.Tensor]
    grads: list[torch.Tensor]
    buffer: torch.Tensor
    future: torch.futures.Future[torch.Tensor] | None


class StreamSession:
    """What :meth:`HookCore.stream_step` keeps between calls:
    the bucket layout recorded in the last dense iteration and the buckets in flight."""

    def __init__(self) -> None:
        self.recording: dict[int, Layout] = {}
        self.recorded: list[Layout] | None = None
        self.pending: list[tuple[torch.Tensor, torch.futures.Future[torch.Tensor]]] = []

    def fail_pending(self, exc: BaseException) -> None:
        for _, fut in self.pending:
            if not fut.done():
                fut.set_exception(exc)
        self.pending = []


class HookCore:
    """The settings and runtime state of a hook, and the pieces every mode shares.

    Attributes:
        settings: the validated :class:`~gssgd.ddp.settings.HookSettings`.
        group: the process group (None: the default group).
        iter: the number of DDP iterations this state has seen (saved in checkpoints).
        last_stats: the summed :class:`~gssgd.StepStats` of the last iteration.
        totals: :class:`RunningTotals`, every iteration's statistics
            summed since the run began (saved in checkpoints).
    """

    settings: HookSettings
    group: dist.ProcessGroup | None

    def _reset(self) -> None:
        """Empty runtime state: no aggregators, no binding, iteration 0."""
        self.iter = 0
        self.last_stats = StepStats()
        self._aggregators: dict[int, Aggregator] = {}
        self._layouts: dict[int, Layout] = {}  # layout each live or saved residual is for
        self._saved: dict[int, dict[str, Any]] = {}  # loaded states not yet given an aggregator
        self._positions: dict[int, int] = {}  # id(parameter) -> position in the bound model
        self._bound: list[torch.Tensor] = []  # keeps the bound parameters (and their ids) alive
        self._pending: list[Pending] = []
        self._stats: IterationStats | None = None
        self._session_iters = 0  # iterations seen in this process (not saved)
        self._comm: Communicator | None = None  # the warm-up's accounted all-reduce
        self._grad_views: bool | None = None  # DDP's gradient_as_bucket_view, once seen
        self._stream = StreamSession()  # overlap="stream": the layout and buckets in flight
        self._lane: BucketLane | None = None  # overlap="buckets": the buckets' thread
        self._stats_lock = threading.Lock()  # the iteration's statistics, between buckets
        self._blocked = 0.0  # seconds the hook's calls held this iteration's backward
        self._loss_scale = LossScaleFollower()  # the scaler's scale the residuals are in
        self._scale_followed_at = -1  # the iteration whose loss scale was last followed
        self._warned_skip = False  # the skipped-step advice of _end_iteration, given once
        self.last_iteration = NO_ITERATION  # what the last iteration was (ITERATION_KINDS)
        self.last_skipped: frozenset[int] = frozenset()  # id()s of parameters skipped in it
        self._skipping: set[int] = set()  # the same, during the iteration
        self._params: dict[int, weakref.ref[torch.Tensor]] = {}  # the buckets' parameters
        self._params_known = False  # set once an iteration has noted every bucket's
        self.totals = RunningTotals()  # every iteration's statistics, summed (saved)
        self._saved_world: tuple[int, int] | None = None  # (world size, rank) of a loaded state

    # ------------------------------------------------------------------ settings
    @property
    def method(self) -> str:
        return self.settings.method

    @property
    def density(self) -> float | None:
        return self.settings.density

    @property
    def start_iter(self) -> int:
        return self.settings.start_iter

    @property
    def whole_model(self) -> bool:
        return self.settings.whole_model

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.settings.options)

    @property
    def overlap(self) -> str:
        return self.settings.overlap

    # ------------------------------------------------------------------ hook pieces
    def _compressing(self) -> bool:
        """Whether this iteration is compressed (the same answer for every bucket of it)."""
        if self.iter < self.start_iter:
            return False
        # In a process's first DDP iteration the buckets have their pre-rebuild layout;
        # only whole-model mode in model order does not depend on it.
        return self._session_iters >= 1 or (self.whole_model and bool(self._positions))

    def bucket_lane(self) -> BucketLane:
        """The thread that averages buckets during backward (``overlap="buckets"``)."""
        if self._lane is None:
            self._lane = BucketLane()
        return self._lane

    def _waits_for_iteration(self) -> bool:
        """Per-bucket mode under ``nonfinite="propagate"`` waits for the last bucket: an
        overflow in any bucket must leave every bucket's residual untouched."""
        return self.settings.options.get("nonfinite") == "propagate"

    def _follow_loss_scale(self) -> None:
        """Once per iteration, before any aggregator steps: bring every residual and
        momentum to the scaler's current loss scale (:class:`~gssgd.amp.LossScaleFollower`)."""
        if self._scale_followed_at == self.iter:
            return
        self._scale_followed_at = self.iter
        self._loss_scale.follow(list(self._aggregators.values()), list(self._saved.values()))

    def _scaler_advice(self) -> str | None:
        """What a hook that zeroes non-finite steps (``nonfinite="skip"``, the default
        without a scaler) tells a run that may be under a ``torch.amp.GradScaler`` it was
        not given; None when it has a scaler or another ``nonfinite`` policy."""
        if self._loss_scale.scaler is not None:
            return None
        if self.settings.options.get("nonfinite", "skip") != "skip":
            return None
        return (
            "If this run uses a torch.amp.GradScaler, give it to the hook: "
            "HookState(..., scaler=scaler) or state.use_scaler(scaler). Without it every "
            "overflow becomes a zero update (nonfinite='skip'), so the scaler never sees it "
            "and never lowers its scale."
        )

    def _nonfinite_ranks(self, buffers: list[torch.Tensor]) -> list[int]:
        """The ranks on which any of ``buffers`` holds NaN/Inf (one 4-byte all-gather)."""
        if self._comm is None:
            self._comm = Communicator(self.group)
        bad = torch.tensor(
            [0 if all(all_finite(b) for b in buffers) else 1],
            dtype=torch.int32,
            device=buffers[0].device,
        )
        flags = self._comm.allgather_backend(bad) if self._comm.world_size > 1 else [bad]
        self._iteration_stats().add(StepStats.of_comm(self._comm.take_stats()))
        return [r for r, flag in enumerate(flags) if int(flag)]

    def _iteration_stats(self) -> IterationStats:
        if self._stats is None:
            self._stats = IterationStats()
        return self._stats

    def _end_iteration(self, compressed: bool) -> None:
        """Publish the iteration's statistics and what kind it was; count it.

        Args:
            compressed: whether the iteration ran the aggregator (else a dense all-reduce).
        """
        self.last_stats = self._iteration_stats().total
        self._stats = None
        self.last_skipped, self._skipping = frozenset(self._skipping), set()
        skipped = self.last_stats.skipped and self.last_skipped >= self._params.keys()
        before, self.last_iteration = self.last_iteration, (  # "skipped": every vector was
            DENSE_ITERATION if not compressed
            else SKIPPED_ITERATION if skipped else COMPRESSED_ITERATION
        )
        self.totals.add(self.last_stats, self.last_iteration)
        if compressed and before in (NO_ITERATION, DENSE_ITERATION):
            logger.info("gssgd: iteration %d: %s compresses from here on (%s after %d dense "
                        "iterations); %d B sent this iteration", self.iter, self.method,
                        "whole model" if self.whole_model else "per bucket",
                        self.totals.dense_iterations, self.last_stats.bytes_sent)
        self.iter += 1
        self._session_iters += 1
        self._params_known = bool(self._params)
        note_iteration_ended(self)  # the optimizer watch pairs optimizers with it
        if self.last_stats.skipped and not self._warned_skip:
            self._warn_skipped()

    def _check_saved_world(self) -> None:
        """A loaded state must run in the world it was saved in: each rank's residual is its
        own, so another world size or rank would silently drop or misplace them.

        Raises:
            ValueError: the process group's size or this process's rank differs from the
                loaded state's; the message says what was saved and what is running.
        """
        if self._saved_world is None or not dist.is_available() or not dist.is_initialized():
            return
        saved_world, saved_rank = self._saved_world
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if (world, rank) != (saved_world, saved_rank):
            raise ValueError(
                f"this hook state was saved by rank {saved_rank} of {saved_world} processes, "
                f"but it is loaded by rank {rank} of {world}: each rank's error-feedback "
                "residual is its own, so it cannot move to another world size or rank. "
                f"Resume with {saved_world} processes (torchrun --nproc_per_node "
                f"{saved_world}), each loading its own file, or start without the hook state."
            )
        self._saved_world = None  # checked once

    def _warn_skipped(self) -> None:
        """The first step this hook skipped for a non-finite gradient without a scaler:
        say once (per state) what a GradScaler run must do."""
        advice = self._scaler_advice()
        if advice is None:
            return
        self._warned_skip = True
        limit = self.settings.options.get("max_consecutive_skips", 100)
        warnings.warn(
            f"gssgd: iteration {self.iter - 1}: the hook skipped a non-finite gradient (NaN "
            f"or Inf) and returned a zero update. {advice} After max_consecutive_skips="
            f"{limit} skipped steps in a row every rank stops.",
            UserWarning,
            stacklevel=2,
        )

    def _note_parameters(self, bucket: dist.GradBucket) -> None:
        """Until an iteration has ended with them, remember which parameters the buckets
        hold (:meth:`holds`)."""
        if not self._params_known:
            self._params.update((id(p), weakref.ref(p)) for p in bucket.parameters())

    def _add_step(self, stats: StepStats, params: list[torch.Tensor] | None = None) -> None:
        """Count an aggregator step of this iteration; a skipped one (non-finite) leaves its
        parameters (None: every parameter) without an update (:attr:`last_skipped`)."""
        self._iteration_stats().add(stats)
        if stats.skipped:
            self._skipping.update(self._params if params is None else (id(p) for p in params))

    def holds(self, params: list[torch.Tensor]) -> bool:
        """Whether this hook averaged the gradients of any of ``params`` (in an iteration
        of this process): an optimizer over them steps on what this hook returned."""
        for p in params:
            ref = self._params.get(id(p))
            if ref is not None and ref() is p:
                return True
        return False

    def _layout(self, params: list[torch.Tensor]) -> Layout:
        return [[self._positions.get(id(p), -1), p.numel()] for p in params]

    def _aggregator(self, index: int, layout: Layout, d: int, where: str,
                    params: list[torch.Tensor] | None = None) -> Aggregator:
        """The aggregator of bucket ``index`` (created on first use, with any loaded state).

        ``params`` are the vector's parameters in its order: a method that compresses each
        tensor by its shape (``takes_shapes``, PowerSGD) is given their shapes.

        Raises:
            ValueError: the layout differs from the one its residual was built for, or an
                explicit k exceeds ``d``.
        """
        agg = self._aggregators.get(index)
        known = self._layouts.get(index)
        if known is not None and known != layout:
            if agg is not None:
                raise ValueError(
                    f"{where} changed from {layout_str(known)} to {layout_str(layout)} "
                    "after compression had started (did DDP rebuild its buckets?). Start "
                    "compression after DDP's bucket rebuild (start_iter >= 1; with "
                    "static_graph=True DDP rebuilds after iteration 1, so start_iter >= 2), or "
                    "use whole_model=True with model=..., whose order does not depend on buckets."
                )
            hint = (
                "call state.bind(model) first (it was saved in model order)"
                if any(pos >= 0 for pos, _ in known) and all(pos < 0 for pos, _ in layout)
                else "resume with the same model and bucket_cap_mb (with static_graph=True DDP "
                "keeps its first layout through a process's first two iterations, so a "
                "per-bucket state cannot resume there), or use whole_model=True with "
                "model=..., whose order does not depend on the bucket layout"
            )
            raise ValueError(
                f"{where} holds {layout_str(layout)}, but its saved residual is for "
                f"{layout_str(known)}; {hint}."
            )
        if agg is None:
            self.settings.check_k(d, where)
            options = dict(self.settings.options)
            if AGGREGATORS[self.method].takes_shapes and params is not None:
                options["shapes"] = tuple(tuple(p.shape) for p in params)
            agg = make_aggregator(
                self.method, d, density=self.density, group=self.group, **options
            )
            if index in self._saved:
                agg.load_state_dict(self._saved.pop(index))
            self._aggregators[index] = agg
            self._layouts[index] = layout
        return agg

    def _allreduce_mean(self, buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """Warm-up: the plain average by the backend's all-reduce (through the accounted
        :class:`~gssgd.comm.Communicator`, counted as a ring), chained on its future."""
        if self._comm is None:
            self._comm = Communicator(self.group)
        comm = self._comm
        buffer.div_(comm.world_size)  # before the sum, as DDP's own hook does (no fp16 overflow)
        start = time.perf_counter()
        fut = comm.allreduce_backend_async(buffer)
        totals = self._iteration_stats()
        # its seconds are timed by ``done`` below, when the all-reduce has finished
        totals.add(StepStats.of_comm(comm.take_stats(), timed=False,
                                     k=buffer.numel(), d=buffer.numel()))

        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            totals.total.seconds_communicate += time.perf_counter() - start
            return fut.value()

        return fut.then(done)

    def _note_grad_views(self, bucket: dist.GradBucket) -> None:
        """Learn once whether DDP's ``.grad`` tensors are views of its buckets
        (``gradient_as_bucket_view=True``), from a parameter autograd gave a gradient."""
        if self._grad_views is not None:
            return
        storage = bucket.buffer().untyped_storage().data_ptr()
        for p in bucket.parameters():
            if p.grad is not None:
                self._grad_views = p.grad.untyped_storage().data_ptr() == storage
                return

    def _hand_over_unused(
        self, params: list[torch.Tensor], views: list[torch.Tensor], update: torch.Tensor
    ) -> None:
        """Give the parameters no rank used in this iteration their update in ``.grad``.

        With ``find_unused_parameters=True`` (or ``static_graph=True``) DDP writes the
        hook's result into ``param.grad`` only for parameters some rank used in the
        iteration; the others keep their ``.grad`` (None after ``zero_grad()``). A dense
        average is zero there, but a sparse method may deliver error-feedback residual to
        such a parameter (gradient kept from an earlier step that used it), and its
        aggregator has already taken that mass out of the residual: dropped by DDP, it
        would be lost. So every parameter without a ``.grad`` when its bucket is reduced
        (autograd gave it none since the last ``zero_grad()``: unused on this rank) and with
        a non-zero update gets it here: a copy, or, with ``gradient_as_bucket_view=True``,
        the bucket's view (which DDP fills with the result and requires). Where another
        rank used the parameter, DDP then writes the same values again. A ``.grad`` zeroed
        with ``zero_grad(set_to_none=False)`` does not look unused, and keeps DDP's rule.

        Args:
            params: the parameters of the update, in its order.
            views: their gradients' views into DDP's bucket buffers, in the same order.
            update: their averaged update, flat (what the hook returns for them).
        """
        offset = 0
        for p, view in zip(params, views, strict=True):
            n = p.numel()
            if p.grad is None and self._grad_views is not None:
                piece = update[offset : offset + n]
                if bool(piece.count_nonzero()):  # a device sync, for unused parameters only
                    p.grad = view.view_as(p) if self._grad_views else piece.clone().view_as(p)
            offset += n

    # ------------------------------------------------------------------ waiting buckets
    def _defer(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Whole-model mode, a bucket before the last: stash it, return a pending future."""
        index = bucket.index()
        if any(p.index == index for p in self._pending):  # a backward was abandoned
            self._fail_pending(RuntimeError("an earlier backward pass did not finish"))
            self._stats = None
        buffer = bucket.buffer()
        fut = new_future(buffer.device)
        self._pending.append(Pending(index, bucket.parameters(), bucket.gradients(), buffer, fut))
        return fut

    def _fail_pending(self, exc: BaseException) -> None:
        for p in self._pending:
            if p.future is not None and not p.future.done():
                p.future.set_exception(exc)
        self._pending = []

    def _complete_pending(self) -> None:
        """Complete every waiting bucket's future with its (updated) buffer."""
        for e in self._pending:
            e.future.set_result(e.buffer)  # type: ignore[union-attr]
        self._pending = []

    # ------------------------------------------------------------------ per-bucket mode
    # ``whole_model=False``: bucket ``i`` has its own aggregator with ``d = bucket.numel()``
    # (k resolved per bucket from ``density``), created the first time the bucket is
    # compressed; its residual stays in that aggregator.
    #
    # :meth:`bucket_step` averages a bucket as soon as DDP hands it over, before it returns:
    # the backward waits. With ``overlap="buckets"`` (:meth:`overlapped_bucket_step`) it does
    # not: the hook returns a future and the bucket is averaged on the hook's
    # :class:`~gssgd.ddp.bucket_lane.BucketLane` while the backward pass goes on (dense's
    # all-reduce started in the hook and finished in its callback, as PyTorch's own
    # all-reduce is; any other method's buckets but the last on one thread, in bucket order).
    # The last bucket waits for the lane, which re-raises a bucket's error with its own type:
    # the results are bitwise the synchronous path's. Under
    # ``nonfinite="propagate"`` (the default with a GradScaler) the buckets wait for the last
    # one instead (:meth:`_defer`) and :meth:`bucket_iteration` steps them all, so no
    # bucket's state moves on a step the scaler skips.

    def bucket_step(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Per-bucket mode: the bucket's own aggregator averages it (before returning)."""
        return completed_future(self._average_bucket(
            bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer()))

    def overlapped_bucket_step(self, bucket: dist.GradBucket
                               ) -> torch.futures.Future[torch.Tensor]:
        """``overlap="buckets"``: a method that :attr:`~gssgd.Aggregator.starts_async`
        starts every bucket's collective here and finishes it in its callback; any other
        averages every bucket but the last on the hook's lane while the backward goes on.
        The last bucket waits for the lane (its own collective already in flight, for the
        first kind), so that the iteration's statistics are complete when it ends."""
        lane = self.bucket_lane()
        args = (bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer())
        index, params, grads, buffer = args
        if AGGREGATORS[self.method].starts_async:
            agg = self._aggregator(index, self._layout(params), buffer.numel(),
                                   f"bucket {index}", params)
            fut = lane.launch(lambda: agg.start_step(buffer),
                              lambda update: self._bucket_done(agg, params, grads, update),
                              buffer.device)
            if bucket.is_last():
                lane.drain()
            return fut
        if bucket.is_last():
            lane.drain()
            return completed_future(self._average_bucket(*args))
        return lane.submit(lambda: self._average_bucket(*args), buffer.device)

    def _bucket_done(self, agg: Aggregator, params: list[torch.Tensor],
                     grads: list[torch.Tensor], update: torch.Tensor) -> torch.Tensor:
        """A bucket's update is in: give unused parameters theirs, count the step."""
        self._hand_over_unused(params, grads, update)
        with self._stats_lock:  # completions may run on several backend threads at once
            self._add_step(agg.last_stats, params)
        return update

    def _average_bucket(self, index: int, params: list[torch.Tensor],
                        grads: list[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor:
        """Bucket ``index``'s update from its own aggregator (its parameters, gradients and
        flat buffer as DDP handed them over)."""
        layout = self._layout(params)
        agg = self._aggregator(index, layout, buffer.numel(), f"bucket {index}", params)
        return self._bucket_done(agg, params, grads, agg.step(buffer))

    def bucket_iteration(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Per-bucket mode under ``nonfinite="propagate"``, the last bucket.

        Steps: (1) every rank learns whether any bucket of the iteration is non-finite on
        any rank; (2) if so, every bucket's aggregator applies its non-finite policy (an
        all-NaN bucket, state untouched); else each steps in bucket order; (3) the updates
        go into the buckets' buffers and every pending future completes.
        """
        this = Pending(bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer(),
                       None)
        entries = sorted([*self._pending, this], key=lambda p: p.index)
        try:
            aggs = [
                self._aggregator(e.index, self._layout(e.params), e.buffer.numel(),
                                 f"bucket {e.index}", e.params)
                for e in entries
            ]
            bad_ranks = self._nonfinite_ranks([e.buffer for e in entries])
            for e, agg in zip(entries, aggs, strict=True):
                update = (agg.nonfinite_step(e.buffer, bad_ranks) if bad_ranks
                          else agg.step(e.buffer))
                self._add_step(agg.last_stats, e.params)
                e.buffer.copy_(update)
                self._hand_over_unused(e.params, e.grads, update)
        except BaseException as exc:
            self._fail_pending(exc)
            raise
        self._complete_pending()
        return completed_future(this.buffer)

    # ------------------------------------------------------------------ whole-model mode
    # ``whole_model=True``: the whole gradient is one vector, so top-k is global over all
    # layers, as in the papers. Buckets before the last get a not-yet-completed future and
    # their gradients are stashed (:meth:`_defer`); at the last bucket
    # :meth:`whole_model_step` concatenates the stashed gradients in model order, runs one
    # ``agg.step(flat)``, splits the update back into the buckets' gradients and completes
    # every pending future. DDP waits for all of a backward's futures before it writes
    # ``param.grad``, so deferring is safe; it just gives up overlapping communication with
    # the backward pass (:meth:`stream_step` brings it back for gs).

    def whole_model_step(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Whole-model mode, the last bucket: one step over every stashed gradient.

        Steps: (1) list every parameter of the pending buckets and this one with its
        gradient view; (2) order them by model position (or keep bucket order when no
        model is bound); (3) concatenate and run the aggregator once; (4) write the update
        back into the gradient views, which live in the buckets' buffers; (5) complete
        the pending futures with their buffers.
        """
        this = Pending(bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer(),
                       None)
        entries = sorted([*self._pending, this], key=lambda p: p.index)
        try:
            pairs = [(p, g) for e in entries for p, g in zip(e.params, e.grads, strict=True)]
            if self._positions:
                unknown = [tuple(p.shape) for p, _ in pairs if id(p) not in self._positions]
                if unknown:
                    raise ValueError(
                        f"{len(unknown)} parameter(s) in DDP's buckets (shapes {unknown[:4]}) "
                        "are not in the bound model; bind the model DDP wraps: "
                        "HookState(..., model=ddp_model) or state.bind(ddp_model)."
                    )
                pairs.sort(key=lambda pg: self._positions[id(pg[0])])
            layout = self._layout([p for p, _ in pairs])
            flat = torch.cat([g.reshape(-1) for _, g in pairs])
            agg = self._aggregator(WHOLE_MODEL, layout, flat.numel(), "the whole model",
                                   [p for p, _ in pairs])
            update = agg.step(flat)
            self._add_step(agg.last_stats)
            pieces = update.split([g.numel() for _, g in pairs])
            for (_, g), piece in zip(pairs, pieces, strict=True):
                g.copy_(piece.view_as(g))
            self._hand_over_unused([p for p, _ in pairs], [g for _, g in pairs], update)
        except BaseException as exc:
            self._fail_pending(exc)  # never leave DDP waiting on a future forever
            raise
        self._complete_pending()
        return completed_future(this.buffer)


    # ------------------------------------------------------------------ streaming gs
    # ``overlap="stream"``: each bucket's sketch region is all-reduced during backward
    # (:mod:`gssgd.ddp.streaming_gs` describes the algorithm and its aggregator).

    def _stream_aggregator(self, layouts: list[Layout]) -> StreamingGS:
        """The streaming aggregator (created on first use, with any loaded state)."""
        agg = self._aggregators.get(0)
        flat = [entry for layout in layouts for entry in layout]
        if isinstance(agg, StreamingGS):
            if self._layouts.get(0) != flat:
                raise ValueError(
                    "DDP's bucket layout changed after streaming gs had started; keep the model "
                    "and bucket_cap_mb fixed, or use overlap='none'."
                )
            return agg
        sizes = [sum(n for _, n in layout) for layout in layouts]
        d = sum(sizes)
        known = self._layouts.get(0)
        if known is not None and known != flat:
            raise ValueError(
                "the saved streaming residual is for another bucket layout (parameters "
                f"{[p for p, _ in known][:8]}...), DDP now has {[p for p, _ in flat][:8]}...; "
                "resume with the same model and bucket_cap_mb."
            )
        self.settings.check_k(d, "the whole model")
        # every coordinate is sketched: a pre-filter needs the whole gradient before bucket 0;
        # the regions go by the backend's ring, and so, unless asked otherwise, does the exact round
        # (streaming's own shape at every P: the default's was measured with the pre-filter)
        given = streaming_options(d, resolve_k(d, self.density, None), self.settings.options)
        _, k, options = build_options("gs", d, self.density, **given)
        agg = StreamingGS(sizes, d, k, options, self.group)
        if 0 in self._saved:
            agg.load_state_dict(self._saved.pop(0))
        self._aggregators[0] = agg
        self._layouts[0] = flat
        return agg

    def stream_step(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Streaming gs (``overlap="stream"``; the algorithm: :mod:`gssgd.ddp.streaming_gs`).

        Dense iterations (``iter < start_iter``, and a process's first two iterations) average
        the bucket with the backend's all-reduce and record the bucket layout; compressed ones
        stream the bucket's sketch region and complete every bucket's future at the last one.
        """
        session = self._stream
        index, buffer = bucket.index(), bucket.buffer()
        layout = self._layout(bucket.parameters())
        streaming = self.iter >= self.start_iter and session.recorded is not None
        if not streaming:
            session.recording[index] = layout
            fut = self._allreduce_mean(buffer)
            if bucket.is_last():
                if self._session_iters >= 1:  # DDP's own first iteration has a provisional layout
                    session.recorded = [session.recording[i] for i in sorted(session.recording)]
                session.recording = {}
                self._end_iteration(compressed=False)
            return fut
        try:
            assert session.recorded is not None
            if index == 0 and session.pending:  # a backward was abandoned half way
                session.fail_pending(RuntimeError("an earlier backward pass did not finish"))
                agg = self._aggregators.get(0)
                if isinstance(agg, StreamingGS):
                    agg.abandon()
                self._stats = None
            if index >= len(session.recorded) or session.recorded[index] != layout:
                raise ValueError(
                    f"bucket {index} holds {layout} but the recorded layout has "
                    f"{session.recorded[index] if index < len(session.recorded) else 'no such bucket'}"
                    "; DDP's buckets changed after they were recorded. Keep the model and "
                    "bucket_cap_mb fixed, or use overlap='none'."
                )
            agg = self._stream_aggregator(session.recorded)
            if index == 0:
                self._follow_loss_scale()  # a GradScaler's units for the residual (gssgd.amp)
            agg.add_bucket(index, buffer)
            if not bucket.is_last():
                fut = new_future(buffer.device)
                session.pending.append((buffer, fut))
                return fut
            update = agg.finish()
            self._add_step(agg.last_stats)
            pieces = update.split(agg.sizes)
            buffers = [b for b, _ in session.pending] + [buffer]
            for buf, piece in zip(buffers, pieces, strict=True):
                buf.copy_(piece)
        except BaseException as exc:
            session.fail_pending(exc)  # never leave DDP waiting on a future forever
            agg = self._aggregators.get(0)
            if isinstance(agg, StreamingGS):
                agg.abandon()
            raise
        for buf, fut in session.pending:
            fut.set_result(buf)
        session.pending = []
        self._end_iteration(compressed=True)
        return completed_future(buffer)


class HookState(HookCore):
    r"""Settings and per-bucket state of :func:`comm_hook` (the analogue of ``PowerSGDState``).

    Holds the tuned settings (validated here, before any process group is touched), one
    aggregator per bucket (or one for the whole model) with its error-feedback residual,
    the iteration counter and the last iteration's statistics.

    Tuning:

    1. ``density`` (or ``k``) sets how many coordinates each vector sends per step:
       ``k = max(1, round(density * d))`` with ``d`` the bucket's (or model's) length.
       Error feedback keeps what is not sent, so a small density slows convergence but
       loses no gradient. Start around 0.01 and go down while the accuracy holds.
    2. ``start_iter`` runs plain all-reduce for the first ``start_iter`` iterations (at
       least 1: DDP rebuilds its buckets after iteration 0). Like PowerSGD's
       ``start_powerSGD_iter``, a longer dense warm-up protects the sensitive start of
       training; a learning-rate warm-up is a good length.
    3. ``whole_model=True`` selects the top coordinates over the whole model (as the
       papers do) instead of per bucket, at the price of waiting for the last bucket
       before communicating. Pass ``model=`` so its residual follows the model's
       parameter order and checkpoints survive a changed bucket layout.

    Args:
        method: one of :data:`gssgd.AGGREGATORS` (PowerSGD: ``rank=``, or PyTorch's name
            ``matrix_approximation_rank=``, instead of a density; the hook gives it each
            vector's parameter shapes).
        density: fraction of each vector sent, in (0, 1]; default 0.01. Only the methods
            that send k coordinates take it (dense and PowerSGD refuse it).
        start_iter: the first compressed iteration, >= 1 (default 2).
        whole_model: one vector for the whole model (True: one global selection, as the
            papers) or one per bucket (False). Default: True when ``model=`` is given
            (its parameter order fixes the vector's, so checkpoints survive a new bucket
            layout), else False; ``HookState("gs", density=0.01, model=ddp_model)`` is the
            usual call.
        group: process group; None means the default group.
        model: the model whose parameter order fixes the whole-model order (the DDP
            module or the module it wraps); same as calling :meth:`bind` later.
        overlap: "none" (default), or "stream" with ``method="gs"`` and ``whole_model=True``:
            the sketch table is cut by DDP bucket and each bucket's part is all-reduced
            while backward runs (:mod:`gssgd.ddp.streaming_gs`; saved in :meth:`state_dict`).
        scaler: the run's ``torch.amp.GradScaler`` under float16 autocast, or None. With
            it ``nonfinite`` defaults to ``"propagate"`` and the residuals are kept in the
            units of its current loss scale (:mod:`gssgd.amp`). Without it (and with
            ``nonfinite="skip"``, the default) the first skipped non-finite step warns
            once that a GradScaler run must pass ``scaler=``.
        **options: the method's options (``k`` instead of ``density``; ``rows``, ``cols``,
            ``candidates``, ``exact``, ``allreduce``, ``table_dtype``, ``momentum``,
            ``feedback`` ("ef", "ef21", "global", "onebit" or "fetchsgd"), ``seed``,
            ``dtype``, ``nonfinite``: "skip", "raise" or "propagate"; see
            :func:`gssgd.make_aggregator`). The recipes :mod:`gssgd.recipes`
            recommends on a language model: with SGD, ``momentum=0.9`` here and the
            optimizer's momentum 0 (DGC's momentum correction) at dense's learning rate;
            with AdamW, 1-bit Adam's
            recipe, built with its optimizer in one call by
            :func:`~gssgd.ddp.compressed_adamw` (by hand:
            :class:`~gssgd.optim.FrozenVarianceAdamW` and ``start_iter=N,
            feedback="onebit", momentum=beta1``, checked at the first step). On image models,
            plain SGD on the classic error-fed update. The other combinations are
            warned about once (:func:`gssgd.recipes.recipe_advice`).

    Attributes:
        iter: the number of DDP iterations this state has seen (saved in checkpoints).
        last_iteration: what the last iteration was: ``"none"`` (none yet), ``"dense"``
            (the warm-up's all-reduce), ``"compressed"``, or ``"skipped"`` (a non-finite
            step returned as zeros); :class:`~gssgd.optim.FrozenVarianceAdamW` follows it.
        last_stats: the summed :class:`~gssgd.StepStats` of the last iteration: bytes,
            messages and rounds of every aggregator step (dense warm-up all-reduces counted
            with the ring figure ``floor(2(P-1)/P * n)``), seconds, and ``k``/``d`` summed
            over the vectors. ``delivered_fraction`` is the d-weighted mean over the
            vectors that report one (exact in whole-model mode). Complete once
            ``backward()`` has returned.
        group: the process group (None after unpickling: the default group).

    Raises:
        ValueError: unknown method or option, an option out of range, both density and k,
            ``start_iter < 1``, ``model`` that is not an ``nn.Module``, or a scaler with
            ``nonfinite="skip"``.

    Example::
        >>> # xdoctest: +SKIP
        >>> model = DistributedDataParallel(net, bucket_cap_mb=25)
        >>> state = HookState("gs", density=0.001, start_iter=100, whole_model=True,
        ...                   model=model)  # the default sketch: 1 row of 40·k columns, m = 32
        >>> model.register_comm_hook(state, comm_hook)
        >>> loss_fn(model(x), y).backward()     # gradients are the gs-SGD update
        >>> state.last_stats.bytes_sent
        >>> torch.save({"model": model.state_dict(), "hook": state.state_dict()}, path)
    """

    def __init__(
        self,
        method: str,
        density: float | None = None,
        start_iter: int = 2,
        whole_model: bool | None = None,
        group: dist.ProcessGroup | None = None,
        model: nn.Module | None = None,
        scaler: torch.amp.GradScaler | None = None,
        overlap: str = "none",
        **options: Any,
    ) -> None:
        if whole_model is None:  # the papers' global selection wherever its order is known
            whole_model = model is not None
        settings = HookSettings(method, density, start_iter, whole_model, dict(options), overlap)
        self._start(settings, group, model, scaler)

    @classmethod
    def from_settings(
        cls,
        settings: HookSettings,
        group: dist.ProcessGroup | None = None,
        model: nn.Module | None = None,
        scaler: torch.amp.GradScaler | None = None,
    ) -> HookState:
        """A state for already validated :class:`HookSettings` (``gssgd train`` builds them
        from its config); otherwise the same as the constructor."""
        state = cls.__new__(cls)
        state._start(settings, group, model, scaler)
        return state

    def _start(
        self,
        settings: HookSettings,
        group: dist.ProcessGroup | None,
        model: nn.Module | None,
        scaler: torch.amp.GradScaler | None,
    ) -> None:
        """What both constructors do once the settings are validated."""
        self.settings = settings
        self.group = group
        self._reset()
        self.use_scaler(scaler)
        self._watch_recipe()
        if model is not None:
            self.bind(model)

    def _watch_recipe(self) -> None:
        """For a sparse method: warn (once per process) if an optimizer steps on this state
        in a combination :func:`gssgd.recipes.recipe_advice` warns against."""
        watch(self)

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self.settings.options.items())
        return (
            f"HookState({self.method!r}, density={self.density!r}, start_iter="
            f"{self.start_iter}, whole_model={self.whole_model}"
            + (f", overlap={self.overlap!r}" if self.overlap != "none" else "")
            + f"{opts}; iter={self.iter})"
        )

    def bind(self, model: nn.Module) -> HookState:
        """Use ``model``'s parameter order as the canonical order of whole-model mode.

        Args:
            model: the DDP model or the module it wraps (both list the same parameters).

        Returns:
            This state, so ``HookState(...).bind(model)`` chains.

        Raises:
            ValueError: ``model`` is not an ``nn.Module``.
        """
        if not isinstance(model, nn.Module):
            raise ValueError(
                f"model={type(model).__name__} is invalid: it must be a torch.nn.Module (the "
                "DDP model or the module it wraps)."
            )
        self._bound = list(model.parameters())
        self._positions = {id(p): i for i, p in enumerate(self._bound)}
        return self

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's hook state: the iteration and every bucket's aggregator state.

        Returns:
            a dict with ``"iter"``, ``"method"``, ``"whole_model"``, ``"buckets"`` (bucket
            index -> its aggregator's state_dict) and ``"layouts"`` (bucket index ->
            ``[[position, numel], ...]``; whole-model mode: index 0),
            the world it was saved in (``"world_size"``, ``"rank"``; a state saved with
            no process group says 1 and 0), the settings (``"density"``, ``"options"``),
            the running ``"totals"`` (:class:`~gssgd.ddp.hook.RunningTotals`),
            and ``"loss_scale"`` (the GradScaler scale the residuals are in) under a scaler.
            Only tensors, ints, floats, strings, bools, dicts and lists, so
            ``torch.load(..., weights_only=True)`` reads it.
        """
        buckets = {i: dict(sd) for i, sd in self._saved.items()}
        buckets.update({i: agg.state_dict() for i, agg in self._aggregators.items()})
        world, rank = self._world()
        return {
            "world_size": world,
            "rank": rank,
            "density": self.density,
            "options": self._recorded_options(),
            "totals": self.totals.state_dict(),
            # "overlap" only when streaming: absent means "none" (and older checkpoints)
            **({"overlap": self.overlap} if self.overlap != "none" else {}),
            "iter": self.iter,
            "method": self.method,
            "whole_model": self.whole_model,
            "buckets": buckets,
            "layouts": {
                i: [list(p) for p in self._layouts[i]] for i in buckets if i in self._layouts
            },
            # the GradScaler's scale the residuals are in, only under one (see gssgd.amp)
            **({"loss_scale": self._loss_scale.scale} if self._loss_scale.scale else {}),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; each bucket's state is loaded when it is next used.

        Args:
            sd: a state saved by a HookState of the same method and mode.

        Raises:
            ValueError: another method, mode, density or options, another world size or rank
                (checked here when the process group is up, else at the first bucket), or a
                malformed state.
        """
        if not isinstance(sd, dict) or not {"iter", "method", "whole_model", "buckets"} <= set(sd):
            raise ValueError(
                "not a HookState state_dict: it needs the keys iter, method, whole_model and "
                "buckets; pass what HookState.state_dict() returned."
            )
        if sd["method"] != self.method:
            raise ValueError(
                f"cannot load a hook state saved for method {sd['method']!r} into a HookState "
                f"for method {self.method!r}; build HookState({sd['method']!r}, ...) to resume "
                "that run, or start this one without the state."
            )
        if bool(sd["whole_model"]) != self.whole_model:
            raise ValueError(
                f"cannot load a hook state saved with whole_model={bool(sd['whole_model'])} "
                f"into a HookState with whole_model={self.whole_model}; use the same mode."
            )
        if sd.get("overlap", "none") != self.overlap:
            raise ValueError(
                f"cannot load a hook state saved with overlap={sd.get('overlap', 'none')!r} "
                f"into a HookState with overlap={self.overlap!r}: their residuals are in "
                "different orders. Use the same overlap."
            )
        if not is_int(sd["iter"]) or sd["iter"] < 0:
            raise ValueError(f"iter={sd['iter']!r} in the state is invalid: it must be >= 0.")
        self._check_saved_settings(sd)
        layouts = sd.get("layouts", {})
        self.iter = sd["iter"]
        self._aggregators = {}
        self._saved = {int(i): dict(b) for i, b in sd["buckets"].items()}
        self._layouts = {
            int(i): [[int(pos), int(n)] for pos, n in layouts[i]]
            for i in sd["buckets"]
            if i in layouts
        }
        self._pending = []
        self._stats = None
        scale = sd.get("loss_scale")
        self._loss_scale.scale = None if scale is None else float(scale)
        self.totals = RunningTotals.from_state_dict(sd.get("totals"))
        # a state saved before the world was recorded cannot be checked
        self._saved_world = (int(sd["world_size"]), int(sd["rank"])) if "world_size" in sd else None
        self._check_saved_world()  # now if the process group is up, else at the first bucket
        logger.info("gssgd: loaded the %s hook state of iteration %d (%d B sent so far)",
                    self.method, self.iter, self.totals.bytes_sent)

    #: Options that may change between a save and its resume (they shape no saved state).
    _RESUME_MAY_CHANGE = ("nonfinite", "max_consecutive_skips")

    def _recorded_options(self) -> dict[str, Any]:
        """The options as ``state_dict()`` records them (dtypes by name, so the state stays
        plain data)."""
        return {k: str(v) if isinstance(v, torch.dtype) else v
                for k, v in self.settings.options.items()}

    def _check_saved_settings(self, sd: dict[str, Any]) -> None:
        """The density and options a state was saved with must be this state's (a state
        saved before they were recorded is not checked).

        Raises:
            ValueError: naming each setting that differs, saved and current.
        """
        if "options" not in sd:
            return
        saved, current = dict(sd["options"]), self._recorded_options()
        differing = [
            f"{name}: saved {saved.get(name)!r}, running {current.get(name)!r}"
            for name in sorted(set(saved) | set(current))
            if name not in self._RESUME_MAY_CHANGE and saved.get(name) != current.get(name)
        ]
        if sd.get("density") != self.density:
            differing.insert(0, f"density: saved {sd.get('density')!r}, running {self.density!r}")
        if differing:
            raise ValueError(
                f"cannot load this {self.method} hook state: it was saved with other settings "
                f"({'; '.join(differing)}). Build the HookState with the saved settings to "
                "resume that run, or start without the state."
            )

    def _world(self) -> tuple[int, int]:
        """``(world size, rank)`` of this process in the hook's group; (1, 0) without one."""
        if not dist.is_available() or not dist.is_initialized():
            return 1, 0
        return dist.get_world_size(self.group), dist.get_rank(self.group)

    def __getstate__(self) -> dict[str, Any]:
        """Settings and :meth:`state_dict`; the process group, the aggregators'
        communicators and the model binding are left out (they belong to this process)."""
        return {"settings": self.settings, "state": self.state_dict(), "stats": self.last_stats}

    def __setstate__(self, pickled: dict[str, Any]) -> None:
        """Restore a pickled state; aggregators are rebuilt lazily on the default group.

        Set ``state.group`` for another group, call :meth:`bind` again in whole-model
        mode with a bound model, and :meth:`use_scaler` again under a GradScaler.
        """
        self.settings = pickled["settings"]
        self.group = None
        self._reset()
        self._watch_recipe()
        self.load_state_dict(pickled["state"])
        self.last_stats = pickled["stats"]

    def use_scaler(self, scaler: torch.amp.GradScaler | None) -> HookState:
        """Follow ``scaler``'s loss scale from now on (as ``HookState(..., scaler=)``).

        For a state that lost its scaler (unpickled in another process) or was built
        without one. Call it before the first compressed iteration of this process, on
        every rank alike: with a scaler ``nonfinite`` becomes ``"propagate"`` unless it
        was given, and the aggregators are built with it.

        Returns:
            This state.

        Raises:
            ValueError: not a GradScaler, or ``nonfinite="skip"`` (see :mod:`gssgd.amp`).
        """
        options = scaler_options(dict(self.settings.options), scaler)
        if options != self.settings.options:
            self.settings = dataclasses.replace(self.settings, options=options)
        self._loss_scale.scaler = scaler
        return self

    def note_buckets_rebuilt(self) -> None:
        """Say that the DDP model this state hooks has already run a backward in this process.

        DDP lays its buckets out anew after a process's first backward, so per-bucket mode
        keeps that first iteration uncompressed. A training loop that resumes from a
        checkpoint runs one throwaway backward before registering the hook (as
        ``gssgd train`` does) to give the buckets their final layout at once; calling this
        then lets the resumed run's first iteration be compressed like the uninterrupted
        run's, so the two end bitwise equal.
        """
        self._session_iters = max(self._session_iters, 1)

    # ------------------------------------------------------------------ the hook
    def average(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Average one bucket DDP hands over, as :func:`~gssgd.ddp.comm_hook` does (its
        steps 1-4): the dense warm-up, per-bucket, whole-model or streaming mode.

        Raises:
            FloatingPointError: as :func:`~gssgd.ddp.comm_hook` (with a scaler's advice
                where skipped steps had none).
        """
        called, last = time.perf_counter(), bucket.is_last()
        try:
            fut = self._route(bucket)
        except FloatingPointError as exc:
            advice = self._scaler_advice()  # skipped steps without a scaler: a GradScaler's
            if advice is None:
                raise
            raise FloatingPointError(f"{exc} {advice}") from exc
        finally:  # the backward waited this long for the hook (a failed iteration: dropped)
            blocked = self._blocked + time.perf_counter() - called
            self._blocked = 0.0 if last else blocked
        if last:  # the iteration's statistics are published: give them its blocked time
            self.last_stats.seconds_blocked = blocked
        return fut

    def _route(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        self._check_saved_world()  # a loaded state runs in the world it was saved in
        self._follow_loss_scale()  # residuals in the scaler's current units (once an iteration)
        self._note_parameters(bucket)  # which optimizer steps on this hook's gradients
        if self.overlap == "stream":
            return self.stream_step(bucket)  # sketch regions during backward
        self._note_grad_views(bucket)  # for parameters no rank used (find_unused_parameters)
        compressing = self._compressing()
        if not compressing:
            fut = self._allreduce_mean(bucket.buffer())
        elif not (self.whole_model or self._waits_for_iteration()):
            fut = (self.overlapped_bucket_step(bucket) if self.overlap == "buckets"
                   else self.bucket_step(bucket))
        elif not bucket.is_last():
            return self._defer(bucket)  # completed by the last bucket of this iteration
        elif self.whole_model:
            fut = self.whole_model_step(bucket)
        else:
            fut = self.bucket_iteration(bucket)
        if bucket.is_last():
            self._end_iteration(compressing)
        return fut


def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    r"""DDP communication hook that averages gradients with a gssgd aggregator.

    Runs the aggregator ``state.method`` (dense all-reduce, local Top-k, global Top-k,
    Sketched-SGD, gs-SGD or PowerSGD; see :mod:`gssgd.aggregators`) inside DDP's backward
    pass:

    1. For ``state.iter < state.start_iter``: average the bucket with a plain all-reduce.
    2. Per-bucket mode: ``update = agg.step(bucket.buffer())`` with the bucket's own
       aggregator (error feedback per bucket).
    3. Whole-model mode: defer buckets until the last one, then run one ``agg.step`` on
       the concatenated gradient in model order and hand each bucket its part.
    4. At the last bucket, count the iteration and publish ``state.last_stats``.

    Every rank gets bitwise the same update, so the replicas stay identical.

    Args:
        state: the :class:`HookState` holding the settings, residuals and statistics.
        bucket: the gradient bucket DDP hands over (a flat 1-D buffer of several
            parameters' gradients).

    Returns:
        A future holding the averaged gradient of the bucket (in whole-model mode, the
        futures of buckets before the last complete at the last bucket).

    Raises:
        ValueError: a bucket is smaller than an explicit ``k``, its layout differs from the
            one a loaded residual was saved for, or the ranks disagree on the settings.
        FloatingPointError: a non-finite gradient under ``nonfinite="raise"``, or
            ``max_consecutive_skips`` skipped steps in a row (without a scaler, the message
            says how to give the hook a GradScaler).

    Example::
        >>> # xdoctest: +SKIP
        >>> from gssgd.ddp import HookState, comm_hook
        >>> state = HookState("gs", density=0.01, start_iter=10)
        >>> ddp_model.register_comm_hook(state, comm_hook)
        >>> for x, y in loader:
        ...     optimizer.zero_grad()
        ...     loss_fn(ddp_model(x), y).backward()  # grads are gs-SGD's averaged update
        ...     optimizer.step()
    """
    return state.average(bucket)


# DDP's register_comm_hook compares the hook's ``bucket`` and return annotations with
# dist.GradBucket and torch.futures.Future[torch.Tensor] as objects and rejects strings, which
# is what this module's ``from __future__ import annotations`` makes of them: give it objects.
comm_hook.__annotations__ = {"state": HookState, "bucket": dist.GradBucket,
                             "return": torch.futures.Future[torch.Tensor]}
