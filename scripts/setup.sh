#!/usr/bin/env bash
# Installs the project and its test tools into the current Python environment.
# CPU machines: torch 2.13.0 is installed first and pinned, so no dependency can pull CUDA wheels.
# SGLANG_TORCH_INDEX, if set, is passed to pip as --index-url for that one torch install
# (e.g. a CPU-only wheel index on hosted CI); torchvision is never installed here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  if [ -n "${SGLANG_TORCH_INDEX:-}" ]; then
    "$PY" -m pip install -q "torch==2.13.0" --index-url "$SGLANG_TORCH_INDEX"
  else
    "$PY" -m pip install -q "torch==2.13.0"
  fi
fi
TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==${TORCH_VERSION}" > "$CONSTRAINTS"
cat scripts/test-constraints.txt >> "$CONSTRAINTS"

# sgl-kernel's triton extra lets the CPU suite run the Triton kernels under TRITON_INTERPRET=1. Where
# no triton wheel exists for the platform, install without it: those tests then skip themselves.
if ! "$PY" -m pip install -q -c "$CONSTRAINTS" -e ".[test]" -e "./sgl-kernel[triton]"; then
  echo "warning: could not install triton; sgl-kernel's Triton tests will be skipped" >&2
  "$PY" -m pip install -q -c "$CONSTRAINTS" -e ".[test]" -e ./sgl-kernel
fi
if "$PY" -c "import torchvision" 2>/dev/null && ! "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "warning: torchvision is installed on a machine without CUDA; transformers' image processors break with it" >&2
fi
