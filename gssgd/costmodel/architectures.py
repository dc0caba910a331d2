"""Layer shapes of an architecture family at a given size, for the methods whose message
depends on them (PowerSGD sends ``r * (n + m)`` numbers per ``n x m`` matrix).

``gssgd advise --params 1.3B --arch transformer`` prices PowerSGD on these shapes. Each
family is a documented reference layout scaled to the parameter count asked for:

* ``transformer``: GPT-2's layout (Radford et al. 2019; the Hugging Face ``gpt2`` modules,
  weights as ``nn.Linear`` stores them, ``(out, in)``): token embedding ``50257 x d``,
  position embedding ``1024 x d``, per block two layer norms (``d``, ``d`` each), the
  attention's ``3d x d`` and ``d x d`` projections and the MLP's ``4d x d`` and ``d x 4d``,
  each with its bias, and a final layer norm; the output layer is tied to the embedding.
  The width ``d`` comes from the nearest published configuration (GPT-2
  small/medium/large/XL; GPT-3's 1.3B-175B, Brown et al. 2020, Table 2.1) on a log scale of
  parameters, the depth is the one nearest the count asked for.
* ``resnet``: torchvision's bottleneck ResNet (He et al. 2016): a 7x7 stem of 64 channels,
  four stages of bottleneck blocks (1x1, 3x3, 1x1 convolutions, expansion 4, a 1x1
  projection at each stage's first block), batch norms (weight and bias), a 1000-way
  classifier. ResNet-50 (25,557,032 parameters), -101 or -152 by the nearest count, its
  channels widened or narrowed by a common factor ``sqrt(asked / reference)``.

The difference to the count asked for goes into the embedding's rows (the vocabulary) or
the classifier's classes, and what is left, less than one such row, is one vector (as a
model's leftover biases would be: PowerSGD sends vectors dense).

Example:
    >>> shapes = layer_shapes("transformer", 124_439_808)  # GPT-2 small exactly
    >>> len(shapes), shapes[0]
    (148, (50257, 768))
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ARCHITECTURES", "LANGUAGE_MODELS", "MODEL_ARCHITECTURES", "architecture_of",
           "family_of", "layer_shapes", "model_data", "model_family", "model_shapes"]

Shape = tuple[int, ...]

#: The families ``advise --arch`` knows.
ARCHITECTURES: tuple[str, ...] = ("transformer", "resnet")
#: The shipped language models (``gssgd.train.models.TEXT_MODELS``, named here so that
#: ``advise`` need not import torch to know a family).
LANGUAGE_MODELS: tuple[str, ...] = ("lm", "gpt", "gpt-s")
#: Stand-in data of the shipped models for their shapes: MNIST-shaped images (1x28x28, 10
#: classes) for image models, a 65-character vocabulary (Shakespeare's) for text models.
_STANDIN_VOCAB = 65

#: GPT-2 (small, medium, large, XL) and GPT-3 (XL, 2.7B, 6.7B, 13B, 175B): (layers, width).
_TRANSFORMERS: tuple[tuple[int, int], ...] = (
    (12, 768), (24, 1024), (36, 1280), (48, 1600),
    (24, 2048), (32, 2560), (32, 4096), (40, 5120), (96, 12288),
)
_VOCAB, _CONTEXT = 50257, 1024
#: ResNet-50, -101, -152: bottleneck blocks per stage.
_RESNETS: tuple[tuple[int, ...], ...] = ((3, 4, 6, 3), (3, 4, 23, 3), (3, 8, 36, 3))


def _block(d: int) -> list[Shape]:
    """One GPT-2 block of width ``d``."""
    return [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,),
            (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]


def _transformer(layers: int, d: int, vocab: int = _VOCAB) -> list[Shape]:
    return [(vocab, d), (_CONTEXT, d)] + _block(d) * layers + [(d,), (d,)]


def _resnet(blocks: tuple[int, ...], width: float, classes: int = 1000) -> list[Shape]:
    """A bottleneck ResNet with every channel count scaled by ``width``."""
    def ch(c: int) -> int:
        return max(1, round(c * width))

    stem = ch(64)
    shapes: list[Shape] = [(stem, 3, 7, 7), (stem,), (stem,)]
    inplanes = stem
    for stage, count in enumerate(blocks):
        planes = ch(64 * 2**stage)
        for i in range(count):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,),
                       (planes, planes, 3, 3), (planes,), (planes,),
                       (4 * planes, planes, 1, 1), (4 * planes,), (4 * planes,)]
            if i == 0:
                shapes += [(4 * planes, inplanes, 1, 1), (4 * planes,), (4 * planes,)]
            inplanes = 4 * planes
    return shapes + [(classes, inplanes), (classes,)]


def _count(shapes: list[Shape]) -> int:
    return sum(math.prod(s) for s in shapes)


def _nearest(counts: list[int], params: int) -> int:
    """The index of the count nearest to ``params`` on a log scale."""
    return min(range(len(counts)), key=lambda i: abs(math.log(counts[i] / params)))


def _fit_transformer(params: int) -> list[Shape]:
    """The nearest configuration's width; the depth nearest the count; the vocabulary (the
    embedding's rows) absorbing the difference."""
    configs = [_transformer(n, d) for n, d in _TRANSFORMERS]
    _, d = _TRANSFORMERS[_nearest([_count(c) for c in configs], params)]
    fixed, per_layer = _count(_transformer(0, d)), _count(_block(d))
    layers = max(1, round((params - fixed) / per_layer))
    vocab = (params - _count(_transformer(layers, d, vocab=0))) // d
    return _transformer(layers, d, vocab=vocab)


def _fit_resnet(params: int) -> list[Shape]:
    """The nearest depth; its channels scaled by a common width; the classifier's classes
    absorbing the difference."""
    blocks = _RESNETS[_nearest([_count(_resnet(b, 1.0)) for b in _RESNETS], params)]
    width = math.sqrt(params / _count(_resnet(blocks, 1.0)))
    body = _resnet(blocks, width, classes=0)
    inplanes = body[-2][1]
    return _resnet(blocks, width, classes=(params - _count(body)) // (inplanes + 1))


def layer_shapes(arch: str, params: int) -> tuple[Shape, ...]:
    """The parameter shapes of family ``arch`` at ``params`` parameters, in model order,
    adding up to exactly ``params`` (the rest as one vector; see the module doc).

    Raises:
        ValueError: an unknown family (the message lists them), or a count too small for
            the family's smallest layout.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"unknown architecture {arch!r}; known families: {', '.join(ARCHITECTURES)} "
            "(or give --model NAME for a shipped model's exact shapes)"
        )
    shapes = _fit_transformer(params) if arch == "transformer" else _fit_resnet(params)
    rest = params - _count(shapes)
    if rest < 0 or any(min(s) < 1 for s in shapes):
        raise ValueError(
            f"{params:,} parameters is too few for a {arch} of the documented layout (its "
            f"smallest here has {_count(shapes):,}); give --params of at least that"
        )
    return tuple(shapes) + (((rest,),) if rest else ())


#: The architecture of each shipped model, as a study's evidence names its model's: within
#: a family, ``advise`` reads the study of the same architecture where there is one (a
#: character GPT's evidence for a transformer, the character LSTM's for ``--model lm``).
MODEL_ARCHITECTURES: dict[str, str] = {
    "mlp": "mlp", "cnn": "cnn", "resnet": "resnet", "wresnet": "resnet", "lm": "lstm",
    "gpt": "transformer", "gpt-s": "transformer",
}


def architecture_of(model: str | None = None, arch: str | None = None) -> str | None:
    """The architecture (:data:`MODEL_ARCHITECTURES`) of a shipped model, or the family
    ``arch`` itself (``"transformer"``, ``"resnet"``); None where neither is given."""
    if model is not None:
        return MODEL_ARCHITECTURES.get(model, model)
    return arch


def family_of(model: str | None = None, arch: str | None = None) -> str:
    """The family (``"image"`` or ``"language"``, :data:`gssgd.costmodel.evidence.FAMILIES`)
    of a shipped model or an architecture family."""
    if model is not None:
        return "language" if model in LANGUAGE_MODELS else "image"
    return "language" if arch == "transformer" else "image"


def model_shapes(name: str, dataset: str | None = None) -> tuple[Shape, ...]:
    """The parameter shapes of the model ``name`` in model order: a shipped model
    (``gssgd train --model``) or the user's ``MODULE:FUNCTION``, built on ``dataset``
    (loaded as ``gssgd train --dataset`` loads it) or, without one, on stand-in data
    (MNIST-shaped images, or a 65-character vocabulary for a shipped text model).

    Raises:
        ValueError: an unknown model (the message lists them), or one that cannot be built
            on that data.
    """
    data = model_data(name, dataset)
    from gssgd.train.models import build_model

    return tuple(tuple(p.shape) for p in build_model(name, data).parameters())


def model_data(name: str, dataset: str | None = None) -> Any:
    """The data ``name`` is built on for its shapes (see :func:`model_shapes`).

    Raises:
        ValueError: an unknown shipped model (the message lists them).
    """
    import torch

    from gssgd.train.data_types import ImageData, TextData
    from gssgd.train.models import MODELS
    from gssgd.train.user_code import is_user_code

    if not is_user_code(name) and name not in MODELS:
        raise ValueError(
            f"unknown model {name!r}; shipped models are {', '.join(MODELS)}, or give your "
            "own as MODULE:FUNCTION (with --dataset where it needs its data), or --params N "
            "with --arch"
        )
    if dataset is not None:
        from gssgd.train.data import load_dataset

        return load_dataset(dataset)
    if name in LANGUAGE_MODELS:
        ids = torch.arange(200) % _STANDIN_VOCAB
        chars = [chr(32 + i) for i in range(_STANDIN_VOCAB)]
        return TextData(train=ids, test=ids, vocab=chars, name="stand-in")
    x, y = torch.zeros(2, 1, 28, 28), torch.arange(2)
    return ImageData(x_train=x, y_train=y, x_test=x, y_test=y, num_classes=10,
                     name="stand-in")


def model_family(name: str, dataset: str | None = None) -> str:
    """The family of a shipped model, or of the user's by the data it is built on (text:
    ``"language"``; else ``"image"``)."""
    from gssgd.train.user_code import is_user_code

    if not is_user_code(name):
        return family_of(model=name)
    from gssgd.train.data_types import TextData

    return "language" if isinstance(model_data(name, dataset), TextData) else "image"
