"""The cost model itself: its parameters (:class:`CostModel`, the ``DEFAULT_*`` calibration)
and its prediction of a step (:class:`Prediction`).

The model is described in :mod:`gssgd.costmodel`:
``T = alpha * rounds + beta(rate) * (header_bytes + critical_bytes) + gamma[method] * d``;
its fit to measured runs is :mod:`gssgd.costmodel.fit`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gssgd.costmodel import store
from gssgd.costmodel.compute_law import COMPUTE_REF_D, ComputeLaw
from gssgd.costmodel.method_specs import MethodSpec, traffic
from gssgd.methods import get_method

__all__ = ["CostModel", "Prediction"]


@dataclass(frozen=True)
class Prediction:
    """A predicted step time and its three parts (seconds)."""

    latency: float
    bandwidth: float
    compute: float

    @property
    def total(self) -> float:
        return self.latency + self.bandwidth + self.compute


def _fitted(section: str) -> dict[str, Any]:
    """A section of the stored fit (``fit.json``: ``bench_model`` or ``cpu_compute``), or
    {} before any calibration (a fit on new runs then starts from neutral values)."""
    try:
        return dict(store.load("fit.json")[section])
    except (FileNotFoundError, KeyError):
        return {}


def _default_gamma() -> dict[str, float]:
    """Compute per element on a core of its own, by benchmark name: each method's fitted
    law (``fit.json``) at its reference size (``COMPUTE_REF_D`` = 1M elements)."""
    laws = _fitted("cpu_compute")
    return {name: ComputeLaw(law["gamma"], law["slope"]).per_element(COMPUTE_REF_D)
            for name, law in laws.items()}


@dataclass
class CostModel:
    """``T = alpha * rounds + beta(rate) * (header_bytes + critical_bytes) + gamma[method] * d``.

    The latency term holds each message's fixed costs: ``alpha`` per round and the wire
    time of gloo's preambles on the busiest link (:attr:`gssgd.comm.Traffic.header_bytes`,
    48 bytes each: :data:`gssgd.comm.HEADER_BYTES`); the bandwidth term the payload.

    Attributes:
        alpha: seconds per latency-bound message (round).
        beta0: seconds per byte through the software stack (the whole cost on loopback).
        eta: the fraction of a shaped link's nominal rate that payload achieves.
        gamma: seconds of compression compute per gradient element, by method name.
        source: where the values come from ("defaults", or the calibration directories).
        notes: what calibration could not determine and left at its default.
    """

    alpha: float = field(default_factory=lambda: _fitted("bench_model").get("alpha", 0.0))
    beta0: float = field(default_factory=lambda: _fitted("bench_model").get("beta0", 0.0))
    eta: float = field(default_factory=lambda: _fitted("bench_model").get("eta", 0.9))
    gamma: dict[str, float] = field(default_factory=_default_gamma)
    source: str = "defaults"
    notes: list[str] = field(default_factory=list)

    @classmethod
    def default(cls) -> CostModel:
        """The stored fit's round cost, software cost per byte, efficiency and compute per
        element (``fit.json``)."""
        return cls()

    def beta(self, rate_bps: int | None, compute_share: float = 1.0) -> float:
        """Seconds per byte: ``max(share * beta0, 8 / (eta * rate))``, the slower of the
        software stack (stretched by shared cores) and the wire; ``share * beta0`` alone
        for an unlimited link (``rate_bps=None``)."""
        software = compute_share * self.beta0
        return software if rate_bps is None else max(software, 8.0 / (self.eta * rate_bps))

    def gamma_of(self, spec: MethodSpec) -> float:
        """``gamma`` of the method: its own figure, else its aggregator's, else that of the
        registry's ``cost_like`` method; a method with none of these is taken to cost as
        much as the costliest method in the table (a conservative guess until calibrated).
        """
        like = get_method(spec.aggregator).cost_like
        for key in (spec.name, spec.aggregator, like):
            if key is not None and key in self.gamma:
                return self.gamma[key]
        return max(self.gamma.values(), default=0.0)

    def predict(
        self,
        spec: MethodSpec,
        world_size: int,
        rate_bps: int | None,
        compute_share: float = 1.0,
    ) -> Prediction:
        """The predicted seconds of one step of ``spec`` on ``world_size`` ranks.

        Args:
            spec: the method and sizes.
            world_size: P >= 1.
            rate_bps: every link's rate in bit/s, or None for an unlimited link.
            compute_share: workers per core (1: a core per worker, as in a cluster; about 2
                for 4 single-threaded workers on 2 cores): compute and the software cost
                per byte take that many times longer.
        """
        t = traffic(spec, world_size)
        beta = self.beta(rate_bps, compute_share)
        return Prediction(
            latency=self.alpha * t.rounds + beta * t.header_bytes,
            bandwidth=beta * t.critical_bytes,
            compute=compute_share * self.gamma_of(spec) * spec.d,
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
