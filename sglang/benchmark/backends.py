"""Backends: which route each one calls, the request body it sends, and the server queries shared by all.

| backend                                  | route                   | prompt                     | extensions sent              |
|------------------------------------------|-------------------------|----------------------------|------------------------------|
| sglang                                   | POST /generate          | `text` or `input_ids`      | sampling_params.ignore_eos   |
| sglang-oai, vllm                         | POST /v1/completions    | `prompt` (text or ids)     | ignore_eos                   |
| openai                                   | POST /v1/completions    | `prompt` (text or ids)     | none (OpenAI fields only)    |
| sglang-oai-chat                          | POST /v1/chat/completions | `messages`               | ignore_eos, min_tokens       |
| vllm-chat                                | POST /v1/chat/completions | `messages`               | ignore_eos                   |
| openai-chat                              | POST /v1/chat/completions | `messages`               | none                         |

Every body asks for greedy sampling (`temperature: 0`) and the dataset's output length; streamed OpenAI
requests set `stream_options.include_usage` so the server reports token counts. `--extra-request-body` is
merged last (`merge_extra`). Images go as `image_data` (native) or `image_url` parts (chat); the completions
API has no image field, so image datasets need the `sglang` or a chat backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from sglang.benchmark.datasets import SampleRequest, apply_chat_template, image_placeholder, video_placeholder

GENERATE_PATH = "/generate"
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
API_PATHS = {"generate": GENERATE_PATH, "completions": COMPLETIONS_PATH, "chat": CHAT_PATH}
JSON_HEADERS = {"Content-Type": "application/json"}
TIMEOUT = aiohttp.ClientTimeout(total=6 * 60 * 60)


@dataclass(frozen=True)
class Backend:
    api: str  # generate | completions | chat
    default_port: int
    ignore_eos: bool  # sends the ignore_eos extension
    min_tokens: bool = False  # also sends min_tokens = max_tokens


BACKENDS: dict[str, Backend] = {
    "sglang": Backend("generate", 30000, True),
    "sglang-oai": Backend("completions", 30000, True),
    "sglang-oai-chat": Backend("chat", 30000, True, min_tokens=True),
    "vllm": Backend("completions", 8000, True),
    "vllm-chat": Backend("chat", 8000, True),
    "openai": Backend("completions", 30000, False),
    "openai-chat": Backend("chat", 30000, False),
}


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose from {tuple(BACKENDS)}") from None


def api_url(base_url: str, backend: str) -> str:
    return base_url.rstrip("/") + API_PATHS[get_backend(backend).api]


def merge_extra(body: dict[str, Any], extra: dict[str, Any] | None) -> dict[str, Any]:
    """`extra` over `body`: top-level keys replace, except that dict values (sampling_params,
    stream_options, ...) are merged one level deep."""
    out = dict(body)
    for k, v in (extra or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


@dataclass
class Prompt:
    """What a non-chat backend sends as the prompt, and its text-token count."""
    value: str | list[int]
    text_len: int


def prepare_prompt(req: SampleRequest, api: str, tokenizer=None, chat_template: bool = False) -> Prompt:
    """The prompt of a /generate or /v1/completions request: token ids as they are (`random-ids`), else the
    text, rendered through the tokenizer's chat template with `--apply-chat-template`, with one image
    placeholder per image for /generate. Text tokens exclude the image placeholders."""
    n_img, n_vid = len(req.images), len(req.videos)
    if (n_img or n_vid) and api != "generate":
        raise ValueError("the completions API takes no images or videos; use --backend sglang or a *-chat backend")
    if req.prompt_ids is not None and not chat_template:
        return Prompt(list(req.prompt_ids), len(req.prompt_ids))
    if not chat_template and not n_img and not n_vid:
        return Prompt(req.prompt, req.prompt_len)
    if tokenizer is None:
        raise ValueError("a tokenizer is needed to add a chat template or image placeholders")
    if chat_template:
        text = apply_chat_template(tokenizer, req.prompt, n_img, req.images_first, n_vid)
    else:
        ph = image_placeholder(tokenizer) * n_img + video_placeholder(tokenizer) * n_vid
        text = ph + req.prompt if req.images_first else req.prompt + ph
    count = len(tokenizer.encode(text, add_special_tokens=False))
    per_image = len(tokenizer.encode(image_placeholder(tokenizer), add_special_tokens=False)) if n_img else 0
    per_video = len(tokenizer.encode(video_placeholder(tokenizer), add_special_tokens=False)) if n_vid else 0
    return Prompt(text, max(0, count - n_img * per_image - n_vid * per_video))


def build_body(backend: str, model: str | None, req: SampleRequest, prompt: Prompt | None = None, *,
               ignore_eos: bool = True, stream: bool = True, extra: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """The JSON body of one request (`prompt` from `prepare_prompt`, needed for the non-chat APIs)."""
    b = get_backend(backend)
    if b.api == "generate":
        body: dict[str, Any] = {"input_ids" if isinstance(prompt.value, list) else "text": prompt.value}
        body["sampling_params"] = {"temperature": 0.0, "max_new_tokens": req.output_len, "ignore_eos": ignore_eos}
        if req.images:
            body["image_data"] = list(req.images)
        if req.videos:
            body["video_data"] = list(req.videos)
        body["stream"] = stream
        return merge_extra(body, extra)
    body = {"model": model}
    if b.api == "completions":
        body["prompt"] = prompt.value
    else:
        content = req.content() if req.images or req.videos else req.prompt
        body["messages"] = [{"role": "user", "content": content}]
    body.update({"max_tokens": req.output_len, "temperature": 0.0, "stream": stream})
    if stream:
        body["stream_options"] = {"include_usage": True}
    if b.ignore_eos and ignore_eos:
        body["ignore_eos"] = True
        if b.min_tokens:
            body["min_tokens"] = req.output_len
    return merge_extra(body, extra)


def build_chat_body(backend: str, model: str, req: SampleRequest, ignore_eos: bool = True) -> dict[str, Any]:
    """A streamed chat body (kept for callers that only speak the chat API)."""
    if get_backend(backend).api != "chat":
        raise ValueError(f"{backend} is not a chat backend")
    return build_body(backend, model, req, ignore_eos=ignore_eos)


# ----------------------------------------------------------------------------- server queries
def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err if err is not None else obj)


async def http_error(resp: aiohttp.ClientResponse) -> str:
    raw = await resp.read()
    try:
        detail = _error_text(orjson.loads(raw))
    except orjson.JSONDecodeError:
        detail = raw.decode("utf-8", "replace").strip()
    return f"HTTP {resp.status}: {detail[:300]}"


async def iter_sse(resp: aiohttp.ClientResponse):
    """The `data:` payloads of a server-sent-event stream, `[DONE]` included; comments and blanks skipped.
    Buffers raw bytes itself so long events are not cut by aiohttp's line-length limit."""
    buf = b""
    async for piece in resp.content.iter_any():
        buf += piece
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip().decode("utf-8")
    line = buf.strip()
    if line.startswith(b"data:"):
        yield line[5:].strip().decode("utf-8")


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {url} -> {await http_error(resp)}")
        return orjson.loads(await resp.read())


async def default_model(session: aiohttp.ClientSession, base_url: str) -> str:
    data = await get_json(session, base_url + "/v1/models")
    models = data.get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return models[0]["id"]


async def server_model_path(session: aiohttp.ClientSession, base_url: str) -> str | None:
    """`tokenizer_path`/`model_path` from SGLang's /get_model_info, or None where the server has no such route."""
    try:
        info = await get_json(session, base_url + "/get_model_info")
    except (RuntimeError, aiohttp.ClientError, orjson.JSONDecodeError):
        return None
    return info.get("tokenizer_path") or info.get("model_path")


async def flush_cache(session: aiohttp.ClientSession, base_url: str) -> str | None:
    """POST /flush_cache; None on success, else why it failed (the run goes on)."""
    try:
        async with session.post(base_url + "/flush_cache") as resp:
            return None if resp.status == 200 else await http_error(resp)
    except aiohttp.ClientError as e:
        return f"{type(e).__name__}: {e}"
