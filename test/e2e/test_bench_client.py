"""bench_serving and the TTFT probe end to end against a tiny fake server that speaks the native /generate,
OpenAI completions and chat APIs (aiohttp on 127.0.0.1, in a background thread), not the engine; plus one
run of `--backend sglang --dataset-name random` against the real server."""

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
from sglang.benchmark import datasets as ds
from sglang.benchmark.metrics import RESULT_KEYS

REPO = Path(__file__).resolve().parents[2]
STAGES = {"processor": 2.0, "vit_encode": 3.0, "llm_prefill": 1.0, "decode": 5.0}
SERVER_PROMPT_TOKENS = 1000


class FakeServer:
    """Streams `max_tokens` one-word chunks on every API; answers 400 to every `fail_every`-th request."""

    def __init__(self, model_path: str, fail_every: int = 0, chunk_delay: float = 0.002):
        self.model_path, self.fail_every, self.chunk_delay = model_path, fail_every, chunk_delay
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.flushes = 0
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
        app.router.add_post("/flush_cache", self.flush)
        app.router.add_post("/v1/chat/completions", self.openai)
        app.router.add_post("/v1/completions", self.openai)
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

    async def flush(self, request):
        self.flushes += 1
        return web.json_response({"success": True})

    async def _sse(self, request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        return resp

    def _take(self, request, body) -> bool:
        """Records the request; False when this one is to fail."""
        self.bodies.append(body)
        self.paths.append(request.path)
        self.seen += 1
        return not (self.fail_every and self.seen % self.fail_every == 0)

    async def openai(self, request):
        body = await request.json()
        if not self._take(request, body):
            return web.json_response({"error": {"message": "image too large", "code": 400}}, status=400)
        chat = request.path.endswith("/chat/completions")
        n = body["max_tokens"]
        usage = {"prompt_tokens": SERVER_PROMPT_TOKENS, "completion_tokens": n, "total_tokens": 1000 + n}
        words = [f" w{i}" for i in range(n)]
        if not body.get("stream"):
            await asyncio.sleep(self.chunk_delay * n)
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": "".join(words)}} if chat
                          else {"text": "".join(words)})
            return web.json_response({"choices": [choice], "usage": usage})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        resp = await self._sse(request)

        async def send(obj):
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        def choice(text, finish=None):
            part = {"delta": {"content": text}} if chat else {"text": text}
            return {"choices": [{"index": 0, **part, "finish_reason": finish}]}

        if chat:
            await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        for w in words:
            await asyncio.sleep(self.chunk_delay)
            await send(choice(w))
        await send(choice("", "length"))
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({"choices": [], "usage": usage, "meta_info": {"stage_timings_ms": STAGES}})
        # Leave the in-flight count before [DONE]: the client can only start its next request after it.
        self.in_flight -= 1
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def generate(self, request):
        body = await request.json()
        if not self._take(request, body):
            return web.json_response({"error": {"message": "bad request", "code": 400}}, status=400)
        n_img = len(body.get("image_data") or [])
        if "text" in body:
            assert body["text"].count("<|image_pad|>") == n_img
        n = body["sampling_params"]["max_new_tokens"]

        def out(i):
            meta = {"prompt_tokens": SERVER_PROMPT_TOKENS, "completion_tokens": i,
                    "finish_reason": {"type": "length"} if i == n else None}
            if i == n:
                meta["stage_timings_ms"] = {k: v * max(n_img, 1) for k, v in STAGES.items()}
            return {"text": "x" * i, "output_ids": list(range(i)), "meta_info": meta}

        if not body.get("stream"):
            await asyncio.sleep(self.chunk_delay * n)
            return web.json_response(out(n))
        resp = await self._sse(request)
        for i in range(1, n + 1):
            await asyncio.sleep(self.chunk_delay * max(n_img, 1))
            await resp.write(b"data: " + json.dumps(out(i)).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> str:
    from sglang.testing.tokenizer_builder import write_tokenizer_files

    out = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(out)
    return str(out)


@pytest.fixture(scope="module")
def shared_tok(tok_dir):
    return ds.load_tokenizer(tok_dir)


@pytest.fixture
def one_tokenizer(shared_tok, monkeypatch):
    """Every run in a test reuses one loaded tokenizer (and its cached vocabulary scan)."""
    monkeypatch.setattr(ds, "load_tokenizer", lambda path: shared_tok)


def _bench(server: FakeServer, *extra: str) -> dict:
    return bench_serving.main(["--base-url", server.url, "--disable-tqdm", "--random-input-len", "24",
                               "--random-output-len", "5", *extra])


EXACT = ("--dataset-name", "random", "--random-range-ratio", "1", "--warmup-requests", "0")
ROUTES = {"sglang": "/generate", "sglang-oai": "/v1/completions", "vllm": "/v1/completions",
          "openai": "/v1/completions", "sglang-oai-chat": "/v1/chat/completions",
          "vllm-chat": "/v1/chat/completions", "openai-chat": "/v1/chat/completions"}


@pytest.mark.parametrize("backend", list(ROUTES))
def test_each_backend_body_and_stream(tok_dir, one_tokenizer, backend, capsys):
    with FakeServer(tok_dir) as server:
        rec = _bench(server, "--backend", backend, *EXACT, "--num-prompts", "3",
                     "--extra-request-body", '{"top_p": 0.5, "sampling_params": {"top_k": 3}}')
    assert server.paths == [ROUTES[backend]] * 3
    assert (rec["completed"], rec["total_output_tokens"], rec["total_input_text_tokens"]) == (3, 15, 72)
    assert rec["total_input_vision_tokens"] == 0 and rec["total_input_tokens"] == 72
    assert rec["total_output_tokens_retokenized"] > 0
    assert rec["mean_ttft_ms"] > 0 and rec["mean_itl_ms"] > 0 and rec["max_itl_ms"] >= rec["p95_itl_ms"]
    assert rec["mean_e2e_latency_ms"] >= rec["mean_ttft_ms"] and rec["mean_tpot_ms"] > 0
    body = server.bodies[0]
    assert body["top_p"] == 0.5 and body["stream"] is True
    if backend == "sglang":
        assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True, "top_k": 3}
        assert isinstance(body["text"], str)
    else:
        assert body["model"] == "fake-vl" and body["max_tokens"] == 5
        assert body["stream_options"] == {"include_usage": True}
        assert ("ignore_eos" in body) == (not backend.startswith("openai"))
        key = "messages" if backend.endswith("chat") else "prompt"
        assert key in body and isinstance(body["messages"][0]["content"] if key == "messages" else body["prompt"], str)
    assert f"Backend:                                 {backend}" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["sglang", "vllm", "openai-chat"])
def test_disable_stream(tok_dir, one_tokenizer, backend):
    with FakeServer(tok_dir) as server:
        rec = _bench(server, "--backend", backend, *EXACT, "--num-prompts", "2", "--disable-stream",
                     "--disable-ignore-eos")
    assert rec["completed"] == 2 and rec["total_output_tokens"] == 10
    assert rec["mean_ttft_ms"] == pytest.approx(rec["mean_e2e_latency_ms"]) and rec["max_itl_ms"] == 0.0
    body = server.bodies[0]
    assert body["stream"] is False and "stream_options" not in body and "ignore_eos" not in body
    if backend == "sglang":
        assert body["sampling_params"]["ignore_eos"] is False


def test_random_ids_sent_as_token_ids(tok_dir, one_tokenizer):
    with FakeServer(tok_dir) as server:
        _bench(server, "--backend", "sglang", *EXACT, "--dataset-name", "random-ids", "--num-prompts", "2")
        _bench(server, "--backend", "vllm", *EXACT, "--dataset-name", "random-ids", "--num-prompts", "2")
        _bench(server, "--backend", "vllm-chat", *EXACT, "--dataset-name", "random-ids", "--num-prompts", "1")
    native, completions, chat = server.bodies[:2], server.bodies[2:4], server.bodies[4]
    assert all(len(b["input_ids"]) == 24 and "text" not in b for b in native)
    assert all(isinstance(b["prompt"], list) and len(b["prompt"]) == 24 for b in completions)
    assert isinstance(chat["messages"][0]["content"], str)


def test_chat_template_flush_cache_tag_and_jsonl(tok_dir, one_tokenizer, tmp_path, capsys):
    out_file = tmp_path / "res.jsonl"
    with FakeServer(tok_dir) as server:
        for tag in ("first", "second"):
            _bench(server, "--backend", "sglang-oai", *EXACT, "--num-prompts", "2", "--apply-chat-template",
                   "--flush-cache", "--tag", tag, "--output-file", str(out_file))
    assert server.flushes == 2
    assert all(b["prompt"].startswith("<|im_start|>user\n") for b in server.bodies)
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["tag"] for r in rows] == ["first", "second"]
    assert list(rows[0])[1:1 + len(RESULT_KEYS)] == list(RESULT_KEYS)
    assert rows[0]["backend"] == "sglang-oai" and rows[0]["dataset_name"] == "random"
    # The chat template adds text tokens beyond the 24 of the prompt.
    assert rows[0]["total_input_text_tokens"] > 2 * 24 and rows[0]["total_input_vision_tokens"] == 0
    assert "flushed the server cache" in capsys.readouterr().out


def test_random_mm_run_counts_failures_and_respects_concurrency(tok_dir, one_tokenizer, tmp_path, capsys):
    out_file = tmp_path / "res.jsonl"
    with FakeServer(tok_dir, fail_every=4) as server:
        rec = _bench(server, "--backend", "sglang-oai-chat", "--dataset-name", "random-mm", "--num-prompts", "11",
                     "--max-concurrency", "3", "--random-mm-base-items-per-request", "2",
                     "--random-mm-bucket-config", "{(32, 48, 1): 1.0}", "--output-file", str(out_file),
                     "--output-details")
    stdout = capsys.readouterr().out
    # 1 warmup + 11 timed requests: arrivals 4, 8 and 12 fail.
    assert rec["completed"] == 8
    assert 2 <= server.max_in_flight <= 3
    for line in ("============ Serving Benchmark Result ============", "Successful requests:                     8",
                 "---------------Time to First Token----------------", "Mean TPOT (ms):", "P99 ITL (ms):",
                 "Median E2E Latency (ms):", "Total token throughput (tok/s):", "Max request concurrency:                 3",
                 "3 of 11 request(s) failed; first error messages:", "3 x HTTP 400: image too large"):
        assert line in stdout, line
    assert stdout.rstrip().endswith("=" * 50)

    lines = out_file.read_text().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert len(row["ttfts"]) == len(row["errors"]) == len(row["output_lens"]) == 11
    assert sorted(row["output_lens"]) == [0] * 3 + [5] * 8
    assert row["total_output_tokens"] == 40 and row["total_input_text_tokens"] == 8 * 24
    # Vision tokens: the server's prompt count minus the client's text count, for requests with images.
    assert row["total_input_vision_tokens"] == 8 * (SERVER_PROMPT_TOKENS - 24)
    assert all((e == "") == (n == 5) for e, n in zip(row["errors"], row["output_lens"]))
    assert all(len(itl) == 4 for itl, e in zip(row["itls"], row["errors"]) if not e)
    assert row["request_rate"] == "inf" and row["max_concurrency"] == 3

    body = server.bodies[-1]
    assert body["ignore_eos"] is True and body["min_tokens"] == 5
    parts = body["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url"]
    assert parts[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_image_dataset_openai_chat_and_native(tok_dir, one_tokenizer, capsys):
    with FakeServer(tok_dir) as server:
        rec = _bench(server, "--backend", "openai-chat", "--dataset-name", "image", "--random-range-ratio", "1",
                     "--num-prompts", "4", "--image-count", "2", "--image-resolution", "24x40",
                     "--image-format", "png", "--request-rate", "200", "--warmup-requests", "0")
        native = _bench(server, "--backend", "sglang", "--dataset-name", "image", "--random-range-ratio", "1",
                        "--num-prompts", "2", "--image-count", "3", "--image-resolution", "8x8",
                        "--warmup-requests", "0")
    assert rec["completed"] == 4 and rec["total_input_vision_tokens"] == 4 * (SERVER_PROMPT_TOKENS - 24)
    assert "Traffic request rate:                    200.0" in capsys.readouterr().out
    for body in server.bodies[:4]:
        assert "ignore_eos" not in body and "min_tokens" not in body
        parts = body["messages"][0]["content"]
        assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
        from PIL import Image

        raw = base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1])
        img = Image.open(io.BytesIO(raw))
        assert (img.format, img.size) == ("PNG", (40, 24))
    assert native["completed"] == 2 and native["total_input_text_tokens"] == 48
    for body in server.bodies[4:]:
        assert len(body["image_data"]) == 3 and body["text"].startswith("<|vision_start|><|image_pad|>")


def test_sharegpt_run_from_local_file(tok_dir, one_tokenizer, tmp_path):
    text = "the quick brown fox jumps over the lazy dog"
    conv = [{"conversations": [{"from": "human", "value": f"{text} {i}"}, {"from": "gpt", "value": text}]}
            for i in range(5)]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(conv))
    with FakeServer(tok_dir) as server:
        rec = _bench(server, "--backend", "sglang", "--dataset-name", "sharegpt", "--dataset-path", str(path),
                     "--num-prompts", "3", "--sharegpt-output-len", "4")
    assert rec["completed"] == 3 and rec["total_output_tokens"] == 12
    assert len(server.bodies) == 4 and server.bodies[0]["text"] == server.bodies[1]["text"]  # warmup: the first


def test_all_warmups_failing_aborts(tok_dir, one_tokenizer):
    with FakeServer(tok_dir, fail_every=1) as server:
        with pytest.raises(SystemExit, match="warmup request"):
            _bench(server, "--backend", "sglang-oai-chat", "--dataset-name", "random-mm", "--num-prompts", "2",
                   "--random-mm-bucket-config", "{(16, 16, 1): 1.0}")


def test_failed_requests_never_crash_the_run(tok_dir, one_tokenizer, capsys):
    with FakeServer(tok_dir, fail_every=1) as server:
        rec = _bench(server, "--backend", "sglang", *EXACT, "--num-prompts", "3")
    out = capsys.readouterr().out
    assert rec["completed"] == 0 and "3 x HTTP 400: bad request" in out and "All requests failed" in out


def test_real_server_sglang_random(server, tmp_path):
    """One run against the real engine (the session's e2e server): native /generate, random dataset."""
    out_file = tmp_path / "real.jsonl"
    rec = bench_serving.main(["--base-url", server.url, "--backend", "sglang", "--dataset-name", "random",
                              "--num-prompts", "4", "--random-input-len", "16", "--random-output-len", "4",
                              "--random-range-ratio", "1", "--disable-tqdm", "--output-file", str(out_file)])
    assert rec["completed"] == 4 and rec["total_input_text_tokens"] == 64
    assert rec["total_output_tokens"] == 16  # ignore_eos: every request yields its 4 tokens
    assert rec["mean_ttft_ms"] > 0 and rec["mean_e2e_latency_ms"] >= rec["mean_ttft_ms"]
    assert json.loads(out_file.read_text())["completed"] == 4
    # Images through /generate: one placeholder per image in the text; the server counts the image tokens.
    for backend in ("sglang", "sglang-oai-chat"):
        img = bench_serving.main(["--base-url", server.url, "--backend", backend, "--dataset-name", "image",
                                  "--num-prompts", "2", "--image-count", "1", "--image-resolution", "64x64",
                                  "--random-input-len", "8", "--random-output-len", "2", "--random-range-ratio", "1",
                                  "--disable-tqdm", "--warmup-requests", "0"])
        assert img["completed"] == 2 and img["total_input_text_tokens"] == 16, backend
        assert img["total_input_vision_tokens"] > 0, backend


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
