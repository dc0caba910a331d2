"""Every kernel compiles for a GPU (sm_90, Hopper) on this machine, no GPU needed.

The interpreter runs kernels as numpy and accepts code the compiler refuses (a Python
global read inside a kernel, say), so the kernels are also compiled ahead of time through
Triton's own toolchain down to a cubin. A subprocess: the kernels must be defined without
``TRITON_INTERPRET``, which this directory's conftest sets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.kernels.conftest import DEVICE, HAVE_TRITON

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gssgd.kernels import select_ops, sketch_ops

    def compile_(fn, signature, constexprs):
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        assert "cubin" in kernel.asm, sorted(kernel.asm)

    for rows, dt in ((5, "bf16"), (7, "fp32")):
        compile_(sketch_ops._query_kernel, {
            "table_ptr": f"*{dt}", "params_ptr": "*i64", "idx_ptr": "*i64",
            "out_ptr": f"*{dt}", "n": "i32", "cols": "i32", "HAS_IDX": "constexpr",
            "ROWS": "constexpr", "BLOCK": "constexpr"},
            {"HAS_IDX": rows == 5, "ROWS": rows, "BLOCK": 1024})
    compile_(sketch_ops._sketch_kernel, {
        "vec_ptr": "*bf16", "acc_ptr": "*fp32", "params_ptr": "*i64", "d": "i64",
        "cols": "i32", "ROWS": "constexpr", "BLOCK": "constexpr"}, {"ROWS": 5, "BLOCK": 1024})
    for write in (True,):  # the write pass holds the count pass's code, and more
        compile_(sketch_ops._candidates_kernel, {
            "table_ptr": "*fp32", "params_ptr": "*i64", "tau_ptr": "*fp32",
            "counts_ptr": "*i64", "offsets_ptr": "*i64", "out_ptr": "*i64", "d": "i32",
            "cols": "i32", "majority": "i32", "WRITE": "constexpr", "ROWS": "constexpr",
            "BLOCK": "constexpr"}, {"WRITE": write, "ROWS": 3, "BLOCK": 1024})
        compile_(select_ops._at_least_kernel, {
            "values_ptr": "*bf16", "tau_ptr": "*bf16", "counts_ptr": "*i64",
            "offsets_ptr": "*i64", "out_ptr": "*i64", "n": "i32", "WRITE": "constexpr",
            "BLOCK": "constexpr"}, {"WRITE": write, "BLOCK": 1024})
    compile_(select_ops._gather_kernel, {
        "vec_ptr": "*fp32", "idx_ptr": "*i64", "out_ptr": "*fp32", "n": "i32",
        "BLOCK": "constexpr"}, {"BLOCK": 1024})
    print("compiled")
    """
)


@pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed")
@pytest.mark.skipif(DEVICE == "cuda", reason="on CUDA every other test compiles the kernels")
def test_every_kernel_compiles_for_sm90(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path),
               TRITON_DEFAULT_FP_FUSION="1")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "compiled"
