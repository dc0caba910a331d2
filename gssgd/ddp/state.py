"""The public state of the hook: :class:`HookState` (the analogue of ``PowerSGDState``).

Construction and validation, the model binding that fixes the whole-model order,
checkpoints (:meth:`HookState.state_dict`, pickling) and the GradScaler
(:meth:`HookState.use_scaler`) live here; the runtime pieces every mode of the hook shares
are those of :class:`~gssgd.ddp.core.HookCore`.
"""

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gssgd._validate import is_int
from gssgd.amp import scaler_options
from gssgd.ddp import recipe
from gssgd.ddp.core import HookCore
from gssgd.ddp.settings import HookSettings
from gssgd.ddp.stats import RunningTotals
from gssgd.log import logger

__all__ = ["HookState"]


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
        """For a sparse method: warn (once per process) if an optimizer steps on this state
        in a combination :func:`gssgd.recipes.recipe_advice` warns against."""
        recipe.watch(self)

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
            a dict with ``"iter"``, ``"method"``, ``"whole_model"``, ``"buckets"`` (bucket
            index -> its aggregator's state_dict) and ``"layouts"`` (bucket index ->
            ``[[position, numel], ...]``; whole-model mode: index 0),
            the world it was saved in (``"world_size"``, ``"rank"``; a state saved with
            no process group says 1 and 0), the settings (``"density"``, ``"options"``),
            the running ``"totals"`` (:class:`~gssgd.ddp.stats.RunningTotals`),
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
        try:
            return self._route(bucket)
        except FloatingPointError as exc:
            advice = self._scaler_advice()  # skipped steps without a scaler: a GradScaler's
            if advice is None:
                raise
            raise FloatingPointError(f"{exc} {advice}") from exc

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
