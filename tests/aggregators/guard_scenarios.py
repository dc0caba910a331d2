"""Worker functions for the collapse-guard tests (importable by spawned processes)."""

from __future__ import annotations

import torch

import gssgd

D = 50_000


def concentrated_grad(rank: int, step: int) -> torch.Tensor:
    """Most mass on 300 active coordinates, a little noise elsewhere."""
    gen = torch.Generator().manual_seed(97 * step + rank)
    g = 0.001 * torch.randn(D, generator=gen)
    g[:300] += torch.randn(300, generator=gen)
    return g


def run_guard(rank: int, world_size: int, cols: int, guard: str, steps: int,
              audit: str = "tops") -> dict:
    agg = gssgd.make_aggregator("gs", D, k=50, rows=3, cols=cols, candidates=2, guard=guard,
                                audit=audit)
    recalls, audited, bytes_sent, both = [], [], [], []
    try:
        for t in range(steps):
            agg.step(concentrated_grad(rank, t))
            recalls.append(agg.guard.last_recall)
            audited.append(agg.last_stats.audited_recall)
            bytes_sent.append(agg.last_stats.bytes_sent)
            if agg.last_stats.audited_recall is not None:
                both.append(dict(agg.audit_recalls))
    except RuntimeError as exc:
        return {"error": str(exc), "cols": agg.cols, "num_candidates": agg.num_candidates}
    return {
        "cols": agg.cols,
        "recalls": recalls,
        "audited": audited,
        "bytes": bytes_sent,
        "audit_recalls": both,
        "state_cols": agg.state_dict()["cols"],
        "num_candidates": agg.num_candidates,
    }
