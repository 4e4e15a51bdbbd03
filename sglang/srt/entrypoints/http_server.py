"""The HTTP server: FastAPI app over one TokenizerManager, served by uvicorn.

Endpoints, on upstream SGLang's paths: /, /health, /health_generate, /ping, /ready, /metrics
(--enable-metrics), /v1/models, /v1/models/{model}, /model_info (also /get_model_info), /server_info
(also /get_server_info), /get_load, /flush_cache, /update_weights_from_disk, /get_weight_version, /abort_request, /start_profile, /stop_profile, /tokenize and
/detokenize (also under /v1/), native /generate (POST or PUT), /v1/chat/completions and /v1/completions.
Errors are OpenAI-style JSON `{"error": {"message", "type", "code"}}`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
import time
import uuid
from contextlib import asynccontextmanager
from multiprocessing.process import BaseProcess
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from sglang.version import __version__
from sglang.srt.entrypoints.auth import ApiKeyAuth
from sglang.srt.entrypoints.body_limit import BodySizeLimit
from sglang.srt.entrypoints.native_generate import native_request_groups, stream_deltas
from sglang.srt.entrypoints.parse_routes import parse_function_call, separate_reasoning
from sglang.srt.entrypoints.weight_routes import update_weights_request
from sglang.srt.entrypoints.openai.protocol import ModelCard, ModelList
from sglang.srt.entrypoints.openai.serving_base import (
    CLIENT_CLOSED_REQUEST,
    ClientGone,
    collect_until_disconnect,
    drain,
    error_response,
    gather_finals,
    hold_for_first_output,
    indexed_chunks,
    json_response,
    merge_streams,
    parse_json_body,
    sse_stream,
)
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.serving_tokenize import detokenize, tokenize
from sglang.srt.entrypoints.profile_request import start_profile_request
from sglang.srt.managers.io_struct import GenerateReqInput, ProfileReq
from sglang.srt.errors import GenerateError, ServerUnhealthyError
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.secrets import redact_secrets

logger = logging.getLogger(__name__)

# After a child process dies: keep answering 503 this long (clients and balancers see why), then exit.
EXIT_GRACE_S = 1.0
# SIGTERM/SIGINT: requests in flight get this long to finish; those still running then answer 503
# ("shutting down") just before the HTTP server would cancel them (which would be a 500).
SHUTDOWN_GRACE_S = 5.0
# /health_generate: the one-token probe must finish within this, or the server answers 503.
HEALTH_GENERATE_TIMEOUT_S = 20.0
# /stop_profile answers once every rank wrote its trace: large GPU traces take a while to export.
PROFILE_STOP_TIMEOUT_S = 300.0


def _draining_server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def __init__(self, config, tm: TokenizerManager):
            super().__init__(config)
            self.tm = tm

        async def shutdown(self, sockets=None) -> None:
            loop = asyncio.get_running_loop()
            handle = loop.call_later(max(SHUTDOWN_GRACE_S - 1.0, 0.0), self.tm.fail_pending, "server is shutting down")
            try:
                await super().shutdown(sockets)
            finally:
                handle.cancel()

    return DrainingServer


def _draining_server(config, tm: TokenizerManager):
    return _draining_server_class()(config, tm)


def create_app(
    tokenizer_manager: TokenizerManager,
    server_args: ServerArgs,
    child_processes: list[BaseProcess] | None = None,
    on_child_death: Callable[[str], None] | None = None,
) -> FastAPI:
    tm = tokenizer_manager
    model_name = server_args.served_model_name or tm.model_path
    chat = OpenAIServingChat(tm, model_name)
    completion = OpenAIServingCompletion(tm, model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await tm.start(child_processes, on_child_death)
        try:
            yield
        finally:
            await tm.close()

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(BodySizeLimit, max_bytes=server_args.max_payload_size,
                       on_refuse=lambda msg: error_response(GenerateError(f"Payload Too Large: {msg}", 413,
                                                                          "request_too_large")))
    if server_args.api_key:  # added last: it runs first, before the body is read
        app.add_middleware(ApiKeyAuth, api_key=server_args.api_key,
                           on_refuse=lambda msg: error_response(GenerateError(msg, 401, "authentication_error")))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s", request.url.path)
        return error_response(GenerateError(f"internal server error: {type(exc).__name__}: {exc}", 500, "server_error"))

    @app.get("/health")
    async def health() -> Response:
        if not tm.healthy:
            return error_response(ServerUnhealthyError(f"server unavailable: {tm.dead_reason}"))
        return json_response({"status": "ok"})

    if tm.metrics is not None:

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(await tm.render_metrics(), media_type="text/plain; version=0.0.4")

    def model_card() -> ModelCard:
        return ModelCard(id=model_name, root=tm.model_path, max_model_len=tm.context_length)

    async def one_token_probe(what: str) -> Response:
        """200 once a one-token generation went through the whole pipeline; 503 naming why otherwise."""
        obj = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                               rid=f"HEALTH_CHECK_{uuid.uuid4().hex}")
        try:
            # On timeout the probe is cancelled, and a cancelled generation aborts its request.
            out = await asyncio.wait_for(drain(tm.generate_request(obj)), HEALTH_GENERATE_TIMEOUT_S)
        except asyncio.TimeoutError:
            return error_response(ServerUnhealthyError(
                f"{what}: a one-token generation did not finish within {HEALTH_GENERATE_TIMEOUT_S:g} s"))
        except GenerateError as e:
            return error_response(ServerUnhealthyError(f"{what}: a one-token generation failed: {e.message}"))
        if out is None or out["meta_info"]["finish_reason"]["type"] == "abort":
            return error_response(ServerUnhealthyError(f"{what}: the one-token generation was aborted"))
        return json_response({"status": "ok"})

    @app.get("/health_generate")
    async def health_generate() -> Response:
        return await one_token_probe("health check")

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> Response:
        return json_response("SGLang is running")  # upstream's answer: the HTTP server is up

    @app.get("/ping")
    async def ping() -> Response:
        """SageMaker's liveness route: 200 with an empty body while the server serves."""
        if not tm.accepting:
            return error_response(ServerUnhealthyError(f"server unavailable: {tm.dead_reason or 'shutting down'}"))
        return Response(status_code=200)

    ready_probe: list[asyncio.Task] = []  # the one probe in flight, shared by concurrent /ready calls

    @app.get("/ready")
    async def ready() -> Response:
        """503 until a generation has come back through scheduler and detokenizer (the first /ready
        sends a one-token one when no request has yet), and again once the server is dying or
        shutting down; 200 {"status": "ready"} otherwise."""
        if not tm.accepting:
            return error_response(ServerUnhealthyError(f"not ready: {tm.dead_reason or 'shutting down'}"))
        if not tm.has_served:
            if not ready_probe or ready_probe[0].done():
                ready_probe[:] = [asyncio.ensure_future(one_token_probe("not ready"))]
            probe = await asyncio.shield(ready_probe[0])
            if probe.status_code != 200:
                return probe
        return json_response({"status": "ready"})

    @app.get("/v1/models")
    async def models() -> Response:
        return json_response(ModelList(data=[model_card()]).model_dump())

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> Response:
        if model != model_name:
            return error_response(GenerateError(f"the model {model!r} does not exist; this server serves "
                                                f"{model_name!r}", 404, "invalid_request_error"))
        return json_response(model_card().model_dump())

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> Response:
        return json_response({
            "model_path": tm.model_path,
            "tokenizer_path": server_args.tokenizer_path or tm.model_path,
            "served_model_name": model_name,
            "is_generation": True,
            "is_multimodal": tm.processor is not None,
            "architectures": tm.hf_config.get("architectures"),
            "model_type": tm.hf_config.get("model_type"),
            "context_length": tm.context_length,
            "weight_version": tm.weight_version,
        })

    @app.get("/get_weight_version")
    async def get_weight_version() -> Response:
        return json_response({"weight_version": tm.weight_version})

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        """Swaps the weights in place on every rank and replica, or on none (weight_routes.py)."""
        try:
            success, message = await tm.update_weights_from_disk(
                **update_weights_request(parse_json_body(await request.body())))
        except GenerateError as e:
            return error_response(e)
        return json_response({"success": success, "message": message, "num_paused_requests": 0},
                             status_code=200 if success else 400)

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> Response:
        try:
            info = await tm.get_server_info()
        except GenerateError as e:
            return error_response(e)
        lm_attn, mm_attn = server_args.resolved_attention_backends()  # what "auto" became
        return json_response({**redact_secrets(dataclasses.asdict(server_args)), "model_path": tm.model_path,
                              "attention_backend": lm_attn, "mm_attention_backend": mm_attn, **info,
                              "version": __version__})

    @app.get("/get_load")
    async def get_load() -> Response:
        """Upstream's load report, polled by sglang-router: one entry per data-parallel replica."""
        try:
            return json_response(await tm.get_load())
        except GenerateError as e:
            return error_response(e)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        try:
            out = await tm.flush_cache()
        except GenerateError as e:
            return error_response(e)
        if not out.success:
            return error_response(GenerateError(f"cache not flushed: {out.message}"))
        return json_response({"success": True, "message": "cache flushed"})

    @app.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(request: Request) -> Response:
        """torch.profiler in every scheduler process until /stop_profile or `num_steps` forward steps (bounded);
        traces go under SGLANG_TORCH_PROFILER_DIR (`output_dir` only inside it)."""
        try:
            body = await request.body()
            req = start_profile_request(parse_json_body(body) if body.strip() else {})
            out = await tm.profile(req)
        except GenerateError as e:
            return error_response(e)
        if not out.success:
            return error_response(GenerateError(f"profiling not started: {out.message}"))
        return Response(f"Start profiling.\nThe trace of each scheduler rank goes to {_rank_paths(out.files)}\n")

    @app.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile() -> Response:
        try:
            out = await tm.profile(ProfileReq("stop"), timeout=PROFILE_STOP_TIMEOUT_S)
        except GenerateError as e:
            return error_response(e)
        if not out.success:
            return error_response(GenerateError(f"profiling not stopped: {out.message}"))
        return Response(f"Stop profiling. This will take some time.\nTraces written: {_rank_paths(out.files)}\n")

    for path, handler in (("/tokenize", tokenize), ("/detokenize", detokenize)):
        async def route(request: Request, handler=handler) -> Response:
            try:
                return json_response(await handler(tm, await request.body()))
            except GenerateError as e:
                return error_response(e)

        app.add_api_route(path, route, methods=["POST"])
        app.add_api_route("/v1" + path, route, methods=["POST"])

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        created = time.time()
        try:
            groups, batch = native_request_groups(parse_json_body(await request.body()), created)
            prepared = await tm.tokenize_requests(groups)  # a prompt built once for its n samples, prompts concurrently
        except GenerateError as e:
            return error_response(e)
        streams = [tm.generate_tokenized(tok, payload) for tok, payload in prepared]
        if groups[0][0].stream:
            try:
                streams = await hold_for_first_output(request, streams)  # a failure before running: its status
            except GenerateError as e:
                return error_response(e)
            except ClientGone:
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            events = streams[0] if len(streams) == 1 else indexed_chunks(merge_streams(streams))
            if server_args.stream_output:
                events = stream_deltas(events)
            return StreamingResponse(sse_stream(events), media_type="text/event-stream")
        try:
            out = await collect_until_disconnect(request, gather_finals(streams) if batch else streams[0])
        except GenerateError as e:
            return error_response(e)
        return Response(status_code=CLIENT_CLOSED_REQUEST) if out is None else json_response(out)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        """Ends a running request (`rid`) or all of them (`abort_all`); their callers get finish
        reason "abort". Unknown ids are not an error: the request may have just finished."""
        try:
            data = parse_json_body(await request.body())
            rid, abort_all = data.get("rid", ""), data.get("abort_all", False)
            if not isinstance(rid, str) or not isinstance(abort_all, bool) or not (rid or abort_all):
                raise GenerateError("give 'rid' (a request id string) or 'abort_all': true")
        except GenerateError as e:
            return error_response(e)
        return json_response({"success": True, "num_aborted": tm.abort_request(rid, abort_all)})

    @app.post("/parse_function_call")
    async def parse_function_call_route(request: Request) -> Response:
        try:
            template = getattr(getattr(getattr(tm, "builder", None), "tokenizer", None), "chat_template", None)
            return json_response(parse_function_call(parse_json_body(await request.body()), server_args, template))
        except GenerateError as e:
            return error_response(e)

    @app.post("/separate_reasoning")
    async def separate_reasoning_route(request: Request) -> Response:
        try:
            return json_response(separate_reasoning(parse_json_body(await request.body()), server_args))
        except GenerateError as e:
            return error_response(e)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await chat.handle_request(request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion.handle_request(request)

    return app


def _rank_paths(files: list[str]) -> str:
    """Rank 0's trace path, with its `-TP-0.` generalized to every rank."""
    return ", ".join(f.replace("-TP-0.", "-TP-<rank>.") for f in files)


# ----------------------------------------------------------------------------- process entry
def _serve_worker_node(server_args: ServerArgs, procs, port_args) -> int:
    """A node other than 0 hosts scheduler ranks only: wait until one of them exits (the group is
    torn down, or a peer failed), then stop the rest."""
    from multiprocessing.connection import wait

    from sglang.srt.entrypoints.engine import shutdown_subprocesses

    logger.info("node %d: %d scheduler rank(s) joined the group", server_args.node_rank, len(procs))
    try:
        wait([p.sentinel for p in procs])
    finally:
        shutdown_subprocesses(procs, port_args)
    return 0 if all(p.exitcode == 0 for p in procs) else 1


def launch_server(server_args: ServerArgs) -> int:
    """Starts the engine processes and serves HTTP until SIGINT/SIGTERM or a child dies; always kills
    the children and removes the ipc directory. Returns the process exit code."""
    import uvicorn

    from sglang.srt.entrypoints.engine import launch_subprocesses, shutdown_subprocesses

    tm, procs, port_args = launch_subprocesses(server_args)
    if tm is None:
        return _serve_worker_node(server_args, procs, port_args)
    server_box: list[uvicorn.Server] = []

    def on_child_death(reason: str) -> None:
        def stop() -> None:
            server_box[0].should_exit = True

        asyncio.get_running_loop().call_later(EXIT_GRACE_S, stop)

    try:
        app = create_app(tm, server_args, procs, on_child_death)
        config = uvicorn.Config(
            app,
            host=server_args.host,
            port=server_args.port,
            log_level=server_args.log_level,
            access_log=server_args.log_level == "debug",
            loop="asyncio",
            http="h11",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
        server_box.append(_draining_server(config, tm))
        logger.info("serving on http://%s:%d", server_args.host, server_args.port)
        server_box[0].run()
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the cleanup
        shutdown_subprocesses(procs, port_args)
    if tm.dead_reason:
        logger.error("exiting: %s", tm.dead_reason)
        return 1
    return 0
