"""Why global selection loses on language models: what each method delivers, measured.

For each method (gs, gTop-k, local Top-k) and worker count P, a simulated world trains the
character LSTM (Shakespeare) with the language models' recipe (plain SGD at lr 1.6, the
aggregator's local momentum 0.9, the 100-step density warm-up; compression from step 0)
and, at every step, reads every rank's accumulated vector ``a_p = e_p + u_p`` (what the
method compresses) and the update it delivers. Per step it records:

- the **global accumulated vector** ``A = sum_p a_p`` and its exact top-k ``G``: the share
  of A's squared mass on G, on the union of the local top-ks ``U``, and on the delivered
  coordinates ``D``; how many of G are in U and in D;
- **per tensor** (embedding, each LSTM weight and bias, the output layer): its share of A's
  mass, of the raw gradient's (``sum_p g_p``), of D's coordinates and of the delivered mass;
- **waiting**: how many steps a coordinate waited since its last delivery (or the start)
  when it is delivered, by tensor, and how many of a tensor's coordinates were never
  delivered.

    .venv/bin/python studies/lm_selection/run.py --workers 4 16 --steps 300 \\
        --out studies/lm_selection/results
    .venv/bin/python studies/lm_selection/run.py --workers 16 --steps 200 --append \\
        --methods gs:prefilter=1 gs:prefilter=2 gs:cols=15872 gs

A method may carry aggregator options after a colon (``gs:prefilter=1,candidates=16``):
the levers, each run under that name. Every run also records the busiest rank's bytes a
step (sent or received, the larger) after the warm-up: the median over those steps, so a
guard audit's dense all-reduce, once in 200 steps or fewer, does not count.

writes ``summary.json`` (every figure, by P and method), ``summary.md`` (the tables) and a
plot. Raw per-step records stay in memory; the summary averages the steps after the
warm-up. Reads private aggregator hooks (``_error_compensated``): an analysis, not an API.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gssgd.aggregators import make_aggregator  # noqa: E402
from gssgd.simulated import SimulatedWorld  # noqa: E402
from gssgd.train.config import TrainConfig, make_optimizer  # noqa: E402
from gssgd.train.data import load_dataset  # noqa: E402
from gssgd.train.models import build_model  # noqa: E402
from gssgd.train.objective import batch_loss, train_batch  # noqa: E402

METHODS = ("gs", "gtopk", "topk")


def tensor_slices(model: torch.nn.Module) -> dict[str, slice]:
    """Each trainable tensor's coordinates in the flat gradient (model order)."""
    out, offset = {}, 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            out[name] = slice(offset, offset + p.numel())
            offset += p.numel()
    return out


def share(values: torch.Tensor, parts: dict[str, slice]) -> dict[str, float]:
    """Each part's share of ``values``' sum (values already squared or counted)."""
    total = float(values.sum()) or 1.0
    return {name: float(values[s].sum()) / total for name, s in parts.items()}


class Probe:
    """Per-step measurements of one run (see the module doc)."""

    def __init__(self, d: int, parts: dict[str, slice]) -> None:
        self.parts = parts
        self.last = torch.zeros(d, dtype=torch.long)  # step of the last delivery (or 0)
        self.delivered_ever = torch.zeros(d, dtype=torch.bool)
        self.steps: list[dict[str, Any]] = []
        self.ages: dict[str, list[int]] = {name: [] for name in parts}

    def record(self, step: int, accumulated: list[torch.Tensor], grads: list[torch.Tensor],
               update: torch.Tensor, k: int) -> None:
        """One step: every rank's accumulated vector and gradient, the update, the step's k
        (larger during the density warm-up)."""
        a = torch.stack(accumulated).double()
        total = a.sum(0)
        mass = total.square()
        whole = float(mass.sum()) or 1.0
        g = set(torch.topk(total.abs(), k).indices.tolist())
        u: set[int] = set()
        for row in a:
            u |= set(torch.topk(row.abs(), k).indices.tolist())
        delivered = torch.nonzero(update).flatten()
        dset = set(delivered.tolist())

        def on(coords: set[int]) -> float:
            if not coords:
                return 0.0
            return float(mass[torch.tensor(sorted(coords))].sum()) / whole

        raw = torch.stack(grads).double().sum(0).square()
        count = torch.zeros_like(mass)
        count[delivered] = 1.0
        self.steps.append({
            "step": step,
            "mass_on_global_topk": on(g),
            "mass_on_union_of_local_topk": on(u),
            "mass_on_delivered": on(dset),
            "union_size_over_k": len(u) / k,
            "delivered_over_k": len(dset) / k,
            "global_topk_in_union": len(g & u) / k,
            "global_topk_delivered": len(g & dset) / k,
            "tensor_accumulated_mass": share(mass, self.parts),
            "tensor_gradient_mass": share(raw, self.parts),
            "tensor_delivered_count": share(count, self.parts),
            "tensor_delivered_mass": share(update.double().square(), self.parts),
        })
        for name, s in self.parts.items():
            hit = delivered[(delivered >= s.start) & (delivered < s.stop)]
            self.ages[name].extend((step - self.last[hit]).tolist())
        self.last[delivered] = step
        self.delivered_ever[delivered] = True

    def summary(self, skip: int) -> dict[str, Any]:
        rows = [r for r in self.steps if r["step"] >= skip] or self.steps
        out: dict[str, Any] = {}
        for key, value in rows[0].items():
            if key == "step":
                continue
            if isinstance(value, dict):
                out[key] = {n: statistics.mean(r[key][n] for r in rows) for n in value}
            else:
                out[key] = statistics.mean(r[key] for r in rows)
        out["median_wait_at_delivery"] = {
            n: (statistics.median(a) if a else None) for n, a in self.ages.items()}
        out["never_delivered"] = {
            n: float((~self.delivered_ever[s]).double().mean()) for n, s in self.parts.items()}
        return out


def parse_method(spec: str) -> tuple[str, dict[str, int | float]]:
    """``gs:prefilter=1,cols=15872`` -> ``("gs", {"prefilter": 1, "cols": 15872})``.

    Raises:
        ValueError: an option without ``=`` or with a value that is not a number.
    """
    method, _, rest = spec.partition(":")
    options: dict[str, int | float] = {}
    for item in filter(None, rest.split(",")):
        name, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"option {item!r} of {spec!r} is invalid: write NAME=VALUE")
        try:
            options[name] = int(value)
        except ValueError:
            try:
                options[name] = float(value)
            except ValueError:
                raise ValueError(f"option {item!r} of {spec!r}: {value!r} is not a number "
                                 "(the levers take numbers)") from None
    return method, options


def run(spec: str, workers: int, steps: int, density: float, global_batch: int,
        seed: int) -> dict[str, Any]:
    """One simulated run with its probe; the summary, the final training loss and the
    busiest rank's bytes a step after the warm-up."""
    method, overrides = parse_method(spec)
    cfg = TrainConfig(method=method, dataset="shakespeare", model="lm", workers=workers,
                      simulate=True, seed=seed, steps=steps, progress=False,
                      options={"density": density})
    cfg.batch_size = max(1, global_batch // workers)
    torch.manual_seed(seed)
    data = load_dataset(cfg.dataset)
    model = build_model("lm", data)
    params = [p for p in model.parameters() if p.requires_grad]
    parts = tensor_slices(model)
    d = sum(p.numel() for p in params)
    optimizer = make_optimizer(model, cfg)
    world = SimulatedWorld(workers)
    options = {**cfg.aggregator_options(), **overrides}
    aggs = [make_aggregator(method, d, density, group=world.rank(r), **options)
            for r in range(workers)]
    captured: list[torch.Tensor | None] = [None] * workers
    for r, agg in enumerate(aggs):
        inner = agg._error_compensated

        def capture(grad: torch.Tensor, r: int = r, inner: Any = inner) -> torch.Tensor:
            out = inner(grad)
            captured[r] = out.clone()  # the aggregator zeroes what it delivers, in place
            return out

        agg._error_compensated = capture  # type: ignore[method-assign]
    probe = Probe(d, parts)
    loss_value = math.nan
    busiest: list[float] = []
    for step in range(steps):
        grads, losses = [], []
        for r in range(workers):
            x, y = train_batch(data, cfg, step, r, workers, torch.device("cpu"))
            loss, _, _ = batch_loss(model(x), y)
            losses.append(loss.item())
            parts_ = torch.autograd.grad(loss, params)
            grads.append(torch.cat([g.reshape(-1) for g in parts_]))
        updates = world.run(lambda rank, g=grads: aggs[rank.rank].step(g[rank.rank]))
        probe.record(step, captured, grads, updates[0], aggs[0].step_k)  # type: ignore[arg-type]
        if step >= (cfg.option("warmup_steps") or 0):
            busiest.append(max(max(a.last_stats.bytes_sent, a.last_stats.bytes_received)
                               for a in aggs))
        for p, piece in zip(params, updates[0].split([p.numel() for p in params]), strict=True):
            p.grad = piece.view_as(p).clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = statistics.mean(losses)
    return {"final_train_loss": loss_value, "d": d, "k": aggs[0].k, "options": overrides,
            "busiest_bytes_per_step": statistics.median(busiest) if busiest else None,
            **probe.summary(skip=cfg.option("warmup_steps") or 0)}


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| P | method | train loss | busiest B / step | mass on global top-k | "
             "on union of local top-k | delivered | union / k | global top-k in union | "
             "in delivered |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p, by in results.items():
        for m, r in by.items():
            link = r.get("busiest_bytes_per_step")
            lines.append(
                f"| {p} | {m} | {r['final_train_loss']:.3f} | "
                f"{'–' if link is None else f'{link:,.0f}'} | {r['mass_on_global_topk']:.1%} | "
                f"{r['mass_on_union_of_local_topk']:.1%} | {r['mass_on_delivered']:.1%} | "
                f"{r['union_size_over_k']:.1f} | {r['global_topk_in_union']:.1%} | "
                f"{r['global_topk_delivered']:.1%} |")
    lines += ["", "Per tensor (share of the accumulated mass / of the raw gradient's / of the "
              "delivered coordinates / of the delivered mass; median wait at delivery in "
              "steps; never delivered):", ""]
    for p, by in results.items():
        for m, r in by.items():
            lines += [f"**P = {p}, {m}**", "", "| tensor | accumulated | gradient | delivered "
                      "coords | delivered mass | median wait | never delivered |",
                      "|---|---|---|---|---|---|---|"]
            for n in r["tensor_accumulated_mass"]:
                wait = r["median_wait_at_delivery"][n]
                lines.append(
                    f"| {n} | {r['tensor_accumulated_mass'][n]:.1%} | "
                    f"{r['tensor_gradient_mass'][n]:.1%} | {r['tensor_delivered_count'][n]:.1%} | "
                    f"{r['tensor_delivered_mass'][n]:.1%} | "
                    f"{'–' if wait is None else f'{wait:g}'} | {r['never_delivered'][n]:.1%} |")
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("studies/lm_selection/results"))
    ap.add_argument("--append", action="store_true",
                    help="keep the runs already in OUT/summary.json (a run of the same P and "
                         "method is replaced) and add these")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    results: dict[str, dict[str, Any]] = {}
    if args.append and (args.out / "summary.json").exists():
        results = json.loads((args.out / "summary.json").read_text())["results"]
    for p in args.workers:
        for m in args.methods:
            print(f"P = {p}, {m} ...", flush=True)
            record = run(m, p, args.steps, args.density, args.global_batch, args.seed)
            record.update(steps=args.steps, density=args.density,
                          global_batch=args.global_batch, seed=args.seed)
            results.setdefault(str(p), {})[m] = record
            (args.out / "summary.json").write_text(json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                indent=1) + "\n")
    text = markdown(results)
    (args.out / "summary.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
