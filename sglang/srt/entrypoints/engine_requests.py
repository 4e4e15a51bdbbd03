"""`Engine.generate`'s arguments -> the requests to run: one `GenerateReqInput` per prompt (a batch: one
per entry, each list argument checked against the batch's size), each expanded to its `n` samples
(`parallel_copies`), which the tokenizer manager then builds once and clones."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import GenerateReqInput


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Per-request options of generate() beyond the prompt, media and sampling parameters."""

    priority: int | list[int] | None = None
    images_config: dict | None = None
    mm_processor_kwargs: dict | None = None
    # CustomLogitProcessor.to_str() (one, or a list of one per prompt); needs --enable-custom-logit-processor
    custom_logit_processor: str | list[str | None] | None = None


def as_media_list(media: Any) -> list[Any]:
    """One image or video, or a list of them -> a list."""
    if media is None:
        return []
    return list(media) if isinstance(media, (list, tuple)) else [media]


def engine_request_groups(prompt, messages, image_data, sampling_params, stream, input_ids, return_logprob,
                          logprob_start_len, top_logprobs_num, video_data=None, options: "EngineOptions | None" = None
                          ) -> tuple[list[list[GenerateReqInput]], bool]:
    """(the requests to run: one group per prompt, its `n` samples (`parallel_copies`); whether the
    caller gets a list)."""
    # imported here: engine.py (and so this module) is imported by every spawned child, which needs neither
    from sglang.srt.entrypoints.openai.protocol import pick_media_settings
    from sglang.srt.managers.io_struct import GenerateReqInput

    options = options or EngineOptions()
    media_kwargs, media_kwargs_name = pick_media_settings(options.mm_processor_kwargs, options.images_config)

    logprob_kw = {k: v for k, v in (("logprob_start_len", logprob_start_len), ("top_logprobs_num", top_logprobs_num))
                  if v is not None}
    if return_logprob:
        logprob_kw["return_logprob"] = True
    if logprob_kw:
        sampling_params = ([{**(p or {}), **logprob_kw} for p in sampling_params] if isinstance(sampling_params, list)
                           else {**(sampling_params or {}), **logprob_kw})

    batch = isinstance(prompt, list) or (input_ids and isinstance(input_ids[0], list)) or (
        messages and isinstance(messages[0], list)
    )
    if not batch:
        if isinstance(options.priority, list):
            raise ValueError("priority is one integer for one prompt")
        if isinstance(options.custom_logit_processor, list):
            raise ValueError("custom_logit_processor is one string for one prompt")
        obj = GenerateReqInput(text=prompt, input_ids=input_ids, messages=messages,
                               image_data=as_media_list(image_data), video_data=as_media_list(video_data),
                               sampling_params=dict(sampling_params or {}), stream=stream,
                               priority=options.priority, mm_processor_kwargs=media_kwargs,
                               mm_kwargs_name=media_kwargs_name, custom_logit_processor=options.custom_logit_processor)
        copies = obj.parallel_copies()
        return [copies], len(copies) > 1
    n = len(prompt if isinstance(prompt, list) else input_ids if input_ids else messages)
    per_images = list(image_data) if image_data is not None else [None] * n
    per_params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * n
    per_videos = list(video_data) if video_data is not None else [None] * n
    if len(per_images) != n or len(per_params) != n or len(per_videos) != n:
        raise ValueError(f"a batch of {n} requests needs {n} image_data, video_data and sampling_params entries")
    per_priority = options.priority if isinstance(options.priority, list) else [options.priority] * n
    if len(per_priority) != n:
        raise ValueError(f"a batch of {n} requests needs priority as one integer or a list of {n}")
    per_processor = (options.custom_logit_processor if isinstance(options.custom_logit_processor, list)
                     else [options.custom_logit_processor] * n)
    if len(per_processor) != n:
        raise ValueError(f"a batch of {n} requests needs custom_logit_processor as one string or a list of {n}")
    objs = [
        GenerateReqInput(text=prompt[i] if prompt else None, input_ids=input_ids[i] if input_ids else None,
                         messages=messages[i] if messages else None, image_data=as_media_list(per_images[i]),
                         video_data=as_media_list(per_videos[i]),
                         sampling_params=dict(per_params[i] or {}), stream=stream, priority=per_priority[i],
                         mm_processor_kwargs=media_kwargs, mm_kwargs_name=media_kwargs_name,
                         custom_logit_processor=per_processor[i])
        for i in range(n)
    ]
    return [o.parallel_copies() for o in objs], True
