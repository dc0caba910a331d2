"""Each method's per-step compression compute on CUDA, and its share of a forward +
backward step (``tools/gpu_check.sh`` prints it)."""

from __future__ import annotations

import torch

from gssgd.aggregators.options import resolve_k
from gssgd.aggregators.sketching import SketchingAggregator, default_candidates
from gssgd.methods import METHODS
from gssgd.sketch import CountSketch
from gssgd_lab.kernel_config import H200_ANCHOR, RESNET50_D, KernelBenchConfig
from gssgd_lab.kernel_timing import median_ms, no_setup

__all__ = ["compression_shares"]


def compression_shares(
    d: int = RESNET50_D, density: float = 0.001, repeats: int = 20, warmup: int = 3,
    fwdbwd_ms: float | None = None,
) -> dict:
    """Each method's per-step compression compute at length ``d`` on CUDA, and its share of
    a forward + backward step (the project's defaults: gs and Sketched-SGD with their default
    sketch and candidates; topk and gtopk the local top-k; dense nothing).

    Timed with the kernels as dispatch chooses them (``GSSGD_KERNELS``), CUDA events, the
    median of ``repeats`` on two alternating gradients. What is timed per method:

    * gs: sketch the gradient, recover m·k candidates (``heavy_hitters(m·k,
      ordered=False)``), gather the exact values at them, top-k of those;
    * sketched: the same compute (the server's recovery; its rows and columns are gs's);
    * topk, gtopk: ``topk_indices(|a|, k)`` (gtopk's merges are communication);
    * dense: none.

    Args:
        fwdbwd_ms: the step to compare with; None measures torchvision's ResNet-50 at batch
            64 (fp32) when torchvision is importable, else uses the H200 anchor's figure.

    Returns:
        ``{"d", "k", "fwdbwd_ms", "fwdbwd_source", "methods": {name: {"ms", "share"}}}``.
    """
    from gssgd.aggregators.sketching import DEFAULT_ROWS, default_sketch_cols
    from gssgd.selection import topk_indices

    cfg = KernelBenchConfig(sizes=(d,), repeats=repeats, warmup=warmup, device="cuda")
    k = resolve_k(d, density, None)
    m = default_candidates(d, k)
    rows, cols = DEFAULT_ROWS, default_sketch_cols(d, k, DEFAULT_ROWS)
    gen = torch.Generator(device="cuda").manual_seed(0)
    pool = [torch.randn(d, generator=gen, device="cuda") for _ in range(2)]
    sketch = CountSketch(d, rows=rows, cols=cols, seed=0, device="cuda")

    def sketch_recover(i: int) -> None:
        a = pool[i % 2]
        sketch.zero_()
        sketch.accumulate(a)
        cand = sketch.heavy_hitters(m * k, ordered=False)[0]
        exact = a[cand]
        topk_indices(exact.abs(), k)

    def local_topk(i: int) -> None:
        topk_indices(pool[i % 2].abs(), k)

    # every built-in sparse method: the sketching ones sketch and recover, the others select
    timed = {name: sketch_recover if issubclass(method.aggregator, SketchingAggregator)
             else local_topk
             for name, method in METHODS.items()
             if method.sparse and method.aggregator.__module__.startswith("gssgd.")}
    source = "given"
    if fwdbwd_ms is None:
        fwdbwd_ms, source = _resnet50_fwdbwd_ms(cfg)
    methods = {"dense": {"ms": 0.0, "share": 0.0}}
    for name, fn in timed.items():
        ms = median_ms(fn, no_setup, cfg)
        methods[name] = {"ms": ms, "share": ms / fwdbwd_ms}
    return {"d": d, "k": k, "m": m, "rows": rows, "cols": cols, "fwdbwd_ms": fwdbwd_ms,
            "fwdbwd_source": source, "methods": methods}


def _resnet50_fwdbwd_ms(cfg: KernelBenchConfig) -> tuple[float, str]:
    """torchvision's ResNet-50, batch 64, fp32, forward + backward (median ms), or the H200
    anchor's figure when torchvision is absent."""
    try:
        import torchvision
    except ImportError:
        return H200_ANCHOR["resnet50_b64_fp32_fwdbwd_ms"], "H200 anchor (no torchvision)"
    model = torchvision.models.resnet50().cuda()
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i: int) -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    return median_ms(step, no_setup, cfg), "measured (torchvision resnet50, batch 64, fp32)"
