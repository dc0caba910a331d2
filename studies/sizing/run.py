"""How large must gs-SGD's sketch be? Recall of the exact top-k mass on real training.

Trains a model with *ideal* global top-k and error feedback (what gs-SGD approximates),
simulating P workers in one process: each step every worker's gradient on its own shard is
accumulated with its residual, the global accumulated vector A = sum_p a_p is formed, and
at a few checkpoints every candidate sketch configuration (rows, cols, m) is applied to
the per-worker vectors exactly as gs-SGD would: sketch each a_p, sum the tables, take the
top m*k candidates, sum the exact values, keep the top k. Its quality is the *mass recall*:
||A at the chosen k||^2 / ||top-k of A||^2 (1.0 = exact global top-k).

Run: python studies/sizing/run.py --dataset mnist --density 0.001 --steps 300
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F

from gssgd.selection import topk_indices
from gssgd.sketch import CountSketch
from gssgd.train.data import ImageData, batch_indices, lm_batch, load_dataset
from gssgd.train.models import build_model, default_model


def concentration(per_worker: list[torch.Tensor], k: int, prefilter: int = 8) -> dict[str, float]:
    """How much the workers' heavy coordinates agree: ``union`` = |union of each worker's
    top-k| / (P k) (1/P: all agree, 1: disjoint), and ``prefilter_recall``: the share of
    the global top-k that lies in the union of each worker's top-(prefilter k)."""
    total = torch.stack(per_worker).sum(0)
    best = set(topk_indices(total.abs(), k).tolist())
    tops = [set(topk_indices(a.abs(), k).tolist()) for a in per_worker]
    wide = set().union(*(topk_indices(a.abs(), min(prefilter * k, a.numel())).tolist()
                         for a in per_worker))
    return {"union": len(set().union(*tops)) / (len(per_worker) * k),
            "prefilter_recall": len(best & wide) / k}


def mass_recall(per_worker: list[torch.Tensor], k: int, rows: int, cols: int, m: int,
                prefilter: int = 0) -> float:
    """Mass recall of the sketch (rows x cols, m*k candidates); ``prefilter`` f > 0: each
    worker sketches only its own f*k largest coordinates, as gs's pre-filter does."""
    total = torch.stack(per_worker).sum(0)
    best = total[topk_indices(total.abs(), k)].double().pow(2).sum()
    summed = None
    for a in per_worker:
        if prefilter:
            keep = topk_indices(a.abs(), min(prefilter * k, a.numel()))
            a = torch.zeros_like(a).index_copy_(0, keep, a[keep])
        sk = CountSketch(total.numel(), rows=rows, cols=cols, seed=0, cache_hashes=True)
        sk.accumulate(a)
        summed = sk if summed is None else summed + sk
    cand = summed.heavy_hitters(min(m * k, total.numel()))[0]
    chosen = cand[topk_indices(total[cand].abs(), k)]
    return float(total[chosen].double().pow(2).sum() / best)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--model", default=None)
    p.add_argument("--density", type=float, default=0.001)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoints", default="20,100,300")
    p.add_argument("--json", default=None)
    p.add_argument("--grid", default=None,
                   help="rows:cols_per_k:m[:prefilter],... (default: rows 1,3,5 x cols "
                   "(2,10,40,160)·k x m 1,4,16, no pre-filter)")
    args = p.parse_args()
    torch.manual_seed(0)
    data = load_dataset(args.dataset)
    model = build_model(args.model or default_model(data), data)
    params = [q for q in model.parameters() if q.requires_grad]
    d = sum(q.numel() for q in params)
    k = max(1, round(args.density * d))
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    residual = [torch.zeros(d) for _ in range(args.workers)]
    checkpoints = {int(s) for s in args.checkpoints.split(",")}
    grid = [(r, c, m, 0) for r in (1, 3, 5) for c in (2, 10, 40, 160) for m in (1, 4, 16)]
    if args.grid:
        grid = [(*(int(v) for v in item.split(":")), 0)[:4] for item in args.grid.split(",")]
    out = {"dataset": args.dataset, "d": d, "k": k, "P": args.workers, "results": []}
    print(f"d={d:,} k={k} P={args.workers}")
    for step in range(1, args.steps + 1):
        acc = []
        for w in range(args.workers):
            model.zero_grad()
            if isinstance(data, ImageData):
                idx = batch_indices(step, w, args.workers, args.batch_size, len(data.y_train), 0)
                loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx])
            else:
                x, y = lm_batch(data.train, step, w, args.workers, args.batch_size, 64, 0)
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            g = torch.cat([q.grad.flatten() for q in params])
            acc.append(residual[w] + g)
        total = torch.stack(acc).sum(0)
        chosen = topk_indices(total.abs(), k)
        if step in checkpoints:
            for rows, cpk, m, pf in grid:
                rec = mass_recall(acc, k, rows, cpk * k, m, pf)
                out["results"].append({"step": step, "rows": rows, "cols_per_k": cpk,
                                       "m": m, "prefilter": pf, "recall": rec})
            agree = concentration(acc, k)
            out.setdefault("concentration", []).append({"step": step, **agree})
            print(f"step {step} loss {loss.item():.3f} union {agree['union']:.2f} "
                  f"prefilter recall {agree['prefilter_recall']:.2f}")
            for r in out["results"]:
                if r["step"] == step:
                    print(f"  rows={r['rows']} cols={r['cols_per_k']}·k m={r['m']} "
                          f"prefilter={r['prefilter']}: recall {r['recall']:.2f}")
        update = torch.zeros(d)
        update[chosen] = total[chosen] / args.workers
        for w in range(args.workers):
            acc[w][chosen] = 0
            residual[w] = acc[w]
        offset = 0
        for q in params:
            q.grad = update[offset: offset + q.numel()].view_as(q).clone()
            offset += q.numel()
        opt.step()
        if not math.isfinite(loss.item()):
            break
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
