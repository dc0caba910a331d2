"""``--model MODULE:FUNCTION`` and ``--dataset MODULE:FUNCTION`` (examples/user_model.py):
a user's model trains through the same trainer as a shipped one, on real gloo processes
and simulated (bitwise the same), in ``compare``, and mistakes stop before any worker
starts with a message that names the value and the fix."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from gssgd.cli.main import main
from gssgd.train.data import ImageData, TextData, load_dataset
from gssgd.train.loop import TrainConfig, run_training
from gssgd.train.metrics import read_metrics
from gssgd.train.models import build_model

USER: dict[str, Any] = dict(dataset="examples.user_model:blobs", model="examples.user_model:mlp",
                            batch_size=16, eval_every=3, progress=False, timeout=60.0)


def test_the_users_data_and_model_are_what_their_functions_build() -> None:
    from examples import user_model

    data = load_dataset(USER["dataset"])
    assert isinstance(data, ImageData) and data.num_classes == 4
    raw = user_model.blobs()
    assert len(data.y_train) == len(raw["y_train"]) and data.input_shape == (20,)
    torch.manual_seed(0)
    model = build_model(USER["model"], data)
    torch.manual_seed(0)
    assert [p.shape for p in model.parameters()] == [
        p.shape for p in user_model.mlp(data).parameters()]
    assert model(data.x_test[:5]).shape == (5, 4)


@pytest.mark.parametrize(("method", "workers"), [("gs", 3), ("powersgd", 2)])
def test_a_user_model_trains_the_same_real_and_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, workers: int
) -> None:
    """Real gloo workers and the simulated world give the same losses, bytes and final
    weights, bit for bit; the hook's schedule applies (dense first steps, then the method's
    own message), as for a shipped model."""
    from tests.train.test_simulate import _assert_simulated_is_real

    options = {"density": 0.05} if method == "gs" else {"powersgd_rank": 1}
    _assert_simulated_is_real(tmp_path, monkeypatch, method, workers, **USER, **options)
    records = read_metrics(tmp_path / f"{method}-True" / "metrics.jsonl")
    dense_step = records[0]["bytes_sent"]  # steps 0 and 1 all-reduce the dense gradient
    assert records[1]["bytes_sent"] == dense_step > records[-1]["bytes_sent"]


def test_compare_takes_a_user_model(tmp_path: Path) -> None:
    code = main(["compare", "--methods", "dense,gs", "--dataset", USER["dataset"], "--model",
                 USER["model"], "--workers", "2", "--steps", "4", "--eval-every", "4",
                 "--density", "0.05", "--no-progress", "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["status"] for r in results.values()] == ["completed"] * 2
    for method in ("dense", "gs"):
        summary = json.loads((tmp_path / method / "summary.json").read_text())
        assert summary["model"] == USER["model"] and summary["dataset"] == USER["dataset"]


@pytest.fixture()
def local_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A user's module as a file in the working directory (not on PYTHONPATH)."""
    (tmp_path / "my_things.py").write_text(textwrap.dedent("""
        import numpy as np
        from torch import nn

        def text():
            return "to be or not to be, that is the question. " * 40

        def not_a_model(data):
            return 3

        def odd_data():
            return [1, 2, 3]

        def short_data():
            return {"x_train": np.zeros((4, 2), np.float32)}

        def lstm(data):
            return nn.Sequential(nn.Embedding(data.vocab_size, 8), nn.Linear(8, data.vocab_size))

        NOT_CALLABLE = 5
    """))
    monkeypatch.chdir(tmp_path)
    yield "my_things"
    sys.modules.pop("my_things", None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def test_a_file_in_the_working_directory_is_found_and_a_text_trains(local_module: str) -> None:
    data = load_dataset(f"{local_module}:text")
    assert isinstance(data, TextData)
    cfg = TrainConfig.build(method="topk", dataset=f"{local_module}:text",
                            model=f"{local_module}:lstm", workers=2, steps=3, simulate=True,
                            batch_size=4, seq_len=16, progress=False, out="run")
    assert cfg.trains_text  # the text recipe, as for the shipped language models
    summary = run_training(cfg)
    assert summary is not None and summary["status"] == "completed"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"model": "my_things:nope"}, "--model 'my_things:nope': module 'my_things' has no 'nope'"),
        ({"model": "no_module_xyz:build"}, "--model 'no_module_xyz' cannot be imported"),
        ({"model": "my_things:NOT_CALLABLE"}, "names a int, not a function"),
        ({"model": "my_things:not_a_model"}, "returned a int, not an nn.Module"),
        ({"model": "my_things:"}, "is not MODULE:FUNCTION"),
        ({"dataset": "my_things:odd_data"}, "returned a list; return ImageData"),
        ({"dataset": "my_things:short_data"}, "returned a mapping without ['y_train', 'x_test'"),
        ({"model": "bogus"}, "or MODULE:FUNCTION"),
    ],
)
def test_mistakes_in_user_code_stop_before_any_worker(
    local_module: str, settings: dict[str, str], message: str
) -> None:
    base = {"dataset": "examples.user_model:blobs", "workers": 2, "steps": 2, **settings}
    with pytest.raises(ValueError, match=_escape(message)):
        TrainConfig.build(method="gs", density=0.05, **base)


def _escape(text: str) -> str:
    import re

    return re.escape(text)
