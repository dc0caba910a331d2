"""An independent single-process PowerSGD: every rank's gradients in one place, the
averages taken directly, 2-D matrix products, a Gram-Schmidt of its own.

Written from the algorithm (Vogels et al. 2019; PyTorch's ``powerSGD_hook`` for the
error-feedback rule and the order of the random draws), not from ``gssgd``: nothing of the
package is imported here, so a mistake there cannot be copied into the expectation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

Shape = tuple[int, ...]


def plan(shapes: Sequence[Shape], rank: int, rate: float = 2.0):
    """``(dense, matrices)``: ``(offset, numel)`` of the tensors sent as they are, and
    ``(offset, n, m, r)`` of the compressed ones, grouped by ``(n, m)`` in the order each
    shape first appears (PyTorch's order of the P and Q buffers and of the random draws)."""
    dense, matrices, offset = [], [], 0
    for shape in shapes:
        numel = math.prod(shape)
        n = shape[0] if len(shape) >= 2 else 0
        m = numel // n if n else 0
        r = min(rank, n, m)
        if len(shape) >= 2 and numel and r * (n + m) * rate < n * m:
            matrices.append((offset, n, m, r))
        elif numel:
            dense.append((offset, numel))
        offset += numel
    order = list(dict.fromkeys((n, m) for _, n, m, _ in matrices))
    matrices.sort(key=lambda e: order.index((e[1], e[2])))  # stable: vector order within
    return dense, matrices


def orthonormal(x: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the columns of a 2-D ``x`` (a new tensor)."""
    x = x.clone()
    for i in range(x.shape[1]):
        x[:, i] /= torch.linalg.vector_norm(x[:, i])
        if i + 1 < x.shape[1]:
            x[:, i + 1 :] -= torch.outer(x[:, i], x[:, i] @ x[:, i + 1 :])
    return x


def reference_powersgd(
    grads: Sequence[Sequence[torch.Tensor]],
    shapes: Sequence[Shape],
    rank: int,
    seed: int = 0,
    warm_start: bool = True,
    momentum: float = 0.0,
    dtype: torch.dtype = torch.float64,
    feedback: str = "ef",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """PowerSGD over ``grads[t][p]`` (step t, rank p; 1-D), computed in ``dtype`` (float64
    by default: the exact math, which a float32 run should follow to its rounding).

    Per step: ``a_p = e_p + g_p`` (``e_p + u_p`` with momentum; with ``feedback="onebit"``,
    1-bit Adam's ``a_p = e_p + momentum * M + (1 - momentum) * g_p``, ``M`` the last
    step's update, 0 at first); the dense tensors are
    averaged; each compressed matrix's ``Q`` (a standard normal draw from a generator
    seeded with ``seed`` at the first step, or every step without warm start; otherwise
    the last mean ``Q``) is orthonormalised, ``P = orthonormal(sum_p M_p Q)``, ``Q =
    mean_p M_p^T P``, and the update there is ``P Q^T``; ``e_p = a_p - update``.

    Returns:
        The update of every step, and every rank's residual after the last.
    """
    world, d = len(grads[0]), grads[0][0].numel()
    dense, matrices = plan(shapes, rank)
    residuals = [torch.zeros(d, dtype=dtype) for _ in range(world)]
    velocity = [torch.zeros(d, dtype=dtype) for _ in range(world)]
    grads = [[g.to(dtype) for g in step] for step in grads]
    gen = torch.Generator().manual_seed(seed)
    queries: list[torch.Tensor] | None = None
    updates = []
    shared = torch.zeros(d, dtype=dtype)  # 1-bit Adam's M
    for step in grads:
        if feedback == "onebit":
            acc = [e + momentum * shared + (1 - momentum) * g
                   for e, g in zip(residuals, step, strict=True)]
        elif momentum:
            velocity = [momentum * v + g for v, g in zip(velocity, step, strict=True)]
            acc = [e + v for e, v in zip(residuals, velocity, strict=True)]
        else:
            acc = [e + g for e, g in zip(residuals, step, strict=True)]
        update = torch.zeros(d, dtype=dtype)
        for o, n in dense:
            update[o : o + n] = sum(a[o : o + n] for a in acc) / world
        if queries is None or not warm_start:
            queries = [torch.randn((m, r), generator=gen).to(dtype) for _, _, m, r in matrices]
        means = []
        for (o, n, m, _), q in zip(matrices, queries, strict=True):
            ms = [a[o : o + n * m].view(n, m) for a in acc]
            q = orthonormal(q)
            p = orthonormal(sum(mat @ q for mat in ms))
            q_mean = sum(mat.T @ p for mat in ms) / world
            update[o : o + n * m] = (p @ q_mean.T).reshape(-1)
            means.append(q_mean)
        queries = means
        residuals = [a - update for a in acc]
        shared = update
        updates.append(update)
    return updates, residuals
