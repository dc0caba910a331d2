"""Link rates: parsing a text such as ``"100mbit"`` and the tbf shape of one link.

:func:`parse_link_rate` turns the ``--link`` argument into bits per second and
:func:`format_rate` writes one back; :class:`LinkShape` turns a rate into the token bucket
filter settings of one cable (the lab's emulated cluster, beside the package in the repository,
puts them on every veth). The cost model reads rates and bucket sizes from here too.
"""

from __future__ import annotations

import re

__all__ = ["LinkShape", "format_rate", "parse_link_rate"]

_LINK_FORMS = "a number and a unit, e.g. 500kbit, 100mbit, 1gbit, 2.5gbit, 10gbit, or 'none'"
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE_RE = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[kmgt]?bit)$")
_MIN_RATE_BPS = 10_000  # below this one 1500-byte frame takes over a second
_MAX_RATE_BPS = 10**12


# --------------------------------------------------------------------------- rates


def parse_link_rate(text: str | None) -> int | None:
    """Parse a link rate such as ``"100mbit"`` into bits per second.

    Units are tc's decimal ones: ``kbit`` = 1e3, ``mbit`` = 1e6, ``gbit`` = 1e9 bits
    per second (``bit`` and ``tbit`` too). ``"none"`` (or ``None``) means an unlimited
    link and returns ``None``. Case and surrounding blanks do not matter.

    Args:
        text: the rate, e.g. ``"500kbit"``, ``"1gbit"``, ``"2.5gbit"`` or ``"none"``.

    Returns:
        The rate in bits per second, or ``None`` for an unlimited link.

    Raises:
        ValueError: the text is not of that form (``"100mbps"``, ``"fast"``, ``"100"``),
            or the rate lies outside 10kbit..1000gbit.

    Example:
        >>> parse_link_rate("100mbit"), parse_link_rate("none")
        (100000000, None)
    """
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"link rate {text!r} must be a string: {_LINK_FORMS}")
    cleaned = text.strip().lower()
    if cleaned == "none":
        return None
    match = _RATE_RE.match(cleaned)
    if match is None:
        hint = ""
        if cleaned.endswith(("bps", "b/s")):
            hint = " (tc's 'bps' means bytes per second; write bits, e.g. 100mbit)"
        raise ValueError(f"link rate {text!r} is not understood: use {_LINK_FORMS}{hint}")
    bps = round(float(match["num"]) * _UNITS[match["unit"]])
    if not _MIN_RATE_BPS <= bps <= _MAX_RATE_BPS:
        raise ValueError(
            f"link rate {text!r} = {bps} bit/s is outside 10kbit..1000gbit; "
            f"use a rate in that range, or 'none' for an unlimited link"
        )
    return bps


def format_rate(bps: int) -> str:
    """``100mbit``, ``1gbit``, ``2500mbit``: a rate in bit/s as tc and ``--link`` write it,
    in the largest unit that holds it exactly (:func:`parse_link_rate` reads it back)."""
    for unit in ("gbit", "mbit", "kbit"):
        if bps % _UNITS[unit] == 0:
            return f"{bps // _UNITS[unit]}{unit}"
    return f"{bps}bit"


class LinkShape:
    """The tbf settings of one direction of one link.

    ``burst`` is the bucket size: the bytes that may leave back to back after an idle
    period. It must hold at least one full frame, and enough for the kernel to keep
    the link busy between two timer wake-ups; the classic rule is 4 ms of traffic
    (rate / HZ with HZ = 250). Larger bursts make short messages faster than the rate
    allows, so the default is max(4 ms of traffic, 32 KiB, two frames).
    ``latency`` bounds how long a packet may queue before tbf drops it; it sets the
    queue limit to ``burst + rate * latency``. 50 ms is a deep switch buffer: TCP
    stays at the full rate after a loss (with an empty pipe, cwnd is all queue, and
    a 30% cut still leaves the queue busy) and incast of a few senders seldom drops.

    Args:
        rate_bps: the rate in bits per second (see :func:`parse_link_rate`).
        mtu: the link's MTU in bytes, to size the minimum burst.
        burst_bytes: the bucket size; ``None`` picks the default above.
        latency_ms: the longest queueing delay before drops, in milliseconds.
    """

    def __init__(
        self,
        rate_bps: int,
        *,
        mtu: int = 1500,
        burst_bytes: int | None = None,
        latency_ms: float = 50.0,
    ) -> None:
        if not isinstance(rate_bps, int) or not _MIN_RATE_BPS <= rate_bps <= _MAX_RATE_BPS:
            raise ValueError(
                f"rate_bps={rate_bps!r} must be an int in {_MIN_RATE_BPS}..{_MAX_RATE_BPS} "
                f"bit/s; parse a text such as '100mbit' with parse_link_rate()"
            )
        frame = mtu + 14  # Ethernet header; tbf charges whole frames
        if burst_bytes is None:
            burst_bytes = max(rate_bps // 8 // 250, 32 * 1024, 2 * frame)
        if not isinstance(burst_bytes, int) or burst_bytes < frame:
            raise ValueError(
                f"burst_bytes={burst_bytes!r} must be an int of at least one frame "
                f"({frame} bytes at mtu={mtu}); leave it None for the default"
            )
        if not 1.0 <= float(latency_ms) <= 10_000.0:
            raise ValueError(
                f"latency_ms={latency_ms!r} must lie in 1..10000 ms; 50 ms is a deep switch buffer"
            )
        self.rate_bps = rate_bps
        self.burst_bytes = burst_bytes
        self.latency_ms = float(latency_ms)

    @property
    def limit_bytes(self) -> int:
        """The queue limit in bytes that ``latency_ms`` implies: burst + rate * latency."""
        return self.burst_bytes + int(self.rate_bps / 8 * self.latency_ms / 1000)

    def tc_args(self) -> list[str]:
        """The arguments after ``tc qdisc replace dev DEV root``."""
        return [
            "tbf",
            "rate", f"{self.rate_bps}bit",
            "burst", str(self.burst_bytes),
            "limit", str(self.limit_bytes),
        ]  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"LinkShape(rate={format_rate(self.rate_bps)}, burst={self.burst_bytes} B, "
            f"limit={self.limit_bytes} B ~ {self.latency_ms:g} ms)"
        )
