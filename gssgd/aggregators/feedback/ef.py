"""Classic error feedback (Seide et al. 2014; Stich et al. 2018), with DGC's local momentum.

Steps (per rank p, each step):
    1. Compensate: ``a_p = e_p + g_p``; with local momentum ``rho`` (Deep Gradient
       Compression's "momentum correction", Lin et al. 2018) ``u_p = rho*u_p + g_p`` and
       ``a_p = e_p + u_p``.
    2. (The method compresses and communicates ``a_p``.)
    3. Keep: ``e_p = a_p`` with the delivered coordinates zeroed; with momentum masking
       (DGC's "momentum factor masking") the velocity is zeroed there too, so a delivered
       coordinate's old velocity does not push it again.
    4. Return the averaged update as it is.

:class:`ErrorFeedback` is also the base of every other rule: a rule is a small object that
owns the per-rank state of the feedback (residual, velocity) and says what a rank
compresses (:meth:`~ErrorFeedback.compensate`), what it keeps
(:meth:`~ErrorFeedback.keep`) and what the step returns (:meth:`~ErrorFeedback.returned`).
Aggregators call these three in their ``step``; nothing else about the rule leaks into them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

__all__ = ["ErrorFeedback"]


class ErrorFeedback:
    """The residual ``e`` and (with momentum) the velocity ``u`` of one rank.

    Args:
        momentum: ``rho`` in [0, 1); 0 = no local momentum.
        masking: zero a delivered coordinate's velocity (DGC); False keeps it, so at
            density 1 the rule is momentum SGD exactly.

    Attributes:
        residual: ``e`` (None before the first step), at least float32.
        velocity: ``u`` (None without momentum or before the first step).
    """

    #: the ``feedback`` option's value that selects the rule
    name: ClassVar[str] = "ef"
    #: True for a rule that keeps the momentum itself, so the optimizer must add none
    owns_momentum: ClassVar[bool] = False
    #: True for a rule that can compensate a vector piece by piece
    #: (:meth:`compensate_part`, streaming gs-SGD's buckets)
    streams: ClassVar[bool] = True

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        self.momentum, self.masking = momentum, masking
        self.residual: torch.Tensor | None = None
        self.velocity: torch.Tensor | None = None

    @classmethod
    def from_options(cls, options: object) -> ErrorFeedback:
        """The rule with the ``momentum`` and ``momentum_masking`` of a method's options
        (0 and True where the options have none)."""
        return cls(getattr(options, "momentum", 0.0), getattr(options, "momentum_masking", True))

    # ------------------------------------------------------------------ the rule
    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        """Step 1: the vector to compress, a new tensor (``grad``: this rank's gradient,
        already in the state's dtype)."""
        residual = self._residual_like(grad)
        if self.momentum == 0:
            return residual + grad
        velocity = self._velocity_like(grad)
        velocity.mul_(self.momentum).add_(grad)
        return residual + velocity

    def keep(self, accumulated: torch.Tensor, delivered: torch.Tensor) -> None:
        """Step 3: ``e = a`` with ``a[delivered] = 0`` (in place: ``accumulated`` becomes the
        residual), and momentum masking.

        Args:
            accumulated: this step's ``a_p`` (from :meth:`compensate`).
            delivered: indices (int64) of the coordinates of ``a_p`` the step delivered.
        """
        accumulated[delivered] = 0
        self.residual = accumulated
        if self.velocity is not None and self.masking:
            self.velocity[delivered] = 0

    def returned(self, update: torch.Tensor) -> torch.Tensor:
        """Step 4: what the step returns for the averaged ``update`` (here: ``update``)."""
        return update

    # ------------------------------------------------------------------ piece by piece
    @property
    def keeps_step_velocity(self) -> bool:
        """Whether a step computes a new per-rank velocity (here: with momentum), which a
        streamed step writes into a buffer of its own until the step is taken."""
        return self.momentum > 0

    def compensate_part(self, grad: torch.Tensor, part: slice, out: torch.Tensor,
                        velocity: torch.Tensor | None = None) -> None:
        """Step 1 on the coordinates ``part`` of a vector whose gradient arrives in pieces
        (streaming gs-SGD's buckets): ``out[part] = a[part]``, leaving the rule's state as it
        was so that a step skipped later leaves no trace.

        Args:
            grad: the gradient of ``part`` (in the state's dtype).
            part: the piece's coordinates in the whole vector.
            out: the whole vector's ``a`` (the step's buffer; sets the state's device,
                dtype and length).
            velocity: with :attr:`keeps_step_velocity`, the step's new velocity buffer
                (its ``part`` is written here; the taken step stores it as
                :attr:`velocity`); else None.
        """
        residual = self._residual_like(out)
        if velocity is not None:
            torch.mul(self._velocity_like(out)[part], self.momentum, out=velocity[part])
            velocity[part].add_(grad)
            grad = velocity[part]
        torch.add(residual[part], grad, out=out[part])

    # ------------------------------------------------------------------ state
    def _residual_like(self, grad: torch.Tensor) -> torch.Tensor:
        """The residual on ``grad``'s device and dtype (zeros at the first step)."""
        if self.residual is None:
            self.residual = torch.zeros_like(grad)
        elif self.residual.device != grad.device or self.residual.dtype != grad.dtype:
            self.residual = self.residual.to(grad.device, grad.dtype)
        return self.residual

    def _velocity_like(self, grad: torch.Tensor) -> torch.Tensor:
        """The velocity on ``grad``'s device and dtype (zeros at the first step)."""
        if self.velocity is None:
            self.velocity = torch.zeros_like(grad)
        self.velocity = self.velocity.to(grad.device, grad.dtype)
        return self.velocity

    def tensors(self) -> dict[str, torch.Tensor | None]:
        """The state by its ``state_dict`` key: ``"residual"`` and ``"momentum"``."""
        return {"residual": self.residual, "momentum": self.velocity}

    def rescale(self, factor: float) -> None:
        """Multiply the state by ``factor`` (a loss-scale change under AMP: the gradients,
        and so the state, are kept in the scaled units)."""
        for tensor in self.tensors().values():
            if tensor is not None:
                tensor.mul_(factor)

    def state_dict(self) -> dict[str, Any]:
        """Copies of the state by key; the residual is always there (None before the first
        step), the rest only when it exists."""
        out = {key: value.clone() for key, value in self.tensors().items() if value is not None}
        out.setdefault("residual", None)
        return out

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (a missing velocity is None)."""
        residual, velocity = sd.get("residual"), sd.get("momentum")
        if residual is not None:
            self.residual = residual.clone()
        self.velocity = None if velocity is None else velocity.clone()
