#!/usr/bin/env bash
# The GPU checks on a CUDA machine, in stages that each fit one GPU job (at most 600 s, at most 8
# files brought back from $OUT) on a bare machine with no package registry:
#
#   bash scripts/gpu_check.sh --stage first     # THE first call (planned <= 520 s): environment, kernel and
#                                               # parity tests, forward and serving figures, attention kernels
#   bash scripts/gpu_check.sh --stage anchor    # the second call, once first passed (planned <= 520 s): full-depth
#                                               # qwen3-vl-8b/4b with --load-format dummy on the anchors' workloads
#   bash scripts/gpu_check.sh --stage hybrid    # Qwen3.5's GPU path: DeltaNet kernel tests, decode graphs,
#                                               # bench_gdn, one batch
#   bash scripts/gpu_check.sh --stage tests     # gpu-marked tests, then the device-following suite on cuda
#   bash scripts/gpu_check.sh --stage micro     # benchmark/gpu_micro_benchmarks.txt
#   bash scripts/gpu_check.sh --stage serving   # benchmark/gpu_serving_benchmarks.txt, @stage=serving lines
#   bash scripts/gpu_check.sh --stage serving2  # the same list's @stage=serving2 lines
#   bash scripts/gpu_check.sh [--stage all]     # all four in order (a runner without the 600 s limit)
#
# Options:
#   --dry-run       print the plan (one line per step with its budget, then `planned N s, files M`);
#                   runs and installs nothing, needs none of the server's modules
#   --list FILE     take the stage's commands from FILE instead of its own list (tests of this script)
#   --no-install    skip the install and environment steps; only check that the server's modules import
#
# Environment:
#   WHEELS_DIR      wheels installed offline first (default shared/wheels). When the server's modules
#                   (zmq, fastapi, uvicorn, ...) do not import and there are no wheels, the stage stops
#                   at once, naming the folder and the modules.
#   OUT             output folder (default gpu_check_out). A stage leaves exactly: gpu-check-STAGE.log,
#                   summary-STAGE.json (rewritten after every step), results-STAGE.tar.gz (everything the
#                   commands wrote under $RAW, refreshed after every step) and the tests' junit-*.xml.
#   GPU_CACHE       what later jobs on the same machine reuse (default .gpu_cache, git-ignored): generated
#                   models under $GPU_CACHE/models, the commands' raw results under $GPU_CACHE/raw/STAGE
#                   (exported to the commands as $RAW)
#   STAGE_BUDGET    seconds a stage may take, steps included (default 570; 570 per stage for `all`)
#   PYTHON          interpreter (default python)
#
# Every step runs under `timeout` with min(its own budget, what is left of the stage): SIGINT first
# (pytest still writes its junit XML), SIGKILL to the step's process group at the budget, and any
# process the step left behind is killed before the next one starts. A failed step does not stop the
# next ones, except install (nothing could work without it); the exit status is non-zero when a
# counted step failed. pip never resolves dependencies or reaches an index here, and torch is pinned
# to the image's own build. Plan, list format and budgets: scripts/gpu_check_plan.py; the built-in
# stages' steps (first, anchor, hybrid, tests): scripts/gpu_check_stages.py.
set -u

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELPER="$REPO_ROOT/scripts/gpu_check_plan.py"
CALLER_PWD="$PWD"
cd "$REPO_ROOT" || exit 2

STAGE=all LIST="" DRY_RUN=0 INSTALL=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --stage) STAGE="${2:-}"; shift 2 ;;
        --stage=*) STAGE="${1#--stage=}"; shift ;;
        --list) LIST="${2:-}"; shift 2 ;;
        --list=*) LIST="${1#--list=}"; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        --no-install) INSTALL=0; shift ;;
        -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ -n "$LIST" && "$LIST" != /* ]] && LIST="$CALLER_PWD/$LIST"

export PYTHON="${PYTHON:-python}"
export WHEELS_DIR="${WHEELS_DIR:-shared/wheels}"
export OUT="${OUT:-gpu_check_out}"
export GPU_CACHE="${GPU_CACHE:-.gpu_cache}"
plan_args=(plan --stage "$STAGE" --wheels-dir "$WHEELS_DIR")
[[ -n "$LIST" ]] && plan_args+=(--list "$LIST")
[[ "$INSTALL" -eq 0 ]] && plan_args+=(--no-install)

if [[ "$DRY_RUN" -eq 1 ]]; then
    exec "$PYTHON" "$HELPER" "${plan_args[@]}" --format text
fi

plan_tsv="$("$PYTHON" "$HELPER" "${plan_args[@]}" --format tsv)" || exit 2
mapfile -t PLAN <<<"$plan_tsv"
IFS=$'\t' read -r _ default_budget PLANNED _ MIN_START <<<"${PLAN[0]}"
PLAN=("${PLAN[@]:1}")
STAGE_BUDGET="${STAGE_BUDGET:-$default_budget}"

mkdir -p "$OUT" "$GPU_CACHE" || exit 2
OUT="$(cd "$OUT" && pwd)"
GPU_CACHE="$(cd "$GPU_CACHE" && pwd)"
if [[ "$OUT" == "$REPO_ROOT" ]]; then echo "OUT must be a folder of its own, not the repository" >&2; exit 2; fi
export RAW="$GPU_CACHE/raw/$STAGE"
rm -rf "$RAW" && mkdir -p "$RAW" || exit 2
RECORDS="$GPU_CACHE/steps-$STAGE.tsv"
STAMP="$GPU_CACHE/start-$STAGE"
: >"$RECORDS"; : >"$STAMP"
STAGE_T0=$SECONDS

exec > >(tee "$OUT/gpu-check-$STAGE.log") 2>&1

# The checkout itself, whether or not the editable installs work.
export PYTHONPATH="$REPO_ROOT:$REPO_ROOT/sgl-kernel/python${PYTHONPATH:+:$PYTHONPATH}"
export SGLANG_TEST_DEVICE=cuda

section() { printf '\n===== %s =====\n' "$1"; }

# ---- the install and environment steps (run as `bash -c NAME` under the step's timeout) ------------
wheels_state() {
    local dir; dir="$(realpath -m "$WHEELS_DIR")"
    if [[ ! -d "$dir" ]]; then echo "folder $dir does not exist"
    elif ! compgen -G "$dir/*.whl" >/dev/null; then echo "folder $dir holds no .whl files"
    else echo "folder $dir holds $(compgen -G "$dir/*.whl" | wc -l) wheels"; fi
}

gpu_check_modules() {
    local missing
    if missing="$("$PYTHON" "$HELPER" check-modules)"; then echo "the server's modules import"; return 0; fi
    echo "ERROR: the server needs modules that $PYTHON cannot import:"
    printf '  %s\n' "${missing//$'\n'/$'\n'  }"
    echo "Wheels (WHEELS_DIR=$WHEELS_DIR): $(wheels_state)."
    echo "Copy the wheels into a folder of the checkout and pass it as WHEELS_DIR (docs/performance.md,"
    echo "\"Running the GPU checks\")."
    return 3
}

gpu_check_install() {
    local missing torch_version after
    if ! compgen -G "$WHEELS_DIR/*.whl" >/dev/null; then
        # Nothing to install from: fine when every module is already there (a second job on a machine).
        echo "no wheels to install: $(wheels_state)"
        gpu_check_modules
        return
    fi
    missing="$("$PYTHON" "$HELPER" check-modules)" || echo "not importable yet (installing): ${missing//$'\n'/; }"
    torch_version="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
    local constraints="$GPU_CACHE/constraints.txt"
    if [[ -n "$torch_version" ]]; then echo "torch==$torch_version" >"$constraints"; else : >"$constraints"; fi
    local pip_cmd=("$PYTHON" -m pip install -q --no-index --disable-pip-version-check -c "$constraints")
    # --no-deps: the folder carries every wheel the image lacks, and a resolver pass over the image's
    # own packages can refuse the whole set over one pin it cannot satisfy offline (xgrammar 0.2.8 did),
    # installing nothing. The module check below is what decides.
    echo "+ pip install --no-index --no-deps $WHEELS_DIR/*.whl (torch pinned to ${torch_version:-none})"
    "${pip_cmd[@]}" --no-deps "$WHEELS_DIR"/*.whl || echo "WARNING: pip failed (rc=$?)"
    "${pip_cmd[@]}" --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
        || echo "editable install of . failed; the checkout is on PYTHONPATH"
    "${pip_cmd[@]}" --no-deps --no-build-isolation -e sgl-kernel >/dev/null 2>&1 \
        || echo "editable install of sgl-kernel failed; sgl-kernel/python is on PYTHONPATH"
    gpu_check_modules || return
    if [[ -n "$torch_version" ]]; then
        after="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
        if [[ "$after" != "$torch_version" ]]; then
            echo "ERROR: torch changed during install: $torch_version -> $after"; return 4
        fi
    fi
}

gpu_check_environment() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    "$PYTHON" - <<'PY'
import sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| available", torch.cuda.is_available())
for i in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(i)
    cap = torch.cuda.get_device_capability(i)
    print(f"  cuda:{i}", torch.cuda.get_device_name(i), f"sm_{cap[0]}{cap[1]}",
          f"free {free / 2**30:.1f} of {total / 2**30:.1f} GiB")
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
PY
    local missing
    if missing="$("$PYTHON" "$HELPER" check-modules)"; then echo "every required module imports"
    else echo "missing modules (their wheels): ${missing//$'\n'/; }"; fi
}
export HELPER
export -f wheels_state gpu_check_modules gpu_check_install gpu_check_environment

# ---- bookkeeping after every step: strays into $RAW, the results tarball, the summary ---------------
failed=0

# Files a command wrote straight under $OUT (not one of this script's outputs) would cost the job's
# file limit: they go into the tarball instead.
collect_strays() {
    local f rel
    while IFS= read -r -d '' f; do
        rel="${f#"$OUT"/}"
        mkdir -p "$RAW/stray/$(dirname "$rel")" && mv -f "$f" "$RAW/stray/$rel" \
            && echo "moved \$OUT/$rel into the results"
    done < <(find "$OUT" -type f -newer "$STAMP" ! -name 'gpu-check-*.log' ! -name 'summary-*.json' \
                  ! -name 'results-*.tar.gz' ! -name 'junit-*.xml' ! -name '.*.part' -print0)
    find "$OUT" -mindepth 1 -type d -empty -newer "$STAMP" -delete 2>/dev/null
}

write_summary() {  # [--complete --table]
    "$PYTHON" "$HELPER" summary --records "$RECORDS" --out "$OUT/summary-$STAGE.json" --stage "$STAGE" \
        --stage-budget "$STAGE_BUDGET" --planned "$PLANNED" --elapsed $((SECONDS - STAGE_T0)) "$@"
}

# record NAME RC SECONDS BUDGET GIVEN COUNTS STATUS
record() {
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RECORDS"
    if [[ "$2" -ne 0 && "$6" -eq 1 ]]; then failed=1; fi
    collect_strays
    local part="$OUT/.results-$STAGE.tar.gz.part"
    tar -czf "$part" -C "$RAW" . && mv -f "$part" "$OUT/results-$STAGE.tar.gz"
    write_summary
}

# run_step INDEX BUDGET GIVEN COUNTS PYTEST NAME CMD: one step under its hard budget.
run_step() {
    local idx="$1" budget="$2" given="$3" counts="$4" is_pytest="$5" name="$6" cmd="$7"
    local grace=$((given / 4)) note=""
    ((grace > 15)) && grace=15
    ((grace < 1)) && grace=1
    ((given < budget)) && note=" (cut from ${budget} s: what is left of the stage)"
    section "$name  [budget ${given} s$note]"
    echo "+ $cmd"
    local t0=$SECONDS rc status
    GPU_CHECK_STEP="$$-$idx" timeout -s INT -k "$grace" $((given - grace)) \
        "$PYTHON" "$HELPER" exec -- bash -c "$cmd" </dev/null
    rc=$?
    "$PYTHON" "$HELPER" reap "GPU_CHECK_STEP=$$-$idx"
    if [[ "$rc" -eq 5 && "$is_pytest" -eq 1 ]]; then echo "no tests collected; counted as passed"; rc=0; fi
    if [[ "$rc" -eq 124 || "$rc" -eq 137 ]]; then
        status="timed out"; [[ -n "$note" ]] && status="timed out (stage budget)"
        echo "TIMED OUT after $((SECONDS - t0)) s (budget ${given} s)"
    elif [[ "$rc" -eq 0 ]]; then status="ok"
    elif [[ "$counts" -eq 0 ]]; then status="warning"
    else status="failed"; fi
    record "$name" "$rc" $((SECONDS - t0)) "$budget" "$given" "$counts" "$status"
    return "$rc"
}

# ---- the stage ------------------------------------------------------------------------------------
echo "gpu_check --stage $STAGE: ${#PLAN[@]} steps, planned $PLANNED s, stage budget $STAGE_BUDGET s, OUT=$OUT"
aborted=""
for i in "${!PLAN[@]}"; do
    IFS=$'\t' read -r budget counts fatal is_pytest name cmd <<<"${PLAN[$i]}"
    left=$((STAGE_BUDGET - (SECONDS - STAGE_T0)))
    if [[ -n "$aborted" ]]; then
        record "$name" 1 0 "$budget" 0 0 "not started ($aborted failed)"
    elif ((left < MIN_START)); then
        echo "not started (stage budget spent): $name"
        record "$name" 1 0 "$budget" 0 "$counts" "not started (stage budget spent)"
    elif ! run_step "$i" "$budget" $((budget < left ? budget : left)) "$counts" "$is_pytest" "$name" "$cmd" \
            && [[ "$fatal" -eq 1 ]]; then
        aborted="$name"
    fi
done

section "summary ($STAGE, $((SECONDS - STAGE_T0)) s of $STAGE_BUDGET s)"
write_summary --complete --table
if [[ -n "$aborted" ]]; then echo "gpu_check ($STAGE): STOPPED ($aborted failed)"
elif [[ "$failed" -ne 0 ]]; then echo "gpu_check ($STAGE): FAILED"
else echo "gpu_check ($STAGE): OK"; fi
exit "$failed"
