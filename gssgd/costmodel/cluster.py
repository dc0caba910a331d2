"""The cost model: one training step of a method, split into compute, communication and
the communication hidden behind the backward pass. The same model is fitted on this
machine's emulated links and checked there on held-out runs (:mod:`gssgd.costmodel.fit`),
and predicts a cluster for ``gssgd advise``.

One step of ``spec`` on ``P`` workers joined by links of rate ``R`` and latency ``a``, on
a device, through a :class:`~gssgd.costmodel.network.Network` ``net``, with ``s`` workers
sharing a core (1 on a cluster)::

    compute       = forward + backward (measured, or params * device.fwdbwd_s_per_param)
                  + s * compression(spec)               # the device's constants
    latency       = (a + net.round_s) * rounds + net.driven_round_s * (s - 1) * driven_rounds
    bytes         = critical_bytes + header_bytes - net.burst_credit * bucket * rounds
    bandwidth     = bytes * max(s * net.software_s_per_byte, 8 / (net.eta[pattern] * R))
    hidden        = device.overlap_efficiency
                  * min(overlappable communication, backward)   # backward = 2/3 of fwd+bwd
    step          = compute + latency + bandwidth - hidden

* ``rounds``, ``critical_bytes`` and ``header_bytes`` (gloo's 48-byte preambles, one per
  message: :data:`gssgd.comm.HEADER_BYTES`) are the method's own
  :class:`~gssgd.comm.Traffic` (its aggregator's ``traffic`` classmethod): nothing here
  restates a byte formula. ``driven_rounds``: those a Python loop drives
  (:func:`~gssgd.costmodel.network.rounds_of`).
* ``pattern``: the collective the bulk traffic uses, read from that same formula
  (:func:`~gssgd.costmodel.network.pattern_of`).
* ``net``: the pattern efficiencies fitted on this machine's emulated links
  (:func:`gssgd.costmodel.fit.fit_model`), the same on this machine's runs (with each
  run's probed latency as ``a``) and on a cluster (with ``--latency``); its other terms
  are 0 there.
* Overlap (:func:`overlap_of`), the documented assumption: a method that sends every
  coordinate uncompressed (dense) runs as DDP's bucketed all-reduce, which starts while
  backward still runs, so its communication hides up to the backward time; the compressed
  methods, PowerSGD included, run over the whole model (``HookState(..., model=m)``) and
  communicate after backward, hiding nothing; gs streamed by the DDP hook
  (``HookState(..., overlap="stream")``) hides its table all-reduce; a method a per-bucket
  hook overlaps (``HookState(..., whole_model=False, overlap="buckets")``: PowerSGD, whose
  per-bucket and whole-model algorithms are one, as advise recommends it) hides every
  bucket's communication but the last's (:func:`last_bucket_share`; its compression runs
  on the hook's thread but on the same device as backward, so it is not counted as
  hidden). How much of that
  backward really hides is the device's ``overlap_efficiency``: all of it on a GPU (an
  assumption, not measured), none on this CPU (measured).

Example:
    >>> spec = method_spec("gs", d=25_557_032, density=0.001)
    >>> t = predict_step(spec, 64, Link(10**10, 20e-6), get_device("h200"), fwdbwd_s=0.033)
    >>> t.total, t.communication, t.hidden
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from gssgd.comm import Traffic
from gssgd.costmodel.devices import Device
from gssgd.costmodel.link_rate import format_rate, parse_link_rate
from gssgd.costmodel.method_specs import MethodSpec, warmup_traffic
from gssgd.costmodel.network import Network, pattern_of, rounds_of, step_traffic
from gssgd.ddp.settings import STREAMING_METHODS
from gssgd.methods import get_method

__all__ = [
    "BACKWARD_FRACTION",
    "DDP_BUCKET_CAP_BYTES",
    "Link",
    "StepTime",
    "Warmup",
    "communication_seconds",
    "last_bucket_share",
    "overlap_of",
    "parse_latency",
    "parse_link",
    "predict_step",
    "predict_warmup",
]

#: Backward's share of forward + backward (backward computes two products per forward one).
BACKWARD_FRACTION = 2.0 / 3.0

#: DDP's default bucket size (``bucket_cap_mb=25``): its last bucket, ready when backward
#: ends, holds the model's first layers, up to this many bytes of float32 gradient.
DDP_BUCKET_CAP_BYTES = 25 * 2**20

#: Link rates the model takes: 1 Mbit/s .. 400 Gbit/s.
MIN_RATE_BPS, MAX_RATE_BPS = 10**6, 400 * 10**9
_LATENCY_RE = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>ns|us|µs|ms|s)$")
_LATENCY_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_MIN_LATENCY_S, _MAX_LATENCY_S = 1e-7, 1.0


# --------------------------------------------------------------------------- links


@dataclass(frozen=True)
class Link:
    """Every worker's link: its rate (bit/s; None: unlimited, loopback), its per-message
    latency (seconds), and the token bucket a ``tc tbf`` emulation lets leave at memory
    speed after an idle moment (bytes; 0 on a real link)."""

    rate_bps: int | None
    latency_s: float = 0.0
    burst_bytes: int = 0

    def __str__(self) -> str:
        rate = "unlimited" if self.rate_bps is None else format_rate(self.rate_bps)
        return f"{rate}, {_format_seconds(self.latency_s)} latency"


def parse_link(text: str) -> int:
    """A cluster link rate such as ``"10gbit"`` or ``"400gbit"``, in bit/s.

    Raises:
        ValueError: not a rate (the message shows the form), ``none``, or outside
            1mbit..400gbit.
    """
    rate = parse_link_rate(text)
    if rate is None:
        raise ValueError(
            f"link {text!r}: the cluster model needs a rate; give one in 1mbit..400gbit, "
            "e.g. --link 10gbit"
        )
    if not MIN_RATE_BPS <= rate <= MAX_RATE_BPS:
        raise ValueError(
            f"link {text!r} = {rate} bit/s is outside 1mbit..400gbit; give a rate in that "
            "range, e.g. --link 10gbit"
        )
    return rate


def parse_latency(text: str) -> float:
    """A per-message latency such as ``"20us"``, ``"1.5ms"`` or ``"500ns"``, in seconds.

    Raises:
        ValueError: not a number with a unit (ns, us, ms, s), or outside 100ns..1s.
    """
    cleaned = text.strip().lower() if isinstance(text, str) else ""
    match = _LATENCY_RE.match(cleaned)
    if match is None:
        raise ValueError(
            f"latency {text!r} is not understood: give a number and a unit (ns, us, ms, s), "
            "e.g. --latency 20us"
        )
    seconds = float(match["num"]) * _LATENCY_UNITS[match["unit"]]
    if not _MIN_LATENCY_S <= seconds <= _MAX_LATENCY_S:
        raise ValueError(
            f"latency {text!r} is outside 100ns..1s; give a latency in that range, e.g. "
            "--latency 20us (a data-centre network) or --latency 1ms (across sites)"
        )
    return seconds


def _format_seconds(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:g} ms"
    if s >= 1e-6:
        return f"{s * 1e6:g} us"
    return f"{s * 1e9:g} ns"


# --------------------------------------------------------------------------- overlap


def overlap_of(spec: MethodSpec, *, stream: bool = False) -> str:
    """How much of ``spec``'s communication can hide behind backward (see the module doc).

    Args:
        spec: the method.
        stream: whether gs is streamed by the DDP hook (``overlap="stream"``).

    Returns:
        ``"backward"`` (all of it: DDP's bucketed all-reduce of a method that sends every
        coordinate), ``"table"`` (gs's table all-reduce, streaming) or ``"none"``.
    """
    cls = get_method(spec.aggregator).aggregator
    assert cls is not None
    if cls.sends_all and not cls.compresses:
        return "backward"
    if stream and spec.aggregator in STREAMING_METHODS:
        return "table"
    return "none"


def last_bucket_share(d: int) -> float:
    """The share of a ``d``-parameter model's gradient in DDP's last bucket at its default
    size (:data:`DDP_BUCKET_CAP_BYTES`): communication a per-bucket hook can start only once
    backward is done (all of it for a model of one bucket)."""
    return min(1.0, DDP_BUCKET_CAP_BYTES / (4 * d))


# --------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class StepTime:
    """A predicted training step (seconds).

    Attributes:
        fwdbwd: forward + backward; compression: the method's compute.
        latency, bandwidth: communication's two parts (``communication`` is their sum).
        hidden: communication that runs during backward (subtracted once).
        pattern, overlap: the collective and the overlap assumed.
    """

    fwdbwd: float
    compression: float
    latency: float
    bandwidth: float
    hidden: float
    pattern: str
    overlap: str

    @property
    def compute(self) -> float:
        return self.fwdbwd + self.compression

    @property
    def communication(self) -> float:
        return self.latency + self.bandwidth

    @property
    def total(self) -> float:
        return self.compute + self.communication - self.hidden

    def as_dict(self) -> dict[str, float | str]:
        out: dict[str, float | str] = dataclasses.asdict(self)
        out.update(compute=self.compute, communication=self.communication, total=self.total)
        return out


def communication_seconds(
    spec: MethodSpec,
    world_size: int,
    link: Link,
    network: Network,
    *,
    compute_share: float = 1.0,
    t: Traffic | None = None,
) -> tuple[float, float]:
    """``(latency, bandwidth)`` seconds of one step's communication (see the module doc).

    Args:
        spec: the method; world_size: P.
        link: every worker's link (rate None: unlimited, the software alone).
        network: the network's constants.
        compute_share: workers per core (1 on a cluster).
        t: the traffic to charge (default: ``spec``'s steady step).
    """
    t = step_traffic(spec, world_size) if t is None else t
    rounds = rounds_of(spec, world_size)
    scale = t.rounds / rounds.total if rounds.total else 1.0  # a warm-up's summed steps
    waiting = max(0.0, compute_share - 1.0)  # others on the partner's core
    latency = ((link.latency_s + network.round_s) * t.rounds
               + network.driven_round_s * waiting * rounds.driven * scale)
    volume = t.critical_bytes + (t.header_bytes if network.headers else 0)
    software = compute_share * network.software_s_per_byte * volume
    if link.rate_bps is None:
        return latency, software
    credit = network.burst_credit * link.burst_bytes * t.rounds
    wire = max(0.0, volume - credit) * 8.0 / (network.eta(pattern_of(spec)) * link.rate_bps)
    return latency, max(software, wire)


@dataclass(frozen=True)
class Warmup:
    """What a density warm-up (``spec.warmup_steps`` steps) adds to a run.

    Attributes:
        steps: the warm-up's steps (0: none).
        bytes_sent: bytes the busiest sender sends over those steps.
        step_bytes_sent: what it sends in one steady step (after the warm-up).
        extra_seconds: communication seconds over those of as many steady steps (none of it
            taken as hidden behind backward; compression compute is taken as unchanged).
    """

    steps: int
    bytes_sent: int
    step_bytes_sent: int
    extra_seconds: float

    @property
    def extra_bytes_sent(self) -> int:
        """Bytes over those of as many steady steps."""
        return self.bytes_sent - self.steps * self.step_bytes_sent

    def run_bytes_sent(self, steps: int) -> int:
        """The busiest sender's bytes over a run of ``steps`` steps, warm-up included (a run
        shorter than the warm-up sends the warm-up's first steps only: not modelled, it is
        counted whole)."""
        return steps * self.step_bytes_sent + (self.extra_bytes_sent if steps else 0)

    def as_dict(self) -> dict[str, float | int]:
        return {**dataclasses.asdict(self), "extra_bytes_sent": self.extra_bytes_sent}


def predict_warmup(
    spec: MethodSpec,
    world_size: int,
    link: Link,
    network: Network,
    *,
    compute_share: float = 1.0,
) -> Warmup:
    """The bytes and extra seconds of ``spec``'s density warm-up on ``world_size`` workers:
    each warm-up step's own traffic (:func:`~gssgd.costmodel.method_specs.warmup_traffic`)
    against the steady step's."""
    n = spec.warmup_steps
    warm, steady = warmup_traffic(spec, world_size), step_traffic(spec, world_size)
    kw = {"compute_share": compute_share}
    per_step = sum(communication_seconds(spec, world_size, link, network, **kw))
    extra = sum(communication_seconds(spec, world_size, link, network, t=warm, **kw))
    extra = extra - n * per_step if n else 0.0
    return Warmup(n, max(warm.sent), max(steady.sent), extra)


def predict_step(
    spec: MethodSpec,
    world_size: int,
    link: Link,
    device: Device,
    network: Network,
    *,
    fwdbwd_s: float | None = None,
    params: int | None = None,
    overlap: str | None = None,
    compute_share: float = 1.0,
) -> StepTime:
    """One training step of ``spec`` on ``world_size`` workers (see the module doc).

    Args:
        spec: the method, with ``d`` the model's parameter count.
        world_size: P >= 1.
        link: every worker's link.
        device: the workers' device (compute constants).
        network: the network's constants (:func:`gssgd.costmodel.advice.fitted_network`).
        fwdbwd_s: forward + backward seconds of one worker's batch; None: estimated as
            ``params * device.fwdbwd_s_per_param``; 0 for an aggregation step alone.
        params: the model's parameters for that estimate (default ``spec.d``).
        overlap: ``"backward"``, ``"table"``, ``"buckets"`` or ``"none"``; None:
            :func:`overlap_of`.
        compute_share: workers per core (1 on a cluster).

    Raises:
        ValueError: a negative compute time or an unknown overlap.
    """
    if fwdbwd_s is None:
        fwdbwd_s = (spec.d if params is None else params) * device.fwdbwd_s_per_param
    if not (math.isfinite(fwdbwd_s) and fwdbwd_s >= 0):
        raise ValueError(f"fwdbwd_s={fwdbwd_s!r} must be a finite number of seconds >= 0")
    kw = {"compute_share": compute_share}
    latency, bandwidth = communication_seconds(spec, world_size, link, network, **kw)
    mode = overlap_of(spec) if overlap is None else overlap
    if mode == "backward":
        overlappable = latency + bandwidth
    elif mode == "table":
        table_only = dataclasses.replace(spec, exact=False)  # the table all-reduce alone
        overlappable = sum(communication_seconds(table_only, world_size, link, network, **kw))
    elif mode == "buckets":
        overlappable = (latency + bandwidth) * (1.0 - last_bucket_share(spec.d))
    elif mode == "none":
        overlappable = 0.0
    else:
        raise ValueError(f"overlap={mode!r} must be 'backward', 'table', 'buckets' or 'none'")
    return StepTime(
        fwdbwd=fwdbwd_s,
        compression=device.compression_seconds(spec, compute_share),
        latency=latency,
        bandwidth=bandwidth,
        hidden=device.overlap_efficiency * min(overlappable, BACKWARD_FRACTION * fwdbwd_s),
        pattern=pattern_of(spec),
        overlap=mode,
    )
