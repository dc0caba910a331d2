"""Recursive doubling: its schedule (who talks to whom) and its traffic formula.

In ``log2 P2`` rounds rank ``p`` exchanges its payload with ``p XOR 2^i`` and combines the
two, ``P2`` the largest power of two ``<= P``. For a world size that is not a power of two,
the ranks past ``P2`` first *fold in* (send their payload to rank ``p - P2``, which combines
it into its own) and *receive the result last*. gs-SGD's dense sketch all-reduce and gTop-k's
sparse merges run this pattern (:meth:`~gssgd.comm.Communicator.recursive_doubling`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gssgd.comm.traffic import Traffic, phase

__all__ = ["RecursiveDoublingPlan", "recursive_doubling", "recursive_doubling_plan"]


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
