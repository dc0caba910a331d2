"""The README in its own words: its DDP scripts run, its tables quote the committed summaries.

The SGD script is the README's block that calls ``compressed_sgd``; the AdamW script is that
script with the lines from ``run = compressed_sgd(`` to ``torch.save(run`` replaced by the
README's ``compressed_adamw`` block, as the README tells the reader to do. Each runs on 2
gloo processes launched as ``torchrun`` would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), must print its losses falling well below chance and save each rank's state.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
sys.path.insert(0, str(ROOT / "tools"))
import readme_tables  # noqa: E402


def python_blocks(text: str) -> list[str]:
    """The README's ```python blocks, in order."""
    return re.findall(r"```python\n(.*?)```", text, re.S)


def the_block(blocks: list[str], needle: str) -> str:
    """The one block that contains ``needle``."""
    found = [b for b in blocks if needle in b]
    assert len(found) == 1, f"expected one README python block with {needle!r}, got {len(found)}"
    return found[0]


def sgd_script(text: str) -> str:
    return the_block(python_blocks(text), "init_process_group")


def adamw_script(text: str) -> str:
    """The SGD script with its hook-and-loop lines replaced by the AdamW block."""
    sgd, adamw = sgd_script(text), the_block(python_blocks(text), "compressed_adamw(")
    start = sgd.index("run = compressed_sgd(")
    end_line = sgd.index("torch.save(run")
    end = sgd.index("\n", end_line) + 1
    return sgd[:start] + adamw + sgd[end:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_on_two_processes(script: str, tmp_path: Path) -> list[str]:
    """Run ``script`` as rank 0 and 1 of a gloo group in ``tmp_path``; rank 0's output lines."""
    path = tmp_path / "train.py"
    path.write_text(script)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(path)], cwd=tmp_path,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{out}"
    return outs[0].splitlines()


def losses(lines: list[str]) -> list[float]:
    return [float(m[1]) for line in lines if (m := re.match(r"step \d+: loss ([0-9.]+)", line))]


@pytest.mark.parametrize("which", ["sgd", "adamw"])
def test_the_readme_ddp_script_trains_on_two_gloo_processes(which: str, tmp_path: Path) -> None:
    text = README.read_text()
    script = sgd_script(text) if which == "sgd" else adamw_script(text)
    lines = run_on_two_processes(script, tmp_path)
    seen = losses(lines)
    assert len(seen) == 3, lines
    chance = math.log(4)  # four classes
    assert seen[-1] < 0.2 * chance, f"the README's {which} script did not train: {lines}"
    saved = sorted(p.name for p in tmp_path.glob("*.rank*.pt"))
    assert saved == ([f"sgd.rank{r}.pt" for r in range(2)] if which == "sgd"
                     else [f"adamw.rank{r}.pt" for r in range(2)])
    state = torch.load(tmp_path / saved[1], weights_only=False)
    assert state, "a rank saved an empty state"


def test_the_adamw_block_replaces_exactly_the_hook_and_the_loop() -> None:
    script = adamw_script(README.read_text())
    assert "compressed_sgd(" not in script.split("from gssgd.ddp import compressed_sgd")[1]
    assert "compressed_adamw(" in script and "dist.destroy_process_group()" in script


def test_the_quoted_tables_are_the_committed_summaries() -> None:
    tables = readme_tables.blocks()
    for page, names in readme_tables.PAGES.items():
        text = page.read_text()
        for name in names:
            quoted = re.search(rf"<!-- BEGIN {name} -->\n(.*?)<!-- END {name} -->", text, re.S)
            assert quoted, f"{page.name} lacks the {name} table's markers"
            assert quoted[1].rstrip() == tables[name].rstrip(), (
                f"{page.name}'s {name} table differs from the committed summaries: run "
                "tools/readme_tables.py")


def test_a_changed_figure_is_caught(tmp_path: Path) -> None:
    """The check can fail: one figure off in a copy of the README is reported stale."""
    copy = tmp_path / "README.md"
    text = README.read_text()
    cell = re.search(r"\| (\d+\.\d\d) % \|", text.split("<!-- BEGIN main-job -->")[1])
    assert cell, "the main-job table has no accuracy cell"
    changed = f"| {float(cell[1]) + 0.01:.2f} % |"
    copy.write_text(text.replace(cell[0], changed, 1))
    body = readme_tables.blocks()["main-job"]
    quoted = re.search(r"<!-- BEGIN main-job -->\n(.*?)<!-- END main-job -->",
                       copy.read_text(), re.S)
    assert quoted and quoted[1].rstrip() != body.rstrip()


#: A measured figure in prose: a number with its unit (bytes, a percentage, points, a
#: factor, seconds), possibly signed.
FIGURE = re.compile(r"[+−-]?\d+(?:\.\d+)? ?(?:MB|GB|%|×|point|pt\b)")


def _study_pages() -> str:
    """Every committed study page (summaries' tables, reports, answers) as one text."""
    return "\n".join(p.read_text(errors="ignore") for p in sorted((ROOT / "studies").rglob("*.md")))


def test_the_which_method_table_quotes_only_committed_figures() -> None:
    """Issue 61: the README said nothing the summaries did not say... except where it did.
    Every figure in the which-method table ("why (measured)") is one a committed study
    page prints, in the same form."""
    text = README.read_text()
    table = text[text.index("| your model and cluster |"):text.index("Time, not bytes")]
    pages = _study_pages()
    figures = FIGURE.findall(table)
    assert len(figures) > 30
    missing = sorted({f for f in figures if f.replace("−", "-") not in pages and f not in pages})
    assert not missing, f"figures no committed study page holds: {missing}"


def test_an_invented_figure_in_the_which_method_table_is_caught() -> None:
    pages = _study_pages()
    assert "123.4 MB" not in pages and FIGURE.findall("sent 123.4 MB") == ["123.4 MB"]


def test_the_readme_is_a_short_guide() -> None:
    """The README gets a user running; detail lives in docs/guide.md (the docs issue's 200)."""
    assert len(README.read_text().splitlines()) <= 200
