"""From a coordinate's buckets to its estimate, and how estimates are ranked.

A Count Sketch estimates coordinate ``i`` by the median over rows of its signed buckets
(:func:`median_of_rows`); recovery ranks coordinates by ``|estimate|``, with every
non-finite estimate first (:func:`nonfinite_as_largest`).
"""

from __future__ import annotations

import torch

__all__ = ["median_of_rows", "nonfinite_as_largest"]


def nonfinite_as_largest(magnitude: torch.Tensor) -> torch.Tensor:
    """``magnitude`` (``|estimates|``) with NaN as +inf: a total order that ranks every
    non-finite estimate first and equally (ties then go to the lower index)."""
    return torch.where(torch.isnan(magnitude), torch.inf, magnitude)



def median_of_rows(values: list[torch.Tensor]) -> torch.Tensor:
    """Element-wise median of an odd number of equal-length vectors (one: itself, uncopied).

    Three and five rows use min/max networks (a few element-wise passes, instead of
    ``torch.median``'s sort); the result is the same order statistic, bit for bit.
    """
    n = len(values)
    if n == 1:
        return values[0]
    if n == 3:
        a, b, c = values
        return torch.maximum(torch.minimum(a, b), torch.minimum(torch.maximum(a, b), c))
    if n == 5:
        a, b, c, d, e = values
        lo_ab, hi_ab = torch.minimum(a, b), torch.maximum(a, b)
        lo_cd, hi_cd = torch.minimum(c, d), torch.maximum(c, d)
        # Neither the least nor the greatest of a..d can be the median of five.
        x, y = torch.maximum(lo_ab, lo_cd), torch.minimum(hi_ab, hi_cd)
        return torch.maximum(torch.minimum(x, y), torch.minimum(torch.maximum(x, y), e))
    return torch.stack(values).median(dim=0).values
