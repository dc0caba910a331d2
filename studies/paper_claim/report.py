"""gs-SGD's throughput claim, by the cost model: gs against gTop-k (as its paper's cost
formula has it, and as its authors' code runs it) and against Sketched-SGD, at the sizes and
worker counts of GPU clusters (issue 63).

Usage (from the repository root; a few seconds):

    .venv/bin/python studies/paper_claim/report.py [--out studies/paper_claim/results]

Writes ``claim.md``: for d = 1M, 25M and 138M parameters (density 0.001), P = 4 to 1,024
H200 workers and 0.1 to 25 Gbit/s links with 20 us latency, each method's aggregation step
(compression and communication, no forward or backward: the part a compressor changes) by
``gssgd advise``'s step model on a GPU cluster (one link efficiency for every pattern, no
gloo headers: :meth:`gssgd.costmodel.network.Network.for_cluster`), and gs's speed against
each rival: the rival's step over gs's (above 1: gs is faster). Each gs variant is the
faster of its sums by the ring and by recursive halving and doubling (``gs-hd``), in its
default shape at that P; "gs, estimates only" drops the exact round (``gs-estimate``; it
diverged in training here, docs/benchmarks.md); "gs, byte-matched" narrows the table and
the exact round together (columns and m halved in step) until its busiest rank sends no
more than gTop-k's at that P (its accuracy is not measured).

Then the same ratios as measured by ``gssgd bench comm`` on this machine's emulated links
(P = 4 and 8, 100 Mbit/s and 1 Gbit/s, CPU compute on two shared cores): the cost model's
grid, ``studies/cost_model/grid``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
import gssgd.methods  # noqa: E402, F401  (registers the methods)
from gssgd.costmodel.advice import cluster_network  # noqa: E402
from gssgd.costmodel.cluster import Link, predict_step  # noqa: E402
from gssgd.costmodel.devices import get_device  # noqa: E402
from gssgd.costmodel.method_specs import MethodSpec, method_spec, traffic  # noqa: E402
from studies._lib.report import markdown_table  # noqa: E402

SIZES = {"1M": 1_000_000, "25M": 25_000_000, "138M": 138_000_000}
WORKERS = (4, 8, 16, 64, 256, 1024)
RATES = {"0.1 Gbit/s": 10**8, "1 Gbit/s": 10**9, "10 Gbit/s": 10**10, "25 Gbit/s": 25 * 10**9}
DENSITY, LATENCY_S, DEVICE = 0.001, 20e-6, "h200"
#: The paper's claim: gs's throughput over gTop-k's and over Sketched-SGD's.
CLAIM = {"gtopk": (1.3, 3.1), "sketched": (1.1, 1.2)}


#: How gs may sum its tables and exact values: the backend's ring, or recursive halving and
#: doubling (the ring's bytes in 2 log2 P rounds).
ALLREDUCES = ("backend", "halving_doubling")


def byte_matched(d: int, world_size: int, allreduce: str) -> MethodSpec:
    """gs summing by ``allreduce``, its columns and candidates halved together until its
    busiest rank sends no more than gTop-k's (recursive doubling) at ``world_size``
    workers."""
    budget = max(traffic(method_spec("gtopk", d, DENSITY), world_size).sent)
    spec = replace(method_spec("gs", d, DENSITY, world_size=world_size), allreduce=allreduce)
    cols, m = spec.cols, spec.candidates
    while max(traffic(spec, world_size).sent) > budget and (cols > 16 or m > 1):
        cols, m = max(16, cols // 2), max(1, m // 2)
        spec = replace(method_spec("gs", d, DENSITY, world_size=world_size, cols=cols,
                                   candidates=m), allreduce=allreduce)
    return spec


def steps(d: int, world_size: int, rate: int) -> dict[str, float]:
    """Each method's aggregation step (seconds) on the cluster."""
    device = get_device(DEVICE)
    net = cluster_network(device)

    def step(spec: MethodSpec) -> float:
        return predict_step(spec, world_size, Link(rate, LATENCY_S), device, net,
                            fwdbwd_s=0.0, overlap="none").total

    def fastest(spec: MethodSpec) -> float:
        return min(step(replace(spec, allreduce=way)) for way in ALLREDUCES)

    specs = {name: method_spec(name, d, DENSITY, world_size=world_size)
             for name in ("gs", "gs-estimate", "gtopk", "gtopk-tree", "sketched")}
    out = {name: step(specs[name]) for name in ("gtopk", "gtopk-tree", "sketched")}
    out["gs-best"] = fastest(specs["gs"])
    out["gs-estimate"] = fastest(specs["gs-estimate"])
    out["gs-matched"] = min(step(byte_matched(d, world_size, way)) for way in ALLREDUCES)
    return out


#: (column, gs variant, rival): each table's columns, gs's speed against the rival.
COLUMNS = (
    ("gs / gTop-k (formula)", "gs-best", "gtopk"),
    ("gs / gTop-k (published)", "gs-best", "gtopk-tree"),
    ("estimates only / gTop-k", "gs-estimate", "gtopk"),
    ("byte-matched / gTop-k", "gs-matched", "gtopk"),
    ("gs / Sketched-SGD", "gs-best", "sketched"),
)


#: The emulated-link runs of every variant (the cost model's grid).
GRID = Path(__file__).resolve().parents[1] / "cost_model" / "grid"


def measured() -> list[str]:
    """The measured section: per grid run, each rival's median step over gs's (gs the
    faster of its ring and halving-doubling sums; a variant a run did not measure: -)."""
    rows = []
    for run in sorted(GRID.glob("comm_*/results.json")):
        t = {name: r["seconds_per_step"] for name, r in json.loads(run.read_text()).items()
             if isinstance(r, dict) and "seconds_per_step" in r}
        gs = min(t[name] for name in ("gs", "gs-hd") if name in t)

        def ratio(rival: str, mine: float = gs, t: dict = t) -> str:
            return f"{t[rival] / mine:.2f}x" if rival in t else "-"

        rows.append([run.parent.name, f"{1e3 * gs:.0f}", ratio("gtopk"), ratio("gtopk-tree"),
                     ratio("gtopk", t["gs-estimate"]), ratio("sketched")])
    return ["## Measured: `gssgd bench comm` on emulated links", "", markdown_table(
        ["run", "gs ms", "gs / gTop-k (formula)", "gs / gTop-k (published)",
         "estimates only / gTop-k", "gs / Sketched-SGD"], rows), ""]


def report() -> str:
    """The whole of claim.md."""
    parts = [__doc__.split("\n\nUsage")[0].replace("\n", " ").strip(), ""]
    ratios: dict[str, list[float]] = {c[0]: [] for c in COLUMNS}
    for size, d in SIZES.items():
        for rate_name, rate in RATES.items():
            rows = []
            for p in WORKERS:
                t = steps(d, p, rate)
                cells = []
                for column, mine, rival in COLUMNS:
                    ratio = t[rival] / t[mine]
                    ratios[column].append(ratio)
                    cells.append(f"{ratio:.2f}x")
                rows.append([str(p), f"{1e3 * t['gs-best']:.1f}", f"{1e3 * t['gtopk']:.1f}",
                             f"{1e3 * t['gtopk-tree']:.1f}", *cells])
            parts += [f"### d = {size}, {rate_name}", "", markdown_table(
                ["P", "gs ms", "gTop-k ms", "gTop-k tree ms", *(c[0] for c in COLUMNS)], rows), ""]
    low, high = CLAIM["gtopk"]
    summary = ["## Verdict (the ratios over every cell above)", ""]
    for column, values in ratios.items():
        band = CLAIM["sketched" if "Sketched" in column else "gtopk"]
        inside = sum(band[0] <= v for v in values)
        summary.append(f"- **{column}**: {min(values):.2f}x to {max(values):.2f}x; at or above "
                       f"the paper's {band[0]}x in {inside} of {len(values)} cells.")
    summary += ["", f"The paper claims {low}-{high}x gTop-k's throughput and "
                f"{CLAIM['sketched'][0]}-{CLAIM['sketched'][1]}x Sketched-SGD's.", ""]
    return "\n".join(["# gs-SGD's throughput claim by the cost model", "", *summary, *parts,
                      *measured()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("studies/paper_claim/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "claim.md").write_text(report())
    print(f"wrote {args.out}/claim.md")


if __name__ == "__main__":
    main()
