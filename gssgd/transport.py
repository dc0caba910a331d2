"""How tensors move between ranks: the few primitives :class:`gssgd.comm.Communicator` needs.

The communicator counts bytes, messages, rounds and seconds; a *transport* only moves the
tensors. Two transports share one contract (:class:`Transport`):

* :class:`DistTransport`: ``torch.distributed`` over a process group (gloo, NCCL): the
  real thing, one process per rank;
* :class:`gssgd.simulated.SimulatedRank`: one rank of a simulated world, P ranks as
  coroutines of one process exchanging tensors in memory (large-P studies on one machine).

Ranks are group-local everywhere: the transport translates them where the backend needs
global ranks. All collectives of a transport are called by every rank of its group in the
same order, as with ``torch.distributed``.

The futures an asynchronous collective and a DDP hook return are built here too
(:func:`new_future`, :func:`completed_future`, :func:`chain`); :mod:`gssgd.comm` exports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

__all__ = ["DistTransport", "Transport", "Waitable", "chain", "completed_future", "new_future"]


def new_future(device: torch.device) -> torch.futures.Future[torch.Tensor]:
    """A future that may hold tensors on ``device`` (CUDA futures must name their device):
    what a DDP communication hook returns for a bucket it completes later."""
    return torch.futures.Future(devices=[device] if device.type != "cpu" else None)


def completed_future(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future that already holds ``tensor``."""
    fut = new_future(tensor.device)
    fut.set_result(tensor)
    return fut


def chain(fut: torch.futures.Future[Any], then: Callable[[Any], torch.Tensor],
          device: torch.device) -> torch.futures.Future[torch.Tensor]:
    """``fut.then``, keeping an error's type: the returned future holds ``then`` of
    ``fut``'s value once ``fut`` completes (on the thread that completes it), and fails with
    the very exception ``then`` or ``fut`` raised. (``Future.then`` turns every error into
    a RuntimeError, so a FloatingPointError of a callback would arrive as one.)"""
    out = new_future(device)

    def run(done: torch.futures.Future[Any]) -> None:
        try:
            out.set_result(then(done.value()))
        except BaseException as exc:
            out.set_exception(exc)

    fut.add_done_callback(run)
    return out


class Waitable(Protocol):
    """What a non-blocking send returns: ``wait()`` returns once the tensor is sent."""

    def wait(self) -> object: ...


@runtime_checkable
class Transport(Protocol):
    """The primitives of :class:`gssgd.comm.Communicator`, over group-local ranks.

    Attributes:
        rank: this rank in the group, in ``[0, world_size)``.
        world_size: the number of ranks in the group.
    """

    rank: int
    world_size: int

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Send ``tensor`` to rank ``dst`` (blocking until it may be reused)."""
        ...

    def isend(self, tensor: torch.Tensor, dst: int) -> Waitable:
        """Start sending ``tensor`` to ``dst``; don't change it before ``wait()``."""
        ...

    def recv(self, out: torch.Tensor, src: int) -> None:
        """Receive into ``out`` (shape and dtype as sent) from rank ``src``."""
        ...

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType) -> None:
        """Reduce ``tensor`` over the ranks, in place (the sum's order is the transport's)."""
        ...

    def all_reduce_async(self, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """Sum ``tensor`` over the ranks in place; the future holds ``tensor`` when done."""
        ...

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape and dtype everywhere), by rank, in tensors
        this rank owns."""
        ...


class DistTransport:
    """:class:`Transport` over a ``torch.distributed`` process group.

    Args:
        group: the process group (None: the default group).

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised: call "
                "torch.distributed.init_process_group('gloo' or 'nccl') first (torchrun or "
                "`gssgd train` do this for you), or pass a simulated rank as the group "
                "(gssgd.simulated.SimulatedWorld(P).rank(r))."
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor.contiguous(), self._global(dst), group=self.group)

    def isend(self, tensor: torch.Tensor, dst: int) -> Waitable:
        work = dist.isend(tensor.contiguous(), self._global(dst), group=self.group)
        assert work is not None
        return work

    def recv(self, out: torch.Tensor, src: int) -> None:
        dist.recv(out, self._global(src), group=self.group)

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType) -> None:
        if self.world_size > 1:
            dist.all_reduce(tensor, op=op, group=self.group)

    def all_reduce_async(self, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        if self.world_size == 1:  # as all_reduce: nothing to sum
            return completed_future(tensor)
        work = dist.all_reduce(tensor, group=self.group, async_op=True)
        assert work is not None
        return work.get_future().then(lambda fut: fut.value()[0])

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor.contiguous(), group=self.group)
        return out
