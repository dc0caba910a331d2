"""Tests for gssgd.train.models_wide: the 1-10M-parameter workloads (``gpt``, ``wresnet``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gssgd.train.data import DatasetUnavailableError, ImageData, TextData, lm_batch, load_dataset
from gssgd.train.models import build_model
from gssgd.train.models_wide import CharGPT, WideResNet


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _text(vocab: int = 11, n: int = 600) -> TextData:
    ids = (torch.arange(n) * 7 + torch.arange(n) // 5) % vocab
    chars = [chr(ord("a") + i) for i in range(vocab)]
    return TextData(train=ids, test=ids[:100], vocab=chars, name="text:tiny")


def _images(shape: tuple[int, ...] = (1, 28, 28), classes: int = 10, n: int = 16) -> ImageData:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=g)
    y = torch.arange(n) % classes
    return ImageData(x_train=x, y_train=y, x_test=x, y_test=y, num_classes=classes, name="npz:x")


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def test_gpt_gives_logits_per_position_and_has_1_to_10m_parameters() -> None:
    data = _text()
    torch.manual_seed(0)
    model = build_model("gpt", data)
    assert isinstance(model, CharGPT)
    x, y = lm_batch(data.train, 0, 0, 1, batch_size=3, seq_len=40, seed=0)
    assert model(x).shape == (3, 40, data.vocab_size)
    assert 1_000_000 <= _num_params(model) <= 10_000_000


def test_gpt_on_shakespeare_is_about_3m_parameters() -> None:
    try:
        data = load_dataset("shakespeare")
    except DatasetUnavailableError as err:
        pytest.skip(str(err))
    assert 3_000_000 <= _num_params(build_model("gpt", data)) <= 3_500_000
    small = build_model("gpt-s", data)  # sized for 600 steps at 16 workers on 2 cores
    assert 400_000 <= _num_params(small) <= 500_000 and small.context == 128


def test_gpt_is_causal_a_later_character_never_changes_earlier_logits() -> None:
    torch.manual_seed(0)
    model = CharGPT(13, d_model=32, layers=2, heads=4, context=16).eval()
    ids = torch.randint(0, 13, (2, 12))
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 13
    a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])  # the changed position and later do see it


def test_gpt_rejects_a_sequence_longer_than_its_context() -> None:
    model = CharGPT(5, d_model=16, layers=1, heads=2, context=8)
    with pytest.raises(
        ValueError, match=r"sequence length 9 exceeds .* context of 8 .* --seq-len 8"
    ):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_gpt_rejects_heads_that_do_not_divide_the_width() -> None:
    with pytest.raises(ValueError, match=r"d_model=30 must be a multiple of heads=4"):
        CharGPT(5, d_model=30, heads=4)


@pytest.mark.parametrize(
    ("shape", "low", "high"),
    [
        ((1, 28, 28), 3_000_000, 4_000_000),
        ((3, 32, 32), 3_000_000, 4_000_000),
        ((1, 8, 8), 3_000_000, 4_000_000),
    ],
)
def test_wresnet_gives_logits_per_class_on_any_image_size(
    shape: tuple[int, ...], low: int, high: int
) -> None:
    data = _images(shape)
    torch.manual_seed(0)
    model = build_model("wresnet", data)
    assert isinstance(model, WideResNet)
    assert model(data.x_train[:5]).shape == (5, 10)
    assert low <= _num_params(model) <= high


def test_wresnet_holds_most_parameters_in_its_head() -> None:
    model = WideResNet(1, 10)
    assert _num_params(model.head) > 0.8 * _num_params(model)


def test_wresnet_needs_images_not_flat_features() -> None:
    flat = ImageData(
        x_train=torch.randn(4, 12),
        y_train=torch.arange(4),
        x_test=torch.randn(4, 12),
        y_test=torch.arange(4),
        num_classes=4,
        name="npz:flat",
    )
    with pytest.raises(ValueError, match=r"model 'wresnet' needs images of shape \(C, H, W\)"):
        build_model("wresnet", flat)


@pytest.mark.parametrize(
    ("name", "data_factory", "message"),
    [
        ("gpt", _images, r"model 'gpt' needs text data .* --model cnn"),
        (
            "wresnet",
            _text,
            r"model 'wresnet' needs image data .* use --model lm \(or --model gpt\)",
        ),
    ],
)
def test_a_wide_model_on_the_wrong_kind_of_data_says_which_to_use(
    name: str, data_factory, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(name, data_factory())


@pytest.mark.parametrize("name", ["gpt", "wresnet"])
def test_a_few_training_steps_lower_the_loss(name: str) -> None:
    torch.manual_seed(0)
    if name == "gpt":
        data = _text()
        model = build_model("gpt", data)
        x, y = lm_batch(data.train, 0, 0, 1, batch_size=4, seq_len=32, seed=0)
    else:
        data = _images(n=16)
        model = build_model("wresnet", data)
        x, y = data.x_train, data.y_train
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = _loss(model, x, y)
        loss.backward()
        for pname, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("name", ["gpt", "wresnet"])
def test_build_is_deterministic_under_the_callers_seed_and_has_no_buffers(name: str) -> None:
    data = _text() if name == "gpt" else _images()

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return build_model(name, data)

    first, again, other = build(0), build(0), build(1)
    a, b, c = first.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert list(first.buffers()) == []
    x = data.x_train[:2] if isinstance(data, ImageData) else data.train[:20].view(2, 10)
    torch.testing.assert_close(first(x), again(x), rtol=0, atol=0)


def test_gpt_initialisation_scales_the_residual_projections_down() -> None:
    torch.manual_seed(0)
    model = CharGPT(50, d_model=256, layers=4)
    std = model.blocks[0].attn.proj.weight.std().item()
    assert 0.6 * 0.02 / 8**0.5 < std < 1.4 * 0.02 / 8**0.5
    assert 0.015 < model.blocks[0].attn.qkv.weight.std().item() < 0.025
