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
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gssgd.aggregators.options import DEFAULT_DENSITY
from gssgd.ddp.hook import comm_hook
from gssgd.ddp.paired import PairedRun, check_one_call
from gssgd.ddp.state import HookState
from gssgd.log import logger
from gssgd.methods import get_method
from gssgd.recipes import (
    ONE_CALL_HORIZON,
    momentum_placement,
    one_call_horizon,
    recipe_advice,
    sparse,
    sparse_needs_normalisation,
)

__all__ = ["CompressedSGD", "compressed_sgd"]

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
    """Momentum SGD on a DDP model whose gradients ``method`` averages, at your dense lr:
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
    def number(value: object) -> bool:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))

    if not number(lr) or lr <= 0:  # type: ignore[operator]
        raise ValueError(f"lr={lr!r} is invalid: it must be a number > 0 (your dense "
                         "momentum SGD's learning rate, e.g. lr=0.05).")
    if not number(momentum) or not 0 <= momentum < 1:  # type: ignore[operator]
        raise ValueError(f"momentum={momentum!r} is invalid: it must be a number in [0, 1) "
                         "(0.9 is usual; 0 is plain SGD).")
    if not number(weight_decay) or weight_decay < 0:  # type: ignore[operator]
        raise ValueError(f"weight_decay={weight_decay!r} is invalid: it must be a number >= 0.")
    if not isinstance(nesterov, bool):
        raise ValueError(f"nesterov={nesterov!r} is invalid: it must be True or False.")
    if total_steps is not None and (isinstance(total_steps, bool)
                                    or not isinstance(total_steps, int) or total_steps < 1):
        raise ValueError(f"total_steps={total_steps!r} is invalid: it must be an integer >= 1 "
                         "(the run's optimizer steps) or None (unknown).")
    if options.get("feedback") == "onebit":
        raise ValueError(
            "feedback='onebit' is 1-bit Adam's recipe, whose hook returns a momentum for "
            "AdamW to step on; with SGD use the default feedback. For AdamW build the pair "
            "with gssgd.ddp.compressed_adamw(ddp_model, method, lr=...)."
        )
