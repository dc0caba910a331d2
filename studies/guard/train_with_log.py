"""``gssgd train`` with gssgd's INFO log on, so ``--opt audit=both`` prints both audits'
recalls (the simulated world runs in this process): ``compare_audits.sh`` uses it."""

from __future__ import annotations

import logging
import sys

from gssgd.cli.main import main

logging.basicConfig(level=logging.WARNING, format="%(message)s")
logging.getLogger("gssgd").setLevel(logging.INFO)
sys.exit(main(sys.argv[1:]))
