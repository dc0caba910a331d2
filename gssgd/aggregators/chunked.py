"""Balanced selection by chunk: every part of the model gets its share of the k coordinates.

DeMo (Peng et al. 2024) and SparseLoCo (2025) do not take the k largest coordinates of the
whole model: they cut it into chunks (DeMo: 64×64 DCT blocks; SparseLoCo: 4096 consecutive
elements) and take the largest of each chunk, so a layer whose gradient is small next to
another's still moves every step. gs-SGD can select the same way from its summed sketch
(its ``chunk`` option): the model's d coordinates are cut into chunks of ``chunk``
consecutive coordinates (the last one shorter); the m·k candidates are shared out over the
chunks in proportion to their lengths, the k delivered in proportion to the candidates
each chunk holds (:func:`shares`: so a chunk never owes more than it has and a step
delivers exactly k), and each chunk keeps its share of largest values
(:func:`grouped_topk_indices`). Every rank computes the same shares and, from the same
values, the same set, so the selection still needs no indices on the wire.
"""

from __future__ import annotations

import torch

__all__ = ["grouped_topk_indices", "shares"]


def shares(total: int, sizes: torch.Tensor) -> torch.Tensor:
    """``total`` selections shared out over groups in proportion to their ``sizes``.

    Group c of size n_c gets ``floor(total * n_c / N)`` (N the sizes' sum), and the
    ``total`` minus their sum left over go one each to the groups with the largest
    remainders ``total * n_c mod N`` (ties: the lower group). So the shares add up to
    ``total`` exactly and none exceeds its group's size: a group whose remainder is nonzero
    has ``floor(total * n_c / N) < n_c``.

    Args:
        total: the selections, in [0, N].
        sizes: int64 sizes of the groups (>= 0), N = their sum >= 1.

    Returns:
        int64 shares, one per group.

    Raises:
        ValueError: ``total`` outside [0, N].
    """
    n = int(sizes.sum())
    if not 0 <= total <= n:
        raise ValueError(f"total={total} is invalid: it must be in [0, {n}]")
    exact = total * sizes.to(torch.int64)  # exact integers: d * total fits int64
    quotas = exact // n
    left = total - int(quotas.sum())
    if left:
        by_remainder = torch.argsort(-(exact % n), stable=True)  # ties: the lower group
        quotas[by_remainder[:left]] += 1
    return quotas


def grouped_topk_indices(
    values: torch.Tensor, groups: torch.Tensor, quotas: torch.Tensor
) -> torch.Tensor:
    """Positions of each group's ``quotas[g]`` largest values, sorted.

    Ties go to the lower position, NaN and ±Inf count as the largest (an overflowed float16
    sketch's heaviest coordinates, as :meth:`gssgd.CountSketch.heavy_hitters` ranks them),
    so every rank holding the same ``values`` selects the same set. A group with fewer
    entries than its quota keeps them all.

    Args:
        values: 1-D scores (typically ``|estimate|`` or ``|exact sum|``).
        groups: the group of each entry (an integer tensor, any order), in
            ``[0, len(quotas))``.
        quotas: how many to keep per group (int64).

    Returns:
        int64 positions into ``values``, ascending.
    """
    scores = torch.where(torch.isfinite(values), values, torch.full_like(values, torch.inf))
    by_value = torch.argsort(scores, descending=True, stable=True)  # ties: lower position
    order = by_value[torch.argsort(groups[by_value], stable=True)]  # by group, then value
    counts = torch.bincount(groups, minlength=quotas.numel())
    starts = torch.cumsum(counts, 0) - counts
    ranked = groups[order]
    rank_in_group = torch.arange(order.numel(), device=values.device) - starts[ranked]
    return order[rank_in_group < quotas.to(values.device)[ranked]].sort().values
