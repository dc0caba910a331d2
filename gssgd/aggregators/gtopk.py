"""Global Top-k by recursive doubling (gTop-k; Shi et al., ICDCS 2019).

Steps (per rank p, each step):
    1. Accumulate: ``a_p = e_p + u_p``.
    2. Compress: the local top-k of ``|a_p|`` as an (index, value) list.
    3. Communicate and merge, log2(P) rounds: exchange lists with partner ``p XOR 2^i``; sum
       the values of equal indices; keep the top-k of the merged list by ``|value|`` (ties
       by lower index). Both partners compute bitwise the same list. With P not a power of
       two, the extra ranks fold their list into partner ``p - P2`` first and receive the
       final list, plus which of their contributions survived, last.
    4. Track survival: this rank's contribution at index i is *delivered* only if i stayed
       in the merged list after every merge it took part in.
    5. Update: the final list / P. Error feedback: ``e_p = a_p`` with only the delivered
       coordinates zeroed; contributions cut during a merge stay in the residual.

Each rank sends about 8k bytes per round for log2(P) rounds. The index messages end with
the ranks' non-finite flags, one bit per rank OR-ed at every merge, so after the last round
every rank knows whether to skip the step (its ``nonfinite`` policy) without a message of
their own.

``exchange="tree"`` runs gTop-k as its authors' code does (gtopkssgd,
``gtopk_sparse_allreduce``): step 3 sends the list *up* a binomial tree to rank 0 in
``ceil(log2 P)`` rounds, each receiver merging on the host (the selection copied there from
the device, as the authors' ``.cpu().numpy()`` does), and rank 0 broadcasts the final list
down the same tree (:mod:`gssgd.comm.patterns`); any P. Step 4 is the authors' rule: a rank's
coordinate is delivered when its index is in the final list (their ``included_indexes``).
Their per-round barrier is left out (it only adds waiting) and indices travel as integers
(theirs as float32, exact only below 2^24).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gssgd.aggregators.base import Aggregator, flag_mask_words, index_dtype, present_in
from gssgd.aggregators.topk import TopkOptions
from gssgd.comm import (
    Traffic,
    recursive_doubling,
    recursive_doubling_plan,
    tree_plan,
    tree_reduce_broadcast,
)
from gssgd.selection import topk_indices
from gssgd.validate import bad_value

__all__ = ["EXCHANGES", "GlobalTopk", "GlobalTopkOptions", "merge_topk", "present_in"]

#: How the ranks' lists meet: the symmetric exchange of the paper's cost formula, or the
#: authors' code's reduce to rank 0 and broadcast.
EXCHANGES = ("doubling", "tree")

#: Lists at least this fraction of d long are merged on a d-long buffer, not by sorting
#: their indices: a dense warm-up step sends k near d, where sorting costs 2x (and a
#: simulated P = 64 step merges 384 such lists).
DENSE_MERGE_FRACTION = 1 / 16


def merge_topk(mine: list[torch.Tensor], theirs: list[torch.Tensor], k: int,
               d: int | None = None) -> list[torch.Tensor]:
    """Merge two (index, value) lists: sum equal indices, keep the top-k by |value|.

    Symmetric: ``merge_topk(a, b, k)`` equals ``merge_topk(b, a, k)`` bitwise, because the
    union is sorted by index and float addition of two numbers is commutative. Each list
    holds an index at most once.

    Args:
        mine, theirs: (indices, values) lists.
        k: how many to keep.
        d: the vector's length; where given and the lists are long against it
            (:data:`DENSE_MERGE_FRACTION`), the union is found on a d-long buffer instead
            of by a sort: the same union, sums (``0 + mine + theirs``, as the sort's
            scatter-add adds them) and selection, bit for bit.
    """
    idx = [mine[0].to(torch.int64), theirs[0].to(torch.int64)]
    if d is not None and (idx[0].numel() + idx[1].numel()) >= DENSE_MERGE_FRACTION * d:
        summed = torch.zeros(d, dtype=mine[1].dtype, device=mine[1].device)
        summed.index_add_(0, idx[0], mine[1])
        summed.index_add_(0, idx[1], theirs[1])
        union = present_in(idx[0], d, idx[1]).nonzero().squeeze(1)  # sorted
        summed = summed[union]
    else:
        all_vals = torch.cat([mine[1], theirs[1]])
        union, slot = torch.unique(torch.cat(idx), sorted=True, return_inverse=True)
        summed = torch.zeros(union.numel(), dtype=all_vals.dtype, device=all_vals.device)
        summed.index_add_(0, slot, all_vals)
    keep = topk_indices(summed.abs(), min(k, union.numel()))
    return [union[keep].to(mine[0].dtype), summed[keep]]


def _packed(pair: list[torch.Tensor], mask: torch.Tensor) -> list[torch.Tensor]:
    """An (index, value) list as it travels: the ranks' non-finite flags (``mask``,
    :meth:`~gssgd.aggregators.base.Aggregator._flag_mask`) after the indices."""
    return [torch.cat([pair[0], mask.to(pair[0].device)]), *pair[1:]]


def _unpacked(message: list[torch.Tensor], words: int
              ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A received :func:`_packed` list (and whatever travels after it), and its mask."""
    return [message[0][:-words], *message[1:]], message[0][-words:]


def _cut_dropped(kept: torch.Tensor, merged_idx: torch.Tensor, tracked: list[torch.Tensor],
                 alive: list[torch.Tensor]) -> None:
    """After a merge: each tracked list's survival flags (``alive``, in place) lose the
    indices the merged list no longer holds. ``kept`` is an all-False d-long mask, marked at
    the merged indices for the lookup and cleared again: O(k) a round, not O(d)."""
    positions = merged_idx.to(torch.int64)
    kept[positions] = True
    for idx, flags in zip(tracked, alive, strict=True):
        flags &= kept[idx]
    kept[positions] = False


@dataclass(frozen=True)
class GlobalTopkOptions(TopkOptions):
    """Global Top-k: :class:`~gssgd.aggregators.topk.TopkOptions`, and ``exchange``:
    ``"doubling"`` (the default: recursive doubling, both partners merge on the device) or
    ``"tree"`` (as the authors' code: a binomial tree to rank 0 with host merges, then a
    broadcast; see the module doc)."""

    exchange: str = "doubling"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.exchange not in EXCHANGES:
            raise bad_value("exchange", self.exchange, f"it must be one of {', '.join(EXCHANGES)}",
                            "Use 'doubling' (the default) or 'tree' (the authors' pattern).")


class GlobalTopk(Aggregator):
    """Global top-k: every rank applies the same k coordinates of the summed gradient."""

    name = "gtopk"
    flags_ride = True
    Options = GlobalTopkOptions
    options: GlobalTopkOptions

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: GlobalTopkOptions, world_size: int, *,
        step: int | None = None
    ) -> Traffic:
        """Recursive doubling of (index, value) lists, two messages each, the indices
        followed by the ranks' non-finite flags as bits (:func:`flag_mask_words`); a folded
        rank also gets k survival flags (uint8, a third message) back with the final list
        (the step's k). ``exchange="tree"``: the list up a binomial tree and the final list
        down it, two messages each time."""
        k = cls.k_at_step(d, k, options, step)
        index_bytes = index_dtype(d).itemsize
        pair = k * (index_bytes + 4) + flag_mask_words(world_size, index_bytes) * index_bytes
        if options.exchange == "tree":
            return tree_reduce_broadcast(pair, world_size, tensors=2)
        return recursive_doubling(pair, world_size, k, tensors=2, result_tensors=3)

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        if self._sends_dense_now():  # a warm-up step that would cost more than dense
            return self._dense_warmup_step(grad)
        accumulated, bad = self._begin_riding(grad)
        k = self.step_k  # k, or more during a density warm-up
        with self._timed("compress"):
            own_pos = topk_indices(accumulated.abs(), k)
            own = [own_pos.to(index_dtype(self.d)), accumulated[own_pos]]
            mask = self._flag_mask([self.rank] if bad else [], own[0].dtype, own[0].device)

        tree = self.options.exchange == "tree"
        exchange = self._tree_exchange if tree else self._doubling
        merged, own_alive, mask = exchange(own, mask, k)
        skipped = self._guard(grad, self._ranks_in_mask(mask))
        if skipped is not None:
            return skipped
        with self._timed("decompress"):
            final_idx, final_vals = merged[0].to(torch.int64), merged[1]
            update = torch.zeros_like(accumulated)  # in the residual's dtype
            update[final_idx] = final_vals / self.world_size
            if tree:  # the authors' rule: delivered where the index is in the final list
                own_alive = present_in(final_idx, self.d)[own_pos]
            self.feedback.keep(accumulated, own_pos[own_alive])
        return self._finish(update)

    def _doubling(self, own: list[torch.Tensor], mask: torch.Tensor, k: int
                  ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Steps 3-4 by recursive doubling: the final list, which of this rank's k
        contributions survived every merge it took part in, and every rank's non-finite
        flag (``mask``, this rank's, OR-ed with each partner's on the way)."""
        merged, own_pos, words = own, own[0].to(torch.int64), mask.numel()
        own_alive = torch.ones(k, dtype=torch.bool, device=own_pos.device)
        plan = recursive_doubling_plan(self.rank, self.world_size)
        self.comm.count_rounds(plan.rounds)
        if plan.fold_into is not None:
            # An extra rank: fold in, then receive the final list and what of ours survived.
            self.comm.send(_packed(merged, mask), plan.fold_into)
            like = [*_packed(merged, mask), own_alive.to(torch.uint8)]
            (*merged, alive_u8), mask = _unpacked(self.comm.recv(like, plan.fold_into), words)
            return merged, alive_u8.bool(), mask
        # whose contributions this rank tracks: its own, and a folded-in rank's
        tracked, alive = [own_pos], [own_alive]
        kept = torch.zeros(self.d, dtype=torch.bool, device=own_pos.device)  # one mask a step
        if plan.folded_from is not None:
            folded, theirs = _unpacked(self.comm.recv(_packed(merged, mask), plan.folded_from),
                                       words)
            mask = mask | theirs
            tracked.append(folded[0].to(torch.int64))
            alive.append(torch.ones(folded[0].numel(), dtype=torch.bool, device=own_pos.device))
            merged = merge_topk(merged, folded, k, self.d)
            _cut_dropped(kept, merged[0], tracked, alive)
        for peer in plan.partners:
            partner, theirs = _unpacked(self.comm.exchange(_packed(merged, mask), peer), words)
            mask = mask | theirs
            merged = merge_topk(merged, partner, k, self.d)
            _cut_dropped(kept, merged[0], tracked, alive)
        if plan.folded_from is not None:
            self.comm.send([*_packed(merged, mask), alive[1].to(torch.uint8)],
                           plan.folded_from)
        return merged, own_alive, mask

    def _tree_exchange(self, own: list[torch.Tensor], mask: torch.Tensor, k: int
                       ) -> tuple[list[torch.Tensor], None, torch.Tensor]:
        """Step 3 with ``exchange="tree"`` (the authors' pattern, see the module doc): the
        final list (who contributed is decided against it, by their rule) and every rank's
        non-finite flag (``mask``: OR-ed up the tree, the root's sent down with the list)."""
        device, host, words = own[0].device, torch.device("cpu"), mask.numel()
        plan = tree_plan(self.rank, self.world_size)
        self.comm.count_rounds(plan.rounds)
        like = _packed(own, mask)  # what every message of the exchange looks like
        with self._timed("compress"):  # the selection goes to the host, as theirs
            merged = [t.to(host) for t in own]
        for child in plan.children:  # the reduce: merge what each child sends, on the host
            theirs, their_mask = _unpacked([t.to(host) for t in self.comm.recv(like, child)],
                                           words)
            mask = mask | their_mask.to(device)
            with self._timed("compress"):
                merged = merge_topk(merged, theirs, k, self.d)
        if plan.parent is not None:
            self.comm.send(_packed([t.to(device) for t in merged], mask), plan.parent)
            # the final list and every rank's flags, down the tree
            merged, mask = _unpacked(self.comm.recv(like, plan.parent), words)
        else:
            merged = [t.to(device) for t in merged]
        for child in reversed(plan.children):  # the broadcast: the largest subtree first
            self.comm.send(_packed(merged, mask), child)
        return merged, None, mask
