"""What rank 0 shows while a run trains: the progress bar (tqdm's, when installed) and the
lines printed above it."""

from __future__ import annotations

import sys
from typing import Any

try:  # the progress bar comes with the gssgd[cli] extra; the loop runs without it
    from tqdm import tqdm
except ImportError:  # pragma: no cover - exercised in a subprocess by tests/test_packaging.py
    tqdm = None

__all__ = ["counter", "progress_bar", "say"]


def say(message: str) -> None:
    """Print ``message`` on stderr (above the progress bar, not through it)."""
    if tqdm is None:
        print(message, file=sys.stderr, flush=True)
    else:
        tqdm.write(message, file=sys.stderr)  # above the bar, not through it


class _NoBar:
    """What the loop calls on a progress bar, doing nothing (no tqdm installed)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def counter(total: int, desc: str, unit: str, show: bool, initial: int = 0,
            who: str = "gssgd") -> Any:
    """tqdm's bar over ``total`` units (disabled unless ``show``), or no bar without tqdm
    (``who`` says so once when one was asked for). What it returns takes ``update``,
    ``set_postfix`` and ``close``."""
    if tqdm is not None:
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not show,
                    dynamic_ncols=True, mininterval=0.5)
    if show:
        say(f"{who}: no progress bar (tqdm is not installed: pip install 'gssgd[cli]')")
    return _NoBar()


def progress_bar(cfg: Any, start_step: int, show: bool) -> Any:
    """The training loop's bar over the run's steps (:func:`counter`)."""
    return counter(cfg.steps, cfg.method, "step", show, initial=start_step, who="gssgd train")
