"""The committed one-off benchmark summaries (studies/benchmarks/results) stay readable: a
``gssgd bench comm`` run keeps only its ``results.json``, whose table is rendered from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gssgd_lab.comm_report import comm_table

RESULTS = Path(__file__).resolve().parents[2] / "studies" / "benchmarks" / "results"
COMM_RUNS = sorted(p.parent.name for p in RESULTS.glob("*/results.json")
                   if p.parent.name.startswith(("comm_", "check_")))


def test_the_comm_runs_are_committed() -> None:
    assert len(COMM_RUNS) == 8


@pytest.mark.parametrize("run", COMM_RUNS)
def test_a_comm_runs_table_is_rendered_from_its_results(run: str) -> None:
    results = json.loads((RESULTS / run / "results.json").read_text())
    table = comm_table(results)
    methods = [name for name in results if not name.startswith("_")]
    assert methods and all(name in table for name in methods)
