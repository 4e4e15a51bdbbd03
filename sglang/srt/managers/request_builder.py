"""GenerateReqInput -> TokenizedGenerateReqInput: validation, chat template, tokenization, images.

`check` runs on the event loop (cheap checks only); `build` runs in a worker thread (template,
tokenizer, image fetch/decode/preprocess, image hashing, pickling; with --mm-processor-worker-num the
per-image work is a job for a preprocessing worker process, whose pixels come back in shared memory:
`multimodal/mm_worker_pool.py`). Every problem with the request raises
`GenerateError` (400) with a message naming it. The field and length checks that need neither the
tokenizer nor the processor live in `request_validation`; this module holds what needs them (and the
shared-memory and CUDA IPC hand-off of the built media).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.managers.chat_messages import split_chat_media
from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput, SchedulerReady, TokenizedGenerateReqInput
from sglang.srt.managers.tokenizer_lanes import TokenizerLanes
from sglang.srt.environ import envs
from sglang.srt.multimodal.bounded_fanout import resolve_in_flight
from sglang.srt.multimodal.hashing import configured_hash_algo, precompute_hash_enabled, precompute_item_hashes
from sglang.srt.multimodal.image_flight import SharedImageLoader
from sglang.srt.multimodal.media_fetch import is_http_url
from sglang.srt.multimodal.mm_worker_pool import MMWorkerError
from sglang.srt.multimodal.processor_spec import ProcessorSpec
from sglang.srt.multimodal.transport.cuda_ipc import make_sender, release_unsent
from sglang.srt.parser.reasoning_parser import prompt_opens_reasoning, reasoning_format
from sglang.srt.multimodal.transport.shm import (  # noqa: F401  (use_shm_transport: its earlier import path)
    ShmSpaceError,
    cleanup_own_segments,
    link_mm_items,
    mm_items_to_shm,
    own_pointers,
    segment_prefix,
    use_shm_transport,
)
from sglang.srt.managers.request_validation import (
    check_custom_logit_processor,
    check_in_worker,
    check_input_ids,
    check_priority,
    check_prompt_length,
    checked_dp_rank,
    fit_max_new_tokens,
    make_sampling_params,
    merge_media_sources,
    refuse_grammar_without_backend,
    refuse_local_paths,
    refuse_tokenizer_work,
)
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.metrics.stage_timer import VlmStageTimer, stage_timer_enabled


logger = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 300.0  # preprocessing workers (imports, tokenizer, processor) on a loaded machine


@dataclass
class CheckedRequest:
    """What `check` found valid; `build` finishes the job."""

    rid: str
    obj: GenerateReqInput
    messages: list[dict[str, Any]] | None
    images: list[Any]
    sampling: SamplingParams
    to_context: bool  # max_new_tokens unset by the client: fill the context
    explicit_max_new: bool = False  # the client named max_new_tokens: too large for the KV cache is a 400
    priority: int = 0
    image_config: Any = None  # the request's own image processor config (mm_processor_kwargs); None: the server's
    videos: list[Any] = field(default_factory=list)
    video_config: Any = None  # the request's own video processor config (mm_processor_kwargs); None: the server's


class RequestBuilder:
    def __init__(self, server_args: ServerArgs, model_path: str, scheduler_info: SchedulerReady | None = None,
                 mm_pool=None):
        """`mm_pool`: the preprocessing workers already started for this server (`start_worker_pool`, at
        launch, alongside the schedulers); None: started here when --mm-processor-worker-num asks for them."""
        from transformers import AutoTokenizer

        self.server_args = server_args
        self.model_path = model_path
        self.tokenizer = AutoTokenizer.from_pretrained(server_args.tokenizer_path or model_path)
        if server_args.chat_template:
            self.tokenizer.chat_template = load_chat_template(server_args.chat_template)
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as f:
            self.hf_config: dict[str, Any] = json.load(f)
        text_cfg = self.hf_config.get("text_config") or self.hf_config
        self.vocab_size = int(text_cfg.get("vocab_size") or len(self.tokenizer))
        # --reasoning-parser: the tag ending the reasoning and its token ids, tokenized once (a constraint
        # on an output that begins inside the reasoning starts after that token)
        parser = server_args.reasoning_parser
        self._reasoning_end: tuple[str, list[int]] | None = None
        if parser:
            end = reasoning_format(parser).end
            self._reasoning_end = (end, self.tokenizer.encode(end, add_special_tokens=False))
        self.context_length = int(
            server_args.context_length
            or (scheduler_info.context_length if scheduler_info else 0)
            or text_cfg.get("max_position_embeddings")
            or 4096
        )
        self.max_req_input_len = scheduler_info.max_req_input_len if scheduler_info else None
        self.max_total_num_tokens = scheduler_info.max_total_num_tokens if scheduler_info else None
        # the processor and its switches (deferred JPEGs, uint8 pixels, compact still images, video limits),
        # resolved once: the preprocessing workers build their copies from the same spec
        self.spec = ProcessorSpec.from_server_args(server_args, model_path)
        self.processor = self.spec.build(self.tokenizer, self.hf_config)
        self.fetcher = self.spec.fetcher
        self.stage_timer = VlmStageTimer(stage_timer_enabled(server_args))
        self.lanes = TokenizerLanes(self.tokenizer, self.context_length, envs.SGLANG_MAX_PROMPT_CHARS_PER_TOKEN.get())
        if self.processor is not None:
            self.processor.tokenizer_lock = self.lanes.lock  # it tokenizes video timestamps
        # shared-memory transport: pixels go to /dev/shm here; the request carries pointers only
        # (--language-only: the pixels go to the encoders, the scheduler gets none)
        epd = server_args.language_only
        self.shm_prefix = segment_prefix(server_args.port) if use_shm_transport(server_args) and not epd else None
        self.unsent_shm: dict[str, tuple[list[str], float]] = {}  # rid -> (segment names, time built)
        self.shm_fallback_count = 0  # requests sent inline because /dev/shm was full
        self.num_uint8_items = 0  # items built as uint8 pixels (SGLANG_MM_UINT8_PIXELS)
        self._count_lock = threading.Lock()
        self.ipc = None if epd else make_sender(server_args)  # --mm-feature-transport cuda_ipc: the GPU feature pool
        self._unsent_lock = threading.Lock()
        # SGLANG_MM_PRECOMPUTE_HASH; --language-only hashes here always (the encoders' cache key; no pixels later)
        self.precompute_hash = precompute_hash_enabled() or epd
        self.hash_algo = configured_hash_algo()  # SGLANG_MM_HASH_ALGO
        # single-flight: each distinct image in flight (same URL, or same bytes) is fetched, decoded,
        # preprocessed and hashed once, by the first request carrying it (multimodal/image_flight.py);
        # SGLANG_MM_SINGLE_FLIGHT=0: every image on its own
        self.image_loader = None
        # --mm-processor-worker-num: encoded images go to worker processes; their pixels come back in shm
        self.mm_pool = self._ready_workers(mm_pool)
        # Only per-image work runs here: `build` itself runs in another pool and waits on this one (with
        # workers, its threads wait on them). --mm-io-worker-num sizes it when there are no workers.
        io = server_args.mm_io_worker_num if self.mm_pool is None else None
        threads = io or min(32, (os.cpu_count() or 1) + 4)
        self.media_pool = ThreadPoolExecutor(threads, thread_name_prefix="sglang-media")
        # --mm-max-in-flight-per-request: a request's images are loaded (and hashed) K at a time (bounded_fanout)
        slots = self.mm_pool.num_workers * self.mm_pool.io_threads if self.mm_pool else threads
        self.mm_in_flight = resolve_in_flight(server_args.mm_max_in_flight_per_request, slots)
        if self.processor is not None:
            # bounded in-process loads write each finished image to shm at once (a huge request holds K here)
            spill = self.shm_prefix if self.mm_pool is None and self.mm_in_flight else None
            self.image_loader = SharedImageLoader(self.processor, lambda url: self.fetcher(url), self.hash_algo,
                                                  self.hash_algo if self.precompute_hash else None,
                                                  spill_prefix=spill, shared=envs.SGLANG_MM_SINGLE_FLIGHT.get(),
                                                  data_url_text_key=envs.SGLANG_MM_DATA_URL_TEXT_KEY.get(),
                                                  remote=self.mm_pool)
            self.processor.image_loader = self.image_loader

    def _ready_workers(self, pool):
        """The preprocessing workers, ready: `pool` (started at launch), else started here when
        --mm-processor-worker-num asks for them (unset, only a launched server resolves its default)."""
        if pool is None and self.processor is not None and self.server_args.mm_processor_worker_num:
            from sglang.srt.multimodal.mm_worker_plan import start_worker_pool

            pool = start_worker_pool(self.server_args, self.model_path)
        if pool is not None:
            try:
                pool.wait_ready(WORKER_START_TIMEOUT_S)
            except BaseException:
                pool.close()
                raise
        return pool

    def take_unsent_shm(self, rid: str) -> list[str]:
        with self._unsent_lock:
            entry = self.unsent_shm.pop(rid, None)
        return entry[0] if entry else []

    def expired_unsent_shm(self, max_age_s: float) -> list[str]:
        now, names = time.monotonic(), []
        with self._unsent_lock:
            for rid, (ns, t) in list(self.unsent_shm.items()):
                if now - t > max_age_s:
                    del self.unsent_shm[rid]
                    names += ns
        return names

    def close(self) -> None:
        self.media_pool.shutdown(wait=False, cancel_futures=True)
        if self.mm_pool is not None:  # first: no worker writes a segment after the sweep below
            self.mm_pool.close()
        with self._unsent_lock:
            for names, _ in self.unsent_shm.values():
                release_unsent(names)
            self.unsent_shm.clear()
        if self.shm_prefix:
            cleanup_own_segments(self.shm_prefix)  # shutdown: nothing of this instance is needed any more
        if self.ipc is not None:
            self.ipc.close()

    # ------------------------------------------------------------------ event loop side
    def check(self, obj: GenerateReqInput, rid: str) -> CheckedRequest:
        if sum(x is not None for x in (obj.text, obj.input_ids, obj.messages)) != 1:
            raise GenerateError("exactly one of text, input_ids or messages must be given")
        if obj.text is not None and not isinstance(obj.text, str):
            raise GenerateError(f"text must be a string, got {type(obj.text).__name__}")
        sampling, to_context = make_sampling_params(obj.sampling_params, compile_patterns=False)  # build compiles
        if self.server_args.skip_tokenizer_init:
            refuse_tokenizer_work(obj, sampling)
        refuse_grammar_without_backend(sampling, self.server_args.grammar_backend)
        check_custom_logit_processor(obj.custom_logit_processor, self.server_args)
        bad = next((t for t in (sampling.logit_bias or ()) if t >= self.vocab_size), None)
        if bad is not None:
            raise GenerateError(f"logit_bias names token id {bad} outside the vocabulary [0, {self.vocab_size})")
        images = list(obj.image_data or [])
        videos = list(obj.video_data or [])
        messages = None
        if obj.messages is not None:
            try:
                messages, sources, video_sources = split_chat_media(obj.messages)
            except ValueError as e:
                raise GenerateError(str(e)) from None
            images = merge_media_sources(sources, images)
            videos = merge_media_sources(video_sources, videos, "video")
        # The counts are checked here, on the event loop, before `build` fetches or decodes anything: a request
        # over the limit costs nothing but this parse (the limits are upstream's and vLLM's flags, one value)
        limit = self.server_args.limit_mm_per_prompt
        if len(images) > limit:
            raise GenerateError(f"too many images: {len(images)} given, at most {limit} per prompt "
                                "(--limit-mm-per-prompt / --limit-mm-data-per-request '{\"image\": N}')")
        vlimit = self.server_args.limit_mm_video_per_prompt
        if len(videos) > vlimit:
            raise GenerateError(f"too many videos: {len(videos)} given, at most {vlimit} per prompt "
                                "(--limit-mm-per-prompt / --limit-mm-data-per-request '{\"video\": M}')")
        if (images or videos) and self.processor is None:
            raise GenerateError(f"model {self.model_path} does not accept {'images' if images else 'videos'}")
        if self.server_args.allowed_local_media_path is None:
            refuse_local_paths(images, "image")
            refuse_local_paths(videos, "video")
        explicit = isinstance(obj.sampling_params, dict) and obj.sampling_params.get("max_new_tokens") is not None
        image_cfg, video_cfg = self._media_config(obj)
        return CheckedRequest(rid, obj, messages, images, sampling, to_context, explicit,
                              check_priority(obj.priority, self.server_args), image_cfg, videos, video_cfg)

    def _media_config(self, obj: GenerateReqInput):
        """The request's image and video processor settings as configs of their own, or a 400 naming what
        cannot be honoured; never ignored, images or not."""
        if obj.mm_processor_kwargs is None:
            return None, None
        if self.processor is None or not hasattr(self.processor, "media_config"):
            raise GenerateError(f"{obj.mm_kwargs_name} is not supported: model {self.model_path} does not accept images")
        try:
            return self.processor.media_config(obj.mm_processor_kwargs, obj.mm_kwargs_name)
        except ValueError as e:
            raise GenerateError(str(e)) from None

    # ------------------------------------------------------------------ worker thread side
    def build(self, req: CheckedRequest) -> tuple[TokenizedGenerateReqInput, bytes]:
        """The wire message and its pickle (made here, off the event loop: pixel tensors can be large)."""
        obj = req.obj
        check_in_worker(req.sampling, obj.custom_logit_processor)  # stop_regex compiles, processor loads: bounded
        mm_inputs, owned, timings = None, [], {}
        try:
            prompt = self._render_chat(req.messages, obj) if req.messages is not None else obj.text
            if obj.input_ids is not None:
                ids = check_input_ids(obj.input_ids, self.vocab_size)
            else:  # bounded in characters first; a long prompt takes its own lane
                ids = self.lanes.encode(prompt, add_special_tokens=False)
            if self.processor is not None:
                ids, mm_inputs, owned = self._process_media(req, ids, timings)
        except GenerateError:
            raise
        except MMWorkerError as e:  # a preprocessing worker died under this request (or failed inside)
            raise GenerateError(str(e), 500, "server_error") from None
        except ValueError as e:  # ImageLoadError, MultimodalInputError, SmartResizeError, MediaFetchError
            raise GenerateError(str(e)) from None
        try:  # from here on this request owns the segments its workers wrote (`owned`): sent, or released
            return self._finish(req, prompt, ids, mm_inputs, timings, owned)
        except BaseException:
            release_unsent(owned)
            raise

    def _process_media(self, req: CheckedRequest, ids: list[int], timings: dict[str, float]):
        """(expanded ids, the request's MultimodalInputs or None, the segment names its workers wrote)."""
        with self.stage_timer.measure(timings, "processor"):
            images = list(req.images)  # URLs are fetched by the image loader, once per URL in flight
            # with preprocessing workers a video URL is the worker's job (multimodal/video_job.py fetches it)
            fetch = self._fetch_video_if_url if self.mm_pool is None else (lambda src: src)
            videos = list(self.media_pool.map(fetch, req.videos)) if req.videos else []
            extra = {"image_config": req.image_config} if req.image_config is not None else {}
            if videos or req.video_config is not None:
                extra.update(videos=videos, video_config=req.video_config, fetcher=self.fetcher)
            ids, mm = self.processor.process(ids, images, executor=self.media_pool, max_in_flight=self.mm_in_flight,
                                             **extra)
        mm_inputs = mm if images or videos else None
        # the segments a worker (or a spilled in-process load) already wrote: this request's own from here on
        owned = own_pointers(mm_inputs, self.shm_prefix) if mm_inputs is not None and self.shm_prefix else []
        try:
            if mm_inputs is not None:  # observable: the carrier each item actually left with
                with self._count_lock:  # worker threads
                    self.num_uint8_items += sum(it.pixel_norm is not None for it in mm_inputs.mm_items)
            if videos and self.stage_timer.enabled:
                for item in mm.mm_items:
                    for stage in ("video_decode", "video_preprocess"):
                        ms = item.model_specific_data.get(stage.replace("video_", "") + "_ms")
                        if ms is not None:
                            self.stage_timer.add(timings, stage, ms)
            if mm_inputs is not None and self.precompute_hash:
                # Still in the worker thread: the items hash in parallel on the image pool and
                # are pickled with their hash and pad value; the scheduler only checks.
                with self.stage_timer.measure(timings, "hash"):
                    precompute_item_hashes(mm_inputs, self.hash_algo, self.media_pool, self.mm_in_flight)
                self.stage_timer.emit(req.rid, timings, ("hash",))
        except BaseException:
            release_unsent(owned)
            raise
        return ids, mm_inputs, owned

    def _finish(self, req: CheckedRequest, prompt, ids: list[int], mm_inputs, timings: dict[str, float],
                owned: list[str]) -> tuple[TokenizedGenerateReqInput, bytes]:
        obj = req.obj
        check_prompt_length(len(ids), self.context_length, self.max_req_input_len, self.max_total_num_tokens)
        sampling = req.sampling
        sampling.max_new_tokens = fit_max_new_tokens(len(ids), sampling.max_new_tokens, req.to_context,
                                                     req.explicit_max_new, self.context_length,
                                                     self.max_total_num_tokens)
        sampling.min_new_tokens = min(sampling.min_new_tokens, sampling.max_new_tokens)
        tokenized = TokenizedGenerateReqInput(
            rid=req.rid, input_ids=ids, sampling_params=sampling, mm_inputs=mm_inputs, stream=obj.stream,
            input_text=prompt, created_time=obj.created_time, stage_timings_ms=timings if mm_inputs else {},
            priority=req.priority,
            grammar_start_after=self._grammar_start_after(prompt, sampling, req.messages is not None,
                                                          obj.require_reasoning),
            routed_dp_rank=checked_dp_rank(obj.routed_dp_rank, self.server_args.dp_size),
            custom_logit_processor=obj.custom_logit_processor,
        )
        tokenized.send_time = time.time()  # the `send` stage starts with serialization
        names = self._to_shm(req.rid, mm_inputs) if mm_inputs is not None and self.shm_prefix else []
        if mm_inputs is not None and self.ipc is not None:
            names = self.ipc.items_to_pool(mm_inputs, req.rid)
        names = owned + names
        try:
            payload = pickle.dumps(tokenized, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:
            release_unsent(names)
            raise
        if names:
            # Registered here, in the worker thread, so a caller cancelled while awaiting this build
            # (client gone) cannot lose them: the tokenizer manager sweeps what is never sent.
            with self._unsent_lock:
                self.unsent_shm[req.rid] = (names, time.monotonic())
        return tokenized, payload

    def can_clone(self, tokenized: TokenizedGenerateReqInput) -> bool:
        """Whether `clone` may copy this built request: not when its features sit in the CUDA IPC pool
        (a pool slice has one owner; such copies are built again)."""
        if tokenized.mm_inputs is not None and self.server_args.language_only:
            # EPD: zmq_to_scheduler embeddings are addressed to one rid; each sample is sent to the encoders
            return self.server_args.encoder_transfer_backend == "zmq_to_tokenizer"
        return self.ipc is None or tokenized.mm_inputs is None

    def clone(self, tokenized: TokenizedGenerateReqInput, payload: bytes, rid: str,
              seed: int | None) -> tuple[TokenizedGenerateReqInput, bytes]:
        """Another sample of a built request (`n` > 1): the same prompt, media and parameters under its
        own rid and seed, without fetching, decoding, hashing or writing the media again. Shared-memory
        pixels get hard-linked names of their own (`link_mm_items`), registered as unsent like `build`'s.
        Runs in a worker thread (the unpickle and pickle)."""
        copy = pickle.loads(payload)  # a deep copy; shared-memory pointers travel as metadata only
        copy.rid = rid
        copy.sampling_params.seed = seed
        names = link_mm_items(copy.mm_inputs, self.shm_prefix) if copy.mm_inputs is not None and self.shm_prefix else []
        copy.send_time = time.time()
        try:
            out = pickle.dumps(copy, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:
            release_unsent(names)
            raise
        if names:
            with self._unsent_lock:
                self.unsent_shm[rid] = (names, time.monotonic())
        return copy, out

    def _to_shm(self, rid: str, mm_inputs) -> list[str]:
        """Pixels into shared memory; when /dev/shm is full this request's pixels travel inline
        (pickled with the request) instead: slower, never fatal."""
        try:
            return mm_items_to_shm(mm_inputs, self.shm_prefix)
        except ShmSpaceError as e:
            with self._unsent_lock:
                self.shm_fallback_count += 1
                n = self.shm_fallback_count
            if n == 1 or n % 100 == 0:  # a full /dev/shm stays full for a while: do not flood the log
                logger.warning("shared memory is full (%s); request %s sends its pixels inline "
                               "(%d request(s) so far; enlarge /dev/shm, e.g. docker --shm-size)", e, rid, n)
            return []

    def _render_chat(self, messages: list[dict[str, Any]], obj: GenerateReqInput) -> str:
        """The prompt the model's own template makes of the messages, the tools and chat_template_kwargs;
        with continue_final_message the last (assistant) message is left open, no generation prompt."""
        kwargs = dict(obj.chat_template_kwargs or {})
        if obj.tools:
            kwargs["tools"] = obj.tools
        cont = bool(obj.continue_final_message)
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=not cont,
                                                      continue_final_message=cont, **kwargs)
        except Exception as e:  # jinja errors (raise_exception in templates) are not ValueErrors
            raise GenerateError(f"cannot apply the chat template to these messages: {e}") from None

    def _grammar_start_after(self, prompt: str | None, sampling: SamplingParams, chat: bool,
                             require_reasoning: bool) -> int | None:
        """With --reasoning-parser, a constrained output that begins inside the reasoning (a chat prompt
        that opens it, or /generate's require_reasoning) is constrained only after it: the id of the
        token ending the reasoning (None: from the start)."""
        parser = self.server_args.reasoning_parser
        if require_reasoning and not parser:
            raise GenerateError("require_reasoning needs a reasoning parser: start the server with --reasoning-parser")
        opens = bool(parser) and (require_reasoning or (chat and prompt_opens_reasoning(parser, prompt)))
        if not opens or sampling.grammar_key() is None:
            return None
        end, ids = self._reasoning_end
        if len(ids) != 1:
            raise GenerateError(f"an output constraint after reasoning needs {end} to be one token, and this "
                                f"tokenizer splits it in {len(ids)}; drop the constraint or the reasoning")
        return ids[0]

    def _fetch_video_if_url(self, src: Any) -> Any:
        return self.fetcher(src, "video") if is_http_url(src) else src


def load_chat_template(path: str) -> str:
    """--chat-template: a Jinja file replacing the tokenizer's template (checked at start-up)."""
    if not os.path.isfile(path):
        raise ValueError(f"--chat-template {path!r}: no such file (give a Jinja chat template file)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"--chat-template {path!r}: not a valid Jinja template: {e}") from None
    return text

