#!/usr/bin/env bash
# Runs the GPU suite on a CUDA machine in one call: install, environment report, tests, benchmarks.
#
#   bash scripts/gpu_check.sh
#
# Environment:
#   WHEELS_DIR      wheels to install offline first (default shared/wheels; skipped when missing)
#   OUT             output folder (default gpu_check_out); the full log is $OUT/gpu_check.log
#   BENCH_TIMEOUT   seconds allowed to each benchmark command (default 1800)
#   BENCH_LIST      benchmark command file (default benchmark/gpu_benchmarks.txt)
#
# Every step runs even after an earlier one failed; the exit status is non-zero when any test or
# benchmark step failed. pip never resolves dependencies or reaches an index here, so the torch of
# the GPU image stays as it is.
set -u

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT" || exit 2

WHEELS_DIR="${WHEELS_DIR:-shared/wheels}"
export OUT="${OUT:-gpu_check_out}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-1800}"
BENCH_LIST="${BENCH_LIST:-benchmark/gpu_benchmarks.txt}"
PYTHON="${PYTHON:-python}"

mkdir -p "$OUT" || exit 2
LOG="$OUT/gpu_check.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

step_names=()
step_codes=()
step_counts=()
failed=0

section() {
    printf '\n===== %s =====\n' "$1"
}

# record NAME RC [counts]: counts=1 makes a non-zero RC fail the whole run.
record() {
    local name="$1" rc="$2" counts="${3:-1}"
    step_names+=("$name")
    step_codes+=("$rc")
    step_counts+=("$counts")
    if [[ "$rc" -ne 0 && "$counts" -eq 1 ]]; then
        failed=1
    fi
}

# pytest exits 5 when nothing was collected (e.g. no GPU-marked test yet): not a failure.
run_pytest() {
    local name="$1"
    shift
    section "$name: $PYTHON -m pytest $*"
    "$PYTHON" -m pytest "$@"
    local rc=$?
    if [[ "$rc" -eq 5 ]]; then
        echo "no tests collected; counted as passed"
        rc=0
    fi
    record "$name" "$rc"
}

# ---- (a) install ----------------------------------------------------------------------------
section "install"
torch_version="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
constraints="$OUT/constraints.txt"
: >"$constraints"
if [[ -n "$torch_version" ]]; then
    echo "torch==$torch_version" >"$constraints"
fi
pip_cmd=("$PYTHON" -m pip install --no-index --disable-pip-version-check -c "$constraints")

if [[ -d "$WHEELS_DIR" ]]; then
    wheels=("$WHEELS_DIR"/*.whl)
    if [[ -e "${wheels[0]}" ]]; then
        echo "installing ${#wheels[@]} wheel(s) from $WHEELS_DIR"
        "${pip_cmd[@]}" --find-links "$WHEELS_DIR" "${wheels[@]}"
        record "install wheels" $? 1
    else
        echo "no wheels in $WHEELS_DIR; skipped"
    fi
else
    echo "$WHEELS_DIR not found; skipped"
fi

pythonpath_extra=()
"${pip_cmd[@]}" --no-deps --no-build-isolation -e .
rc=$?
record "install sglang (editable)" "$rc" 0
if [[ "$rc" -ne 0 ]]; then
    echo "editable install failed; falling back to PYTHONPATH"
    pythonpath_extra+=("$REPO_ROOT")
fi
if [[ -f sgl-kernel/pyproject.toml ]]; then
    "${pip_cmd[@]}" --no-deps --no-build-isolation -e sgl-kernel
    rc=$?
    record "install sgl-kernel (editable)" "$rc" 0
    if [[ "$rc" -ne 0 ]]; then
        echo "editable install of sgl-kernel failed; falling back to PYTHONPATH"
        pythonpath_extra+=("$REPO_ROOT/sgl-kernel/python")
    fi
fi
if [[ ${#pythonpath_extra[@]} -gt 0 ]]; then
    joined="$(IFS=:; echo "${pythonpath_extra[*]}")"
    export PYTHONPATH="$joined${PYTHONPATH:+:$PYTHONPATH}"
fi
if [[ -n "$torch_version" ]]; then
    after="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
    if [[ "$after" != "$torch_version" ]]; then
        echo "ERROR: torch changed during install: $torch_version -> $after"
        record "torch unchanged" 1
    fi
fi

# ---- (b) environment ------------------------------------------------------------------------
section "environment"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi
else
    echo "nvidia-smi not found"
fi
"$PYTHON" - <<'PY'
import sys

import torch

print("python", sys.version.split()[0])
print("torch", torch.__version__, "| cuda build", torch.version.cuda, "| cuda available", torch.cuda.is_available())
for i in range(torch.cuda.device_count()):
    print(f"  cuda:{i}", torch.cuda.get_device_name(i))
try:
    import triton

    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
PY
record "environment report" $? 0

# ---- (c) tests ------------------------------------------------------------------------------
export SGLANG_TEST_DEVICE=cuda
gpu_test_paths=()
for p in test sgl-kernel/tests; do
    [[ -d "$p" ]] && gpu_test_paths+=("$p")
done
run_pytest "gpu tests" -m gpu -q "${gpu_test_paths[@]}"
run_pytest "default suite" -q -x test

# ---- (d) benchmarks -------------------------------------------------------------------------
section "benchmarks ($BENCH_LIST)"
if [[ -f "$BENCH_LIST" ]]; then
    mapfile -t bench_lines <"$BENCH_LIST"
    n_bench=0
    for line in "${bench_lines[@]}"; do
        # Whole-line comments and blank lines are skipped; a trailing comment is left to bash.
        cmd="${line#"${line%%[![:space:]]*}"}"
        [[ -z "$cmd" || "$cmd" == \#* ]] && continue
        n_bench=$((n_bench + 1))
        section "benchmark $n_bench: $cmd"
        timeout "$BENCH_TIMEOUT" bash -c "$cmd" </dev/null
        record "benchmark $n_bench: $cmd" $?
    done
    echo "$n_bench benchmark command(s) run"
else
    echo "$BENCH_LIST not found; skipped"
fi

# ---- summary --------------------------------------------------------------------------------
section "summary"
for i in "${!step_names[@]}"; do
    if [[ "${step_codes[$i]}" -eq 0 ]]; then
        status="ok"
    elif [[ "${step_counts[$i]}" -eq 0 ]]; then
        status="warning (rc=${step_codes[$i]}, not counted)"
    else
        status="FAILED (rc=${step_codes[$i]})"
    fi
    printf '%-60s %s\n' "${step_names[$i]}" "$status"
done
if [[ "$failed" -ne 0 ]]; then
    echo "gpu_check: FAILED"
else
    echo "gpu_check: OK"
fi
exit "$failed"
