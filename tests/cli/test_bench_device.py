"""``gssgd bench device``: the compute constants of this machine's device, measured and
printed as a device record (the cost model's devices.json holds such records)."""

from __future__ import annotations

import json
from pathlib import Path

from gssgd.cli.bench_device import measure_device
from gssgd.cli.main import main

KEYS = ("pass_s_per_elem", "topk_s_per_elem", "sketch_s_per_elem_row", "recover_s_per_elem",
        "lowrank_s_per_elem_rank", "fwdbwd_s_per_param")


def test_a_cpu_record_has_every_constant_positive() -> None:
    record = measure_device("cpu", d=20_000, repeats=2, warmup=0)
    for key in KEYS:
        assert record[key] > 0, key
    assert record["details"]["d"] == 20_000 and len(
        record["details"]["lowrank_s_per_elem_rank_at_1_2_4"]) == 3
    assert "gssgd bench device" in record["source"]


def test_the_command_prints_and_writes_the_record(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cpu.json"
    assert main(["bench", "device", "--device", "cpu", "--d", "20000", "--repeats", "1",
                 "--warmup", "0", "--json", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == printed and set(KEYS) <= set(printed)
    assert main(["bench", "device", "--device", "cpu", "--d", "10"]) == 2
    assert "must be >= 1000" in capsys.readouterr().err
