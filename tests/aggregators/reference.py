"""Single-process references of every aggregator's math, written independently of gssgd's
distributed code (plain numpy and Python dicts), for the distributed tests to compare with.
"""

from __future__ import annotations

import numpy as np
import torch

from gssgd.sketch import CountSketch


def ref_topk(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, ties by lower index (by a lexicographic sort)."""
    order = np.lexsort((np.arange(values.size), -values))
    return order[:k]


def _merge(a: dict, b: dict, k: int) -> dict:
    """gTop-k merge of {index: (value, contributors)} lists."""
    out: dict[int, tuple[float, frozenset]] = {}
    for lst in (a, b):
        for i, (v, who) in lst.items():
            if i in out:
                out[i] = (out[i][0] + v, out[i][1] | who)
            else:
                out[i] = (v, who)
    keys = np.array(sorted(out))
    vals = np.array([abs(out[i][0]) for i in keys])
    keep = keys[ref_topk(vals, min(k, keys.size))]
    return {int(i): out[int(i)] for i in keep}


def reference_run(method: str, grads: list[list[torch.Tensor]], k: int, opts: dict):
    """Replay ``method`` on grads[t][p] in one process.

    Returns:
        (updates per step as float64 arrays, final residual per rank as float64 arrays).
    """
    steps, world = len(grads), len(grads[0])
    d = grads[0][0].numel()
    rho = opts.get("momentum", 0.0)
    e = [np.zeros(d) for _ in range(world)]
    u = [np.zeros(d) for _ in range(world)]
    updates = []
    for t in range(steps):
        g = [grads[t][p].double().numpy() for p in range(world)]
        if method == "dense":
            updates.append(sum(g) / world)
            continue
        a = []
        for p in range(world):
            u[p] = rho * u[p] + g[p] if rho > 0 else g[p]
            a.append(e[p] + u[p])
        update = np.zeros(d)
        delivered: list[np.ndarray] = [np.array([], dtype=np.int64)] * world
        if method == "topk":
            for p in range(world):
                idx = ref_topk(np.abs(a[p]), k)
                update[idx] += a[p][idx]
                delivered[p] = idx
        elif method == "gtopk":
            lists = []
            for p in range(world):
                idx = ref_topk(np.abs(a[p]), k)
                lists.append({int(i): (a[p][i], frozenset([p])) for i in idx})
            power = 1 << (world.bit_length() - 1)
            for r in range(power, world):
                lists[r - power] = _merge(lists[r - power], lists[r], k)
            step = 1
            while step < power:
                for p in range(power):
                    q = p ^ step
                    if p < q:
                        lists[p] = lists[q] = _merge(lists[p], lists[q], k)
                step <<= 1
            final = lists[0]
            for i, (v, _who) in final.items():
                update[i] = v
            delivered = [
                np.array([i for i, (_, w) in final.items() if p in w], dtype=np.int64)
                for p in range(world)
            ]
        elif method in ("sketched", "gs"):
            sketches = []
            for p in range(world):
                sk = CountSketch(d, rows=opts["rows"], cols=opts["cols"], seed=opts.get("seed", 0))
                sk.accumulate(torch.from_numpy(a[p]).float())
                sketches.append(sk)
            summed = sketches[0]
            for sk in sketches[1:]:
                summed = summed + sk
            est = summed.query().double().numpy()
            if opts.get("exact", True):
                cand = ref_topk(np.abs(est), min(opts["candidates"] * k, d))
                exact = sum(a[p][cand] for p in range(world))
                keep = ref_topk(np.abs(exact), k)
                chosen, values = cand[keep], exact[keep]
            else:
                chosen = ref_topk(np.abs(est), k)
                values = est[chosen]
            update[chosen] = values
            delivered = [chosen] * world
        else:
            raise ValueError(method)
        for p in range(world):
            a[p][delivered[p]] = 0
            e[p] = a[p]
            if rho > 0:
                u[p][delivered[p]] = 0
        updates.append(update / world)
    return updates, e
