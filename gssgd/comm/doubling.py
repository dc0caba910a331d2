"""Recursive doubling: its schedule (who talks to whom) and its traffic formula.

In ``log2 P2`` rounds rank ``p`` exchanges its payload with ``p XOR 2^i`` and combines the
two, ``P2`` the largest power of two ``<= P``. For a world size that is not a power of two,
the ranks past ``P2`` first *fold in* (send their payload to rank ``p - P2``, which combines
it into its own) and *receive the result last*. gs-SGD's dense sketch all-reduce and gTop-k's
sparse merges run this pattern (:meth:`~gssgd.comm.Communicator.recursive_doubling`).

Recursive *halving and doubling* (Rabenseifner's all-reduce) sums a vector in the bytes of
a ring and the rounds of a tree: a reduce-scatter by recursive halving (in round ``i`` rank
``p`` keeps half of its current range of the vector's ``P2`` chunks, sends the other half
to ``p XOR P2/2^(i+1)`` and adds what that partner sends of its own half), then an
all-gather by recursive doubling back up; ``2 log2 P2`` rounds, about ``2 n (P2-1)/P2``
bytes each way, the same fold-in and result for the ranks past ``P2``
(:meth:`~gssgd.comm.Communicator.allreduce_halving_doubling`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gssgd.comm.traffic import Traffic, phase

__all__ = ["RecursiveDoublingPlan", "chunk_bounds", "halving_doubling",
           "halving_doubling_schedule", "recursive_doubling", "recursive_doubling_plan"]


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
