"""scripts/gpu_check.sh fits a GPU job: each stage plans <= 570 s and leaves <= 8 files under $OUT,
every step is killed at min(its budget, what is left of the stage), the summary is written after every
step, and missing server modules stop a stage at once. Runs on CPU: the stages run tiny test lists."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu_check.sh"

_spec = importlib.util.spec_from_file_location("gpu_check_plan", REPO / "scripts" / "gpu_check_plan.py")
plan_mod = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("gpu_check_plan", plan_mod)  # dataclasses look their module up
_spec.loader.exec_module(plan_mod)

JOB_STAGE_LIMIT = 570  # a job is killed at 600 s
JOB_FILE_LIMIT = 8


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("STAGE_BUDGET", "WHEELS_DIR", "GPU_CHECK_REQUIRED_MODULES", "OUT", "GPU_CACHE", "RAW")}
    env.update(PYTHON=sys.executable, OUT=str(tmp_path / "out"), GPU_CACHE=str(tmp_path / "cache"),
               WHEELS_DIR=str(tmp_path / "no-wheels"), PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    env.update(extra)
    return env


def _run(tmp_path: Path, *args: str, timeout: float = 180, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=_env(tmp_path, **extra), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _dry_run(tmp_path: Path, *args: str) -> tuple[int, int, list[int], list[str]]:
    res = _run(tmp_path, *args, "--dry-run", GPU_CHECK_REQUIRED_MODULES="gpu_check_no_such_module")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    m = re.fullmatch(r"planned (\d+) s, files (\d+)", lines[-1])
    assert m, lines[-1]
    budgets = [int(b) for b in re.findall(r"^\s*(\d+) s  ", res.stdout, re.M)]
    files = next(line for line in lines if line.startswith("files under $OUT: ")).split(": ", 1)[1].split()
    # a dry run runs, installs and creates nothing
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()
    return int(m.group(1)), int(m.group(2)), budgets, files


@pytest.mark.parametrize("stage", ["tests", "micro", "serving", "serving2"])
def test_each_stage_fits_one_job(tmp_path, stage):
    planned, files, budgets, outputs = _dry_run(tmp_path, "--stage", stage)
    assert planned == sum(budgets) and budgets[0] == plan_mod.INSTALL_BUDGET  # installs are planned too
    assert planned <= JOB_STAGE_LIMIT
    assert files == len(outputs) <= JOB_FILE_LIMIT
    assert {f"gpu-check-{stage}.log", f"summary-{stage}.json", f"results-{stage}.tar.gz"} <= set(outputs)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in outputs)


# The lent machine (docs: the device tool): 15 minutes of device time a session, start-up (1-2 min) and
# give-back included, 10 minutes a call; what travels (the checkout plus carried paths) at most 64 MiB.
FIRST_CALL_LIMIT_S = 520
CARRY_LIMIT_BYTES = 64 * 2**20


def test_stage_first_fits_one_call_of_the_lent_machine(tmp_path):
    planned, files, budgets, outputs = _dry_run(tmp_path, "--stage", "first")
    assert planned == sum(budgets) <= FIRST_CALL_LIMIT_S
    assert files == len(outputs) <= JOB_FILE_LIMIT
    assert {"gpu-check-first.log", "summary-first.json", "results-first.tar.gz"} <= set(outputs)
    plan = plan_mod.build_plan("first")
    assert plan.stage_budget == FIRST_CALL_LIMIT_S
    # in the order of value: the environment, correctness, then the figures
    names = [s.name for s in plan.steps]
    assert names == ["install", "environment", "first: kernels", "first: parity", "first: replica",
                     "first: forward", "first: serving", "first: attention"]
    for step in plan.steps[2:]:
        assert "gpu_check_out" not in step.command
        assert "$OUT" not in step.command or "--junitxml" in step.command, step.command


def test_stage_first_names_only_paths_and_flags_that_exist():
    plan = plan_mod.build_plan("first")
    for step in plan.steps[2:]:
        for path in re.findall(r"(?:^|\s)((?:test|sgl-kernel|benchmark)/[\w/.-]+)", step.command):
            assert (REPO / path).exists(), f"{step.name}: {path}"
    from sglang.testing.make_model import main as make_model_main

    with pytest.raises(SystemExit) as e:  # --num-layers is a flag of make_model
        make_model_main(["--preset", "qwen3-vl-4b", "--num-layers", "1", "--out", "/nonexistent"])
    assert e.value.code == 2
    help_of = {
        "run_hash_serving_ab.py": ["--modes", "--max-concurrency"],
        "bench_attention.py": ["--shapes", "--iters"],
        "bench_forward.py": ["--decode-batch-sizes", "--repeat"],
    }
    for script, flags in help_of.items():
        text = next(REPO.glob(f"**/{script}")).read_text()
        assert all(f'"{flag}"' in text for flag in flags), script


def test_the_checkout_and_the_wheels_travel_within_the_carry_limit():
    """What a first call carries: the tracked files plus ../shared/wheels copied into .wheels."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    size = sum((REPO / f).stat().st_size for f in tracked.decode().split("\0") if f and (REPO / f).is_file())
    wheels = REPO.parent / "shared" / "wheels"
    if not wheels.is_dir():
        wheels = REPO / ".wheels"
    wheel_bytes = sum(f.stat().st_size for f in wheels.glob("*.whl")) if wheels.is_dir() else 0
    assert size + wheel_bytes <= CARRY_LIMIT_BYTES, f"checkout {size} + wheels {wheel_bytes} bytes"


def test_all_runs_every_stage_once_within_their_budgets(tmp_path):
    # `all` is for a runner without the 600 s limit: one install, every stage's steps, one set of files.
    planned, files, budgets, outputs = _dry_run(tmp_path, "--stage", "all")
    assert planned == sum(budgets) <= JOB_STAGE_LIMIT * len(plan_mod.STAGES)
    assert files == len(outputs) <= JOB_FILE_LIMIT
    plan = plan_mod.build_plan("all")
    assert sum(s.name == "install" for s in plan.steps) == 1
    assert sum("make_model" in s.command for s in plan.steps) == 1


def test_serving_stages_generate_the_model_once_into_the_cache():
    for stage in ("serving", "serving2"):
        steps = plan_mod.build_plan(stage).steps
        gens = [s for s in steps if "sglang.testing.make_model" in s.command]
        assert len(gens) == 1 and '--out "$GPU_CACHE/models/qwen3-vl-4b"' in gens[0].command
        assert gens[0].budget >= 120
        later = steps[steps.index(gens[0]) + 1:]
        assert later and all('"$GPU_CACHE/models/qwen3-vl-4b"' in s.command for s in later)


def test_list_commands_write_their_results_under_raw():
    # Only $RAW is packed into the tarball: a line writing under $OUT would cost the job's file limit.
    for stage in ("micro", "serving", "serving2"):
        for step in plan_mod.build_plan(stage).steps[2:]:
            assert "$OUT" not in step.command and "gpu_check_out" not in step.command, step.command


@pytest.mark.parametrize("line, message", [
    ("python x.py", "no @budget=SECONDS"),
    ("@budget=ten python x.py", "whole number"),
    ("@budget=10 @stage=nope python x.py", "unknown @stage=nope"),
    ("@budget=10 @files=2 python x.py", "unknown token @files="),
    ("@budget=10", "no command"),
])
def test_a_bad_list_line_stops_before_anything_runs(tmp_path, line, message):
    lst = tmp_path / "list.txt"
    lst.write_text(f"# comment\n\n{line}\n")
    res = _run(tmp_path, "--stage", "micro", "--list", str(lst), "--no-install")
    assert res.returncode == 2
    assert f"{lst}:3" in res.stderr and message in res.stderr
    assert not (tmp_path / "out").exists()


def _summary(out: Path, stage: str = "micro") -> dict:
    return json.loads((out / f"summary-{stage}.json").read_text())


@pytest.mark.slow  # waits out real step budgets: ~20 s
def test_every_step_is_killed_at_its_budget_or_the_stage_end(tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text(
        # ignores SIGINT (a background job of a script): killed with whatever it started
        '@budget=2 sleep 300 & echo $! > "$RAW/child.pid"; sleep 300\n'
        '@budget=5 echo "{}" > "$RAW/result.json"; echo x > "$OUT/stray.json"\n'
        # ignores SIGINT too; cut to what is left of the 20 s stage, then SIGKILLed at its end
        "@budget=100 trap '' INT; sleep 300\n"
        "@budget=5 touch \"$RAW/never\"\n"  # nothing left of the stage: not started
    )
    t0 = time.monotonic()
    res = _run(tmp_path, "--stage", "micro", "--list", str(lst), "--no-install", STAGE_BUDGET="20")
    wall = time.monotonic() - t0
    assert res.returncode == 1, res.stdout
    assert wall < 20 + 40  # nowhere near the 300 s the commands wanted

    steps = _summary(tmp_path / "out")["steps"]
    assert [s["status"] for s in steps] == [
        "ok", "timed out", "ok", "timed out (stage budget)", "not started (stage budget spent)"]
    check, own, quick, cut, never = steps
    assert own["timed_out"] and own["rc"] in (124, 137) and own["given"] == 2
    assert own["seconds"] <= 2 + 5
    assert cut["timed_out"] and cut["rc"] == 137 and cut["budget"] == 100 and cut["given"] <= 20
    assert cut["seconds"] <= cut["given"] + 5
    assert never["given"] == 0 and not (tmp_path / "cache" / "raw" / "micro" / "never").exists()
    assert _summary(tmp_path / "out")["complete"] is True

    # the background sleep the first command started went with it
    pid = int((tmp_path / "cache" / "raw" / "micro" / "child.pid").read_text())
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        cmdline = b""
    assert b"sleep" not in cmdline

    # exactly the files the plan names; the stray file went into the tarball
    out_files = sorted(p.name for p in (tmp_path / "out").iterdir())
    _, files, _, outputs = _dry_run(tmp_path / "dry", "--stage", "micro", "--list", str(lst))
    assert out_files == sorted(outputs) and len(out_files) == files == 3
    with tarfile.open(tmp_path / "out" / "results-micro.tar.gz") as tar:
        names = {n.lstrip("./") for n in tar.getnames()}
    assert {"result.json", "child.pid", "stray/stray.json"} <= names


def test_a_killed_job_still_returns_what_ran(tmp_path):
    fifo = tmp_path / "step2-started"
    os.mkfifo(fifo)
    lst = tmp_path / "list.txt"
    lst.write_text('@budget=30 echo \'{"one": 1}\' > "$RAW/one.json"\n'
                   '@budget=120 echo started > "$GPU_CHECK_TEST_FIFO"; sleep 120\n')
    run_tag = f"GPU_CHECK_TEST_RUN={uuid.uuid4().hex}"
    env = _env(tmp_path, GPU_CHECK_TEST_FIFO=str(fifo), GPU_CHECK_TEST_RUN=run_tag.split("=", 1)[1])
    proc = subprocess.Popen(["bash", str(SCRIPT), "--stage", "micro", "--list", str(lst), "--no-install"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # O_RDWR: opening does not wait for the writer
    try:
        deadline = time.monotonic() + 120
        while not select.select([fd], [], [], 1.0)[0]:  # wait for step 2 to start (or the script to die)
            assert proc.poll() is None and time.monotonic() < deadline, "step 2 never started"
        assert os.read(fd, 100) == b"started\n"
    finally:
        os.close(fd)
        # the job is killed: the script, and everything it started
        os.killpg(proc.pid, signal.SIGKILL)
        plan_mod.reap(run_tag)
        proc.wait(30)

    out = tmp_path / "out"
    summary = _summary(out)
    assert summary["complete"] is False
    assert [(s["name"].split(":")[0], s["status"]) for s in summary["steps"]] == [
        ("check modules", "ok"), ("micro 1", "ok")]
    with tarfile.open(out / "results-micro.tar.gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("one.json"))
        assert json.load(tar.extractfile(member)) == {"one": 1}
    assert {p.name for p in out.iterdir()} == {"gpu-check-micro.log", "summary-micro.json", "results-micro.tar.gz"}


@pytest.mark.parametrize("wheels", ["empty", "missing"])
@pytest.mark.parametrize("install", [True, False])
def test_a_missing_server_module_stops_the_stage_at_once(tmp_path, wheels, install):
    wheels_dir = tmp_path / "wheels"
    if wheels == "empty":
        wheels_dir.mkdir()
    lst = tmp_path / "list.txt"
    lst.write_text('@budget=30 touch "$RAW/ran"\n')
    t0 = time.monotonic()
    res = _run(tmp_path, "--stage", "micro", "--list", str(lst), *([] if install else ["--no-install"]),
               WHEELS_DIR=str(wheels_dir), GPU_CHECK_REQUIRED_MODULES="zmq, gpu_check_no_such_module")
    assert time.monotonic() - t0 < 60  # seconds, not the stage's minutes
    assert res.returncode != 0
    assert "gpu_check_no_such_module" in res.stdout and str(wheels_dir) in res.stdout
    assert ("holds no .whl files" if wheels == "empty" else "does not exist") in res.stdout
    assert not (tmp_path / "cache" / "raw" / "micro" / "ran").exists()
    first, *rest = _summary(tmp_path / "out")["steps"]
    assert first["name"] == ("install" if install else "check modules") and first["status"] == "failed"
    assert rest and all(s["status"].startswith("not started") for s in rest)


def test_modules_that_import_need_no_wheels(tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text('@budget=30 touch "$RAW/ran"\n')
    res = _run(tmp_path, "--stage", "micro", "--list", str(lst), "--no-install")
    assert res.returncode == 0, res.stdout
    assert (tmp_path / "cache" / "raw" / "micro" / "ran").exists()


# importorskip targets that may skip on the GPU image: plotting (tuning reports only) and the in-tree kernels
# (built there, absent on a CPU runner).
# llguidance: the --grammar-backend llguidance tests are host-side (grammar compile, token masks), run by
# the CPU suite where it is declared and installed; the shared GPU wheels do not carry it
OPTIONAL_ON_GPU = {"matplotlib", "sgl_kernel", "llguidance"}


def test_no_test_skips_for_want_of_a_module_the_image_lacks():
    # a test that importorskips a module neither the image nor the wheels provide skips silently on the
    # GPU machines (the video tests did, for want of av)
    wanted = set()
    for path in (REPO / "test").rglob("*.py"):
        wanted |= {m.split(".")[0] for m in re.findall(r"importorskip\(\s*[\"']([\w.]+)[\"']", path.read_text())}
    assert wanted, "no importorskip found: the pattern is stale"
    covered = set(plan_mod.REQUIRED_MODULES) | set(plan_mod.IMAGE_MODULES) | OPTIONAL_ON_GPU
    assert wanted - covered == set()


def test_stage_anchor_fits_one_call_and_puts_the_most_valuable_first(tmp_path):
    planned, files, budgets, outputs = _dry_run(tmp_path, "--stage", "anchor")
    assert planned == sum(budgets) <= FIRST_CALL_LIMIT_S
    assert files == len(outputs) <= JOB_FILE_LIMIT
    plan = plan_mod.build_plan("anchor")
    assert plan.stage_budget == FIRST_CALL_LIMIT_S
    assert [s.name for s in plan.steps] == ["install", "environment", "anchor: configs", "anchor: forward",
                                            "anchor: serving overlap", "anchor: serving no overlap",
                                            "anchor: seed-002 4B"]


def test_stage_anchor_commands_parse_and_its_config_step_runs_here(tmp_path):
    """Every flag the anchor steps pass exists (each script's own parser or ServerArgs), the quoted server
    arguments reach launch_server as one string, and the config step writes weight-free folders in seconds."""
    import shlex

    from sglang.srt.server_args import ServerArgs

    plan = plan_mod.build_plan("anchor")
    for step in plan.steps[2:]:
        for path in re.findall(r"(?:^|\s)((?:benchmark|scripts)/[\w/.-]+)", step.command):
            assert (REPO / path).exists(), f"{step.name}: {path}"
        words = shlex.split(step.command.replace('"$PYTHON"', "python"))
        if "--server-args" in words:
            extra = shlex.split(words[words.index("--server-args") + 1])
            args = ServerArgs.from_argv(["--model-path", "x", *extra])
            assert args.load_format == "dummy"
            assert args.disable_overlap_schedule == ("no overlap" in step.name)
    text = (REPO / "benchmark/performance/bench_forward.py").read_text()
    assert '"--load-format"' in text and '"--mm-attention-backends"' in text
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CACHE": str(tmp_path)}
    subprocess.run(["bash", "-c", plan.steps[2].command], cwd=REPO, env=env, check=True, capture_output=True)
    for name in ("qwen3-vl-8b-config", "qwen3-vl-4b-config"):
        folder = tmp_path / "models" / name
        assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
        assert not list(folder.glob("*.safetensors"))


def test_stage_hybrid_fits_and_names_only_paths_and_flags_that_exist(tmp_path):
    planned, files, budgets, outputs = _dry_run(tmp_path, "--stage", "hybrid")
    assert planned == sum(budgets) <= FIRST_CALL_LIMIT_S and files == len(outputs) <= JOB_FILE_LIMIT
    plan = plan_mod.build_plan("hybrid")
    for step in plan.steps[2:]:
        for path in re.findall(r"(?:^|\s)((?:sgl-kernel|benchmark|test)/[\w/.-]+)", step.command):
            assert (REPO / path).exists(), f"{step.name}: {path}"
    bench = (REPO / "sgl-kernel/benchmark/bench_gdn.py").read_text()
    assert all(f'"{flag}"' in bench for flag in ("--presets", "--tps", "--out"))
    one_batch = (REPO / "sglang/bench_one_batch.py").read_text()
    assert '"--load-format"' in one_batch and '"--output-len"' in one_batch
    make = plan.steps[-1].command.split(" && ")[0]  # the replica's config, here, in seconds
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CACHE": str(tmp_path)}
    subprocess.run(["bash", "-c", make], cwd=REPO, env=env, check=True, capture_output=True)
    cfg = json.loads((tmp_path / "models" / "qwen3.5-4b-4l-config" / "config.json").read_text())
    assert cfg["text_config"]["num_hidden_layers"] == 4 and cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]
