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

__all__ = ["ARCHITECTURES", "architecture_of", "family_of", "layer_shapes"]

Shape = tuple[int, ...]

#: The families ``advise --arch`` knows.
ARCHITECTURES: tuple[str, ...] = ("transformer", "resnet")

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


def architecture_of(arch: str | None) -> str | None:
    """The architecture a study's evidence is matched by, for ``--arch`` (a shipped model's
    own is :func:`gssgd.train.models.architecture_of`, which the caller hands in)."""
    return arch


def family_of(arch: str | None) -> str:
    """The family (``"image"`` or ``"language"``, :data:`gssgd.costmodel.evidence.FAMILIES`)
    of an architecture family (a model's own is :func:`gssgd.train.models.model_family`)."""
    return "language" if arch in ("transformer", "lstm") else "image"
