"""Liveness and readiness on upstream's paths: /health, /health_generate, /, /ping, /ready, and /metrics
with --enable-metrics. Probes that run a generation bound it by HEALTH_GENERATE_TIMEOUT_S."""

from __future__ import annotations

import asyncio
import uuid

from fastapi import FastAPI
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.serving_base import error_response, json_response
from sglang.srt.entrypoints.openai.streams import drain
from sglang.srt.errors import GenerateError, ServerUnhealthyError
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import TokenizerManager

# /health_generate: the one-token probe must finish within this, or the server answers 503.
HEALTH_GENERATE_TIMEOUT_S = 20.0


async def one_token_probe(tm: TokenizerManager, what: str) -> Response:
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


def add_health_routes(router: FastAPI, tm: TokenizerManager) -> None:
    """Adds the routes to `router` (the app itself: its route table stays flat)."""

    @router.get("/health")
    async def health() -> Response:
        if not tm.healthy:
            return error_response(ServerUnhealthyError(f"server unavailable: {tm.dead_reason}"))
        return json_response({"status": "ok"})

    if tm.metrics is not None:

        @router.get("/metrics")
        async def metrics() -> Response:
            return Response(await tm.render_metrics(), media_type="text/plain; version=0.0.4")

    @router.get("/health_generate")
    async def health_generate() -> Response:
        return await one_token_probe(tm, "health check")

    @router.api_route("/", methods=["GET", "HEAD"])
    async def root() -> Response:
        return json_response("SGLang is running")  # upstream's answer: the HTTP server is up

    @router.get("/ping")
    async def ping() -> Response:
        """SageMaker's liveness route: 200 with an empty body while the server serves."""
        if not tm.accepting:
            return error_response(ServerUnhealthyError(f"server unavailable: {tm.dead_reason or 'shutting down'}"))
        return Response(status_code=200)

    ready_probe: list[asyncio.Task] = []  # the one probe in flight, shared by concurrent /ready calls

    @router.get("/ready")
    async def ready() -> Response:
        """503 until a generation has come back through scheduler and detokenizer (the first /ready
        sends a one-token one when no request has yet), and again once the server is dying or
        shutting down; 200 {"status": "ready"} otherwise."""
        if not tm.accepting:
            return error_response(ServerUnhealthyError(f"not ready: {tm.dead_reason or 'shutting down'}"))
        if not tm.has_served:
            if not ready_probe or ready_probe[0].done():
                ready_probe[:] = [asyncio.ensure_future(one_token_probe(tm, "not ready"))]
            probe = await asyncio.shield(ready_probe[0])
            if probe.status_code != 200:
                return probe
        return json_response({"status": "ready"})

