"""Training recipes: the defaults ``gssgd train`` and the one-call optimizers fill in, and
the optimizer/hook combinations that get a warning. One small function per decision.

* SGD's learning rate and momentum for a method (:func:`sgd_recipe`), the local momentum
  a sparse method takes on a language model (:func:`local_momentum_recipe`), and how the
  run's optimizer settings follow from them (:func:`sgd_settings`, :func:`adamw_lr`);
* the density warm-up (:func:`warmup_steps_recipe`);
* 1-bit Adam's recipe, the frozen variance (:func:`default_freeze_steps`,
  :func:`onebit_settings`);
* where momentum SGD keeps its momentum with a compressing hook
  (:func:`momentum_placement`);
* the warning for an optimizer stepping on a sparse hook in a combination that trains
  badly (:func:`recipe_advice`).

Methods are read from the registry (:mod:`gssgd.methods`): a method's recipe follows from
whether it is sparse and which options it takes, never from its name.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gssgd.aggregators import AGGREGATORS
from gssgd.aggregators.feedback import OWN_MOMENTUM_FEEDBACKS
from gssgd.aggregators.options import DEFAULT_DENSITY
from gssgd.methods import get_method
from gssgd.optim import FrozenVarianceAdamW, dense_steps_for

__all__ = [
    "ADAMW_FREEZE_STEPS",
    "ADAMW_LM_LR",
    "ADAMW_LR",
    "DENSE_RECIPE",
    "SPARSE_RECIPE",
    "SPARSE_WARMUP_STEPS",
    "TEXT_RECIPE",
    "TEXT_SPARSE_RECIPE",
    "ONEBIT_SETTINGS",
    "LOW_RANK_HORIZON",
    "ONE_CALL_HORIZON",
    "MAX_SKIPS",
    "adamw_lr",
    "compresses",
    "default_freeze_steps",
    "local_momentum_recipe",
    "max_skips_for",
    "momentum_placement",
    "one_call_horizon",
    "onebit_settings",
    "recipe_advice",
    "sgd_recipe",
    "sgd_settings",
    "sparse",
    "sparse_needs_normalisation",
    "warmup_steps_recipe",
]

#: SGD's (lr, momentum) by default for methods that send everything: momentum 0.9 after an
#: all-reduce, as usual.
DENSE_RECIPE = (0.05, 0.9)
#: SGD's (lr, momentum) by default for sparse methods with error feedback: plain SGD at a
#: larger learning rate (optimizer momentum on a sparse update trained far worse, and lr
#: 0.4 diverged now and then for the sketching methods at low density; the recipe study
#: has the runs).
SPARSE_RECIPE = (0.2, 0.0)
#: SGD's (lr, momentum) by default for dense methods on the language models (``lm``,
#: ``gpt``), and for sparse methods there without a local momentum: the robust end of
#: dense's learning-rate sweep on text (the optimizer study).
TEXT_RECIPE = (0.8, 0.9)
#: A sparse method on a language model by default: (lr, the optimizer's momentum, the
#: aggregator's local momentum): plain SGD at lr 1.6 with DGC's momentum correction and
#: masking inside the aggregator (``TopkOptions.momentum``), which beat the optimizer's own
#: momentum for every sparse method but Sketched-SGD (the optimizer study).
TEXT_SPARSE_RECIPE = (1.6, 0.0, 0.9)
#: Density warm-up steps (from 25 % down to the target density, DGC's schedule) that
#: ``gssgd train`` uses by default for sparse methods: it moves them closer to dense at low
#: density and keeps the sketching methods from collapsing, at the price of the first
#: steps' larger messages. ``--warmup-steps 0`` turns it off. The DDP hook's library default
#: stays 0 (it does not know the run's length).
SPARSE_WARMUP_STEPS = 100
#: Steps x density a one-call sparse run needed to end within 2x dense's training loss at
#: dense's learning rate (``studies/one_call_sgd``, three seeds: on the two batch-norm CNNs
#: every sparse method did on average at 6 / density steps; at 2 / density each ended
#: 2.0-4.6x dense's loss). On the CNN without normalisation even 6 / density was not
#: enough (:func:`sparse_needs_normalisation`).
ONE_CALL_HORIZON = 6
#: Steps a one-call run of a dense low-rank compressor (PowerSGD) needed to end within
#: 1.5x dense's loss at dense's learning rate (the same study: 1.20-1.29x at 600 steps on
#: all three CNNs, 1.46-1.52x at 200).
LOW_RANK_HORIZON = 600
#: At most this many consecutive non-finite (skipped) steps before a run stops, however
#: long the run (:func:`max_skips_for`).
MAX_SKIPS = 100
#: AdamW's learning rate when ``--lr`` is not given (the character LSTM's is
#: :data:`ADAMW_LM_LR`).
ADAMW_LR = 1e-3
#: AdamW's learning rate on the character LSTM (``--model lm``, text's default model) when
#: ``--lr`` is not given.
ADAMW_LM_LR = 1e-2
#: A sparse method under AdamW: dense AdamW steps before the variance freezes and the
#: momentum is compressed (1-bit Adam's recipe, ``--freeze-variance-after``), by default.
ADAMW_FREEZE_STEPS = 150


# --------------------------------------------------------------------------- what methods are


def compresses(method: str) -> bool:
    """Whether ``method`` is an aggregator that compresses (every one but dense, which
    averages exactly: :attr:`~gssgd.Aggregator.compresses`)."""
    return method in AGGREGATORS and AGGREGATORS[method].compresses


def sparse(method: str) -> bool:
    """Whether ``method`` sends k of d coordinates with error feedback (PowerSGD's update
    is dense and low-rank, and takes the optimizer's momentum as its paper does)."""
    return compresses(method) and not AGGREGATORS[method].sends_all


# --------------------------------------------------------------------------- SGD and AdamW


def sgd_recipe(method: str, text: bool = False) -> tuple[float, float]:
    """``(lr, momentum)`` of SGD that ``gssgd train`` uses by default for ``method``.

    On a language model (``text``): :data:`TEXT_SPARSE_RECIPE`'s lr with the optimizer's
    momentum of :data:`TEXT_RECIPE` for a sparse method that keeps a local momentum
    (:func:`local_momentum_recipe` moves that momentum into the aggregator), else
    :data:`TEXT_RECIPE`; on other models :data:`SPARSE_RECIPE` or :data:`DENSE_RECIPE`. A
    method's own ``Method.lr`` / ``Method.momentum`` override them."""
    spec = get_method(method)
    if text and local_momentum_recipe(method, text=True) is not None:
        lr, momentum = TEXT_SPARSE_RECIPE[0], TEXT_RECIPE[1]
    elif text:
        lr, momentum = TEXT_RECIPE
    else:
        lr, momentum = SPARSE_RECIPE if spec.sparse else DENSE_RECIPE
    return (lr if spec.lr is None else spec.lr,
            momentum if spec.momentum is None else spec.momentum)


def local_momentum_recipe(method: str, text: bool = False) -> float | None:
    """The aggregator's local momentum (DGC's, with masking) ``gssgd train`` uses by default
    with plain SGD: :data:`TEXT_SPARSE_RECIPE`'s on a language model for a sparse method
    whose options take ``momentum``; None otherwise."""
    spec = get_method(method)
    if text and spec.sparse and "momentum" in spec.option_names():
        return TEXT_SPARSE_RECIPE[2]
    return None


def adamw_lr(lstm: bool) -> float:
    """AdamW's learning rate when none is given: :data:`ADAMW_LM_LR` on the character LSTM,
    else :data:`ADAMW_LR`."""
    return ADAMW_LM_LR if lstm else ADAMW_LR


def sgd_settings(method: str, text: bool, lr: float | None, momentum: float | None,
                 local_momentum: float | None, feedback: str | None,
                 local_steps: bool) -> tuple[float, float, float | None]:
    """SGD's ``(lr, momentum, local_momentum)`` of a run, the given ones kept.

    The method's recipe fills what is left out (:func:`sgd_recipe`). With local steps the
    inner optimizer trains alone between outer steps, so it takes a dense method's recipe.
    On a language model a sparse method takes the local momentum of
    :func:`local_momentum_recipe` unless the optimizer's momentum, a local momentum or
    another error feedback was given; the optimizer's momentum defaults to 0 wherever the
    aggregator keeps one (none on top of it)."""
    if local_steps:
        recipe_lr, recipe_momentum = TEXT_RECIPE if text else DENSE_RECIPE
        local = None
    else:
        recipe_lr, recipe_momentum = sgd_recipe(method, text=text)
        local = local_momentum_recipe(method, text=text)
    if local is not None and local_momentum is None and not momentum and feedback in (None, "ef"):
        local_momentum = local  # the momentum moves into the aggregator (DGC)
    inner = bool(local_momentum) or feedback in OWN_MOMENTUM_FEEDBACKS
    if momentum is None:
        momentum = 0.0 if inner else recipe_momentum
    return (recipe_lr if lr is None else lr), momentum, local_momentum


# --------------------------------------------------------------------------- schedules


def warmup_steps_recipe(method: str) -> int:
    """Density warm-up steps ``gssgd train`` uses by default: :data:`SPARSE_WARMUP_STEPS`
    for a sparse method whose options take ``warmup_steps``, else 0."""
    spec = get_method(method)
    return SPARSE_WARMUP_STEPS if spec.sparse and "warmup_steps" in spec.option_names() else 0


def default_freeze_steps(steps: object) -> tuple[int, str | None]:
    """1-bit Adam's dense AdamW steps by default for a run of ``steps``, and a warning when
    the run is too short for :data:`ADAMW_FREEZE_STEPS` (then a tenth of it, or 0: AdamW on
    the error-fed update)."""
    n = ADAMW_FREEZE_STEPS
    if not isinstance(steps, int) or steps > n:
        return n, None
    n = dense_steps_for(steps)
    return n, (
        f"gssgd train: --steps {steps} is not longer than AdamW's default dense warm-up of "
        f"{ADAMW_FREEZE_STEPS} steps, which would leave the whole run dense; using "
        "--freeze-variance-after "
        + (f"{n} (a tenth of the run)" if n else "0 (AdamW on the error-fed update: the run "
           "is too short for a warm-up)")
        + ". Give --freeze-variance-after N to choose.")


#: The hook settings 1-bit Adam's recipe sets itself (:func:`onebit_settings`' keys).
ONEBIT_SETTINGS: tuple[str, ...] = ("feedback", "momentum", "start_iter")


def onebit_settings(freeze_steps: int, beta1: float | None) -> dict[str, Any]:
    """The hook settings of 1-bit Adam's recipe after ``freeze_steps`` dense AdamW steps
    (``HookState`` keywords): compress from that step (``start_iter``), return the
    compressed momentum (``feedback="onebit"``) formed with the optimizer's ``beta1``
    (``momentum``)."""
    return {"start_iter": freeze_steps, "feedback": "onebit", "momentum": beta1}


# --------------------------------------------------------------------------- momentum SGD


def momentum_placement(method: str) -> str:
    """Where :func:`gssgd.ddp.compressed_sgd` keeps ``method``'s momentum: ``"hook"`` for a
    method that sends k of d coordinates with error feedback and takes a ``momentum``
    option (DGC's momentum correction), else ``"optimizer"``.

    Raises:
        ValueError: an unknown method.
    """
    if method not in AGGREGATORS:
        raise ValueError(f"unknown method {method!r}; valid methods: {', '.join(AGGREGATORS)}.")
    takes = getattr(AGGREGATORS[method].Options, "__dataclass_fields__", {})
    return "hook" if sparse(method) and "momentum" in takes else "optimizer"


def max_skips_for(steps: int) -> int:
    """Consecutive non-finite steps a run of ``steps`` skips before it stops (the
    aggregators' ``max_consecutive_skips``): a tenth of the run, at least 1, at most
    :data:`MAX_SKIPS`. A 60-step run whose gradients stay NaN stops at its 6th such step
    instead of skipping to the end and reporting success."""
    return min(MAX_SKIPS, max(1, steps // 10))


def one_call_horizon(method: str, density: float) -> int:
    """The optimizer steps a one-call run of ``method`` needs to train like dense at
    dense's learning rate: :data:`ONE_CALL_HORIZON` / ``density`` for a sparse method,
    :data:`LOW_RANK_HORIZON` for another compressor (PowerSGD), 0 for dense."""
    if sparse(method):
        return math.ceil(ONE_CALL_HORIZON / density)
    return LOW_RANK_HORIZON if compresses(method) else 0


def sparse_needs_normalisation(method: str, model: torch.nn.Module) -> bool:
    """Whether ``model`` is a convolutional network without normalisation layers and
    ``method`` sparse: the one-call study's CNN without batch norm, at dense's (edge of
    stability) learning rate, ended far above dense's loss with every sparse method even
    over :data:`ONE_CALL_HORIZON` / density steps, where PowerSGD held."""
    if not sparse(method):
        return False
    kinds = tuple(type(m).__name__ for m in model.modules())
    convolutional = any(k.startswith("Conv") for k in kinds)
    return convolutional and not any("Norm" in k for k in kinds)


# --------------------------------------------------------------------------- warnings


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
    aggregator ``options`` and ``density``, or None when the combination is a good one.

    Args:
        optimizer: the optimizer about to step.
        method: the hook's method.
        options: the hook's aggregator options (``feedback``, ``momentum``, ...).
        density: the hook's density (None: the default, or an explicit ``k``).
    """
    kind, value = _optimizer_kind(optimizer)
    seen = _Seen(type(optimizer).__name__, kind, value, method,
                 options.get("feedback", "ef"), options.get("momentum", 0.0))
    for advice in (_momentum_twice, _stale_ef21, _own_momentum, _adam_on_ef):
        text = advice(seen, optimizer)
        if text is not None:
            return text
    return _momentum_on_ef(seen, density)


class _Seen:
    """What :func:`recipe_advice` looks at: the optimizer's name, kind and momentum (or
    beta1), the method, its error feedback and the momentum it keeps inside."""

    def __init__(self, name: str, kind: str, value: float, method: str, feedback: str,
                 inner: float) -> None:
        self.name, self.kind, self.value = name, kind, value
        self.method, self.feedback, self.inner = method, feedback, inner


def _momentum_twice(s: _Seen, optimizer: torch.optim.Optimizer) -> str | None:
    """Momentum SGD on top of the momentum the hook keeps (DGC's, ``ef`` or ``ef21``)."""
    if not (s.kind == "momentum" and s.inner and s.feedback in ("ef", "ef21")):
        return None
    return (
        f"gssgd: {s.name} has momentum={s.value} on top of the momentum the sparse method "
        f"{s.method!r} keeps inside the hook (HookState(..., momentum={s.inner}"
        + (f", feedback={s.feedback!r}" if s.feedback != "ef" else "") + ")): the momentum "
        "is applied twice. Keep one: DGC's momentum inside the hook with "
        "torch.optim.SGD(momentum=0) (measured best on the character LSTM), or the "
        "optimizer's with HookState(..., momentum=0)."
    )


def _stale_ef21(s: _Seen, optimizer: torch.optim.Optimizer) -> str | None:
    """An optimizer with momentum, or AdamW, on EF21 without momentum inside."""
    if not (s.kind != "plain" and s.feedback == "ef21" and not s.inner):
        return None
    return (
        f"gssgd: {s.name} steps on EF21's dense estimate without momentum inside "
        f"(HookState({s.method!r}, ..., feedback='ef21', momentum=0)): the estimate lags, "
        "and the optimizer keeps pushing stale coordinates. On a character LSTM at "
        "density 0.01 this diverged under AdamW, and under momentum SGD it ended 32 % "
        "above dense's loss at the same learning rate, where the classic error feedback "
        "ended 5 % above. Use feedback='ef' (the default), or EF21-SGDM: "
        "feedback='ef21', momentum=0.9 with plain SGD."
    )


def _own_momentum(s: _Seen, optimizer: torch.optim.Optimizer) -> str | None:
    """An optimizer with momentum, or AdamW, on an error feedback that keeps its own
    momentum (1-bit Adam's is fine under :class:`~gssgd.optim.FrozenVarianceAdamW`)."""
    own = s.feedback in OWN_MOMENTUM_FEEDBACKS and not (
        s.feedback == "onebit" and isinstance(optimizer, FrozenVarianceAdamW))
    if not (s.kind != "plain" and own):
        return None
    return (
        f"gssgd: {s.name} steps on feedback={s.feedback!r}, which keeps its own momentum "
        f"(HookState({s.method!r}, ..., feedback={s.feedback!r}, momentum={s.inner})): the "
        "momentum would be applied twice. Use plain SGD (torch.optim.SGD with "
        "momentum=0) with these modes (feedback='onebit': gssgd.optim."
        "FrozenVarianceAdamW), or feedback='ef' with your optimizer."
    )


def _adam_on_ef(s: _Seen, optimizer: torch.optim.Optimizer) -> str | None:
    """AdamW (or Adam) on the classic error-fed update: 1-bit Adam's recipe does better."""
    if not (s.kind == "adam" and s.feedback == "ef"
            and not isinstance(optimizer, FrozenVarianceAdamW)):
        return None
    return (
        f"gssgd: {s.name} steps on the error-fed update of the method {s.method!r}. On a "
        "character LSTM at density 0.01 that ended 4.9-7.1 % above dense AdamW's loss; "
        "1-bit Adam's recipe ended 1.2-3.1 % above. Build the optimizer and the hook "
        "with one call, which sets that recipe up: gssgd.ddp.compressed_adamw(ddp_model, "
        f"{s.method!r}, lr=..., weight_decay=..., freeze_step=N) (N dense AdamW steps "
        "first, a tenth of the run); see docs/guide.md, 'Recipes by model family and optimizer'."
    )


def _momentum_on_ef(s: _Seen, density: float | None) -> str | None:
    """SGD momentum on a sparse method's classic error-fed update, at any density."""
    if not (s.kind == "momentum" and s.feedback == "ef" and not s.inner and sparse(s.method)):
        return None
    shown = DEFAULT_DENSITY if density is None else density
    return (
        f"gssgd: {s.name} has momentum={s.value} on top of the error-fed update of the "
        f"sparse method {s.method!r} (density {shown}): the optimizer's momentum keeps "
        "pushing each delivered burst of residual. Measured: on the MNIST CNN at density "
        "0.001 it cost gTop-k 21 points and gs 3 against plain SGD; on the character "
        "LSTM the momentum inside the hook (DGC's correction) did better; on small CNNs "
        "at density 0.01 moving it into the hook helped local Top-k, not gs. One call puts "
        "the momentum where each method keeps it, at your learning rate: "
        f"gssgd.ddp.compressed_sgd(ddp_model, {s.method!r}, lr=..., momentum={s.value}); or "
        f"by hand: HookState({s.method!r}, ..., momentum={s.value}) with "
        "torch.optim.SGD(momentum=0). See docs/guide.md, 'Recipes by model family and optimizer'."
    )
