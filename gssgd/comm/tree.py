"""A binomial tree: reduce to rank 0, then broadcast from it; its schedule and its formula.

gTop-k as its authors' code runs it (gtopkssgd's ``gtopk_sparse_allreduce``) sends its
(index, value) list *up* a binomial tree to rank 0, merging at every receiver, and rank 0
then broadcasts the final list (MPI's ``Bcast``, a binomial tree for short messages). In
round ``i`` of the reduce, a rank ``r`` with ``r mod 2^(i+1) = 2^i`` sends to ``r - 2^i``
and leaves; a rank with ``r mod 2^(i+1) = 0`` receives from ``r + 2^i`` where that rank
exists. So the reduce takes ``ceil(log2 P)`` rounds for any P (for a power of two, the
authors' pairs exactly: 0 <- 1, 2 <- 3, ...; then 0 <- 2, 4 <- 6; ...), and the broadcast
runs the same tree downwards in as many rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from gssgd.comm.traffic import Traffic, phase

__all__ = ["TreePlan", "tree_plan", "tree_reduce_broadcast"]


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
