"""What ``gssgd bench kernels`` runs: sizes, sketch layouts, timing repeats and device
(:class:`KernelBenchConfig`), and the reference figures its report prints beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gssgd.costmodel import store

__all__ = ["CPU_SIZES", "CUDA_SIZES", "H200_ANCHOR", "KernelBenchConfig", "Layout",
           "RESNET50_D", "TARGETS_MS"]

#: ResNet-50's parameter count: the size of the anchors and of the per-step shares.
RESNET50_D = 25_557_032
#: The naive torch operations timed on an H200 (``data/h200_anchor.json``), sizes by d.
H200_ANCHOR: dict = {**store.load("h200_anchor.json"), "sizes": {
    int(d): v for d, v in store.load("h200_anchor.json")["sizes"].items()}}

#: Default sizes: ResNet-50's 25.6M and BERT-base's 110M parameters, and 1M.
CUDA_SIZES: tuple[int, ...] = (1_000_000, 25_557_032, 110_000_000)
#: Without CUDA (the torch path on CPU): one size that finishes in about a minute.
CPU_SIZES: tuple[int, ...] = (1_000_000,)

#: The kernels' targets at d = 25.6M on an H200 (milliseconds).
TARGETS_MS: dict[str, float] = {"sketch": 0.1, "recover+select": 1.0}


@dataclass(frozen=True)
class Layout:
    """A sketch shape: ``rows`` rows of ``cols_per_k · k`` columns."""

    rows: int
    cols_per_k: int

    @property
    def name(self) -> str:
        """``5x10k``: the layout as the report names it."""
        return f"{self.rows}x{self.cols_per_k}k"

    @classmethod
    def parse(cls, text: str) -> Layout:
        """``"5x10"`` (or ``"5x10k"``): 5 rows of 10·k columns.

        Raises:
            ValueError: not of that form, or rows even / below 1.
        """
        try:
            rows, per_k = (int(part) for part in text.lower().rstrip("k").split("x"))
        except ValueError:
            raise ValueError(
                f"layout {text!r} is invalid: write ROWSxCOLS_PER_K, e.g. 1x40 or 5x10"
            ) from None
        if rows < 1 or rows % 2 == 0 or per_k < 1:
            raise ValueError(
                f"layout {text!r} is invalid: rows must be odd and >= 1, columns per k >= 1"
            )
        return cls(rows, per_k)


@dataclass
class KernelBenchConfig:
    """What ``gssgd bench kernels`` runs.

    Attributes:
        sizes: gradient lengths (None: :data:`CUDA_SIZES` on CUDA, :data:`CPU_SIZES` else).
        layouts: sketch shapes; gs's default (1 row of 40·k) and the anchors' (5 of 10·k).
        density: k = round(density · d).
        repeats: timed runs per operation (the median is reported).
        warmup: untimed runs first (compilation, allocator).
        device: "cuda" or "cpu" (None: CUDA when available).
        seed: of the random gradients and the hashes.
        notes: lines the report prints first (the run adds its own).
    """

    sizes: tuple[int, ...] | None = None
    layouts: tuple[Layout, ...] = (Layout(1, 40), Layout(5, 10))
    density: float = 0.001
    repeats: int = 20
    warmup: int = 3
    device: str | None = None
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(
                f"repeats={self.repeats} must be >= 1 and warmup={self.warmup} >= 0"
            )
        if not 0 < self.density <= 1:
            raise ValueError(f"density={self.density} must be in (0, 1]")
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device={self.device!r} must be 'cuda' or 'cpu'")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device; use device='cpu'")
        if self.sizes is None:
            self.sizes = CUDA_SIZES if self.device == "cuda" else CPU_SIZES
