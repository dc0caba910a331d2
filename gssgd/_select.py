"""Deterministic top-k selection: the same input gives the same set on every process.

``torch.topk`` returns *a* set of k largest values, but which of several equal values it
keeps is unspecified and differs between CPU and CUDA. Every rank of a distributed
aggregator must select the identical set, so ties are broken here by the lower index.
"""

from __future__ import annotations

import torch

__all__ = ["topk_indices"]


def topk_indices(values: torch.Tensor, k: int, ordered: bool = True) -> torch.Tensor:
    """Indices of the ``k`` largest entries of a 1-D tensor, ties broken by lower index.

    Steps: (1) ``torch.topk`` finds k largest values and the k-th value ``t``; (2) if fewer
    entries equal ``t`` were picked than exist, re-pick the ties in index order; (3) order
    the result by decreasing value, then increasing index.

    Args:
        values: 1-D tensor (typically ``|x|``); NaN is not allowed.
        k: ``1 <= k <= values.numel()``.
        ordered: sort the result (else the same set in an unspecified order, cheaper).

    Returns:
        int64 tensor of k indices, by decreasing value, ties by increasing index.
    """
    n = values.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}]")
    top_vals, top_idx = torch.topk(values, k, sorted=False)
    threshold = top_vals.min()
    picked_ties = int((top_vals == threshold).sum())
    all_ties = int((values == threshold).sum())
    if all_ties != picked_ties:
        above = torch.nonzero(values > threshold).flatten()
        ties = torch.nonzero(values == threshold).flatten()[: k - above.numel()]
        top_idx = torch.cat([above, ties])
    if not ordered:
        return top_idx
    # Order by (value desc, index asc): a stable sort by value after sorting by index.
    top_idx = top_idx.sort().values
    order = torch.sort(values[top_idx], descending=True, stable=True).indices
    return top_idx[order]
