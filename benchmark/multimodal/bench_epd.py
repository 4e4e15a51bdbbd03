"""Encoder disaggregation (EPD) at the serving level: the same `bench_serving --dataset-name image` workload
against three topologies, one after the other on this machine:

  normal     one ordinary server (tokenizer, scheduler with its own vision tower)
  1e+1l      one --encoder-only server and one --language-only server pointing at it
  2e+1l      two encoders and one language server

It prints bench_serving's result block per topology, then a summary: throughput, TTFT, and the stage-timer
split of a few probe requests sent after each run (fresh images, one at a time): `processor` (the language
side's tokenizer work: a JPEG is only sized from its header there under EPD), `epd_encode` (the encoder's
own time: decode, cache, tower), `epd_transfer` (the language side's wait for the encoders minus that: HTTP
out, ZMQ back), `epd_wait` (scheduler rank 0 holding the request until its embeddings came), `vit_encode`
(the normal server's own tower), `llm_prefill` and `first_token`.

The model is the tiny Qwen3-VL preset with the real checkpoint's pixel limit (a 1280x720 image is 880 image
tokens, as with Qwen3-VL-2B/4B/8B), or any --model-path. Servers run with OMP_NUM_THREADS=1.

  python benchmark/multimodal/bench_epd.py                                   # 32 requests, concurrency 8
  python benchmark/multimodal/bench_epd.py --num-prompts 16 --max-concurrency 1 --topologies normal,2e+1l
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_hash_serving_ab import full_res_tiny_model  # noqa: E402  the same full-resolution tiny model
TOPOLOGIES = {"normal": 0, "1e+1l": 1, "2e+1l": 2}
STAGES = ("processor", "epd_encode", "epd_transfer", "epd_wait", "vit_encode", "llm_prefill", "first_token")


class Server:
    def __init__(self, name: str, model: str, args, workdir: Path, extra: list[str]):
        from sglang.srt.utils.network import pick_unused_port

        self.port = pick_unused_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}:{REPO}/sgl-kernel/python")
        self.log = open(workdir / f"{name}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(self.port),
             "--device", args.device, "--dtype", args.dtype, "--log-level", "warning", *extra],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)

    def wait_healthy(self, timeout: float = 300) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.url} exited with {self.proc.returncode} (see {self.log.name})")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.url} not healthy in {timeout:g} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def start(topology: str, model: str, args, workdir: Path) -> list[Server]:
    n_enc = TOPOLOGIES[topology]
    servers = [Server(f"{topology}-enc{i}", model, args, workdir, ["--encoder-only"]) for i in range(n_enc)]
    for s in servers:
        s.wait_healthy()
    extra = ["--enable-vlm-stage-timer", *args.server_args.split()]
    if n_enc:
        extra += ["--language-only", "--encoder-urls", *(s.url for s in servers),
                  "--encoder-transfer-backend", args.transfer_backend]
    servers.append(Server(f"{topology}-lang", model, args, workdir, extra).wait_healthy())
    return servers


def probe(url: str, model: str, n: int, resolution: tuple[int, int], seed: int) -> dict[str, float]:
    """Median stage timings of `n` sequential one-image requests with images no run has seen."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    rows: dict[str, list[float]] = {}
    rng = np.random.default_rng(seed)
    h, w = resolution
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        body = {"text": "Describe <|vision_start|><|image_pad|><|vision_end|>",
                "image_data": ["data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()],
                "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
        req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            timings = json.loads(r.read())["meta_info"].get("stage_timings_ms", {})
        for k, v in timings.items():
            rows.setdefault(k, []).append(float(v))
    return {k: statistics.median(v) for k, v in rows.items()}


def run(topology: str, model: str, args, workdir: Path) -> dict:
    from sglang.bench_serving import main as bench_main

    servers = start(topology, model, args, workdir)
    try:
        lang = servers[-1]
        rec = bench_main([
            "--backend", "sglang", "--base-url", lang.url, "--dataset-name", "image",
            "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.max_concurrency),
            "--request-rate", "inf", "--image-count", str(args.image_count), "--image-resolution", args.image_resolution,
            "--image-format", "jpeg", "--random-input-len", str(args.input_len), "--random-output-len",
            str(args.output_len), "--random-range-ratio", "1", "--seed", str(args.seed), "--warmup-requests", "2",
            "--disable-tqdm", "--tokenizer", model, "--model", model])
        res = tuple(int(v) for v in args.image_resolution.split("x")) if "x" in args.image_resolution else \
            {"720p": (720, 1280), "360p": (360, 640), "1080p": (1080, 1920)}[args.image_resolution]
        rec["stages"] = probe(lang.url, model, args.probes, res, args.seed + 7)
        return rec
    finally:
        for s in reversed(servers):
            s.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None, help="default: the tiny Qwen3-VL at full resolution")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--topologies", default="normal,1e+1l,2e+1l")
    p.add_argument("--transfer-backend", default="zmq_to_scheduler", choices=("zmq_to_scheduler", "zmq_to_tokenizer"))
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--image-count", type=int, default=1)
    p.add_argument("--image-resolution", default="720p")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--probes", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--server-args", default="", help="extra flags for the normal / language server")
    p.add_argument("--output-json", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-epd-") as tmp:
        workdir = Path(tmp)
        model = args.model_path or full_res_tiny_model(workdir / "model")
        results = {t: run(t, model, args, workdir) for t in args.topologies.split(",")}
    print(f"\n{'topology':<9} {'req/s':>7} {'out tok/s':>9} {'TTFT mean':>10} {'TTFT p50':>9} {'TTFT p99':>9}  "
          + " ".join(f"{s:>12}" for s in STAGES))
    for t, rec in results.items():
        st = rec["stages"]
        print(f"{t:<9} {rec['request_throughput']:>7.2f} {rec['output_throughput']:>9.1f} {rec['mean_ttft_ms']:>10.0f} "
              f"{rec['median_ttft_ms']:>9.0f} {rec['p99_ttft_ms']:>9.0f}  "
              + " ".join(f"{st[s]:>12.1f}" if s in st else f"{'-':>12}" for s in STAGES))
    print("(stage columns: median ms over the probe requests, one at a time after the run)")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
