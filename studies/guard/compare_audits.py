"""The pool audit against the dense one, side by side (issue #48): every audit that
``audit="both"`` logged in the runs' logs, with each recall and whether each audit calls
a collapse (below the guard's 10 % bar).

    python studies/guard/compare_audits.py LOG... > studies/guard/results/audits.md

Each LOG is a ``gssgd train`` run's output with gssgd's INFO log on (``compare_audits.sh``
makes them: the guard study's healthy and too-small sketches at P = 16).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

AUDIT = re.compile(r"gs audit at aggregation step (\d+): dense recall ([0-9.]+), "
                   r"tops recall ([0-9.]+)")
BAR = 0.1


def audits(log: Path) -> list[tuple[int, float, float]]:
    """(aggregation step, dense recall, pool recall) of every audit in ``log``."""
    return [(int(s), float(d), float(t)) for s, d, t in AUDIT.findall(log.read_text())]


def main() -> None:
    rows, agree, total, misses = [], 0, 0, 0
    for log in sorted(Path(p) for p in sys.argv[1:]):
        for step, dense, tops in audits(log):
            same = (dense < BAR) == (tops < BAR)
            agree, total = agree + same, total + 1
            misses += dense < BAR <= tops
            rows.append(f"| {log.stem} | {step} | {dense:.4f} | {tops:.4f} | "
                        f"{'collapse' if dense < BAR else 'healthy'} | "
                        f"{'collapse' if tops < BAR else 'healthy'} |")
    print("| run | step | dense recall | pool recall | dense says | pool says |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n{agree} of {total} audits agree; {misses} collapse(s) the pool audit missed; "
          "a false alarm (pool collapse, dense healthy) cannot happen: the pool's recall is "
          "never below the dense one's.")


if __name__ == "__main__":
    main()
