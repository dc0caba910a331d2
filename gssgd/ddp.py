"""DistributedDataParallel communication hooks built on the gssgd aggregators.

(Longer than the project's ~500-line guide only by its docstrings, about 220 lines that
teach the hook's contract with DDP; the code, one hook and its state, is about 450 lines.)

Any aggregator of :data:`gssgd.AGGREGATORS` ("dense", "topk", "gtopk", "sketched", "gs",
and any method registered with :func:`gssgd.register_method`) becomes a DDP communication
hook with one line, the way PyTorch's ``powerSGD_hook`` does::

    from gssgd.ddp import HookState, comm_hook
    ddp_model.register_comm_hook(HookState("gs", density=0.01, model=ddp_model), comm_hook)

DDP hands the hook its gradients bucket by bucket during ``loss.backward()``; the hook
returns a future holding the averaged gradient of the bucket, which DDP writes into
``param.grad``. The optimizer then runs unchanged.

Algorithm of :func:`comm_hook`, per bucket (steps 1-2 of every iteration are collectives
that every rank runs in the same order, since DDP launches buckets in index order):

1. Warm-up (``state.iter < start_iter``): all-reduce the bucket and divide by the world
   size, exactly like DDP without a hook. DDP rebuilds its buckets after its first
   iteration, so the layout the compressors see is only fixed from then on.
2. Compression, per-bucket mode (``whole_model=False``): bucket ``i`` has its own
   aggregator with ``d = bucket.numel()`` (k is resolved per bucket from ``density``),
   created the first time the bucket is compressed. ``update = agg.step(bucket.buffer())``
   is the averaged update, the same on every rank; the residual of the bucket stays in
   its aggregator.
3. Compression, whole-model mode (``whole_model=True``): the whole gradient is one vector,
   so top-k is global over all layers, as in the papers. Buckets before the last get a
   not-yet-completed future and their gradients are stashed; at the last bucket the
   stashed gradients are concatenated in model order (see below), one
   ``agg.step(flat)`` runs, the update is split back into the buckets' gradients, and
   every pending future is completed. DDP waits for all of a backward's futures
   before it writes ``param.grad``, so deferring is safe; it just gives up overlapping
   communication with the backward pass.
4. After the last bucket, ``state.iter`` grows by one and ``state.last_stats`` holds the
   summed :class:`~gssgd.StepStats` of the iteration.

Model order. DDP's bucket layout changes when it rebuilds its buckets, and differs between
processes with other ``bucket_cap_mb``. In whole-model mode the flat vector (and therefore
the residual a checkpoint saves) follows the parameters' order in the model, given by
``HookState(..., model=m)`` or ``state.bind(m)``, so a resumed run lines up with the saved
residual whatever the layout. Without a bound model it follows the bucket order (bucket
index, then DDP's order inside each bucket), and a resumed run must rebuild the same
layout (same model, same ``bucket_cap_mb``). In per-bucket mode the residuals belong to
buckets, so a resume always needs the same layout; a changed layout is a ``ValueError``.

Mixed precision. Give the hook the run's ``torch.amp.GradScaler`` (``scaler=``): an
overflowing step then returns all-NaN buckets on every rank with the residuals untouched
(``nonfinite="propagate"``; in per-bucket mode the buckets wait for the last one, so no
bucket's state moves on a step the scaler skips), the scaler skips and backs off as with
DDP's all-reduce, and the residuals follow the scaler's scale. See :mod:`gssgd.amp`.

Resuming. A state that was loaded (:meth:`HookState.load_state_dict`, or unpickled) and is
already past ``start_iter`` runs one dense iteration in its first DDP iteration in this
process (while DDP's buckets still have their construction-time layout), then compresses
with the saved residuals. Whole-model mode with a bound model does not need that iteration
and compresses at once, so its resumed run is bitwise the uninterrupted one.
"""

# No ``from __future__ import annotations`` here: DDP's register_comm_hook compares the
# hook's ``bucket`` and return annotations with dist.GradBucket and
# torch.futures.Future[torch.Tensor] as objects, and rejects them as strings.
import dataclasses
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from gssgd.aggregators import AGGREGATORS, Aggregator, StepStats, build_options, make_aggregator
from gssgd.aggregators.base import _all_finite
from gssgd.amp import LossScaleFollower, scaler_options
from gssgd.comm import Communicator, completed_future, new_future
from gssgd.ddp_stream import check_overlap, stream_hook

__all__ = ["HookState", "comm_hook"]

#: The compressing hook states alive in this process (for the optimizer-momentum warning).
_SPARSE_STATES: "weakref.WeakSet[HookState]" = weakref.WeakSet()
_warned_momentum = False
_recipe_hook: list[Any] = []  # the one registered optimizer pre-hook (its handle)


def _warn_optimizer_momentum(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """An optimizer step pre-hook: warn once when an optimizer with momentum steps while a
    sparse method's hook is alive (momentum on a sparse, error-fed update is unstable)."""
    global _warned_momentum
    if _warned_momentum or not _SPARSE_STATES:
        return
    momenta = [g.get("momentum", 0) for g in optimizer.param_groups]
    momenta = [m for m in momenta if isinstance(m, (int, float)) and m > 0]
    if not momenta:
        return
    _warned_momentum = True
    method = next(iter(_SPARSE_STATES)).method
    warnings.warn(
        f"gssgd: {type(optimizer).__name__} has momentum={momenta[0]} on top of the sparse "
        f"method {method!r}. Momentum applied after a sparse, error-fed aggregation is "
        "unstable (MNIST, density 0.001: gs reached 89% with it, 97% without; see "
        "docs/study.md). Use plain SGD (momentum=0) with a larger learning rate, or momentum "
        f"inside the aggregator: HookState({method!r}, ..., momentum=0.9) with the optimizer's "
        "momentum at 0.",
        UserWarning,
        stacklevel=3,
    )


#: Key of the single aggregator in whole-model mode (in ``state_dict()["buckets"]``).
_WHOLE_MODEL = 0

#: A layout, one entry per parameter: ``[position in the model (-1 when no model is bound), numel]``.
_Layout = list[list[int]]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class HookSettings:
    """The tuned settings of a :class:`HookState`, validated once at construction.

    Attributes:
        method: one of :data:`gssgd.AGGREGATORS`.
        density: fraction of coordinates sent per vector (bucket or whole model), or None.
        start_iter: the first compressed iteration (>= 1); earlier ones all-reduce densely.
        whole_model: compress the whole gradient as one vector instead of bucket by bucket.
        options: the method's options (``k``, ``rows``, ``cols``, ``momentum``, ...).
        overlap: "none", or "stream" (whole-model gs only) to all-reduce the sketch bucket
            by bucket during backward (:mod:`gssgd.ddp_stream`).

    Raises:
        ValueError: any setting out of range, naming the value, the range and the fix.
    """

    method: str
    density: float | None = None
    start_iter: int = 2
    whole_model: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    overlap: str = "none"

    def __post_init__(self) -> None:
        if self.method not in AGGREGATORS:
            raise ValueError(
                f"method={self.method!r} is invalid: it must be one of "
                f"{', '.join(AGGREGATORS)}. For example HookState('gs', density=0.01)."
            )
        if not _is_int(self.start_iter) or self.start_iter < 1:
            raise ValueError(
                f"start_iter={self.start_iter!r} is invalid: it must be an integer >= 1, "
                "because DDP rebuilds its buckets after iteration 0 and compression must "
                "start on the rebuilt layout. Use start_iter=2 (the default) or more."
            )
        if not isinstance(self.whole_model, bool):
            raise ValueError(
                f"whole_model={self.whole_model!r} is invalid: it must be True or False."
            )
        k = self.options.get("k")
        if k is not None and (not _is_int(k) or k < 1):
            raise ValueError(
                f"k={k!r} is invalid: it must be an integer >= 1 (and at most the length of "
                "every compressed vector). Or give density= instead."
            )
        # Validate density and every option against a dummy length that admits k; k is
        # resolved again for each vector's real length when it is first compressed.
        build_options(self.method, k if k is not None else 1, self.density, **self.options)
        check_overlap(self.overlap, self.method, self.whole_model, self.options)

    def check_k(self, d: int, where: str) -> None:
        """Raise a clear error when an explicit ``k`` exceeds the vector length ``d``.

        Raises:
            ValueError: ``k > d``.
        """
        k = self.options.get("k")
        if k is not None and k > d:
            raise ValueError(
                f"k={k} is larger than {where}, which holds d={d} gradient elements; k must "
                f"be in [1, {d}]. Give density= (k is then resolved per vector), a smaller k, "
                + (
                    "or a larger bucket_cap_mb / whole_model=True."
                    if not self.whole_model
                    else "or compress a larger model."
                )
            )


def _layout_str(layout: _Layout) -> str:
    if all(pos >= 0 for pos, _ in layout):
        return "parameters " + str([pos for pos, _ in layout])
    return "unbound parameters of sizes " + str([n for _, n in layout])


@dataclass
class _Pending:
    """A bucket whose future waits for the last bucket (whole-model mode)."""

    index: int
    params: list[torch.Tensor]
    grads: list[torch.Tensor]
    buffer: torch.Tensor
    future: torch.futures.Future[torch.Tensor] | None


class _IterationStats:
    """Sums the StepStats of one iteration's aggregator steps and dense all-reduces."""

    def __init__(self) -> None:
        self.total = StepStats()
        self._fraction_sum = 0.0
        self._fraction_weight = 0

    def add(self, stats: StepStats) -> None:
        t = self.total
        for f in dataclasses.fields(StepStats):
            if f.name not in ("skipped", "delivered_fraction"):
                setattr(t, f.name, getattr(t, f.name) + getattr(stats, f.name))
        t.skipped = t.skipped or stats.skipped
        if stats.delivered_fraction is not None:
            self._fraction_sum += stats.delivered_fraction * stats.d
            self._fraction_weight += stats.d
            t.delivered_fraction = self._fraction_sum / self._fraction_weight


class HookState:
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
        method: one of :data:`gssgd.AGGREGATORS`: "dense", "topk", "gtopk", "sketched", "gs".
        density: fraction of each vector sent, in (0, 1]; default 0.01 (ignored by dense).
        start_iter: the first compressed iteration, >= 1 (default 2).
        whole_model: one vector for the whole model (True) or one per bucket (False).
        group: process group; None means the default group.
        model: the model whose parameter order fixes the whole-model order (the DDP
            module or the module it wraps); same as calling :meth:`bind` later.
        overlap: "none" (default), or "stream" with ``method="gs"`` and ``whole_model=True``:
            the sketch table is cut by DDP bucket and each bucket's part is all-reduced
            while backward runs (:mod:`gssgd.ddp_stream`; saved in :meth:`state_dict`).
        scaler: the run's ``torch.amp.GradScaler`` under float16 autocast, or None. With
            it ``nonfinite`` defaults to ``"propagate"`` and the residuals are kept in the
            units of its current loss scale (:mod:`gssgd.amp`).
        **options: the method's options (``k`` instead of ``density``; ``rows``, ``cols``,
            ``candidates``, ``exact``, ``allreduce``, ``table_dtype``, ``momentum``, ``seed``, ``dtype``,
            ``nonfinite``: "skip", "raise" or "propagate"; see :func:`gssgd.make_aggregator`).

    Attributes:
        iter: the number of DDP iterations this state has seen (saved in checkpoints).
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
        whole_model: bool = False,
        group: dist.ProcessGroup | None = None,
        model: nn.Module | None = None,
        scaler: torch.amp.GradScaler | None = None,
        overlap: str = "none",
        **options: Any,
    ) -> None:
        settings = HookSettings(method, density, start_iter, whole_model, dict(options), overlap)
        self._start(settings, group, model, scaler)

    @classmethod
    def from_settings(
        cls,
        settings: HookSettings,
        group: dist.ProcessGroup | None = None,
        model: nn.Module | None = None,
        scaler: torch.amp.GradScaler | None = None,
    ) -> "HookState":
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
        """For a sparse method: warn (once per process) if an optimizer with momentum steps
        while this state is alive."""
        if self.method in AGGREGATORS and not AGGREGATORS[self.method].sends_all:
            if not _recipe_hook:
                _recipe_hook.append(register_optimizer_step_pre_hook(_warn_optimizer_momentum))
            _SPARSE_STATES.add(self)

    def _reset(self) -> None:
        """Empty runtime state: no aggregators, no binding, iteration 0."""
        self.iter = 0
        self.last_stats = StepStats()
        self._aggregators: dict[int, Aggregator] = {}
        self._layouts: dict[int, _Layout] = {}  # layout each live or saved residual is for
        self._saved: dict[int, dict[str, Any]] = {}  # loaded states not yet given an aggregator
        self._positions: dict[int, int] = {}  # id(parameter) -> position in the bound model
        self._bound: list[torch.Tensor] = []  # keeps the bound parameters (and their ids) alive
        self._pending: list[_Pending] = []
        self._stats: _IterationStats | None = None
        self._session_iters = 0  # iterations seen in this process (not saved)
        self._comm: Communicator | None = None  # the warm-up's accounted all-reduce
        self._grad_views: bool | None = None  # DDP's gradient_as_bucket_view, once seen
        self._stream: Any = None  # overlap="stream": gssgd.ddp_stream's session
        self._loss_scale = LossScaleFollower()  # the scaler's scale the residuals are in
        self._scale_followed_at = -1  # the iteration whose loss scale was last followed

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

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self.settings.options.items())
        return (
            f"HookState({self.method!r}, density={self.density!r}, start_iter="
            f"{self.start_iter}, whole_model={self.whole_model}"
            + (f", overlap={self.overlap!r}" if self.overlap != "none" else "")
            + f"{opts}; iter={self.iter})"
        )

    def bind(self, model: nn.Module) -> "HookState":
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
            ``{"iter", "method", "whole_model", "buckets": {index: aggregator state_dict},
            "layouts": {index: [[position, numel], ...]}}`` (whole-model mode: index 0),
            and ``"loss_scale"`` (the GradScaler scale the residuals are in) under a scaler.
            Only tensors, ints, floats, strings, bools, dicts and lists, so
            ``torch.load(..., weights_only=True)`` reads it.
        """
        buckets = {i: dict(sd) for i, sd in self._saved.items()}
        buckets.update({i: agg.state_dict() for i, agg in self._aggregators.items()})
        return {
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
            ValueError: another method or mode, or a malformed state.
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
        if not _is_int(sd["iter"]) or sd["iter"] < 0:
            raise ValueError(f"iter={sd['iter']!r} in the state is invalid: it must be >= 0.")
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

    def use_scaler(self, scaler: torch.amp.GradScaler | None) -> "HookState":
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

    # ------------------------------------------------------------------ hook pieces
    def _compressing(self) -> bool:
        """Whether this iteration is compressed (the same answer for every bucket of it)."""
        if self.iter < self.start_iter:
            return False
        # In a process's first DDP iteration the buckets have their pre-rebuild layout;
        # only whole-model mode in model order does not depend on it.
        return self._session_iters >= 1 or (self.whole_model and bool(self._positions))

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

    def _nonfinite_ranks(self, buffers: list[torch.Tensor]) -> list[int]:
        """The ranks on which any of ``buffers`` holds NaN/Inf (one 4-byte all-gather)."""
        if self._comm is None:
            self._comm = Communicator(self.group)
        bad = torch.tensor(
            [0 if all(_all_finite(b) for b in buffers) else 1],
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
                rounds=counted.rounds,
                seconds_communicate=counted.seconds,
            )
        )
        return [r for r, flag in enumerate(flags) if int(flag)]

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

    def _iteration_stats(self) -> _IterationStats:
        if self._stats is None:
            self._stats = _IterationStats()
        return self._stats

    def _end_iteration(self) -> None:
        self.last_stats = self._iteration_stats().total
        self._stats = None
        self.iter += 1
        self._session_iters += 1

    def _layout(self, params: list[torch.Tensor]) -> _Layout:
        return [[self._positions.get(id(p), -1), p.numel()] for p in params]

    def _aggregator(self, index: int, layout: _Layout, d: int, where: str) -> Aggregator:
        """The aggregator of bucket ``index`` (created on first use, with any loaded state).

        Raises:
            ValueError: the layout differs from the one its residual was built for, or an
                explicit k exceeds ``d``.
        """
        agg = self._aggregators.get(index)
        known = self._layouts.get(index)
        if known is not None and known != layout:
            if agg is not None:
                raise ValueError(
                    f"{where} changed from {_layout_str(known)} to {_layout_str(layout)} "
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
                f"{where} holds {_layout_str(layout)}, but its saved residual is for "
                f"{_layout_str(known)}; {hint}."
            )
        if agg is None:
            self.settings.check_k(d, where)
            agg = make_aggregator(
                self.method, d, density=self.density, group=self.group, **self.settings.options
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

    def _per_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Per-bucket mode: the bucket's own aggregator averages it."""
        index = bucket.index()
        buffer = bucket.buffer()
        layout = self._layout(bucket.parameters())
        agg = self._aggregator(index, layout, buffer.numel(), f"bucket {index}")
        update = agg.step(buffer)
        self._hand_over_unused(bucket.parameters(), bucket.gradients(), update)
        self._iteration_stats().add(agg.last_stats)
        return completed_future(update)

    def _per_bucket_iteration(
        self, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        """Per-bucket mode under ``nonfinite="propagate"``, the last bucket.

        Steps: (1) every rank learns whether any bucket of the iteration is non-finite on
        any rank; (2) if so, every bucket's aggregator applies its non-finite policy (an
        all-NaN bucket, state untouched); else each steps in bucket order; (3) the updates
        go into the buckets' buffers and every pending future completes.
        """
        this = _Pending(
            bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer(), None
        )
        entries = sorted([*self._pending, this], key=lambda p: p.index)
        try:
            aggs = [
                self._aggregator(e.index, self._layout(e.params), e.buffer.numel(),
                                 f"bucket {e.index}")
                for e in entries
            ]
            bad_ranks = self._nonfinite_ranks([e.buffer for e in entries])
            for e, agg in zip(entries, aggs, strict=True):
                if bad_ranks:
                    update = agg.nonfinite_step(e.buffer, bad_ranks)
                else:
                    update = agg.step(e.buffer)
                self._iteration_stats().add(agg.last_stats)
                e.buffer.copy_(update)
                self._hand_over_unused(e.params, e.grads, update)
        except BaseException as exc:
            self._fail_pending(exc)
            raise
        for e in self._pending:
            e.future.set_result(e.buffer)  # type: ignore[union-attr]
        self._pending = []
        return completed_future(this.buffer)

    def _defer(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Whole-model mode, a bucket before the last: stash it, return a pending future."""
        index = bucket.index()
        if any(p.index == index for p in self._pending):  # a backward was abandoned
            self._fail_pending(RuntimeError("an earlier backward pass did not finish"))
            self._stats = None
        buffer = bucket.buffer()
        fut = new_future(buffer.device)
        self._pending.append(_Pending(index, bucket.parameters(), bucket.gradients(), buffer, fut))
        return fut

    def _fail_pending(self, exc: BaseException) -> None:
        for p in self._pending:
            if p.future is not None and not p.future.done():
                p.future.set_exception(exc)
        self._pending = []

    def _whole_model(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Whole-model mode, the last bucket: one step over every stashed gradient.

        Steps: (1) list every parameter of the pending buckets and this one with its
        gradient view; (2) order them by model position (or keep bucket order when no
        model is bound); (3) concatenate and run the aggregator once; (4) write the update
        back into the gradient views, which live in the buckets' buffers; (5) complete
        the pending futures with their buffers.
        """
        this = _Pending(
            bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer(), None
        )
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
            agg = self._aggregator(_WHOLE_MODEL, layout, flat.numel(), "the whole model")
            update = agg.step(flat)
            self._iteration_stats().add(agg.last_stats)
            pieces = update.split([g.numel() for _, g in pairs])
            for (_, g), piece in zip(pairs, pieces, strict=True):
                g.copy_(piece.view_as(g))
            self._hand_over_unused([p for p, _ in pairs], [g for _, g in pairs], update)
        except BaseException as exc:
            self._fail_pending(exc)  # never leave DDP waiting on a future forever
            raise
        for e in self._pending:
            e.future.set_result(e.buffer)  # type: ignore[union-attr]
        self._pending = []
        return completed_future(this.buffer)


def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    r"""DDP communication hook that averages gradients with a gssgd aggregator.

    Runs the aggregator ``state.method`` (dense all-reduce, local Top-k, global Top-k,
    Sketched-SGD or gs-SGD; see :mod:`gssgd.aggregators`) inside DDP's backward pass:

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
    state._follow_loss_scale()  # residuals in the scaler's current units (once an iteration)
    if state.overlap == "stream":
        return stream_hook(state, bucket)  # gssgd.ddp_stream: sketch regions during backward
    state._note_grad_views(bucket)  # for parameters no rank used (find_unused_parameters)
    if not state._compressing():
        fut = state._allreduce_mean(bucket.buffer())
    else:
        waits = state.whole_model or state._waits_for_iteration()
        if not waits:
            fut = state._per_bucket(bucket)
        elif not bucket.is_last():
            return state._defer(bucket)  # completed by the last bucket of this iteration
        elif state.whole_model:
            fut = state._whole_model(bucket)
        else:
            fut = state._per_bucket_iteration(bucket)
    if bucket.is_last():
        state._end_iteration()
    return fut
