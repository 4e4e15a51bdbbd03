#!/usr/bin/env bash
# The CPU sweeps behind docs/tuning.md, on the embedded tiny model: each prints its report and keeps
# results.jsonl, report.md and pareto.png under benchmark/tuning/results/<name>/. Rerunning resumes (finished
# runs are skipped); delete a folder to measure it again. Usage: bash benchmark/tuning/run_doc_sweeps.sh [name ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
R=benchmark/tuning/results
COMMON=(--server-env OMP_NUM_THREADS=1 --disable-progress)
want() { [ $# -eq 0 ] || [[ " ${SELECTED} " == *" $1 "* ]]; }
SELECTED="$*"
load() { echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"; }

if [ -z "$SELECTED" ] || want chunked; then
  load
  python -m sglang.tune "${COMMON[@]}" --output-dir $R/chunked \
    --grid chunked-prefill-size=128,512,4096 --max-concurrency 8 \
    --dataset-name random-mm --num-prompts 16 --random-input-len 64 --random-output-len 16 \
    --random-mm-base-items-per-request 4 --random-mm-bucket-config '{(256, 256, 1): 1.0}'
  load
fi
if [ -z "$SELECTED" ] || want running; then
  load
  python -m sglang.tune "${COMMON[@]}" --output-dir $R/running --server-args="--max-total-tokens 2048" \
    --grid max-running-requests=4,8,16 --max-concurrency 16 \
    --dataset-name random-mm --num-prompts 32 --random-input-len 128 --random-output-len 96 \
    --random-mm-bucket-config '{(128, 128, 1): 1.0}'
  load
fi
if [ -z "$SELECTED" ] || want repeat; then
  python benchmark/tuning/make_repeat_trace.py --out /tmp/sglang-tune-repeat --requests 24 --images 3 >/dev/null
  load
  python -m sglang.tune "${COMMON[@]}" --output-dir $R/repeat \
    --grid disable-radix-cache=on,off --grid page-size=1,16 --max-concurrency 4 \
    --trace /tmp/sglang-tune-repeat/trace.jsonl
  load
fi
if [ -z "$SELECTED" ] || want transport; then
  load
  python -m sglang.tune "${COMMON[@]}" --output-dir $R/transport \
    --grid SGLANG_MM_SHM_TRANSPORT=0,1 --max-concurrency 8 \
    --dataset-name random-mm --num-prompts 16 --random-input-len 32 --random-output-len 8 \
    --random-mm-base-items-per-request 2 --random-mm-bucket-config '{(1080, 1920, 1): 1.0}'
  load
fi
if [ -z "$SELECTED" ] || want tp; then
  load
  python -m sglang.tune "${COMMON[@]}" --output-dir $R/tp \
    --grid tp-size=1,2 --max-concurrency 4 \
    --dataset-name random-mm --num-prompts 16 --random-input-len 64 --random-output-len 16 \
    --random-mm-bucket-config '{(256, 256, 1): 1.0}'
  load
fi
if [ -z "$SELECTED" ] || want concurrency; then
  load
  python -m sglang.tune "${COMMON[@]}" --output-dir $R/concurrency --max-concurrency 1 4 16 \
    --slo-ttft-p99-ms 500 --slo-tpot-ms 40 \
    --dataset-name random-mm --num-prompts 24 --random-input-len 64 --random-output-len 32 \
    --random-mm-bucket-config '{(256, 256, 1): 1.0}'
  load
fi
