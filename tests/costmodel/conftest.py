"""Shared by the cost-model tests: the held-out check over the committed runs that
``fit.json`` was made from, computed once per session (a few seconds; several tests read
it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gssgd.costmodel import store
from gssgd.costmodel.fit import ErrorRow, held_out_errors, load_measurements, rated

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def held_out() -> tuple[list[Path], list[ErrorRow]]:
    """The committed bench comm runs of the stored fit (a missing run fails, it does not
    skip) and the leave-one-run-out rows of their rate-limited links."""
    runs = [ROOT / r for r in store.load("fit.json")["runs"]]
    missing = [str(r) for r in runs if not (r / "results.json").exists()]
    assert not missing, f"the fit's runs are missing: {missing}"
    return runs, held_out_errors(rated(m for r in runs for m in load_measurements(r)))
