"""Per-device compute constants of the cost model, loaded from
``gssgd/costmodel/data/devices.json`` (each with its source) and, for this machine's CPU,
from the fit on its emulated runs (``data/fit.json``).

A step costs, on each worker, the model's forward and backward pass plus the method's
compression work. :class:`Device` holds what the cost model needs of both:

* ``fwdbwd_s_per_param``: seconds of forward + backward per model parameter, a rough
  default for a model given only by its size (a measured ``--compute-ms`` is better:
  compute per parameter depends on the architecture and the batch).
* ``compression_seconds(spec)``: the method's compute per step. The CPU's are per-method
  :class:`~gssgd.costmodel.compute_law.ComputeLaw` s (seconds per element as a power of
  ``d``) fitted on this machine's ``gssgd bench comm`` runs; a GPU's are built from measured
  primitives (``gssgd bench device``) by what each method does, read from the spec: a pass
  over the vector, ``torch.topk``, a sketch row, the sketch's recovery, PowerSGD's products.

Devices (``devices.json``; ``gssgd advise --device``):

* ``h200``: timed on one NVIDIA H200 (``gssgd bench device``, and
  ``tools/gpu_check.sh``'s kernel timings for the sketch and its recovery).
* ``h100``, ``a100``: derived from the H200's measurement by datasheet ratios (NVIDIA's
  H100 SXM5, A100 SXM4 80 GB and H200 SXM datasheets, stored beside them): the
  memory-bound constants (passes, top-k, sketching, recovery, PowerSGD's thin products) by
  HBM bandwidth, forward + backward by dense TF32 throughput. Not measured.
* ``cpu``: one core of the machine the fit's runs were made on (the record's ``summary``
  and ``source`` say which): compression laws from the fit, forward + backward of the
  shipped wide models measured there.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gssgd.costmodel import store
from gssgd.costmodel.compute_law import ComputeLaw
from gssgd.costmodel.method_specs import MethodSpec
from gssgd.methods import get_method

__all__ = ["DEVICE_NAMES", "Device", "cpu_fwdbwd_seconds", "device_record", "get_device"]

#: Passes over the vector every sparse method makes besides its selection: add the
#: residual, take |.|, gather the selected values, zero them in the residual, write the
#: update (each a read or a read + write of d float32 elements).
_SPARSE_PASSES = 5
#: Passes of a dense step: copy the gradient into the payload, divide the sum by P
#: (a 16-bit payload adds the cast).
_DENSE_PASSES = 2
#: Passes of a PowerSGD step besides its products: add the residual, write the update,
#: subtract it into the residual.
_LOWRANK_PASSES = 3


@dataclass(frozen=True)
class Device:
    """What one worker's device costs the cost model.

    Attributes:
        name: what ``--device`` takes.
        summary: one line for the reports.
        fwdbwd_s_per_param: forward + backward seconds per model parameter.
        pass_s_per_elem: one pass over a float32 vector, per element (GPU).
        topk_s_per_elem: top-k of ``|g|`` at k = d/1000, per element (GPU).
        sketch_s_per_elem_row: sketching one element into one row (GPU).
        recover_s_per_elem: the sketch's recovery, candidates over d, per element (GPU; 0:
            priced as a top-k).
        lowrank_s_per_elem_rank: PowerSGD's products (``M Q``, ``M^T P``, ``P Q^T``), per
            element of the matrices and unit of rank (GPU).
        compute: per-method compression laws by benchmark name (CPU: fitted); empty for a
            device priced from the primitives above.
        overlap_efficiency: the fraction of the overlappable communication backward really
            hides, 0..1 (1 on a GPU: NCCL on its own engines, assumed; 0 on this CPU:
            measured).
        source: where the numbers come from.
    """

    name: str
    summary: str
    fwdbwd_s_per_param: float
    pass_s_per_elem: float = 0.0
    topk_s_per_elem: float = 0.0
    sketch_s_per_elem_row: float = 0.0
    recover_s_per_elem: float = 0.0
    lowrank_s_per_elem_rank: float = 0.0
    compute: Mapping[str, ComputeLaw] = field(default_factory=dict)
    overlap_efficiency: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap_efficiency <= 1.0:
            raise ValueError(
                f"overlap_efficiency={self.overlap_efficiency!r} must be in [0, 1] "
                "(the fraction of overlappable communication that backward hides)"
            )

    def compression_seconds(self, spec: MethodSpec, compute_share: float = 1.0) -> float:
        """The method's compute per step on this device for ``spec.d`` elements, with
        ``compute_share`` workers per core.

        With fitted laws (``compute``): the method's own, else its aggregator's, else its
        ``cost_like`` method's (a method with none costs as the costliest in the table).
        Otherwise from primitives: a method that sends everything makes its passes (one
        more for a 16-bit payload's cast); PowerSGD its passes and ``rank`` products per
        element; a sparse one its passes and a top-k over ``d``, and when it sketches,
        ``rows`` sketch passes and the recovery (or a top-k where none was measured).
        """
        if self.compute:
            return self._law(spec).seconds(spec.d, compute_share)
        cls = get_method(spec.aggregator).aggregator
        assert cls is not None
        if cls.takes_shapes:
            per_elem = (_LOWRANK_PASSES * self.pass_s_per_elem
                        + max(spec.rank, 1) * self.lowrank_s_per_elem_rank)
        elif cls.sends_all:
            per_elem = (_DENSE_PASSES + (1 if spec.value_bytes < 4 else 0)) * self.pass_s_per_elem
        else:
            per_elem = _SPARSE_PASSES * self.pass_s_per_elem + self.topk_s_per_elem
            if spec.rows:
                per_elem += spec.rows * self.sketch_s_per_elem_row
                per_elem += self.recover_s_per_elem or self.topk_s_per_elem
        return compute_share * per_elem * spec.d

    def _law(self, spec: MethodSpec) -> ComputeLaw:
        like = get_method(spec.aggregator).cost_like
        for key in (spec.name, spec.aggregator, like):
            if key is not None and key in self.compute:
                return self.compute[key]
        return max(self.compute.values(), key=lambda law: law.gamma)


def device_record(name: str) -> dict[str, Any]:
    """The device's record in ``devices.json``: measured, or derived from the measured
    reference by its datasheet ratios (``"derived_from"``).

    Raises:
        ValueError: an unknown device (the message lists the known ones).
    """
    data = store.load("devices.json")
    devices = data["devices"]
    if name not in devices:
        raise ValueError(
            f"unknown device {name!r}; known devices: {', '.join(devices)} (e.g. --device h200)"
        )
    record = dict(devices[name])
    base_name = record.get("derived_from")
    if base_name is None:
        return record
    base, sheets = devices[base_name], data["datasheets"]
    memory = sheets[base_name]["hbm_TBps"] / sheets[name]["hbm_TBps"]
    compute = sheets[base_name]["tf32_dense_TFLOPS"] / sheets[name]["tf32_dense_TFLOPS"]
    for key in ("pass_s_per_elem", "topk_s_per_elem", "sketch_s_per_elem_row",
                "recover_s_per_elem", "lowrank_s_per_elem_rank"):
        record[key] = base.get(key, 0.0) * memory
    record["fwdbwd_s_per_param"] = base["fwdbwd_s_per_param"] * compute
    record.setdefault("overlap_efficiency", base.get("overlap_efficiency", 1.0))
    return record


#: The devices ``gssgd advise --device`` knows (``devices.json``).
DEVICE_NAMES: tuple[str, ...] = tuple(store.load("devices.json")["devices"])


def cpu_fwdbwd_seconds(model: str) -> float | None:
    """The CPU's measured forward + backward seconds of a shipped model at ``gssgd train``'s
    default batch, or None where it was not measured."""
    return device_record("cpu").get("fwdbwd_s", {}).get(model)


@functools.cache
def get_device(name: str) -> Device:
    """The named device (the CPU with the compression laws of the fit on its runs).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    key = name.strip().lower() if isinstance(name, str) else name
    record = device_record(key)
    compute: dict[str, ComputeLaw] = {}
    if record.get("compute") == "fit":
        laws = store.load("fit.json")["cpu_compute"]
        compute = {m: ComputeLaw(law["gamma"], law["slope"]) for m, law in laws.items()}
    fields_ = {k: v for k, v in record.items()
               if k in Device.__dataclass_fields__ and k not in ("name", "compute")}
    return Device(name=key, compute=compute, **fields_)
