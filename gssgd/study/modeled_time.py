"""Modeled time to the target on a cluster, from a study's measured steps and bytes.

A study on this machine measures how many steps and how many bytes through the busiest
link a method needs to reach the target; what those cost in time depends on the cluster.
The time is ``advise``'s cost model (:mod:`gssgd.costmodel`) with the measured bytes in
place of the formula's::

    T = steps * (fwdbwd + compression + latency / H) + bytes * 8 / (eta(pattern) * rate)

on ``device`` (default the H200's constants; ``fwdbwd`` its per-parameter estimate), with
``latency`` the method's rounds at the link's per-message latency (``H``: local steps
between outer steps, 1 otherwise), ``eta`` the fitted efficiency of the method's
collective, nothing overlapped with backward (every method alike).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["LINKS", "ModeledStep", "modeled_step"]

#: The link rates a summary models (bit/s): 1 and 10 Gbit/s.
LINKS = {"1gbit": 10**9, "10gbit": 10**10}
LATENCY_S = 20e-6  # advise's default per-message latency
DEVICE = "h200"


@dataclass(frozen=True)
class ModeledStep:
    """A method's step on a cluster, less its bandwidth term: ``fixed`` seconds a step
    (forward and backward, compression, latency) and ``per_byte`` seconds per byte of the
    busiest link at each of :data:`LINKS`."""

    fixed: dict[str, float]
    per_byte: dict[str, float]

    def seconds(self, steps: float, sent: float) -> dict[str, float]:
        """Seconds for ``steps`` steps that moved ``sent`` bytes, at each link."""
        return {link: steps * self.fixed[link] + sent * self.per_byte[link] for link in LINKS}


def modeled_step(method: str, d: int, workers: int, settings: dict[str, Any]) -> ModeledStep:
    """The cost model's step of ``method`` (settings: the run's, for its density and local
    steps) on ``workers`` workers of :data:`DEVICE` at each link of :data:`LINKS`.

    A method the cost model does not price (not an aggregator) is priced as dense's
    collective, which only its latency term and compression compute depend on.
    """
    from gssgd.costmodel.advice import cluster_network
    from gssgd.costmodel.cluster import Link, predict_step
    from gssgd.costmodel.devices import get_device
    from gssgd.costmodel.method_specs import method_spec

    density = settings.get("density")
    try:
        spec = method_spec(method, d, density if isinstance(density, float) else None)
    except ValueError:
        spec = method_spec("dense", d)
    device = get_device(DEVICE)
    network = cluster_network(device)
    every = settings.get("local_steps") or 1
    fixed, per_byte = {}, {}
    for name, rate in LINKS.items():
        step = predict_step(spec, workers, Link(rate, LATENCY_S), device, network,
                            overlap="none")
        fixed[name] = step.fwdbwd + step.compression / every + step.latency / every
        per_byte[name] = 8.0 / (network.eta(step.pattern) * rate)
    return ModeledStep(fixed, per_byte)
