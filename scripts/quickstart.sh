#!/usr/bin/env bash
# The main job on a fresh machine: set up, start the server on the embedded tiny Qwen3-VL (generated
# on first use), answer a sample image request through the OpenAI client, then shut the server down.
# Extra arguments go to the server, e.g. `bash scripts/quickstart.sh --model-path DIR --tp-size 2`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PORT=${PORT:-30000}
bash scripts/setup.sh

LOG=$(mktemp -t sglang-quickstart-XXXX.log)
"$PY" -m sglang.launch_server --port "$PORT" "$@" >"$LOG" 2>&1 &
SERVER=$!
cleanup() { kill -TERM "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }
trap cleanup EXIT

echo "waiting for the server on port $PORT (log: $LOG) ..."
for _ in $(seq 1 300); do
  if "$PY" -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$SERVER" 2>/dev/null; then
    echo "the server exited during start-up:" >&2; tail -n 40 "$LOG" >&2; exit 1
  fi
  sleep 1
done
"$PY" scripts/sample_request.py --port "$PORT"
