"""A simulated world: P ranks as threads of one process, tensors exchanged in memory.

Large-P behaviour (P = 16 to 256 and more) is measured with the package's own code: each
simulated rank is handed to the same aggregator classes (and DDP hook states) as a real
process group would be, ``make_aggregator("gs", d, group=world.rank(r))``, so every
collective goes through the same :class:`gssgd.comm.Communicator` and its byte accounting.
Only the transport differs (:class:`SimulatedRank` instead of
:class:`gssgd.transport.DistTransport`). This follows torch's multi-threaded process group
in its own tests: the real code, many ranks, one process.

What is the same as real processes, and what is not:

* point-to-point messages (recursive doubling, the star) and all-gathers move exactly the
  tensors a process group would move, so methods that fix the order of their sums
  themselves (gTop-k, Sketched-SGD, gs with recursive doubling, local Top-k) give bitwise
  the same updates as on gloo;
* the backend all-reduce sums in gloo's order (:func:`gloo_ring_reduce`: gloo's ring
  adds each chunk of the tensor starting from a different rank), so dense, the dense
  warm-up and gs with ``allreduce="backend"`` (float32 or float16 tables) are bitwise the
  same as on gloo too; NCCL picks yet another order, which is not simulated;
* byte counts are exact; wall times are not step times (the ranks take turns on one
  thread): the cost model predicts step times.

Example::

    world = SimulatedWorld(64)
    aggs = [make_aggregator("gs", d, density=0.001, group=world.rank(r)) for r in range(64)]
    updates = world.run(lambda rank: aggs[rank.rank].step(grads[rank.rank]))
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from gssgd.transport import completed_future
from gssgd.validate import check_int

__all__ = [
    "SimulatedRank",
    "SimulatedWorld",
    "SimulationError",
    "gloo_ring_chunk",
    "gloo_ring_reduce",
]

T = TypeVar("T")

_REDUCE_OPS: dict[Any, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    dist.ReduceOp.SUM: lambda acc, t: acc.add_(t),
    dist.ReduceOp.MAX: lambda acc, t: torch.maximum(acc, t, out=acc),
    dist.ReduceOp.MIN: lambda acc, t: torch.minimum(acc, t, out=acc),
}
#: gloo's largest ring segment in bytes (``AllreduceOptionsImpl::kMaxSegmentSize``, 1 MiB).
GLOO_MAX_SEGMENT_BYTES = 1 << 20


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def gloo_ring_chunk(numel: int, element_size: int, world_size: int) -> int:
    """Elements in each chunk of gloo's ring all-reduce of ``numel`` elements of
    ``element_size`` bytes over ``world_size`` ranks (the last chunks short or empty).

    gloo cuts the buffer into S segments, S the smallest multiple of P that is at least
    ``max(ceil(bytes / 1 MiB), 2P)``, each of ``ceil(bytes / S)`` bytes rounded up to whole
    elements; chunk ``c`` is segments ``c·S/P`` to ``(c+1)·S/P - 1``. So the chunks are
    whole segments, not ``ceil(n / P)``: P = 16 and 100 elements give chunks of 8 (12 full
    ones and one of 4), not 7; 6,000,001 float32 over P = 5 (24 MB: 25 segments) give
    chunks of 1,200,005.
    """
    nbytes, p = numel * element_size, world_size
    max_segment = element_size * max(1, GLOO_MAX_SEGMENT_BYTES // element_size)
    segments = _ceil_div(max(_ceil_div(nbytes, max_segment), 2 * p), p) * p
    segment_elements = _ceil_div(_ceil_div(nbytes, segments), element_size)
    return segment_elements * (segments // p)


def gloo_ring_reduce(
    tensors: list[torch.Tensor], op: Any = dist.ReduceOp.SUM
) -> torch.Tensor:
    """Reduce rank ``r``'s ``tensors[r]`` exactly as gloo's ring all-reduce does: a new
    tensor, bitwise what ``torch.distributed.all_reduce`` gives every rank on gloo (CPU).

    The rule (gloo's ``ring`` in ``gloo/allreduce.cc``, which ProcessGroupGloo runs for every
    CPU all-reduce):

    1. the flattened tensor is cut into P chunks of :func:`gloo_ring_chunk` elements; rank
       ``c`` ends up holding chunk ``c`` reduced;
    2. reduce-scatter: chunk ``c`` leaves rank ``c - 1`` (mod P) holding that rank's
       values, travels down the ring to ranks ``c - 2``, ``c - 3``, ... and ends on rank
       ``c``, each rank adding its own values to what it received. So chunk ``c``'s sum is
       ``((x[c-1] + x[c-2]) + x[c-3]) + ... + x[c]``: chunk 0 starts at rank P - 1, chunk
       1 at rank 0, and so on;
    3. each addition is one add in the tensor's dtype: float16 adds two halves in float32
       and rounds to float16 each time (gloo's ``float16::operator+``, as torch's CPU add),
       never a float32 accumulator over the ranks;
    4. the all-gather only copies, so every rank gets the same bits.

    This is the order of gloo's ring all-reduce source; tests/test_simulated.py checks it
    bitwise against real gloo processes.

    Args:
        tensors: one tensor per rank, same shape and dtype, contiguous or not.
        op: ``dist.ReduceOp.SUM``, ``MAX`` or ``MIN`` (the last two in the same order,
            which does not change them, NaNs aside).

    Returns:
        The reduced tensor, shaped like ``tensors[0]``.
    """
    p, reduce = len(tensors), _REDUCE_OPS[op]
    flat = [t.reshape(-1) for t in tensors]
    out = torch.empty_like(flat[0])
    n = out.numel()
    size = gloo_ring_chunk(n, out.element_size(), p)
    for chunk in range(p):
        lo, hi = chunk * size, min(n, (chunk + 1) * size)
        if lo >= hi:
            break  # this chunk and the ones after it are empty
        acc = out[lo:hi]
        acc.copy_(flat[(chunk - 1) % p][lo:hi])
        for step in range(1, p):
            reduce(acc, flat[(chunk - 1 - step) % p][lo:hi])
    return out.view(tensors[0].shape)


class SimulationError(RuntimeError):
    """The simulated ranks cannot go on: every unfinished rank waits for another."""


class _Sent:
    """A send that completed when it was queued (the mailbox holds a copy)."""

    def wait(self) -> None:
        return None


def _greenlet() -> Any:
    try:
        import greenlet
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "the simulated world runs its ranks as greenlets: pip install greenlet "
            "(or pip install 'gssgd[sim]')"
        ) from None
    return greenlet


class SimulatedWorld:
    """P simulated ranks: mailboxes for messages, a meeting point for collectives.

    The ranks run as greenlets (coroutines with their own stacks) on the calling thread: a
    rank runs until it must wait (a message not yet sent, a collective not everyone has
    reached), then the scheduler switches to the next rank that can go on, in rank order.
    So a simulated run is deterministic, switching costs microseconds (P = 256 is
    practical), and a deadlock (the ranks calling collectives in different orders, or a
    rank waiting for a message nobody sends) is found at once and named, not waited out.

    Args:
        world_size: the number of ranks, >= 1.

    Raises:
        ValueError: ``world_size`` is not an integer >= 1.
    """

    def __init__(self, world_size: int) -> None:
        check_int("world_size", world_size, 1, fix="A simulated world needs at least one rank.")
        self.world_size = world_size
        self._ranks = [SimulatedRank(self, r) for r in range(world_size)]
        self._reset()

    def rank(self, r: int) -> SimulatedRank:
        """Rank ``r`` of this world: pass it as ``group=`` to an aggregator or hook state.

        Raises:
            ValueError: ``r`` is outside ``[0, world_size)``.
        """
        if not 0 <= r < self.world_size:
            raise ValueError(f"rank {r} is out of range [0, {self.world_size - 1}]")
        return self._ranks[r]

    def run(self, fn: Callable[[SimulatedRank], T]) -> list[T]:
        """Run ``fn(rank)`` on every rank, interleaved at their waits; their results.

        Every rank must make the same collective calls in the same order, as with real
        processes. A rank that raises stops the run: the others are abandoned at their
        waits and the error is raised here (with the rank in a note).

        Returns:
            ``[fn(rank 0), fn(rank 1), ...]``.

        Raises:
            Whatever a rank raised; SimulationError when every unfinished rank waits.
        """
        greenlet = _greenlet()
        self._scheduler = greenlet.getcurrent()
        results: list[Any] = [None] * self.world_size
        lets = [
            greenlet.greenlet(lambda r=r: fn(self._ranks[r])) for r in range(self.world_size)
        ]
        pending = list(range(self.world_size))
        try:
            while pending:
                still, progressed = [], False
                for r in pending:
                    ready = self._waits[r]
                    if ready is not None and not ready():
                        still.append(r)
                        continue
                    self._waits[r] = None
                    progressed = True
                    try:
                        out = lets[r].switch()
                    except BaseException as err:
                        err.add_note(f"(simulated rank {r} of {self.world_size})")
                        raise
                    if lets[r].dead:
                        results[r] = out
                    else:
                        still.append(r)
                if pending and not progressed:
                    raise SimulationError(self._deadlock(still))
                pending = still
        finally:
            if pending:
                self._reset()  # abandon the waiting ranks; the world is usable again
        return results

    # ------------------------------------------------------------------ plumbing
    def _reset(self) -> None:
        self._mailboxes: dict[tuple[int, int], deque[torch.Tensor]] = {}
        self._waits: list[Callable[[], bool] | None] = [None] * self.world_size
        self._what: list[str] = [""] * self.world_size
        self._slots: list[torch.Tensor | None] = [None] * self.world_size
        self._arrived = 0
        self._generation = 0
        self._result: Any = None

    def _deadlock(self, waiting: list[int]) -> str:
        shown = "; ".join(f"rank {r} {self._what[r]}" for r in waiting[:8])
        more = f" (and {len(waiting) - 8} more)" if len(waiting) > 8 else ""
        return (
            f"the simulated ranks cannot go on: {shown}{more}. The ranks called collectives "
            "in different orders, or a rank waits for a message no rank sends."
        )

    def _block(self, rank: int, ready: Callable[[], bool], what: str) -> None:
        """Rank ``rank`` waits until ``ready()``: back to the scheduler meanwhile."""
        if ready():
            return
        self._waits[rank], self._what[rank] = ready, what
        self._scheduler.switch()

    def _mailbox(self, src: int, dst: int) -> deque[torch.Tensor]:
        return self._mailboxes.setdefault((src, dst), deque())

    def _take(self, src: int, dst: int) -> torch.Tensor:
        """Rank ``dst``'s next message from ``src`` (waiting for it)."""
        box = self._mailbox(src, dst)
        self._block(dst, lambda: bool(box), f"waits for a message from rank {src}")
        return box.popleft()

    def _meet(self, rank: int, tensor: torch.Tensor, op: Any) -> Any:
        """Every rank hands in a tensor; the last to arrive combines them (``op``: a reduce
        op, or None to stack them for a gather); every rank gets the combined result."""
        self._slots[rank] = tensor
        self._arrived += 1
        if self._arrived == self.world_size:
            self._combine(op)
            return self._result
        generation = self._generation
        self._block(
            rank, lambda: self._generation != generation, "waits in a collective"
        )
        return self._result

    def _combine(self, op: Any) -> None:
        """Combine the handed-in tensors (a reduction in gloo's order), so every rank gets
        this result."""
        slots = [t for t in self._slots if t is not None]
        if op is None:
            self._result = torch.stack(slots)  # every rank copies its own from this
        else:
            self._result = gloo_ring_reduce(slots, op)
        self._slots = [None] * self.world_size
        self._arrived = 0
        self._generation += 1


class SimulatedRank:
    """One rank of a :class:`SimulatedWorld`: a :class:`gssgd.transport.Transport`.

    Pass it where a process group goes (``group=``): :class:`gssgd.comm.Communicator`
    moves tensors through it instead of ``torch.distributed``.
    """

    def __init__(self, world: SimulatedWorld, rank: int) -> None:
        self.world = world
        self.rank = rank
        self.world_size = world.world_size

    def __repr__(self) -> str:
        return f"SimulatedRank({self.rank} of {self.world_size})"

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.world._mailbox(self.rank, dst).append(tensor.detach().clone())

    def isend(self, tensor: torch.Tensor, dst: int) -> _Sent:
        self.send(tensor, dst)
        return _Sent()

    def recv(self, out: torch.Tensor, src: int) -> None:
        got = self.world._take(src, self.rank)
        if got.shape != out.shape or got.dtype != out.dtype:
            raise SimulationError(
                f"simulated rank {self.rank} expected {tuple(out.shape)} {out.dtype} from rank "
                f"{src} but got {tuple(got.shape)} {got.dtype}: the ranks disagree."
            )
        out.copy_(got)

    def all_reduce(
        self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> None:
        if op not in _REDUCE_OPS:
            raise ValueError(f"the simulated all-reduce supports SUM, MAX and MIN, not {op}")
        if self.world_size > 1:
            tensor.copy_(self.world._meet(self.rank, tensor, op))

    def all_reduce_async(self, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        self.all_reduce(tensor)
        return completed_future(tensor)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self.world_size == 1:
            return [tensor.detach().clone()]
        everyone = self.world._meet(self.rank, tensor.detach(), None)
        return list(everyone.clone().unbind(0))  # one copy of the stack per rank: O(P) work
