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
each rival: the rival's step over gs's (above 1: gs is faster). gs is the fastest of its
sum by the ring and by recursive halving and doubling (``gs-hd``), each in its default
shape at that P; "gs, estimates only" drops the exact round (``gs-estimate``; it diverged
in training here, docs/benchmarks.md); "gs, byte-matched" narrows the table and the exact
round together (columns and m halved in step) until its busiest rank sends no more than
gTop-k's at that P (its accuracy is not measured).
"""

from __future__ import annotations

import argparse
import sys
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


def byte_matched(d: int, world_size: int) -> MethodSpec:
    """gs with its columns and candidates halved together until its busiest rank sends no
    more than gTop-k's (recursive doubling) at ``world_size`` workers."""
    budget = max(traffic(method_spec("gtopk", d, DENSITY), world_size).sent)
    base = method_spec("gs", d, DENSITY, world_size=world_size)
    cols, m = base.cols, base.candidates
    spec = base
    while max(traffic(spec, world_size).sent) > budget and (cols > 16 or m > 1):
        cols, m = max(16, cols // 2), max(1, m // 2)
        spec = method_spec("gs", d, DENSITY, world_size=world_size, cols=cols, candidates=m)
    return spec


def steps(d: int, world_size: int, rate: int) -> dict[str, float]:
    """Each method's aggregation step (seconds) on the cluster."""
    device = get_device(DEVICE)
    net = cluster_network(device)

    def step(spec: MethodSpec) -> float:
        return predict_step(spec, world_size, Link(rate, LATENCY_S), device, net,
                            fwdbwd_s=0.0, overlap="none").total

    specs = {name: method_spec(name, d, DENSITY, world_size=world_size)
             for name in ("gs", "gs-hd", "gs-estimate", "gtopk", "gtopk-tree", "sketched")}
    out = {name: step(spec) for name, spec in specs.items()}
    out["gs-best"] = min(out["gs"], out["gs-hd"])
    out["gs-matched"] = step(byte_matched(d, world_size))
    return out


#: (column, gs variant, rival): each table's columns, gs's speed against the rival.
COLUMNS = (
    ("gs / gTop-k (formula)", "gs-best", "gtopk"),
    ("gs / gTop-k (published)", "gs-best", "gtopk-tree"),
    ("estimates only / gTop-k", "gs-estimate", "gtopk"),
    ("byte-matched / gTop-k", "gs-matched", "gtopk"),
    ("gs / Sketched-SGD", "gs-best", "sketched"),
)


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
    return "\n".join(["# gs-SGD's throughput claim by the cost model", "", *summary, *parts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("studies/paper_claim/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "claim.md").write_text(report())
    print(f"wrote {args.out}/claim.md")


if __name__ == "__main__":
    main()
