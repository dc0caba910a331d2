#!/usr/bin/env bash
# The GPU check of issue 11: under 5 minutes on one GPU with only torch and Triton installed
# (no package registry; the training data is generated here). Writes gpu_check.json and
# table.txt (plus each part's output) to the directory given, else $OUT, else runs/gpu_check.
#
#   bash tools/gpu_check.sh [DIR]
#
# Parts (each under its own timeout; a failed part is recorded and the rest still run):
#   1. tests/kernels on CUDA (compiled, not interpreted); needs pytest, else recorded as skipped
#   2. gssgd bench kernels (1M, 25.6M, 110M; kernels against the torch path, checked)
#   3. each method's compression at ResNet-50 size (d = 25,557,032) as a share of a
#      ResNet-50 batch-64 forward+backward (torchvision's if importable, else the 32.8 ms anchor)
#   4. 20 steps of gssgd train --method gs on CUDA: NCCL with 1 worker; gloo with CUDA
#      tensors (GSSGD_CUDA_BACKEND=gloo, --allreduce backend: gloo moves CUDA tensors only
#      in all-reduce and broadcast) with 2 and 4 workers on the one GPU
# Without a CUDA device it stops before the first CUDA step, says so, and exits 2
# (GPU_CHECK_DRY_RUN=1 goes on anyway: the CUDA parts fail and are recorded; a check of
# this script itself).
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-${OUT:-runs/gpu_check}}
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
# the package and the lab from this checkout (nothing needs installing but torch and Triton)
export PYTHONPATH="$PWD:$PWD/lab${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$DIR"
STATUS="$DIR/parts.jsonl"
: > "$STATUS"

# record NAME RC SECONDS: one line of parts.jsonl
record() { echo "{\"part\": \"$1\", \"rc\": $2, \"seconds\": $3}" >> "$STATUS"; }

"$PYTHON" - "$DIR" <<'PY'
import json, os, sys
import torch
info = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
try:
    import triton
    info["triton"] = triton.__version__
except ImportError:
    info["triton"] = None
if info["cuda"]:
    info["device"] = torch.cuda.get_device_name()
json.dump(info, open(f"{sys.argv[1]}/environment.json", "w"), indent=1)
print("gpu_check:", info)
if not info["cuda"] and os.environ.get("GPU_CHECK_DRY_RUN") != "1":
    print(
        f"gpu_check: no CUDA device visible to torch {torch.__version__}: nothing measured. "
        "Run tools/gpu_check.sh on a machine with an NVIDIA GPU (the kernel tests run "
        "without one: pytest tests/kernels).", file=sys.stderr)
    sys.exit(2)
PY
rc=$?
if [[ $rc -ne 0 ]]; then exit "$rc"; fi

# 1. the kernel tests, compiled for the GPU
start=$SECONDS
if "$PYTHON" -c "import pytest" 2>/dev/null; then
  GSSGD_KERNEL_TEST_DEVICE=cuda timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/kernels > "$DIR/kernel_tests.txt" 2>&1
  rc=$?
else
  echo "pytest is not installed: kernel tests skipped (bench kernels still checks every kernel)" \
    > "$DIR/kernel_tests.txt"
  rc=77
fi
tail -3 "$DIR/kernel_tests.txt"
record kernel_tests $rc $((SECONDS - start))

# 2. the kernel benchmark
start=$SECONDS
timeout 200 "$PYTHON" -m gssgd_lab kernels --json "$DIR/bench_kernels.json" \
  > "$DIR/bench_kernels.txt" 2>&1
rc=$?
cat "$DIR/bench_kernels.txt"
record bench_kernels $rc $((SECONDS - start))

# 3. compression as a share of a ResNet-50 step
start=$SECONDS
timeout 90 "$PYTHON" - "$DIR" > "$DIR/step_shares.txt" 2>&1 <<'PY'
import json, sys
from gssgd_lab.compression_shares import compression_shares
shares = compression_shares()
json.dump(shares, open(f"{sys.argv[1]}/step_shares.json", "w"), indent=1)
print(f"fwd+bwd {shares['fwdbwd_ms']:.2f} ms ({shares['fwdbwd_source']})")
for name, entry in shares["methods"].items():
    print(f"{name:>9}: compression {entry['ms']:.3f} ms = {100 * entry['share']:.2f} % of the step")
PY
rc=$?
cat "$DIR/step_shares.txt"
record step_shares $rc $((SECONDS - start))

# 4. a few training steps on CUDA (generated data: 64 features, 10 classes)
"$PYTHON" - "$DIR/data.npz" <<'PY'
import sys
import numpy as np
rng = np.random.default_rng(0)
centers = rng.normal(size=(10, 64)).astype(np.float32)
def split(n):
    y = rng.integers(0, 10, n)
    return (centers[y] + rng.normal(scale=0.8, size=(n, 64))).astype(np.float32), y
x_train, y_train = split(4096)
x_test, y_test = split(1024)
np.savez(sys.argv[1], x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
PY
train() {  # NAME BACKEND WORKERS EXTRA...
  local name=$1 backend=$2 workers=$3; shift 3
  local start=$SECONDS
  GSSGD_CUDA_BACKEND=$backend timeout 75 "$PYTHON" -m gssgd.cli.main train --device cuda \
    --dataset "npz:$DIR/data.npz" --workers "$workers" --steps 20 --eval-every 0 \
    --no-progress --timeout 60 --out "$DIR/$name" --overwrite "$@" > "$DIR/$name.txt" 2>&1
  local rc=$?
  tail -2 "$DIR/$name.txt"
  record "$name" $rc $((SECONDS - start))
}
train train_nccl_p1 nccl 1 --method gs
train train_gloo_p2 gloo 2 --method gs --allreduce backend
train train_gloo_p4 gloo 4 --method gs --allreduce backend

# the one JSON and the short table
"$PYTHON" - "$DIR" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
def load(name):
    p = d / name
    return json.loads(p.read_text()) if p.exists() else None
parts = [json.loads(line) for line in (d / "parts.jsonl").read_text().splitlines()]
train = {p["part"]: load(f"{p['part']}/summary.json") for p in parts if p["part"].startswith("train")}
out = {"environment": load("environment.json"), "parts": parts,
       "bench_kernels": load("bench_kernels.json"), "step_shares": load("step_shares.json"),
       "train": train}
(d / "gpu_check.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
lines = [f"gpu_check on {out['environment'].get('device')} (torch {out['environment']['torch']}, "
         f"triton {out['environment']['triton']})", ""]
lines += [f"{p['part']:>22}: rc {p['rc']:>3}, {p['seconds']:>4} s" for p in parts]
shares = out["step_shares"]
if shares:
    lines += ["", f"compression at d = {shares['d']:,} vs fwd+bwd {shares['fwdbwd_ms']:.2f} ms "
              f"({shares['fwdbwd_source']})"]
    lines += [f"{n:>22}: {e['ms']:.3f} ms = {100 * e['share']:.2f} %" for n, e in shares["methods"].items()]
bench = out["bench_kernels"]
if bench:
    lines += ["", "kernels (ms, kernel / torch):"]
    for size in bench["sizes"]:
        for lay, ops in size["layouts"].items():
            for op in ("sketch", "recover", "query"):
                e = ops[op]
                lines.append(f"{size['d']:>12,} {lay:>6} {op:>8}: {e['kernel_ms']} / {e['torch_ms']:.3f}  {e['check']}")
        for op in ("gather", "select"):
            e = size[op]
            lines.append(f"{size['d']:>12,} {'-':>6} {op:>8}: {e['kernel_ms']} / {e['torch_ms']:.3f}  {e['check']}")
for name, summary in train.items():
    if summary:
        keys = ("status", "seconds_per_step", "final_test_accuracy")
        lines.append(f"{name:>22}: " + ", ".join(f"{k} {summary.get(k)}" for k in keys))
(d / "table.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"wrote {d / 'gpu_check.json'} and {d / 'table.txt'}")
PY
