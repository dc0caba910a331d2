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
compressed average, so ``v`` sees the bursts of late coordinates that freezing avoids;
it is there to measure that (docs/study.md, "Keep your optimizer").

Use it with a hook whose ``start_iter`` equals ``freeze_step`` and whose aggregator has
``feedback="onebit", momentum=beta1`` (``gssgd train --freeze-variance-after N`` sets all
three; ``--optimizer adamw`` does it with N = 150 for a sparse method).

Measured (docs/study.md, "Keep your optimizer"; character LSTM, P = 4, 1,500 steps): at
density 0.01 it ended 1.2-3.1 % above dense AdamW's loss for the four sparse methods
(three seeds), against 4.9-7.1 % for AdamW on the error-fed update and 2.5-3.3 % for AdamW
after the same 150 dense steps (seed 0).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["VARIANCES", "FrozenVarianceAdamW"]

#: What :class:`FrozenVarianceAdamW` does with the variance after its dense warm-up.
VARIANCES: tuple[str, ...] = ("frozen", "moving")


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
        freeze_step: dense AdamW steps before the variance freezes (>= 1).
        variance: after ``freeze_step``, ``"frozen"`` (1-bit Adam's) or ``"moving"`` (kept
            up to date from the implied averaged gradient; see the module docstring).

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
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr={lr!r} is invalid: it must be > 0. For example 1e-3.")
        if not (len(betas) == 2 and all(0 <= b < 1 for b in betas)):
            raise ValueError(f"betas={betas!r} is invalid: it must be two numbers in [0, 1).")
        if not eps > 0 or not weight_decay >= 0:
            raise ValueError(f"eps={eps!r} must be > 0 and weight_decay={weight_decay!r} >= 0.")
        if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 1:
            raise ValueError(
                f"freeze_step={freeze_step!r} is invalid: it must be an integer >= 1 (the "
                "dense AdamW steps before the variance freezes). For example 100."
            )
        if variance not in VARIANCES:
            raise ValueError(
                f"variance={variance!r} is invalid: it must be one of {VARIANCES} (the "
                "variance after freeze_step). For example 'frozen', 1-bit Adam's."
            )
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        freeze_step=freeze_step, variance=variance)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: D102 - documented on the class
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float64)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = int(state["step"])
                grad, frozen = p.grad, t > group["freeze_step"]
                if frozen:  # the gradient is the shared compressed momentum
                    seen = group["freeze_step"]
                    if group.get("variance", "frozen") == "moving":
                        implied = grad if t == seen + 1 else grad - beta1 * state["exp_avg"]
                        implied = implied / (1 - beta1)
                        state["exp_avg_sq"].mul_(beta2).addcmul_(implied, implied,
                                                                 value=1 - beta2)
                        seen = t
                    state["exp_avg"].copy_(grad)
                    direction = grad
                else:
                    state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
                    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                    direction = state["exp_avg"] / (1 - beta1**t)
                    seen = t
                denominator = (state["exp_avg_sq"] / (1 - beta2**seen)).sqrt_().add_(
                    group["eps"])
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.addcdiv_(direction, denominator, value=-group["lr"])
        return loss
