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

One request's items are encoded in one call, requests one after another on one worker thread (the
tower is the bottleneck; concurrent HTTP calls queue there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from fastapi import FastAPI, Request

from sglang.srt.disaggregation.encode_protocol import ENCODE_PATH, EncodedEmbeddings, EncodeRequest
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

PUSH_TIMEOUT_MS = 10_000  # longest a push waits for the language server's socket (then a 500: retried elsewhere)
MAX_PUSH_SOCKETS = 64


class EncoderEngine:
    """The vision tower, its embedding cache and the ZMQ sockets embeddings leave on. Thread-confined:
    call `encode` from one thread at a time (the server's worker thread)."""

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

    def encode(self, req: EncodeRequest) -> EncodedEmbeddings:
        """The request's embeddings (CPU), from the cache or the tower. Raises ValueError for a bad item."""
        start = time.perf_counter()
        out: list[torch.Tensor | None] = [None] * len(req.items)
        misses = []
        for k, item in enumerate(req.items):
            hit = self.cache.get_image(item.hash) if item.hash is not None else None
            if hit is not None:
                out[k] = hit
            else:
                misses.append(k)
        if misses:
            todo = [_decoded(req.items[k]) for k in misses]  # a broken JPEG: ValueError (400) here
            with torch.inference_mode():
                embs = self.model.get_image_feature(todo)
            for k, emb in zip(misses, embs):
                emb = emb.to("cpu").contiguous()
                out[k] = emb
                if req.items[k].hash is not None:
                    self.cache.put_image(req.items[k].hash, emb)
        self.num_requests += 1
        self.num_encoded += len(misses)
        self.num_cached += len(req.items) - len(misses)
        return EncodedEmbeddings(req.rid, list(req.item_indices), out, (time.perf_counter() - start) * 1e3,
                                 len(req.items) - len(misses), self.address)

    def encode_and_push(self, req: EncodeRequest) -> dict:
        msg = self.encode(req)
        self._push(req.reply_to, msg.frames())
        return {"ok": True, "rid": req.rid, "items": len(req.items), "cached": msg.cached,
                "encode_ms": round(msg.encode_ms, 3)}

    def stats(self) -> dict:
        return {"role": "encoder", "model_path": self.model_path, "num_requests": self.num_requests,
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


def create_encoder_app(engine: EncoderEngine):
    app = FastAPI()
    worker = ThreadPoolExecutor(1, thread_name_prefix="sglang-encoder")
    lock = threading.Lock()

    def run(req: EncodeRequest) -> dict:
        with lock:
            return engine.encode_and_push(req)

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
            return await asyncio.get_running_loop().run_in_executor(worker, run, req)
        except (ValueError, OSError) as e:  # a bad image (undecodable, wrong size): the request's fault
            return _error(f"{type(e).__name__}: {e}", 400)
        except Exception as e:
            logger.exception("encoding request %s failed", req.rid)
            return _error(f"encoder failed: {type(e).__name__}: {e}", 500)

    app.state.worker = worker
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
        app.state.worker.shutdown(wait=False, cancel_futures=True)
        engine.close()
    return 0
