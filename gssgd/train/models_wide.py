"""Two models of a few million parameters, where communication is most of a step.

The small models of :mod:`gssgd.train.models` (80k-250k parameters) finish a dense
all-reduce in milliseconds even on a 100 Mbit/s link, so no compressor can win there. These
two carry enough parameters that moving a dense gradient costs more than computing it on
the development machine (a 2-core VM, half a core per worker at P = 4):

===========  ================================================  ============================
name         what                                              size
===========  ================================================  ============================
``gpt``      character GPT: token + learned position           ~3.2M parameters
             embeddings, 4 pre-LN blocks (causal self-         (d_model 256, 4 heads,
             attention, 4x GELU MLP), final LayerNorm,          context up to 256 characters)
             linear head to the vocabulary
``wresnet``  a wide ResNet trunk (GroupNorm BasicBlocks of     ~3.5M parameters on 28x28
             32, 64, 128 channels, strides 1, 2, 2) and a      (most of them in the head)
             VGG-style fully connected head (flatten the
             4x4 map, 2 layers of 1024)
===========  ================================================  ============================

Why the ResNet's parameters sit in a fully connected head: a 3x3 convolution reuses each
weight at every pixel (hundreds of multiply-adds per weight and sample), a linear layer once.
Putting the width in the head (as VGG and AlexNet do, the classic communication-bound models
of the gradient-compression literature) gives millions of parameters at a compute cost half
a core can carry. The transformer does about ``6 * parameters`` operations per token, so its
share of communication depends on the tokens per worker and step (``--batch-size`` times
``--seq-len``).

Like the small models: no BatchNorm and no buffers (the causal mask is applied by
:func:`torch.nn.functional.scaled_dot_product_attention`, not stored), weights from
PyTorch's default initialisation (the transformer's as GPT-2's: normal(0, 0.02), residual
projections scaled by ``1/sqrt(2 * layers)``), all drawn from the global RNG, so
``torch.manual_seed`` before building gives every rank the same model.

Example::

    torch.manual_seed(0)
    data = load_dataset("shakespeare")
    model = build_model("gpt", data)            # CharGPT(vocab_size=data.vocab_size)
    logits = model(ids)                         # (B, T) -> (B, T, vocab_size), T <= 256
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from gssgd.train.resnet_parts import resnet_trunk

__all__ = ["CharGPT", "WideResNet"]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position ``t`` sees positions ``<= t`` only.

    Steps: one linear layer makes queries, keys and values for every head; scaled
    dot-product attention with the causal mask (``is_causal=True``) mixes the values;
    a linear projection maps the heads back to ``d_model``.
    """

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        if d_model % heads:
            raise ValueError(
                f"d_model={d_model} must be a multiple of heads={heads}; e.g. d_model=256, heads=4"
            )
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, d_model) -> (B, T, d_model)``."""
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """A pre-LN transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, d_model) -> (B, T, d_model)``."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    """A GPT-style character language model (Radford et al. 2019's layout, small).

    ``logits = head(ln_f(blocks(tok_emb(ids) + pos_emb(positions))))``.

    Args:
        vocab_size: characters in the vocabulary (the head's outputs).
        d_model: width of the residual stream.
        layers: transformer blocks.
        heads: attention heads per block (``d_model`` must be a multiple).
        context: the longest sequence it accepts (learned positions ``0..context-1``).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 256,
        layers: int = 4,
        heads: int = 4,
        context: int = 256,
    ):
        super().__init__()
        self.context = context
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, heads) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        self._init_weights(layers)

    def _init_weights(self, layers: int) -> None:
        """GPT-2's initialisation: normal(0, 0.02) weights, zero biases, and the projections
        into the residual stream scaled down by ``sqrt(2 * layers)`` so its variance does
        not grow with depth."""
        for name, p in self.named_parameters():
            if p.dim() < 2:  # biases and LayerNorm gains keep their defaults (0 and 1)
                continue
            std = 0.02
            if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                std /= math.sqrt(2 * layers)
            nn.init.normal_(p, 0.0, std)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` int64 ids -> ``(B, T, vocab_size)`` next-character logits.

        Raises:
            ValueError: ``T`` is longer than the model's context.
        """
        t = ids.shape[1]
        if t > self.context:
            raise ValueError(
                f"sequence length {t} exceeds the model's context of {self.context} "
                f"characters; use --seq-len {self.context} or less"
            )
        positions = torch.arange(t, device=ids.device)
        x = self.tok_emb(ids) + self.pos_emb(positions)
        return self.head(self.ln_f(self.blocks(x)))


class WideResNet(nn.Module):
    """A ResNet trunk and a wide fully connected head (most parameters in the head).

    Stem (3x3 conv, GroupNorm, ReLU), BasicBlocks of ``widths`` channels (the first at
    stride 1, the others at stride 2), adaptive average pooling to ``pool x pool``, then
    ``flatten -> hidden -> hidden -> num_classes`` with ReLU between.

    On 28x28 images with the defaults: 28 -> 14 -> 7 feature maps of 128 channels,
    pooled to 4x4 (2048 features), then 2048 -> 1024 -> 1024 -> 10: about 3.5M parameters,
    of which 2.1M in the head's first layer.

    Args:
        in_channels, num_classes: the data's.
        widths: channels of the BasicBlocks.
        hidden: width of the head's two hidden layers.
        pool: side of the pooled feature map fed to the head.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        widths: tuple[int, ...] = (32, 64, 128),
        hidden: int = 1024,
        pool: int = 4,
    ):
        super().__init__()
        self.stem, self.blocks, width = resnet_trunk(in_channels, widths)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(pool),
            nn.Flatten(),
            nn.Linear(width * pool * pool, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W) -> (B, num_classes)`` logits."""
        return self.head(self.blocks(self.stem(x)))
