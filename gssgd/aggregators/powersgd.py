"""PowerSGD: low-rank gradient compression with error feedback (Vogels, Karimireddy, Jaggi;
"PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization",
NeurIPS 2019), as PyTorch's ``powerSGD_hook`` computes it.

Steps (per rank p, each step; W ranks):
    1. Accumulate: ``a_p = e_p + g_p`` (``e_p + u_p`` with the optional local momentum).
    2. Split ``a_p`` into its tensors (``options.shapes``) and plan them
       (:func:`~gssgd.aggregators.lowrank.plan_lowrank`): each tensor with two or more
       dimensions is a matrix ``M`` (``n = shape[0]`` rows, ``m`` the rest); it is
       compressed when its rank-r factors are smaller than ``M`` by ``min_compression_rate``;
       every other tensor (biases, small matrices) goes dense.
    3. Dense part: all-reduce the dense tensors as one flat buffer (sum), divide by W.
    4. Queries: each matrix's ``Q`` (``m x r``) is last step's (``warm_start``) or, at the
       first step, drawn from a generator seeded with ``seed`` (alike on every rank);
       orthogonalised.
    5. ``P = M Q`` for every matrix; all-reduce every P as one flat buffer (sum: the
       orthogonalisation does not see the scale); orthogonalise each P.
    6. ``Q = M^T P``; all-reduce every Q as one flat buffer, divide by W: the mean ``Q``
       (kept for the next step's warm start).
    7. Update: ``P Q^T`` for each matrix (the mean over ranks of the ranks' ``P Q_p^T``),
       the dense part's mean elsewhere; the same on every rank.
    8. Error feedback, PyTorch's rule (``error = input_copy - input`` in its hook):
       ``e_p = a_p - update``. Summed over ranks it is what the rank-r approximation left
       out (``sum_p (M_p - P P^T M_p)``, as in the paper's Algorithm 1); each rank's own
       residual also holds its deviation from the ranks' mean, which sums to zero over the
       ranks (so no gradient mass is lost: ``sum_p a_p = W * update + sum_p e_p``).

Communication per rank: three ring all-reduces, of the dense tensors, of every P
(``sum r n`` values) and of every Q (``sum r m``) (:meth:`PowerSGD.traffic`); the message
is constant in W, like gs-SGD's. In the DDP hook's per-bucket mode every bucket has its own
aggregator, all seeded alike (PyTorch's hook draws the buckets' first Q from one stream).

Tuning: ``rank`` is the one knob (the message grows linearly with it); PowerSGD is biased,
so error feedback is always on; the paper trains with momentum SGD on the update, which is
``gssgd train``'s default for this method. Before the first compressed step the DDP hook's
``start_iter`` runs plain all-reduces, like PyTorch's ``start_powerSGD_iter``.

Example:
    >>> shapes = [p.shape for p in model.parameters()]  # doctest: +SKIP
    >>> agg = gssgd.make_aggregator("powersgd", d, rank=2, shapes=shapes)
    >>> update = agg.step(flat_grad)  # the averaged rank-2 update
"""

from __future__ import annotations

from typing import Any

import torch

from gssgd.aggregators.base import Aggregator
from gssgd.aggregators.lowrank import PowerSGDOptions, orthogonalize_, plan_lowrank
from gssgd.comm import Traffic, ring_allreduce

__all__ = ["PowerSGD"]


class PowerSGD(Aggregator):
    """PowerSGD: every matrix-shaped tensor averaged as a rank-r product, the rest dense.

    Attributes:
        plan: the :class:`~gssgd.aggregators.lowrank.LowRankPlan` of ``options.shapes``.
        q_memory: every matrix's mean ``Q`` of the last step (the warm start), flat in the
            plan's order; None before the first step.
        generator: the CPU generator the random ``Q`` factors are drawn from.
    """

    name = "powersgd"
    Options = PowerSGDOptions
    sends_all = True  # no k: the rank sets the message
    takes_shapes = True
    options: PowerSGDOptions

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: PowerSGDOptions, world_size: int, *,
        step: int | None = None,
    ) -> Traffic:
        """The non-finite flag, then a ring all-reduce each of the dense tensors, every P
        and every Q (float32 values; an empty one is not sent), the same at every step."""
        assert options.shapes is not None, "resolve the options first (build_options)"
        plan = plan_lowrank(options.shapes, options.rank, options.min_compression_rate)
        out = cls.control_traffic(world_size)
        for numel in (plan.dense_numel, plan.p_numel, plan.q_numel):
            if numel:
                out = out + ring_allreduce(4 * numel, world_size)
        return out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        opts = self.options
        assert opts.shapes is not None, "resolve the options first (build_options)"
        self.plan = plan_lowrank(opts.shapes, opts.rank, opts.min_compression_rate)
        self.q_memory: torch.Tensor | None = None
        self.generator = torch.Generator().manual_seed(opts.seed)

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        skipped = self._begin(grad)
        if skipped is not None:
            return skipped
        plan, world = self.plan, self.world_size
        with self._timed("compress"):
            accumulated = self._error_compensated(grad)  # a_p = e_p + g_p (+ momentum)
            matrices = [accumulated[f.offset : f.offset + f.n * f.m].view(1, f.n, f.m)
                        for f in plan.factors]
            dense = torch.cat([accumulated[o : o + n] for o, n in plan.dense]
                              or [accumulated[:0]])
            queries, q_previous = self._queries(accumulated)  # orthogonalised Q
            p_flat = accumulated.new_empty(plan.p_numel)
            ps = self._views(p_flat, "p")
            for m_, q, p in zip(matrices, queries, ps, strict=True):
                torch.bmm(m_, q, out=p)  # P = M Q
        if plan.dense_numel:
            dense = self.comm.allreduce_backend(dense)
        if plan.p_numel:
            self.comm.allreduce_backend(p_flat)  # in place: ps now hold the sum
        with self._timed("compress"):
            for p in ps:
                orthogonalize_(p, self.options.epsilon)
            q_flat = accumulated.new_empty(plan.q_numel)
            qs = self._views(q_flat, "q")
            for m_, p, q in zip(matrices, ps, qs, strict=True):
                torch.bmm(m_.transpose(1, 2), p, out=q)  # Q = M^T P
        if plan.q_numel:
            self.comm.allreduce_backend(q_flat)
        with self._timed("decompress"):
            q_flat.div_(world)  # the mean Q
            update = torch.empty_like(accumulated)
            at = 0
            for o, n in plan.dense:
                update[o : o + n] = dense[at : at + n] / world
                at += n
            for f, p, q in zip(plan.factors, ps, qs, strict=True):
                out = update[f.offset : f.offset + f.n * f.m].view(1, f.n, f.m)
                torch.bmm(p, q.transpose(1, 2), out=out)  # P Q^T
            self._remember(q_flat, qs, q_previous)
            self.feedback.keep(accumulated, update)  # PyTorch's rule: e = a - update
        return self._finish(update)

    # ---------------------------------------------------------------- factors
    def _views(self, flat: torch.Tensor, which: str) -> list[torch.Tensor]:
        """Each matrix's ``P`` (``which="p"``: ``1 x n x r``) or ``Q`` (``1 x m x r``) as a
        view into the flat buffer, in the plan's order."""
        out = []
        for f in self.plan.factors:
            start, rows = (f.p_offset, f.n) if which == "p" else (f.q_offset, f.m)
            out.append(flat[start : start + rows * f.r].view(1, rows, f.r))
        return out

    def _queries(self, like: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """This step's orthogonalised ``Q`` of every matrix (on ``like``'s device and dtype)
        and, for :meth:`_remember`, the same list (a copy of it, with warm start).

        Steps: with a warm start after the first step, last step's mean ``Q``; else a
        standard normal draw per matrix, in the plan's order, from :attr:`generator` on the
        CPU (so every device draws the same numbers; PyTorch's hook seeds the global
        generator inside ``fork_rng`` instead). Then each is orthogonalised.
        """
        warm = self.options.warm_start and self.q_memory is not None
        if warm:
            flat = self.q_memory.to(like.device, like.dtype)  # type: ignore[union-attr]
        else:
            flat = like.new_empty(self.plan.q_numel)
        queries = self._views(flat, "q")
        for f, q in zip(self.plan.factors, queries, strict=True):
            if not warm:
                q.copy_(torch.randn((1, f.m, f.r), generator=self.generator, dtype=like.dtype))
            orthogonalize_(q, self.options.epsilon)
        return queries, ([q.clone() for q in queries] if self.options.warm_start else [])

    def _remember(self, q_flat: torch.Tensor, qs: list[torch.Tensor],
                  previous: list[torch.Tensor]) -> None:
        """Keep the mean ``Q`` for the next step's warm start. A column that is all zero
        (its ``P`` column was: the matrix had nothing in that direction on any rank, e.g.
        a layer no rank has used yet) keeps the column it was computed from, so the power
        iteration does not stall there for the rest of training; elsewhere this is
        PyTorch's memory exactly."""
        if not self.options.warm_start:
            return
        for q, before in zip(qs, previous, strict=True):
            dead = torch.linalg.vector_norm(q, dim=1, keepdim=True) == 0
            q.copy_(torch.where(dead, before, q))
        self.q_memory = q_flat

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Adds ``"q"``, the warm start (absent before the first step), and
        ``"generator"``, the state of the generator the random ``Q`` come from."""
        sd = super().state_dict()
        if self.q_memory is not None:
            sd["q"] = self.q_memory.clone()
        sd["generator"] = self.generator.get_state()
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Raises:
            ValueError: another method or size, or a ``"q"`` of another plan's length.
        """
        super().load_state_dict(sd)
        q = sd.get("q")
        if q is not None and tuple(q.shape) != (self.plan.q_numel,):
            raise ValueError(
                f"cannot load PowerSGD state: its Q factors hold {q.numel()} values, this "
                f"plan's {self.plan.q_numel}; resume with the same shapes, rank and "
                "min_compression_rate."
            )
        self.q_memory = None if q is None else q.clone()
        if "generator" in sd:
            self.generator.set_state(sd["generator"])
