"""End-to-end fixtures: the real server (`python -m sglang.launch_server`) on the tiny model, images,
and a local HTTP server for image URLs.

Every launched server runs with its own TMPDIR, so its private ipc:// directory can be checked for
after shutdown; at teardown no child process may survive and no ipc directory may be left."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image

from sglang.srt.utils.network import pick_unused_port
from sglang.srt.utils.process_tree import child_pids

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

def _test_device() -> str:
    from sglang.srt.environ import envs

    return envs.SGLANG_TEST_DEVICE.get()


# Servers run on SGLANG_TEST_DEVICE (cpu by default; gpu_check.sh sets cuda), always in float32 with exact
# (ieee, not tf32) attention dots so that greedy tokens are compared exactly with transformers on the same device.
TEST_DEVICE = _test_device()
BASE_ARGS = ["--dtype", "float32", "--device", TEST_DEVICE, "--log-level", "warning", "--attention-fp32-precision", "ieee"]




def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(pred, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def private_shm_prefix(size: str) -> list[str] | None:
    """A command prefix that runs the server in its own mount namespace with a `size` tmpfs on
    /dev/shm (a container's small /dev/shm, or another node's), or None where unshare is not allowed."""
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /dev/shm"],
                           capture_output=True)
    if probe.returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"', "sh"]


def shm_sglang_entries() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if "sglang" in n}
    except FileNotFoundError:
        return set()


class ServerProcess:
    """One `python -m sglang.launch_server` subprocess."""

    def __init__(self, model_dir: Path, workdir: Path, extra_args: list[str], cmd_prefix: list[str] | None = None,
                 env: dict[str, str] | None = None):
        self.port = pick_unused_port()
        self.model_dir = model_dir
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmpdir = workdir / "tmp"
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "server.log"
        self.shm_before = shm_sglang_entries()
        # One intra-op thread: with several torch processes on a small machine, spinning OpenMP
        # workers otherwise make the suite's run time depend on the machine's load.
        env = dict(os.environ, TMPDIR=str(self.tmpdir), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **(env or {}))
        cmd = [*(cmd_prefix or []), sys.executable, "-m", "sglang.launch_server", "--port", str(self.port),
               "--model-path", str(model_dir), *BASE_ARGS, *extra_args]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.children: dict[int, str] = {}

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode} during start-up:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    self.children = child_pids(self.proc.pid)
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        self.proc.kill()
        raise AssertionError(f"server not healthy within {timeout:g} s:\n{self.log_tail()}")

    def pid_of(self, comm: str) -> int:
        return next(pid for pid, name in self.children.items() if name == comm)

    def ipc_dirs(self) -> list[str]:
        return [p.name for p in self.tmpdir.glob("sglang-ipc-*")]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"server ignored signal {sig} for {STOP_TIMEOUT_S:g} s:\n{self.log_tail()}")
        finally:
            self._log.close()
        return self.proc.returncode

    def close(self, sig: int = signal.SIGTERM) -> None:
        """Stops the server with `sig` and checks it left nothing behind. SIGKILL leaves no chance to
        clean up: the children must notice their parent is gone, exit and remove the ipc dir."""
        code = self.stop(sig)
        assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 0), self.log_tail()
        self.assert_clean()

    def assert_clean(self) -> None:
        """No child left running, no ipc directory, no new sglang shared-memory segment."""
        wait_until(lambda: not any(pid_alive(p) for p in self.children), 10, what="children to exit")
        assert self.ipc_dirs() == [], f"ipc directories left behind: {self.ipc_dirs()}"
        # only this server's own segments (other servers of the session may have requests in flight)
        own = {n for n in shm_sglang_entries() - self.shm_before if n.startswith(f"sglang_mm_{self.port}_")}
        assert not own, f"shared-memory segments left behind: {sorted(own)}"


@pytest.fixture(scope="session")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("qwen3-vl-tiny")


@pytest.fixture(scope="session")
def launch_server(model_dir, tmp_path_factory):
    """Returns `launch(*extra_args) -> ServerProcess` (healthy); servers still running at session end
    are stopped and checked for leftovers."""
    started: list[ServerProcess] = []

    def launch(*extra_args: str, env: dict[str, str] | None = None, model: Path | None = None) -> ServerProcess:
        args = list(extra_args)
        if not any(a.startswith("--mm-processor-worker-num") for a in args):
            # the suite's servers keep the in-process front-end: a preprocessing worker costs each server ~3.5 s
            # of CPU to start on 2 cores; the worker path has its own e2e (test_mm_processor_workers_server.py)
            args += ["--mm-processor-worker-num", "0"]
        s = ServerProcess(model or model_dir, tmp_path_factory.mktemp("server"), args, env=env)
        started.append(s)
        return s.wait_healthy()

    yield launch
    errors = []
    for s in started:  # stop every server, even after one fails its leftovers check
        if s.proc.poll() is None:
            try:
                s.close()
            except AssertionError as e:
                errors.append(str(e)[:2000])
    assert not errors, "\n".join(errors)


# ----------------------------------------------------------------------------- images and media
def noise_image(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


class MediaServer:
    """Local HTTP server on 127.0.0.1: /img.png, /big.bin (oversized), /slow (answers late), 404 otherwise.
    `paths` lists every path asked for, in order (what the engine actually fetched)."""

    def __init__(self, files: dict[str, bytes], slow_s: float):
        media = self
        self.paths: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                media.paths.append(self.path)  # list.append is atomic: handler threads need no lock
                if self.path == "/slow":
                    media.release.wait(slow_s)
                body = files.get(self.path.lstrip("/"))
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        class QuietServer(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # clients that gave up (the fetch-timeout case) break the pipe: expected

        self.release = threading.Event()
        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="session")
def media_server():
    img = png_bytes(noise_image(96, 64, 7))
    s = MediaServer({"img.png": img, "slow": img, "big.bin": b"\0" * 1_500_000}, slow_s=5.0)
    yield s
    s.close()


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("media")
    noise_image(64, 96, 11).save(d / "allowed.png")
    return d


@pytest.fixture(scope="session")
def outside_image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("outside") / "secret.png"
    noise_image(64, 64, 12).save(path)
    return path


# The server most tests share: small image / fetch limits so the bad-input cases are cheap to hit.
# The media server lives on loopback, refused by default: this server allows it by name.
MAIN_SERVER_ARGS = ("--limit-mm-per-prompt", "4", "--media-fetch-timeout", "1", "--media-max-bytes", "1000000",
                    "--allowed-media-domains", "127.0.0.1", "--max-request-body-mb", "4")


@pytest.fixture(scope="session")
def tools_server(launch_server) -> ServerProcess:
    """Tool calls and reasoning (test_tool_calls.py, test_reasoning.py): the tool-call format picked from the
    chat template, the qwen3 reasoning split, JSON whitespace runs capped (the random model pads JSON)."""
    return launch_server("--reasoning-parser", "qwen3", "--constrained-json-max-whitespace-cnt", "2")


@pytest.fixture(scope="session")
def server(launch_server, media_dir) -> ServerProcess:
    return launch_server(*MAIN_SERVER_ARGS, "--allowed-local-media-path", str(media_dir))


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


# ----------------------------------------------------------------------------- transformers reference
class HFReference:
    """Greedy generation with transformers on the same weights, from the same chat template and images."""

    def __init__(self, model_dir: Path):
        import torch
        import transformers

        from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

        self.torch = torch
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.model.to(TEST_DEVICE)
        self.processor = QwenVLProcessor.from_pretrained(str(model_dir), self.tokenizer)
        self._cache: dict = {}

    def render(self, template_messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(template_messages, tokenize=False, add_generation_prompt=True)

    def prompt(self, template_messages: list[dict], images: list[Image.Image]):
        ids = self.tokenizer.encode(self.render(template_messages), add_special_tokens=False)
        return self.processor.process(ids, images)

    def _inputs(self, template_messages: list[dict], images: list[Image.Image]):
        torch = self.torch
        ids, mm = self.prompt(template_messages, images)
        t = torch.tensor([ids], device=TEST_DEVICE)
        kwargs = {"mm_token_type_ids": (t == mm.im_token_id).long()}
        if images:
            kwargs["pixel_values"] = torch.cat([torch.as_tensor(it.feature) for it in mm.mm_items]).to(TEST_DEVICE)
            kwargs["image_grid_thw"] = torch.tensor([list(it.image_grid_thw) for it in mm.mm_items], device=TEST_DEVICE)
        return ids, t, kwargs

    def prompt_logprobs(self, template_messages: list[dict], images: list[Image.Image], top_n: int = 0):
        """(prompt ids, log-probability of prompt token i given the tokens before it for i >= 1, and the
        top_n (logprob, id) alternatives at each of those positions)."""
        torch = self.torch
        ids, t, kwargs = self._inputs(template_messages, images)
        with torch.no_grad():
            logits = self.model(input_ids=t, attention_mask=torch.ones_like(t), **kwargs).logits[0].float()
        lsm = torch.log_softmax(logits[:-1], dim=-1)
        chosen = lsm.gather(1, t[0, 1:, None]).squeeze(1).tolist()
        top = []
        if top_n:
            v, i = lsm.topk(top_n, dim=-1)
            top = [list(zip(a, b)) for a, b in zip(v.tolist(), i.tolist())]
        return ids, chosen, top

    def greedy(self, key: str, template_messages: list[dict], images: list[Image.Image], max_new_tokens: int) -> list[int]:
        key = (key, max_new_tokens)  # the same prompt is asked for with different lengths
        if key not in self._cache:
            torch = self.torch
            ids, t, kwargs = self._inputs(template_messages, images)
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=t, attention_mask=torch.ones_like(t), max_new_tokens=max_new_tokens, do_sample=False, **kwargs
                )
            self._cache[key] = out[0, len(ids):].tolist()
        return self._cache[key]


@pytest.fixture(scope="session")
def hf_ref(model_dir) -> HFReference:
    return HFReference(model_dir)


# Prompts as parts: ("text", str) or ("image", (width, height, seed)), in order.
CASES: dict[str, list[tuple]] = {
    "text_only": [("text", "Tell me a short story about a robot who learns to paint.")],
    "one_image": [("text", "Describe this picture:"), ("image", (256, 256, 1))],
    "three_images_mixed_sizes": [
        ("image", (96, 64, 2)), ("text", "and"), ("image", (160, 320, 3)),
        ("text", "versus"), ("image", (256, 192, 4)), ("text", "compare them."),
    ],
    "image_before_text": [("image", (128, 96, 5)), ("text", "What is this?")],
    "text_before_image": [("text", "What is in this image?"), ("image", (96, 128, 6))],
}


def build_case(parts: list[tuple]) -> tuple[list[dict], list[dict], list[Image.Image]]:
    """-> (OpenAI messages with data URLs, template messages with image parts, PIL images)."""
    api_content, tmpl_content, images = [], [], []
    for kind, value in parts:
        if kind == "text":
            api_content.append({"type": "text", "text": value})
            tmpl_content.append({"type": "text", "text": value})
        else:
            img = noise_image(*value)
            images.append(img)
            api_content.append({"type": "image_url", "image_url": {"url": data_url(png_bytes(img))}})
            tmpl_content.append({"type": "image"})
    return [{"role": "user", "content": api_content}], [{"role": "user", "content": tmpl_content}], images
