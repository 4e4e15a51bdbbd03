#!/usr/bin/env bash
# The GPU suite on a CUDA machine, in stages that each fit one 10-minute call on a bare machine
# with no package registry:
#
#   bash scripts/gpu_check.sh --stage tests     # gpu-marked tests, then the device-following suite on cuda
#   bash scripts/gpu_check.sh --stage micro     # benchmark/gpu_micro_benchmarks.txt
#   bash scripts/gpu_check.sh --stage serving   # benchmark/gpu_serving_benchmarks.txt
#   bash scripts/gpu_check.sh [--stage all]     # the three in order
#
# Environment:
#   WHEELS_DIR      wheels installed offline before anything else (default shared/wheels; skipped if missing)
#   OUT             output folder (default gpu_check_out): gpu_check.log, summary.json, junit XML, benchmark JSON
#   BENCH_TIMEOUT   seconds allowed to one benchmark command (default 540)
#   STAGE_BUDGET    seconds after which a stage starts no new command (default 540)
#
# Every step runs even after an earlier one failed; the exit status is non-zero when a counted step
# failed. pip never resolves dependencies or reaches an index here, and torch is pinned to the
# image's own build, so the GPU image's torch stays as it is.
set -u

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT" || exit 2

STAGE=all
while [[ $# -gt 0 ]]; do
    case "$1" in
        --stage) STAGE="${2:-}"; shift 2 ;;
        --stage=*) STAGE="${1#--stage=}"; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (use --stage tests|micro|serving|all)" >&2; exit 2 ;;
    esac
done
case "$STAGE" in tests|micro|serving|all) ;; *) echo "unknown stage: $STAGE (tests|micro|serving|all)" >&2; exit 2 ;; esac

WHEELS_DIR="${WHEELS_DIR:-shared/wheels}"
export OUT="${OUT:-gpu_check_out}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-540}"
STAGE_BUDGET="${STAGE_BUDGET:-540}"
PYTHON="${PYTHON:-python}"

mkdir -p "$OUT" || exit 2
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1

step_names=()
step_codes=()
step_counts=()
step_secs=()
failed=0

section() { printf '\n===== %s =====\n' "$1"; }

# record NAME RC SECONDS [counts]: counts=1 makes a non-zero RC fail the run.
record() {
    local name="$1" rc="$2" secs="$3" counts="${4:-1}"
    step_names+=("$name"); step_codes+=("$rc"); step_secs+=("$secs"); step_counts+=("$counts")
    if [[ "$rc" -ne 0 && "$counts" -eq 1 ]]; then failed=1; fi
}

# run_step NAME COUNTS CMD...: runs, times and records one step.
run_step() {
    local name="$1" counts="$2"; shift 2
    section "$name"
    local t0=$SECONDS
    "$@"
    local rc=$?
    # pytest exits 5 when it collected nothing: a stage with no such test is not a failure
    if [[ "$rc" -eq 5 && "$1" == "$PYTHON" && "${2:-}" == "-m" && "${3:-}" == "pytest" ]]; then
        echo "no tests collected; counted as passed"; rc=0
    fi
    record "$name" "$rc" $((SECONDS - t0)) "$counts"
    return 0
}

# ---- install (every stage: a fresh machine may get any stage first) -------------------------
install() {
    local torch_version constraints
    torch_version="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
    constraints="$OUT/constraints.txt"
    : >"$constraints"
    [[ -n "$torch_version" ]] && echo "torch==$torch_version" >"$constraints"
    local pip_cmd=("$PYTHON" -m pip install -q --no-index --disable-pip-version-check -c "$constraints")
    if compgen -G "$WHEELS_DIR/*.whl" >/dev/null; then
        run_step "install wheels from $WHEELS_DIR" 1 "${pip_cmd[@]}" --find-links "$WHEELS_DIR" "$WHEELS_DIR"/*.whl
    else
        echo "no wheels in $WHEELS_DIR; skipped"
    fi
    local extra=()
    "${pip_cmd[@]}" --no-deps --no-build-isolation -e . || extra+=("$REPO_ROOT")
    "${pip_cmd[@]}" --no-deps --no-build-isolation -e sgl-kernel || extra+=("$REPO_ROOT/sgl-kernel/python")
    if [[ ${#extra[@]} -gt 0 ]]; then
        echo "editable install failed for ${extra[*]}; using PYTHONPATH"
        export PYTHONPATH="$(IFS=:; echo "${extra[*]}")${PYTHONPATH:+:$PYTHONPATH}"
    fi
    if [[ -n "$torch_version" ]]; then
        local after
        after="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
        if [[ "$after" != "$torch_version" ]]; then
            echo "ERROR: torch changed during install: $torch_version -> $after"
            record "torch unchanged" 1 0
        fi
    fi
    section "environment"
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    "$PYTHON" - <<'PY'
import sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| available", torch.cuda.is_available())
for i in range(torch.cuda.device_count()):
    print(f"  cuda:{i}", torch.cuda.get_device_name(i))
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
PY
}

# ---- stages ---------------------------------------------------------------------------------
export SGLANG_TEST_DEVICE=cuda

stage_tests() {
    run_step "tests: gpu-marked" 1 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider \
        --junitxml="$OUT/tests-gpu-marked.xml" test sgl-kernel/tests
    # The device-following part of the default suite: model parity on cuda, server fixtures with
    # --device cuda, NCCL start-up, scheduler e2e cases (CPU-only cases skip with their reason).
    run_step "tests: suite on cuda" 1 timeout 420 "$PYTHON" -m pytest -q -x -p no:cacheprovider -m "not slow" \
        --junitxml="$OUT/tests-cuda.xml" test/unit/models test/unit/model_loader test/unit/layers test/e2e
}

run_bench_list() {
    local list="$1" stage="$2" start=$SECONDS n=0
    if [[ ! -f "$list" ]]; then echo "$list not found"; record "$stage: list" 1 0; return; fi
    while IFS= read -r line || [[ -n "$line" ]]; do
        local cmd="${line#"${line%%[![:space:]]*}"}"
        [[ -z "$cmd" || "$cmd" == \#* ]] && continue
        n=$((n + 1))
        if (( SECONDS - start > STAGE_BUDGET )); then
            echo "stage budget of ${STAGE_BUDGET}s spent; not started: $cmd"
            record "$stage $n (not started: budget)" 1 0
            continue
        fi
        run_step "$stage $n: $cmd" 1 timeout "$BENCH_TIMEOUT" bash -c "$cmd" </dev/null
    done <"$list"
    echo "$n command(s) in $list"
}

install
case "$STAGE" in
    tests) stage_tests ;;
    micro) run_bench_list benchmark/gpu_micro_benchmarks.txt micro ;;
    serving) run_bench_list benchmark/gpu_serving_benchmarks.txt serving ;;
    all) stage_tests; run_bench_list benchmark/gpu_micro_benchmarks.txt micro
         run_bench_list benchmark/gpu_serving_benchmarks.txt serving ;;
esac

# ---- summary --------------------------------------------------------------------------------
section "summary ($STAGE)"
{
    printf '{"stage": "%s", "failed": %d, "steps": [' "$STAGE" "$failed"
    for i in "${!step_names[@]}"; do
        [[ $i -gt 0 ]] && printf ', '
        name="${step_names[$i]//\\/\\\\}"; name="${name//\"/\\\"}"
        printf '{"name": "%s", "rc": %d, "seconds": %d, "counts": %d}' "$name" "${step_codes[$i]}" "${step_secs[$i]}" "${step_counts[$i]}"
    done
    printf ']}\n'
} >"$OUT/summary-$STAGE.json"
for i in "${!step_names[@]}"; do
    if [[ "${step_codes[$i]}" -eq 0 ]]; then status="ok"
    elif [[ "${step_counts[$i]}" -eq 0 ]]; then status="warning (rc=${step_codes[$i]}, not counted)"
    else status="FAILED (rc=${step_codes[$i]})"; fi
    printf '%-70.70s %5ss  %s\n' "${step_names[$i]}" "${step_secs[$i]}" "$status"
done
if [[ "$failed" -ne 0 ]]; then echo "gpu_check ($STAGE): FAILED"; else echo "gpu_check ($STAGE): OK"; fi
exit "$failed"
