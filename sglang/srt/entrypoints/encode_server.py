"""The encoder server of encoder disaggregation (EPD): `python -m sglang.launch_server --model-path M
--encoder-only --port P`.

It builds only the vision tower of the model's own class (`ViTStrategy.towers="vision"`: no decoder, no
LM head, no KV cache; the checkpoint's text tensors are never read) and answers:
- `GET /health`: 200 once the tower is loaded;
- `POST /register`: a language server names the endpoint it receives embeddings on (`reply_to`, whose
  host must be the address the call came from) and gets this encoder's model identity back to compare
  with its own (`model_identity.py`). Embeddings are pushed only to registered endpoints.
- `POST /encode`: an `EncodeRequest` in the typed wire form (`encode_wire.py`: never a pickle), every field
  checked against this encoder's own vision config. Each item is looked up in this encoder's
  `ImageEmbeddingCache` by the hash this encoder computes over the bytes it received (a stated hash is
  never trusted, so nobody can plant embeddings under another image's key); the misses are decoded where
  still compressed (plain JPEGs, with this encoder's own image processor config), normalized where uint8,
  and go through the tower in one call (`get_image_feature`, the model's own, deepstack features included:
  exactly the rows the language model's embedding merge consumes). The embeddings are pushed over ZMQ to
  the request's `reply_to` (with a MAC keyed by `--api-key` when one is set), then the call is answered
  with a JSON acknowledgement. A bad item is a 400 naming it; the language server answers its client 400.
- `GET /get_server_info`, `/get_model_info`: the cache's counters, the encoded item counts, the model.

One worker thread runs the tower (`EncodeBatcher`): the requests that arrived while it was busy go through
it together in its next call, their misses deduplicated by hash; a request with a bad item fails alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

import torch
from fastapi import FastAPI, Request

from sglang.srt.disaggregation.encode_protocol import ENCODE_PATH, REGISTER_PATH, EncodedEmbeddings, EncodeRequest
from sglang.srt.disaggregation.encode_wire import (WireError, content_key, decode_request_body, embedding_frames,
                                                   mac_key)
from sglang.srt.disaggregation.model_identity import model_identity
from sglang.srt.multimodal.mm_types import EncodedImage, Modality
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

PUSH_TIMEOUT_MS = 10_000  # longest a push waits for the language server's socket (then a 500: retried elsewhere)
MAX_PUSH_SOCKETS = 64
MAX_REGISTERED = 256  # reply_to endpoints remembered (least recently registered forgotten first)


class Unregistered(Exception):
    """An /encode whose reply_to never registered here (or was forgotten): the caller registers, then retries."""


class EncoderEngine:
    """The vision tower, its embedding cache and the ZMQ sockets embeddings leave on. Thread-confined:
    call `encode` / `encode_batch` from one thread at a time (the batcher's worker thread)."""

    def __init__(self, server_args: ServerArgs):
        import zmq

        from sglang.srt.configs.vit_strategy import ViTStrategy
        from sglang.srt.environ import envs
        from sglang.srt.layers.attention.vision_attention import configure_vision_attention
        from sglang.srt.mem_cache.mm_embedding_cache import ImageEmbeddingCache
        from sglang.srt.model_loader.loader import get_model

        self.server_args = server_args
        self.model_path = server_args.resolved_model_path()
        self.device = torch.device(server_args.resolved_device())
        vit = ViTStrategy.from_env(towers="vision")
        self.model = get_model(self.model_path, server_args.dtype, self.device, vit=vit)
        if getattr(self.model, "visual", None) is None or not hasattr(self.model, "get_image_feature"):
            raise ValueError(f"--encoder-only needs a vision-language model; {self.model_path} "
                             f"({type(self.model).__name__}) has no vision tower")
        configure_vision_attention(self.model, server_args.resolved_attention_backends()[1],
                                   server_args.attention_fp32_precision)
        self.cache = ImageEmbeddingCache(int(envs.SGLANG_VLM_CACHE_SIZE_MB.get() * 2**20))
        from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor

        self.image_processor = QwenVLImageProcessor.from_pretrained(self.model_path)
        self.identity = model_identity(self.model_path)
        self.mac_key = mac_key(server_args.api_key)
        self.max_body = int(server_args.max_payload_size)
        self.registered: OrderedDict[str, float] = OrderedDict()
        self.address = f"http://{server_args.host}:{server_args.port}"
        self._zmq = zmq.Context(1)
        self._sockets: dict[str, object] = {}  # reply_to -> PUSH socket, least recently used first
        self.push_timeout_ms = PUSH_TIMEOUT_MS
        self.num_requests = 0
        self.num_encoded = 0
        self.num_cached = 0
        self.num_batches = 0  # tower calls

    def _socket(self, addr: str):
        import zmq

        sock = self._sockets.pop(addr, None)
        if sock is None:
            sock = self._zmq.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only on a live connection: a dead peer is an error, not a backlog
            sock.setsockopt(zmq.SNDTIMEO, self.push_timeout_ms)
            sock.connect(addr)
        self._sockets[addr] = sock  # most recently used last
        while len(self._sockets) > MAX_PUSH_SOCKETS:  # language servers that went away (new ports)
            self._sockets.pop(next(iter(self._sockets))).close(linger=0)
        return sock

    def _push(self, addr: str, frames: list) -> None:
        import zmq

        try:
            self._socket(addr).send_multipart(frames, copy=False)
        except zmq.Again:
            self._sockets.pop(addr).close(linger=0)
            raise RuntimeError(f"could not push the embeddings to {addr} within {self.push_timeout_ms} ms "
                               "(is the language server up, and its embedding port reachable from here?)") from None

    def register(self, reply_to: str, peer: str | None) -> dict:
        """Accepts `reply_to` as a push target when its host is the caller's own address (both loopback
        counts as the same): an encoder never pushes to a machine that did not ask it to."""
        from urllib.parse import urlsplit

        try:
            url = urlsplit(str(reply_to))
            host, port = url.hostname, url.port
            if url.scheme != "tcp" or not host or not port:
                raise ValueError
            target = ipaddress.ip_address(host)
        except ValueError:
            raise WireError(f"reply_to must be tcp://<ip>:<port>, got {str(reply_to)[:100]!r}") from None
        try:
            caller = ipaddress.ip_address(peer or "")
        except ValueError:
            caller = None
        same = caller is not None and (target == caller or (target.is_loopback and caller.is_loopback))
        if not same:
            raise PermissionError(f"reply_to {reply_to} is not the caller's address ({peer}): register from the "
                                  "language server that receives the embeddings")
        self.registered.pop(reply_to, None)
        self.registered[reply_to] = time.time()
        while len(self.registered) > MAX_REGISTERED:
            self.registered.popitem(last=False)
        return {"ok": True, "identity": self.identity}

    def accept(self, body: bytes) -> EncodeRequest:
        """The request a body carries, every item checked against this tower's config and keyed by this
        encoder's own content hash; WireError (400) or Unregistered (409) otherwise."""
        req, raw = decode_request_body(body, self.max_body)
        if req.reply_to not in self.registered:
            raise Unregistered(req.reply_to)
        vcfg = self.model.config.vision
        for index, item, r in zip(req.item_indices, req.items, raw):
            check_item(index, item, vcfg, self.image_processor.max_pixels)
            item.hash = content_key(r)
            if isinstance(item.feature, EncodedImage):
                item.feature.processor = self.image_processor
        return req

    def encode_batch(self, reqs: list[EncodeRequest], queued_at: list[float] | None = None) -> list:
        """Each request's EncodedEmbeddings (CPU), or the ValueError / OSError of its bad item (that request
        alone fails). Cache hits are served as they are; the misses of all the requests, deduplicated by
        hash, go through the tower in one call. `encode_ms` of a request counts from `queued_at` (its arrival
        in the batcher's queue) to the end of the call."""
        out: list[list] = []
        results: list = [None] * len(reqs)
        todo: dict = {}  # hash (or a per-item key) -> the decoded item
        wants: list[list[tuple[int, object]]] = []
        for r, req in enumerate(reqs):
            row, want, mine = [None] * len(req.items), [], {}
            try:
                for k, item in enumerate(req.items):
                    hit = self.cache.get_image(item.hash) if item.hash is not None else None
                    if hit is not None:
                        row[k] = hit
                        continue
                    key = item.hash if item.hash is not None else ("unhashed", r, k)
                    if key not in todo and key not in mine:
                        mine[key] = _decoded(item)  # a broken JPEG: ValueError (this request's 400)
                    want.append((k, key))
            except (ValueError, OSError) as e:
                results[r] = e
                row, want, mine = None, [], {}
            todo.update(mine)
            out.append(row)
            wants.append(want)
        encoded: dict = {}
        if todo:
            with torch.inference_mode():
                embs = self.model.get_image_feature(list(todo.values()))
            for key, emb in zip(todo, embs):
                encoded[key] = emb.to("cpu").contiguous()
                if not (isinstance(key, tuple) and key and key[0] == "unhashed"):
                    self.cache.put_image(key, encoded[key])
            self.num_batches += 1
        self.num_encoded += len(todo)
        now = time.perf_counter()
        for r, req in enumerate(reqs):
            if results[r] is not None:
                continue
            row = out[r]
            for k, key in wants[r]:
                row[k] = encoded[key]
            cached = len(req.items) - len(wants[r])
            self.num_requests += 1
            self.num_cached += cached
            start = queued_at[r] if queued_at else now
            results[r] = EncodedEmbeddings(req.rid, list(req.item_indices), row, (now - start) * 1e3, cached,
                                           self.address)
        return results

    def encode(self, req: EncodeRequest) -> EncodedEmbeddings:
        """One request alone (raises ValueError / OSError for a bad item)."""
        start = time.perf_counter()
        (res,) = self.encode_batch([req], [start])
        if isinstance(res, Exception):
            raise res
        return res

    def push(self, req: EncodeRequest, msg: EncodedEmbeddings) -> dict:
        self._push(req.reply_to, embedding_frames(msg, self.mac_key))
        return {"ok": True, "rid": req.rid, "items": len(req.items), "cached": msg.cached,
                "encode_ms": round(msg.encode_ms, 3)}

    def stats(self) -> dict:
        return {"role": "encoder", "model_path": self.model_path, "num_requests": self.num_requests,
                "num_tower_calls": self.num_batches,
                "num_encoded_items": self.num_encoded, "num_cached_items": self.num_cached,
                "mm_embedding_cache_bytes": self.cache.current_bytes, "mm_embedding_cache_hits": self.cache.hits,
                "mm_embedding_cache_misses": self.cache.misses}

    def close(self) -> None:
        self._zmq.destroy(linger=1000)


def check_item(index: int, item, vcfg, max_pixels: int | None = None) -> None:
    """The item's grid, shape and recipe fit this tower (a WireError naming the item otherwise): what the
    tower would otherwise find out as a shape error deep inside, or not at all."""
    p, tp, m = vcfg.patch_size, vcfg.temporal_patch_size, vcfg.spatial_merge_size
    t, h, w = item.image_grid_thw
    feature = item.feature
    still = item.modality == Modality.IMAGE and t == 1

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise WireError(f"item {index}: {what} (grid {tuple(item.image_grid_thw)}, patch {p}, merge {m})")

    need(item.spatial_merge_size == m and h % m == 0 and w % m == 0, "the grid does not fit the spatial merge")
    if isinstance(feature, EncodedImage):
        need(t == 1 and tuple(feature.target_hw) == (h * p, w * p), f"target size {feature.target_hw} is not the grid's")
        need(max_pixels is None or h * p * w * p <= max_pixels, f"target size {feature.target_hw} is over the "
             f"image processor's {max_pixels} pixels")
    elif item.pixel_norm is None:
        # a still image may come compact (SGLANG_MM_COMPACT_STILL_IMAGES on the sender): one frame per patch row
        widths = (3 * tp * p * p, 3 * p * p) if still else (3 * tp * p * p,)
        need(tuple(feature.shape) in [(t * h * w, wd) for wd in widths], f"pixel_values of shape {tuple(feature.shape)}")
    else:
        n = item.pixel_norm
        need((n.patch_size, n.merge_size) == (p, m) and n.temporal_patch_size in ((tp, 1) if still else (tp,)),
             "the pixel recipe's patch sizes differ")
        if n.kind == "image":
            need(t == 1 and tuple(feature.shape) == (h * p, w * p, 3), f"uint8 image of shape {tuple(feature.shape)}")
        else:
            frames = feature.shape[0]
            need(tuple(feature.shape[1:]) == (h * p, w * p, 3) and -(-frames // tp) == t,
                 f"uint8 video of shape {tuple(feature.shape)}")


def _decoded(item):
    """A compressed JPEG decoded strictly (the tokenizer's PIL path, bit for bit): a file broken past its
    header is the request's 400 here, as it is on a server that decodes in its tokenizer, never a blank."""
    from sglang.srt.multimodal.deferred_decode import strict_pil_pixels

    if not isinstance(item.feature, EncodedImage):
        return item
    return dataclasses.replace(item, feature=strict_pil_pixels(item.feature))


def _error(message: str, status: int):
    from fastapi.responses import JSONResponse

    err_type = "invalid_request_error" if status == 400 else "internal_error"
    return JSONResponse({"error": {"message": message, "type": err_type, "code": status}}, status_code=status)


class EncodeBatcher:
    """One worker thread in front of the tower: requests that arrived while it was busy are encoded together
    in its next call (at most `max_batch`), then each request's embeddings are pushed and its future set."""

    def __init__(self, engine: EncoderEngine, max_batch: int = 32):
        self.engine = engine
        self.max_batch = max_batch
        self._cv = threading.Condition()
        self._queue: list[tuple[EncodeRequest, float, Future]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="sglang-encoder", daemon=True)
        self._thread.start()

    def submit(self, req: EncodeRequest) -> Future:
        fut: Future = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the encoder is shutting down")
            self._queue.append((req, time.perf_counter(), fut))
            self._cv.notify()
        return fut

    def close(self) -> None:
        with self._cv:
            self._closed = True
            for _, _, fut in self._queue:
                fut.set_exception(RuntimeError("the encoder is shutting down"))
            self._queue.clear()
            self._cv.notify()
        self._thread.join(10)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                results = self.engine.encode_batch([r for r, _, _ in batch], [t for _, t, _ in batch])
            except Exception as e:  # the tower itself failed: every request of the call
                logger.exception("encoding %d request(s) failed", len(batch))
                results = [e] * len(batch)
            for (req, _, fut), res in zip(batch, results):
                try:
                    if isinstance(res, Exception):
                        raise res
                    fut.set_result(self.engine.push(req, res))
                except Exception as e:
                    fut.set_exception(e)


def create_encoder_app(engine: EncoderEngine, api_key: str | None = None):
    """The encoder's HTTP API: `--api-key` guards every route but /health (as on a server), and bodies
    past `--max-payload-size` are refused before they are read."""
    from sglang.srt.entrypoints.auth import ApiKeyAuth
    from sglang.srt.entrypoints.body_limit import BodySizeLimit

    app = FastAPI()
    batcher = EncodeBatcher(engine)
    app.add_middleware(BodySizeLimit, max_bytes=engine.max_body,
                       on_refuse=lambda msg: _error(f"Payload Too Large: {msg}", 413))
    if api_key:  # added last: it runs first, before the body is read
        app.add_middleware(ApiKeyAuth, api_key=api_key, on_refuse=lambda msg: _error(msg, 401))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate():
        return {"status": "ok"}

    @app.get("/get_server_info")
    async def server_info():
        return engine.stats()

    @app.get("/get_model_info")
    async def model_info():
        return {"model_path": engine.model_path, "is_generation": False, "role": "encoder"}

    @app.post(REGISTER_PATH)
    async def register(request: Request):
        try:
            body = await request.json()
            return engine.register(body.get("reply_to") if isinstance(body, dict) else None,
                                   request.client.host if request.client else None)
        except PermissionError as e:
            return _error(str(e), 403)
        except (ValueError, TypeError) as e:  # WireError, JSON
            return _error(f"malformed register request: {e}", 400)

    @app.post(ENCODE_PATH)
    async def encode(request: Request):
        body = await request.body()
        try:  # off the loop: the checks copy pixel bytes
            req = await asyncio.get_running_loop().run_in_executor(None, engine.accept, body)
        except Unregistered as e:
            return _error(f"reply_to {e} is not registered here: POST {REGISTER_PATH} first", 409)
        except (ValueError, TypeError, OverflowError) as e:
            return _error(f"malformed encode request: {e}", 400)
        try:
            return await asyncio.wrap_future(batcher.submit(req))
        except (ValueError, OSError) as e:  # a bad image (undecodable, wrong size): the request's fault
            return _error(f"{type(e).__name__}: {e}", 400)
        except Exception as e:
            logger.exception("encoding request %s failed", req.rid)
            return _error(f"encoder failed: {type(e).__name__}: {e}", 500)

    app.state.batcher = batcher
    return app


def launch_encoder_server(server_args: ServerArgs) -> int:
    """Loads the vision tower and serves until SIGINT/SIGTERM."""
    import uvicorn

    engine = EncoderEngine(server_args)
    nparams = sum(p.numel() for p in engine.model.parameters())
    logger.info("encoder-only: vision tower of %s loaded (%.1f M parameters, no text decoder, no KV cache)",
                engine.model_path, nparams / 1e6)
    app = create_encoder_app(engine, server_args.api_key)
    config = uvicorn.Config(app, host=server_args.host, port=server_args.port, log_level=server_args.log_level,
                            access_log=server_args.log_level == "debug", loop="asyncio", http="h11")
    logger.info("encoder serving on http://%s:%d", server_args.host, server_args.port)
    try:
        uvicorn.Server(config).run()
    finally:
        app.state.batcher.close()
        engine.close()
    return 0
