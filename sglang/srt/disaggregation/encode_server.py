"""The encoder server of encoder disaggregation (EPD): `python -m sglang.launch_server --model-path M
--encoder-only --port P`.

It builds only the vision tower of the model's own class (`ViTStrategy.towers="vision"`: no decoder, no
LM head, no KV cache; the checkpoint's text tensors are never read) and answers:
- `GET /health`: 200 once the tower is loaded;
- `POST /encode`: a pickled `EncodeRequest` from a language server. Each item is looked up in this
  encoder's `ImageEmbeddingCache` by the content hash the language server computed (the key its radix
  cache uses too); the misses are decoded where still compressed (plain JPEGs: the deferred-decode path),
  normalized where uint8, and go through the tower in one call (`get_image_feature`, the model's own,
  deepstack features included: exactly the rows the language model's embedding merge consumes). The
  embeddings are pushed over ZMQ to the request's `reply_to`, then the call is answered with a JSON
  acknowledgement. A bad item is a 400 naming it; the language server answers its client 400 too.
- `GET /get_server_info`, `/get_model_info`: the cache's counters, the encoded item counts, the model.

One worker thread runs the tower (`EncodeBatcher`): the requests that arrived while it was busy go through
it together in its next call, their misses deduplicated by hash; a request with a bad item fails alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pickle
import threading
import time
from concurrent.futures import Future

import torch
from fastapi import FastAPI, Request

from sglang.srt.disaggregation.encode_protocol import ENCODE_PATH, EncodedEmbeddings, EncodeRequest
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

PUSH_TIMEOUT_MS = 10_000  # longest a push waits for the language server's socket (then a 500: retried elsewhere)
MAX_PUSH_SOCKETS = 64


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
        self._push(req.reply_to, msg.frames())
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


def _decoded(item):
    """A compressed JPEG decoded strictly (the tokenizer's PIL path, bit for bit): a file broken past its
    header is the request's 400 here, as it is on a server that decodes in its tokenizer, never a blank."""
    from sglang.srt.multimodal.deferred_decode import strict_pil_pixels
    from sglang.srt.multimodal.mm_types import EncodedImage

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


def create_encoder_app(engine: EncoderEngine):
    app = FastAPI()
    batcher = EncodeBatcher(engine)

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

    @app.post(ENCODE_PATH)
    async def encode(request: Request):
        try:
            req = pickle.loads(await request.body())
            if not isinstance(req, EncodeRequest):
                raise TypeError(f"expected an EncodeRequest, got {type(req).__name__}")
        except Exception as e:
            return _error(f"malformed encode request: {type(e).__name__}: {e}", 400)
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
    app = create_encoder_app(engine)
    config = uvicorn.Config(app, host=server_args.host, port=server_args.port, log_level=server_args.log_level,
                            access_log=server_args.log_level == "debug", loop="asyncio", http="h11")
    logger.info("encoder serving on http://%s:%d", server_args.host, server_args.port)
    try:
        uvicorn.Server(config).run()
    finally:
        app.state.batcher.close()
        engine.close()
    return 0
