"""The cost model for GPU (and CPU) clusters: one training step, split into compute,
communication and the part of communication hidden behind the backward pass.

One step of ``spec`` on ``P`` workers joined by links of rate ``R`` and latency ``a``::

    compute       = forward + backward (measured, or params * device.fwdbwd_s_per_param)
                  + compression(spec)                 # the device's constants
    communication = a * rounds                        # latency-bound steps, critical path
                  + header_bytes * max(s, 8 / (eff[pattern] * R))   # gloo's preambles
                  + critical_bytes * max(s, 8 / (eff[pattern] * R))
    hidden        = device.overlap_efficiency
                  * min(overlappable communication, backward)   # backward = 2/3 of fwd+bwd
    step          = compute + communication - hidden

* ``rounds``, ``header_bytes`` and ``critical_bytes`` are the method's own
  :class:`~gssgd.comm.Traffic` (its aggregator's ``traffic`` classmethod through
  :func:`gssgd.costmodel.method_specs.traffic`): nothing here restates a byte formula.
  ``header_bytes`` are the 48-byte preambles gloo puts on the busiest link for each
  message (:data:`gssgd.comm.HEADER_BYTES`, measured): a fixed cost per message, so it is
  counted in the latency part.
* ``pattern``: the collective the method's bulk traffic uses, *read from that same formula*
  by :func:`pattern_of` (how its rounds grow from P = 8 to 16, and whether a rank receives
  more than it sends): ``ring`` (dense; gs with ``allreduce="backend"``),
  ``recursive_doubling`` (gs, gTop-k), ``allgather`` (local Top-k) or ``star``
  (Sketched-SGD). ``eff[pattern]``: the fraction of the nominal rate the pattern's payload
  reaches. Measured on the emulated links of this machine (tbf-shaped veths, gloo): ring
  0.90, star 1.0, all-gather 0.9 and recursive doubling about 0.45: a pairwise exchange
  there moves at half the rate of a ring step (see docs/benchmarks.md; the cause is not
  established). On a cluster (:data:`CLUSTER_EFFICIENCY`) every pattern is given the ring's
  0.9: a full-duplex fabric has no reason to halve an exchange; this is an assumption, not a
  measurement.
* ``s``: the software's seconds per byte (the CPU's ``beta0``; 0 on a GPU).
* Overlap (:func:`overlap_of`), the documented assumption: a method that sends every
  coordinate runs as DDP's bucketed all-reduce, which starts while backward still runs, so
  its communication hides up to the backward time; the compressed methods select over the
  whole model and communicate after backward, hiding nothing; gs streamed by the DDP hook
  (``HookState(..., overlap="stream")``: each bucket's region of the table is all-reduced
  by the backend as soon as the bucket is sketched) hides its table all-reduce (the exact
  round waits for the candidates, so it does not hide). How much of that backward really
  hides is the device's ``overlap_efficiency``: all of it on a GPU (NCCL runs on its own
  engines beside the compute; an assumption, not measured), none on this CPU, where gloo's
  threads take the cores backward needs (measured end to end, see
  :data:`gssgd.costmodel.devices.CPU_OVERLAP_EFFICIENCY`).

Example:
    >>> spec = method_spec("gs", d=25_557_032, density=0.001)
    >>> t = predict_step(spec, 64, Link(10**10, 20e-6), DEVICES["h200"], fwdbwd_s=0.033)
    >>> t.total, t.communication, t.hidden
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gssgd.comm import Traffic
from gssgd.costmodel.devices import Device
from gssgd.costmodel.link_rate import parse_link_rate
from gssgd.costmodel.method_specs import MethodSpec, traffic, warmup_traffic
from gssgd.methods import get_method

__all__ = [
    "BACKWARD_FRACTION",
    "CLUSTER_EFFICIENCY",
    "PATTERNS",
    "Link",
    "StepTime",
    "Warmup",
    "overlap_of",
    "parse_latency",
    "parse_link",
    "pattern_of",
    "predict_step",
    "predict_warmup",
    "stream_overlap_available",
]

#: The collectives :func:`pattern_of` tells apart ("mixed": none of them alone).
PATTERNS: tuple[str, ...] = ("ring", "recursive_doubling", "allgather", "star", "mixed")
#: Fraction of a cluster link's nominal rate each pattern's payload reaches (assumed: the
#: ring's efficiency on this machine's emulated links, for every pattern).
CLUSTER_EFFICIENCY: dict[str, float] = dict.fromkeys(PATTERNS, 0.9)
#: Backward's share of forward + backward (backward computes two products per forward one).
BACKWARD_FRACTION = 2.0 / 3.0

#: Link rates the model takes: 1 Mbit/s .. 400 Gbit/s.
MIN_RATE_BPS, MAX_RATE_BPS = 10**6, 400 * 10**9
_LATENCY_RE = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>ns|us|µs|ms|s)$")
_LATENCY_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_MIN_LATENCY_S, _MAX_LATENCY_S = 1e-7, 1.0


# --------------------------------------------------------------------------- links


@dataclass(frozen=True)
class Link:
    """Every worker's link: its rate (bit/s) and its per-message latency (seconds)."""

    rate_bps: int
    latency_s: float

    def __str__(self) -> str:
        return f"{_format_rate(self.rate_bps)}, {_format_seconds(self.latency_s)} latency"


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


def _format_rate(bps: int) -> str:
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps}bit"


def _format_seconds(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:g} ms"
    if s >= 1e-6:
        return f"{s * 1e6:g} us"
    return f"{s * 1e9:g} ns"


# --------------------------------------------------------------------------- patterns


def pattern_of(spec: MethodSpec) -> str:
    """The collective of ``spec``'s bulk traffic, read from its own traffic formula.

    Steps: take the method's :class:`~gssgd.comm.Traffic` at P = 8 and P = 16 and remove its
    control all-gather (the aggregator's ``control_traffic``); then the rounds left tell the
    pattern by how they grow: unchanged (a star: one round a phase), by 4/3 (recursive
    doubling: log2 P), by 30/14 (a ring all-reduce, 2(P-1), or an all-gather, P-1). The last
    two differ in their bytes: a ring all-reduce sends about ``2n`` whatever P, an all-gather
    ``(P-1) * n``, which more than doubles from P = 8 to 16 (15/7).

    Returns:
        One of :data:`PATTERNS`.
    """
    cls = get_method(spec.aggregator).aggregator
    assert cls is not None
    bulk = {}
    for p in (8, 16):
        t, c = traffic(spec, p), cls.control_traffic(p)
        bulk[p] = (t.rounds - c.rounds, max(t.sent) - max(c.sent))
    (r8, sent8), (r16, sent16) = bulk[8], bulk[16]
    if r8 <= 0:
        return "mixed"
    if r16 == r8:
        return "star"
    if 3 * r16 == 4 * r8:
        return "recursive_doubling"
    if 14 * r16 == 30 * r8:
        return "allgather" if sent16 > 2 * sent8 else "ring"
    return "mixed"


# --------------------------------------------------------------------------- overlap


def stream_overlap_available() -> bool:
    """Whether the DDP hook can stream gs (``HookState(..., overlap="stream")``)."""
    import inspect

    from gssgd.ddp import HookState

    return "overlap" in inspect.signature(HookState.__init__).parameters


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
    if cls.sends_all:
        return "backward"
    if stream and spec.aggregator == "gs":
        return "table"
    return "none"


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
    *,
    efficiency: Mapping[str, float] = CLUSTER_EFFICIENCY,
    software_s_per_byte: float = 0.0,
) -> tuple[float, float]:
    """``(latency, bandwidth)`` seconds of one step's communication (see the module doc)."""
    kw = {"efficiency": efficiency, "software_s_per_byte": software_s_per_byte}
    return _seconds_of(traffic(spec, world_size), spec, link, **kw)


def _seconds_of(
    t: Traffic,
    spec: MethodSpec,
    link: Link,
    *,
    efficiency: Mapping[str, float],
    software_s_per_byte: float,
) -> tuple[float, float]:
    """``(latency, bandwidth)`` seconds of the traffic ``t`` of ``spec``'s pattern: the
    latency holds the rounds and the messages' preambles, the bandwidth the payload."""
    eff = efficiency.get(pattern_of(spec), efficiency.get("mixed", 0.9))
    per_byte = max(software_s_per_byte, 8.0 / (eff * link.rate_bps))
    return link.latency_s * t.rounds + per_byte * t.header_bytes, per_byte * t.critical_bytes


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
    device: Device,
    *,
    efficiency: Mapping[str, float] = CLUSTER_EFFICIENCY,
) -> Warmup:
    """The bytes and extra seconds of ``spec``'s density warm-up on ``world_size`` workers:
    each warm-up step's own traffic (:func:`~gssgd.costmodel.method_specs.warmup_traffic`)
    against the steady step's."""
    n = spec.warmup_steps
    warm, steady = warmup_traffic(spec, world_size), traffic(spec, world_size)
    kw = {"efficiency": efficiency, "software_s_per_byte": device.software_s_per_byte}
    per_step = sum(_seconds_of(steady, spec, link, **kw))
    extra = sum(_seconds_of(warm, spec, link, **kw)) - n * per_step
    return Warmup(n, max(warm.sent), max(steady.sent), extra)


def predict_step(
    spec: MethodSpec,
    world_size: int,
    link: Link,
    device: Device,
    *,
    fwdbwd_s: float | None = None,
    params: int | None = None,
    overlap: str | None = None,
    efficiency: Mapping[str, float] = CLUSTER_EFFICIENCY,
) -> StepTime:
    """One training step of ``spec`` on ``world_size`` workers (see the module doc).

    Args:
        spec: the method, with ``d`` the model's parameter count.
        world_size: P >= 1.
        link: every worker's link.
        device: the workers' device (compute constants).
        fwdbwd_s: forward + backward seconds of one worker's batch; None: estimated as
            ``params * device.fwdbwd_s_per_param``.
        params: the model's parameters for that estimate (default ``spec.d``).
        overlap: ``"backward"``, ``"table"`` or ``"none"``; None: :func:`overlap_of`.
        efficiency: each pattern's fraction of the nominal rate.

    Raises:
        ValueError: ``world_size`` < 1 or a negative compute time.
    """
    if fwdbwd_s is None:
        fwdbwd_s = (spec.d if params is None else params) * device.fwdbwd_s_per_param
    if not (math.isfinite(fwdbwd_s) and fwdbwd_s >= 0):
        raise ValueError(f"fwdbwd_s={fwdbwd_s!r} must be a finite number of seconds >= 0")
    kw = {"efficiency": efficiency, "software_s_per_byte": device.software_s_per_byte}
    latency, bandwidth = communication_seconds(spec, world_size, link, **kw)
    mode = overlap_of(spec) if overlap is None else overlap
    if mode == "backward":
        overlappable = latency + bandwidth
    elif mode == "table":
        table_only = dataclasses.replace(spec, exact=False)  # the table all-reduce alone
        overlappable = sum(communication_seconds(table_only, world_size, link, **kw))
    elif mode == "none":
        overlappable = 0.0
    else:
        raise ValueError(f"overlap={mode!r} must be 'backward', 'table' or 'none'")
    return StepTime(
        fwdbwd=fwdbwd_s,
        compression=device.compression_seconds(spec),
        latency=latency,
        bandwidth=bandwidth,
        hidden=device.overlap_efficiency * min(overlappable, BACKWARD_FRACTION * fwdbwd_s),
        pattern=pattern_of(spec),
        overlap=mode,
    )
