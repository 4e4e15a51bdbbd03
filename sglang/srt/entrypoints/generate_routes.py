"""The native API: /generate (POST or PUT; batches, `n`, streaming), /tokenize and /detokenize (also under
/v1/), /parse_function_call and /separate_reasoning."""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from sglang.srt.entrypoints.native_generate import native_request_groups, stream_deltas
from sglang.srt.entrypoints.openai.serving_base import (
    CLIENT_CLOSED_REQUEST,
    error_response,
    held_streams,
    json_response,
    parse_json_body,
    sse_stream,
)
from sglang.srt.entrypoints.openai.streams import collect_until_disconnect, gather_finals, indexed_chunks, merge_streams
from sglang.srt.entrypoints.openai.serving_tokenize import detokenize, tokenize
from sglang.srt.entrypoints.parse_routes import parse_function_call, separate_reasoning
from sglang.srt.errors import GenerateError
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs


def add_generate_routes(router: FastAPI, tm: TokenizerManager, server_args: ServerArgs) -> None:
    """Adds the routes to `router` (the app itself: its route table stays flat)."""

    for path, handler in (("/tokenize", tokenize), ("/detokenize", detokenize)):
        async def route(request: Request, handler=handler) -> Response:
            try:
                return json_response(await handler(tm, await request.body()))
            except GenerateError as e:
                return error_response(e)

        router.add_api_route(path, route, methods=["POST"])
        router.add_api_route("/v1" + path, route, methods=["POST"])

    @router.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        created = time.time()
        try:
            groups, batch = native_request_groups(parse_json_body(await request.body()), created)
            prepared = await tm.tokenize_requests(groups)  # a prompt built once for its n samples, prompts concurrently
        except GenerateError as e:
            return error_response(e)
        streams = [tm.generate_tokenized(tok, payload) for tok, payload in prepared]
        if groups[0][0].stream:
            streams = await held_streams(request, streams)  # a failure before running: its status
            if isinstance(streams, Response):
                return streams
            events = streams[0] if len(streams) == 1 else indexed_chunks(merge_streams(streams))
            if server_args.stream_output:
                events = stream_deltas(events)
            return StreamingResponse(sse_stream(events), media_type="text/event-stream")
        try:
            out = await collect_until_disconnect(request, gather_finals(streams) if batch else streams[0])
        except GenerateError as e:
            return error_response(e)
        return Response(status_code=CLIENT_CLOSED_REQUEST) if out is None else json_response(out)

    @router.post("/parse_function_call")
    async def parse_function_call_route(request: Request) -> Response:
        try:
            template = getattr(getattr(getattr(tm, "builder", None), "tokenizer", None), "chat_template", None)
            return json_response(parse_function_call(parse_json_body(await request.body()), server_args, template))
        except GenerateError as e:
            return error_response(e)

    @router.post("/separate_reasoning")
    async def separate_reasoning_route(request: Request) -> Response:
        try:
            return json_response(separate_reasoning(parse_json_body(await request.body()), server_args))
        except GenerateError as e:
            return error_response(e)

