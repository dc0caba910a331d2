"""Fixtures shared by test files of different folders."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def torchrun_gs_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess]:
    """One uninterrupted torchrun launch of ``gssgd train`` (2 workers, gs on digits, the
    settings of tests/train/test_elastic.py): its ``--out`` and the finished launcher. The
    command line's torchrun test checks it, and the elastic-restart test compares its
    restarted run with it (a torchrun launch of two workers costs about ten seconds)."""
    from tests.train.test_elastic import torchrun

    out = tmp_path_factory.mktemp("torchrun") / "plain"
    return out, torchrun(out)
