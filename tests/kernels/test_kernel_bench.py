"""``gssgd bench kernels``: its checks, report and command line, at tiny sizes.

Under the interpreter (this directory's conftest) the benchmark times and checks the kernels
on the CPU, so its own code, the kernel-vs-torch checks included, runs in CI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gssgd import kernels
from gssgd.cli.main import main
from gssgd_lab.kernel_bench import run_kernel_bench
from gssgd_lab.kernel_config import H200_ANCHOR, KernelBenchConfig, Layout
from gssgd_lab.kernel_report import format_report

TINY = {"sizes": (20_000,), "layouts": (Layout(1, 40),), "repeats": 1, "warmup": 0,
        "density": 0.002, "device": "cpu"}


def test_bench_checks_every_kernel_against_torch(device: torch.device) -> None:
    if device.type != "cpu":
        pytest.skip("the interpreter run is the CPU check; tools/gpu_check.sh runs it on CUDA")
    report = run_kernel_bench(KernelBenchConfig(**TINY))
    assert report["kernels_timed"]
    size = report["sizes"][0]
    layout = size["layouts"]["1x40k"]
    checks = [layout[op]["check"] for op in ("sketch", "recover", "query")]
    checks += [size[op]["check"] for op in ("gather", "select")]
    assert checks == ["ok"] * 5
    assert all(layout[op]["kernel_ms"] > 0 for op in ("sketch", "recover", "query"))
    text = format_report(report)
    assert "interpreter" in text and "1x40k" in text and "floor: copy" in text


def test_bench_without_kernels_times_torch_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kernels, "interpreted", lambda: False)
    report = run_kernel_bench(KernelBenchConfig(**TINY))
    assert not report["kernels_timed"]
    assert "torch path on the CPU only" in report["notes"][0]
    size = report["sizes"][0]
    assert size["select"]["kernel_ms"] is None and size["select"]["torch_ms"] > 0
    assert size["layouts"]["1x40k"]["sketch"]["check"] == "torch path only"


def test_report_compares_with_the_anchor_at_resnet50_size() -> None:
    entry = {"torch_ms": 8.0, "kernel_ms": 0.5, "speedup": 16.0, "bytes": 1, "GBps": 1.0,
             "check": "ok"}
    size = {"d": 25_557_032, "k": 25_557, "m": 32, "copy_TBps": 4.0, "read_floor_ms": 0.025,
            "layouts": {"1x40k": dict.fromkeys(("sketch", "recover", "query"), entry)},
            **dict.fromkeys(("gather", "select", "copy"), entry)}
    report = {"device": "GPU", "torch": "2.11", "triton": "3.6", "notes": [],
              "kernels_timed": True, "sizes": [size], "anchor": H200_ANCHOR}
    text = format_report(report)
    assert "H200 anchor (resnet50" in text
    assert "targets (1x40k): sketch 0.500 ms (target <= 0.1 ms)" in text


@pytest.mark.parametrize("text", ["2x10", "5", "0x3", "ax4"])
def test_bad_layout_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=f"layout '{text}' is invalid"):
        Layout.parse(text)


def test_cli_writes_json(device: torch.device, tmp_path: Path, capsys) -> None:
    if device.type != "cpu":
        pytest.skip("the interpreter run is the CPU check")
    out = tmp_path / "kernels.json"
    status = main(["bench", "kernels", "--sizes", "2e4", "--layouts", "1x40", "--repeats", "1",
                   "--warmup", "0", "--density", "0.002", "--device", "cpu", "--json", str(out)])
    assert status == 0
    report = json.loads(out.read_text())
    assert report["sizes"][0]["d"] == 20_000
    assert "select" in capsys.readouterr().out


def test_cli_refuses_a_bad_layout(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "kernels", "--layouts", "4x10"])
    assert exit_info.value.code == 2
    assert "rows must be odd" in capsys.readouterr().err
