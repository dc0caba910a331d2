"""Per-device compute constants of the cluster cost model: this CPU and an NVIDIA H200.

A step of data-parallel training costs, on each worker, the model's forward and backward
pass plus the method's compression work (error feedback, top-k selection, sketching,
recovery). :class:`Device` holds what the cost model needs of both:

* ``fwdbwd_s_per_param``: seconds of forward + backward per model parameter, a rough
  default for a model given only by its size (``gssgd advise --params``). Compute per
  parameter depends on the architecture and the batch (a convolution reuses each weight at
  every pixel, a linear layer once), so a measured figure (``--compute-ms``) is always
  better.
* ``compression_seconds(spec)``: the method's compute per step for a vector of ``spec.d``
  elements. The CPU's figures are the per-method :class:`~gssgd.costmodel.compute_law.ComputeLaw`
  (seconds per element as a power of ``d``) fitted on this machine's ``gssgd bench comm``
  runs by the cost model's held-out check (:data:`CPU_COMPUTE`); the GPU's are built from
  measured primitives (a pass over the vector, ``torch.topk``, a sketch row's ``index_add_``)
  by what each method does, read from the spec's fields (does it send everything, does it
  sketch and with how many rows).

Sources:

* **H200**: :mod:`gssgd.costmodel.anchors`, measured 2026-11-29 on one NVIDIA H200 with torch 2.11,
  fp32, CUDA events, median of repeated runs, naive (unfused) torch ops at d = 25,557,032
  (ResNet-50's parameter count), k = d/1000: device copy 4.21 TB/s, one read of the
  gradient 0.0243 ms, ``torch.topk(g.abs(), k)`` 0.622 ms, a 5-row sketch by ``index_add_``
  with precomputed int64 hashes 1.915 ms (0.383 ms a row), torchvision ResNet-50 at batch
  64, 224x224, forward + backward 32.79 ms (fp32).
* **CPU**: the 2-core x86-64 development VM (torch 2.13.0+cpu, one thread per worker),
  2026-11-30: compression laws and the software cost per byte from the cluster
  model's fit (:func:`gssgd.costmodel.check.fit_cells`) on the bench comm runs of
  ``docs/results``; forward + backward of the wide ResNet (``--model wresnet``, 3.46M
  parameters, batch 32 of 28x28, one thread) 0.27 s, the faster of two timings taken while
  other work ran (:data:`CPU_FWDBWD_S`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gssgd.costmodel.anchors import H200_ANCHOR, RESNET50_D
from gssgd.costmodel.compute_law import CPU_COMPUTE, ComputeLaw
from gssgd.costmodel.method_specs import MethodSpec
from gssgd.costmodel.predict import CostModel
from gssgd.methods import get_method

__all__ = ["CPU_COMPUTE", "CPU_FWDBWD_S", "DEVICES", "Device", "get_device"]

#: Passes over the vector every sparse method makes besides its selection: add the
#: residual, take |.|, gather the selected values, zero them in the residual, write the
#: update (each a read or a read + write of d float32 elements).
_SPARSE_PASSES = 5
#: Passes of a dense step: copy the gradient into the payload, divide the sum by P
#: (a 16-bit payload adds the cast).
_DENSE_PASSES = 2


@dataclass(frozen=True)
class Device:
    """What one worker's device costs the cost model.

    Attributes:
        name: what ``--device`` takes.
        summary: one line for the reports.
        fwdbwd_s_per_param: forward + backward seconds per model parameter (a rough default
            when no measured compute time is given).
        software_s_per_byte: seconds per byte the software stack needs to move data through a
            collective (this CPU's ``beta0``: a core moves about 9 Gbit/s through gloo); 0 where
            the link is the limit (NCCL from GPU memory).
        pass_s_per_elem: one pass over a float32 vector, per element (GPU constants).
        topk_s_per_elem: ``torch.topk`` of ``|g|`` at k = d/1000, per element (GPU).
        sketch_s_per_elem_row: sketching one element into one row (GPU).
        compute: per-method compression seconds per element as a power of ``d``, by
            benchmark name (CPU: fitted); empty for a device whose constants are built from
            the primitives above.
        overlap_efficiency: the fraction of the communication that could run during
            backward which backward really hides, 0..1 (1: the communication runs beside
            the compute on its own engine, as NCCL's copy engines let it on a GPU; 0: it
            takes the cores backward needs, as gloo does on this CPU).
        source: where the numbers come from.
    """

    name: str
    summary: str
    fwdbwd_s_per_param: float
    software_s_per_byte: float
    pass_s_per_elem: float = 0.0
    topk_s_per_elem: float = 0.0
    sketch_s_per_elem_row: float = 0.0
    compute: Mapping[str, ComputeLaw] = field(default_factory=dict)
    overlap_efficiency: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap_efficiency <= 1.0:
            raise ValueError(
                f"overlap_efficiency={self.overlap_efficiency!r} must be in [0, 1] "
                "(the fraction of overlappable communication that backward hides)"
            )

    def compression_seconds(self, spec: MethodSpec) -> float:
        """The method's compute per step on this device for ``spec.d`` elements.

        With fitted per-method laws (``compute``): ``law.per_element(d) * d`` (a method
        without one takes its aggregator's or its ``cost_like`` method's, as the CPU cost
        model does).
        Otherwise from primitives: a method that sends everything makes its passes (one
        more for a 16-bit payload's cast); a sparse one adds a ``torch.topk`` over ``d`` (its
        own selection, or the candidates' from the summed sketch) and, when it sketches,
        ``rows`` sketch passes.
        """
        if self.compute:
            at_d = {name: law.per_element(spec.d) for name, law in self.compute.items()}
            return CostModel(gamma=at_d).gamma_of(spec) * spec.d
        cls = get_method(spec.aggregator).aggregator
        assert cls is not None
        if cls.sends_all:
            passes = _DENSE_PASSES + (1 if spec.value_bytes < 4 else 0)
            return passes * self.pass_s_per_elem * spec.d
        per_elem = _SPARSE_PASSES * self.pass_s_per_elem + self.topk_s_per_elem
        per_elem += spec.rows * self.sketch_s_per_elem_row
        return per_elem * spec.d


def _h200() -> Device:
    a = {**H200_ANCHOR, **H200_ANCHOR["sizes"][RESNET50_D]}
    d = RESNET50_D
    return Device(
        name="h200",
        summary="NVIDIA H200 (torch 2.11, fp32, naive torch ops; measured 2026-11-29)",
        fwdbwd_s_per_param=a["resnet50_b64_fp32_fwdbwd_ms"] * 1e-3 / d,
        software_s_per_byte=0.0,
        pass_s_per_elem=a["read_floor_ms"] * 1e-3 / d,
        topk_s_per_elem=a["topk_ms"] * 1e-3 / d,
        sketch_s_per_elem_row=a["sketch_precomputed_hash_ms"] * 1e-3 / (5 * d),  # 5 rows
        source="gssgd.costmodel.anchors (2026-11-29): ResNet-50 b64 fwd+bwd, topk, index_add_ sketch, copy",
    )


#: CPU software seconds per byte through gloo (a core moves about 12 Gbit/s): the same fit.
CPU_SOFTWARE_S_PER_BYTE = 6.6e-10

#: CPU forward + backward seconds of the shipped wide models at ``gssgd train``'s default
#: batch (32 images of 28x28; 32 windows of 64 characters), one thread, on the development
#: VM (2026-11-30; the faster of two measurements on a machine shared with other work).
CPU_FWDBWD_S: dict[str, float] = {"wresnet": 0.27, "gpt": 1.34}
#: CPU forward + backward seconds per parameter, the default for a model given by its size:
#: ``--model wresnet``'s (3,464,810 parameters).
CPU_FWDBWD_S_PER_PARAM = CPU_FWDBWD_S["wresnet"] / 3_464_810
#: How much of DDP's bucketed all-reduce backward hides on this CPU: none. Measured end to
#: end (``scripts/ttt_study.sh``, wide ResNet, P = 4 on 2 cores, 2026-12-01): dense's step
#: was its compute plus 1.87 s at 100 Mbit/s and plus 221 ms at 1 Gbit/s, as much as or
#: more than its whole predicted all-reduce (1.86 s and 194 ms); gloo's threads take the
#: cores backward runs on. The streamed gs measured the same way: on the
#: 3.3M-parameter ``gpt`` it was no faster than whole-model gs with the ring (3.10 against
#: 3.01 s per step, docs/benchmarks.md "Streaming gs").
CPU_OVERLAP_EFFICIENCY = 0.0


def _cpu(compute: Mapping[str, ComputeLaw] | None = None) -> Device:
    return Device(
        name="cpu",
        summary="one core of the 2-core x86-64 development VM (torch 2.13.0+cpu, gloo)",
        fwdbwd_s_per_param=CPU_FWDBWD_S_PER_PARAM,
        software_s_per_byte=CPU_SOFTWARE_S_PER_BYTE,
        compute=dict(CPU_COMPUTE if compute is None else compute),
        overlap_efficiency=CPU_OVERLAP_EFFICIENCY,
        source="the cost model's fit on this machine's bench comm runs (docs/results)",
    )


#: The devices ``gssgd advise --device`` knows, by name.
DEVICES: dict[str, Device] = {"cpu": _cpu(), "h200": _h200()}


def get_device(name: str, compute: Mapping[str, ComputeLaw] | None = None) -> Device:
    """The named device; for ``"cpu"``, optionally with calibrated compute laws.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in DEVICES:
        raise ValueError(
            f"unknown device {name!r}; known devices: {', '.join(DEVICES)} (e.g. --device h200)"
        )
    if key == "cpu" and compute is not None:
        return _cpu(compute)
    return DEVICES[key]
