"""The hook's runtime: a :class:`HookCore` holds the settings and the runtime state of
:class:`~gssgd.ddp.HookState` (aggregators, layouts, the iteration's statistics, buckets
waiting for the last), the pieces every mode is built from (the dense warm-up's
all-reduce, the non-finite check, statistics) and the modes themselves: per-bucket
(:meth:`HookCore.bucket_step`, overlapped :meth:`HookCore.overlapped_bucket_step`,
:meth:`HookCore.bucket_iteration`), whole-model (:meth:`HookCore.whole_model_step`) and
streaming gs (:meth:`HookCore.stream_step`; the algorithm and its aggregator:
:mod:`gssgd.ddp.streaming_gs`). :class:`~gssgd.ddp.HookState` adds construction, model
binding, checkpoints, the scaler and the routing of each bucket to its mode
(:meth:`~gssgd.ddp.HookState.average`) on top.
"""

from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gssgd.aggregators import AGGREGATORS, Aggregator, StepStats, build_options, make_aggregator
from gssgd.aggregators.base import all_finite
from gssgd.aggregators.options import resolve_k
from gssgd.aggregators.sizing import streaming_options
from gssgd.amp import LossScaleFollower
from gssgd.comm import Communicator, completed_future, new_future
from gssgd.comm.futures import BucketLane
from gssgd.ddp.settings import HookSettings
from gssgd.ddp.stats import IterationStats, RunningTotals
from gssgd.ddp.streaming_gs import StreamingGS
from gssgd.log import logger

__all__ = [
    "ITERATION_KINDS",
    "WHOLE_MODEL",
    "HookCore",
    "Layout",
    "Pending",
    "StreamSession",
    "hook_for",
    "layout_str",
]

#: What :attr:`HookCore.last_iteration` says of the iteration that ended last: none yet, a
#: dense all-reduce, a compressed step, or a compressed step whose every vector was skipped
#: for a non-finite gradient (``nonfinite="skip"``: zeros returned, state kept; under a
#: scaler's ``"propagate"`` the scaler skips the optimizer step instead). In per-bucket
#: mode buckets skip on their own: :attr:`HookCore.last_skipped` names their parameters.
ITERATION_KINDS: tuple[str, ...] = ("none", "dense", "compressed", "skipped")

#: The hook states alive in this process that have ended an iteration (weak references).
_HOOKS: weakref.WeakSet[HookCore] = weakref.WeakSet()
_ended = 0  # iterations ended in this process, over every hook (orders them)


def hook_for(params: list[torch.Tensor]) -> HookCore | None:
    """The live hook state that averaged the gradients of ``params`` most recently, or None:
    the hook that produced the gradients an optimizer over ``params`` is about to step on
    (:mod:`gssgd.ddp.recipe` pairs a hand-built :class:`~gssgd.optim.FrozenVarianceAdamW`
    with it)."""
    holding = [h for h in list(_HOOKS) if h.holds(params)]
    return max(holding, key=lambda h: h._ended_at, default=None)

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
        totals: :class:`~gssgd.ddp.totals.RunningTotals`, every iteration's statistics
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
        self._loss_scale = LossScaleFollower()  # the scaler's scale the residuals are in
        self._scale_followed_at = -1  # the iteration whose loss scale was last followed
        self._warned_skip = False  # the skipped-step advice of _end_iteration, given once
        self.last_iteration = "none"  # what the last iteration was (ITERATION_KINDS)
        self.last_skipped: frozenset[int] = frozenset()  # id()s of parameters skipped in it
        self._skipping: set[int] = set()  # the same, during the iteration
        self._params: dict[int, weakref.ref[torch.Tensor]] = {}  # the buckets' parameters
        self._params_known = False  # set once an iteration has noted every bucket's
        self._ended_at = 0  # when, over every hook of the process, it last ended an iteration
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
        counted = self._comm.take_stats()
        self._iteration_stats().add(
            StepStats(
                bytes_sent=counted.bytes_sent,
                bytes_received=counted.bytes_received,
                messages=counted.messages,
                messages_received=counted.messages_received,
                rounds=counted.rounds,
                seconds_communicate=counted.seconds,
            )
        )
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
        global _ended
        self.last_stats = self._iteration_stats().total
        self._stats = None
        self.last_skipped, self._skipping = frozenset(self._skipping), set()
        skipped = self.last_stats.skipped and self.last_skipped >= self._params.keys()
        before, self.last_iteration = self.last_iteration, (  # "skipped": every vector was
            "dense" if not compressed else "skipped" if skipped else "compressed"
        )
        self.totals.add(self.last_stats, self.last_iteration)
        if compressed and before in ("none", "dense"):
            logger.info("gssgd: iteration %d: %s compresses from here on (%s after %d dense "
                        "iterations); %d B sent this iteration", self.iter, self.method,
                        "whole model" if self.whole_model else "per bucket",
                        self.totals.dense_iterations, self.last_stats.bytes_sent)
        self.iter += 1
        self._session_iters += 1
        self._params_known = bool(self._params)
        _ended += 1
        self._ended_at = _ended
        _HOOKS.add(self)
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
        counted = comm.take_stats()
        totals = self._iteration_stats()
        totals.add(
            StepStats(
                bytes_sent=counted.bytes_sent,
                bytes_received=counted.bytes_received,
                messages=counted.messages,
                messages_received=counted.messages_received,
                rounds=counted.rounds,
                k=buffer.numel(),
                d=buffer.numel(),
            )
        )

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
    # not: every bucket but the last goes to the hook's :class:`~gssgd.comm.futures.BucketLane`,
    # one thread that averages the buckets in bucket order while the backward pass goes on,
    # and the hook returns a future the lane completes, as PyTorch's own all-reduce does.
    # DDP launches buckets in bucket order on every rank and one thread issues their
    # collectives in that order, so every rank sees the same sequence of collectives
    # whatever the timing. The last bucket (ready when the backward is done: nothing left to
    # overlap) waits for the lane, which re-raises a bucket's error with its own type, then
    # is averaged in the hook: the results are bitwise the synchronous path's. Under
    # ``nonfinite="propagate"`` (the default with a GradScaler) the buckets wait for the last
    # one instead (:meth:`_defer`) and :meth:`bucket_iteration` steps them all, so no
    # bucket's state moves on a step the scaler skips.

    def bucket_step(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Per-bucket mode: the bucket's own aggregator averages it (before returning)."""
        return completed_future(self._average_bucket(
            bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer()))

    def overlapped_bucket_step(self, bucket: dist.GradBucket
                               ) -> torch.futures.Future[torch.Tensor]:
        """``overlap="buckets"``: every bucket but the last is averaged on the hook's lane
        while the backward goes on; the last waits for the lane, then is averaged here."""
        lane = self.bucket_lane()
        args = (bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer())
        if bucket.is_last():
            lane.drain()
            return completed_future(self._average_bucket(*args))
        return lane.submit(lambda: self._average_bucket(*args), bucket.buffer().device)

    def _average_bucket(self, index: int, params: list[torch.Tensor],
                        grads: list[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor:
        """Bucket ``index``'s update from its own aggregator (its parameters, gradients and
        flat buffer as DDP handed them over)."""
        layout = self._layout(params)
        agg = self._aggregator(index, layout, buffer.numel(), f"bucket {index}", params)
        update = agg.step(buffer)
        self._hand_over_unused(params, grads, update)
        self._add_step(agg.last_stats, params)
        return update

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
