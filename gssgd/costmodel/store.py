"""The cost model's measured data: JSON files under ``gssgd/costmodel/data/`` that the
commands which measure them write, and the package loads (no measured figure lives in a
Python module).

* ``fit.json``: the model fitted on this machine's emulated links and its held-out error
  (``gssgd advise --calibrate RUNS...``, :mod:`gssgd.costmodel.fit`).
* ``devices.json``: each device's compute constants and where they come from (``gssgd bench
  device``; datasheet ratios for the devices derived from a measured one).
* ``evidence/*.json``: one study each, the steps (or final loss) each method needed to
  reach dense's target (written by the study's report from its committed summary).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["DATA_DIR", "evidence_names", "load", "write"]

#: The data directory of the source tree (where the writing commands put their files).
DATA_DIR = Path(__file__).resolve().parent / "data"


@functools.cache
def load(name: str) -> Any:
    """The JSON data file ``name`` (``"fit.json"``, ``"evidence/fair-frontier-mnist.json"``)
    of the installed package.

    Raises:
        FileNotFoundError: no such file (the message says which command writes it).
    """
    path = resources.files("gssgd.costmodel").joinpath("data", *name.split("/"))
    if not path.is_file():
        raise FileNotFoundError(
            f"the cost model's data file {name} is missing from the installed package; it "
            "is written by gssgd advise --calibrate (fit.json), gssgd bench device "
            "(devices.json) or a study's report (evidence/); reinstall gssgd"
        )
    return json.loads(path.read_text())


def evidence_names() -> list[str]:
    """The evidence files of the installed package, sorted."""
    folder = resources.files("gssgd.costmodel").joinpath("data", "evidence")
    return sorted(f"evidence/{p.name}" for p in folder.iterdir() if p.name.endswith(".json"))


def write(name: str, data: Any, root: Path | None = None) -> Path:
    """Write ``data`` as the JSON data file ``name`` under ``root`` (default: this source
    tree's :data:`DATA_DIR`), sorted keys, one trailing newline; returns the path."""
    path = (DATA_DIR if root is None else root) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    load.cache_clear()
    return path
