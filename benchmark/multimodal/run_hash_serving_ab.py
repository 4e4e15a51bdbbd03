"""mm-hash-precompute at the serving level: the same random-mm workload against a server launched with
SGLANG_MM_PRECOMPUTE_HASH=0 (baseline: sha256 in the scheduler loop) and then =1 (xxh3_128 in the
tokenizer's worker threads), one after the other, printing both result blocks and a summary.

The model is the tiny Qwen3-VL preset with the real checkpoint's pixel limit (max_pixels 16777216), so a
1280x720 image is 880 image tokens and 21.6 MB of float32 pixels as with Qwen3-VL-4B: the host-side
work per image is the real one while the model itself costs little. Servers run with OMP_NUM_THREADS=1.

  python benchmark/multimodal/run_hash_serving_ab.py                         # 64 requests, concurrency 32
  python benchmark/multimodal/run_hash_serving_ab.py --num-prompts 16 --max-concurrency 1   # low load
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from sglang.srt.utils.network import pick_unused_port

REPO = Path(__file__).resolve().parents[2]
MODES = [("off", {"SGLANG_MM_PRECOMPUTE_HASH": "0"}), ("on", {"SGLANG_MM_PRECOMPUTE_HASH": "1"})]


def full_res_tiny_model(out: Path) -> str:
    from sglang.testing.make_model import make_model

    path = Path(make_model("qwen3-vl-tiny", out, seed=0, progress=False))
    cfg_path = path / "preprocessor_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["max_pixels"] = cfg["size"]["longest_edge"] = 16777216  # Qwen3-VL's own limit: no downscale
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return str(path)


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server not healthy in time")


def run_mode(name: str, env_extra: dict, model: str, args, workdir: Path) -> tuple[str, dict]:
    port = pick_unused_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **env_extra)
    log = open(workdir / f"server_{name}.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(port), "--device", args.device,
         "--dtype", args.dtype, "--log-level", "warning", *args.server_args.split()],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", server)
        out_file = workdir / f"bench_{name}.jsonl"
        cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang-oai-chat", "--port", str(port),
               "--dataset-name", "random-mm", "--num-prompts", str(args.num_prompts),
               "--max-concurrency", str(args.max_concurrency), "--request-rate", "inf", "--seed", str(args.seed),
               "--random-input-len", str(args.random_input_len), "--random-output-len", str(args.random_output_len),
               "--random-prefix-len", str(args.random_prefix_len),
               "--random-range-ratio", "0", "--random-mm-base-items-per-request", "1",
               "--random-mm-num-mm-items-range-ratio", "0", "--random-mm-bucket-config", args.bucket,
               "--warmup-requests", str(args.warmup), "--ignore-eos", "--disable-tqdm", "--output-file", str(out_file)]
        res = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO, capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"bench_serving failed:\n{res.stdout}\n{res.stderr}")
        block = res.stdout[res.stdout.find("="):] if "=" in res.stdout else res.stdout
        return block, _parse(block)
    finally:
        server.terminate()
        server.wait(60)
        log.close()


def _parse(block: str) -> dict:
    want = {"req_s": r"Request throughput \(req/s\):\s+([\d.]+)", "ttft_mean": r"Mean TTFT \(ms\):\s+([\d.]+)",
            "ttft_median": r"Median TTFT \(ms\):\s+([\d.]+)", "ttft_p99": r"P99 TTFT \(ms\):\s+([\d.]+)",
            "tpot_mean": r"Mean TPOT \(ms\):\s+([\d.]+)", "e2el_mean": r"Mean E2E Latency \(ms\):\s+([\d.]+)"}
    out = {}
    for k, pat in want.items():
        m = re.search(pat, block)
        out[k] = float(m.group(1)) if m else float("nan")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", help="default: the tiny preset with the real pixel limit, built in a temp dir")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-concurrency", type=int, default=32)
    ap.add_argument("--random-input-len", type=int, default=256)
    ap.add_argument("--random-output-len", type=int, default=16)
    ap.add_argument("--random-prefix-len", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--bucket", default="{(720, 1280, 1): 1.0}", help="random-mm bucket config (H, W, T): p")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=18347)
    ap.add_argument("--server-args", default="", help="extra launch_server arguments, one string")
    ap.add_argument("--modes", default="off,on",
                    help="which sides to run, in order (on alone: one serving run of the default server)")
    ap.add_argument("--output", help="write the parsed figures of both runs as JSON here")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or not set(modes) <= dict(MODES).keys():
        ap.error(f"--modes takes off and/or on, got {args.modes!r}")
    workdir = Path(tempfile.mkdtemp(prefix="hash_ab_"))
    model = args.model_path or full_res_tiny_model(workdir / "model")
    results = {}
    for name in modes:
        env_extra = dict(MODES)[name]
        print(f"\n##### SGLANG_MM_PRECOMPUTE_HASH={env_extra['SGLANG_MM_PRECOMPUTE_HASH']} ({name}) #####", flush=True)
        block, figures = run_mode(name, env_extra, model, args, workdir)
        print(block, flush=True)
        results[name] = figures
    print(f"\nsummary ({args.num_prompts} requests, concurrency {args.max_concurrency}, bucket {args.bucket}):")
    for k in ("req_s", "ttft_mean", "ttft_median", "ttft_p99", "tpot_mean", "e2el_mean"):
        row = "  ".join(f"{name} {results[name][k]:9.2f}" for name in modes)
        ratio = f"  on/off {results['on'][k] / results['off'][k]:.3f}" if len(results) == 2 else ""
        print(f"  {k:>12}: {row}{ratio}")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
