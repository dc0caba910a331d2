"""Local steps with a compressed outer step: DiLoCo-style training where the pseudo-gradient
travels through any gssgd method.

DiLoCo (Douillard et al. 2023) trains data-parallel with little communication: each worker
takes ``H`` inner optimizer steps on its own data with no communication at all; then the
workers average their **pseudo-gradient**, the change of their weights since the last
outer step, and an **outer optimizer** (Nesterov SGD, lr 0.7, momentum 0.9) applies it to
the weights they started from, the same on every rank. :class:`LocalSteps` does the outer
half for a user's own loop, with the pseudo-gradient aggregated by a gssgd method and its
error feedback:

- the dense all-reduce: DiLoCo (float32; ``dtype=torch.bfloat16`` for a 16-bit one);
- local Top-k: a SparseLoCo-style gather (each worker's top-k of its error-fed
  pseudo-gradient, all-gathered: what a worker receives grows with P);
- gs: the pseudo-gradient as a summed Count Sketch (a message that stays constant as P
  grows), then the exact values of its heavy coordinates;
- any other registered aggregator method (:data:`gssgd.METHODS`, one of yours too).

An outer step, on every rank alike:

1. ``delta_p = anchor - theta_p`` (float32), the weights' change since the anchor (the
   weights every rank held after the last outer step);
2. ``update = aggregator.step(delta_p)``: the average over ranks of what the method
   delivers, the rest kept in this rank's residual (error feedback); with ``error_decay``
   beta < 1 the residual is decayed first, ``e = beta * e + delta_p`` is what the method
   compresses (SparseLoCo's error feedback, which stands in for the outer momentum: use it
   with ``outer_momentum=0``);
3. the outer optimizer steps the anchor with ``update`` as its gradient;
4. every rank's weights are set to the new anchor (floating buffers, such as batch norm's
   running statistics, are averaged densely).

The inner optimizer is the user's and keeps its own state on each rank (DiLoCo's).
A non-finite pseudo-gradient on any rank skips the outer step on every rank: the weights go
back to the anchor, the residuals and the outer optimizer are left as they were, and a
``RuntimeWarning`` says so (the aggregator's ``nonfinite`` policy and
``max_consecutive_skips`` stop the run after repeated skips).

Bytes: an outer step moves the aggregator's traffic (``last_stats``) plus the buffers'
all-reduce; inner steps move nothing. :attr:`LocalSteps.bytes_sent` totals them. The
broadcast of rank 0's weights at construction (as DDP does) is a one-time copy, not counted.

Example (each rank, under torchrun; the model is not wrapped in DDP)::

    model = build_model()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    outer = LocalSteps(model, "gs", local_steps=30, density=0.01)
    for x, y in loader:
        loss_fn(model(x), y).backward()
        inner.step()
        inner.zero_grad()
        outer.step()  # every 30th call: the outer step (a collective on every rank)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from gssgd.aggregators import AGGREGATORS, Aggregator, StepStats, make_aggregator
from gssgd.validate import check_int, check_number

__all__ = ["DILOCO_OUTER_LR", "DILOCO_OUTER_MOMENTUM", "LocalSteps"]

#: DiLoCo's outer learning rate (its outer optimizer: Nesterov SGD).
DILOCO_OUTER_LR = 0.7
#: DiLoCo's outer Nesterov momentum.
DILOCO_OUTER_MOMENTUM = 0.9


class LocalSteps:
    """H inner steps with no communication, then one outer step through a gssgd method.

    Call :meth:`step` once after every inner optimizer step, on every rank; every
    ``local_steps``-th call is the outer step (a collective: every rank must call it as
    often). See the module doc for the algorithm.

    Args:
        model: the model (not wrapped in DDP: its gradients must stay local), or its
            parameters; a model's floating buffers are averaged at each outer step.
        method: the gssgd method that aggregates the pseudo-gradient (default ``"dense"``,
            DiLoCo's).
        local_steps: H >= 1, inner steps per outer step.
        density: the sparse methods' fraction of coordinates (or ``k=`` in ``options``).
        outer_lr: the outer optimizer's learning rate (> 0; DiLoCo's 0.7).
        outer_momentum: its momentum in [0, 1) (DiLoCo's 0.9); 0 is plain SGD.
        nesterov: Nesterov momentum (DiLoCo's), when ``outer_momentum`` > 0.
        error_decay: beta in (0, 1]: the residual's decay before each outer step adds the
            pseudo-gradient to it (1: classic error feedback; SparseLoCo decays it, with
            plain SGD outside: ``outer_momentum=0``). Only for methods with a residual.
        group: the process group (None: the default one), or a simulated rank
            (:class:`gssgd.simulated.SimulatedRank`).
        broadcast: start every rank from rank 0's weights and buffers (as DDP does); False
            where the replicas are already equal (the simulated world copies one model).
        **options: the method's options (:func:`gssgd.make_aggregator`).

    Raises:
        ValueError: a bad setting (the message names the value, the valid range and the
            fix), or a method's own option error.
        RuntimeError: torch.distributed is not initialised.
    """

    def __init__(
        self,
        model: torch.nn.Module | Iterable[torch.nn.Parameter],
        method: str = "dense",
        *,
        local_steps: int,
        density: float | None = None,
        outer_lr: float = DILOCO_OUTER_LR,
        outer_momentum: float = DILOCO_OUTER_MOMENTUM,
        nesterov: bool = True,
        error_decay: float = 1.0,
        group: Any = None,
        broadcast: bool = True,
        **options: Any,
    ) -> None:
        _check_settings(method, local_steps, outer_lr, outer_momentum)
        _check_error_decay(method, error_decay, options)
        self.error_decay = float(error_decay)
        if isinstance(model, torch.nn.Module):
            self.params = [p for p in model.parameters() if p.requires_grad]
            self.buffers = [b for b in model.buffers() if b.dtype.is_floating_point]
        else:
            self.params, self.buffers = [p for p in model if p.requires_grad], []
        if not self.params:
            raise ValueError("LocalSteps got no trainable parameters; pass the model or its "
                             "parameters (requires_grad=True).")
        self.method, self.local_steps, self.group = method, local_steps, group
        self.d = sum(p.numel() for p in self.params)
        if AGGREGATORS[method].takes_shapes:
            options.setdefault("shapes", tuple(tuple(p.shape) for p in self.params))
        self.aggregator: Aggregator = make_aggregator(method, self.d, density, group=group,
                                                      **options)
        self._buffers_agg = (make_aggregator("dense", sum(b.numel() for b in self.buffers),
                                             group=group) if self.buffers else None)
        with torch.no_grad():  # every rank starts from rank 0's weights, as DDP does
            for t in [*self.params, *self.buffers] if broadcast else []:
                dist.broadcast(t.data, src=dist.get_global_rank(group, 0) if group else 0,
                               group=group)
        self.anchor = self._flat_params()
        self.outer = torch.optim.SGD([self.anchor], lr=outer_lr, momentum=outer_momentum,
                                     nesterov=nesterov and outer_momentum > 0)
        #: inner steps since the run began, outer steps taken, outer steps skipped
        self.inner_steps = 0
        self.outer_steps = 0
        self.skipped = 0
        #: bytes this rank sent and received over every outer step
        self.bytes_sent = 0
        self.bytes_received = 0
        #: the last outer step's traffic: the pseudo-gradient's and the buffers'
        self.last_stats: StepStats | None = None

    # ------------------------------------------------------------------ the step
    def step(self) -> bool:
        """Count one inner step; on every ``local_steps``-th, take the outer step.

        Returns:
            True when this call took (or skipped, for a non-finite pseudo-gradient) the
            outer step.

        Raises:
            FloatingPointError: the aggregator's ``nonfinite`` policy stopped the run.
        """
        self.inner_steps += 1
        if self.inner_steps % self.local_steps:
            return False
        self.outer_step()
        return True

    def outer_step(self) -> None:
        """Aggregate the pseudo-gradient, step the anchor, and set every rank's weights
        to it (the module doc's steps 1-4); called by :meth:`step`. (No ``no_grad`` spans a
        collective: a simulated world's ranks take turns inside one thread, whose grad
        mode they share.)"""
        delta = (self.anchor - self._flat_params()).detach()
        residual = self.aggregator.residual
        if self.error_decay != 1.0 and residual is not None:
            # the method compresses e + delta': delta' = delta - (1 - beta) e gives beta e + delta,
            # and a skipped step leaves e as it was
            delta = delta.sub(residual.to(delta.dtype), alpha=1.0 - self.error_decay)
        update = self.aggregator.step(delta)
        stats = self.aggregator.last_stats
        sent, received = stats.bytes_sent, stats.bytes_received
        if stats.skipped:
            self.skipped += 1
            warnings.warn(
                f"LocalSteps: outer step {self.outer_steps + self.skipped} skipped on every "
                "rank: the pseudo-gradient is not finite (the inner steps diverged); the "
                "weights go back to the last outer step's. Lower the inner learning rate or "
                "clip its gradients.", RuntimeWarning, stacklevel=3)
        else:
            self.anchor.grad = update.to(torch.float32)
            self.outer.step()
            self.anchor.grad = None
            self.outer_steps += 1
        _write(self.params, self.anchor)
        if self._buffers_agg is not None:
            flat = torch.cat([b.detach().reshape(-1).to(torch.float32) for b in self.buffers])
            _write(self.buffers, self._buffers_agg.step(flat))
            sent += self._buffers_agg.last_stats.bytes_sent
            received += self._buffers_agg.last_stats.bytes_received
        self.bytes_sent += sent
        self.bytes_received += received
        self.last_stats = StepStats(bytes_sent=sent, bytes_received=received,
                                    rounds=stats.rounds, k=stats.k, d=self.d,
                                    skipped=stats.skipped)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """This rank's state for an exact resume: the anchor, the outer optimizer, the
        aggregator's (residual) state, and the counters. Save it with the model's and the
        inner optimizer's; the weights between outer steps are the model's."""
        return {
            "method": self.method,
            "d": self.d,
            "local_steps": self.local_steps,
            "inner_steps": self.inner_steps,
            "outer_steps": self.outer_steps,
            "skipped": self.skipped,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "anchor": self.anchor.clone(),
            "outer": self.outer.state_dict(),
            "aggregator": self.aggregator.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (of the same method, model size and H).

        Raises:
            ValueError: the state belongs to another method, model size or H.
        """
        for key, want in (("method", self.method), ("d", self.d),
                          ("local_steps", self.local_steps)):
            if state.get(key) != want:
                raise ValueError(
                    f"cannot load LocalSteps state: {key}={state.get(key)!r} in the state but "
                    f"{want!r} here; resume with the same method, model and local_steps.")
        self.anchor.copy_(state["anchor"])
        self.outer.load_state_dict(state["outer"])
        self.aggregator.load_state_dict(state["aggregator"])
        for key in ("inner_steps", "outer_steps", "skipped", "bytes_sent", "bytes_received"):
            setattr(self, key, int(state[key]))

    # ------------------------------------------------------------------ helpers
    def _flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in self.params])


def _write(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy consecutive pieces of ``flat`` into ``tensors`` (their shapes and dtypes)."""
    with torch.no_grad():
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def _check_error_decay(method: str, beta: object, options: dict[str, Any]) -> None:
    """``error_decay`` must be in (0, 1], and below 1 only where a residual is kept."""
    check_number("error_decay", beta, "in (0, 1]", lambda b: 0 < b <= 1,
                 "1: classic error feedback; SparseLoCo decays the residual, e.g. 0.95.")
    fetch = options.get("feedback") == "fetchsgd"
    if beta != 1 and (fetch or not AGGREGATORS[method].has_residual):
        which = f"method={method!r}" + (" with feedback='fetchsgd'" if fetch else "")
        raise ValueError(f"error_decay={beta!r} decays the residual, but {which} keeps none; "
                         "use error_decay=1 or a method with error feedback (topk, gs).")


def _check_settings(method: str, local_steps: object, outer_lr: object,
                    outer_momentum: object) -> None:
    """Bad settings as ValueErrors that name the value, the valid range and the fix."""
    if method not in AGGREGATORS:
        raise ValueError(f"method={method!r} is not a gssgd method; choose one of "
                         f"{sorted(AGGREGATORS)} (dense is DiLoCo's outer step).")
    check_int("local_steps", local_steps, 1, fix="It counts the inner steps per outer step; "
              "DiLoCo uses 30-500; 1 is per-step training.")
    check_number("outer_lr", outer_lr, "> 0", lambda v: v > 0,
                 f"DiLoCo's is {DILOCO_OUTER_LR}; 1 with outer_momentum=0 averages the weights.")
    check_number("outer_momentum", outer_momentum, "in [0, 1)", lambda v: 0 <= v < 1,
                 f"DiLoCo's is {DILOCO_OUTER_MOMENTUM}; 0 for plain SGD.")
