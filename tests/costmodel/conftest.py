"""Shared by the cost-model tests: the held-out check over the committed runs, computed
once per session (about 10 s; two tests read it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gssgd.costmodel.check import ErrorRow, check_runs, held_out_errors
from gssgd.costmodel.fit import load_measurements

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


@pytest.fixture(scope="session")
def held_out() -> tuple[list[Path], list[ErrorRow]]:
    """The committed bench comm runs of the check (missing runs fail: check_runs raises)
    and their leave-one-run-out rows."""
    runs = check_runs(RESULTS)
    return runs, held_out_errors([m for r in runs for m in load_measurements(r)])
