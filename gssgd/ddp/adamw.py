"""AdamW with a compressing hook in one call: :func:`compressed_adamw` builds 1-bit Adam's
recipe (Tang et al., "1-bit Adam", ICML 2021) so that its four values cannot mismatch.

The recipe has two halves that must agree:

* the optimizer, :class:`~gssgd.optim.FrozenVarianceAdamW`: ``freeze_step`` dense AdamW
  steps, then the variance ``v`` frozen and each step taken on the momentum the hook
  returns;
* the hook, :class:`~gssgd.ddp.HookState`: a dense all-reduce until ``start_iter``, then
  the method compresses ``e + beta1 * m + (1 - beta1) * g`` (``feedback="onebit"``,
  ``momentum=beta1``) and returns the new shared momentum ``m``.

Paired by hand, one wrong value diverges silently (the error-fed update read as a momentum
went to NaN on a small MLP within 44 steps). :func:`compressed_adamw` sets
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
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gssgd.aggregators import AGGREGATORS
from gssgd.ddp.hook import comm_hook
from gssgd.ddp.paired import PairedRun, check_one_call
from gssgd.ddp.recipe import compresses, pair_adamw
from gssgd.ddp.state import HookState
from gssgd.log import logger
from gssgd.optim import FrozenVarianceAdamW, dense_steps_for

__all__ = ["CompressedAdamW", "compressed_adamw"]

#: Hook options the recipe sets itself (from the optimizer's settings).
_RECIPE_OPTIONS = ("feedback", "momentum", "start_iter")


@dataclass
class CompressedAdamW(PairedRun):
    """What :func:`compressed_adamw` returns (a :class:`~gssgd.ddp.paired.PairedRun`).

    Attributes:
        optimizer: the :class:`~gssgd.optim.FrozenVarianceAdamW` to step (also through a
            ``GradScaler``: ``scaler.step(run.optimizer)``) and to give an LR scheduler.
        hook: the :class:`~gssgd.ddp.HookState` registered on the model.
    """

    optimizer: FrozenVarianceAdamW

    def _loaded(self) -> None:
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
    **options: Any,
) -> CompressedAdamW:
    """AdamW on a DDP model whose gradients a gssgd method compresses (1-bit Adam's recipe).

    Steps: (1) build :class:`~gssgd.optim.FrozenVarianceAdamW` with the AdamW settings;
    (2) build :class:`~gssgd.ddp.HookState` with ``start_iter=freeze_step``,
    ``feedback="onebit"`` and ``momentum=betas[0]``; (3) check they match and make the
    optimizer follow the hook's phase; (4) register the hook on ``model``.

    Tuning: ``freeze_step`` dense steps settle the variance before it freezes (a tenth of
    the run; 150 of 1,500 on the character LSTM and GPT, where at density 0.01 the sparse
    methods ended 1.2-3.1 % above dense AdamW); lr, betas, weight decay as for dense AdamW.

    Args:
        model: the DDP model (the hook is registered on it).
        method: any compressing method whose options offer ``feedback="onebit"`` (every
            built-in one but dense, PowerSGD included).
        lr, betas, eps, weight_decay: AdamW's settings (decoupled weight decay).
        freeze_step: dense AdamW steps before the variance freezes (>= 1); also the hook's
            first compressed iteration.
        variance: ``"frozen"`` (1-bit Adam's) or ``"moving"`` after ``freeze_step``.
        unseen: what a coordinate with no variance at the freeze does
            (:data:`gssgd.optim.UNSEEN_RULES`; default: its variance keeps moving).
        density: the fraction of coordinates sent per step (or ``k=`` in ``options``).
        whole_model: one global selection over the model (True) or one per DDP bucket.
        scaler: the run's ``torch.amp.GradScaler`` under float16 autocast, or None.
        overlap: ``"stream"`` for gs: the sketch is all-reduced during backward.
        total_steps: the run's length, if known: a run no longer than ``freeze_step`` is
            dense throughout, and warns.
        params: what the optimizer updates (parameters or param groups); default
            ``model.parameters()``.
        **options: the method's other options (``rows``, ``cols``, ``candidates``,
            ``nonfinite``, ...); ``feedback``, ``momentum`` and ``start_iter`` are the
            recipe's and are refused.

    Returns:
        A :class:`CompressedAdamW`: ``.optimizer`` to step, ``.hook`` registered, and
        ``state_dict()``/``load_state_dict()`` for this rank's checkpoint.

    Raises:
        ValueError: ``model`` is not a DDP model, ``method`` does not compress, an option
            the recipe sets is given, or any setting out of range (the optimizer's and the
            hook's own checks; the message names the value and the valid range).
    """
    check_one_call("compressed_adamw", model, method, _refusal)
    _check_recipe_options(options)
    optimizer = FrozenVarianceAdamW(
        model.parameters() if params is None else params, lr=lr, betas=betas, eps=eps,
        weight_decay=weight_decay, freeze_step=freeze_step, variance=variance, unseen=unseen,
    )
    hook = HookState(
        method, density=density, start_iter=freeze_step, whole_model=whole_model,
        model=model if whole_model else None, scaler=scaler, overlap=overlap,
        feedback="onebit", momentum=float(optimizer.param_groups[0]["betas"][0]), **options,
    )
    pair_adamw(optimizer, hook)
    if total_steps is not None and total_steps <= freeze_step:
        _warn_all_dense(total_steps, freeze_step)
    model.register_comm_hook(hook, comm_hook)
    logger.info("gssgd: compressed_adamw: %s, %d dense AdamW steps, then the variance %s",
                method, freeze_step, variance)
    return CompressedAdamW(optimizer, hook)


def _check_recipe_options(options: dict[str, Any]) -> None:
    """Refuse an option 1-bit Adam's recipe sets itself (:data:`_RECIPE_OPTIONS`)."""
    given = sorted(set(options) & set(_RECIPE_OPTIONS))
    if given:
        raise ValueError(
            f"{', '.join(f'{k}={options[k]!r}' for k in given)}: compressed_adamw sets "
            "start_iter=freeze_step, feedback='onebit' and momentum=betas[0] itself. Drop "
            "them (choose freeze_step and betas instead)."
        )


def _refusal(method: str) -> str | None:
    """Why 1-bit Adam's recipe cannot serve ``method``, or None."""
    if not compresses(method):
        return ("it never compresses, so there is no compressed momentum to pair AdamW with. "
                "Use torch.optim.AdamW with it, or a compressing method "
                f"({', '.join(m for m in AGGREGATORS if compresses(m))}).")
    if "onebit" not in getattr(AGGREGATORS[method].Options, "feedbacks", ()):
        return ("it has no 'onebit' error feedback, which 1-bit Adam's recipe compresses the "
                "momentum with. Use torch.optim.AdamW with it (warned: AdamW on an error-fed "
                "update trains worse), or give the method feedback='onebit'.")
    return None


def _warn_all_dense(total_steps: int, freeze_step: int) -> None:
    """A run no longer than its dense warm-up compresses nothing: say so."""
    warnings.warn(
        f"gssgd: total_steps={total_steps} is not longer than freeze_step={freeze_step}: "
        "the whole run is dense AdamW and nothing is compressed. Use a freeze_step "
        f"below the run's length (a tenth of it: {max(1, dense_steps_for(total_steps))}).",
        UserWarning,
        stacklevel=3,
    )
