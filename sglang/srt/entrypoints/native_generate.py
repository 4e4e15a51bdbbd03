"""The native /generate body (upstream's `GenerateReqInput` fields: one prompt or a batch, text or token ids,
images and videos per prompt) as one `GenerateReqInput` per prompt, refused with a 400 naming the field
when it does not fit."""

from __future__ import annotations

from typing import Any, AsyncIterator

from sglang.srt.entrypoints.openai.protocol import pick_dp_rank, pick_media_settings
from sglang.srt.errors import GenerateError
from sglang.srt.managers.field_policy import GENERATE_REFUSED, check_fields
from sglang.srt.managers.io_struct import GenerateReqInput

# logprob options upstream takes at the top level of a /generate body (they join each request's sampling_params)
_TOP_LEVEL_LOGPROB_KEYS = ("return_logprob", "top_logprobs_num", "logprob_start_len", "return_text_in_logprobs")


# the /generate body's keys read by native_requests; upstream's others are in GENERATE_REFUSED
NATIVE_FIELDS = ("text", "input_ids", "image_data", "video_data", "sampling_params", "stream", "rid", "priority",
                 "mm_processor_kwargs", "images_config", "require_reasoning", "routed_dp_rank", "data_parallel_rank",
                 "custom_logit_processor", *_TOP_LEVEL_LOGPROB_KEYS)


def _require_reasoning(value: Any) -> bool:
    if value is not None and not isinstance(value, bool):
        raise GenerateError(f"require_reasoning must be true or false, got {value!r:.50}")
    return bool(value)


def native_requests(data: dict[str, Any], created: float) -> tuple[list[GenerateReqInput], bool]:
    """The native /generate body -> one GenerateReqInput per prompt and sample, and whether it was a batch."""
    groups, batch = native_request_groups(data, created)
    return [c for g in groups for c in g], batch


def native_request_groups(data: dict[str, Any], created: float) -> tuple[list[list[GenerateReqInput]], bool]:
    """The native /generate body -> per prompt, its samples (`sampling_params.n` GenerateReqInputs), and
    whether the answer is a list (a batch, or n > 1)."""
    problem = check_fields(data, NATIVE_FIELDS, GENERATE_REFUSED)
    if problem:
        raise GenerateError(problem)
    text, input_ids = data.get("text"), data.get("input_ids")
    if (text is None) == (input_ids is None):
        raise GenerateError("give exactly one of 'text' or 'input_ids'")
    batch = isinstance(text, list) or (isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list))
    prompts = (text if isinstance(text, list) else input_ids) if batch else [text if text is not None else input_ids]
    if batch and not prompts:
        raise GenerateError("the batch is empty")
    n = len(prompts)
    stream = bool(data.get("stream", False))
    images = data.get("image_data")
    if batch:
        per_images = images if images is not None else [None] * n
        if not isinstance(per_images, list) or len(per_images) != n:
            raise GenerateError(f"a batch of {n} prompts needs image_data as a list of {n} entries")
    else:
        per_images = [images]
    per_videos = _per_prompt_videos(data.get("video_data"), batch, n)
    params = data.get("sampling_params")
    per_params = params if isinstance(params, list) else [params] * n
    if len(per_params) != n:
        raise GenerateError(f"a batch of {n} prompts needs {n} sampling_params")
    rid = data.get("rid")
    rids = (rid if rid is not None else [None] * n) if batch else [rid]
    if not isinstance(rids, list) or len(rids) != n:
        raise GenerateError(f"a batch of {n} prompts needs rid as a list of {n} ids")
    logprob_keys = {k: data[k] for k in _TOP_LEVEL_LOGPROB_KEYS if data.get(k) is not None}
    priority = data.get("priority")
    priorities = priority if batch and isinstance(priority, list) else [priority] * n
    if len(priorities) != n:
        raise GenerateError(f"a batch of {n} prompts needs priority as one integer or a list of {n}")
    try:
        media_kwargs, media_kwargs_name = pick_media_settings(data.get("mm_processor_kwargs"), data.get("images_config"))
    except ValueError as e:
        raise GenerateError(str(e)) from None
    require_reasoning = _require_reasoning(data.get("require_reasoning"))
    routed_dp_rank = pick_dp_rank(data.get("routed_dp_rank"), data.get("data_parallel_rank"))
    processor = data.get("custom_logit_processor")  # one for every prompt, or (a batch) a list of one per prompt
    processors = processor if batch and isinstance(processor, list) else [processor] * n
    if len(processors) != n:
        raise GenerateError(f"a batch of {n} prompts needs custom_logit_processor as one string or a list of {n}")
    objs = []
    for i, prompt in enumerate(prompts):
        img = per_images[i]
        if logprob_keys:
            if per_params[i] is not None and not isinstance(per_params[i], dict):
                raise GenerateError(f"sampling_params must be an object, got {type(per_params[i]).__name__}")
            per_params[i] = {**(per_params[i] or {}), **logprob_keys}
        objs.append(GenerateReqInput(
            text=prompt if text is not None else None,
            input_ids=prompt if input_ids is not None else None,
            image_data=[] if img is None else list(img) if isinstance(img, list) else [img],
            video_data=per_videos[i],
            sampling_params=per_params[i] if per_params[i] is not None else {},
            stream=stream,
            rid=rids[i],
            created_time=created,
            priority=priorities[i],
            mm_processor_kwargs=media_kwargs,
            mm_kwargs_name=media_kwargs_name,
            require_reasoning=require_reasoning,
            routed_dp_rank=routed_dp_rank,
            custom_logit_processor=processors[i],
        ))
    try:
        groups = [o.parallel_copies() for o in objs]
    except ValueError as e:
        raise GenerateError(str(e)) from None
    return groups, batch or any(len(g) > 1 for g in groups)


def _per_prompt_videos(videos: Any, batch: bool, n: int) -> list[list[Any]]:
    """/generate's video_data -> the video list of each prompt. One prompt: a video (string or bytes) or
    a list of videos, each a string or a list of frames. A batch: one such entry per prompt."""
    def one(v: Any) -> list[Any]:
        return [] if v is None else list(v) if isinstance(v, list) else [v]

    if not batch:
        return [one(videos)]
    if videos is None:
        return [[] for _ in range(n)]
    if not isinstance(videos, list) or len(videos) != n:
        raise GenerateError(f"a batch of {n} prompts needs video_data as a list of {n} entries")
    return [one(v) for v in videos]


async def stream_deltas(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """--stream-output: each streamed chunk's `text` and `output_ids` cut to what is new since the chunk
    before (the last one too); a batch's chunks (tagged with `index`) are cut per prompt."""
    sent: dict[Any, tuple[int, int]] = {}
    try:
        async for chunk in chunks:
            key = chunk.get("index")
            text_len, ids_len = sent.get(key, (0, 0))
            out = dict(chunk)
            ids = chunk.get("output_ids") or []
            out["output_ids"] = list(ids[ids_len:])
            if "text" in chunk:  # absent with --skip-tokenizer-init
                out["text"] = chunk["text"][text_len:]
                text_len = max(text_len, len(chunk["text"]))
            sent[key] = (text_len, max(ids_len, len(ids)))
            yield out
    finally:  # closing this closes the generation under it, which aborts an unfinished request
        await chunks.aclose()
