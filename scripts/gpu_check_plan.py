"""The plan, budgets and bookkeeping behind ``scripts/gpu_check.sh`` (standard library only).

A GPU job runs at most 600 s and brings back at most 8 files from ``$OUT``. Each stage of
``gpu_check.sh`` therefore plans at most ``STAGE_LIMIT`` seconds, install and model generation
included, and leaves a fixed set of files: its log, its summary JSON, one tarball of everything its
commands wrote under ``$RAW``, and one junit XML per pytest step.

Subcommands (``gpu_check.sh`` calls them; each is usable on its own):

    plan --stage S [--list FILE] [--no-install] [--format text|tsv]   the stage's steps and budgets
    check-modules                       names the modules the server needs that this Python lacks
    summary --records F --out F ...     writes the summary JSON (atomically) from the step records
    exec -- CMD...                      runs CMD with SIGINT and SIGPIPE at their defaults
    reap KEY=VALUE                      SIGKILLs every process whose environment holds KEY=VALUE

Benchmark list files: one shell command per line, led by ``@key=value`` tokens:
``@budget=SECONDS`` (required: the most the command may run) and ``@stage=NAME`` (optional: the
line runs only in that stage; without it, in every stage that reads the list).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_report import format_table, reap, write_summary  # noqa: E402,F401  (CLI; tests use them here)

REPO = Path(__file__).resolve().parents[1]

# What one stage may plan: a job is killed at 600 s; 30 s stay for start-up, summary and slack.
STAGE_LIMIT = 570
# A step is not started when less than this is left of its stage.
MIN_START_S = 3

STAGES = ("tests", "micro", "serving", "serving2")
# `first` is the one call a session with a GPU makes before anything else: the most valuable answers of
# the other stages, each cut to fit FIRST_LIMIT (a session's 15 minutes of device time also pay for the
# machine's start-up and give-back). `all` runs the four full stages, not `first`.
FIRST = "first"
FIRST_LIMIT = 520
# `anchor`: the session's second call, once `first` passed: full-depth replicas (weights made on the GPU by
# --load-format dummy) on the anchors' workloads, priority ordered, in one call of the same size.
ANCHOR = "anchor"
# `hybrid`: Qwen3.5's GPU path (issue 51): the Gated DeltaNet kernels' gpu tests, hybrid decode CUDA graphs
# against eager, the kernels' microbenchmark, and one static batch on a 4-layer qwen3.5-4b replica made on
# the GPU (--load-format dummy)
HYBRID = "hybrid"
BUILTIN_STAGES = (FIRST, ANCHOR, HYBRID)
ALL_STAGES = BUILTIN_STAGES + STAGES + ("all",)
LISTS = {
    "micro": "benchmark/gpu_micro_benchmarks.txt",
    "serving": "benchmark/gpu_serving_benchmarks.txt",
    "serving2": "benchmark/gpu_serving_benchmarks.txt",
}

INSTALL_BUDGET = 50  # offline wheels (~30 s) + editable installs + module checks
ENV_BUDGET = 20  # cold imports of torch and triton took 9 s on an H200 (first call of 2026-11-26)
CHECK_BUDGET = 45  # --no-install: the module check alone (its imports took 16 s on 2 busy CPU cores)

# Import name -> wheel (distribution) name: what the server, its clients and the tests import that
# the GPU image may lack (docs: /work/shared/wheels/README.md lists what the image has).
REQUIRED_MODULES = {
    "zmq": "pyzmq",
    "fastapi": "fastapi",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "pydantic": "pydantic",
    "pydantic_core": "pydantic-core",
    "orjson": "orjson",
    "msgspec": "msgspec",
    "blake3": "blake3",
    "pybase64": "pybase64",
    "openai": "openai",
    "xxhash": "xxhash",
    "aiohttp": "aiohttp",
    "xgrammar": "xgrammar",  # constrained output: the tokenizer checks every grammar with it
    "regex": "regex",  # stop_regex
    "jsonschema": "jsonschema",  # the structured-output and tool-call tests validate with it
    "av": "av",  # PyAV: video input (without it every video test skips)
}
# What the GPU image has already (the wheels README): a test may importorskip these.
IMAGE_MODULES = ("torch", "triton", "transformers", "torchvision", "numpy", "PIL", "safetensors", "tokenizers",
                 "requests", "pytest", "hypothesis")
# Extra import names (comma or space separated) that check-modules also requires.
EXTRA_MODULES_ENV = "GPU_CHECK_REQUIRED_MODULES"

TSV_FIELDS = ("budget", "counts", "fatal", "pytest", "name", "command")


class PlanError(ValueError):
    pass


@dataclass
class Step:
    name: str
    budget: int
    command: str  # run by `bash -c` from the repository root (shell functions of gpu_check.sh included)
    counts: bool = True  # a failure fails the stage
    fatal: bool = False  # a failure stops the stage (nothing after it could work)
    pytest: bool = False  # exit status 5 (nothing collected) counts as passed
    outputs: tuple[str, ...] = ()  # files the step writes directly under $OUT
    display: str = ""

    def tsv(self) -> str:
        cells = [str(self.budget), str(int(self.counts)), str(int(self.fatal)), str(int(self.pytest)),
                 self.name, self.command]
        for cell in cells:
            if "\t" in cell or "\n" in cell:
                raise PlanError(f"tab or newline in step {self.name!r}")
        return "\t".join(cells)


@dataclass
class Plan:
    stage: str
    steps: list[Step]
    stage_budget: int
    outputs: list[str] = field(default_factory=list)

    @property
    def planned(self) -> int:
        return sum(s.budget for s in self.steps)

    @property
    def files(self) -> int:
        return len(self.outputs)


# ----------------------------------------------------------------------------- steps


def prelude(install: bool, wheels_dir: str) -> list[Step]:
    if not install:
        return [Step("check modules", CHECK_BUDGET, "gpu_check_modules", fatal=True,
                     display="the modules the server needs import (no install)")]
    return [
        Step("install", INSTALL_BUDGET, "gpu_check_install", fatal=True,
             display=f"check the server's modules; pip install --no-index {wheels_dir}/*.whl "
                     "(torch pinned); editable . and sgl-kernel; check again"),
        Step("environment", ENV_BUDGET, "gpu_check_environment", counts=False,
             display="nvidia-smi, python/torch/cuda/triton versions"),
    ]


def tests_steps() -> list[Step]:
    # The 1,000-request CUDA IPC e2e is gpu-marked; the suite part is the device-following tests
    # (model parity on cuda, server fixtures with --device cuda, NCCL start-up, scheduler e2e).
    return [
        Step("tests: gpu-marked", 180,
             '"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/junit-gpu-marked.xml" '
             "test sgl-kernel/tests",
             pytest=True, outputs=("junit-gpu-marked.xml",)),
        Step("tests: suite on cuda", 320,
             '"$PYTHON" -m pytest -q -x -p no:cacheprovider -m "not slow" --junitxml="$OUT/junit-cuda.xml" '
             "test/unit/models test/unit/model_loader test/unit/layers test/e2e",
             pytest=True, outputs=("junit-cuda.xml",)),
    ]


# the short replica of stage first: qwen3-vl-4b's widths and vision tower, 4 of its 36 text layers
FIRST_MODEL = '"$GPU_CACHE/models/qwen3-vl-4b-4l"'


def first_steps() -> list[Step]:
    """Stage `first`, in the order of what a first GPU call must answer: are the kernels and the engine
    right on CUDA, how fast is a forward against its floor, how fast does it serve, how fast are the
    attention kernels at the real shapes."""
    junit = '--junitxml="$OUT/junit-first-{}.xml"'
    return [
        Step("first: kernels", 100,
             '"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider ' + junit.format("kernels")
             + " sgl-kernel/tests test/unit/layers/test_vision_pos_embed.py "
               "test/unit/model_executor/test_cuda_graph_runner.py test/unit/model_executor/test_vit_cuda_graph_runner.py",
             pytest=True, outputs=("junit-first-kernels.xml",),
             display="gpu-marked kernel tests against their references (attention, sampling, pos-embed, "
                     "fp8/MoE when present), decode and ViT CUDA graph runners"),
        Step("first: parity", 100,
             '"$PYTHON" -m pytest -q -x -p no:cacheprovider -m "not slow" ' + junit.format("parity")
             + " test/unit/models/test_model_parity.py test/e2e/test_openai_api.py "
               '-k "test_model_parity or (greedy_chat_matches_transformers and default) or stream_equals"',
             pytest=True, outputs=("junit-first-parity.xml",),
             display="model parity with transformers on cuda; greedy chat parity through the server on "
                     "qwen3-vl-tiny (CUDA graphs on)"),
        Step("first: replica", 45,
             '"$PYTHON" -m sglang.testing.make_model --preset qwen3-vl-4b --num-layers 4 --dtype bfloat16 '
             f"--out {FIRST_MODEL} --no-progress",
             display="qwen3-vl-4b with 4 text layers (real widths, full vision tower), bf16"),
        Step("first: forward", 75,
             f'"$PYTHON" benchmark/performance/bench_forward.py --model-path {FIRST_MODEL} --device cuda '
             '--dtype bfloat16 --decode-batch-sizes 1,32,64 --repeat 2 --output "$RAW/first-forward.json"',
             display="decode step vs the bandwidth floor, prefill tok/s and MFU, ViT MFU"),
        Step("first: serving", 90,
             f'"$PYTHON" benchmark/multimodal/run_hash_serving_ab.py --modes on --model-path {FIRST_MODEL} '
             "--device cuda --dtype bfloat16 --num-prompts 384 --max-concurrency 16 --random-input-len 128 "
             '--random-output-len 64 --warmup 4 --output "$RAW/first-serving.json"',
             display="image chat (one 1280x720 JPEG each), concurrency 16: req/s, TTFT"),
        Step("first: attention", 35,
             '"$PYTHON" sgl-kernel/benchmark/bench_attention.py --shapes report --iters 10 '
             '--out "$RAW/first-attention.jsonl"',
             display="Triton decode and extend attention vs SDPA at every preset's text shape"),
    ]


# full-depth replicas of stage anchor: config, tokenizer and processor files only; weights made on the GPU
ANCHOR_8B = '"$GPU_CACHE/models/qwen3-vl-8b-config"'
ANCHOR_4B = '"$GPU_CACHE/models/qwen3-vl-4b-config"'
# the #36411 shape as far as it is published (unique 1280x720-class images, Qwen3-VL, one H100), with
# upstream's usual image-benchmark lengths (128 in, 256 out), scaled in count to fit the call
ANCHOR_SERVING = ("--device cuda --dtype bfloat16 --num-prompts 256 --max-concurrency 64 --random-input-len 128 "
                  "--random-output-len 256 --warmup 8")


def anchor_steps() -> list[Step]:
    """Stage `anchor`, most valuable first: the decode step and the ViT of a full-depth 8B against their
    floors, then serving with the overlap scheduler on and off (the A/B), then the seed-002 4B workload."""
    dummy = "--server-args '--load-format dummy{}'"
    return [
        Step("anchor: configs", 15,
             f'"$PYTHON" -m sglang.testing.make_model --preset qwen3-vl-8b --config-only --out {ANCHOR_8B} && '
             f'"$PYTHON" -m sglang.testing.make_model --preset qwen3-vl-4b --config-only --out {ANCHOR_4B}',
             fatal=True, display="qwen3-vl-8b and qwen3-vl-4b config, tokenizer and processor files (no weights)"),
        Step("anchor: forward", 130,
             f'"$PYTHON" benchmark/performance/bench_forward.py --model-path {ANCHOR_8B} --load-format dummy '
             "--device cuda --dtype bfloat16 --decode-batch-sizes 1,32,128 --prefill-batch-sizes 1 --vit-images 20 "
             '--vit-image-size 960x1280 --mm-attention-backends triton,sdpa --repeat 2 --output "$RAW/anchor-forward.json"',
             display="full-depth qwen3-vl-8b (dummy bf16): decode ms at batch 1/32/128 vs the bandwidth floor; "
                     "ViT MFU on 20 x 960x1280 under the triton and sdpa ViT attention (head_dim 72)"),
        Step("anchor: serving overlap", 110,
             f'"$PYTHON" benchmark/multimodal/run_hash_serving_ab.py --modes on --model-path {ANCHOR_8B} '
             f'{dummy.format("")} {ANCHOR_SERVING} --output "$RAW/anchor-serving-overlap.json"',
             display="#36411-shaped image serving on qwen3-vl-8b: req/s, TTFT median and p99, overlap scheduler on"),
        Step("anchor: serving no overlap", 110,
             f'"$PYTHON" benchmark/multimodal/run_hash_serving_ab.py --modes on --model-path {ANCHOR_8B} '
             f'{dummy.format(" --disable-overlap-schedule")} {ANCHOR_SERVING} '
             '--output "$RAW/anchor-serving-no-overlap.json"',
             display="the same with --disable-overlap-schedule (the A/B)"),
        Step("anchor: seed-002 4B", 80,
             f'"$PYTHON" benchmark/multimodal/run_hash_serving_ab.py --modes on --model-path {ANCHOR_4B} '
             f'{dummy.format("")} {ANCHOR_SERVING} --output "$RAW/anchor-serving-4b.json"',
             display="the seed-002 workload on a full-depth qwen3-vl-4b (dummy), if time is left"),
    ]


HYBRID_4B = '"$GPU_CACHE/models/qwen3.5-4b-4l-config"'


def hybrid_steps() -> list[Step]:
    return [
        Step("hybrid: kernel tests", 150,
             '"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/junit-hybrid-kernels.xml" '
             "sgl-kernel/tests/test_gdn_chunk_kernel.py sgl-kernel/tests/test_gdn_recurrent_kernel.py "
             "sgl-kernel/tests/test_gdn_conv_kernel.py",
             pytest=True, outputs=("junit-hybrid-kernels.xml",),
             display="the Gated DeltaNet kernels in bf16 at Qwen3.5 shapes, and the decode step under CUDA-graph "
                     "capture against eager"),
        Step("hybrid: decode graphs", 80,
             '"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/junit-hybrid-graphs.xml" '
             "test/unit/model_executor/test_hybrid_decode_graph.py",
             pytest=True, outputs=("junit-hybrid-graphs.xml",),
             display="qwen3.5-tiny decode through captured CUDA graphs (GDN state slots as graph inputs, padding "
                     "to the pool's padding row) against eager: tokens and states, float32 then bf16"),
        Step("hybrid: bench_gdn", 120,
             '"$PYTHON" sgl-kernel/benchmark/bench_gdn.py --presets qwen3.5-4b,qwen3.5-27b --tps 1,8 '
             '--out "$RAW/hybrid-gdn.jsonl"',
             display="chunk kernel TFLOP/s, recurrent step GB/s against the bandwidth floor"),
        Step("hybrid: one batch", 90,
             f'"$PYTHON" -m sglang.testing.make_model --preset qwen3.5-4b --num-layers 4 --config-only --out {HYBRID_4B} '
             f'&& "$PYTHON" -m sglang.bench_one_batch --model-path {HYBRID_4B} --load-format dummy --device cuda '
             '--dtype bfloat16 --batch-size 4 --output-len 16 --json > "$RAW/hybrid-one-batch.json"',
             display="bench_one_batch on a 4-layer qwen3.5-4b replica (dummy bf16 weights): prefill and decode ms"),
    ]


_TOKEN = re.compile(r"@([a-z_]+)=(\S+)")


def parse_list(path: Path, stage: str) -> list[Step]:
    """The list's lines for ``stage``: ``@budget=S [@stage=NAME] command``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PlanError(f"cannot read list {path}: {e.strerror}") from None
    steps = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{lineno}"
        if "\t" in line:
            raise PlanError(f"{where}: tab in a command (use spaces)")
        opts: dict[str, str] = {}
        while (m := _TOKEN.match(line)) is not None:
            key, value = m.groups()
            if key not in ("budget", "stage"):
                raise PlanError(f"{where}: unknown token @{key}= (known: @budget=, @stage=)")
            if key in opts:
                raise PlanError(f"{where}: @{key}= given twice")
            opts[key] = value
            line = line[m.end():].lstrip()
        if "budget" not in opts:
            raise PlanError(f"{where}: no @budget=SECONDS token at the start of the line")
        if not opts["budget"].isdigit() or int(opts["budget"]) < 2:
            raise PlanError(f"{where}: @budget= must be a whole number of seconds >= 2")
        if "stage" in opts and opts["stage"] not in BUILTIN_STAGES + STAGES:
            raise PlanError(f"{where}: unknown @stage={opts['stage']} (stages: {', '.join(BUILTIN_STAGES + STAGES)})")
        if not line:
            raise PlanError(f"{where}: no command after the tokens")
        if opts.get("stage", stage) != stage:
            continue
        steps.append(Step(f"{stage} {len(steps) + 1}: {line}", int(opts["budget"]), line))
    return steps


def stage_steps(stage: str, list_path: Path | None) -> list[Step]:
    if list_path is not None:
        return parse_list(list_path, stage)
    if stage == "tests":
        return tests_steps()
    if stage == FIRST:
        return first_steps()
    if stage == ANCHOR:
        return anchor_steps()
    if stage == HYBRID:
        return hybrid_steps()
    return parse_list(REPO / LISTS[stage], stage)


def build_plan(stage: str, list_path: Path | None = None, install: bool = True,
               wheels_dir: str = "shared/wheels") -> Plan:
    if stage not in ALL_STAGES:
        raise PlanError(f"unknown stage {stage!r} ({'|'.join(ALL_STAGES)})")
    steps = prelude(install, wheels_dir)
    if stage == "all":
        if list_path is not None:
            raise PlanError("--list names the commands of one stage; not with --stage all")
        # One run: a command two stages share (the model generation) runs once.
        for s in STAGES:
            steps += [st for st in stage_steps(s, None) if st.command not in {p.command for p in steps}]
        budget = STAGE_LIMIT * len(STAGES)
    else:
        steps += stage_steps(stage, list_path)
        budget = FIRST_LIMIT if stage in BUILTIN_STAGES else STAGE_LIMIT
    outputs = [f"gpu-check-{stage}.log", f"summary-{stage}.json", f"results-{stage}.tar.gz"]
    for s in steps:
        outputs += [o for o in s.outputs if o not in outputs]
    return Plan(stage, steps, budget, outputs)


def format_text(plan: Plan) -> str:
    lines = [f"gpu_check --stage {plan.stage}: dry run, nothing is run; stage budget {plan.stage_budget} s"]
    width = max((len(s.name) for s in plan.steps if len(s.name) <= 28), default=10)
    for s in plan.steps:
        flags = [] if s.counts else ["not counted"]
        if s.fatal:
            flags.append("stops the stage on failure")
        name = s.name if len(s.name) <= 28 else s.name.split(":", 1)[0]
        what = s.display or s.command
        lines.append(f"{s.budget:5d} s  {name:<{width}}  {what}" + (f"  [{', '.join(flags)}]" if flags else ""))
    lines.append(f"files under $OUT: {' '.join(plan.outputs)}")
    if plan.planned > plan.stage_budget:
        lines.append(f"WARNING: the plan exceeds the stage budget of {plan.stage_budget} s")
    lines.append(f"planned {plan.planned} s, files {plan.files}")
    return "\n".join(lines)


def format_tsv(plan: Plan) -> str:
    head = f"#plan\t{plan.stage_budget}\t{plan.planned}\t{plan.files}\t{MIN_START_S}"
    return "\n".join([head] + [s.tsv() for s in plan.steps])


# ----------------------------------------------------------------------------- modules


def required_modules() -> dict[str, str]:
    mods = dict(REQUIRED_MODULES)
    for name in re.split(r"[,\s]+", os.environ.get(EXTRA_MODULES_ENV, "")):
        if name:
            mods.setdefault(name, name)
    return mods


def missing_modules() -> list[str]:
    """One line per required module that does not import: 'name (wheel dist): error'."""
    out = []
    for mod, dist in required_modules().items():
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any failure to import is a missing module here
            out.append(f"{mod} (wheel {dist}): {type(e).__name__}: {e}")
    return out


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exec"]:
        cmd = argv[2:] if argv[1:2] == ["--"] else argv[1:]
        if not cmd:
            print("exec: no command", file=sys.stderr)
            return 2
        # A shell started in the background ignores SIGINT, and Python ignores SIGPIPE: give the
        # command both at their defaults, so that the timeout's SIGINT reaches pytest (junit XML).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.execvp(cmd[0], cmd)

    ap = argparse.ArgumentParser(prog="gpu_check_plan.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--stage", required=True)
    p.add_argument("--list", type=Path)
    p.add_argument("--no-install", action="store_true")
    p.add_argument("--wheels-dir", default=os.environ.get("WHEELS_DIR", "shared/wheels"))
    p.add_argument("--format", choices=("text", "tsv"), default="text")
    sub.add_parser("check-modules")
    s = sub.add_parser("summary")
    s.add_argument("--records", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--stage", required=True)
    s.add_argument("--stage-budget", type=int, required=True)
    s.add_argument("--planned", type=int, required=True)
    s.add_argument("--elapsed", type=int, required=True)
    s.add_argument("--complete", action="store_true")
    s.add_argument("--table", action="store_true", help="also print the steps as a table")
    r = sub.add_parser("reap")
    r.add_argument("tag", help="KEY=VALUE")
    args = ap.parse_args(argv)

    if args.cmd == "plan":
        try:
            plan = build_plan(args.stage, args.list, not args.no_install, args.wheels_dir)
        except PlanError as e:
            print(f"gpu_check: {e}", file=sys.stderr)
            return 2
        if args.format == "tsv":
            print(format_tsv(plan))
            return 0
        print(format_text(plan))
        return 1 if plan.planned > plan.stage_budget else 0
    if args.cmd == "check-modules":
        missing = missing_modules()
        for line in missing:
            print(line)
        return 1 if missing else 0
    if args.cmd == "summary":
        summary = write_summary(args.records, args.out, args.stage, args.stage_budget, args.planned,
                                args.elapsed, args.complete)
        if args.table:
            print(format_table(summary))
        return 0
    if args.cmd == "reap":
        killed = reap(args.tag)
        if killed:
            print(f"killed {len(killed)} process(es) left behind: {' '.join(map(str, killed))}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
