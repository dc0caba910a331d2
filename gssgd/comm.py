"""Collectives with exact byte, message, round and time accounting.

Every byte an aggregator moves goes through a :class:`Communicator`, which counts, per
rank, the payload bytes it sends and receives under the algorithm's own message pattern:

* **recursive doubling** (:meth:`Communicator.recursive_doubling`): ``log2 P`` rounds in
  which rank ``p`` exchanges its payload with ``p XOR 2^i`` and combines the two. For a world
  size that is not a power of two, the ranks past the largest power of two ``P2`` first
  *fold in* (send their payload to rank ``p - P2``, which combines it into its own) and
  *receive the result last*. Used for the dense sketch all-reduce of gs-SGD and for gTop-k's
  sparse merges.
* **star** (:meth:`Communicator.gather_to_root`, :meth:`Communicator.broadcast_from_root`):
  every rank talks to rank 0 alone, as Sketched-SGD's parameter server does.
* **backend** (:meth:`Communicator.allreduce_backend`, :meth:`Communicator.allgather_backend`):
  the process group's own collective, counted with the bandwidth-optimal ring figures: an
  all-reduce of ``n`` bytes sends and receives ``floor(2(P-1)/P * n)``, an all-gather
  ``(P-1) * n``.

``rounds`` counts the sequential communication steps on the algorithm's critical path (the
same on every rank), ``messages`` the point-to-point messages this rank sent (one per
tensor), and ``seconds`` the wall time spent inside collectives.

The same patterns as formulas (:class:`Traffic`, :func:`ring_allreduce`,
:func:`allgather`, :func:`recursive_doubling`, :func:`star`) predict what a step moves
without running it; each aggregator's ``traffic`` classmethod composes them into its own
message pattern, and the cost model and the training metrics read them from there. This
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
    "CommStats",
    "Communicator",
    "RecursiveDoublingPlan",
    "Traffic",
    "allgather",
    "completed_future",
    "new_future",
    "recursive_doubling",
    "recursive_doubling_plan",
    "ring_allreduce",
    "ring_allreduce_bytes",
    "star",
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


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends (and receives) in a ring all-reduce of ``nbytes``:
    ``floor(2(P-1)/P * n)`` (a reduce-scatter and an all-gather of ``P-1`` steps each)."""
    return (2 * (world_size - 1) * nbytes) // world_size


@dataclass(frozen=True)
class Traffic:
    """What one step of a message pattern moves, for every rank.

    Attributes:
        sent, received: payload bytes per rank (index = rank), as :class:`Communicator`
            counts them.
        rounds: sequential communication steps on the critical path.
        critical_bytes: bytes on the busiest link, summed over the sequential phases, each
            phase counted in its busier direction (links are full duplex).
    """

    sent: tuple[int, ...]
    received: tuple[int, ...]
    rounds: int
    critical_bytes: int

    def __add__(self, other: Traffic) -> Traffic:
        """The two patterns one after the other."""
        return Traffic(
            tuple(a + b for a, b in zip(self.sent, other.sent, strict=True)),
            tuple(a + b for a, b in zip(self.received, other.received, strict=True)),
            self.rounds + other.rounds,
            self.critical_bytes + other.critical_bytes,
        )


def ring_allreduce(nbytes: int, world_size: int) -> Traffic:
    """The backend's all-reduce of ``nbytes`` (:meth:`Communicator.allreduce_backend`),
    counted as a ring: :func:`ring_allreduce_bytes` each way in ``2(P-1)`` steps."""
    p = world_size
    moved = ring_allreduce_bytes(nbytes, p)
    return Traffic((moved,) * p, (moved,) * p, 2 * (p - 1), moved)


def allgather(nbytes: int, world_size: int) -> Traffic:
    """An all-gather of ``nbytes`` per rank (:meth:`Communicator.allgather_backend`): each
    rank's bytes go out once (logically) and ``(P-1) * n`` come in, over ``P-1`` steps."""
    p = world_size
    if p == 1:
        return Traffic((0,), (0,), 0, 0)
    return Traffic((nbytes,) * p, ((p - 1) * nbytes,) * p, p - 1, (p - 1) * nbytes)


def recursive_doubling(nbytes: int, world_size: int, result_extra: int = 0) -> Traffic:
    """Recursive doubling of an ``nbytes`` payload (:meth:`Communicator.recursive_doubling`).

    ``log2 P2`` exchanges of ``n`` bytes with partner ``rank XOR 2^i``; with ``P != P2`` the
    ranks ``>= P2`` first send their payload to ``rank - P2`` and get the result (plus
    ``result_extra`` bytes, e.g. gTop-k's survival flags) back last: two more rounds.
    """
    p = world_size
    sent, received = [], []
    for rank in range(p):
        plan = recursive_doubling_plan(rank, p)
        if plan.fold_into is not None:  # folds in, then receives the result
            sent.append(nbytes)
            received.append(nbytes + result_extra)
            continue
        s = r = len(plan.partners) * nbytes
        if plan.folded_from is not None:  # receives a folded payload, sends back the result
            r += nbytes
            s += nbytes + result_extra
        sent.append(s)
        received.append(r)
    plan = recursive_doubling_plan(0, p)
    folded = p != plan.power
    critical = len(plan.partners) * nbytes + ((2 * nbytes + result_extra) if folded else 0)
    return Traffic(tuple(sent), tuple(received), plan.rounds, critical)


def star(to_root: int, from_root: int, world_size: int) -> Traffic:
    """One star phase through rank 0 (:meth:`Communicator.gather_to_root` or
    :meth:`Communicator.broadcast_from_root`): every other rank sends ``to_root`` bytes to
    rank 0 and receives ``from_root`` bytes from it; rank 0's link carries ``P-1`` copies.
    One round (a gather and a broadcast are one each: pass 0 for the direction unused)."""
    p = world_size
    sent = ((p - 1) * from_root,) + (to_root,) * (p - 1)
    received = ((p - 1) * to_root,) + (from_root,) * (p - 1)
    return Traffic(sent, received, 1, (p - 1) * max(to_root, from_root))


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
        """The backend's all-reduce, in place; counted as a ring: 2(P-1)/P * n bytes."""
        start = time.perf_counter()
        self.transport.all_reduce(tensor, op)
        self._count_ring(tensor)
        self.stats.seconds += time.perf_counter() - start
        return tensor

    def _count_ring(self, tensor: torch.Tensor) -> None:
        """Count a backend all-reduce of ``tensor`` with the ring figures."""
        p = self.world_size
        moved = ring_allreduce_bytes(_nbytes([tensor]), p)
        self.stats.bytes_sent += moved
        self.stats.bytes_received += moved
        self.stats.messages += 2 * (p - 1)
        self.stats.rounds += 2 * (p - 1)

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

        Counted by the all-gather's logical pattern (local Top-k's figure): this rank's
        ``n`` bytes are sent once and every other rank's ``(P-1) * n`` are received.
        """
        start = time.perf_counter()
        out = self.transport.all_gather(tensor)
        p, n = self.world_size, _nbytes([tensor])
        self.stats.bytes_sent += n if p > 1 else 0
        self.stats.bytes_received += (p - 1) * n
        self.stats.messages += p - 1
        self.stats.rounds += p - 1
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
