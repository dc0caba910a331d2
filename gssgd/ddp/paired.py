"""What the one-call recipes share: the optimizer and the hook they build together
(:class:`PairedRun`, with one rank's checkpoint of both) and the checks they make before
building anything (:func:`check_one_call`).

:func:`gssgd.ddp.compressed_sgd` and :func:`gssgd.ddp.compressed_adamw` each put the
optimizer's and the hook's settings where the method needs them, so the pair cannot
mismatch; both return a :class:`PairedRun`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import torch
from torch import nn

from gssgd.aggregators import AGGREGATORS
from gssgd.aggregators.options import DEFAULT_DENSITY
from gssgd.ddp.state import HookState
from gssgd.log import logger
from gssgd.lr_schedule import LrSchedule
from gssgd.methods import get_method
from gssgd.recipes import max_skips_for

__all__ = ["PairedRun", "check_one_call", "say_default_density"]


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

