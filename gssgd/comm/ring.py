"""gloo's ring collectives as formulas: the backend all-reduce and all-gather.

The process group's own collectives (:meth:`~gssgd.comm.Communicator.allreduce_backend`,
:meth:`~gssgd.comm.Communicator.allgather_backend`) run as gloo's rings; these functions
count what each rank moves in them, segment by segment, so the communicator's counts and
the cost model's predictions are the same numbers.
"""

from __future__ import annotations

from gssgd.comm.traffic import Traffic, phase
from gssgd.comm.wire import GLOO_MAX_SEGMENT_BYTES

__all__ = ["allgather", "gloo_ring_segments", "ring_allreduce", "ring_allreduce_bytes"]


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
