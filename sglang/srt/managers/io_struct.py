"""Messages between the processes (tokenizer manager <-> scheduler <-> detokenizer).

Plain dataclasses, pickled over ZMQ between our own processes only. No model or scheduler imports:
every process can load this module cheaply.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.multimodal.mm_types import MultimodalInputs
from sglang.srt.sampling.sampling_params import SamplingParams


# ----------------------------------------------------------------------------- API layer -> tokenizer manager
@dataclass
class GenerateReqInput:
    """One request as the API layer hands it to the TokenizerManager, before tokenization.

    Exactly one of `text`, `input_ids`, `messages` is set. `messages` are chat turns (OpenAI style:
    string content or lists of `text` / `image_url` / `image` parts); `image_data` holds the images
    for `{"type": "image"}` parts or for the `<|image_pad|>` placeholders of `text` / `input_ids`,
    in prompt order (bytes, base64, data URLs, http(s) URLs, allowed local paths, PIL images)."""

    text: str | None = None
    input_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    image_data: list[Any] = field(default_factory=list)
    # videos for `{"type": "video"}` parts or `<|video_pad|>` placeholders, in prompt order: bytes, base64,
    # data URLs, http(s) URLs, allowed local paths, or a list of frames (any image input each)
    video_data: list[Any] = field(default_factory=list)
    sampling_params: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    rid: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    created_time: float = 0.0
    priority: int | None = None  # with --enable-priority-scheduling: larger runs first
    # a request's image processor settings (max_pixels, min_pixels), and the field that carried them
    # (`mm_processor_kwargs`, or upstream's `images_config`), so a refusal names it
    mm_processor_kwargs: dict[str, Any] | None = None
    mm_kwargs_name: str = "mm_processor_kwargs"
    # chat only: OpenAI tool objects rendered by the chat template, and the last (assistant) message
    # continued instead of a new turn opened
    tools: list[dict[str, Any]] | None = None
    continue_final_message: bool = False
    # /generate (upstream's field): the output begins inside the reasoning, its constraint applies after it
    require_reasoning: bool = False
    # the data-parallel replica to run on (an external router's choice; upstream's routed_dp_rank)
    routed_dp_rank: int | None = None
    # upstream's CustomLogitProcessor.to_str() text; honoured with --enable-custom-logit-processor, else a 400
    custom_logit_processor: str | None = None

    def parallel_copies(self, max_n: int = 64) -> list["GenerateReqInput"]:
        """`sampling_params["n"]` independent samples of this prompt as n requests (they share its KV
        through the prefix cache). Copy i gets rid `<rid>-<i>` when a rid was given and seed `seed + i`
        when a seed was, so the samples differ yet stay reproducible. n=1 (or absent): [self]."""
        params = dict(self.sampling_params or {}) if isinstance(self.sampling_params, dict) else self.sampling_params
        n = params.pop("n", 1) if isinstance(params, dict) else 1
        n = 1 if n is None else n
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= max_n:
            raise ValueError(f"n must be an integer in [1, {max_n}], got {n!r}")
        self.sampling_params = params
        if n == 1:
            return [self]
        copies = []
        for i in range(n):
            p = dict(params)
            for key in ("seed", "sampling_seed"):
                if p.get(key) is not None:
                    p[key] = p[key] + i
            copies.append(dataclasses.replace(self, sampling_params=p, rid=f"{self.rid}-{i}" if self.rid else None))
        return copies


# ----------------------------------------------------------------------------- tokenizer -> scheduler
@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    mm_inputs: MultimodalInputs | None = None
    stream: bool = False
    input_text: str | None = None
    created_time: float = 0.0  # time.time() when the HTTP request arrived
    # stage timings measured before the scheduler (ms); the stage timer fills these
    stage_timings_ms: dict[str, float] = field(default_factory=dict)
    # time.time() when the tokenizer started sending (the stage timer's `recv` starts here)
    send_time: float = 0.0
    # wall time of the TP broadcast that delivered this request to every rank (set by rank 0)
    tp_broadcast_ms: float = 0.0
    priority: int = 0  # --enable-priority-scheduling
    # the output constraint applies after this token (the end of reasoning, `</think>`): set when the
    # prompt leaves the model reasoning under --reasoning-parser (sglang/srt/parser/reasoning_parser.py)
    grammar_start_after: int | None = None
    routed_dp_rank: int | None = None  # checked against --dp-size; None: the load balancer picks
    custom_logit_processor: str | None = None  # checked where it entered (it unpickles to a class)
    # --language-only with zmq_to_scheduler (EPD): the mm_items whose embeddings encoders push to scheduler rank 0,
    # which holds the request (no KV) until they are all there; how long it held it; why it gave up (503)
    epd_pending_items: tuple[int, ...] = ()
    epd_wait_ms: float | None = None
    epd_error: str | None = None


@dataclass
class AbortReq:
    rid: str
    reason: str = "aborted by client"


@dataclass
class FlushCacheReq:
    req_id: int = 0  # echoed in the reply: replies resolve the waiter with their id, never by order


@dataclass
class GetServerInfoReq:
    req_id: int = 0


@dataclass
class GetLoadReq:
    """/get_load -> every scheduler replica (rank 0 answers for its TP group)."""

    req_id: int = 0


@dataclass
class ProfileReq:
    """/start_profile, /stop_profile -> every scheduler rank: torch.profiler runs where the model runs.
    Each rank writes `<output_dir>/<profile_id>-TP-<rank>.trace.json.gz` when profiling stops (on
    "stop", or by itself after `num_steps` forward steps)."""

    action: str  # "start" | "stop"
    output_dir: str | None = None  # None: SGLANG_TORCH_PROFILER_DIR; refused outside it (profiler.trace_dir)
    num_steps: int | None = None  # stop by itself after this many forward steps; None: SGLANG_PROFILE_NUM_STEPS
    activities: list[str] = field(default_factory=lambda: ["CPU", "GPU"])
    with_stack: bool = False
    record_shapes: bool = False
    profile_id: str = ""  # the same on every rank: names the trace files
    req_id: int = 0


@dataclass
class UpdateWeightFromDiskReqInput:
    """/update_weights_from_disk -> every scheduler replica, in two phases (upstream's name). "load": every
    TP rank loads `model_path` over its weights, undoably, and the replica answers whether all of its ranks
    did (a replica whose rank failed is already back on the old weights); then "commit" (caches flushed)
    when every replica loaded, else "rollback" (the replicas that loaded go back to the old weights)."""

    model_path: str = ""
    load_format: str | None = None
    phase: str = "load"  # "load" | "commit" | "rollback"
    flush_cache: bool = True  # commit: drop the radix cache and the vision embedding cache (upstream's field)
    req_id: int = 0


# ----------------------------------------------------------------------------- finish reasons
@dataclass
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None  # the stop token id or stop string that ended generation
    message: str | None = None  # for "abort": why (client gone, bad request, server error)
    status_code: int | None = None  # for "abort" caused by bad input: the HTTP status to answer with
    # for "stop" by a stop string or stop_regex: the text the output is cut before; None keeps the output
    # whole (a stop token, or no_stop_trim). A stop string cuts at its first occurrence; a stop_regex match
    # at the place it was found: `stop_chars_after` characters before the end of the output.
    stop_text: str | None = None
    stop_chars_after: int | None = None

    def stop_cut(self, text: str) -> int | None:
        """Where the whole output `text` ends once the stop match is cut off; None keeps it whole."""
        if self.type != "stop" or not self.stop_text:
            return None
        if self.stop_chars_after is not None:
            start = len(text) - self.stop_chars_after - len(self.stop_text)
            if start >= 0 and text.startswith(self.stop_text, start):
                return start
        idx = text.find(self.stop_text)
        return idx if idx >= 0 else None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type}
        if self.matched is not None:
            d["matched"] = self.matched
        if self.message is not None:
            d["message"] = self.message
        return d


# ----------------------------------------------------------------------------- scheduler -> detokenizer
@dataclass
class BatchTokenIDOut:
    """New tokens since the last message, per request; `finished_reasons[i]` set on the last one."""

    rids: list[str]
    new_token_ids: list[list[int]]
    finished_reasons: list[FinishReason | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    skip_special_tokens: list[bool]
    meta_info: list[dict[str, Any]]


# ----------------------------------------------------------------------------- detokenizer -> tokenizer
@dataclass
class BatchStrOut:
    """New text (and ids) since the last message, per request."""

    rids: list[str]
    output_strs: list[str]
    new_token_ids: list[list[int]]
    finished_reasons: list[FinishReason | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    meta_info: list[dict[str, Any]]


# ----------------------------------------------------------------------------- scheduler -> tokenizer (control)
@dataclass
class FlushCacheReqOutput:
    success: bool
    message: str = ""
    req_id: int = 0


@dataclass
class UpdateWeightFromDiskReqOutput:
    """One replica's answer to one phase of a weight update (the message names the failing rank)."""

    success: bool
    message: str = ""
    dp_rank: int = 0
    req_id: int = 0


@dataclass
class GetServerInfoReqOutput:
    info: dict[str, Any]
    req_id: int = 0


@dataclass
class GetLoadReqOutput:
    """One replica's load in upstream's /get_load fields: requests held (running + waiting), waiting ones,
    tokens (KV held by running requests plus prompts still to prefill), the prompt tokens still to prefill
    alone, and when it was measured."""

    dp_rank: int
    num_reqs: int
    num_waiting_reqs: int
    num_tokens: int
    num_pending_tokens: int = 0  # prompt tokens still to prefill: waiting prompts and the chunked one's rest
    ts_tic: float = 0.0  # the scheduler's time.perf_counter() when measured (upstream's field)
    req_id: int = 0


@dataclass
class ReplicaLoadReport:
    """Scheduler rank 0 of a data-parallel replica -> the data-parallel controller, whenever its load changed:
    its live counts, and how many requests (and prompt tokens) it has received so far, so the controller can
    add what it sent that the replica has not seen yet."""

    dp_rank: int
    num_reqs: int
    num_tokens: int
    num_received_reqs: int
    num_received_tokens: int


@dataclass
class ProfileReqOutput:
    success: bool
    message: str = ""
    files: list[str] = field(default_factory=list)  # trace files written (stop) or to be written (start)
    req_id: int = 0


@dataclass
class SchedulerReady:
    """Sent once per rank-0 scheduler after the model is loaded: the start-up barrier."""

    max_total_num_tokens: int
    max_req_input_len: int
    context_length: int


@dataclass
class SchedulerDied:
    """Best-effort notice from a scheduler that is about to exit on an error."""

    message: str
