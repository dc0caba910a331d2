"""The training recipe's checks: a hand-built 1-bit Adam pair that does not match (an
error), and an optimizer on top of a sparse method's hook in the combinations that
measured badly (warnings; docs/study.md, "Keep your optimizer").

Every :class:`~gssgd.ddp.HookState` registers itself with :func:`watch`, which installs one
optimizer step pre-hook. Before a :class:`~gssgd.optim.FrozenVarianceAdamW` that follows no
hook steps, it finds the live hook that holds the optimizer's parameters and ran last
(:func:`~gssgd.ddp.core.hook_for`), checks the pair (:func:`adamw_mismatch`: ``start_iter == freeze_step``,
``feedback="onebit"``, ``momentum == beta1``, a compressing method) and pairs them
(:func:`pair_adamw`), or raises the mismatch as a ``ValueError`` that names both values and
:func:`gssgd.ddp.compressed_adamw`, which builds a matching pair in one call.

For the warnings, the same pre-hook looks, once per process, at the optimizer that steps
while a compressing state is alive and warns about the first bad combination it finds
(:func:`recipe_advice`):

* Momentum SGD on top of the momentum the hook keeps (DGC's local momentum, ``"ef"`` or
  ``"ef21"`` with ``momentum``): applied twice.

* EF21 without momentum inside (``feedback="ef21"``, ``momentum=0``) under an optimizer
  with momentum or AdamW: the optimizer then steps on a stale dense estimate. With AdamW,
  whose step size does not shrink with the gradient, the character LSTM diverged; under
  momentum SGD it ended 32 % above dense's loss at the same learning rate, against 5 %
  with the classic error feedback.
* SGD momentum on the classic error-fed update, at any density: on the MNIST CNN at
  density 0.001 it cost gTop-k 21 points and gs 3; on the character LSTM DGC's momentum
  inside the hook did better; on small CNNs at 0.01 the hook's momentum helped local Top-k
  and not gs (docs/study.md, "One call per optimizer"). The warning says so and names
  :func:`gssgd.ddp.compressed_sgd`, which builds the pair at the same learning rate.
* AdamW (or Adam) on the classic error-fed update: on the character LSTM at density 0.01
  it ended 4.9-7.1 % above dense AdamW, where 1-bit Adam's recipe
  (:class:`~gssgd.optim.FrozenVarianceAdamW` with ``feedback="onebit"``) ended 1.2-3.1 %
  above (three seeds; the other figure is seed 0's); the warning says how to switch.

* An optimizer with momentum, or AdamW, on ``feedback="global"`` or ``"fetchsgd"``, or on
  ``"onebit"`` other than :class:`~gssgd.optim.FrozenVarianceAdamW`: those modes keep the
  momentum themselves, so the optimizer would apply it a second time.

"""

from __future__ import annotations

import warnings
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from gssgd.aggregators import AGGREGATORS
from gssgd.aggregators.options import DEFAULT_DENSITY, OWN_MOMENTUM_FEEDBACKS
from gssgd.ddp.core import hook_for
from gssgd.optim import FrozenVarianceAdamW

if TYPE_CHECKING:
    from gssgd.ddp.core import HookCore

__all__ = [
    "adamw_mismatch", "compresses", "pair_adamw", "recipe_advice", "sparse", "watch",
]

#: The compressing hook states alive in this process (for the recipe warning).
_COMPRESSING_STATES: weakref.WeakSet[HookCore] = weakref.WeakSet()
_warned = False
_recipe_hook: list[Any] = []  # the one registered optimizer pre-hook (its handle)


def _optimizer_kind(optimizer: torch.optim.Optimizer) -> tuple[str, float]:
    """``("adam", beta1)`` for the Adam family (param groups with ``betas``),
    ``("momentum", m)`` for SGD-like optimizers with momentum, else ``("plain", 0)``."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if "betas" in group:
        return "adam", float(group["betas"][0])
    momentum = group.get("momentum", 0)
    if isinstance(momentum, (int, float)) and momentum > 0:
        return "momentum", float(momentum)
    return "plain", 0.0


def recipe_advice(optimizer: torch.optim.Optimizer, method: str, options: dict[str, Any],
                  density: float | None) -> str | None:
    """The warning for ``optimizer`` stepping on a sparse ``method``'s hook with these
    aggregator ``options`` and ``density``, or None when the combination measured well.

    Args:
        optimizer: the optimizer about to step.
        method: the hook's sparse method.
        options: the hook's aggregator options (``feedback``, ``momentum``, ...).
        density: the hook's density (None: the default, or an explicit ``k``).
    """
    kind, value = _optimizer_kind(optimizer)
    name = type(optimizer).__name__
    feedback, inner = options.get("feedback", "ef"), options.get("momentum", 0.0)
    if kind == "momentum" and inner and feedback in ("ef", "ef21"):
        return (
            f"gssgd: {name} has momentum={value} on top of the momentum the sparse method "
            f"{method!r} keeps inside the hook (HookState(..., momentum={inner}"
            + (f", feedback={feedback!r}" if feedback != "ef" else "") + ")): the momentum "
            "is applied twice. Keep one: DGC's momentum inside the hook with "
            "torch.optim.SGD(momentum=0) (measured best on the character LSTM), or the "
            "optimizer's with HookState(..., momentum=0)."
        )
    if kind != "plain" and feedback == "ef21" and not inner:
        return (
            f"gssgd: {name} steps on EF21's dense estimate without momentum inside "
            f"(HookState({method!r}, ..., feedback='ef21', momentum=0)): the estimate lags, "
            "and the optimizer keeps pushing stale coordinates. On a character LSTM at "
            "density 0.01 this diverged under AdamW, and under momentum SGD it ended 32 % "
            "above dense's loss at the same learning rate, where the classic error feedback "
            "ended 5 % above. Use feedback='ef' (the default), or EF21-SGDM: "
            "feedback='ef21', momentum=0.9 with plain SGD."
        )
    own_momentum = feedback in OWN_MOMENTUM_FEEDBACKS and not (
        feedback == "onebit" and isinstance(optimizer, FrozenVarianceAdamW))
    if kind != "plain" and own_momentum:
        return (
            f"gssgd: {name} steps on feedback={feedback!r}, which keeps its own momentum "
            f"(HookState({method!r}, ..., feedback={feedback!r}, momentum={inner})): the "
            "momentum would be applied twice. Use plain SGD (torch.optim.SGD with "
            "momentum=0) with these modes (feedback='onebit': gssgd.optim."
            "FrozenVarianceAdamW), or feedback='ef' with your optimizer."
        )
    if kind == "adam" and feedback == "ef" and not isinstance(optimizer, FrozenVarianceAdamW):
        return (
            f"gssgd: {name} steps on the error-fed update of the method {method!r}. On a "
            "character LSTM at density 0.01 that ended 4.9-7.1 % above dense AdamW's loss; "
            "1-bit Adam's recipe ended 1.2-3.1 % above. Build the optimizer and the hook "
            "with one call, which sets that recipe up: gssgd.ddp.compressed_adamw(ddp_model, "
            f"{method!r}, lr=..., weight_decay=..., freeze_step=N) (N dense AdamW steps "
            "first, a tenth of the run); see docs/guide.md, 'Recipes by model family and optimizer'."
        )
    if kind == "momentum" and feedback == "ef" and not inner and sparse(method):
        shown = DEFAULT_DENSITY if density is None else density
        return (
            f"gssgd: {name} has momentum={value} on top of the error-fed update of the "
            f"sparse method {method!r} (density {shown}): the optimizer's momentum keeps "
            "pushing each delivered burst of residual. Measured: on the MNIST CNN at density "
            "0.001 it cost gTop-k 21 points and gs 3 against plain SGD; on the character "
            "LSTM the momentum inside the hook (DGC's correction) did better; on small CNNs "
            "at density 0.01 moving it into the hook helped local Top-k, not gs "
            "(docs/study.md, 'One call per optimizer'). One call puts the momentum where "
            "each method keeps it, at your learning rate: "
            f"gssgd.ddp.compressed_sgd(ddp_model, {method!r}, lr=..., momentum={value}); or "
            f"by hand: HookState({method!r}, ..., momentum={value}) with "
            "torch.optim.SGD(momentum=0). See docs/guide.md, 'Recipes by model family and optimizer'."
        )
    return None


def compresses(method: str) -> bool:
    """Whether the hook's ``method`` is an aggregator that compresses (every one but dense,
    which averages exactly: :attr:`~gssgd.Aggregator.compresses`)."""
    return method in AGGREGATORS and AGGREGATORS[method].compresses


def sparse(method: str) -> bool:
    """Whether the hook's ``method`` sends k of d coordinates with error feedback (the
    methods the optimizer warnings are about; PowerSGD's update is dense and low-rank, and
    takes the optimizer's momentum as its paper does)."""
    return compresses(method) and not AGGREGATORS[method].sends_all


def adamw_mismatch(optimizer: FrozenVarianceAdamW, state: HookCore) -> str | None:
    """What keeps ``optimizer`` from stepping on ``state``'s hook, or None when they match.

    1-bit Adam's recipe holds when the hook compresses from iteration ``freeze_step`` on
    (``start_iter == freeze_step``), returns the compressed momentum
    (``feedback="onebit"``) and forms it with the optimizer's beta1 (``momentum ==
    beta1``); every param group must share betas and freeze_step. Anything else steps on
    a gradient the optimizer takes for something else: on a small MLP the error-fed update
    under a frozen variance went to NaN within 44 steps.

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


def pair_adamw(optimizer: FrozenVarianceAdamW, state: HookCore, pending: bool = False) -> None:
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


def watch(state: HookCore) -> None:
    """Look at every optimizer step from now on: pair a hand-built
    :class:`FrozenVarianceAdamW` with the hook it steps on (:func:`pair_adamw`) and, for a
    sparse method, warn (once per process) if an optimizer steps on ``state`` in a
    combination that measured badly (:func:`recipe_advice`)."""
    if not _recipe_hook:
        _recipe_hook.append(register_optimizer_step_pre_hook(_before_step))
    if compresses(state.method):
        _COMPRESSING_STATES.add(state)
