"""Where gs's constant message should pay: the cost model's aggregation step (no forward or
backward) of gs, gTop-k and local Top-k at d = 1M, density 0.001, on H200 workers behind
100 Mbit/s and 1 Gbit/s links (20 us latency), P = 4 to 256, each method at its default
shape for P (issue #48).

    .venv/bin/python studies/sizing/predicted_steps.py > studies/sizing/results/predicted_steps.md
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gssgd.costmodel.advice import fitted_network  # noqa: E402
from gssgd.costmodel.cluster import Link, predict_step  # noqa: E402
from gssgd.costmodel.devices import get_device  # noqa: E402
from gssgd.costmodel.method_specs import method_spec  # noqa: E402
from studies._lib.report import markdown_table  # noqa: E402

D, DENSITY, WORKERS = 1_000_000, 0.001, (4, 16, 64, 256)
LINKS = {"100 Mbit/s": 10**8, "1 Gbit/s": 10**9}
METHODS = ("gs", "gs-rd", "gtopk", "topk")


def step_ms(method: str, workers: int, rate: int) -> float:
    """The model's aggregation step of ``method`` in milliseconds."""
    spec = method_spec(method, D, DENSITY, world_size=workers)
    step = predict_step(spec, workers, Link(rate, 20e-6), get_device("h200"),
                        fitted_network(), fwdbwd_s=0)
    return step.total * 1e3


def main() -> None:
    rows = []
    for link, rate in LINKS.items():
        for p in WORKERS:
            ms = {m: step_ms(m, p, rate) for m in METHODS}
            rows.append([link, str(p), *(f"{ms[m]:.1f}" for m in METHODS),
                         f"{ms['gtopk'] / ms['gs']:.2f}×", f"{ms['topk'] / ms['gs']:.2f}×"])
    print("Predicted aggregation step (ms), H200 workers, d = 1M, density 0.001 "
          "(`studies/sizing/predicted_steps.py`)\n")
    print(markdown_table(["link", "P", *METHODS, "gs ÷ gTop-k (throughput)",
                          "gs ÷ local Top-k"], rows))


if __name__ == "__main__":
    main()
