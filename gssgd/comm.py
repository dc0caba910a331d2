"""Collectives with exact byte, message, round and time accounting.

Every byte an aggregator moves goes through a :class:`Communicator`, which counts, per
rank, the payload bytes its process puts on the wire and takes off it under the algorithm's
own message pattern, data it forwards for other ranks included:

* **recursive doubling** (:meth:`Communicator.recursive_doubling`): ``log2 P`` rounds in
  which rank ``p`` exchanges its payload with ``p XOR 2^i`` and combines the two. For a world
  size that is not a power of two, the ranks past the largest power of two ``P2`` first
  *fold in* (send their payload to rank ``p - P2``, which combines it into its own) and
  *receive the result last*. Used for the dense sketch all-reduce of gs-SGD and for gTop-k's
  sparse merges.
* **star** (:meth:`Communicator.gather_to_root`, :meth:`Communicator.broadcast_from_root`):
  every rank talks to rank 0 alone, as Sketched-SGD's parameter server does.
* **backend** (:meth:`Communicator.allreduce_backend`, :meth:`Communicator.allgather_backend`):
  the process group's own collective, counted as gloo's rings carry it: an all-reduce of
  ``n`` bytes sends and receives about ``2(P-1)/P * n`` (exactly: its segments, see
  :func:`ring_allreduce`), an all-gather ``(P-1) * n`` each way (a rank forwards the
  others' blocks).

``rounds`` counts the sequential communication steps on the algorithm's critical path (the
same on every rank), ``messages`` and ``messages_received`` the point-to-point messages
this rank sent and received (one per tensor, or per gloo segment or chunk), and ``seconds``
the wall time spent inside collectives. On the wire gloo adds :data:`HEADER_BYTES` per
message and direction taken (:func:`wire_overhead`); they are not payload, and not in the
byte counts.

The same patterns as formulas (:class:`Traffic`, :func:`ring_allreduce`,
:func:`allgather`, :func:`recursive_doubling`, :func:`star_gather`,
:func:`star_broadcast`) predict what a step moves without running it; each aggregator's
``traffic`` classmethod composes them into its own message pattern, and the cost model and
the training metrics read them from there. The backend collectives count themselves with
these same formulas (:meth:`Communicator._count`), and the point-to-point ones are checked
against them on real processes (tests/test_methods.py), so the two cannot disagree. This
module is the one place every byte formula lives.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from gssgd.simulated import SimulatedRank
from gssgd.transport import DistTransport, Transport

__all__ = [
    "CONTROL_BYTES",
    "GLOO_MAX_SEGMENT_BYTES",
    "HEADER_BYTES",
    "CommStats",
    "Communicator",
    "RecursiveDoublingPlan",
    "Traffic",
    "allgather",
    "completed_future",
    "gloo_ring_segments",
    "new_future",
    "recursive_doubling",
    "recursive_doubling_plan",
    "ring_allreduce",
    "ring_allreduce_bytes",
    "star_broadcast",
    "star_gather",
    "wire_overhead",
    "world_size_of",
]

Payload = list[torch.Tensor]


@dataclass
class CommStats:
    """What one rank's collectives cost: payload bytes, messages, rounds and seconds."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages: int = 0
    rounds: int = 0
    messages_received: int = 0
    seconds: float = 0.0

    def add(self, other: CommStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass(frozen=True)
class RecursiveDoublingPlan:
    """Who a rank talks to in recursive doubling over ``world_size`` ranks.

    Attributes:
        world_size: the number of ranks.
        power: the largest power of two ``<= world_size`` (the ranks that do the doubling).
        fold_into: for a rank ``>= power``, the rank it folds into (``rank - power``), else None.
        folded_from: for a rank ``< world_size - power``, the extra rank folding into it.
        partners: the partner of each doubling round (empty for folded ranks).
    """

    world_size: int
    power: int
    fold_into: int | None
    folded_from: int | None
    partners: tuple[int, ...]

    @property
    def rounds(self) -> int:
        """Rounds on the critical path: log2(power), plus fold-in and result if P != power."""
        return (self.power.bit_length() - 1) + (2 if self.world_size != self.power else 0)


def recursive_doubling_plan(rank: int, world_size: int) -> RecursiveDoublingPlan:
    """The recursive-doubling schedule of ``rank`` among ``world_size`` ranks."""
    power = 1 << (world_size.bit_length() - 1)
    if rank >= power:
        return RecursiveDoublingPlan(world_size, power, rank - power, None, ())
    folded = rank + power if rank + power < world_size else None
    partners = tuple(rank ^ (1 << i) for i in range(power.bit_length() - 1))
    return RecursiveDoublingPlan(world_size, power, None, folded, partners)


#: Bytes of the int32 non-finite flag every aggregator step all-gathers first.
CONTROL_BYTES = 4

#: The bytes gloo puts in front of every message on the wire: the 48-byte preamble of its TCP
#: transport (``Op::preamble`` in gloo/transport/tcp/pair.h: six ``size_t`` fields). A message
#: between unbound buffers (every collective and send/recv of torch.distributed's gloo) is a
#: rendezvous of three of them: the sender's send-ready note and the preamble in front of the
#: payload go with the message, the receiver's recv-ready note goes back (``Pair::send``,
#: ``Pair::recv``). Measured with Linux's per-process write counter (``wchar`` in
#: /proc/self/io, tests/test_wire_bytes.py) around one step of every method at P = 3 and 16:
#: a process writes exactly its payload plus ``2 * 48`` bytes per message it sends and 48 per
#: message it receives: one preamble per message, however many ``writev`` calls its payload
#: takes. :func:`wire_overhead` is that sum; the cost model charges it (``critical_headers``).
HEADER_BYTES = 48

#: gloo's ring all-reduce cuts its buffer into segments of at most this many bytes
#: (``AllreduceOptions::kMaxSegmentSize``), and into at least two per rank.
GLOO_MAX_SEGMENT_BYTES = 1 << 20


def wire_overhead(messages: int, messages_received: int) -> int:
    """Bytes of gloo preambles a rank writes for ``messages`` sent and ``messages_received``
    received (:data:`HEADER_BYTES`: two per message sent, one per message received)."""
    return HEADER_BYTES * (2 * messages + messages_received)


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """The ideal ring figure ``floor(2(P-1)/P * n)``: what one rank sends (and receives), on
    average over the ranks, in a ring all-reduce of ``nbytes`` (a reduce-scatter and an
    all-gather of ``P-1`` steps each). gloo's segments make each rank's share differ from it
    by up to a segment (:func:`ring_allreduce` counts them exactly); this figure serves where
    the tensors are not known one by one (DDP's own buckets)."""
    return (2 * (world_size - 1) * nbytes) // world_size


@dataclass(frozen=True)
class Traffic:
    """What one step of a message pattern moves, for every rank.

    Attributes:
        sent, received: payload bytes per rank (index = rank), as :class:`Communicator`
            counts them: what each rank's process puts on the wire and takes off it, data it
            forwards for others included (a ring all-gather's).
        rounds: sequential communication steps on the critical path.
        critical_bytes: bytes on the busiest link, summed over the sequential phases, each
            phase counted in its busier direction (links are full duplex).
        messages, messages_received: point-to-point messages each rank sends and receives.
        critical_headers: gloo preambles (:data:`HEADER_BYTES` each) on the busiest link,
            summed over the phases like ``critical_bytes``: in a phase where a rank sends
            ``s`` messages and receives ``r``, its link carries ``2s + r`` preambles out and
            ``2r + s`` in.
    """

    sent: tuple[int, ...]
    received: tuple[int, ...]
    rounds: int
    critical_bytes: int
    messages: tuple[int, ...]
    messages_received: tuple[int, ...]
    critical_headers: int

    @classmethod
    def none(cls, world_size: int) -> Traffic:
        """Nothing moved: the start of a sum of phases."""
        zero = (0,) * world_size
        return cls(zero, zero, 0, 0, zero, zero, 0)

    @property
    def header_bytes(self) -> int:
        """Bytes of gloo preambles on the busiest link: ``HEADER_BYTES * critical_headers``."""
        return HEADER_BYTES * self.critical_headers

    def __add__(self, other: Traffic) -> Traffic:
        """The two patterns one after the other."""

        def both(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(x + y for x, y in zip(a, b, strict=True))

        return Traffic(
            both(self.sent, other.sent),
            both(self.received, other.received),
            self.rounds + other.rounds,
            self.critical_bytes + other.critical_bytes,
            both(self.messages, other.messages),
            both(self.messages_received, other.messages_received),
            self.critical_headers + other.critical_headers,
        )


def _phase(
    sent: Sequence[int], received: Sequence[int], rounds: int,
    messages: Sequence[int], messages_received: Sequence[int], critical_bytes: int | None = None,
) -> Traffic:
    """One phase of a pattern from its per-rank figures; its critical bytes (unless given)
    and preambles are the busiest rank's link in its busier direction."""
    if critical_bytes is None:
        critical_bytes = max(max(s, r) for s, r in zip(sent, received, strict=True))
    headers = max(
        max(2 * s + r, s + 2 * r) for s, r in zip(messages, messages_received, strict=True)
    )
    return Traffic(tuple(sent), tuple(received), rounds, critical_bytes, tuple(messages),
                   tuple(messages_received), headers)


def gloo_ring_segments(nbytes: int, world_size: int, itemsize: int = 4) -> list[int]:
    """The segment sizes of gloo's ring all-reduce of ``nbytes`` (gloo/allreduce.cc, ``ring``).

    Steps: ``count = roundUp(max(ceil(n / max_segment), 2P), P)`` segments of
    ``roundUp(ceil(n / count), itemsize)`` bytes each, the last ones shorter or empty; rank
    ``r`` owns segments ``[r * count/P, (r+1) * count/P)``.
    """
    p = world_size
    max_segment = itemsize * max(1, GLOO_MAX_SEGMENT_BYTES // itemsize)
    count = _round_up(max(-(-nbytes // max_segment), 2 * p), p)
    size = _round_up(-(-nbytes // count), itemsize)
    return [max(0, min(size, nbytes - i * size)) for i in range(count)]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def ring_allreduce(nbytes: int, world_size: int, itemsize: int = 4) -> Traffic:
    """The backend's all-reduce of ``nbytes`` in elements of ``itemsize`` bytes
    (:meth:`Communicator.allreduce_backend`): gloo's ring, counted segment by segment.

    In the reduce-scatter rank ``r`` sends rank ``r-1`` every segment but those of its own
    block, and in the all-gather every segment but those of block ``r-1``
    (:func:`gloo_ring_segments`); it receives what rank ``r+1`` sends. So a rank sends
    ``2n`` less two blocks: ``floor(2(P-1)/P * n)`` (:func:`ring_allreduce_bytes`) on
    average, a few bytes more or less where the last segments are short. One message per
    non-empty segment (at least two per ring step); ``2(P-1)`` rounds.
    """
    p = world_size
    if p == 1 or nbytes == 0:
        return Traffic.none(p)
    segments = gloo_ring_segments(nbytes, p, itemsize)
    per = len(segments) // p
    block = [sum(segments[b * per:(b + 1) * per]) for b in range(p)]
    count = [sum(1 for s in segments[b * per:(b + 1) * per] if s) for b in range(p)]
    total = sum(count)
    sent = [2 * nbytes - block[r] - block[r - 1] for r in range(p)]
    received = [2 * nbytes - block[(r + 1) % p] - block[r] for r in range(p)]
    messages = [2 * total - count[r] - count[r - 1] for r in range(p)]
    messages_received = [2 * total - count[(r + 1) % p] - count[r] for r in range(p)]
    return _phase(sent, received, 2 * (p - 1), messages, messages_received)


def allgather(nbytes: int, world_size: int) -> Traffic:
    """An all-gather of ``nbytes`` per rank (:meth:`Communicator.allgather_backend`): gloo's
    ring all-gather (gloo/allgather.cc). In each of ``P-1`` steps a rank forwards one rank's
    block to its successor, in two halves: it sends and receives ``(P-1) * n`` bytes in
    ``2(P-1)`` messages each way (its own block and ``P-2`` others' it passes on)."""
    p = world_size
    if p == 1:
        return Traffic.none(1)
    moved, messages = ((p - 1) * nbytes,) * p, (2 * (p - 1),) * p
    return _phase(moved, moved, p - 1, messages, messages)


def recursive_doubling(
    nbytes: int, world_size: int, result_extra: int = 0, *, tensors: int = 1,
    result_tensors: int | None = None,
) -> Traffic:
    """Recursive doubling of an ``nbytes`` payload (:meth:`Communicator.recursive_doubling`).

    ``log2 P2`` exchanges of ``n`` bytes with partner ``rank XOR 2^i``; with ``P != P2`` the
    ranks ``>= P2`` first send their payload to ``rank - P2`` and get the result (plus
    ``result_extra`` bytes, e.g. gTop-k's survival flags) back last: two more rounds. The
    payload is ``tensors`` messages, the result ``result_tensors`` (default: as many).
    """
    p, t = world_size, tensors
    back = t if result_tensors is None else result_tensors
    plan = recursive_doubling_plan(0, p)
    rounds, folded = len(plan.partners), p != plan.power
    out = _phase([nbytes * rounds if r < plan.power else 0 for r in range(p)],
                 [nbytes * rounds if r < plan.power else 0 for r in range(p)], plan.rounds,
                 [t * rounds if r < plan.power else 0 for r in range(p)],
                 [t * rounds if r < plan.power else 0 for r in range(p)])
    if not folded:
        return out
    extra = range(plan.power, p)
    fold_in = _one_way(p, extra, nbytes, t, to_partner=True)
    result = _one_way(p, extra, nbytes + result_extra, back, to_partner=False)
    return out + fold_in + result


def _one_way(p: int, extra: range, nbytes: int, tensors: int, to_partner: bool) -> Traffic:
    """A fold-in (``to_partner``: each extra rank sends to ``rank - P2``) or the result
    (the partner sends it back): one phase, no rounds of its own (the plan counts them)."""
    power = extra.start
    senders = set(extra) if to_partner else {r - power for r in extra}
    receivers = {r - power for r in extra} if to_partner else set(extra)
    sent = [nbytes if r in senders else 0 for r in range(p)]
    received = [nbytes if r in receivers else 0 for r in range(p)]
    return _phase(sent, received, 0, [tensors if r in senders else 0 for r in range(p)],
                  [tensors if r in receivers else 0 for r in range(p)])


def star_gather(nbytes: int, world_size: int, tensors: int = 1) -> Traffic:
    """Every other rank sends ``nbytes`` (``tensors`` messages) to rank 0
    (:meth:`Communicator.gather_to_root`): rank 0's link carries ``P-1`` copies. One round."""
    p = world_size
    sent = (0,) + (nbytes,) * (p - 1)
    received = ((p - 1) * nbytes,) + (0,) * (p - 1)
    messages = (0,) + (tensors,) * (p - 1)
    return _phase(sent, received, 1, messages, ((p - 1) * tensors,) + (0,) * (p - 1))


def star_broadcast(nbytes: int, world_size: int, tensors: int = 1) -> Traffic:
    """Rank 0 sends ``nbytes`` (``tensors`` messages) to every other rank, one by one
    (:meth:`Communicator.broadcast_from_root`): a star, not a tree. One round."""
    gather = star_gather(nbytes, world_size, tensors)
    return Traffic(gather.received, gather.sent, 1, gather.critical_bytes,
                   gather.messages_received, gather.messages, gather.critical_headers)


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Communicator:
    """Accounted collectives over one process group.

    Args:
        group: the process group (None: the default group), or a
            :class:`~gssgd.simulated.SimulatedRank` of a simulated world. The communicator
            works with group-local ranks; its transport
            (:class:`~gssgd.transport.DistTransport` or the simulated rank) moves the
            tensors, and the counting here is the same for both.

    Raises:
        RuntimeError: a real group is asked for but torch.distributed is not initialised.

    Attributes:
        rank, world_size: this process's rank in ``group`` and the group's size.
        stats: running :class:`CommStats`; :meth:`take_stats` returns and resets it.
    """

    def __init__(self, group: dist.ProcessGroup | SimulatedRank | None = None) -> None:
        self.group = group
        self.transport: Transport = (
            group if isinstance(group, SimulatedRank) else DistTransport(group)
        )
        self.rank = self.transport.rank
        self.world_size = self.transport.world_size
        self.stats = CommStats()

    def take_stats(self) -> CommStats:
        """Return the statistics gathered since the last call and start afresh."""
        out, self.stats = self.stats, CommStats()
        return out

    def count_rounds(self, rounds: int) -> None:
        """Record ``rounds`` sequential communication steps (for hand-written schedules)."""
        self.stats.rounds += rounds

    # ----------------------------------------------------------- point to point
    def send(self, tensors: Sequence[torch.Tensor], dst: int) -> None:
        """Send each tensor to group rank ``dst`` (one message per tensor)."""
        start = time.perf_counter()
        for t in tensors:
            self.transport.send(t, dst)
        self.stats.bytes_sent += _nbytes(tensors)
        self.stats.messages += len(tensors)
        self.stats.seconds += time.perf_counter() - start

    def recv(self, like: Sequence[torch.Tensor], src: int) -> Payload:
        """Receive tensors shaped like ``like`` from group rank ``src``."""
        start = time.perf_counter()
        out = [torch.empty_like(t) for t in like]
        for t in out:
            self.transport.recv(t, src)
        self.stats.bytes_received += _nbytes(out)
        self.stats.messages_received += len(out)
        self.stats.seconds += time.perf_counter() - start
        return out

    def exchange(self, tensors: Sequence[torch.Tensor], peer: int) -> Payload:
        """Send ``tensors`` to ``peer`` and receive same-shaped tensors from it, concurrently."""
        start = time.perf_counter()
        out = [torch.empty_like(t) for t in tensors]
        reqs = [self.transport.isend(t, peer) for t in tensors]
        for t in out:
            self.transport.recv(t, peer)
        for r in reqs:
            r.wait()
        self.stats.bytes_sent += _nbytes(tensors)
        self.stats.bytes_received += _nbytes(out)
        self.stats.messages += len(tensors)
        self.stats.messages_received += len(out)
        self.stats.seconds += time.perf_counter() - start
        return out

    # ----------------------------------------------------------- recursive doubling
    def recursive_doubling(
        self, payload: Payload, combine: Callable[[Payload, Payload], Payload]
    ) -> Payload:
        """Combine every rank's payload by recursive doubling; all ranks get the result.

        Steps: (1) a rank past the largest power of two ``P2`` sends its payload to
        ``rank - P2`` and waits for the result; (2) that partner combines it into its own;
        (3) for ``i`` in ``0..log2(P2)-1`` each rank exchanges its payload with
        ``rank XOR 2^i`` and combines; (4) partners send the result to their folded rank.

        Args:
            payload: this rank's tensors; every intermediate result must keep their shapes.
            combine: ``combine(mine, theirs)``; it must be symmetric (give bitwise the same
                result with the arguments swapped) so both partners agree.

        Returns:
            The combined payload, bitwise identical on every rank.
        """
        plan = recursive_doubling_plan(self.rank, self.world_size)
        self.count_rounds(plan.rounds)
        if plan.fold_into is not None:
            self.send(payload, plan.fold_into)
            return self.recv(payload, plan.fold_into)
        if plan.folded_from is not None:
            payload = combine(payload, self.recv(payload, plan.folded_from))
        for peer in plan.partners:
            payload = combine(payload, self.exchange(payload, peer))
        if plan.folded_from is not None:
            self.send(payload, plan.folded_from)
        return payload

    def allreduce_recursive_doubling(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over ranks by recursive doubling (returns a new tensor)."""
        return self.recursive_doubling([tensor], lambda a, b: [a[0] + b[0]])[0]

    # ----------------------------------------------------------- star (rank 0)
    def gather_to_root(self, tensors: Sequence[torch.Tensor]) -> list[Payload] | None:
        """Every rank sends ``tensors`` to rank 0; rank 0 gets all ranks' lists, by rank.

        Returns:
            On rank 0, a list indexed by rank (its own tensors included, not copied); on
            other ranks, None.
        """
        self.count_rounds(1)
        if self.rank != 0:
            self.send(tensors, 0)
            return None
        return [list(tensors)] + [self.recv(tensors, src) for src in range(1, self.world_size)]

    def broadcast_from_root(self, tensors: Sequence[torch.Tensor]) -> Payload:
        """Rank 0 sends ``tensors`` to every other rank, one by one (a star, not a tree).

        Non-root ranks pass tensors of the right shape and dtype (their content is ignored).
        """
        self.count_rounds(1)
        if self.rank == 0:
            for dst in range(1, self.world_size):
                self.send(tensors, dst)
            return list(tensors)
        return self.recv(tensors, 0)

    # ----------------------------------------------------------- backend collectives
    def allreduce_backend(
        self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> torch.Tensor:
        """The backend's all-reduce, in place; counted as gloo's ring (:func:`ring_allreduce`:
        about 2(P-1)/P * n bytes each way)."""
        start = time.perf_counter()
        self.transport.all_reduce(tensor, op)
        self._count_ring(tensor)
        self.stats.seconds += time.perf_counter() - start
        return tensor

    def _count_ring(self, tensor: torch.Tensor) -> None:
        """Count a backend all-reduce of ``tensor``: this rank's share of :func:`ring_allreduce`."""
        self._count(ring_allreduce(_nbytes([tensor]), self.world_size, tensor.element_size()))

    def _count(self, traffic: Traffic) -> None:
        """Count this rank's share of a backend collective from its formula, so the formula
        the cost model reads and what ``last_stats`` reports are one and the same."""
        r = self.rank
        self.stats.bytes_sent += traffic.sent[r]
        self.stats.bytes_received += traffic.received[r]
        self.stats.messages += traffic.messages[r]
        self.stats.messages_received += traffic.messages_received[r]
        self.stats.rounds += traffic.rounds

    def allreduce_backend_async(self, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """The backend's all-reduce (sum) of ``tensor`` in place, started without waiting.

        Counted like :meth:`allreduce_backend` when it starts; the caller times it (the
        returned future completes when the sum is in ``tensor``). DDP's hooks chain on it.

        Returns:
            A future whose value is ``tensor`` holding the sum.
        """
        self._count_ring(tensor)
        return self.transport.all_reduce_async(tensor)

    def allgather_backend(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """The backend's all-gather, by rank.

        Counted as gloo's ring all-gather (:func:`allgather`): a rank sends ``(P-1) * n``
        bytes, its own block and the ``P-2`` others it forwards, and receives as many.
        """
        start = time.perf_counter()
        out = self.transport.all_gather(tensor)
        self._count(allgather(_nbytes([tensor]), self.world_size))
        self.stats.seconds += time.perf_counter() - start
        return out


def world_size_of(group: dist.ProcessGroup | SimulatedRank | None) -> int | None:
    """The number of ranks of ``group`` (a process group, None for the default group, or a
    simulated rank), or None when torch.distributed is not initialised. No collective."""
    if isinstance(group, SimulatedRank):
        return group.world_size
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_world_size(group)


def new_future(device: torch.device) -> torch.futures.Future[torch.Tensor]:
    """A future that may hold tensors on ``device`` (CUDA futures must name their device):
    what a DDP communication hook returns for a bucket it completes later."""
    return torch.futures.Future(devices=[device] if device.type != "cpu" else None)


def completed_future(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future that already holds ``tensor``."""
    fut = new_future(tensor.device)
    fut.set_result(tensor)
    return fut
