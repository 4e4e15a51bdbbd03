"""The OpenAI API: /v1/models, /v1/models/{model}, /v1/chat/completions and /v1/completions."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.protocol import ModelCard, ModelList
from sglang.srt.entrypoints.openai.serving_base import error_response, json_response
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.errors import GenerateError
from sglang.srt.managers.tokenizer_manager import TokenizerManager


def add_openai_routes(router: FastAPI, tm: TokenizerManager, model_name: str) -> None:
    """Adds the routes to `router` (the app itself: its route table stays flat)."""
    chat = OpenAIServingChat(tm, model_name)
    completion = OpenAIServingCompletion(tm, model_name)

    def model_card() -> ModelCard:
        return ModelCard(id=model_name, root=tm.model_path, max_model_len=tm.context_length)

    @router.get("/v1/models")
    async def models() -> Response:
        return json_response(ModelList(data=[model_card()]).model_dump())

    @router.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> Response:
        if model != model_name:
            return error_response(GenerateError(f"the model {model!r} does not exist; this server serves "
                                                f"{model_name!r}", 404, "invalid_request_error"))
        return json_response(model_card().model_dump())

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await chat.handle_request(request)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion.handle_request(request)

