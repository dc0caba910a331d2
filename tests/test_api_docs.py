"""The API reference (docs/api) builds from the docstrings with warnings as errors, and
every public name (each documented module's ``__all__``) appears in it with its docstring."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "api"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("api")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                          "html", str(SOURCE), str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]  # a warning fails the build
    return (out / "index.html").read_text()


def _documented_modules() -> list[str]:
    return re.findall(r"^\.\. automodule:: (\S+)", (SOURCE / "index.rst").read_text(), re.M)


def test_every_public_module_is_in_the_reference() -> None:
    assert {"gssgd", "gssgd.ddp", "gssgd.local_steps", "gssgd.sketch", "gssgd.optim",
            "gssgd.simulated"} <= set(_documented_modules())


def test_every_public_name_appears_with_its_docstring(built: str) -> None:
    """Under its public module's name, or, for a constant a package re-exports (which
    carries no docstring of its own), under the module that defines it (the same object)."""
    missing = []
    for name in _documented_modules():
        module = importlib.import_module(name)
        for public in module.__all__:
            if f'id="{name}.{public}"' in built:
                continue
            where = re.findall(rf'id="([\w.]+)\.{public}"', built)
            value = getattr(module, public)
            if not any(getattr(importlib.import_module(w), public, None) is value for w in where):
                missing.append(f"{name}.{public}")
    assert not missing, f"not in the API reference (no docstring?): {missing}"
