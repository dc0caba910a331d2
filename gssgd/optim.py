"""AdamW with its variance frozen after a dense warm-up, for a compressed momentum
(1-bit Adam's recipe: Tang et al., "1-bit Adam", ICML 2021).

Adam's update divides by ``sqrt(v)``; a sparse error-fed gradient arrives in bursts, and
its squares inflate ``v`` for coordinates that were simply late. 1-bit Adam avoids that
in two stages:

1. Warm-up, ``freeze_step`` steps: plain AdamW on the dense averaged gradient (the DDP
   hook's ``start_iter`` all-reduces), so the variance ``v`` settles.
2. Compression: ``v`` is frozen. Every rank forms ``m_p = beta1 * m + (1 - beta1) * g_p``
   from the shared momentum ``m``, the hook compresses ``m_p`` with error feedback, and the
   average it returns is the new shared ``m`` (the aggregators' ``feedback="onebit"``,
   with ``momentum=beta1``). This optimizer then steps on that ``m`` as it arrives:
   ``p -= lr * (m / (sqrt(v_hat) + eps) + weight_decay * p)``.

Every rank holds the same ``v`` (from the averaged gradients) and receives the same ``m``,
so the optimizer state is identical on all ranks. The momentum starts afresh from zero at
the switch (1-bit Adam carries the warm-up's over); over a few ``1 / (1 - beta1)`` steps
it catches up.

``variance="moving"`` keeps stage 2's ``v`` moving instead, on the averaged gradient the
shared momentum implies, ``g_hat = (m - beta1 * m_prev) / (1 - beta1)`` (``m_prev`` = 0 at
the switch, where the aggregator's momentum starts): Adam's update compressed with its
variance still adapting, and every rank's state still identical. ``g_hat`` is the
compressed average, so ``v`` sees the bursts of late coordinates that freezing avoids.

Coordinates the warm-up never gave a gradient (an embedding row of a token not seen yet,
a parameter not used early) have ``v = 0`` at the freeze, and a frozen ``v`` would step
them ``lr * m / eps``: thousands of times AdamW's step. At the freeze every coordinate
with ``sqrt(v_hat) <= eps`` is marked unseen, and its ``v`` keeps moving on ``g_hat``
(bias-corrected from the freeze, as AdamW's ``v`` is from a coordinate's first gradient),
so its steps are AdamW's size. Every other coordinate keeps 1-bit Adam's frozen ``v``.
``unseen=`` chooses another rule (:data:`UNSEEN_RULES`).

Build it with its hook in one call, :func:`gssgd.ddp.compressed_adamw`: the hook's
``start_iter`` equals ``freeze_step`` and its aggregator has ``feedback="onebit",
momentum=beta1``, and the optimizer then follows the hook (:meth:`follow`): the variance
freezes at the hook's first compressed iteration, whatever steps a GradScaler skipped
before it, and a step the hook skipped for a non-finite gradient moves nothing. A pair
built by hand is checked at its first step, and a mismatch is a ``ValueError`` that names
both values (:mod:`gssgd.ddp.hook`). Without a hook (a loop that aggregates by itself)
it counts its own steps. ``gssgd train --freeze-variance-after N`` sets all three;
``--optimizer adamw`` does it with N = 150 for a sparse method (a tenth of a shorter run).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from gssgd.validate import check_int

__all__ = ["UNSEEN_RULES", "VARIANCES", "FrozenVarianceAdamW", "dense_steps_for"]

#: What :class:`FrozenVarianceAdamW` does with a coordinate the warm-up gave no variance
#: (``sqrt(v_hat) <= eps`` at the freeze): keep its ``v`` moving (the default), never step
#: it (DeepSpeed 1-bit Adam's ``exp_avg_mask``), floor its ``v`` at the mean of its tensor's
#: other coordinates, or freeze it like the rest (``lr * m / eps`` steps; the old rule).
UNSEEN_RULES: tuple[str, ...] = ("moving", "mask", "floor", "frozen")

#: What :class:`FrozenVarianceAdamW` does with the variance after its dense warm-up.
VARIANCES: tuple[str, ...] = ("frozen", "moving")


def dense_steps_for(total_steps: int) -> int:
    """The dense AdamW steps to suggest for a run of ``total_steps``: a tenth of it (150 of
    1,500 measured well on the character LSTM and GPT), 0 below ten steps."""
    return total_steps // 10


def _implied_gradient(momentum: torch.Tensor, previous: torch.Tensor,
                      beta1: float) -> torch.Tensor:
    """The averaged gradient a momentum step implies: ``(m - beta1 * m_prev) / (1 - beta1)``."""
    return (momentum - beta1 * previous) / (1 - beta1)


class FrozenVarianceAdamW(torch.optim.Optimizer):
    """AdamW for ``freeze_step`` steps, then steps on the gradient as a momentum with the
    variance frozen (see the module docstring).

    Args:
        params: the parameters (or parameter groups) to optimise.
        lr: learning rate.
        betas: ``(beta1, beta2)``: the warm-up's AdamW betas; beta1 is also the momentum the
            aggregator keeps after the switch.
        eps: added to ``sqrt(v_hat)``.
        weight_decay: decoupled weight decay (AdamW's).
        freeze_step: dense AdamW steps before the variance freezes (>= 1); when the
            optimizer follows a hook, the hook's first compressed iteration decides.
        variance: after ``freeze_step``, ``"frozen"`` (1-bit Adam's) or ``"moving"`` (kept
            up to date from the implied averaged gradient; see the module docstring).
        unseen: with the frozen variance, what a coordinate with no variance at the freeze
            does (:data:`UNSEEN_RULES`): ``"moving"`` (default), ``"mask"``, ``"floor"`` or
            ``"frozen"``.

    Raises:
        ValueError: a value out of range (the message names it and the valid range).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        freeze_step: int = 100,
        variance: str = "frozen",
        unseen: str = "moving",
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr={lr!r} is invalid: it must be > 0. For example 1e-3.")
        if not (len(betas) == 2 and all(0 <= b < 1 for b in betas)):
            raise ValueError(f"betas={betas!r} is invalid: it must be two numbers in [0, 1).")
        if not eps > 0 or not weight_decay >= 0:
            raise ValueError(f"eps={eps!r} must be > 0 and weight_decay={weight_decay!r} >= 0.")
        check_int("freeze_step", freeze_step, 1, fix="It counts the dense AdamW steps "
                  "before the variance freezes; for example 100.")
        if variance not in VARIANCES:
            raise ValueError(
                f"variance={variance!r} is invalid: it must be one of {VARIANCES} (the "
                "variance after freeze_step). For example 'frozen', 1-bit Adam's."
            )
        if unseen not in UNSEEN_RULES:
            raise ValueError(
                f"unseen={unseen!r} is invalid: it must be one of {UNSEEN_RULES} (what a "
                "coordinate with no variance at the freeze does). For example 'moving'."
            )
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        freeze_step=freeze_step, variance=variance, unseen=unseen)
        super().__init__(params, defaults)

    # ------------------------------------------------------------------ pairing
    def follow(self, hook: Any, pending: bool = False) -> FrozenVarianceAdamW:
        """Take the phase of every step from ``hook`` instead of counting steps.

        ``hook`` is the DDP hook state that produces this optimizer's gradients (a
        :class:`~gssgd.ddp.HookState`; anything with ``iter`` and ``last_iteration``). Each
        :meth:`step` then reads what the iteration just run was: ``"dense"`` (an AdamW step
        on the averaged gradient), ``"compressed"`` (the variance freezes at the first one,
        whatever the scaler skipped before it, and the step is on the arriving momentum) or
        ``"skipped"`` (a non-finite step the hook returned as zeros: nothing moves, neither
        the parameters nor the moments; in per-bucket mode only the skipped buckets'
        parameters stay). Only the last iteration before a step counts: accumulate
        gradients under DDP's ``no_sync()``, so the hook runs once per step (a step the
        scaler skipped also leaves iterations behind, by design). Use
        :func:`gssgd.ddp.compressed_adamw`, which
        checks that the two match before it pairs them; a hand-built pair is checked and
        paired at its first step (:mod:`gssgd.ddp.hook`).

        Args:
            hook: the hook state.
            pending: the hook's last iteration has not been stepped on yet (pairing at a
                step, as :mod:`gssgd.ddp.hook` does); False when pairing before training.

        Returns:
            This optimizer.
        """
        self._hook = hook
        self._hook_iter = int(hook.iter) - int(pending)
        return self

    @property
    def hook(self) -> Any:
        """The hook state this optimizer follows (:meth:`follow`), or None."""
        return getattr(self, "_hook", None)

    def _phase(self) -> str:
        """What the gradient about to be stepped on is: "dense", "compressed" or "skipped".

        Raises:
            RuntimeError: a followed hook ran no iteration since the last step.
        """
        hook = self.hook
        if hook is None:  # no hook to ask: count this optimizer's own steps
            taken = max((int(s["step"]) for s in self.state.values() if "step" in s), default=0)
            return "compressed" if taken >= self.param_groups[0]["freeze_step"] else "dense"
        if int(hook.iter) == self._hook_iter:
            raise RuntimeError(
                f"FrozenVarianceAdamW.step() ran twice on iteration {hook.iter - 1} of its "
                "hook: the gradient is not one the hook produced. Run one backward through "
                "the hooked DDP model before each step (with gradient accumulation, step "
                "once after the micro-batch that syncs)."
            )
        self._hook_iter = int(hook.iter)
        return str(hook.last_iteration)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: D102 - documented on the class
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        phase = self._phase()
        if phase == "skipped":  # the hook returned zeros for a non-finite step: no step
            return loss
        # per-bucket hooks skip bucket by bucket: those parameters do not move either
        skipped = getattr(self.hook, "last_skipped", frozenset())
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and id(p) not in skipped:
                    self._step_parameter(p, group, compressed=phase == "compressed")
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As :meth:`torch.optim.Optimizer.load_state_dict`; a state saved before the
        freeze step was kept (``frozen_at``) froze at ``freeze_step``, if it was past it."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if state and "frozen_at" not in state:
                    past = int(state["step"]) > group["freeze_step"]
                    state["frozen_at"] = group["freeze_step"] if past else -1

    def _step_parameter(self, p: torch.Tensor, group: dict[str, Any], compressed: bool) -> None:
        """One parameter's step: AdamW while dense, else on the momentum the hook returned
        (``m`` formed here from a dense gradient that arrives after the freeze)."""
        beta1, beta2 = group["betas"]
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float64)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
            state["frozen_at"] = -1  # the dense steps the variance froze after (-1: not yet)
        frozen_at = int(state["frozen_at"])
        state["step"] += 1
        t, grad = int(state["step"]), p.grad
        if frozen_at < 0 and not compressed:  # AdamW on the averaged gradient
            state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denominator = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt_().add_(group["eps"])
            self._apply(p, group, state["exp_avg"] / (1 - beta1**t), denominator)
            return
        if frozen_at < 0:  # the first compressed step: freeze here, after t - 1 dense ones
            frozen_at = t - 1
            self._freeze(state, frozen_at, group, beta2)
            previous = torch.zeros_like(grad)  # the hook's momentum starts afresh
        else:
            previous = state["exp_avg"]
        momentum = grad if compressed else previous * beta1 + grad * (1 - beta1)
        dense_steps = frozen_at
        v, direction = state["exp_avg_sq"], momentum
        if group.get("variance", "frozen") == "moving":
            implied = _implied_gradient(momentum, previous, beta1)
            v.mul_(beta2).addcmul_(implied, implied, value=1 - beta2)
            denominator = (v / (1 - beta2**t)).sqrt_().add_(group["eps"])
        else:
            correction = 1 - beta2**dense_steps if dense_steps else 1.0  # v = 0 without any
            denominator = (v / correction).sqrt_().add_(group["eps"])
            unseen = state.get("unseen")
            if unseen is not None:
                if unseen.dtype != torch.bool:  # load_state_dict casts it to p's dtype
                    unseen = state["unseen"] = unseen.bool()
                if group.get("unseen", "moving") == "mask":  # never stepped after the freeze
                    direction = momentum.masked_fill(unseen, 0)
                else:
                    self._unseen_variance(state, unseen, momentum, previous, beta1, beta2,
                                          t - dense_steps, denominator, group["eps"])
        state["exp_avg"].copy_(momentum)
        self._apply(p, group, direction, denominator)

    def _freeze(self, state: dict[str, Any], dense_steps: int, group: dict[str, Any],
                beta2: float) -> None:
        """Freeze ``v`` after ``dense_steps`` dense steps; mark the coordinates the warm-up
        gave no usable variance (``sqrt(v_hat) <= eps``: no gradient yet, as an embedding
        row not seen or a parameter not used) for the ``unseen`` rule: their ``v`` keeps
        moving, or they are masked, or their ``v`` is floored at the mean ``v`` of the
        tensor's other coordinates (moving where the whole tensor is unseen)."""
        state["frozen_at"] = dense_steps
        v = state["exp_avg_sq"]
        rule = group.get("unseen", "moving")
        if dense_steps == 0:
            unseen = torch.ones_like(v, dtype=torch.bool)
        else:
            unseen = (v / (1 - beta2**dense_steps)).sqrt_() <= group["eps"]
        if rule == "frozen" or group.get("variance") == "moving" or not bool(unseen.any()):
            return
        if rule == "floor" and not bool(unseen.all()):
            v[unseen] = v[~unseen].mean()  # frozen from here on, as the rest
            return
        state["unseen"] = unseen

    @staticmethod
    def _unseen_variance(state: dict[str, Any], unseen: torch.Tensor, momentum: torch.Tensor,
                         previous: torch.Tensor, beta1: float, beta2: float, since: int,
                         denominator: torch.Tensor, eps: float) -> None:
        """Coordinates with no variance at the freeze: ``v`` moves on the gradient the
        momentum implies, ``(m - beta1 * m_prev) / (1 - beta1)``, bias-corrected from the
        freeze (as AdamW's ``v`` is from a coordinate's first gradient), so their step is
        AdamW's size, not ``lr * m / eps``. Writes their entries of ``denominator``."""
        v = state["exp_avg_sq"]
        implied = _implied_gradient(momentum[unseen], previous[unseen], beta1)
        moved = v[unseen].mul_(beta2).addcmul_(implied, implied, value=1 - beta2)
        v[unseen] = moved
        denominator[unseen] = (moved / (1 - beta2**since)).sqrt_().add_(eps)

    @staticmethod
    def _apply(p: torch.Tensor, group: dict[str, Any], direction: torch.Tensor,
               denominator: torch.Tensor) -> None:
        """``p = p * (1 - lr * weight_decay) - lr * direction / denominator``."""
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.addcdiv_(direction, denominator, value=-group["lr"])
