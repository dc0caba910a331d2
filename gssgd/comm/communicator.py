"""The accounted collectives: every byte an aggregator moves goes through a :class:`Communicator`.

A communicator counts, per rank, the payload bytes its process puts on the wire and takes off
it under the algorithm's own message pattern, data it forwards for other ranks included:

* **point to point** (:meth:`Communicator.send`, :meth:`Communicator.recv`,
  :meth:`Communicator.exchange`): one message per tensor.
* **recursive doubling** (:meth:`Communicator.recursive_doubling`): the schedule of
  :mod:`gssgd.comm.patterns`.
* **star** (:meth:`Communicator.gather_to_root`, :meth:`Communicator.broadcast_from_root`):
  every rank talks to rank 0 alone.
* **backend** (:meth:`Communicator.allreduce_backend`, :meth:`Communicator.allgather_backend`):
  the process group's own collective, counted with gloo's ring formulas
  (:mod:`gssgd.comm.patterns`), so what ``last_stats`` reports and what the cost model reads are
  one and the same.

:class:`CommStats` holds the counts: ``rounds`` (sequential steps on the algorithm's critical
path, the same on every rank), ``messages`` and ``messages_received`` (point-to-point
messages, one per tensor or per gloo segment or chunk), and ``seconds`` (wall time inside
collectives). gloo's preambles are not payload and not in the byte counts
(:func:`~gssgd.comm.wire_overhead`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from gssgd.comm.patterns import (
    Traffic,
    allgather,
    chunk_bounds,
    halving_doubling_schedule,
    recursive_doubling_plan,
    ring_allreduce,
)
from gssgd.transport import DistTransport, Transport

__all__ = ["CommStats", "Communicator", "Payload", "world_size_of"]

#: The tensors of one message pattern's payload, in order.
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


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Communicator:
    """Accounted collectives over one process group.

    Args:
        group: the process group (None: the default group), or any other
            :class:`~gssgd.transport.Transport`, such as a
            :class:`~gssgd.simulated.SimulatedRank` of a simulated world. The communicator
            works with group-local ranks; its transport
            (:class:`~gssgd.transport.DistTransport`, or the transport given) moves the
            tensors, and the counting here is the same for both.

    Raises:
        RuntimeError: a real group is asked for but torch.distributed is not initialised.

    Attributes:
        rank, world_size: this process's rank in ``group`` and the group's size.
        stats: running :class:`CommStats`; :meth:`take_stats` returns and resets it.
    """

    def __init__(self, group: dist.ProcessGroup | Transport | None = None) -> None:
        self.group = group
        self.transport: Transport = (
            group if isinstance(group, Transport) else DistTransport(group)
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

    def exchange(self, tensors: Sequence[torch.Tensor], peer: int,
                 like: Sequence[torch.Tensor] | None = None) -> Payload:
        """Send ``tensors`` to ``peer`` and receive tensors shaped like ``like`` (default:
        like ``tensors``) from it, concurrently."""
        start = time.perf_counter()
        out = [torch.empty_like(t) for t in (tensors if like is None else like)]
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

    def allreduce_halving_doubling(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over ranks by recursive halving and doubling (returns a new
        tensor, bitwise the same on every rank).

        Steps: (1) a rank past the largest power of two ``P2`` sends its tensor to
        ``rank - P2``, which adds it to its own, and waits for the result; (2) the ``P2``
        ranks split the vector into ``P2`` chunks (:func:`~gssgd.comm.patterns.chunk_bounds`)
        and reduce-scatter it by recursive halving: each round a rank sends the half of its
        range it gives up to its partner and adds the partner's copy of the half it keeps
        (:func:`~gssgd.comm.patterns.halving_doubling_schedule`), until it holds one chunk's
        sum; (3) an all-gather by recursive doubling sends each sum back up, so every rank
        holds the one copy of each chunk's sum; (4) partners send the result to their
        folded rank. ``2 log2 P2`` rounds (+2 with folded ranks), about ``2n(P2-1)/P2``
        bytes each way: the ring's bytes in a tree's rounds.
        """
        plan = recursive_doubling_plan(self.rank, self.world_size)
        self.count_rounds(2 * (plan.power.bit_length() - 1)
                          + (2 if plan.power != self.world_size else 0))
        flat = tensor.reshape(-1)
        if plan.fold_into is not None:
            self.send([flat], plan.fold_into)
            return self.recv([flat], plan.fold_into)[0].view_as(tensor)
        out = flat.clone()
        if plan.folded_from is not None:
            out += self.recv([flat], plan.folded_from)[0]
        bounds = chunk_bounds(out.numel(), plan.power)

        def part(r: tuple[int, int]) -> torch.Tensor:
            return out[bounds[r[0]]:bounds[r[1]]]

        schedule = halving_doubling_schedule(self.rank, plan.power)
        for peer, kept, given in schedule:  # reduce-scatter
            theirs = self.exchange([part(given)], peer, like=[part(kept)])[0]
            part(kept).add_(theirs)
        for peer, kept, given in reversed(schedule):  # all-gather
            part(given).copy_(self.exchange([part(kept)], peer, like=[part(given)])[0])
        if plan.folded_from is not None:
            self.send([out], plan.folded_from)
        return out.view_as(tensor)

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


def world_size_of(group: dist.ProcessGroup | Transport | None) -> int | None:
    """The number of ranks of ``group`` (a process group, None for the default group, or a
    :class:`~gssgd.transport.Transport` such as a simulated rank), or None when
    torch.distributed is not initialised. No collective."""
    if isinstance(group, Transport):
        return group.world_size
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_world_size(group)
