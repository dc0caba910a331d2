"""Mixed precision with the gssgd hook: ``torch.autocast`` and ``torch.amp.GradScaler``.

With float16 autocast a scaler multiplies the loss by a scale ``S`` before ``backward``, so
the gradients the hook sees are ``S`` times the true ones, and some steps overflow. DDP's
own all-reduce hands an overflow on to every rank (a sum with an Inf is Inf), the scaler
finds it in ``unscale_``, skips ``optimizer.step`` and halves ``S``. A compressing hook
must keep that contract and its error feedback in step with ``S``:

1. **Overflow**: with ``nonfinite="propagate"`` (the default once the hook knows the
   scaler) every rank learns that some rank's gradient is not finite (one 4-byte
   all-gather, already part of every step) and returns an all-NaN bucket, the same on every
   rank. The residuals, the momentum and the step count are left as they were, so the
   skipped step loses nothing. In per-bucket mode the hook first waits for every bucket of
   the iteration, so no bucket's state moves on a step the scaler skips.
2. **Scale changes**: the residual and momentum hold scaled gradients, in units of the
   ``S`` of the step that wrote them. Before the first compressed bucket of each iteration
   :class:`LossScaleFollower` reads the scaler's scale and, when it changed, multiplies
   every residual and momentum by ``new / old`` (the scaler grows and backs off by powers
   of two by default, so this is exact). The scale the state is in is saved with it.
3. **Dtypes**: the residual and momentum are float32 whatever the gradient's dtype
   (:func:`gssgd.aggregators.base.state_dtype`), gs's sketch tables are float32 and cross
   the wire in ``table_dtype`` only; the hook returns the gradient's dtype.

Example::

    scaler = torch.amp.GradScaler("cuda")
    state = HookState("gs", density=0.01, model=ddp_model, scaler=scaler)
    ddp_model.register_comm_hook(state, comm_hook)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(ddp_model(x), y)
    scaler.scale(loss).backward()   # an overflow: NaN buckets on every rank
    scaler.step(optimizer)          # skipped on every rank
    scaler.update()                 # the scale halves; the hook rescales its residuals

``gssgd train --amp fp16`` does exactly this (``--amp bf16``: bfloat16 autocast, which has
float32's range and needs no scaler).

A hook that is not given the scaler keeps ``nonfinite="skip"``: every overflow becomes a
zero update the scaler never sees, so its scale never goes down. The hook says so where it
happens: the first skipped step warns once per ``HookState``, and the ``FloatingPointError``
after ``max_consecutive_skips`` skipped steps names ``scaler=`` and ``use_scaler``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["AMP_DTYPES", "LossScaleFollower", "make_scaler", "scaler_options"]

#: ``--amp`` names and their autocast dtypes.
AMP_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16}


def scaler_options(options: dict[str, Any], scaler: Any) -> dict[str, Any]:
    """A hook's aggregator options once it is given a ``scaler``: ``nonfinite`` defaults
    to ``"propagate"``.

    Args:
        options: the method's options as given to ``HookState``.
        scaler: a ``torch.amp.GradScaler``, or None (then ``options`` come back unchanged).

    Returns:
        The options to build the aggregators with.

    Raises:
        ValueError: ``scaler`` lacks ``get_scale``/``is_enabled``, or
            ``nonfinite="skip"`` was asked for with a scaler (the scaler would never see an
            overflow and never lower its scale).
    """
    if scaler is None:
        return options
    if not callable(getattr(scaler, "get_scale", None)) or not callable(
        getattr(scaler, "is_enabled", None)
    ):
        raise ValueError(
            f"scaler={type(scaler).__name__} is invalid: it must be a torch.amp.GradScaler "
            "(or None). Pass the scaler your training loop calls scale()/step()/update() on."
        )
    if options.get("nonfinite", "propagate") == "skip":
        raise ValueError(
            "nonfinite='skip' is invalid with a scaler: a skipped step returns zeros, so the "
            "GradScaler never sees the overflow and never lowers its scale. Leave nonfinite "
            "out (with a scaler it defaults to 'propagate') or pass nonfinite='raise'."
        )
    return {**options, "nonfinite": options.get("nonfinite", "propagate")}


class LossScaleFollower:
    """Keeps error-feedback state in the units of the scaler's current loss scale.

    Args:
        scaler: the run's ``torch.amp.GradScaler`` (None or disabled: nothing to follow).

    Attributes:
        scale: the loss scale the residuals and momentum are in (None before the first
            compressed step, or without an enabled scaler).
    """

    def __init__(self, scaler: Any = None) -> None:
        self.scaler = scaler
        self.scale: float | None = None

    def current(self) -> float | None:
        """The scaler's scale now (None without an enabled scaler)."""
        if self.scaler is None or not self.scaler.is_enabled():
            return None
        return float(self.scaler.get_scale())

    def follow(self, aggregators: list[Any], saved: list[dict[str, Any]]) -> None:
        """Rescale every state from :attr:`scale` to the scaler's current scale.

        Args:
            aggregators: live aggregators (each has ``rescale(factor)``).
            saved: loaded aggregator state dicts not yet handed to an aggregator; their
                ``residual`` and ``momentum`` tensors are rescaled in place of new ones.
        """
        now = self.current()
        if now is None:
            return
        if self.scale is not None and now != self.scale:
            factor = now / self.scale
            for agg in aggregators:
                agg.rescale(factor)
            for sd in saved:
                for key in ("residual", "momentum"):
                    if isinstance(sd.get(key), torch.Tensor):
                        sd[key] = sd[key] * factor
        self.scale = now


def make_scaler(amp: str | None, device: torch.device) -> torch.amp.GradScaler | None:
    """The GradScaler of ``gssgd train --amp``: float16 needs one, bfloat16 and float32 not.

    Raises:
        ValueError: ``amp`` is not None, "fp16" or "bf16".
    """
    if amp is not None and amp not in AMP_DTYPES:
        raise ValueError(
            f"--amp={amp!r} is invalid: it must be one of {', '.join(AMP_DTYPES)}. "
            "Leave it out to train in float32."
        )
    if amp != "fp16":
        return None
    return torch.amp.GradScaler(device.type)
