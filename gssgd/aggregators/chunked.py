"""Balanced selection by chunk: every part of the model gets its share of the k coordinates.

DeMo (Peng et al. 2024) and SparseLoCo (2025) do not take the k largest coordinates of the
whole model: they cut it into chunks (DeMo: 64×64 DCT blocks; SparseLoCo: 4096 consecutive
elements) and take the largest of each chunk, so a layer whose gradient is small next to
another's still moves every step. gs-SGD can select the same way from its summed sketch
(its ``chunk`` option): the model's d coordinates are cut into chunks of ``chunk``
consecutive coordinates (the last one shorter), a total such as m·k or k is shared out in
proportion to the chunks' lengths (:func:`chunk_quotas`), and each chunk keeps its quota
of largest values (:func:`grouped_topk_indices`). Every rank computes the same quotas and,
from the same values, the same set, so the selection still needs no indices on the wire.
"""

from __future__ import annotations

import torch

__all__ = ["chunk_quotas", "grouped_topk_indices"]


def chunk_quotas(d: int, chunk: int, total: int) -> torch.Tensor:
    """How many of ``total`` selections each chunk of ``chunk`` coordinates gets.

    Chunk c of length L_c gets ``floor(total * L_c / d)``, and the ``total`` minus their sum
    left over go one each to the chunks with the largest remainders (ties: the lower chunk),
    so the quotas add up to ``total`` exactly and none exceeds its chunk's length.

    Args:
        d: the vector's length (>= 1).
        chunk: coordinates per chunk (>= 1; the last chunk holds what is left).
        total: the selections to share out, in [0, d].

    Returns:
        An int64 tensor with one quota per chunk (``ceil(d / chunk)`` of them).

    Raises:
        ValueError: ``chunk`` < 1, or ``total`` outside [0, d].
    """
    if chunk < 1:
        raise ValueError(f"chunk={chunk} is invalid: it must be an integer >= 1")
    if not 0 <= total <= d:
        raise ValueError(f"total={total} is invalid: it must be in [0, d={d}]")
    chunks = -(-d // chunk)
    lengths = torch.full((chunks,), chunk, dtype=torch.int64)
    lengths[-1] = d - chunk * (chunks - 1)
    shares = total * lengths  # exact integers: d * total fits int64 for any model
    quotas = shares // d
    left = total - int(quotas.sum())
    if left:
        by_remainder = torch.argsort(-(shares % d), stable=True)  # ties: the lower chunk
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
        groups: the group of each entry, int64, nondecreasing, in ``[0, len(quotas))``.
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
