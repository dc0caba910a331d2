"""Error feedback as small strategies, one class per rule.

A rule owns a rank's feedback state and answers three questions an aggregator's ``step``
asks in order: what to compress (:meth:`~ErrorFeedback.compensate`), what to keep
(:meth:`~ErrorFeedback.keep`) and what to return (:meth:`~ErrorFeedback.returned`).
Aggregators call these three in their ``step``; nothing else about the rule leaks into
them. Methods choose theirs by their options' ``feedback`` name (:data:`RULES`); a new rule
is one more subclass of :class:`ErrorFeedback`.

The rules, in the order below (each class's docstring gives its steps and its source):

* :class:`ErrorFeedback` (``ef``): classic error feedback with DGC's local momentum; the
  base of every other rule;
* :class:`EF21Feedback` (``ef21``): EF21 and EF21-SGDM, the change of the gradients;
* :class:`GlobalMomentumFeedback` (``global``): momentum on the averaged update;
* :class:`OneBitFeedback` (``onebit``): 1-bit Adam's compression stage;
* :class:`SketchFeedback` and :class:`FetchSGDFeedback` (``fetchsgd``): momentum and error
  in sketch space;
* :class:`QuantisedFeedback` and :class:`OneBitQuantisedFeedback`: a quantiser's residual
  ``e = a - C(a)`` (PowerSGD's);
* the registry: :data:`RULES` by name, and the sets the methods' options accept.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gssgd.sketch import CountSketch

__all__ = [
    "EF21Feedback",
    "ErrorFeedback",
    "FEEDBACKS",
    "FetchSGDFeedback",
    "GlobalMomentumFeedback",
    "OWN_MOMENTUM_FEEDBACKS",
    "OneBitFeedback",
    "OneBitQuantisedFeedback",
    "QuantisedFeedback",
    "RULES",
    "SKETCH_RULES",
    "SPARSE_RULES",
    "SketchFeedback",
]


class ErrorFeedback:
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
    :meth:`~ErrorFeedback.compensate` only computes (a new velocity waits in
    ``_step_velocity``); the aggregator stores it (:meth:`~ErrorFeedback.commit_step`) once
    the step's flags say every rank's gradient was finite, and :meth:`~ErrorFeedback.keep`
    and the step's end store it too, so a step that learns from its first message that some
    rank's gradient was not finite, and is skipped, leaves the rule as it was. A rule of your
    own keeps that contract: its ``compensate`` changes no state.

    The residual ``e`` and (with momentum) the velocity ``u`` of one rank.

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
    #: the velocity and error tables of a rule that keeps its error in sketch space
    #: (FetchSGD's): a sketching method recovers through them; None for a rule that keeps
    #: its residual on each rank's vector
    tables: SketchFeedback | None = None

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        self.momentum, self.masking = momentum, masking
        self.residual: torch.Tensor | None = None
        self.velocity: torch.Tensor | None = None
        #: the velocity :meth:`compensate` computed, stored by :meth:`commit_step`
        self._step_velocity: torch.Tensor | None = None

    @classmethod
    def from_options(cls, options: object) -> ErrorFeedback:
        """The rule with the ``momentum`` and ``momentum_masking`` of a method's options
        (0 and True where the options have none)."""
        return cls(getattr(options, "momentum", 0.0), getattr(options, "momentum_masking", True))

    # ------------------------------------------------------------------ the rule
    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        """Step 1: the vector to compress, a new tensor (``grad``: this rank's gradient,
        already in the state's dtype). The state is left as it is: the step's new velocity
        waits for :meth:`keep`."""
        residual = self._residual_like(grad)
        if self.momentum == 0:
            return residual + grad
        velocity = self._velocity_like(grad) * self.momentum
        self._step_velocity = velocity.add_(grad)
        return residual + velocity

    def keep(self, accumulated: torch.Tensor, delivered: torch.Tensor) -> None:
        """Step 3: ``e = a`` with ``a[delivered] = 0`` (in place: ``accumulated`` becomes the
        residual), and momentum masking.

        Args:
            accumulated: this step's ``a_p`` (from :meth:`compensate`).
            delivered: indices (int64) of the coordinates of ``a_p`` the step delivered.
        """
        self.commit_step()
        accumulated[delivered] = 0
        self.residual = accumulated
        if self.velocity is not None and self.masking:
            self.velocity[delivered] = 0

    def returned(self, update: torch.Tensor) -> torch.Tensor:
        """Step 4: what the step returns for the averaged ``update`` (here: ``update``)."""
        return update

    def drop_step(self) -> None:
        """Forget what this step's :meth:`compensate` computed: the step was skipped (a
        gradient not finite on some rank), so the state stays as it was."""
        self._step_velocity = None

    def commit_step(self) -> None:
        """Store the velocity this step's :meth:`compensate` computed (if it computed one):
        the step is taken. Called by the aggregator once the flags are in, by :meth:`keep`
        and at the step's end; the first call stores, the others find nothing."""
        if self._step_velocity is not None:
            self.velocity, self._step_velocity = self._step_velocity, None

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
        if velocity is not None:
            torch.mul(self._part_of(self.velocity, out, part), self.momentum,
                      out=velocity[part])
            velocity[part].add_(grad)
            grad = velocity[part]
        torch.add(self._part_of(self.residual, out, part), grad, out=out[part])

    # ------------------------------------------------------------------ state
    def _residual_like(self, grad: torch.Tensor) -> torch.Tensor:
        """The residual on ``grad``'s device and dtype (zeros, not stored, before the
        first step)."""
        if self.residual is None:
            return torch.zeros_like(grad)
        if self.residual.device != grad.device or self.residual.dtype != grad.dtype:
            self.residual = self.residual.to(grad.device, grad.dtype)
        return self.residual

    @staticmethod
    def _part_of(state: torch.Tensor | None, out: torch.Tensor, part: slice) -> torch.Tensor:
        """``state[part]`` on ``out``'s device and dtype (zeros of the part's length before
        the first step: a streamed first step allocates no whole-vector zeros per bucket)."""
        if state is None:
            return torch.zeros_like(out[part])
        return state[part].to(out.device, out.dtype)

    def _velocity_like(self, grad: torch.Tensor) -> torch.Tensor:
        """The velocity on ``grad``'s device and dtype (zeros, not stored, before the
        first step)."""
        if self.velocity is None:
            return torch.zeros_like(grad)
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


class EF21Feedback(ErrorFeedback):
    """EF21 (Richtarik, Sokolov, Fatkhullin 2021) and, with momentum, EF21-SGDM (Fatkhullin et
    al. 2023): the ranks compress the change of their (momentum) gradients, and every rank
    returns the same dense estimate of their mean.

    Steps (per rank p, each step):
        1. Compensate: ``v_p = rho*v_p + g_p`` (``v_p = g_p`` without momentum; stored once
           the step is taken) and compress ``a_p = e_p + (v_p - v_p_prev)``: what the shared
           estimate still lacks.
        2. (The method compresses and communicates ``a_p``; its averaged update is ``delta``.)
        3. Keep: ``e_p = a_p`` with the delivered coordinates zeroed (the velocity is never
           masked).
        4. Return ``G += delta``, the same on every rank: the optimizer steps on a smooth but
           lagging estimate instead of on sparse bursts.

    The residuals then hold what the estimate lacks: ``sum_p e_p = sum_p v_p - P*G``.

    EF21(-SGDM): residual, velocity ``v`` and the shared estimate ``G``.

    Args:
        momentum: ``rho`` in [0, 1); 0: plain EF21.
        masking: ignored (EF21 never masks its velocity).

    Attributes:
        estimate: ``G``, alike on every rank (None before the first step).
    """

    name = "ef21"
    streams = False  # no piece-by-piece compensation: streaming gs-SGD refuses it

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(momentum, masking=False)
        self.estimate: torch.Tensor | None = None

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        residual, velocity = self._residual_like(grad), self._velocity_like(grad)
        change = grad - (1 - self.momentum) * velocity  # v - v_prev, v = rho*v_prev + g
        self._step_velocity = velocity + change
        return residual + change

    def returned(self, update: torch.Tensor) -> torch.Tensor:
        if self.estimate is None:
            self.estimate = torch.zeros_like(update)
        self.estimate = self.estimate.to(update.device, update.dtype).add_(update)
        return self.estimate.clone()

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {**super().tensors(), "estimate": self.estimate}

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        estimate = sd.get("estimate")
        self.estimate = None if estimate is None else estimate.clone()


class GlobalMomentumFeedback(ErrorFeedback):
    """Global momentum: classic error feedback on the gradient, and momentum kept by the
    aggregator on the averaged update, alike on every rank.

    Steps (per rank p, each step):
        1. Compensate: ``a_p = e_p + g_p`` (no local momentum).
        2. (The method compresses and communicates ``a_p``; its averaged update is ``delta``.)
        3. Keep: ``e_p = a_p`` with the delivered coordinates zeroed.
        4. Return the velocity: ``M[delta != 0] = 0`` (masking: where a fresh delivery, which
           carries its accumulated gradients, arrives, the coordinate's earlier velocity stops,
           as DGC masks its local velocity), then ``M = rho*M + delta``.

    The coordinates a step carries are its update's nonzeros, so the rule suits methods whose
    update is sparse; a dense update would mask every coordinate (no momentum). It needs
    ``rho > 0`` and plain SGD (the momentum is here, not in the optimizer).

    Per-rank residual; the velocity ``M`` of the averaged update (alike on every rank).

    Args:
        momentum: ``rho`` in (0, 1), the velocity's decay.
        masking: ignored (the mask is the update's support, step 4).
    """

    name = "global"
    streams = False  # no piece-by-piece compensation: streaming gs-SGD refuses it
    owns_momentum = True

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(momentum, masking=False)

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        return self._residual_like(grad) + grad

    def returned(self, update: torch.Tensor) -> torch.Tensor:
        if self.velocity is None:
            self.velocity = torch.zeros_like(update)
        velocity = self.velocity.to(update.device, update.dtype)
        velocity[update != 0] = 0
        self.velocity = velocity.mul_(self.momentum).add_(update)
        return velocity.clone()


class OneBitFeedback(ErrorFeedback):
    """1-bit Adam's compression stage (Tang et al. 2021) with any method's compressor.

    Steps (per rank p, each step; ``m`` is the last step's update, alike on every rank):
        1. Compensate: ``a_p = e_p + rho*m + (1 - rho)*g_p``: this rank's share of the next
           exponential moving average of the gradients.
        2. (The method compresses and communicates ``a_p``; its averaged update is ``delta``.)
        3. Keep: ``e_p = a_p`` with the delivered coordinates zeroed (a subclass that mixes in
           :class:`~gssgd.aggregators.feedback.QuantisedFeedback` keeps
           ``a_p - delta`` instead).
        4. Return ``delta`` and keep it as ``m``: a compressed moving average of the gradients.

    Pair it with :class:`~gssgd.optim.FrozenVarianceAdamW` (``rho`` = its beta1), which steps on
    ``m`` with the variance frozen after a dense warm-up (:func:`gssgd.ddp.compressed_adamw`).

    Per-rank residual; the shared momentum ``m`` (kept as :attr:`velocity`).

    Args:
        momentum: ``rho`` in [0, 1), the optimizer's beta1.
        masking: ignored (``m`` is the last update, never masked).
    """

    name = "onebit"
    owns_momentum = True

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(momentum, masking=False)

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        own = self._residual_like(grad) + (1 - self.momentum) * grad
        if self.velocity is None:
            return own
        return own.add_(self.velocity.to(grad.device, grad.dtype), alpha=self.momentum)

    def returned(self, update: torch.Tensor) -> torch.Tensor:
        self.velocity = update.clone()  # the shared momentum m
        return update

    @property
    def keeps_step_velocity(self) -> bool:
        return False  # m is the last update: read during the step, replaced by returned()

    def compensate_part(self, grad: torch.Tensor, part: slice, out: torch.Tensor,
                        velocity: torch.Tensor | None = None) -> None:
        own = grad * (1 - self.momentum)
        if self.velocity is not None:
            own.add_(self.velocity[part].to(own.device, own.dtype), alpha=self.momentum)
        torch.add(self._part_of(self.residual, out, part), own, out=out[part])


class SketchFeedback:
    """FetchSGD's momentum and error feedback in sketch space (Rothchild et al., ICML 2020).

    A Count Sketch is linear, so momentum and error accumulation can run on the summed sketch
    instead of on each worker's vector. Sketched-SGD's server and every gs-SGD rank hold the
    same summed table ``S`` of the workers' gradients, and per step:

        1. Velocity: ``S_u = rho * S_u + S``.
        2. Error: ``S_e += S_u``.
        3. Recover: the k coordinates with the largest ``|estimate|`` in ``S_e`` (ties by lower
           index) and their estimates: the update before the division by P.
        4. Feedback: ``S_e = 0`` and ``S_u = 0`` in every bucket ``sketch(delta)`` touches
           (the delivered coordinates leave the error; momentum stopping).

    Step 4 follows the authors' code (kiddyboots216/CommEfficient, ``fed_aggregator.py``),
    not the paper's ``S_e -= sketch(delta)``: the code notes that subtracting "should work
    but doesn't (model diverges)". Subtracting leaves every other coordinate hashed into a
    touched bucket in ``S_e`` and takes off only the estimate, which carries the collisions'
    noise; that noise then builds up step after step. Zeroing drops the colliding
    coordinates' error in those buckets instead (``tests/aggregators/feedback/test_fetchsgd.py``
    shows the difference on a noisy quadratic).

    The workers keep no residual; what the sketch does not deliver stays in ``S_e``. The
    learning rate is applied by the optimizer after this (plain SGD): with a constant learning
    rate that is FetchSGD's update, since the paper's ``S_e += lr * S_u`` only scales the
    error by a constant.

    The velocity ``S_u`` and error ``S_e`` tables of FetchSGD, and its recovery step.

    Args:
        momentum: ``rho`` in [0, 1).
    """

    def __init__(self, momentum: float) -> None:
        self.momentum = momentum
        self.velocity: torch.Tensor | None = None
        self.error: torch.Tensor | None = None

    def recover(self, summed: CountSketch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 1-4 on ``summed``, the sketch of the sum of the workers' gradients.

        Args:
            summed: the summed sketch (its table is read, not changed).
            k: coordinates to deliver.

        Returns:
            ``(indices, values)``: the k delivered coordinates (ordered by ``|value|``)
            and the error sketch's estimates of them (sums over the workers).

        Raises:
            ValueError: ``summed`` has another table shape than the stored state (a
                sketch must keep its shape for the whole run).
        """
        table = summed.table
        if self.velocity is None or self.error is None:
            self.velocity, self.error = torch.zeros_like(table), torch.zeros_like(table)
        if self.velocity.shape != table.shape:
            raise ValueError(
                f"FetchSGD's sketch state has shape {tuple(self.velocity.shape)} but this "
                f"step's sketch {tuple(table.shape)}; keep rows and cols fixed for the run."
            )
        self.velocity = self.velocity.to(table.device, table.dtype)
        self.error = self.error.to(table.device, table.dtype)
        self.velocity.mul_(self.momentum).add_(table)
        self.error.add_(self.velocity)
        error = summed.with_table(self.error)
        indices, values = error.heavy_hitters(k)
        delta = torch.zeros(summed.d, dtype=table.dtype, device=table.device)
        delta[indices] = values
        delivered = summed.with_table(torch.zeros_like(table))
        delivered.accumulate(delta)
        touched = delivered.table != 0
        self.error[touched] = 0
        self.velocity[touched] = 0
        return indices, values

    def rescale(self, factor: float) -> None:
        """Multiply both tables by ``factor`` (a loss-scale change under AMP)."""
        for table in (self.velocity, self.error):
            if table is not None:
                table.mul_(factor)

    def state_dict(self) -> dict[str, Any]:
        """Copies of the two tables (None before the first step)."""
        return {
            "velocity": None if self.velocity is None else self.velocity.clone(),
            "error": None if self.error is None else self.error.clone(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        velocity, error = sd.get("velocity"), sd.get("error")
        self.velocity = None if velocity is None else velocity.clone()
        self.error = None if error is None else error.clone()


class FetchSGDFeedback(ErrorFeedback):
    """FetchSGD as a rule: the ranks compress their plain gradients and keep nothing; the
    sketching method recovers through :attr:`tables` (steps 1-4 above) on whichever rank
    holds the summed sketch (every gs-SGD rank; Sketched-SGD's server).

    Args:
        momentum: ``rho`` in [0, 1), the sketch velocity's decay.
        masking: ignored.

    Attributes:
        tables: the :class:`SketchFeedback` velocity and error tables.
    """

    name = "fetchsgd"
    streams = False  # no piece-by-piece compensation: streaming gs-SGD refuses it
    owns_momentum = True

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(0.0, masking=False)
        self.tables = SketchFeedback(momentum)

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.clone()  # the sketch is built from it; the error lives in sketch space

    def keep(self, accumulated: torch.Tensor, delivered: torch.Tensor) -> None:
        """Nothing: the ranks keep no residual (the error sketch keeps what was not sent)."""

    def rescale(self, factor: float) -> None:
        self.tables.rescale(factor)

    def state_dict(self) -> dict[str, Any]:
        return {"residual": None, "sketch_feedback": self.tables.state_dict()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.tables.load_state_dict(sd.get("sketch_feedback", {}))


class QuantisedFeedback(ErrorFeedback):
    """A quantiser's error feedback: keep what the message got wrong, ``e = a - C(a)``.

    A sparsifier delivers some coordinates of ``a`` exactly, so its residual is ``a`` with them
    zeroed (:class:`~gssgd.aggregators.feedback.ErrorFeedback`). A quantiser (QSGD, signSGD,
    a low-rank approximation such as PowerSGD's) sends an approximation ``C(a)`` of every
    coordinate instead, so the residual is the difference (Karimireddy et al. 2019, "Error
    Feedback Fixes SignSGD"; PowerSGD keeps the same ``e = a - P Q^T``).

    Steps (per rank p, each step):
        1. Compensate: ``a_p = e_p + g_p`` (``e_p + u_p`` with local momentum, never masked:
           no coordinate is delivered exactly).
        2. (The method sends ``C(a_p)`` and averages.)
        3. Keep: ``e_p = a_p - C(a_p)``, where ``C(a_p)`` is this rank's decompressed message
           (for PowerSGD, whose factors are averaged before they are multiplied back, the
           update itself).
        4. Return the averaged update as it is.

    The residual ``a - C(a)`` of a compressor that approximates every coordinate.
    """

    def __init__(self, momentum: float = 0.0, masking: bool = True) -> None:
        super().__init__(momentum, masking=False)

    def keep(self, accumulated: torch.Tensor, delivered: torch.Tensor) -> None:
        """Step 3: ``e = a - C(a)``.

        Args:
            accumulated: this step's ``a_p``.
            delivered: ``C(a_p)``, the dense vector the message stands for (same shape).
        """
        self.commit_step()
        self.residual = accumulated - delivered


class OneBitQuantisedFeedback(OneBitFeedback, QuantisedFeedback):
    """1-bit Adam's rule (compensate with the shared momentum, return it) with a quantiser's
    residual ``e = a - C(a)``: PowerSGD's ``feedback="onebit"``."""


#: Every rule a built-in method takes, by its ``feedback`` name.
RULES: dict[str, type[ErrorFeedback]] = {
    rule.name: rule
    for rule in (ErrorFeedback, EF21Feedback, GlobalMomentumFeedback, OneBitFeedback,
                 FetchSGDFeedback)
}
#: The rules of a method that delivers coordinates of each rank's vector (topk, gtopk).
SPARSE_RULES = {name: RULES[name] for name in ("ef", "ef21", "global", "onebit")}
#: The sparse rules and FetchSGD's, which needs a sketch (sketched, gs).
SKETCH_RULES = {**SPARSE_RULES, "fetchsgd": FetchSGDFeedback}
#: What ``feedback`` accepts across the built-in methods.
FEEDBACKS: tuple[str, ...] = tuple(RULES)
#: The rules that keep the momentum themselves (the optimizer must not add its own).
OWN_MOMENTUM_FEEDBACKS: tuple[str, ...] = tuple(n for n, r in RULES.items() if r.owns_momentum)
