"""Measured GPU anchors: one NVIDIA H200, the only GPU figures the project has so far.

Measured 2026-11-29 on one NVIDIA H200 with torch 2.11, fp32, CUDA events, the median of
repeated runs, with naive (unfused) torch implementations of the compressors' steps at
k = d/1000 and a sketch of 5 rows x 10·k columns:

* ``copy_TBps``: device-to-device copy bandwidth; ``read_floor_ms``: one read of the
  gradient at that rate (the floor any pass over the vector has).
* ``topk_ms``: ``torch.topk(g.abs(), k)``.
* ``sketch_precomputed_hash_ms``: ``index_add_`` into the 5-row table with int64 hashes
  precomputed for all d coordinates; ``sketch_onthefly_hash_ms``: hashes computed by torch
  ops each time.
* ``query_median_topk_ms``: gather from every row, median over rows, top-k over d.
* ``resnet50_b64_*_fwdbwd_ms``: a torchvision-shaped ResNet-50, batch 64, 224x224, forward
  and backward.

Also seen on that machine: an NCCL all-reduce of 4 MB at world size 1 took 0.19 ms; NCCL
refuses two ranks on one GPU; gloo with CUDA tensors works at 2 and 4 ranks (a 4 MB
all-reduce took 3.4 / 4.6 ms). The cluster cost model (:mod:`gssgd.costmodel.devices`) and
``gssgd bench kernels`` read these figures until ``scripts/gpu_check.sh`` has measured the
project's own kernels.
"""

from __future__ import annotations

from typing import Any

__all__ = ["H200_ANCHOR", "RESNET50_D"]

#: ResNet-50's parameter count, the size most anchors were measured at.
RESNET50_D = 25_557_032

#: The H200 figures (milliseconds; copy in TB/s), per gradient size for the per-size ones.
H200_ANCHOR: dict[str, Any] = {
    "date": "2026-11-29",
    "device": "NVIDIA H200, torch 2.11",
    "copy_TBps": 4.20956370720414,
    "resnet50_b64_fp32_fwdbwd_ms": 32.785919189453125,
    "resnet50_b64_bf16_fwdbwd_ms": 29.638912200927734,
    "sizes": {
        RESNET50_D: {
            "name": "resnet50",
            "read_floor_ms": 0.024284732364318277,
            "topk_ms": 0.6220800280570984,
            "sketch_precomputed_hash_ms": 1.9151359796524048,
            "sketch_onthefly_hash_ms": 7.865983963012695,
            "query_median_topk_ms": 23.225631713867188,
        },
        110_000_000: {
            "name": "bert_base",
            "read_floor_ms": 0.10452389620496662,
            "topk_ms": 2.341536045074463,
            "sketch_precomputed_hash_ms": 7.985119819641113,
            "sketch_onthefly_hash_ms": 32.79702377319336,
            "query_median_topk_ms": 99.93011474609375,
        },
    },
}
