"""Administration on upstream's paths: model and server info, load, weight version and updates, cache
flush, profiling, aborts. Each answers the API's JSON error body with its status on failure."""

from __future__ import annotations

import dataclasses

from fastapi import FastAPI, Request
from fastapi.responses import Response

from sglang.version import __version__
from sglang.srt.entrypoints.openai.serving_base import error_response, json_response, parse_json_body
from sglang.srt.entrypoints.profile_request import start_profile_request
from sglang.srt.entrypoints.weight_routes import update_weights_request
from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import ProfileReq
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.secrets import redact_secrets

# /stop_profile answers once every rank wrote its trace: large GPU traces take a while to export.
PROFILE_STOP_TIMEOUT_S = 300.0


def _rank_paths(files: list[str]) -> str:
    """Rank 0's trace path, with its `-TP-0.` generalized to every rank."""
    return ", ".join(f.replace("-TP-0.", "-TP-<rank>.") for f in files)


def add_admin_routes(router: FastAPI, tm: TokenizerManager, server_args: ServerArgs, model_name: str) -> None:
    """Adds the routes to `router` (the app itself: its route table stays flat)."""

    @router.get("/model_info")
    @router.get("/get_model_info")
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

    @router.get("/get_weight_version")
    async def get_weight_version() -> Response:
        return json_response({"weight_version": tm.weight_version})

    @router.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        """Swaps the weights in place on every rank and replica, or on none (weight_routes.py)."""
        try:
            success, message = await tm.update_weights_from_disk(
                **update_weights_request(parse_json_body(await request.body())))
        except GenerateError as e:
            return error_response(e)
        return json_response({"success": success, "message": message, "num_paused_requests": 0},
                             status_code=200 if success else 400)

    @router.get("/server_info")
    @router.get("/get_server_info")
    async def server_info() -> Response:
        try:
            info = await tm.get_server_info()
        except GenerateError as e:
            return error_response(e)
        lm_attn, mm_attn = server_args.resolved_attention_backends()  # what "auto" became
        return json_response({**redact_secrets(dataclasses.asdict(server_args)), "model_path": tm.model_path,
                              "attention_backend": lm_attn, "mm_attention_backend": mm_attn, **info,
                              "version": __version__})

    @router.get("/get_load")
    async def get_load() -> Response:
        """Upstream's load report, polled by sglang-router: one entry per data-parallel replica."""
        try:
            return json_response(await tm.get_load())
        except GenerateError as e:
            return error_response(e)

    @router.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        try:
            out = await tm.flush_cache()
        except GenerateError as e:
            return error_response(e)
        if not out.success:
            return error_response(GenerateError(f"cache not flushed: {out.message}"))
        return json_response({"success": True, "message": "cache flushed"})

    @router.api_route("/start_profile", methods=["GET", "POST"])
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

    @router.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile() -> Response:
        try:
            out = await tm.profile(ProfileReq("stop"), timeout=PROFILE_STOP_TIMEOUT_S)
        except GenerateError as e:
            return error_response(e)
        if not out.success:
            return error_response(GenerateError(f"profiling not stopped: {out.message}"))
        return Response(f"Stop profiling. This will take some time.\nTraces written: {_rank_paths(out.files)}\n")

    @router.post("/abort_request")
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

