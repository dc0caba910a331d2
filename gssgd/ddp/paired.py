"""An optimizer and its compressing hook built together, in one call, so the pair cannot
mismatch: :func:`compressed_sgd` (momentum SGD, the momentum where each method needs it)
and :func:`compressed_adamw` (1-bit Adam's recipe); both return a :class:`PairedRun`, with
one rank's checkpoint of both. :class:`EveryRankHookState` puts every rank's hook state in
one object for checkpointing tools that save once.

In reading order: what the one-call recipes share (:class:`PairedRun`, the checks they make
before building anything, :func:`check_one_call`); :func:`compressed_sgd`;
:func:`compressed_adamw`; :class:`EveryRankHookState`. Each function's and class's docstring
gives its recipe and its sources.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Self

import torch
import torch.distributed as dist
from torch import nn

from gssgd.aggregators import AGGREGATORS
from gssgd.aggregators.options import DEFAULT_DENSITY
from gssgd.ddp.hook import HookState, comm_hook
from gssgd.ddp.optimizer_watch import pair_adamw
from gssgd.log import logger
from gssgd.lr_schedule import LrSchedule
from gssgd.methods import get_method
from gssgd.optim import FrozenVarianceAdamW, dense_steps_for
from gssgd.recipes import (
    ONE_CALL_HORIZON,
    ONEBIT_SETTINGS,
    compresses,
    max_skips_for,
    momentum_placement,
    one_call_horizon,
    onebit_settings,
    recipe_advice,
    sparse,
    sparse_needs_normalisation,
)
from gssgd.validate import bad_value, check_int, check_number

__all__ = [
    "CompressedAdamW",
    "CompressedSGD",
    "EveryRankHookState",
    "PairedRun",
    "check_one_call",
    "compressed_adamw",
    "compressed_sgd",
    "say_default_density",
    "to_cpu",
]


@dataclass
class PairedRun:
    """An optimizer and the hook registered on the DDP model, built to match.

    Attributes:
        optimizer: the optimizer to step (also through a ``GradScaler``:
            ``scaler.step(run.optimizer)``) and to give an LR scheduler.
        hook: the :class:`~gssgd.ddp.HookState` registered on the model (its ``last_stats``
            hold the last iteration's bytes, its ``totals`` the run's).
        scheduler: the learning-rate schedule (``lr_schedule=``, ``lr_warmup_steps=``) as
            a ``torch`` scheduler to step after each optimizer step, or None (constant).
    """

    optimizer: torch.optim.Optimizer
    hook: HookState
    scheduler: torch.optim.lr_scheduler.LambdaLR | None = None

    def scheduled(self, kind: str, warmup_steps: int, total_steps: int | None) -> Self:
        """This run with its learning rate on :class:`~gssgd.lr_schedule.LrSchedule`
        (``kind`` after ``warmup_steps`` of linear warm-up, over ``total_steps``).

        Raises:
            ValueError: a bad value, or a warm-up or decay without the run's length.
        """
        if kind == "constant" and warmup_steps == 0:
            return self
        if total_steps is None:
            raise ValueError(f"lr_schedule={kind!r}, lr_warmup_steps={warmup_steps!r} need "
                             "total_steps= (the run's optimizer steps): the schedule spans "
                             "the run.")
        self.scheduler = LrSchedule(kind, warmup_steps, total_steps).scheduler(self.optimizer)
        return self

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: ``{"optimizer": ..., "hook": ...}`` (and ``"scheduler"``
        with a schedule). The hook's residuals differ between ranks, so save one file per
        rank."""
        sd = {"optimizer": self.optimizer.state_dict(), "hook": self.hook.state_dict()}
        if self.scheduler is not None:
            sd["scheduler"] = self.scheduler.state_dict()
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (this rank's), before the first step.

        Raises:
            ValueError: ``sd`` lacks the ``optimizer`` or ``hook`` key, or its hook state is
                for another method, mode, setting or world (:meth:`HookState.load_state_dict`).
        """
        if not isinstance(sd, dict) or not {"optimizer", "hook"} <= set(sd):
            raise ValueError(
                f"not a {type(self).__name__} state_dict: it needs the keys optimizer and "
                "hook; pass what state_dict() returned."
            )
        self.optimizer.load_state_dict(sd["optimizer"])
        self.hook.load_state_dict(sd["hook"])
        if self.scheduler is not None:
            if "scheduler" not in sd:
                raise ValueError("this run has a learning-rate schedule and the state_dict "
                                 "none: it was saved by a run without one.")
            self.scheduler.load_state_dict(sd["scheduler"])
        self._loaded()

    def _loaded(self) -> None:
        """What a recipe does after a load (the AdamW recipe re-follows the hook)."""


def check_one_call(call: str, model: nn.Module, method: str,
                   refusal: Callable[[str], str | None], density: float | None = None,
                   options: dict[str, Any] | None = None, total_steps: int | None = None
                   ) -> dict[str, Any]:
    """What a one-call recipe refuses before it builds anything, and a defaulted density
    it says (:func:`say_default_density`); the options to build with.

    Args:
        call: the recipe's name, for the messages (``"compressed_sgd"``).
        model: what the hook is to be registered on.
        method: the method asked for.
        refusal: why the recipe cannot serve a registered method (the message's reason
            and fix), or None where it can.
        density, options: the call's density and the method's other options.
        total_steps: the run's length, if known: then a method that skips non-finite steps
            stops after :func:`~gssgd.recipes.max_skips_for` of them in a row (a tenth of
            the run, at most 100), unless ``options`` sets ``max_consecutive_skips``.

    Returns:
        ``options`` with that skip limit.

    Raises:
        ValueError: not a DDP model, or a method the recipe does not serve; each message
            names the value and the fix.
    """
    if not hasattr(model, "register_comm_hook"):
        raise ValueError(
            f"model={type(model).__name__} is invalid: it must be the "
            "DistributedDataParallel model the hook is registered on; wrap it first: "
            f"{call}(DistributedDataParallel(net), ...)."
        )
    why = refusal(method) if method in AGGREGATORS else None
    if why is not None:
        raise ValueError(f"method={method!r} is invalid for {call}: {why}")
    options = dict(options or {})
    say_default_density(call, method, density, options)
    takes = get_method(method).option_names() if method in AGGREGATORS else ()
    if isinstance(total_steps, int) and total_steps >= 1 and "max_consecutive_skips" in takes:
        options.setdefault("max_consecutive_skips", max_skips_for(total_steps))
    return options


def say_default_density(call: str, method: str, density: float | None,
                        options: dict[str, Any]) -> str | None:
    """Log (and return) that a sparse ``method`` got no ``density`` nor ``k``, so it sends
    the default fraction: ``compressed_sgd(m, "topk", lr=0.1)`` silently meant 0.01."""
    cls = AGGREGATORS.get(method)
    if cls is None or cls.sends_all or density is not None or "k" in options:
        return None
    said = (f"gssgd: {call}: no density given for {method!r}: it sends the default "
            f"{DEFAULT_DENSITY:g} of the coordinates; give density= (or k=) to choose")
    logger.warning(said)
    return said


@dataclass
class CompressedSGD(PairedRun):
    """What :func:`compressed_sgd` returns (a :class:`~gssgd.ddp.paired.PairedRun`).

    Attributes:
        optimizer: the ``torch.optim.SGD`` to step (and to give an LR scheduler).
        hook: the :class:`~gssgd.ddp.HookState` registered on the model.
        placement: where the momentum went: ``"hook"`` or ``"optimizer"``.
    """

    optimizer: torch.optim.SGD
    placement: str = "optimizer"


def compressed_sgd(
    model: nn.Module,
    method: str = "gs",
    *,
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    density: float | None = None,
    whole_model: bool = True,
    start_iter: int = 2,
    scaler: torch.amp.GradScaler | None = None,
    overlap: str = "none",
    params: Iterable[Any] | None = None,
    total_steps: int | None = None,
    lr_schedule: str = "constant",
    lr_warmup_steps: int = 0,
    **options: Any,
) -> CompressedSGD:
    """Momentum SGD with a compressing hook in one call: :func:`compressed_sgd` puts the
    momentum where each method needs it, at the user's dense learning rate.

    Momentum SGD on top of a sparse method's error-fed update steps on what the hook
    delivered, sparse bursts of residual, and keeps pushing each burst for ``1 / (1 -
    momentum)`` steps. Deep Gradient Compression's answer (Lin et al., ICLR 2018, "momentum
    correction") keeps the momentum on each worker *before* compression: ``u = momentum * u +
    g``, the method compresses ``e + u``, and the optimizer is plain SGD. DGC also zeroes a
    delivered coordinate's ``u`` ("momentum factor masking", the aggregators' default); this
    recipe does not (``momentum_masking=False``): with masking, a coordinate delivered every
    step loses its momentum, so at density 1 the run would be plain SGD at the momentum run's
    learning rate, where without it the method is momentum SGD exactly. Dense and PowerSGD
    average a dense update, so the momentum stays in the optimizer (PowerSGD's paper trains
    that way).

    The one rule (:func:`gssgd.recipes.momentum_placement`), from the user's dense settings
    ``lr, momentum, weight_decay``:

    * **in the hook** (a method that sends k of d coordinates and keeps a ``momentum``
      option: topk, gtopk, sketched, gs): ``HookState(method, momentum=momentum,
      momentum_masking=False)`` and ``torch.optim.SGD(lr=lr, momentum=0, weight_decay=
      weight_decay / (1 - momentum))``. The hook's velocity sums the gradients with the
      weights the optimizer's would, so the learning rate stays the user's; weight decay,
      applied by the optimizer outside the momentum, is scaled so its steady-state step is the
      one momentum SGD takes. Nesterov momentum has no form here and is refused.
    * **in the optimizer** (dense, PowerSGD, and a plugin method with no ``momentum`` option):
      ``torch.optim.SGD(lr=lr, momentum=momentum, nesterov=nesterov,
      weight_decay=weight_decay)`` on the hook's averaged update.

    The hook's first ``start_iter`` iterations are plain all-reduces (DDP rebuilds its
    buckets after the first); with the momentum in the hook they step without momentum, so
    keep ``start_iter`` small (the default, 2).

    Example::
        >>> # xdoctest: +SKIP
        >>> from gssgd.ddp import compressed_sgd
        >>> ddp_model = DistributedDataParallel(net)
        >>> run = compressed_sgd(ddp_model, "gs", lr=0.05, momentum=0.9, density=0.01)
        >>> for x, y in loader:
        ...     run.optimizer.zero_grad()
        ...     loss_fn(ddp_model(x), y).backward()
        ...     run.optimizer.step()
        >>> torch.save(run.state_dict(), f"ckpt.rank{rank}.pt")  # this rank's: one file per rank

    Momentum SGD on a DDP model whose gradients ``method`` averages, at your dense lr:
    the momentum where the method needs it (:func:`~gssgd.recipes.momentum_placement`, the
    module doc's rule), the pair checked against the recipe warnings, the hook registered.

    Args:
        model: the ``DistributedDataParallel`` model (the hook is registered on it).
        method: any of :data:`gssgd.AGGREGATORS` (``"dense"`` too, for the baseline).
        lr, momentum, weight_decay, nesterov: your dense momentum SGD's settings (lr kept
            as it is; momentum in [0, 1); Nesterov with dense and PowerSGD only).
        density: the fraction of coordinates sent per step (sparse methods; or ``k=``).
        whole_model: one global selection over the model (True) or one per DDP bucket.
        start_iter: the hook's first compressed iteration (>= 1).
        scaler: the run's ``torch.amp.GradScaler`` under float16 autocast, or None.
        overlap: ``"stream"`` for gs: the sketch is all-reduced while backward runs.
        params: what the optimizer updates (parameters or param groups); default
            ``model.parameters()``.
        total_steps: the run's optimizer steps. A sparse method trained like dense at
            dense's lr only over :func:`~gssgd.recipes.one_call_horizon` steps (600 at
            density 0.01): a shorter run, or an unknown length (None), is warned.
        lr_schedule, lr_warmup_steps: the lr's schedule over ``total_steps``
            (:class:`~gssgd.lr_schedule.LrSchedule`): ``.scheduler``, stepped by you.
        **options: the method's other options (``rank``, ``rows``, ``warmup_steps``, ...).

    Returns:
        A :class:`CompressedSGD`: ``.optimizer`` to step, ``.hook`` registered, ``.placement``,
        and ``state_dict()``/``load_state_dict()`` for this rank's checkpoint.

    Raises:
        ValueError: ``model`` is not a DDP model, ``nesterov`` with the momentum in the
            hook, ``feedback="onebit"`` (AdamW's: use :func:`~gssgd.ddp.compressed_adamw`),
            or any setting out of range (the message names the value, range and fix).
    """
    _check_settings(lr, momentum, weight_decay, nesterov, total_steps, options)
    options = check_one_call("compressed_sgd", model, method, _any, density, options, total_steps)
    placement = _placement(method, momentum, nesterov)
    hook, optimizer = _build(model, method, placement, lr, momentum, weight_decay, nesterov,
                             params, dict(density=density, start_iter=start_iter,
                                          whole_model=whole_model, scaler=scaler,
                                          overlap=overlap, **options))
    _refuse_advised(optimizer, method, hook)
    _warn_short_run(model, method, _sent_fraction(model, density, options), total_steps)
    run = CompressedSGD(optimizer, hook, placement=placement).scheduled(
        lr_schedule, lr_warmup_steps, total_steps)
    model.register_comm_hook(hook, comm_hook)
    logger.info("gssgd: compressed_sgd: %s with momentum %s in the %s, SGD %s", method, momentum,
                placement, {k: optimizer.param_groups[0][k] for k in ("lr", "weight_decay")})
    return run


def _any(method: str) -> None:
    """compressed_sgd serves every method (dense's momentum stays in the optimizer)."""
    return None


def _placement(method: str, momentum: float, nesterov: bool) -> str:
    """Where the momentum goes (:func:`~gssgd.recipes.momentum_placement`; none: the
    optimizer).

    Raises:
        ValueError: Nesterov momentum with the momentum in the hook.
    """
    placement = momentum_placement(method) if momentum else "optimizer"
    if placement == "hook" and nesterov:
        raise ValueError(
            f"nesterov=True cannot be used with {method!r}: its momentum is kept inside the "
            "hook (DGC's momentum correction), which has no Nesterov form here. Use "
            "nesterov=False (the same lr), or a dense method or PowerSGD."
        )
    return placement


def _sent_fraction(model: nn.Module, density: float | None, options: dict[str, Any]) -> float:
    """The fraction of the model's coordinates a sparse method sends a step: ``density``,
    ``k`` over the model's size, or the default density."""
    if density is not None:
        return density
    if "k" in options:
        return options["k"] / max(1, sum(p.numel() for p in model.parameters()))
    return DEFAULT_DENSITY


def _warn_short_run(model: nn.Module, method: str, density: float,
                    total_steps: int | None) -> None:
    """Warn (``UserWarning``) where the one call did not train like dense at dense's
    learning rate in the one-call study: a run shorter than
    :func:`~gssgd.recipes.one_call_horizon` or of unknown length, and a sparse method on a
    CNN without normalisation layers. The message names the horizon and the fixes."""
    if sparse_needs_normalisation(method, model):
        warnings.warn(
            f"gssgd: compressed_sgd({method!r}): this CNN has no normalisation layers; on "
            "such a CNN at dense's learning rate the sparse methods ended far above dense's "
            "training loss even over long runs (the one-call study). Add batch norm, lower "
            "the lr, or use PowerSGD or dense16.", UserWarning, stacklevel=3)
    needed = one_call_horizon(method, density)
    if not needed or (total_steps is not None and total_steps >= needed):
        return
    run = ("a run of unknown length (total_steps not given)" if total_steps is None
           else f"total_steps={total_steps}")
    within, horizon = (("2x", f"{ONE_CALL_HORIZON}/density = {needed}") if sparse(method)
                       else ("1.5x", str(needed)))
    warnings.warn(
        f"gssgd: compressed_sgd({method!r}"
        + (f", density={density:g}" if sparse(method) else "") + f"): {run}. At dense's "
        f"learning rate this method came within {within} dense's training loss only over "
        f"about {horizon} steps (the one-call study); shorter runs ended further above. "
        f"Train at least {needed} steps (pass total_steps= to say so)"
        + (f", raise the density to {ONE_CALL_HORIZON}/steps, or use PowerSGD or dense16."
           if sparse(method) else ", or use dense16."),
        UserWarning, stacklevel=3)


def _refuse_advised(optimizer: torch.optim.SGD, method: str, hook: HookState) -> None:
    """A plugin method whose momentum cannot move: say so, loudly.

    Raises:
        ValueError: the pair gets a recipe warning (:func:`~gssgd.recipes.recipe_advice`).
    """
    advice = recipe_advice(optimizer, method, hook.options, hook.density)
    if advice is not None:
        raise ValueError(
            f"compressed_sgd cannot pair {method!r} with momentum SGD: {advice} "
            "Pass momentum=0 for plain SGD with its error feedback."
        )


def _build(model: nn.Module, method: str, placement: str, lr: float, momentum: float,
           weight_decay: float, nesterov: bool, params: Iterable[Any] | None,
           hook_settings: dict[str, Any]) -> tuple[HookState, torch.optim.SGD]:
    """The hook state (built first: it validates every option) and the optimizer, with the
    momentum where ``placement`` says (the module doc's rule)."""
    settings = dict(hook_settings)
    if placement == "hook":
        settings["momentum"] = float(momentum)
        if "momentum_masking" in get_method(method).option_names():
            settings.setdefault("momentum_masking", False)  # momentum SGD exactly at density 1
    whole_model = settings.pop("whole_model")
    hook = HookState(method, whole_model=whole_model, model=model if whole_model else None,
                     **settings)
    params = model.parameters() if params is None else params
    if placement == "hook":
        return hook, torch.optim.SGD(params, lr=lr, momentum=0.0,
                                     weight_decay=weight_decay / (1 - momentum))
    return hook, torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov,
                                 weight_decay=weight_decay)


def _check_settings(lr: object, momentum: object, weight_decay: object, nesterov: object,
                    total_steps: object, options: dict[str, Any]) -> None:
    """The SGD settings, checked before anything is built.

    Raises:
        ValueError: a value out of range, or AdamW's feedback.
    """
    check_number("lr", lr, "> 0", lambda v: v > 0,
                 "Use your dense momentum SGD's learning rate, e.g. lr=0.05.")
    check_number("momentum", momentum, "in [0, 1)", lambda v: 0 <= v < 1,
                 "0.9 is usual; 0 is plain SGD.")
    check_number("weight_decay", weight_decay, ">= 0", lambda v: v >= 0)
    if not isinstance(nesterov, bool):
        raise bad_value("nesterov", nesterov, "it must be True or False")
    if total_steps is not None:
        check_int("total_steps", total_steps, 1,
                  fix="It counts the run's optimizer steps; None when unknown.")
    if options.get("feedback") == "onebit":
        raise ValueError(
            "feedback='onebit' is 1-bit Adam's recipe, whose hook returns a momentum for "
            "AdamW to step on; with SGD use the default feedback. For AdamW build the pair "
            "with gssgd.ddp.compressed_adamw(ddp_model, method, lr=...)."
        )


#: Hook options the recipe sets itself (from the optimizer's settings).
_RECIPE_OPTIONS = ONEBIT_SETTINGS


@dataclass
class CompressedAdamW(PairedRun):
    """What :func:`compressed_adamw` returns (a :class:`~gssgd.ddp.paired.PairedRun`).

    Attributes:
        optimizer: the :class:`~gssgd.optim.FrozenVarianceAdamW` to step (also through a
            ``GradScaler``: ``scaler.step(run.optimizer)``) and to give an LR scheduler;
            ``torch.optim.AdamW`` for ``"dense"``, the baseline.
        hook: the :class:`~gssgd.ddp.HookState` registered on the model.
    """

    optimizer: torch.optim.AdamW | FrozenVarianceAdamW

    def _loaded(self) -> None:
        if isinstance(self.optimizer, FrozenVarianceAdamW):
            self.optimizer.follow(self.hook)  # the loaded hook's phase


def compressed_adamw(
    model: nn.Module,
    method: str = "gs",
    *,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    freeze_step: int = 150,
    variance: str = "frozen",
    unseen: str = "moving",
    density: float | None = None,
    whole_model: bool = True,
    scaler: torch.amp.GradScaler | None = None,
    overlap: str = "none",
    total_steps: int | None = None,
    params: Iterable[Any] | None = None,
    lr_schedule: str = "constant",
    lr_warmup_steps: int = 0,
    **options: Any,
) -> CompressedAdamW:
    """AdamW with a compressing hook in one call: :func:`compressed_adamw` builds 1-bit Adam's
    recipe (Tang et al., "1-bit Adam", ICML 2021) so that its four values cannot mismatch.

    The recipe has two halves that must agree:

    * the optimizer, :class:`~gssgd.optim.FrozenVarianceAdamW`: ``freeze_step`` dense AdamW
      steps, then the variance ``v`` frozen and each step taken on the momentum the hook
      returns;
    * the hook, :class:`~gssgd.ddp.HookState`: a dense all-reduce until ``start_iter``, then
      the method compresses ``e + beta1 * m + (1 - beta1) * g`` (``feedback="onebit"``,
      ``momentum=beta1``) and returns the new shared momentum ``m``.

    Paired by hand, one wrong value diverges silently. :func:`compressed_adamw` sets
    ``start_iter = freeze_step``, ``feedback="onebit"`` and ``momentum = beta1`` from the
    optimizer's own settings, registers the hook, and makes the optimizer follow the hook's
    phase (:meth:`~gssgd.optim.FrozenVarianceAdamW.follow`), so a step a GradScaler skipped in
    the warm-up does not shift the switch, and a non-finite step the hook skipped moves
    nothing.

    Example::
        >>> # xdoctest: +SKIP
        >>> from gssgd.ddp import compressed_adamw
        >>> ddp_model = DistributedDataParallel(net)
        >>> run = compressed_adamw(ddp_model, "gs", lr=1e-3, weight_decay=0.01, density=0.01,
        ...                        freeze_step=150)
        >>> for x, y in loader:
        ...     run.optimizer.zero_grad()
        ...     loss_fn(ddp_model(x), y).backward()
        ...     run.optimizer.step()
        >>> torch.save(run.state_dict(), f"ckpt.rank{rank}.pt")  # this rank's: one file per rank

    AdamW on a DDP model whose gradients a gssgd method compresses (1-bit Adam's recipe).

    Builds :class:`~gssgd.optim.FrozenVarianceAdamW` and a hook with 1-bit Adam's settings
    (:func:`gssgd.recipes.onebit_settings`); the run's length sets the non-finite skip
    limit (:func:`~gssgd.ddp.paired.check_one_call`).

    Args:
        model: the DDP model (the hook is registered on it).
        method: a compressing method whose options offer ``feedback="onebit"``, or
            ``"dense"``: plain ``torch.optim.AdamW`` through the same call (the baseline).
        lr, betas, eps, weight_decay: AdamW's settings (decoupled weight decay).
        freeze_step: dense AdamW steps before the variance freezes (>= 1; a tenth of the
            run to start with), the hook's first compressed iteration.
        variance, unseen: the variance after ``freeze_step`` (``"frozen"``, 1-bit Adam's, or
            ``"moving"``) and one with none at the freeze (:data:`gssgd.optim.UNSEEN_RULES`).
        density, whole_model, scaler, overlap, params: as :func:`~gssgd.ddp.compressed_sgd`.
        total_steps: the run's length, if known (none above ``freeze_step``: warned).
        lr_schedule, lr_warmup_steps: as :func:`~gssgd.ddp.compressed_sgd` (``.scheduler``).
        **options: the method's other options; the recipe's own three are refused.

    Returns:
        A :class:`CompressedAdamW` (``.optimizer``, ``.hook``, this rank's ``state_dict()``).

    Raises:
        ValueError: not a DDP model, no 1-bit Adam feedback, a recipe's option, a bad value.
    """
    options = _checked_options(model, method, density, options, total_steps)
    schedule = (lr_schedule, lr_warmup_steps, total_steps)
    hooked = {"whole_model": whole_model, "scaler": scaler, "overlap": overlap,
              "model": model if whole_model else None, **options}
    adamw = {"params": model.parameters() if params is None else params, "lr": lr,
             "betas": betas, "eps": eps, "weight_decay": weight_decay}
    if method in AGGREGATORS and not compresses(method):  # dense: the baseline, AdamW
        return _paired(CompressedAdamW(torch.optim.AdamW(**adamw), HookState(method, **hooked)
                                       ).scheduled(*schedule),
                       model, f"{method}: torch.optim.AdamW on the dense average (the baseline)")
    optimizer = FrozenVarianceAdamW(**adamw, freeze_step=freeze_step, variance=variance,
                                    unseen=unseen)
    recipe = onebit_settings(freeze_step, float(optimizer.param_groups[0]["betas"][0]))
    hook = HookState(method, density=density, **recipe, **hooked)
    pair_adamw(optimizer, hook)
    _warn_all_dense(total_steps, freeze_step)
    return _paired(CompressedAdamW(optimizer, hook).scheduled(*schedule), model,
                   f"{method}, {freeze_step} dense AdamW steps, then the variance {variance}")


def _paired(run: CompressedAdamW, model: nn.Module, summary: str) -> CompressedAdamW:
    """Register ``run``'s hook on ``model`` and say what was built."""
    model.register_comm_hook(run.hook, comm_hook)
    logger.info("gssgd: compressed_adamw: %s", summary)
    return run


def _checked_options(model: nn.Module, method: str, density: float | None,
                     options: dict[str, Any], total_steps: int | None) -> dict[str, Any]:
    """The one call's checks (:func:`~gssgd.ddp.paired.check_one_call`) and the refusal of
    an option 1-bit Adam's recipe sets itself (:data:`_RECIPE_OPTIONS`); the options to
    build with."""
    options = check_one_call("compressed_adamw", model, method, _refusal, density, options,
                             total_steps)
    given = sorted(set(options) & set(_RECIPE_OPTIONS))
    if given:
        raise ValueError(
            f"{', '.join(f'{k}={options[k]!r}' for k in given)}: compressed_adamw sets "
            "start_iter=freeze_step, feedback='onebit' and momentum=betas[0] itself. Drop "
            "them (choose freeze_step and betas instead)."
        )
    return options


def _refusal(method: str) -> str | None:
    """Why 1-bit Adam's recipe cannot serve ``method``, or None (a method that never
    compresses, dense, is served as plain AdamW)."""
    if not compresses(method):
        return None
    if "onebit" not in getattr(AGGREGATORS[method].Options, "feedbacks", ()):
        return ("it has no 'onebit' error feedback, which 1-bit Adam's recipe compresses the "
                "momentum with. Use torch.optim.AdamW with it (warned: AdamW on an error-fed "
                "update trains worse), or give the method feedback='onebit'.")
    return None


def _warn_all_dense(total_steps: int | None, freeze_step: int) -> None:
    """A run no longer than its dense warm-up compresses nothing: say so."""
    if total_steps is None or total_steps > freeze_step:
        return
    warnings.warn(
        f"gssgd: total_steps={total_steps} is not longer than freeze_step={freeze_step}: "
        "the whole run is dense AdamW and nothing is compressed. Use a freeze_step "
        f"below the run's length (a tenth of it: {max(1, dense_steps_for(total_steps))}).",
        UserWarning,
        stacklevel=3,
    )


class EveryRankHookState:
    """Every rank's hook state in one object, for checkpointing tools that save once.

    Each rank of a compressed run has its own error-feedback residual, so each must save its
    own hook state. Tools such as Hugging Face Accelerate (``accelerator.save_state`` with
    ``register_for_checkpointing``) or a script that writes one checkpoint from rank 0 save a
    registered object once and load that one file on every rank. :class:`EveryRankHookState`
    makes that work: ``state_dict()`` (called on every rank) gathers all ranks' hook states,
    and ``load_state_dict()`` (every rank loads the same object) hands each rank its own.

    A hook state (or a one-call run's) as a save-once checkpointer needs it.

    ``state_dict()`` is a collective: every rank must call it (Accelerate's ``save_state``
    does). Tensors travel on the CPU.

    Args:
        state: this rank's :class:`~gssgd.ddp.HookState`, or the
            :class:`~gssgd.ddp.paired.PairedRun` of :func:`~gssgd.ddp.compressed_sgd` /
            :func:`~gssgd.ddp.compressed_adamw` (then its optimizer's state travels too).

    Example::
        >>> # xdoctest: +SKIP
        >>> accelerator.register_for_checkpointing(EveryRankHookState(state))
        >>> accelerator.save_state("ckpt")   # on every rank
        >>> accelerator.load_state("ckpt")   # each rank gets its own residual back
    """

    def __init__(self, state: HookState | PairedRun) -> None:
        if not isinstance(state, (HookState, PairedRun)):
            raise ValueError(
                f"state={type(state).__name__} is invalid: it must be a gssgd.ddp.HookState "
                "or what compressed_sgd / compressed_adamw returned."
            )
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        """``{"world_size": P, "ranks": [rank 0's state_dict(), ...]}`` (a collective)."""
        mine = to_cpu(self.state.state_dict())
        if not dist.is_initialized():
            return {"world_size": 1, "ranks": [mine]}
        ranks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        return {"world_size": len(ranks), "ranks": ranks}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Load this rank's part of :meth:`state_dict`.

        Raises:
            ValueError: not such a state, or saved by another number of processes.
        """
        if not isinstance(sd, dict) or not {"world_size", "ranks"} <= set(sd):
            raise ValueError(
                "not an EveryRankHookState state_dict: it needs the keys world_size and "
                "ranks; pass what EveryRankHookState.state_dict() returned."
            )
        world = dist.get_world_size() if dist.is_initialized() else 1
        if sd["world_size"] != world:
            raise ValueError(
                f"the hook state was saved by {sd['world_size']} processes, but {world} are "
                f"running; resume with {sd['world_size']} processes (accelerate launch "
                f"--num_processes {sd['world_size']}, or torchrun --nproc_per_node "
                f"{sd['world_size']}): each process owns its residual."
            )
        self.state.load_state_dict(sd["ranks"][dist.get_rank() if world > 1 else 0])


def to_cpu(tree: Any) -> Any:
    """``tree`` with every tensor detached and on the CPU, its dicts, lists and tuples
    rebuilt (what ``all_gather_object`` and a checkpoint of every rank carry)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_cpu(v) for v in tree)
    return tree
