"""What one ``gssgd bench comm`` run measures: :class:`CommBenchConfig`.

The configuration checks every value when it is made (so a bad flag fails before any
worker starts), resolves each method to its :class:`~gssgd.costmodel.MethodSpec`, and
can print the command line that reproduces the run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gssgd.aggregators import build_options
from gssgd.aggregators.sketching import DEFAULT_ROWS
from gssgd.costmodel import DEFAULT_METHODS, VARIANTS, MethodSpec, method_spec
from gssgd.costmodel.architectures import layer_shapes
from gssgd.validate import check_int
from gssgd_lab.cluster import parse_link_rate

__all__ = ["CommBenchConfig"]


@dataclass(frozen=True)
class CommBenchConfig:
    """One ``gssgd bench comm`` run.

    Attributes:
        workers: P, the number of worker processes (>= 1).
        d: gradient length.
        density: fraction of coordinates the sparse methods send (k = round(density*d)).
        link: every worker's link rate ("100mbit", "1gbit", ...) or "none" for loopback.
        methods: benchmark method names (keys of :data:`gssgd.costmodel.VARIANTS`).
        repeats: timed steps per method; warmup: untimed steps before them.
        rows, cols, candidates: sketch shape and m (None: the aggregators' defaults).
        arch: the layer shapes the vector stands for (``"resnet"``, ``"transformer"``:
            :func:`gssgd.costmodel.architectures.layer_shapes` at ``d``), which PowerSGD
            compresses matrix by matrix as it would the model's; None: one near-square
            matrix. The other methods do not depend on it.
        threads: torch intra-op threads per worker.
        seed: seed of the synthetic gradients and of the sketch hashes.
        timeout_s: the whole run's limit; None derives one from the cost model's defaults.
        specs: (derived) each method's :class:`~gssgd.costmodel.MethodSpec`, in run order.

    Raises:
        ValueError: a value out of range; the message names it and the fix.
    """

    workers: int = 4
    d: int = 1_000_000
    density: float = 0.001
    link: str = "none"
    methods: tuple[str, ...] = DEFAULT_METHODS
    repeats: int = 20
    warmup: int = 2
    rows: int = DEFAULT_ROWS
    cols: int | None = None
    candidates: int | None = None
    arch: str | None = None
    threads: int = 1
    seed: int = 0
    timeout_s: float | None = None
    specs: tuple[MethodSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int("workers", self.workers, 1, 254, "For example --workers 4.")
        check_int("d", self.d, 1, fix="For example --d 1000000.")
        check_int("repeats", self.repeats, 1, 100_000, "For example --repeats 10.")
        check_int("warmup", self.warmup, 0, 100_000, "For example --warmup 2.")
        check_int("threads", self.threads, 1, 1024, "For example --threads 1.")
        check_int("seed", self.seed, 0, fix="For example --seed 0.")
        parse_link_rate(self.link)  # raises with the valid forms
        if not self.methods:
            raise ValueError(f"methods is empty; choose among {', '.join(VARIANTS)}")
        dupes = sorted({m for m in self.methods if self.methods.count(m) > 1})
        if dupes:
            raise ValueError(f"methods {dupes} are listed twice; list each method once")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s!r} must be > 0 seconds (or None)")
        object.__setattr__(self, "specs", self._resolve_specs())

    def _resolve_specs(self) -> tuple[MethodSpec, ...]:
        """Each method's spec; checks the names, density and sketch shape, and the
        aggregator options exactly as the workers will build them."""
        shapes = None if self.arch is None else layer_shapes(self.arch, self.d)
        specs = tuple(
            method_spec(
                name,
                self.d,
                self.density,
                rows=self.rows,
                cols=self.cols,
                candidates=self.candidates,
                seed=self.seed,
                shapes=shapes,
            )
            for name in self.methods
        )
        for spec in specs:
            build_options(spec.aggregator, spec.d, None, **spec.aggregator_options())
        return specs

    @property
    def link_bps(self) -> int | None:
        """The link rate in bits per second, or None for loopback."""
        return parse_link_rate(self.link)

    @property
    def k(self) -> int:
        """Coordinates a sparse method sends per rank: ``round(density * d)``, at least 1."""
        return max(1, round(self.density * self.d))

    def command_line(self) -> str:
        """The ``gssgd bench comm`` command that reproduces this run."""
        parts = [
            f"gssgd bench comm --workers {self.workers} --d {self.d} --density {self.density:g}",
            f"--link {self.link} --methods {','.join(self.methods)}",
            f"--repeats {self.repeats} --warmup {self.warmup} --rows {self.rows}",
            *([f"--cols {self.cols}"] if self.cols is not None else []),
            *([f"--candidates {self.candidates}"] if self.candidates is not None else []),
            *([f"--arch {self.arch}"] if self.arch is not None else []),
            f"--threads {self.threads} --seed {self.seed}",
        ]
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON-ready mapping (without the derived ``specs``)."""
        out = asdict(self)
        out.pop("specs", None)
        out["methods"] = list(self.methods)
        return out


