"""The optimizer step pre-hook every DDP hook state installs (:func:`watch`).

It answers, at each ``optimizer.step()``, which hook produced the gradients the optimizer
is about to step on (:func:`hook_for`: the live hook state that holds its parameters and
ended an iteration most recently, told by :func:`note_iteration_ended`), and then:

* pairs a hand-built :class:`~gssgd.optim.FrozenVarianceAdamW` with that hook
  (:func:`pair_adamw`), or stops with what differs (:func:`adamw_mismatch`): 1-bit Adam's
  recipe needs the hook to compress the momentum from the step the variance freezes;
* warns once per process about an optimizer that steps on a sparse method's hook in a
  combination that trains badly (:func:`gssgd.recipes.recipe_advice`).

A hook state is anything of the :class:`WatchedHook` shape (:class:`gssgd.ddp.HookState`).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Protocol

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from gssgd.optim import FrozenVarianceAdamW
from gssgd.recipes import compresses, recipe_advice

__all__ = ["WatchedHook", "adamw_mismatch", "hook_for", "note_iteration_ended", "pair_adamw",
           "watch"]


class WatchedHook(Protocol):
    """What the watch reads of a hook state (:class:`gssgd.ddp.HookState` has it all)."""

    @property
    def method(self) -> str: ...
    @property
    def density(self) -> float | None: ...
    @property
    def start_iter(self) -> int: ...
    @property
    def options(self) -> dict[str, Any]: ...
    def holds(self, params: list[torch.Tensor]) -> bool: ...


#: The hook states alive in this process that have ended an iteration, each with the
#: number of iterations ended in this process, over every hook, when it last ended one.
_ENDED: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_ended = 0


def note_iteration_ended(state: WatchedHook) -> None:
    """``state`` has just ended an iteration (its gradients are the newest of its
    parameters): what :func:`hook_for` orders the hooks by."""
    global _ended
    _ended += 1
    _ENDED[state] = _ended


def hook_for(params: list[torch.Tensor]) -> Any:
    """The live hook state that averaged the gradients of ``params`` most recently, or None:
    the hook that produced the gradients an optimizer over ``params`` is about to step on."""
    holding = [(ended, h) for h, ended in list(_ENDED.items()) if h.holds(params)]
    return max(holding, key=lambda pair: pair[0], default=(0, None))[1]


#: The compressing hook states alive in this process (for the recipe warning).
_COMPRESSING_STATES: weakref.WeakSet[Any] = weakref.WeakSet()
_warned = False
_recipe_hook: list[Any] = []  # the one registered optimizer pre-hook (its handle)


def adamw_mismatch(optimizer: FrozenVarianceAdamW, state: WatchedHook) -> str | None:
    """What keeps ``optimizer`` from stepping on ``state``'s hook, or None when they match.

    1-bit Adam's recipe holds when the hook compresses from iteration ``freeze_step`` on
    (``start_iter == freeze_step``), returns the compressed momentum
    (``feedback="onebit"``) and forms it with the optimizer's beta1 (``momentum ==
    beta1``); every param group must share betas and freeze_step. Anything else steps on
    a gradient the optimizer takes for something else.

    Args:
        optimizer: the frozen-variance AdamW.
        state: the hook state whose gradients it steps on.

    Returns:
        The error message (it names both sides' values and the one call that sets them
        together), or None.
    """
    groups = optimizer.param_groups
    settings = {(tuple(g["betas"]), g["freeze_step"]) for g in groups}
    if len(settings) > 1:
        return (
            "gssgd: FrozenVarianceAdamW's param groups differ in betas or freeze_step "
            f"({sorted(settings)}), but the hook forms one momentum for them all. Give "
            "every group the same betas and freeze_step."
        )
    (betas, freeze_step), = settings
    options = state.options
    feedback, momentum = options.get("feedback", "ef"), options.get("momentum", 0.0)
    method = state.method
    wrong = []
    if not compresses(method):
        wrong.append(f"method {method!r} never compresses (use torch.optim.AdamW with it)")
    if state.start_iter != freeze_step:
        wrong.append(f"start_iter={state.start_iter} is not freeze_step={freeze_step}")
    if feedback != "onebit":
        wrong.append(f"feedback={feedback!r} is not 'onebit'")
    if momentum != betas[0]:
        wrong.append(f"momentum={momentum} is not beta1={betas[0]}")
    if not wrong:
        return None
    return (
        f"gssgd: FrozenVarianceAdamW(freeze_step={freeze_step}, betas={betas}) steps on "
        f"HookState({method!r}, start_iter={state.start_iter}, feedback={feedback!r}, "
        f"momentum={momentum}), which does not match it: {'; '.join(wrong)}. 1-bit Adam's "
        "recipe needs the hook to compress the momentum from the step the variance "
        "freezes. Build both with one call, which matches them: gssgd.ddp.compressed_adamw("
        f"ddp_model, {method!r}, lr=..., betas={betas}, freeze_step={freeze_step}, ...); "
        "or, to keep this hook, use torch.optim.AdamW."
    )


def pair_adamw(optimizer: FrozenVarianceAdamW, state: WatchedHook, pending: bool = False) -> None:
    """Check that ``optimizer`` and ``state`` match (:func:`adamw_mismatch`) and make the
    optimizer follow the hook's phase (:meth:`FrozenVarianceAdamW.follow`).

    Args:
        optimizer: the frozen-variance AdamW.
        state: the hook state whose gradients it steps on.
        pending: the hook's last iteration has not been stepped on yet (pairing at a step).

    Raises:
        ValueError: they do not match; the message says what differs and the fix.
    """
    error = adamw_mismatch(optimizer, state)
    if error is not None:
        raise ValueError(error)
    optimizer.follow(state, pending=pending)


def _before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """An optimizer step pre-hook: pair a hand-built :class:`FrozenVarianceAdamW` with the
    hook that produced its gradients (or stop with the mismatch), then the recipe warning."""
    if isinstance(optimizer, FrozenVarianceAdamW) and optimizer.hook is None:
        state = hook_for([p for g in optimizer.param_groups for p in g["params"]])
        if state is not None:
            pair_adamw(optimizer, state, pending=True)
    _warn_recipe(optimizer)


def _warn_recipe(optimizer: torch.optim.Optimizer) -> None:
    """Warn once per process about the combination of ``optimizer`` with the compressing
    hook it steps on (the one holding its parameters; before any hook has run, the first
    alive state with advice)."""
    global _warned
    if _warned or not _COMPRESSING_STATES:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    own = hook_for(params)  # the hook whose gradients this optimizer steps on, if it ran
    states = [own] if own in _COMPRESSING_STATES else list(_COMPRESSING_STATES)
    for state in states:
        advice = recipe_advice(optimizer, state.method, state.options, state.density)
        if advice is not None:
            _warned = True
            warnings.warn(advice, UserWarning, stacklevel=4)  # the optimizer.step() call
            return


def watch(state: WatchedHook) -> None:
    """Look at every optimizer step from now on: pair a hand-built
    :class:`FrozenVarianceAdamW` with the hook it steps on (:func:`pair_adamw`) and, for a
    sparse method, warn (once per process) if an optimizer steps on ``state`` in a
    combination that trains badly (:func:`recipe_advice`)."""
    if not _recipe_hook:
        _recipe_hook.append(register_optimizer_step_pre_hook(_before_step))
    if compresses(state.method):
        _COMPRESSING_STATES.add(state)
