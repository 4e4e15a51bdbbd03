"""OpenAI wire types (pydantic): chat completions, completions, models, errors. A request's top-level
fields are checked before these models read it (sglang/srt/managers/field_policy.py: unknown and
unimplemented fields are 400s naming them); values a declared field cannot honour are refused by the
request's `unsupported()`. Nested objects (messages, parts) tolerate extra keys."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


# "abort": the request was ended by /abort_request; "tool_calls": it stopped after tool calls
FinishReasonStr = Literal["stop", "length", "abort", "tool_calls"]


def pick_media_settings(mm_processor_kwargs: Any, images_config: Any) -> tuple[Any, str]:
    """A request's processor settings for its images and videos, and the field that carried them (vLLM's
    `mm_processor_kwargs` or upstream's `images_config`; neither: None). Both at once is refused (ValueError)."""
    if images_config is not None and mm_processor_kwargs is not None:
        raise ValueError("give the image settings in mm_processor_kwargs or images_config, not both")
    if images_config is not None:
        return images_config, "images_config"
    return mm_processor_kwargs, "mm_processor_kwargs"


def pick_dp_rank(routed_dp_rank: Any, data_parallel_rank: Any) -> Any:
    """The data-parallel replica a request names: upstream's `routed_dp_rank`, else its older
    `data_parallel_rank` (what sglang-router's --dp-aware sends); None: the load balancer picks."""
    return routed_dp_rank if routed_dp_rank is not None else data_parallel_rank


def merge_media_io_kwargs(kwargs: Any, name: str, media_io_kwargs: Any) -> tuple[Any, str]:
    """vLLM's per-request `media_io_kwargs` ({"video": {"fps": ..., "num_frames": ...}}) joined to the
    request's processor settings: video loading settings only; another modality, or a key given in both
    fields with different values, is refused (ValueError naming it)."""
    if not isinstance(media_io_kwargs, dict):
        raise ValueError(f"media_io_kwargs must be an object, got {type(media_io_kwargs).__name__}")
    other = sorted(set(media_io_kwargs) - {"video"})
    if other:
        raise ValueError(f"media_io_kwargs.{other[0]} is not supported: only video loading settings are "
                         "(media_io_kwargs.video: fps, num_frames, min_frames, max_frames)")
    video = media_io_kwargs.get("video") or {}
    if not isinstance(video, dict):
        raise ValueError(f"media_io_kwargs.video must be an object, got {type(video).__name__}")
    if not isinstance(kwargs, (dict, type(None))):
        return kwargs, name  # the processor refuses a non-object, naming its field
    merged = dict(kwargs or {})
    for key, value in video.items():
        if key in merged and merged[key] != value:
            raise ValueError(f"media_io_kwargs.video.{key} differs from {name}.{key}: give it once")
        merged[key] = value
    return merged, (name if kwargs else "media_io_kwargs.video")


class _Tolerant(BaseModel):
    model_config = ConfigDict(extra="allow")


# ----------------------------------------------------------------------------- request
class ImageURL(_Tolerant):
    url: str
    detail: str | None = None


class TextPart(_Tolerant):
    type: Literal["text"]
    text: str


class ImageURLPart(_Tolerant):
    type: Literal["image_url"]
    image_url: ImageURL | str


class VideoURL(_Tolerant):
    url: str


class VideoURLPart(_Tolerant):
    type: Literal["video_url"]
    video_url: VideoURL | str


ContentPart = Annotated[Union[TextPart, ImageURLPart, VideoURLPart], Field(discriminator="type")]


class ChatMessage(_Tolerant):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn's calls (rendered by the template)
    tool_call_id: str | None = None  # a tool result's call
    reasoning_content: str | None = None  # an earlier turn's reasoning, as responses carry it


class StreamOptions(_Tolerant):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # usage so far in every chunk


class _DataParallelRouted(_Tolerant):
    # the data-parallel replica an external router picked (upstream's name; `data_parallel_rank` is its
    # older one); None: the server's load balancer picks
    routed_dp_rank: int | None = None
    data_parallel_rank: int | None = None

    def dp_rank(self) -> int | None:
        return pick_dp_rank(self.routed_dp_rank, self.data_parallel_rank)


class _CustomLogitProcessed(_DataParallelRouted):
    # upstream's custom logit processor (CustomLogitProcessor.to_str()) and its per-request values, honoured
    # with --enable-custom-logit-processor
    custom_logit_processor: str | None = None
    custom_params: dict[str, Any] | None = None


class ChatCompletionRequest(_CustomLogitProcessed):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None  # none, auto (with tools, the default), required, a function
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    user: str | None = None
    # SGLang extensions
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    no_stop_trim: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool = False  # continue the last (assistant) message: no generation prompt
    separate_reasoning: bool = True  # with --reasoning-parser: reasoning in reasoning_content
    stream_reasoning: bool = True  # false: the reasoning streamed in one piece, when it ends
    rid: str | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    priority: int | None = None  # with --enable-priority-scheduling
    # image processor settings for this request's images (max_pixels, min_pixels): vLLM's and upstream's names
    mm_processor_kwargs: dict[str, Any] | None = None
    images_config: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None  # vLLM's: {"video": {"fps": .., "num_frames": ..}}

    def logprob_params(self) -> dict[str, Any]:
        return {"return_logprob": self.logprobs, "top_logprobs_num": self.top_logprobs or 0}

    def media_kwargs(self) -> tuple[dict[str, Any] | None, str]:
        """(settings, the field that carried them), media_io_kwargs' video settings joined in;
        unsupported() refuses what cannot be combined."""
        kwargs, name = pick_media_settings(self.mm_processor_kwargs, self.images_config)
        if self.media_io_kwargs is None:
            return kwargs, name
        return merge_media_io_kwargs(kwargs, name, self.media_io_kwargs)

    def unsupported(self) -> str | None:
        """A message naming the first requested feature this server does not implement, if any."""
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs needs logprobs: true"
        try:
            self.media_kwargs()
        except ValueError as e:
            return str(e)
        if self.continue_final_message and self.messages[-1].role != "assistant":
            return "continue_final_message needs the last message to be the assistant's"
        if not self.parallel_tool_calls and not self.tools:
            return "parallel_tool_calls false needs tools"
        return None

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_CustomLogitProcessed):
    model: str | None = None
    # one prompt (text or token ids) or a list of them: choice index = prompt index * n + sample
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default; null: up to the context length
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    logit_bias: dict[str, float] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # SGLang extensions
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    no_stop_trim: bool = False
    rid: str | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    priority: int | None = None  # with --enable-priority-scheduling

    def logprob_params(self) -> dict[str, Any]:
        params = {"return_logprob": self.logprobs is not None, "top_logprobs_num": self.logprobs or 0}
        if self.echo and self.logprobs is not None:  # the echoed prompt's tokens are scored too
            params["logprob_start_len"] = 0
        return params

    def unsupported(self) -> str | None:
        """A message naming the first requested feature this server does not implement, if any.
        Every parameter accepted but not honoured is refused here, and only here."""
        if self.best_of is not None and self.best_of != self.n:
            return f"best_of={self.best_of} is not supported: only best_of equal to n"
        if self.suffix:
            return "suffix is not supported"
        if isinstance(self.prompt, list) and not self.prompt:
            return "prompt is empty"
        return None

    def prompts(self) -> list[str | list[int]]:
        return list(self.prompt) if self.is_batch() else [self.prompt]  # type: ignore[list-item]

    def is_batch(self) -> bool:
        p = self.prompt
        return isinstance(p, list) and bool(p) and isinstance(p[0], (str, list))


# ----------------------------------------------------------------------------- response
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class FunctionCallOut(BaseModel):
    name: str | None = None
    arguments: str | None = None  # JSON text (streaming: a piece of it)


class ToolCallOut(BaseModel):
    id: str | None = None
    index: int | None = None
    type: Literal["function"] | None = None
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    # null when empty, always present (as upstream's), so clients can read them as attributes
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReasonStr | None = None
    matched_stop: int | str | None = None


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=completion_id)
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatCompletionStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReasonStr | None = None
    matched_stop: int | str | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReasonStr | None = None
    matched_stop: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ErrorInfo(BaseModel):
    message: str
    type: str = "invalid_request_error"
    code: int = 400


class ErrorResponse(BaseModel):
    error: ErrorInfo


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "sglang"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
