"""Every message pattern the aggregators use, as a schedule (who talks to whom, in which
round) and as a formula (:class:`Traffic`: what each rank sends and receives).

A :class:`Traffic` is what one step of a pattern moves, per rank; patterns run one after
the other add up (``+``), each built from :func:`phase`. The byte counts are payload only;
on the wire gloo's TCP transport adds a fixed preamble per message and direction
(:data:`HEADER_BYTES`, :func:`wire_overhead`), and the step of a method whose non-finite
flags do not ride in its messages starts with a small control message
(:data:`CONTROL_BYTES`). The :class:`~gssgd.comm.Communicator`
runs these patterns and counts them with these same formulas. In the order below:

* **gloo's ring** (:func:`ring_allreduce`, segment by segment; :func:`allgather`): the
  process group's own collectives (:meth:`~gssgd.comm.Communicator.allreduce_backend`,
  :meth:`~gssgd.comm.Communicator.allgather_backend`).
* **Recursive doubling** (:func:`recursive_doubling_plan`, :func:`recursive_doubling`): in
  ``log2 P2`` rounds rank ``p`` exchanges its payload with ``p XOR 2^i`` and combines the
  two, ``P2`` the largest power of two ``<= P``; the ranks past ``P2`` first *fold in*
  (send their payload to rank ``p - P2``, which combines it into its own) and *receive the
  result last*. gs-SGD's sketch all-reduce and gTop-k's sparse merges run it
  (:meth:`~gssgd.comm.Communicator.recursive_doubling`).
* **Recursive halving and doubling** (Rabenseifner's all-reduce, :func:`halving_doubling`):
  a vector summed in the bytes of a ring and the rounds of a tree: a reduce-scatter by
  recursive halving (in round ``i`` rank ``p`` keeps half of its current range of the
  vector's ``P2`` chunks, sends the other half to ``p XOR P2/2^(i+1)`` and adds what that
  partner sends of its own half), then an all-gather by recursive doubling back up;
  ``2 log2 P2`` rounds, about ``2 n (P2-1)/P2`` bytes each way, the same fold-in for the
  ranks past ``P2`` (:meth:`~gssgd.comm.Communicator.allreduce_halving_doubling`).
* **The star around rank 0** (:func:`star_gather`, :func:`star_broadcast`): every rank
  talks to rank 0 alone, as Sketched-SGD's parameter server does
  (:meth:`~gssgd.comm.Communicator.gather_to_root`,
  :meth:`~gssgd.comm.Communicator.broadcast_from_root`).
* **A binomial tree** (:func:`tree_plan`, :func:`tree_reduce_broadcast`): reduce to rank 0,
  then broadcast from it, as gTop-k's authors' code (gtopkssgd's
  ``gtopk_sparse_allreduce``) sends its (index, value) list up, merging at every receiver,
  and rank 0 broadcasts the final list (MPI's ``Bcast``). In round ``i`` of the reduce, a
  rank ``r`` with ``r mod 2^(i+1) = 2^i`` sends to ``r - 2^i`` and leaves; a rank with
  ``r mod 2^(i+1) = 0`` receives from ``r + 2^i`` where that rank exists: ``ceil(log2 P)``
  rounds for any P (for a power of two, the authors' pairs exactly), and the broadcast
  runs the same tree downwards in as many rounds.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CONTROL_BYTES",
    "GLOO_MAX_SEGMENT_BYTES",
    "HEADER_BYTES",
    "RecursiveDoublingPlan",
    "Traffic",
    "TreePlan",
    "allgather",
    "chunk_bounds",
    "gloo_ring_segments",
    "halving_doubling",
    "halving_doubling_schedule",
    "phase",
    "recursive_doubling",
    "recursive_doubling_plan",
    "ring_allreduce",
    "ring_allreduce_bytes",
    "star_broadcast",
    "star_gather",
    "tree_plan",
    "tree_reduce_broadcast",
    "wire_overhead",
]

#: The formulas below are pure functions of integers returning a frozen :class:`Traffic`, so
#: each keeps its last results: every step of a density warm-up compares its message with
#: the same dense all-reduce (:meth:`~gssgd.aggregators.base.Aggregator.sends_dense_at`).
#: At most this many results per formula (a result holds four tuples of P integers).
FORMULA_CACHE = 64


#: Bytes of the int32 non-finite flag a method whose flags do not ride in its messages
#: all-gathers before its step (no built-in method: theirs ride in the first message).
CONTROL_BYTES = 4

#: The bytes gloo puts in front of every message on the wire: the 48-byte preamble of its TCP
#: transport (``Op::preamble`` in gloo/transport/tcp/pair.h: six ``size_t`` fields). A message
#: between unbound buffers (every collective and send/recv of torch.distributed's gloo) is a
#: rendezvous of three of them: the sender's send-ready note and the preamble in front of the
#: payload go with the message, the receiver's recv-ready note goes back (``Pair::send``,
#: ``Pair::recv``). So a process writes its payload plus ``2 * 48`` bytes per message it
#: sends and 48 per message it receives, however many ``writev`` calls its payload takes
#: (tests/comm/test_wire_bytes.py checks it). :func:`wire_overhead` is that sum; the cost model
#: charges it (``critical_headers``).
HEADER_BYTES = 48

#: gloo's ring all-reduce cuts its buffer into segments of at most this many bytes
#: (``AllreduceOptions::kMaxSegmentSize``), and into at least two per rank.
GLOO_MAX_SEGMENT_BYTES = 1 << 20


def wire_overhead(messages: int, messages_received: int) -> int:
    """Bytes of gloo preambles a rank writes for ``messages`` sent and ``messages_received``
    received (:data:`HEADER_BYTES`: two per message sent, one per message received)."""
    return HEADER_BYTES * (2 * messages + messages_received)


@dataclass(frozen=True)
class Traffic:
    """What one step of a message pattern moves, for every rank.

    Attributes:
        sent, received: payload bytes per rank (index = rank), as
            :class:`~gssgd.comm.Communicator` counts them: what each rank's process puts on
            the wire and takes off it, data it forwards for others included (a ring
            all-gather's).
        rounds: sequential communication steps on the critical path.
        critical_bytes: bytes on the busiest link, summed over the sequential phases, each
            phase counted in its busier direction (links are full duplex).
        messages, messages_received: point-to-point messages each rank sends and receives.
        critical_headers: gloo preambles (:data:`~gssgd.comm.HEADER_BYTES` each) on the
            busiest link, summed over the phases like ``critical_bytes``: in a phase where a
            rank sends ``s`` messages and receives ``r``, its link carries ``2s + r``
            preambles out and ``2r + s`` in.
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


def phase(
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


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """The ideal ring figure ``floor(2(P-1)/P * n)``: what one rank sends (and receives), on
    average over the ranks, in a ring all-reduce of ``nbytes`` (a reduce-scatter and an
    all-gather of ``P-1`` steps each). gloo's segments make each rank's share differ from it
    by up to a segment (:func:`ring_allreduce` counts them exactly); this figure serves where
    the tensors are not known one by one (DDP's own buckets)."""
    return (2 * (world_size - 1) * nbytes) // world_size


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


@functools.lru_cache(maxsize=FORMULA_CACHE)
def ring_allreduce(nbytes: int, world_size: int, itemsize: int = 4) -> Traffic:
    """The backend's all-reduce of ``nbytes`` in elements of ``itemsize`` bytes
    (:meth:`~gssgd.comm.Communicator.allreduce_backend`): gloo's ring, counted segment by
    segment.

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
    return phase(sent, received, 2 * (p - 1), messages, messages_received)


@functools.lru_cache(maxsize=FORMULA_CACHE)
def allgather(nbytes: int, world_size: int) -> Traffic:
    """An all-gather of ``nbytes`` per rank (:meth:`~gssgd.comm.Communicator.allgather_backend`):
    gloo's ring all-gather (gloo/allgather.cc). In each of ``P-1`` steps a rank forwards one
    rank's block to its successor, in two halves: it sends and receives ``(P-1) * n`` bytes
    in ``2(P-1)`` messages each way (its own block and ``P-2`` others' it passes on)."""
    p = world_size
    if p == 1:
        return Traffic.none(1)
    moved, messages = ((p - 1) * nbytes,) * p, (2 * (p - 1),) * p
    return phase(moved, moved, p - 1, messages, messages)


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


@functools.lru_cache(maxsize=FORMULA_CACHE)
def recursive_doubling(
    nbytes: int, world_size: int, result_extra: int = 0, *, tensors: int = 1,
    result_tensors: int | None = None,
) -> Traffic:
    """Recursive doubling of an ``nbytes`` payload
    (:meth:`~gssgd.comm.Communicator.recursive_doubling`).

    ``log2 P2`` exchanges of ``n`` bytes with partner ``rank XOR 2^i``; with ``P != P2`` the
    ranks ``>= P2`` first send their payload to ``rank - P2`` and get the result (plus
    ``result_extra`` bytes, e.g. gTop-k's survival flags) back last: two more rounds. The
    payload is ``tensors`` messages, the result ``result_tensors`` (default: as many).
    """
    p, t = world_size, tensors
    back = t if result_tensors is None else result_tensors
    plan = recursive_doubling_plan(0, p)
    rounds, folded = len(plan.partners), p != plan.power
    out = phase([nbytes * rounds if r < plan.power else 0 for r in range(p)],
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
    return phase(sent, received, 0, [tensors if r in senders else 0 for r in range(p)],
                 [tensors if r in receivers else 0 for r in range(p)])


def chunk_bounds(numel: int, chunks: int) -> list[int]:
    """Where ``numel`` elements split into ``chunks`` nearly equal pieces: ``chunks + 1``
    offsets, piece ``j`` being ``[b[j], b[j+1])``."""
    return [j * numel // chunks for j in range(chunks + 1)]


def halving_doubling_schedule(rank: int, power: int) -> list[tuple[int, tuple[int, int],
                                                                    tuple[int, int]]]:
    """Rank ``rank``'s reduce-scatter among ``power`` ranks (a power of two), round by
    round: ``(peer, kept, given)``, the chunk ranges ``[lo, hi)`` it keeps and sends. The
    all-gather runs the same rounds backwards, sending ``kept`` and receiving ``given``."""
    out, lo, hi, half = [], 0, power, power // 2
    while half >= 1:
        mid = (lo + hi) // 2
        lower = rank & half == 0
        kept, given = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        out.append((rank ^ half, kept, given))
        lo, hi = kept
        half //= 2
    return out


@functools.lru_cache(maxsize=FORMULA_CACHE)
def halving_doubling(nbytes: int, world_size: int, itemsize: int = 4) -> Traffic:
    """Recursive halving and doubling of an ``nbytes`` payload of ``itemsize``-byte
    elements (:func:`halving_doubling_schedule`): per round each rank sends one message of
    the chunks it gives (reduce-scatter) or keeps (all-gather); ``2 log2 P2`` rounds; the
    ranks past ``P2`` fold in and get the result as in :func:`recursive_doubling`."""
    p = world_size
    plan = recursive_doubling_plan(0, p)
    power = plan.power
    if p == 1 or nbytes == 0:
        return Traffic.none(p)
    bounds = [b * itemsize for b in chunk_bounds(nbytes // itemsize, power)]

    def size(r: tuple[int, int]) -> int:
        return bounds[r[1]] - bounds[r[0]]

    schedules = [halving_doubling_schedule(r, power) for r in range(power)]
    rounds = len(schedules[0])
    out = Traffic.none(p)
    order = [*range(rounds), *reversed(range(rounds))]
    for step, i in enumerate(order):
        gather = step >= rounds  # the all-gather sends what it kept
        sent = [size(schedules[r][i][1 if gather else 2]) if r < power else 0 for r in range(p)]
        received = [size(schedules[r][i][2 if gather else 1]) if r < power else 0
                    for r in range(p)]
        ones = [1 if r < power else 0 for r in range(p)]
        out = out + phase(sent, received, 1, ones, ones)
    if p == power:
        return out
    extra = range(power, p)
    fold = (_one_way(p, extra, nbytes, 1, to_partner=True)
            + _one_way(p, extra, nbytes, 1, to_partner=False))
    return out + dataclasses.replace(fold, rounds=2)  # the fold-in's and the result's


@functools.lru_cache(maxsize=FORMULA_CACHE)
def star_gather(nbytes: int, world_size: int, tensors: int = 1) -> Traffic:
    """Every other rank sends ``nbytes`` (``tensors`` messages) to rank 0
    (:meth:`~gssgd.comm.Communicator.gather_to_root`): rank 0's link carries ``P-1`` copies.
    One round."""
    p = world_size
    sent = (0,) + (nbytes,) * (p - 1)
    received = ((p - 1) * nbytes,) + (0,) * (p - 1)
    messages = (0,) + (tensors,) * (p - 1)
    return phase(sent, received, 1, messages, ((p - 1) * tensors,) + (0,) * (p - 1))


@functools.lru_cache(maxsize=FORMULA_CACHE)
def star_broadcast(nbytes: int, world_size: int, tensors: int = 1) -> Traffic:
    """Rank 0 sends ``nbytes`` (``tensors`` messages) to every other rank, one by one
    (:meth:`~gssgd.comm.Communicator.broadcast_from_root`): a star, not a tree. One round."""
    gather = star_gather(nbytes, world_size, tensors)
    return Traffic(gather.received, gather.sent, 1, gather.critical_bytes,
                   gather.messages_received, gather.messages, gather.critical_headers)


@dataclass(frozen=True)
class TreePlan:
    """What a rank does in a binomial-tree reduce to rank 0 and broadcast from it.

    Attributes:
        world_size: the number of ranks P.
        depth: ``ceil(log2 P)``, the rounds of each half.
        children: the ranks this rank receives from in the reduce, in round order (and
            sends the result to in the broadcast, in reverse order).
        parent: the rank it sends its merged payload to (and receives the result from);
            None for rank 0.
    """

    world_size: int
    depth: int
    children: tuple[int, ...]
    parent: int | None

    @property
    def rounds(self) -> int:
        """Rounds on the critical path: the reduce's and the broadcast's."""
        return 2 * self.depth


def tree_plan(rank: int, world_size: int) -> TreePlan:
    """The binomial-tree schedule of ``rank`` among ``world_size`` ranks."""
    depth = (world_size - 1).bit_length()  # ceil(log2 P); 0 for P = 1
    children, parent = [], None
    for i in range(depth):
        step = 1 << i
        if rank % (2 * step) == step:
            parent = rank - step
            break
        if rank + step < world_size:
            children.append(rank + step)
    return TreePlan(world_size, depth, tuple(children), parent)


@functools.lru_cache(maxsize=FORMULA_CACHE)
def tree_reduce_broadcast(nbytes: int, world_size: int, *, tensors: int = 1) -> Traffic:
    """A reduce of an ``nbytes`` payload up the binomial tree, then its broadcast down
    (:func:`tree_plan`): a rank sends ``nbytes`` once up (rank 0 never) and once down to
    each child, and receives as much; one phase a round, ``2 ceil(log2 P)`` rounds. The
    payload is ``tensors`` messages."""
    p = world_size
    plans = [tree_plan(r, p) for r in range(p)]
    out = Traffic.none(p)
    for i in range(plans[0].depth):  # the reduce: round i's senders leave
        senders = {r for r, pl in enumerate(plans) if pl.parent is not None
                   and r - pl.parent == 1 << i}
        out = out + _round(p, senders, {r - (1 << i) for r in senders}, nbytes, tensors)
    for i in reversed(range(plans[0].depth)):  # the broadcast: the same edges downwards
        receivers = {r for r, pl in enumerate(plans) if pl.parent is not None
                     and r - pl.parent == 1 << i}
        out = out + _round(p, {r - (1 << i) for r in receivers}, receivers, nbytes, tensors)
    return out


def _round(p: int, senders: set[int], receivers: set[int], nbytes: int, tensors: int) -> Traffic:
    """One round of the tree: each sender sends ``nbytes`` to one receiver."""
    return phase([nbytes if r in senders else 0 for r in range(p)],
                 [nbytes if r in receivers else 0 for r in range(p)], 1,
                 [tensors if r in senders else 0 for r in range(p)],
                 [tensors if r in receivers else 0 for r in range(p)])
