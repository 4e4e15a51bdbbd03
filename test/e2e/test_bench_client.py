"""bench_serving and the TTFT probe end to end against a tiny fake OpenAI-compatible streaming server
(aiohttp on 127.0.0.1, in a background thread), not the engine."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web

from sglang import bench_serving

REPO = Path(__file__).resolve().parents[2]
STAGES = {"processor": 2.0, "vit_encode": 3.0, "llm_prefill": 1.0, "decode": 5.0}


class FakeServer:
    """Streams `max_tokens` one-word chunks; answers 400 to every `fail_every`-th chat request."""

    def __init__(self, model_path: str, fail_every: int = 0, chunk_delay: float = 0.002):
        self.model_path, self.fail_every, self.chunk_delay = model_path, fail_every, chunk_delay
        self.bodies: list[dict] = []
        self.in_flight = self.max_in_flight = self.seen = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/generate", self.generate)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "fake-vl", "object": "model"}]})

    async def model_info(self, request):
        return web.json_response({"model_path": self.model_path})

    async def _sse(self, request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        return resp

    async def chat(self, request):
        body = await request.json()
        self.bodies.append(body)
        self.seen += 1
        if self.fail_every and self.seen % self.fail_every == 0:
            return web.json_response({"error": {"message": "image too large", "code": 400}}, status=400)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        n = body["max_tokens"]
        resp = await self._sse(request)

        async def send(obj):
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        for i in range(n):
            await asyncio.sleep(self.chunk_delay)
            await send({"choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]})
        await send({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        usage = {"prompt_tokens": 1000, "completion_tokens": n, "total_tokens": 1000 + n}
        await send({"choices": [], "usage": usage, "meta_info": {"stage_timings_ms": STAGES}})
        # Leave the in-flight count before [DONE]: the client can only start its next request after it.
        self.in_flight -= 1
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def generate(self, request):
        body = await request.json()
        self.bodies.append(body)
        n_img = len(body.get("image_data") or [])
        assert body["text"].count("<|image_pad|>") == n_img
        resp = await self._sse(request)
        n = body["sampling_params"]["max_new_tokens"]
        for i in range(1, n + 1):
            await asyncio.sleep(self.chunk_delay * n_img)
            meta = {"completion_tokens": i, "finish_reason": {"type": "length"} if i == n else None}
            if i == n:
                meta["stage_timings_ms"] = {k: v * n_img for k, v in STAGES.items()}
            out = {"text": "x" * i, "output_ids": list(range(i)), "meta_info": meta}
            await resp.write(b"data: " + json.dumps(out).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> str:
    from sglang.testing.tokenizer_builder import write_tokenizer_files

    out = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(out)
    return str(out)


def _bench(server: FakeServer, *extra: str) -> dict:
    return bench_serving.main(["--base-url", server.url, "--disable-tqdm", "--random-input-len", "24",
                               "--random-output-len", "5", *extra])


def test_random_mm_run_counts_failures_and_respects_concurrency(tok_dir, tmp_path, capsys):
    out_file = tmp_path / "res.jsonl"
    with FakeServer(tok_dir, fail_every=4) as server:
        rec = _bench(server, "--dataset-name", "random-mm", "--num-prompts", "11", "--max-concurrency", "3",
                     "--random-mm-base-items-per-request", "2",
                     "--random-mm-bucket-config", "{(32, 48, 1): 1.0}", "--output-file", str(out_file))
    stdout = capsys.readouterr().out
    # 1 warmup + 11 timed requests: arrivals 4, 8 and 12 fail.
    assert (rec["completed"], rec["failed"]) == (8, 3)
    assert 2 <= server.max_in_flight <= 3
    for line in ("============ Serving Benchmark Result ============", "Successful requests:                     8",
                 "Failed requests:                         3", "---------------Time to First Token----------------",
                 "Mean TPOT (ms):", "P99 ITL (ms):", "Median E2EL (ms):", "Total Token throughput (tok/s):",
                 "Maximum request concurrency:             3", "3 x HTTP 400: image too large"):
        assert line in stdout, line
    assert stdout.rstrip().endswith("=" * 50)

    lines = out_file.read_text().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    for key in ("ttfts", "itls", "e2els", "input_lens", "output_lens", "errors", "mean_ttft_ms", "p99_tpot_ms",
                "median_itl_ms", "std_e2el_ms", "request_throughput", "output_throughput", "total_token_throughput"):
        assert key in row, key
    assert len(row["ttfts"]) == len(row["errors"]) == len(row["output_lens"]) == 11
    assert sorted(row["output_lens"]) == [0] * 3 + [5] * 8
    assert row["total_output_tokens"] == 40 and row["total_input_tokens"] == 8 * 24
    assert all((e == "") == (n == 5) for e, n in zip(row["errors"], row["output_lens"]))
    assert all(len(itl) == 4 for itl, e in zip(row["itls"], row["errors"]) if not e)
    assert row["model"] == "fake-vl" and row["tokenizer"] == tok_dir and row["request_rate"] == "inf"

    body = server.bodies[-1]
    assert body["model"] == "fake-vl" and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.0 and body["max_tokens"] == 5
    assert body["ignore_eos"] is True and body["min_tokens"] == 5
    parts = body["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url"]
    assert parts[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_image_dataset_openai_chat_body(tok_dir, capsys):
    with FakeServer(tok_dir) as server:
        rec = _bench(server, "--backend", "openai-chat", "--no-ignore-eos", "--dataset-name", "image",
                     "--num-prompts", "4", "--image-count", "2", "--image-resolution", "24x40",
                     "--image-format", "png", "--request-rate", "200", "--warmup-requests", "0")
    assert (rec["completed"], rec["failed"]) == (4, 0)
    assert "Request rate configured (RPS):           200.00" in capsys.readouterr().out
    assert len(server.bodies) == 4
    for body in server.bodies:
        assert "ignore_eos" not in body and "min_tokens" not in body
        parts = body["messages"][0]["content"]
        assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
        from PIL import Image

        raw = base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1])
        img = Image.open(io.BytesIO(raw))
        assert (img.format, img.size) == ("PNG", (40, 24))


def test_all_warmups_failing_aborts(tok_dir):
    with FakeServer(tok_dir, fail_every=1) as server:
        with pytest.raises(SystemExit, match="warmup request"):
            _bench(server, "--num-prompts", "2", "--random-mm-bucket-config", "{(16, 16, 1): 1.0}")


def test_module_entry_help():
    out = subprocess.run([sys.executable, "-m", "sglang.bench_serving", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0 and "--random-mm-bucket-config" in out.stdout


def _probe_module():
    spec = importlib.util.spec_from_file_location("ttft_probe", REPO / "benchmark/multimodal/ttft_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("api", ["native", "openai"])
def test_ttft_probe_table_json_and_plot(tok_dir, tmp_path, capsys, api):
    probe = _probe_module()
    out_json, png = tmp_path / "probe.json", tmp_path / "probe.png"
    plot = str(png) if importlib.util.find_spec("matplotlib") else "none"
    with FakeServer(tok_dir) as server:
        rows = probe.main(["--base-url", server.url, "--api", api, "--counts", "1,3", "--repeats", "2",
                           "--resolution", "40x24", "--output-len", "3", "--output-json", str(out_json),
                           "--plot", plot])
    table = capsys.readouterr().out
    assert [r["images"] for r in rows] == [1, 3]
    assert all(r["ttft_ms"] > 0 and r["e2e_ms"] >= r["ttft_ms"] for r in rows)
    assert "TTFT ms" in table and "vit_encode" in table
    stages = rows[1]["stage_timings_ms"]
    assert stages["vit_encode"] == (9.0 if api == "native" else 3.0)
    data = json.loads(out_json.read_text())
    assert [r["images"] for r in data["results"]] == [1, 3] and len(data["results"][0]["ttft_ms_all"]) == 2
    # Each request carries fresh images: no two requests share an image.
    if api == "native":
        urls = [u for b in server.bodies for u in b["image_data"]]
        assert len(urls) == len(set(urls)) == 1 + 2 * (1 + 3)  # warmup + repeats
    if plot != "none":
        assert png.read_bytes()[:4] == b"\x89PNG"
