"""Run ``gssgd train`` with gs's collapse guard auditing every 20 compressed steps, so a
run's ``metrics.jsonl`` traces the audited recall (measurement only: a default run audits
at step 20 and then every few hundred or thousand steps, spaced by bytes).

    .venv/bin/python studies/sizing/audit_trace.py train --simulate --method gs ... --out DIR

The arguments are ``gssgd``'s; only the guard's spacing changes (each audit's bytes are
counted in the run's, so a traced run sends a little more than a default one).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gssgd.aggregators.gs as gs  # noqa: E402

#: Compressed steps between audits in a traced run.
EVERY = 20

gs.audit_interval = lambda audit_bytes, step_bytes: EVERY  # type: ignore[assignment]

from gssgd.cli.main import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
