"""A method's compression compute per element as a power of the vector size ``d``.

Compute per element is not constant on a CPU: a vector of 1M floats (4 MB) stays in the
caches near the cores, one of 25M (100 MB) streams from memory, so the same passes cost
more per element as ``d`` grows. :class:`ComputeLaw` states that as a line in log-log,
``gamma * (d / COMPUTE_REF_D) ** slope``, and :func:`fit_compute_law` fits it by least squares
to measured ``(d, seconds per element per core)`` points. The cost model's held-out check
(:mod:`gssgd.costmodel.fit`) fits one per method on ``gssgd bench comm`` runs, and
``gssgd advise --device cpu`` (:mod:`gssgd.costmodel.devices`) predicts with the laws of that
fit (stored in ``gssgd/costmodel/data/fit.json``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["COMPUTE_REF_D", "ComputeLaw", "fit_compute_law"]

#: The vector size at which :class:`ComputeLaw` states its ``gamma`` (1M elements).
COMPUTE_REF_D = 10**6


@dataclass(frozen=True)
class ComputeLaw:
    """A method's compute seconds per element on a core of its own, as a power of ``d``:
    ``gamma * (d / COMPUTE_REF_D) ** slope`` (slope 0: the same at every size).

    Attributes:
        gamma: seconds per element at ``d = COMPUTE_REF_D``.
        slope: how fast the cost per element grows with ``d`` (log-log).
    """

    gamma: float
    slope: float = 0.0

    def per_element(self, d: int) -> float:
        """Seconds per element at size ``d``."""
        return self.gamma * (d / COMPUTE_REF_D) ** self.slope

    def seconds(self, d: int, share: float = 1.0) -> float:
        """Compute seconds of a vector of ``d`` elements when ``share`` workers share a core."""
        return share * self.per_element(d) * d


def fit_compute_law(points: Sequence[tuple[int, float]]) -> ComputeLaw:
    """The least-squares :class:`ComputeLaw` through ``(d, seconds per element per core)``
    points (a line in log-log).

    With a single ``d`` among the points the slope cannot be told and is 0 (``gamma`` is
    then the points' geometric mean).

    Args:
        points: measured ``(d, seconds per element on a core of its own)`` pairs.

    Returns:
        The fitted law.

    Raises:
        ValueError: no points, or a non-positive value.
    """
    if not points or any(d <= 0 or v <= 0 for d, v in points):
        raise ValueError(f"need positive (d, seconds per element) points, got {points!r}")
    x = np.log(np.array([d / COMPUTE_REF_D for d, _ in points], dtype=float))
    y = np.log(np.array([v for _, v in points], dtype=float))
    if np.ptp(x) == 0:
        return ComputeLaw(gamma=float(np.exp(y.mean())))
    slope, intercept = np.polyfit(x, y, 1)
    return ComputeLaw(gamma=float(np.exp(intercept)), slope=float(slope))
