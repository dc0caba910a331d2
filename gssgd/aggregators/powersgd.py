"""PowerSGD: low-rank gradient compression with error feedback (Vogels, Karimireddy, Jaggi;
"PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization",
NeurIPS 2019), as PyTorch's ``powerSGD_hook`` computes it.

Steps (per rank p, each step; W ranks):
    1. Accumulate: ``a_p = e_p + g_p`` (``e_p + u_p`` with the optional local momentum).
    2. Split ``a_p`` into its tensors (``options.shapes``) and plan them
       (:func:`plan_lowrank`): each tensor with two or more
       dimensions is a matrix ``M`` (``n = shape[0]`` rows, ``m`` the rest); it is
       compressed when its rank-r factors are smaller than ``M`` by ``min_compression_rate``;
       every other tensor (biases, small matrices) goes dense.
    3. Dense part: all-reduce the dense tensors as one flat buffer (sum), divide by W. The
       ranks' non-finite flags ride at the end of this first all-reduce (of step 5's when
       no tensor goes dense): when a gradient is not finite on any rank, every rank skips
       the step there (its ``nonfinite`` policy), its state and random stream untouched.
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

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from gssgd.aggregators.base import Aggregator
from gssgd.aggregators.feedback import ErrorFeedback, OneBitQuantisedFeedback, QuantisedFeedback
from gssgd.aggregators.options import CommonOptions
from gssgd.comm import Traffic, ring_allreduce
from gssgd.validate import bad_value, is_int, is_number

__all__ = [
    "DEFAULT_POWERSGD_RANK",
    "Factor",
    "LowRankPlan",
    "PowerSGD",
    "PowerSGDOptions",
    "default_shapes",
    "orthogonalize_",
    "plan_lowrank",
]


# --------------------------------------------------------------------------- the low-rank plan

#: PowerSGD's rank when none is given (``--powersgd-rank``; PyTorch's hook defaults to 1,
#: the paper's experiments use 1 to 4 on images and up to 32 on language models).
DEFAULT_POWERSGD_RANK = 2
#: PyTorch's ``min_compression_rate`` default: a matrix is compressed only when its factors
#: are less than half its size.
DEFAULT_MIN_COMPRESSION_RATE = 2.0

Shape = tuple[int, ...]


def default_shapes(d: int) -> tuple[Shape, ...]:
    """The layout PowerSGD assumes for a bare vector of length ``d`` (no ``shapes`` given):
    one near-square matrix of ``isqrt(d)`` rows and ``d // isqrt(d)`` columns, followed by a
    dense tail of the ``d mod isqrt(d)`` (fewer than ``sqrt(d)``) last coordinates.

    It is what ``gssgd bench comm`` and the cost model measure; a model's real layers (which
    the DDP hook and ``gssgd train`` pass) compress differently: a layer with few rows
    compresses less than a square matrix of the same size.

    Example:
        >>> default_shapes(80_602)
        ((283, 284), (230,))
    """
    n = max(1, math.isqrt(d))
    tail = d - n * (d // n)
    return ((n, d // n),) + (((tail,),) if tail else ())


def _check_shapes(shapes: object) -> tuple[Shape, ...] | None:
    """``shapes`` as a tuple of int tuples (None passes).

    Raises:
        ValueError: not a sequence of sequences of integers >= 0.
    """
    if shapes is None:
        return None
    fix = "Pass the parameters' shapes in the vector's order, e.g. [p.shape for p in params]."
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Sequence) or not shapes:
        raise bad_value("shapes", shapes, "it must be a non-empty sequence of tensor shapes", fix)
    out = []
    for shape in shapes:
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not all(
            is_int(s) and s >= 0 for s in shape
        ):
            raise bad_value("shapes", shapes, f"{shape!r} is not a shape of integers >= 0", fix)
        out.append(tuple(int(s) for s in shape))
    return tuple(out)


@dataclass(frozen=True)
class PowerSGDOptions(CommonOptions):
    """Options of PowerSGD (:class:`~gssgd.aggregators.powersgd.PowerSGD`).

    Attributes:
        rank: r, the rank of each matrix's approximation ``P Q^T`` (per matrix
            ``min(r, rows, cols)``); the message is ``r * (rows + cols)`` numbers per
            compressed matrix. Start at 1 and double while accuracy improves (the paper:
            2 to 4 for image models, PyTorch's guide: "typically 1-4").
        warm_start: reuse each matrix's last ``Q`` (the paper's power iteration across
            steps); False draws a fresh random ``Q`` every step.
        min_compression_rate: compress a matrix only when ``rows * cols`` exceeds this times
            its factors' ``r * (rows + cols)`` numbers (PyTorch's rule); the others travel
            dense. At least 1: below, factors larger than the matrix would be sent.
        epsilon: added to each column's norm in the Gram-Schmidt orthogonalisation
            (PyTorch's ``orthogonalization_epsilon``); 0 (default) is exact, and an all-zero
            column stays zero instead of becoming NaN.
        seed: seeds the generator the first ``Q`` factors are drawn from (the same on every
            rank; the global RNG is never touched).
        momentum: local momentum ``u = momentum * u + g`` before compression (no stopping:
            nothing is delivered coordinate by coordinate); 0 = off. The paper and PyTorch
            put the momentum in the optimizer instead (momentum SGD on the update), which is
            ``gssgd train``'s default for PowerSGD.
        shapes: the shapes of the tensors the vector concatenates, in order (their sizes
            must add up to d). The DDP hook and ``gssgd train`` pass the parameters' shapes;
            None: :func:`default_shapes`.
        feedback: ``"ef"`` (default): PyTorch's error feedback on ``e + g``; ``"onebit"``:
            1-bit Adam's recipe (:func:`gssgd.ddp.compressed_adamw`): compress
            ``e + momentum * m + (1 - momentum) * g`` with ``m`` the last step's update,
            keep ``e = a - update`` and return the new shared momentum ``m``.

    PyTorch's name for the rank, ``matrix_approximation_rank``, is accepted as well
    (:attr:`aliases`).
    """

    #: Other names of options (PyTorch's ``PowerSGDState`` names), accepted by
    #: :func:`gssgd.make_aggregator` and the DDP hook.
    aliases: ClassVar[dict[str, str]] = {"matrix_approximation_rank": "rank"}
    #: the error-feedback rules: a low-rank approximation's residual ``e = a - P Q^T``
    feedback_rules: ClassVar[dict[str, type[ErrorFeedback]]] = {
        "ef": QuantisedFeedback, "onebit": OneBitQuantisedFeedback}

    rank: int = DEFAULT_POWERSGD_RANK
    warm_start: bool = True
    min_compression_rate: float = DEFAULT_MIN_COMPRESSION_RATE
    epsilon: float = 0.0
    seed: int = 0
    momentum: float = 0.0
    shapes: tuple[Shape, ...] | None = None
    feedback: str = "ef"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.feedback not in self.feedbacks:
            raise bad_value("feedback", self.feedback,
                            f"PowerSGD takes {' or '.join(self.feedbacks)}",
                            "Use 'ef' (PyTorch's error feedback) or 'onebit' with "
                            "gssgd.ddp.compressed_adamw.")
        if not is_int(self.rank) or self.rank < 1:
            raise bad_value("rank", self.rank, "it must be an integer >= 1 (each matrix then uses "
                            "min(rank, rows, cols))", "Start with rank=1 or 2 and double it while "
                            "accuracy improves (--powersgd-rank).")
        if not isinstance(self.warm_start, bool):
            raise bad_value("warm_start", self.warm_start, "it must be True or False",
                            "Use warm_start=True (the paper's power iteration across steps).")
        if not is_number(self.min_compression_rate) or self.min_compression_rate < 1:
            raise bad_value("min_compression_rate", self.min_compression_rate,
                            "it must be a number >= 1 (below 1, factors larger than the matrix "
                            "would be sent)", "Use 2 (PyTorch's default).")
        if not is_number(self.epsilon) or self.epsilon < 0:
            raise bad_value("epsilon", self.epsilon, "it must be a number >= 0",
                            "Use 0 (exact), or 1e-8 as PyTorch suggests for vanishing gradients.")
        if not is_int(self.seed) or not 0 <= self.seed < 2**64:
            raise bad_value("seed", self.seed, "it must be an integer in [0, 2**64)",
                       "For example seed=0.")
        momentum = self.momentum
        if not is_number(momentum) or not 0 <= momentum < 1:
            raise bad_value("momentum", momentum, "it must be a number in [0, 1) (0 turns local "
                            "momentum off)",
                            "Use 0 and the optimizer's momentum, as the paper does.")
        object.__setattr__(self, "shapes", _check_shapes(self.shapes))

    def resolved(self, d: int, k: int, world_size: int | None = None) -> PowerSGDOptions:
        """These options with ``shapes`` filled in (:func:`default_shapes`) and checked
        against ``d``.

        Raises:
            ValueError: the shapes' sizes do not add up to ``d``.
        """
        shapes = default_shapes(d) if self.shapes is None else self.shapes
        total = sum(math.prod(s) for s in shapes)
        if total != d:
            raise bad_value("shapes", shapes, f"their sizes add up to {total}, not to the vector's "
                            f"d={d}", "Pass the shapes of exactly the tensors the vector "
                            "concatenates, in its order.")
        return replace(self, shapes=shapes)


@dataclass(frozen=True)
class Factor:
    """One compressed matrix of a :class:`LowRankPlan`.

    Attributes:
        offset: where the matrix starts in the vector (it is ``n * m`` long, row-major).
        n, m: rows (the tensor's first dimension) and columns (the product of the rest).
        r: its rank, ``min(rank, n, m)``.
        p_offset, q_offset: where its ``P`` (``n x r``) and ``Q`` (``m x r``) start in the
            flat buffers of every matrix's P and Q.
    """

    offset: int
    n: int
    m: int
    r: int
    p_offset: int
    q_offset: int


@dataclass(frozen=True)
class LowRankPlan:
    """Which tensors of a vector PowerSGD compresses, and where everything goes.

    Attributes:
        dense: ``(offset, numel)`` of each tensor sent as it is, in the vector's order
            (all-reduced together as one flat buffer of ``dense_numel`` values).
        factors: the compressed matrices, in PyTorch's order: grouped by ``(n, m)`` in the
            order each shape first appears, then in the vector's order. Their P factors
            fill one buffer of ``p_numel`` values, their Q factors one of ``q_numel``.
    """

    dense: tuple[tuple[int, int], ...]
    factors: tuple[Factor, ...]
    dense_numel: int
    p_numel: int
    q_numel: int


def plan_lowrank(shapes: Sequence[Shape], rank: int, min_compression_rate: float
                 ) -> LowRankPlan:
    """The plan of a vector concatenating tensors of ``shapes`` (PyTorch's rule).

    A tensor with at least two dimensions is the matrix ``n x m`` (``n = shape[0]``); it is
    compressed with ``r = min(rank, n, m)`` when ``r * (n + m) * min_compression_rate <
    n * m``. Every other tensor (vectors, scalars, matrices that would not shrink enough)
    is sent dense.

    Example:
        >>> plan = plan_lowrank([(48, 1568), (48,)], rank=2, min_compression_rate=2)
        >>> plan.p_numel, plan.q_numel, plan.dense_numel
        (96, 3136, 48)
    """
    dense, matrices, offset = [], [], 0
    for shape in shapes:
        numel = math.prod(shape)
        if len(shape) >= 2 and numel > 0:
            n, m = shape[0], numel // shape[0]
            r = min(rank, n, m)
            if r * (n + m) * min_compression_rate < n * m:
                matrices.append((offset, n, m, r))
                offset += numel
                continue
        if numel:
            dense.append((offset, numel))
        offset += numel
    by_shape: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    for entry in matrices:
        by_shape.setdefault((entry[1], entry[2]), []).append(entry)
    factors, p_at, q_at = [], 0, 0
    for group in by_shape.values():
        for off, n, m, r in group:
            factors.append(Factor(off, n, m, r, p_at, q_at))
            p_at, q_at = p_at + n * r, q_at + m * r
    return LowRankPlan(tuple(dense), tuple(factors), sum(n for _, n in dense), p_at, q_at)


def orthogonalize_(matrices: torch.Tensor, epsilon: float = 0.0) -> None:
    """Make the columns of each ``n x r`` matrix of ``matrices`` (shape ``(batch, n, r)``,
    ``r <= n``) orthonormal, in place, as PyTorch's ``powerSGD_hook`` does.

    Steps: for ``r <= 2`` (and 16-bit dtypes) Gram-Schmidt: for each column in turn, divide
    it by its norm (plus ``epsilon``), then subtract its projection from every later column;
    for ``r > 2`` ``torch.linalg.qr``'s Q (faster there; its columns may differ from
    Gram-Schmidt's in sign, which the product ``P Q^T`` does not see). One difference from
    PyTorch: with ``epsilon == 0`` an all-zero column stays zero where PyTorch divides by
    zero and returns NaN (its code means to catch that, but a tensor division never raises).
    """
    r = matrices.shape[2]
    if r <= 2 or matrices.dtype in (torch.float16, torch.bfloat16):
        _gram_schmidt_(matrices, epsilon)
        return
    torch.linalg.qr(matrices, out=(matrices, torch.empty(
        matrices.shape[0], r, r, device=matrices.device, dtype=matrices.dtype)))


def _gram_schmidt_(matrices: torch.Tensor, epsilon: float) -> None:
    """Gram-Schmidt on each matrix of the batch, column by column, in place."""
    r = matrices.shape[2]
    for i in range(r):
        col = matrices[:, :, i : i + 1]
        norm = torch.norm(col, dim=1, keepdim=True)
        if epsilon == 0:
            col.copy_(torch.where(norm > 0, col / norm, 0.0))  # no device sync
        else:
            col /= norm + epsilon
        if i + 1 < r:
            rest = matrices[:, :, i + 1 :]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col


# --------------------------------------------------------------------------- the aggregator


class PowerSGD(Aggregator):
    """PowerSGD: every matrix-shaped tensor averaged as a rank-r product, the rest dense.

    Attributes:
        plan: the :class:`LowRankPlan` of ``options.shapes``.
        q_memory: every matrix's mean ``Q`` of the last step (the warm start), flat in the
            plan's order; None before the first step.
        generator: the CPU generator the random ``Q`` factors are drawn from.
    """

    name = "powersgd"
    flags_ride = True
    Options = PowerSGDOptions
    sends_all = True  # no k: the rank sets the message
    takes_shapes = True
    options: PowerSGDOptions

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: PowerSGDOptions, world_size: int, *,
        step: int | None = None,
    ) -> Traffic:
        """A ring all-reduce each of the dense tensors, every P and every Q (float32 values;
        an empty one is not sent), the first with the ranks' ``P`` non-finite flags at its
        end, the same at every step."""
        assert options.shapes is not None, "resolve the options first (build_options)"
        plan = plan_lowrank(options.shapes, options.rank, options.min_compression_rate)
        out, flags = Traffic.none(world_size), world_size
        for numel in (plan.dense_numel, plan.p_numel, plan.q_numel):
            if numel:
                out = out + ring_allreduce(4 * (numel + flags), world_size)
                flags = 0
        return out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        opts = self.options
        assert opts.shapes is not None, "resolve the options first (build_options)"
        self.plan = plan_lowrank(opts.shapes, opts.rank, opts.min_compression_rate)
        self.q_memory: torch.Tensor | None = None
        self.generator = torch.Generator().manual_seed(opts.seed)

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        accumulated, bad = self._begin_riding(grad)  # a_p = e_p + g_p (+ momentum)
        plan, world = self.plan, self.world_size
        drawn_from = self.generator.get_state()  # a skipped step draws nothing
        with self._timed("compress"):
            matrices = [accumulated[f.offset : f.offset + f.n * f.m].view(1, f.n, f.m)
                        for f in plan.factors]
            # the ranks' flags ride at the end of the first all-reduce: the dense tensors',
            # or every P's when there are none
            flags = self._flag_slots(bad, accumulated.dtype, accumulated.device)
            with_dense = plan.dense_numel > 0
            dense = torch.cat([*(accumulated[o : o + n] for o, n in plan.dense), flags])
            queries, q_previous = self._queries(accumulated)  # orthogonalised Q
            p_sent = accumulated.new_empty(plan.p_numel + (0 if with_dense else world))
            p_flat = p_sent[: plan.p_numel]
            if not with_dense:
                p_sent[plan.p_numel :] = flags
            ps = self._views(p_flat, "p")
            for m_, q, p in zip(matrices, queries, ps, strict=True):
                torch.bmm(m_, q, out=p)  # P = M Q
        first = self.comm.allreduce_backend(dense if with_dense else p_sent)  # in place
        skipped = self._guard(grad, self._flags_of(first))
        if skipped is not None:
            self.generator.set_state(drawn_from)
            return skipped
        if with_dense and plan.p_numel:
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
            # a copy: orthogonalised in place, and the memory stays for a skipped step
            flat = self.q_memory.to(like.device, like.dtype, copy=True)  # type: ignore[union-attr]
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
