"""Small models sized to the offline datasets, built by name.

==========  ======================================================  =========================
name        what                                                    fits
==========  ======================================================  =========================
``mlp``     flatten, two hidden layers (128, 64), ReLU              any :class:`ImageData`
``cnn``     two 3x3 conv + max-pool stages (16, 32 channels),       images of at least 4x4
            one hidden layer of 48                                  (~81k parameters on MNIST)
``resnet``  a ResNet of three BasicBlocks (16, 32, 64 channels)     images of any size
            with GroupNorm, global average pooling                  (~78k parameters)
``lm``      character embedding (64), 2-layer LSTM (128), linear    :class:`TextData`
            head to the vocabulary
``wresnet`` a wide ResNet trunk (32, 64, 128 channels) and a        images of any size
            fully connected head of 2 x 1024                        (~3.5M parameters)
``gpt``     a character GPT: 4 pre-LN blocks of causal self-        :class:`TextData`
            attention, d_model 256, learned positions (<= 256)      (~3.3M parameters)
``gpt-s``   the same with 2 blocks of d_model 128 and positions     :class:`TextData`
            up to 128: sized for many-worker studies on 2 cores     (~0.43M parameters)
==========  ======================================================  =========================

``wresnet`` and ``gpt`` (:mod:`gssgd.train.models_wide`) are the workloads where
communication matters: at 100 Mbit/s a dense all-reduce of their gradient takes longer than
computing it on the development machine.

No model has BatchNorm: its running statistics are buffers outside the gradient,
which would make data-parallel runs of different methods awkward to compare. The
ResNet uses GroupNorm instead.

Weights come from PyTorch's default initialisation and the global RNG: seed it with
``torch.manual_seed`` before :func:`build_model` to build the same model on every
rank (nothing here seeds on its own).

Example::

    torch.manual_seed(0)
    data = load_dataset("mnist")
    model = build_model(default_model(data), data)   # "cnn"
    logits = model(data.x_train[:32])                # (32, 10)
"""

from __future__ import annotations

import torch
from torch import nn

from gssgd.train.data import ImageData, TextData
from gssgd.train.models_wide import CharGPT, WideResNet
from gssgd.train.resnet_parts import BasicBlock as BasicBlock  # still importable from here
from gssgd.train.resnet_parts import resnet_trunk
from gssgd.train.user_code import is_user_code, load_function

__all__ = ["MODELS", "MODEL_ARCHITECTURES", "TEXT_MODELS", "architecture_of", "build_model",
           "default_model", "model_data", "model_family", "model_shapes", "trained_size"]

MODELS: tuple[str, ...] = ("mlp", "cnn", "resnet", "lm", "wresnet", "gpt", "gpt-s")
"""The model names :func:`build_model` accepts."""

_IMAGE_MODELS = ("mlp", "cnn", "resnet", "wresnet")
#: ``gpt-s``: a 600-step run at 16 simulated workers fits minutes on the 2-core machine.
SMALL_GPT = {"d_model": 128, "layers": 2, "heads": 4, "context": 128}
TEXT_MODELS: tuple[str, ...] = ("lm", "gpt", "gpt-s")
#: The architecture of each shipped model, as a study's evidence names its model's: within
#: a family, ``gssgd advise`` reads the study of the same architecture where there is one
#: (a character GPT's evidence for a transformer, the character LSTM's for ``--model lm``).
MODEL_ARCHITECTURES: dict[str, str] = {
    "mlp": "mlp", "cnn": "cnn", "resnet": "resnet", "wresnet": "resnet", "lm": "lstm",
    "gpt": "transformer", "gpt-s": "transformer",
}
#: Stand-in data of the shipped models for their shapes: MNIST-shaped images (1x28x28, 10
#: classes) for image models, a 65-character vocabulary (Shakespeare's) for text models.
_STANDIN_VOCAB = 65


class MLP(nn.Module):
    """Flatten, then ``in -> 128 -> 64 -> num_classes`` with ReLU between."""

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, ...] = (128, 64)):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, ...) -> (B, num_classes)`` logits."""
        return self.net(x)


class SmallCNN(nn.Module):
    """Two stages of 3x3 conv + ReLU + 2x2 max-pool, then one hidden layer.

    On 28x28 MNIST: 28 -> 14 -> 7, a 32*7*7 = 1568 feature vector, ~81k parameters;
    on 8x8 digits: 8 -> 4 -> 2, ~12k parameters.
    """

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = 32 * (height // 4) * (width // 4)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, 48), nn.ReLU(), nn.Linear(48, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W) -> (B, num_classes)`` logits."""
        return self.classifier(self.features(x))


class SmallResNet(nn.Module):
    """A 3x3 stem, BasicBlocks of 16, 32 (stride 2) and 64 (stride 2) channels,
    global average pooling and a linear head. Works on any image size."""

    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...] = (16, 32, 64)):
        super().__init__()
        self.stem, self.blocks, width = resnet_trunk(in_channels, widths)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W) -> (B, num_classes)`` logits."""
        return self.head(self.blocks(self.stem(x)))


class CharLSTM(nn.Module):
    """Character LM: embedding, a multi-layer LSTM, a linear head over the vocabulary."""

    def __init__(self, vocab_size: int, embed: int = 64, hidden: int = 128, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` int64 ids -> ``(B, T, vocab_size)`` next-character logits."""
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def default_model(data: ImageData | TextData) -> str:
    """The model name to use when the user names none.

    Args:
        data: a loaded dataset.

    Returns:
        ``"lm"`` for text, ``"cnn"`` for images with spatial dimensions and
        ``"mlp"`` for flat features.

    Raises:
        TypeError: ``data`` is neither :class:`ImageData` nor :class:`TextData`.
    """
    if isinstance(data, TextData):
        return "lm"
    if isinstance(data, ImageData):
        return "cnn" if len(data.input_shape) == 3 else "mlp"
    raise TypeError(f"data must be ImageData or TextData, got {type(data).__name__}")


def trained_size(model: nn.Module) -> int:
    """``d``: the parameters that train (``requires_grad``), the vector a method averages
    (DDP hands the hook only their gradients); a run's config, summary and checkpoints
    record it."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_model(name: str, data: ImageData | TextData) -> nn.Module:
    """Build the named model, sized to ``data``.

    Args:
        name: one of :data:`MODELS`, or ``MODULE:FUNCTION``: a user's function that takes
            ``data`` and returns the model (:mod:`gssgd.train.user_code`).
        data: the dataset the model will train on (its sample shape, number of
            classes or vocabulary fix the input and output sizes).

    Returns:
        An ``nn.Module`` in training mode on the CPU. Image models map
        ``(B, *data.input_shape)`` float32 to ``(B, num_classes)`` logits; ``lm`` and
        ``gpt`` map ``(B, T)`` int64 ids to ``(B, T, vocab_size)`` logits.

    Raises:
        ValueError: an unknown name, or a model that does not fit the data (the
            message says which models do).
        TypeError: ``data`` is neither :class:`ImageData` nor :class:`TextData`.
    """
    if is_user_code(name):
        return _build_user_model(name, data)
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid models are {', '.join(MODELS)} "
                         "or MODULE:FUNCTION (a function of yours that builds the model)")
    suggestion = default_model(data)  # also checks the type of data
    if isinstance(data, TextData):
        if name not in TEXT_MODELS:
            raise ValueError(
                f"model {name!r} needs image data but dataset {data.name!r} is text; use "
                f"--model lm (or --model gpt)"
            )
        if name == "gpt-s":
            return CharGPT(data.vocab_size, **SMALL_GPT)
        return CharGPT(data.vocab_size) if name == "gpt" else CharLSTM(data.vocab_size)
    if name in TEXT_MODELS:
        raise ValueError(
            f"model {name!r} needs text data but dataset {data.name!r} holds images or features; "
            f"use one of {', '.join(_IMAGE_MODELS)} (e.g. --model {suggestion})"
        )
    return _build_image_model(name, data)


def _build_user_model(name: str, data: ImageData | TextData) -> nn.Module:
    """``--model MODULE:FUNCTION``: the user's function called with the data."""
    model = load_function(name, "--model")(data)
    if not isinstance(model, nn.Module):
        raise ValueError(f"--model {name!r} returned a {type(model).__name__}, not an "
                         "nn.Module; return the model (e.g. nn.Sequential(...))")
    return model.train()


def _build_image_model(name: str, data: ImageData) -> nn.Module:
    shape = data.input_shape
    if name == "mlp":
        return MLP(int(torch.Size(shape).numel()), data.num_classes)
    if len(shape) != 3:
        raise ValueError(
            f"model {name!r} needs images of shape (C, H, W) but dataset {data.name!r} has flat "
            f"features of shape {shape}; use --model mlp or store x as (N, H, W) or (N, C, H, W)"
        )
    channels, height, width = shape
    if name == "resnet":
        return SmallResNet(channels, data.num_classes)
    if name == "wresnet":
        return WideResNet(channels, data.num_classes)
    if height < 4 or width < 4:
        raise ValueError(
            f"model 'cnn' needs images of at least 4x4 (it pools twice by 2) but dataset "
            f"{data.name!r} has {height}x{width}; use --model resnet or --model mlp"
        )
    return SmallCNN(channels, height, width, data.num_classes)


# --------------------------------------------------------------------------- what the cost model is handed


def architecture_of(model: str) -> str:
    """The architecture of a shipped model (:data:`MODEL_ARCHITECTURES`), or the name itself
    for the user's ``MODULE:FUNCTION`` (no study matches it: its family's evidence)."""
    return MODEL_ARCHITECTURES.get(model, model)


def model_shapes(name: str, dataset: str | None = None) -> tuple[tuple[int, ...], ...]:
    """The parameter shapes of the model ``name`` in model order, which ``gssgd advise
    --model`` hands the cost model: a shipped model (``gssgd train --model``) or the user's
    ``MODULE:FUNCTION``, built on ``dataset`` (loaded as ``gssgd train --dataset`` loads it)
    or, without one, on stand-in data (MNIST-shaped images, or a 65-character vocabulary
    for a shipped text model).

    Raises:
        ValueError: an unknown model (the message lists them), or one that cannot be built
            on that data.
    """
    return tuple(tuple(p.shape) for p in build_model(name, model_data(name, dataset)).parameters())


def model_data(name: str, dataset: str | None = None) -> ImageData | TextData:
    """The data ``name`` is built on for its shapes (see :func:`model_shapes`).

    Raises:
        ValueError: an unknown shipped model (the message lists them).
    """
    if not is_user_code(name) and name not in MODELS:
        raise ValueError(
            f"unknown model {name!r}; shipped models are {', '.join(MODELS)}, or give your "
            "own as MODULE:FUNCTION (with --dataset where it needs its data), or --params N "
            "with --arch"
        )
    if dataset is not None:
        from gssgd.train.data import load_dataset

        return load_dataset(dataset)
    if name in TEXT_MODELS:
        ids = torch.arange(200) % _STANDIN_VOCAB
        chars = [chr(32 + i) for i in range(_STANDIN_VOCAB)]
        return TextData(train=ids, test=ids, vocab=chars, name="stand-in")
    x, y = torch.zeros(2, 1, 28, 28), torch.arange(2)
    return ImageData(x_train=x, y_train=y, x_test=x, y_test=y, num_classes=10,
                     name="stand-in")


def model_family(name: str, dataset: str | None = None) -> str:
    """The family of a shipped model (a text model: ``"language"``; else ``"image"``), or of
    the user's by the data it is built on."""
    if not is_user_code(name):
        return "language" if name in TEXT_MODELS else "image"
    return "language" if isinstance(model_data(name, dataset), TextData) else "image"
