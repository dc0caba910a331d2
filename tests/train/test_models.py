"""Tests for gssgd.train.models: every model on every dataset it fits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gssgd.train.data import (
    DatasetUnavailableError,
    ImageData,
    TextData,
    lm_batch,
    load_dataset,
)
from gssgd.train.models import MODELS, TEXT_MODELS, build_model, default_model

IMAGE_DATASETS = ("digits", "mnist", "fashion-mnist")
IMAGE_MODELS = ("mlp", "cnn", "resnet")  # wresnet: tests/train/test_models_wide.py
BATCH = 4

# Parameter counts pinned loosely: small enough for fast CPU runs, big enough to learn.
PARAM_RANGES = {
    ("mlp", 28): (50_000, 200_000),
    ("mlp", 8): (5_000, 50_000),
    ("cnn", 28): (60_000, 120_000),
    ("cnn", 8): (5_000, 50_000),
    ("resnet", 28): (5_000, 200_000),
    ("resnet", 8): (5_000, 200_000),
}


def _load_or_skip(name: str) -> ImageData | TextData:
    try:
        return load_dataset(name)
    except DatasetUnavailableError as err:
        pytest.skip(str(err))


def _flat_data() -> ImageData:
    x = torch.randn(10, 12)
    y = torch.arange(10) % 4
    return ImageData(x_train=x, y_train=y, x_test=x, y_test=y, num_classes=4, name="npz:flat")


def _tiny_text() -> TextData:
    ids = torch.arange(200) % 7
    return TextData(train=ids, test=ids[:50], vocab=list("abcdefg"), name="text:tiny")


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _forward_backward(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    out = model(x)
    loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    return out


@pytest.mark.parametrize("model_name", IMAGE_MODELS)
@pytest.mark.parametrize("dataset", IMAGE_DATASETS)
def test_image_model_gives_logits_per_class_and_backprops(dataset: str, model_name: str) -> None:
    data = _load_or_skip(dataset)
    torch.manual_seed(0)
    model = build_model(model_name, data)
    out = _forward_backward(model, data.x_train[:BATCH], data.y_train[:BATCH])
    assert out.shape == (BATCH, data.num_classes)
    low, high = PARAM_RANGES[(model_name, data.input_shape[-1])]
    assert low <= _num_params(model) <= high


def test_lm_gives_logits_per_position_and_backprops() -> None:
    data = _load_or_skip("shakespeare")
    torch.manual_seed(0)
    model = build_model("lm", data)
    inputs, targets = lm_batch(data.train, 0, 0, 1, batch_size=BATCH, seq_len=32, seed=0)
    out = _forward_backward(model, inputs, targets)
    assert out.shape == (BATCH, 32, data.vocab_size)
    assert 50_000 <= _num_params(model) <= 500_000


def test_lm_sizes_its_head_to_the_vocabulary() -> None:
    model = build_model("lm", _tiny_text())
    inputs, targets = lm_batch(_tiny_text().train, 0, 0, 1, batch_size=2, seq_len=8, seed=0)
    assert _forward_backward(model, inputs, targets).shape == (2, 8, 7)


def test_mlp_fits_flat_features() -> None:
    data = _flat_data()
    out = _forward_backward(build_model("mlp", data), data.x_train[:3], data.y_train[:3])
    assert out.shape == (3, 4)


@pytest.mark.parametrize("model_name", IMAGE_MODELS)
def test_image_models_accept_several_channels(model_name: str) -> None:
    x = torch.randn(6, 3, 12, 10)
    y = torch.arange(6) % 5
    data = ImageData(x_train=x, y_train=y, x_test=x, y_test=y, num_classes=5, name="npz:rgb")
    assert _forward_backward(build_model(model_name, data), x, y).shape == (6, 5)


@pytest.mark.parametrize("model_name", MODELS)
def test_build_is_deterministic_under_the_callers_seed(model_name: str) -> None:
    data = _tiny_text() if model_name in TEXT_MODELS else load_dataset("digits")

    def build(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(model_name, data).state_dict()

    first, again, other = build(0), build(0), build(1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)  # no seeding inside


@pytest.mark.parametrize("model_name", MODELS)
def test_models_have_no_buffers_and_no_batchnorm(model_name: str) -> None:
    data = _tiny_text() if model_name in TEXT_MODELS else load_dataset("digits")
    model = build_model(model_name, data)
    assert list(model.buffers()) == []
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_default_model_picks_cnn_mlp_or_lm() -> None:
    assert default_model(load_dataset("digits")) == "cnn"
    assert default_model(_flat_data()) == "mlp"
    assert default_model(_tiny_text()) == "lm"
    with pytest.raises(TypeError, match=r"data must be ImageData or TextData, got str"):
        default_model("digits")  # type: ignore[arg-type]


def test_models_constant_lists_every_name() -> None:
    assert MODELS == ("mlp", "cnn", "resnet", "lm", "wresnet", "gpt", "gpt-s")


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(
        ValueError, match=r"unknown model 'vgg'; valid models are mlp, cnn, resnet, lm"
    ):
        build_model("vgg", load_dataset("digits"))


@pytest.mark.parametrize(
    ("model_name", "data_factory", "message"),
    [
        ("lm", lambda: load_dataset("digits"), r"model 'lm' needs text data .* --model cnn"),
        ("lm", _flat_data, r"model 'lm' needs text data .* --model mlp"),
        (
            "cnn",
            _tiny_text,
            r"model 'cnn' needs image data but dataset 'text:tiny' is text; use --model lm",
        ),
        (
            "resnet",
            _flat_data,
            r"model 'resnet' needs images of shape \(C, H, W\) .* \(12,\); use --model mlp",
        ),
        ("cnn", _flat_data, r"model 'cnn' needs images of shape \(C, H, W\)"),
    ],
)
def test_model_that_does_not_fit_the_data_is_rejected(
    model_name: str, data_factory, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(model_name, data_factory())


def test_cnn_rejects_images_smaller_than_4x4_but_resnet_fits_them() -> None:
    x = torch.randn(4, 1, 3, 3)
    y = torch.arange(4) % 2
    data = ImageData(x_train=x, y_train=y, x_test=x, y_test=y, num_classes=2, name="npz:tiny")
    with pytest.raises(
        ValueError, match=r"needs images of at least 4x4 .* has 3x3; use --model resnet"
    ):
        build_model("cnn", data)
    assert _forward_backward(build_model("resnet", data), x, y).shape == (4, 2)
