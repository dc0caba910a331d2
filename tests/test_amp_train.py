"""``gssgd train --amp``: float16 autocast with a GradScaler and bfloat16 autocast through
the training loop, and an exact resume of an ``--amp fp16`` run (the scaler's state and the
loss scale the residuals are in travel in the checkpoint).

One launch of 2 workers runs the uninterrupted and first-half runs, a second the resumed
halves (as tests/train/test_resume_methods.py does for float32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gssgd.cli.main import main
from gssgd.train.launch import launch
from gssgd.train.loop import TrainConfig, prepare
from gssgd.train.metrics import read_metrics
from tests.train.test_resume_methods import _differences, _load, check_hook_totals, train_all

BASE: dict[str, Any] = dict(dataset="digits", workers=2, batch_size=16, eval_every=0,
                            progress=False, timeout=120.0, amp="fp16")  # fmt: skip
STEPS = 8
#: (method, per_bucket): whole-model mode, whose resume is exact (a per-bucket hook runs one
#: dense iteration after a resume, see gssgd.ddp; its scaler path is in tests/test_amp.py)
CASES = [("gs", False), ("gtopk", False)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("amp")
    dirs: dict[str, Path] = {}
    first = []
    for method, per_bucket in CASES:
        settings = {"method": method, "per_bucket": per_bucket, **BASE}
        for name, steps in (("full", STEPS), ("part", STEPS // 2)):
            dirs[f"{method}-{name}"] = root / f"{method}-{name}"
            first.append(prepare(TrainConfig(steps=steps, out=str(dirs[f"{method}-{name}"]),
                                             **settings)))
    dirs["bf16"] = root / "bf16"
    first.append(prepare(TrainConfig(**{**BASE, "amp": "bf16"}, method="gs", steps=4,
                                     out=str(dirs["bf16"]))))
    launch(train_all, 2, (first,), timeout_s=BASE["timeout"])
    second = [
        prepare(TrainConfig(method=method, per_bucket=per_bucket, steps=STEPS, **BASE,
                            out=str(dirs[f"{method}-part"]), resume=str(dirs[f"{method}-part"])))
        for method, per_bucket in CASES
    ]
    launch(train_all, 2, (second,), timeout_s=BASE["timeout"])
    return dirs


@pytest.mark.parametrize("method", [m for m, _ in CASES])
def test_a_resumed_fp16_run_ends_bitwise_equal_with_its_scaler_state(
    runs: dict[str, Path], method: str
) -> None:
    want, got = _load(runs[f"{method}-full"], STEPS), _load(runs[f"{method}-part"], STEPS)
    mid = _load(runs[f"{method}-part"], STEPS // 2)
    assert _differences(want["model"], got["model"], "model") == []
    assert _differences(want["optimizer"], got["optimizer"], "optimizer") == []
    for r, (a, b) in enumerate(zip(want["ranks"], got["ranks"], strict=True)):
        check_hook_totals(a["sync"], b["sync"])
        assert _differences(a["sync"], b["sync"], f"rank {r} sync") == []
        scaler = b["sync"]["scaler"]
        # the resumed scaler continued the saved one (a fresh one would count 4 steps)
        assert scaler["_growth_tracker"] == a["sync"]["scaler"]["_growth_tracker"]
        assert scaler["_growth_tracker"] > mid["ranks"][r]["sync"]["scaler"]["_growth_tracker"]
        assert scaler["scale"] > 0
        # the residuals are kept in the units of the scaler's scale, saved with them
        assert b["sync"]["hook"]["loss_scale"] in (scaler["scale"], 2 * scaler["scale"])
        residuals = [sd["residual"] for sd in b["sync"]["hook"]["buckets"].values()]
        assert residuals and all(t.dtype == torch.float32 for t in residuals)
    assert _differences(mid["model"], got["model"]) != []  # the resumed half trained


def test_a_bf16_run_trains_without_a_scaler(runs: dict[str, Path]) -> None:
    ckpt = _load(runs["bf16"], 4)
    assert all("scaler" not in rank["sync"] for rank in ckpt["ranks"])
    records = read_metrics(runs["bf16"] / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    assert not any(r["skipped"] for r in records)


def test_amp_flag_is_checked_before_training(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", "--amp", "fp8", "--dataset", "digits"])
    assert exc.value.code == 2
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--amp='int8' is invalid: it must be one of fp16, bf16"):
        TrainConfig(amp="int8")
