"""What every aggregator shares: the step contract, rank agreement, the non-finite guard and
the recording of each step's statistics (:class:`~gssgd.aggregators.base.StepStats`).

The algorithms themselves live one per module; each one's ``step`` shows its compression,
communication and error feedback in order. The error feedback is a rule object the options
choose (:mod:`gssgd.aggregators.feedback`); this base only supplies the bookkeeping, and
the one step every sparse method shares: a density warm-up step whose own message would
send more than dense's all-reduce goes as that all-reduce instead
(:meth:`Aggregator.sends_dense_at`, :meth:`Aggregator._dense_warmup_step`), so no warm-up
step costs more than an uncompressed step.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from gssgd.aggregators.options import CommonOptions, DensityWarmup
from gssgd.comm import (
    CONTROL_BYTES,
    CommStats,
    Communicator,
    Traffic,
    allgather,
    completed_future,
    ring_allreduce,
)
from gssgd.selection import topk_indices
from gssgd.sketch import HashCache

__all__ = [
    "Aggregator",
    "StepStats",
    "all_finite",
    "flag_mask_words",
    "flagged_allreduce",
    "index_dtype",
    "present_in",
    "state_dtype",
]


def index_dtype(d: int) -> torch.dtype:
    """Indices travel as int32 when ``d < 2^31``, else int64."""
    return torch.int32 if d < 2**31 else torch.int64


def state_dtype(grad_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the residual and momentum of a ``grad_dtype`` gradient: at least float32.

    A float16/bfloat16 gradient (a ``model.half()`` or bfloat16 model) keeps its error
    feedback in float32, where the small coordinates a residual collects for many steps
    are not rounded away; float32 and float64 gradients keep their own dtype.
    """
    return torch.promote_types(grad_dtype, torch.float32)


def all_finite(x: torch.Tensor) -> bool:
    """Whether every element is finite: one sum (any NaN/Inf makes it non-finite), and the
    exact element-wise check only when the sum is not finite (it may just have overflowed)."""
    return bool(torch.isfinite(x.sum())) or bool(torch.isfinite(x).all())


def flag_mask_words(world_size: int, itemsize: int) -> int:
    """How many integers of ``itemsize`` bytes hold one bit per rank: the ranks' non-finite
    flags as a method that merges or relays lists carries them (:meth:`Aggregator._flag_mask`:
    ``8 * itemsize - 1`` bits a word, the sign bit unused)."""
    return -(-world_size // (8 * itemsize - 1))


def flagged_allreduce(d: int, world_size: int, itemsize: int = 4) -> Traffic:
    """A ring all-reduce of ``d`` values and the ranks' ``P`` non-finite flags riding at its
    end: dense's step, and a density warm-up step sent dense
    (:meth:`Aggregator.sends_dense_at`)."""
    return ring_allreduce((d + world_size) * itemsize, world_size, itemsize)


def present_in(indices: torch.Tensor, d: int, *more: torch.Tensor) -> torch.Tensor:
    """A d-long mask, True at ``indices`` (and at each of ``more``): the union of index
    lists in one scatter, and ``mask[other]`` what ``torch.isin(other, indices)`` answers
    by sorting (10-20x slower on CPU for long lists)."""
    mask = torch.zeros(d, dtype=torch.bool, device=indices.device)
    for found in (indices, *more):
        mask[found.to(torch.int64)] = True
    return mask



def _field_hash(value: object) -> int:
    digest = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # fits in int64


class Aggregator:
    """Base class: ``update = agg.step(grad)`` is a collective over the process group.

    Subclasses set ``name`` and ``Options`` and implement ``step`` with, in order:
    ``self._begin(grad)`` (agreement, non-finite guard), compression, communication through
    ``self.comm``, ``self.feedback.keep(...)`` (what the rank keeps) and
    ``self._finish(...)``. The built-in methods send the ranks' non-finite flags inside their
    first message instead (:attr:`flags_ride`): ``self._begin_riding(grad)``, then
    ``self._guard`` once the flags are in.

    Args:
        d: gradient length.
        k: coordinates per rank (``d`` for dense).
        options: the method's validated options dataclass.
        group: process group (None: the default group).
        hashes: the :class:`~gssgd.sketch.HashCache` its sketches keep their hash tables in
            (None: one of its own); pass one to several aggregators of the same sketch shape
            to keep one copy of the tables.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type[CommonOptions]] = CommonOptions
    has_residual: ClassVar[bool] = True
    #: True for a method whose message is not k coordinates, so it takes no ``k``/density
    #: (its k is d: the update is dense): dense, which sends every coordinate, and
    #: PowerSGD, whose rank sets its message.
    sends_all: ClassVar[bool] = False
    #: False for a method that averages the gradient exactly (dense): nothing to pair an
    #: optimizer recipe with, no error feedback. True for every compressor, PowerSGD
    #: included.
    compresses: ClassVar[bool] = True
    #: True for a method that compresses each tensor of the vector by its shape (PowerSGD):
    #: its options have a ``shapes`` field, which the DDP hook and ``gssgd train`` fill with
    #: the parameters' shapes in the vector's order.
    takes_shapes: ClassVar[bool] = False
    #: True for a method whose messages carry every rank's non-finite flag (an all-reduced
    #: payload has ``P`` more values, :meth:`_flag_slots`; a list merged or relayed, a few
    #: more integers, :meth:`_flag_mask`), so no control all-gather starts its step (every
    #: built-in method); False: :meth:`_begin` all-gathers the flags.
    flags_ride: ClassVar[bool] = False
    #: True for a method whose :meth:`start_step` returns as soon as its one collective is
    #: started (dense): a DDP hook returns that future and the backward goes on. False:
    #: :meth:`start_step` runs the whole step first (a hook overlaps it on a thread instead).
    starts_async: ClassVar[bool] = False

    def __init__(
        self,
        d: int,
        k: int,
        options: CommonOptions,
        group: dist.ProcessGroup | None = None,
        hashes: HashCache | None = None,
    ) -> None:
        self.d, self.k, self.options = d, k, options
        self.hashes = HashCache() if hashes is None else hashes
        self.comm = Communicator(group)
        self.rank, self.world_size = self.comm.rank, self.comm.world_size
        #: the error-feedback rule the options chose, with this rank's feedback state
        self.feedback = options.make_feedback()
        self.steps = 0
        #: the k of the current step: ``k``, or less far into a density warm-up
        self.step_k = k
        self._warmup = DensityWarmup(
            d, k, getattr(options, "warmup_steps", 0), getattr(options, "warmup_density", 1.0)
        )
        self.consecutive_skips = 0
        self._agreed = False
        self._timings = {"compress": 0.0, "decompress": 0.0}
        self._grad_dtype = torch.float32  # the dtype of the step's gradient (and update)
        self.last_stats = StepStats(k=k, d=d)

    # ---------------------------------------------------------------- contract
    def step(self, grad: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def start_step(self, grad: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """:meth:`step` as a future of its update. Here the step runs before the future is
        returned; a method with one collective (:attr:`starts_async`) returns as soon as it
        is started and finishes the step when it completes."""
        return completed_future(self.step(grad))

    @classmethod
    def traffic(
        cls, d: int, k: int, options: CommonOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """What one step after the first moves on ``world_size`` ranks, without running it.

        The method's own message (:meth:`message_traffic`), or, for a density warm-up step
        whose message would send more than dense's all-reduce, that all-reduce
        (:meth:`sends_dense_at`). It must equal what ``last_stats`` reports (tests check
        this for every method), and the cost model reads it.

        ``step`` is the 0-based aggregation step: during a density warm-up it fixes the
        step's k (:meth:`k_at_step`) and, for the sketching methods, its larger sketch; None
        (the default) is the steady state, after any warm-up. The first step also moves
        the rank-agreement check (an all-gather of one int64 per agreement field), which
        this leaves out.

        Raises:
            NotImplementedError: the method does not describe its traffic.
        """
        if cls.sends_dense_at(d, k, options, world_size, step):
            return flagged_allreduce(d, world_size)
        return cls.message_traffic(d, k, options, world_size, step=step)

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: CommonOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """What one step of the method's own message pattern moves on ``world_size`` ranks:
        the override a method writes (:meth:`traffic` adds the dense warm-up step).

        As :mod:`gssgd.comm` formulas, control messages included (a step that does not
        carry the ranks' non-finite flags in its payload starts with their all-gather:
        :meth:`control_traffic`); values are counted as float32. Payload bytes are what
        each rank's process puts on the wire, data a ring forwards for others included.
        ``step`` as :meth:`traffic`'s. A subclass that does not override it (or
        :meth:`traffic`) cannot be predicted by the cost model.

        Raises:
            NotImplementedError: the method does not describe its traffic.
        """
        raise NotImplementedError(
            f"{cls.__name__} does not describe its traffic; override the classmethod "
            "message_traffic(d, k, options, world_size, *, step=None) to let the cost model "
            "predict it."
        )

    @classmethod
    def sends_dense_at(cls, d: int, k: int, options: CommonOptions, world_size: int,
                       step: int | None) -> bool:
        """Whether aggregation step ``step`` is a density warm-up step whose own message
        would put more bytes on the busiest rank's wire than dense's all-reduce of the ``d``
        values (:func:`flagged_allreduce`), so that it goes as that all-reduce
        (:meth:`_dense_warmup_step`). A warm-up from 25 % sends ``P`` ranks' large k:
        local Top-k's all-gather costs more than dense from ``k_t > d / P`` on, Sketched-SGD's
        server replies sooner still. Steady steps (``k_t = k``) always send the method's
        message: what they cost is the method's own answer."""
        if step is None or world_size < 2 or cls.k_at_step(d, k, options, step) == k:
            return False
        own = cls.message_traffic(d, k, options, world_size, step=step)
        return max(own.sent) > max(flagged_allreduce(d, world_size).sent)

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The keyword options the method takes: its options dataclass's fields, and ``k``
        for a method that sends k coordinates (``density`` aside, which every path takes
        as its own argument)."""
        names = tuple(f.name for f in fields(cls.Options))
        return names if cls.sends_all else (*names, "k")

    @staticmethod
    def k_at_step(d: int, k: int, options: CommonOptions, step: int | None) -> int:
        """The k that aggregation step ``step`` sends under the options' density warm-up
        (``k`` itself after the warm-up, without one, or for ``step=None``)."""
        if step is None:
            return k
        steps = getattr(options, "warmup_steps", 0)
        return DensityWarmup(d, k, steps, getattr(options, "warmup_density", 1.0)).k_at(step)

    @classmethod
    def control_traffic(cls, world_size: int) -> Traffic:
        """The all-gather of the 4-byte non-finite flag that starts the step of a method
        whose flags do not ride in its messages (:meth:`_begin`): gloo's ring all-gather, so
        each rank sends and receives ``(P - 1) * 4`` bytes; nothing for a method whose flags
        ride with its first collective (:attr:`flags_ride`, every built-in method)."""
        if cls.flags_ride:
            return Traffic.none(world_size)
        return allgather(CONTROL_BYTES, world_size)

    def agreement_fields(self) -> dict[str, Any]:
        """What all ranks must agree on before the first update."""
        return {
            "method": self.name,
            "d": self.d,
            "k": self.k,
            "options": self.options.as_dict(),
            "world_size": self.world_size,
        }

    # ---------------------------------------------------------------- step pieces
    def _begin(self, grad: torch.Tensor, bad_ranks: list[int] | None = None
               ) -> torch.Tensor | None:
        """Validate ``grad``, check rank agreement once, and apply the non-finite guard.

        Args:
            grad: this rank's whole gradient.
            bad_ranks: the ranks whose gradient is not finite, when a collective of the step
                already carried every rank's flag (streaming gs sends them with its last
                region); None: all-gather the flags here (:meth:`control_traffic`).

        Returns:
            None to go on with the step, or the all-zero update of a skipped step.

        Raises:
            ValueError: wrong shape, or ranks disagree.
            FloatingPointError: non-finite gradient with ``nonfinite="raise"``, or too many
                consecutive skips.
        """
        self._start(grad)
        if bad_ranks is None:
            with self._timed("compress"):
                bad_here = torch.tensor(
                    [0 if all_finite(grad) else 1], dtype=torch.int32, device=grad.device
                )
            bad_anywhere = (self.comm.allgather_backend(bad_here) if self.world_size > 1
                            else [bad_here])
            bad_ranks = [r for r, flag in enumerate(bad_anywhere) if int(flag)]
        return self._guard(grad, bad_ranks)

    def _start(self, grad: torch.Tensor) -> None:
        """Validate ``grad``, check rank agreement once, and start the step's clocks and
        statistics (:meth:`_begin` without the non-finite guard, for a method whose flags
        ride with its payload: it calls :meth:`_guard` once its first collective is in).

        Raises:
            ValueError: wrong shape, or ranks disagree.
        """
        if grad.dim() != 1 or grad.numel() != self.d:
            raise ValueError(
                f"{self.name}.step expects a 1-D gradient of length d={self.d}, got shape "
                f"{tuple(grad.shape)}; flatten and concatenate the gradients first."
            )
        if not grad.dtype.is_floating_point:
            raise ValueError(f"gradient dtype {grad.dtype} is not floating point")
        self._grad_dtype = grad.dtype
        if not self._agreed:  # a check of the launch, not the method's traffic: its bytes
            self._check_agreement(grad.device)  # are no step's (a resumed run's fresh
            self._agreed = True  # aggregator checks again and counts what the first did)
        self.comm.take_stats()
        self.step_k = self._warmup.k_at(self.steps)
        self._timings = {"compress": 0.0, "decompress": 0.0}
        self._step_start = time.perf_counter()

    def _begin_riding(self, grad: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Start a step whose messages carry the ranks' non-finite flags (:attr:`flags_ride`):
        :meth:`_start`, then this rank's error-compensated vector ``a_p`` and whether its
        gradient is not finite.

        A rank whose gradient is not finite compensates zeros in its place, so the messages
        it sends until every rank has read the flags are well formed (the others merge and
        select on them); the step is then skipped on every rank (:meth:`_guard`).
        ``compensate`` changes no state and nothing else does before :meth:`_guard` passes,
        so the skip leaves no trace.

        Raises:
            ValueError: wrong shape, or ranks disagree.
        """
        self._start(grad)
        with self._timed("compress"):
            bad = not all_finite(grad)
            accumulated = self._error_compensated(torch.zeros_like(grad) if bad else grad)
        return accumulated, bad

    def _guard(self, grad: torch.Tensor, bad_ranks: list[int]) -> torch.Tensor | None:
        """The non-finite guard, once every rank's flag is known (``bad_ranks``, the same
        list on every rank): None to go on with the step (the rule stores what this step's
        ``compensate`` computed: ``feedback.commit_step``), else :meth:`nonfinite_step`'s
        update."""
        if not bad_ranks:
            self.consecutive_skips = 0
            self.feedback.commit_step()
            return None
        return self.nonfinite_step(grad, bad_ranks)

    def _flag_slots(self, bad: bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``P`` values of ``dtype`` to send at the end of a summed payload: 1 at this rank's
        place if its gradient is not finite (``bad``), else 0 everywhere. Summed by an
        all-reduce, they tell every rank which ranks were bad (:meth:`_flags_of`)."""
        flags = torch.zeros(self.world_size, dtype=dtype, device=device)
        if bad:
            flags[self.rank] = 1
        return flags

    def _flags_of(self, summed: torch.Tensor) -> list[int]:
        """The ranks whose flag is set in the last ``P`` values of a summed payload that
        carried :meth:`_flag_slots`."""
        return summed[-self.world_size:].nonzero().flatten().tolist()

    def _flags_in_lists(self, messages: list[torch.Tensor]) -> list[int]:
        """The ranks whose flag is set in the last entry of their gathered message (each
        rank's list, by rank, ending with its flag: local Top-k's indices, Sketched-SGD's
        sketches)."""
        return self._flags_of(torch.stack([message[-1] for message in messages]))

    def _flag_mask(self, bad_ranks: list[int], dtype: torch.dtype, device: torch.device
                   ) -> torch.Tensor:
        """The ranks' non-finite flags as bits (:func:`flag_mask_words` integers of
        ``dtype``, an index dtype), set for ``bad_ranks``: what a method whose lists are
        merged or relayed (gTop-k, Sketched-SGD) appends to its index message. Masks combine
        by ``|`` (:meth:`_ranks_in_mask` reads one), and stay a few bytes at any P."""
        bits = 8 * dtype.itemsize - 1
        words = [0] * flag_mask_words(self.world_size, dtype.itemsize)
        for rank in bad_ranks:
            words[rank // bits] |= 1 << (rank % bits)
        return torch.tensor(words, dtype=dtype, device=device)

    def _ranks_in_mask(self, mask: torch.Tensor) -> list[int]:
        """The ranks whose bit :meth:`_flag_mask` set in ``mask`` (masks OR-ed together)."""
        bits = 8 * mask.dtype.itemsize - 1
        return [w * bits + b for w, word in enumerate(mask.tolist()) for b in range(bits)
                if word >> b & 1]

    # ---------------------------------------------------------------- a warm-up step sent dense
    def _sends_dense_now(self) -> bool:
        """Whether the step about to run is a warm-up step sent dense (:meth:`sends_dense_at`
        of this aggregator's next step)."""
        return self.sends_dense_at(self.d, self.k, self.options, self.world_size, self.steps)

    def _dense_warmup_step(self, grad: torch.Tensor) -> torch.Tensor:
        """A density warm-up step sent as dense's all-reduce (:meth:`sends_dense_at`).

        Steps (per rank p):
            1. Accumulate ``a_p`` as the method does (its error-feedback rule).
            2. Contribute: the d-long vector of what the method's message would carry,
               :meth:`_warmup_contribution` (local and global Top-k: ``a_p``'s own top
               ``k_t``, zeros elsewhere; the sketching methods: all of ``a_p``, whose sketch
               and exact round sum every coordinate), the ranks' non-finite flags riding at
               its end (:meth:`_flag_slots`), as dense sends them.
            3. All-reduce it with the backend's ring: dense's bytes and rounds, no more.
            4. Select from the sum (:meth:`_warmup_selection`: everything delivered for
               local Top-k; the top ``k_t`` of the exact sum for gTop-k and the sketching
               methods, which their merges and sketches approximate), update = those sums
               / P; error feedback keeps what was not delivered: a coordinate of ``a_p`` is
               delivered when it was contributed and selected.

        Local Top-k's update is the sparse step's own (only the summation order differs);
        gTop-k's and the sketching methods' is the exact answer their step approximates.
        A step some rank skips leaves the rule's state as it was (:meth:`_begin_riding`).
        """
        accumulated, bad = self._begin_riding(grad)
        d, k, world = self.d, self.step_k, self.world_size
        with self._timed("compress"):
            own = self._warmup_contribution(accumulated, k)
            payload = accumulated.new_zeros(d + world)
            if own is None:
                payload[:d] = accumulated
            else:
                payload[own] = accumulated[own]
            payload[d:] = self._flag_slots(bad, payload.dtype, payload.device)
        summed = self.comm.allreduce_backend(payload)
        skipped = self._guard(grad, self._flags_of(summed))
        if skipped is not None:
            return skipped
        with self._timed("decompress"):
            total = summed[:d]
            chosen = self._warmup_selection(total, k)
            update = torch.zeros_like(accumulated)  # in the residual's dtype
            if chosen is None:  # every contributed coordinate
                update.copy_(total).div_(world)
                delivered = own if own is not None else torch.arange(d, device=grad.device)
            else:
                update[chosen] = total[chosen] / world
                # contributed and selected
                delivered = chosen if own is None else own[present_in(chosen, d)[own]]
            self.feedback.keep(accumulated, delivered)
        return self._finish(update)

    def _warmup_contribution(self, accumulated: torch.Tensor, k: int) -> torch.Tensor | None:
        """The coordinates of ``a_p`` a warm-up step sent dense contributes: here its own
        top ``k`` (what a sparse method's message carries); None: all of them."""
        return topk_indices(accumulated.abs(), k)

    def _warmup_selection(self, total: torch.Tensor, k: int) -> torch.Tensor | None:
        """The coordinates of the all-reduced contributions ``total`` that a warm-up step sent
        dense delivers: here the top ``k`` of the sum (gTop-k's merges and the sketching
        methods' recovery approximate it); None: every one (local Top-k)."""
        return topk_indices(total.abs(), k)

    def nonfinite_step(self, grad: torch.Tensor, bad_ranks: list[int]) -> torch.Tensor:
        """Apply the ``nonfinite`` policy to a step whose gradient is not finite on
        ``bad_ranks`` (known on every rank alike). No collectives; the residual and momentum
        are left as they were.

        Returns:
            "skip": an all-zero update (the step counts as taken). "propagate": an all-NaN
            update, the same on every rank, so a ``torch.amp.GradScaler`` finds the
            overflow on every rank and skips ``optimizer.step`` (the step does not count).

        Raises:
            FloatingPointError: ``nonfinite="raise"``, or ``max_consecutive_skips`` reached.
        """
        self._grad_dtype = grad.dtype
        self.feedback.drop_step()
        self.consecutive_skips += 1
        where = f"step {self.steps}: non-finite gradient (NaN or Inf) on rank(s) {bad_ranks}"
        if self.options.nonfinite == "raise":
            raise FloatingPointError(
                f"{where}; every rank stops (nonfinite='raise'). Lower the learning rate, "
                "clip gradients, or pass nonfinite='skip' to skip such steps."
            )
        if self.consecutive_skips >= self.options.max_consecutive_skips:
            raise FloatingPointError(
                f"{where}; {self.consecutive_skips} consecutive steps were skipped "
                f"(max_consecutive_skips={self.options.max_consecutive_skips}), so the model "
                "has probably diverged. Resume from an earlier checkpoint with a lower "
                "learning rate or a higher density."
            )
        self._record(skipped=True)
        if self.options.nonfinite == "propagate":
            return torch.full_like(grad, float("nan"))
        self.steps += 1
        return torch.zeros_like(grad)

    @property
    def residual(self) -> torch.Tensor | None:
        """This rank's residual ``e`` (None before the first step, or for a rule that keeps
        none)."""
        return self.feedback.residual

    @residual.setter
    def residual(self, value: torch.Tensor | None) -> None:
        self.feedback.residual = value

    @property
    def momentum_buffer(self) -> torch.Tensor | None:
        """The rule's velocity: each rank's own ("ef" with momentum, "ef21"), or alike on
        every rank ("global"'s, "onebit"'s shared ``m``); None without one."""
        return self.feedback.velocity

    @momentum_buffer.setter
    def momentum_buffer(self, value: torch.Tensor | None) -> None:
        self.feedback.velocity = value

    def _error_compensated(self, grad: torch.Tensor) -> torch.Tensor:
        """The vector to compress: the gradient in the state's dtype (at least float32),
        with ``local_clip`` first scaled to an l2 norm of at most ``local_clip / sqrt(P)``
        (DGC's local gradient clipping), through the error-feedback rule's
        :meth:`~gssgd.aggregators.feedback.ErrorFeedback.compensate`."""
        clip = getattr(self.options, "local_clip", None)
        if clip is not None:
            limit = clip / math.sqrt(self.world_size)
            norm = float(torch.linalg.vector_norm(grad))
            if norm > limit:
                grad = grad * (limit / norm)
        return self.feedback.compensate(grad.to(state_dtype(grad.dtype)))

    @contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        """Add the wall time of the block to ``compress`` or ``decompress``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._timings[phase] += time.perf_counter() - start

    def _finish(
        self, update: torch.Tensor, delivered_fraction: float | None = None
    ) -> torch.Tensor:
        """Count the step, record its statistics, and return what the error-feedback rule
        makes of ``update`` (:meth:`~gssgd.aggregators.feedback.ErrorFeedback.returned`:
        EF21's estimate, the global velocity, ...) in the gradient's dtype (sparse methods
        build it in the residual's dtype)."""
        self.steps += 1
        self.feedback.commit_step()  # a rule whose own keep did not store it
        self._record(skipped=False, delivered_fraction=delivered_fraction)
        return self.feedback.returned(update).to(self._grad_dtype)

    def rescale(self, factor: float) -> None:
        """Multiply the error feedback's state by ``factor``.

        Under ``torch.amp.GradScaler`` the gradients arrive multiplied by the loss scale,
        so the error feedback is kept in the same scaled units; when the scaler changes its
        scale, the hook rescales the state by ``new / old`` (a power of two with the
        scaler's default factors, so exact) and no mass is gained or lost.
        """
        self.feedback.rescale(factor)

    def _record(self, skipped: bool, delivered_fraction: float | None = None) -> None:
        self.last_stats = StepStats.of_comm(
            self.comm.take_stats(),
            seconds_compress=self._timings["compress"],
            seconds_decompress=self._timings["decompress"],
            k=self.step_k,
            d=self.d,
            skipped=skipped,
            delivered_fraction=delivered_fraction,
            audited_recall=self._audit_of_step(),
        )

    def _audit_of_step(self) -> float | None:
        """The recall this step's collapse-guard audit found (gs-SGD's); None without one."""
        return None

    # ---------------------------------------------------------------- agreement
    def _check_agreement(self, device: torch.device) -> None:
        """All-gather a hash per agreement field; name every field that differs.

        Raises:
            ValueError: on every rank, naming the fields and the ranks that differ.
        """
        fields_ = self.agreement_fields()
        names = sorted(fields_)
        mine = torch.tensor(
            [_field_hash(fields_[n]) for n in names], dtype=torch.int64, device=device
        )
        if self.world_size == 1:
            return
        everyone = self.comm.allgather_backend(mine)
        differing = []
        for i, n in enumerate(names):
            values = [int(t[i]) for t in everyone]
            if len(set(values)) > 1:
                groups: dict[int, list[int]] = {}
                for r, v in enumerate(values):
                    groups.setdefault(v, []).append(r)
                ranks = "; ".join(f"ranks {g}" for g in groups.values())
                differing.append(f"{n} (this rank {self.rank}: {fields_[n]!r}; groups: {ranks})")
        if differing:
            raise ValueError(
                "ranks disagree on the aggregator configuration: "
                + ", ".join(differing)
                + ". Launch every rank with the same method, density/k, options and seed."
            )

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """This rank's state for resume: residual, momentum buffer, counters."""
        sd: dict[str, Any] = {
            "method": self.name,
            "d": self.d,
            "k": self.k,
            "steps": self.steps,
            "consecutive_skips": self.consecutive_skips,
        }
        feedback = self.feedback.state_dict()
        residual = feedback.pop("residual", None)
        if self.has_residual:
            sd["residual"] = residual if residual is not None else torch.zeros(self.d)
        sd.update(feedback)
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (of the same method, d and k).

        Raises:
            ValueError: the state was saved by another method or for another size.
        """
        for key, want in (("method", self.name), ("d", self.d), ("k", self.k)):
            if sd.get(key) != want:
                raise ValueError(
                    f"cannot load aggregator state: {key}={sd.get(key)!r} in the state but "
                    f"{want!r} here; resume with the same method, model and density."
                )
        self.steps = int(sd.get("steps", 0))
        self.consecutive_skips = int(sd.get("consecutive_skips", 0))
        if self.has_residual and "residual" in sd:
            residual = sd["residual"]
            if tuple(residual.shape) != (self.d,):
                raise ValueError(
                    f"residual has shape {tuple(residual.shape)}, expected ({self.d},)"
                )
        elif "residual" in sd:
            sd = {key: value for key, value in sd.items() if key != "residual"}
        self.feedback.load_state_dict(sd)


@dataclass
class StepStats:
    """What one ``step`` cost this rank.

    Attributes:
        bytes_sent, bytes_received: payload bytes this rank's process put on the wire and
            took off it, control messages and data forwarded for other ranks included
            (gloo's preambles are not payload: :func:`gssgd.comm.wire_overhead`).
        messages, messages_received: point-to-point messages this rank sent and received.
        rounds: sequential communication steps on the critical path.
        seconds_compress: time spent selecting/sketching before communication.
        seconds_communicate: time inside collectives.
        seconds_decompress: time spent after communication (recovery, update, residual).
        k, d: coordinates sent per rank, and the vector length.
        skipped: True when the step was skipped for a non-finite gradient.
        delivered_fraction: for sparse methods, the share of the global accumulated mass
            (squared l2) that this step delivered, where the method can measure it; else None.
        audited_recall: gs-SGD on a step its collapse guard audited: the delivered share
            of the mass exact global top-k would have delivered (the guard's bar is
            ``min_recall``; see :mod:`gssgd.aggregators.gs`); else None.
        seconds_blocked: a DDP hook's iteration only: the wall time its calls held the
            backward pass (what the step paid; the seconds above also count work a hook
            overlapped with backward); None for an aggregator's step.
    """

    bytes_sent: int = 0
    bytes_received: int = 0
    messages: int = 0
    rounds: int = 0
    messages_received: int = 0
    seconds_compress: float = 0.0
    seconds_communicate: float = 0.0
    seconds_decompress: float = 0.0
    k: int = 0
    d: int = 0
    skipped: bool = False
    delivered_fraction: float | None = None
    audited_recall: float | None = None
    seconds_blocked: float | None = None

    @classmethod
    def of_comm(cls, counted: CommStats, *, timed: bool = True, **rest: Any) -> StepStats:
        """A step's statistics from what its collectives counted (bytes, messages, rounds
        and, when ``timed``, their seconds: an asynchronous launch times them itself) and
        the ``rest`` of the fields."""
        return cls(bytes_sent=counted.bytes_sent, bytes_received=counted.bytes_received,
                   messages=counted.messages, messages_received=counted.messages_received,
                   rounds=counted.rounds,
                   seconds_communicate=counted.seconds if timed else 0.0, **rest)
