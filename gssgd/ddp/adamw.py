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
from gssgd.ddp.recipe import pair_adamw
from gssgd.ddp.state import HookState
from gssgd.log import logger
from gssgd.optim import FrozenVarianceAdamW, dense_steps_for
from gssgd.recipes import ONEBIT_SETTINGS, compresses, onebit_settings

__all__ = ["CompressedAdamW", "compressed_adamw"]

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
    """AdamW on a DDP model whose gradients a gssgd method compresses (1-bit Adam's recipe).

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
