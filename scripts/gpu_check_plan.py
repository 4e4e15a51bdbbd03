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

The built-in stages' steps (``tests``, ``first``, ``anchor``, ``hybrid``) are ``gpu_check_stages.py``'s; the
``Step`` they are made of, and ``PlanError``, are ``gpu_check_step.py``'s.
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
from gpu_check_stages import anchor_steps, first_steps, hybrid_steps, tests_steps  # noqa: E402
from gpu_check_step import PlanError, Step  # noqa: E402

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
# (the built-in stages' own steps: gpu_check_stages.py; Step and PlanError: gpu_check_step.py)


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
