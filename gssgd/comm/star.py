"""The star around rank 0 as formulas: every rank talks to rank 0 alone, as Sketched-SGD's
parameter server does (:meth:`~gssgd.comm.Communicator.gather_to_root`,
:meth:`~gssgd.comm.Communicator.broadcast_from_root`)."""

from __future__ import annotations

from gssgd.comm.traffic import Traffic, phase

__all__ = ["star_broadcast", "star_gather"]


def star_gather(nbytes: int, world_size: int, tensors: int = 1) -> Traffic:
    """Every other rank sends ``nbytes`` (``tensors`` messages) to rank 0
    (:meth:`~gssgd.comm.Communicator.gather_to_root`): rank 0's link carries ``P-1`` copies.
    One round."""
    p = world_size
    sent = (0,) + (nbytes,) * (p - 1)
    received = ((p - 1) * nbytes,) + (0,) * (p - 1)
    messages = (0,) + (tensors,) * (p - 1)
    return phase(sent, received, 1, messages, ((p - 1) * tensors,) + (0,) * (p - 1))


def star_broadcast(nbytes: int, world_size: int, tensors: int = 1) -> Traffic:
    """Rank 0 sends ``nbytes`` (``tensors`` messages) to every other rank, one by one
    (:meth:`~gssgd.comm.Communicator.broadcast_from_root`): a star, not a tree. One round."""
    gather = star_gather(nbytes, world_size, tensors)
    return Traffic(gather.received, gather.sent, 1, gather.critical_bytes,
                   gather.messages_received, gather.messages, gather.critical_headers)
