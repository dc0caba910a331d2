"""How much of a streamed iteration's communication backward hid, and where it is logged.

Streaming gs (:mod:`gssgd.ddp.streaming_gs`) all-reduces each bucket's sketch region while backward
still runs; :class:`OverlapStats` records, per iteration, when each bucket arrived, when each
region's all-reduce started, and how long the last bucket waited for them (the part not
hidden). With :data:`OVERLAP_LOG_ENV` set, :func:`log_overlap` appends each iteration's
record to a JSON-lines file per rank.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

__all__ = ["OVERLAP_LOG_ENV", "OverlapStats", "log_overlap"]

#: When this environment variable holds a path prefix, every streamed iteration appends its
#: :class:`OverlapStats` as a JSON line to ``PREFIX.rankR.jsonl``.
OVERLAP_LOG_ENV = "GSSGD_OVERLAP_LOG"


@dataclass
class OverlapStats:
    """How much of one iteration's region communication backward hid.

    Attributes:
        regions: region all-reduces in the iteration.
        seconds_span: from the first region's start to the last region's completion.
        seconds_exposed: how long the last bucket waited for the regions (not hidden).
        bucket_ready: per bucket, in index order, when DDP handed it to the hook (it is
            ready, and so is every bucket before it), in seconds after the first bucket.
        region_started: per bucket, when its region's all-reduce started, in seconds after
            the first bucket. Streaming overlaps when a region starts before the last
            bucket is ready: ``region_started[0] < bucket_ready[-1]``.
    """

    regions: int = 0
    seconds_span: float = 0.0
    seconds_exposed: float = 0.0
    bucket_ready: list[float] = field(default_factory=list)
    region_started: list[float] = field(default_factory=list)

    @property
    def hidden_fraction(self) -> float:
        """``1 - exposed / span`` (1.0 when nothing was sent)."""
        if self.seconds_span <= 0:
            return 1.0
        return max(0.0, 1.0 - self.seconds_exposed / self.seconds_span)


def log_overlap(stats: OverlapStats, step: int, rank: int) -> None:
    """Append ``{"step": step, **stats}`` as a JSON line to ``PREFIX.rank{rank}.jsonl``, where
    ``PREFIX`` is the value of :data:`OVERLAP_LOG_ENV`; nothing when it is unset or empty."""
    prefix = os.environ.get(OVERLAP_LOG_ENV)
    if prefix:
        with open(f"{prefix}.rank{rank}.jsonl", "a") as f:
            line = {"step": step, **asdict(stats)}
            f.write(json.dumps(line) + "\n")
