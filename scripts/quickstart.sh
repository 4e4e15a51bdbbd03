#!/usr/bin/env bash
# The main job on a fresh machine: set up, generate the embedded tiny Qwen3-VL on first use, and
# answer a sample image request with it (prompt + built-in test card -> greedy tokens + timings).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m sglang.bench_one_batch --prompt "Describe this image." --output-len 16 "$@"
