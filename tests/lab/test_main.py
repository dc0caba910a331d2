"""``python -m gssgd_lab``: the lab's commands where no entry point joins them to
``gssgd bench`` (``tools/gpu_check.sh`` runs ``kernels`` so), with the flags ``gssgd bench``
gives them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gssgd.cli.main import main as gssgd_main
from gssgd_lab.__main__ import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_has_the_flags_gssgd_bench_gives_it(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    alone = capsys.readouterr().out
    with pytest.raises(SystemExit):
        gssgd_main(["bench", command, "--help"])
    joined = capsys.readouterr().out
    flags = {word for word in alone.split() if word.startswith("--")}
    assert flags and flags == {word for word in joined.split() if word.startswith("--")}


def test_it_runs_from_a_checkout_path_without_an_install(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'lab'}"}
    out = subprocess.run([sys.executable, "-m", "gssgd_lab", "kernels", "--sizes", "2e4",
                          "--layouts", "1x40", "--repeats", "1", "--json",
                          str(tmp_path / "k.json")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "k.json").exists()
