"""The HTTP server: FastAPI app over one TokenizerManager, served by uvicorn.

Endpoints, on upstream SGLang's paths: /, /health, /health_generate, /ping, /ready, /metrics
(--enable-metrics), /v1/models, /v1/models/{model}, /model_info (also /get_model_info), /server_info
(also /get_server_info), /get_load, /flush_cache, /update_weights_from_disk, /get_weight_version, /abort_request, /start_profile, /stop_profile, /tokenize and
/detokenize (also under /v1/), native /generate (POST or PUT), /v1/chat/completions and /v1/completions.
Errors are OpenAI-style JSON `{"error": {"message", "type", "code"}}`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from contextlib import asynccontextmanager
from multiprocessing.process import BaseProcess
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response

from sglang.srt.entrypoints.admin_routes import add_admin_routes
from sglang.srt.entrypoints.auth import ApiKeyAuth
from sglang.srt.entrypoints.body_limit import BodySizeLimit
from sglang.srt.entrypoints.generate_routes import add_generate_routes
from sglang.srt.entrypoints.health_routes import add_health_routes
from sglang.srt.entrypoints.openai.routes import add_openai_routes
from sglang.srt.entrypoints.openai.serving_base import error_response
from sglang.srt.errors import GenerateError
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# After a child process dies: keep answering 503 this long (clients and balancers see why), then exit.
EXIT_GRACE_S = 1.0
# SIGTERM/SIGINT: requests in flight get this long to finish; those still running then answer 503
# ("shutting down") just before the HTTP server would cancel them (which would be a 500).
SHUTDOWN_GRACE_S = 5.0


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
    """The app: the tokenizer manager's lifespan, the body limit and --api-key in front, and the routers
    by concern, each file adding its own (health, OpenAI, administration, native generate)."""
    tm = tokenizer_manager
    model_name = server_args.served_model_name or tm.model_path

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

    add_health_routes(app, tm)
    add_openai_routes(app, tm, model_name)
    add_admin_routes(app, tm, server_args, model_name)
    add_generate_routes(app, tm, server_args)
    return app


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
