"""All server arguments: one frozen dataclass; the argparse CLI is generated from its fields."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, get_args, get_origin, get_type_hints

from sglang.srt.environ import envs
from sglang.srt.port_args import PortArgs  # noqa: F401  (upstream's import path)
from sglang.srt.function_call.function_call_parser import TOOL_CALL_PARSER_CHOICES
from sglang.srt.parser.reasoning_parser import REASONING_PARSERS


def _arg(help: str, choices: tuple | None = None, parse=None, aliases: tuple[str, ...] = (), **kw) -> dict:
    """Field metadata: help, argparse choices, a parser for the raw string (errors name the flag) and other
    spellings of the flag (upstream's long names, this engine's earlier names)."""
    return {"help": help, "choices": choices, "parse": parse, "aliases": aliases, **kw}


# Token (and byte) counts take upstream's suffixes, case-sensitive: SI k M G T (x1000) and IEC Ki Mi Gi Ti
# (x1024); decimals only with an SI suffix and only where the count comes out whole (1.5k = 1500).
_SI_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_COUNT = re.compile(r"(?P<int>-?\d+)|(?P<num>\d+(?:\.\d+)?)(?P<suffix>Ki|Mi|Gi|Ti|k|M|G|T)")
_SUFFIX_HELP = "an integer, or one with a suffix: k M G T (x1000) or Ki Mi Gi Ti (x1024), case-sensitive"


def parse_token_count(raw: str | int) -> int:
    """A count as upstream's launcher reads it: `4096`, `128k` (128000), `1M` (1000000), `32Ki` (32768),
    `1.5k` (1500). Anything else is refused, naming the likely intent (`1m` -> 1M, `1KI` -> 1Ki)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    text = str(raw).strip()
    m = _COUNT.fullmatch(text)
    if m is None:
        raise ValueError(f"not a count: {_SUFFIX_HELP}{_suffix_hint(text)}")
    if m["int"] is not None:
        return int(m["int"])
    number, suffix = m["num"], m["suffix"]
    if suffix in _IEC_SUFFIXES:
        if "." in number:
            si = suffix[0].replace("K", "k")
            raise ValueError(f"decimals go with k M G T only, not with {suffix} (write {number}{si} or a whole "
                             f"number of {suffix})")
        return int(number) * _IEC_SUFFIXES[suffix]
    value = Decimal(number) * _SI_SUFFIXES[suffix]
    if value != value.to_integral_value():
        raise ValueError(f"{text} is {value.normalize():f}, not a whole number")
    return int(value)


def _suffix_hint(text: str) -> str:
    m = re.fullmatch(r"\d+(?:\.\d+)?([A-Za-z]+)", text)
    if m is None:
        return ""
    suffix = m[1]
    if suffix == "K":
        return " ('K': write k for 1000 or Ki for 1024)"
    for known in (*_IEC_SUFFIXES, *_SI_SUFFIXES):
        if suffix.lower() == known.lower() and suffix != known:
            return f" ({suffix!r}: did you mean {known!r}?)"
    return f" ({suffix!r} is not a suffix)"


DEFAULT_VIDEO_LIMIT = 8  # videos per request when no limit names them


def parse_mm_limits(raw: str | int | dict) -> int | dict[str, int]:
    """`N` (images), or the JSON forms `{"image": N, "video": M}` (upstream's --limit-mm-data-per-request,
    vLLM's --limit-mm-per-prompt) as a dict. Audio is not served: a non-zero audio limit is refused."""
    import json

    if isinstance(raw, dict):
        limits = raw
    else:
        raw = str(raw).strip()
        if not raw.startswith("{"):
            return int(raw)
        try:
            limits = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON: {e}") from None
    unknown = {k for k, v in limits.items() if k not in ("image", "video") and v}
    if unknown:
        raise ValueError(f"only image and video inputs are served; got limits for {sorted(unknown)}")
    out = {}
    for k in ("image", "video"):
        if limits.get(k) is not None:
            if isinstance(limits[k], bool) or not isinstance(limits[k], int) or limits[k] < 0:
                raise ValueError(f"the {k} limit must be a non-negative integer, got {limits[k]!r}")
            out[k] = limits[k]
    return out


def parse_image_limit(raw: str) -> int:
    """The image part of `parse_mm_limits` (0 when a JSON form names none)."""
    limits = parse_mm_limits(raw)
    return limits if isinstance(limits, int) else limits.get("image", 0)


GRAMMAR_BACKENDS = ("xgrammar", "none")


def _grammar_problems(args) -> list[str]:
    problems = []
    if args.grammar_backend not in GRAMMAR_BACKENDS:
        problems.append(f"--grammar-backend {args.grammar_backend}: choose xgrammar or none (outlines and llguidance "
                        "are not available here)")
    cnt = args.constrained_json_max_whitespace_cnt
    if cnt is not None and cnt < 1:
        problems.append("--constrained-json-max-whitespace-cnt must be >= 1")
    if args.tool_call_parser not in (None, *TOOL_CALL_PARSER_CHOICES):
        problems.append(f"--tool-call-parser {args.tool_call_parser}: choose one of {', '.join(TOOL_CALL_PARSER_CHOICES)}")
    if args.reasoning_parser not in (None, *REASONING_PARSERS):
        problems.append(f"--reasoning-parser {args.reasoning_parser}: choose one of {', '.join(REASONING_PARSERS)}")
    return problems


# --schedule-policy: upstream 0.5.23's values; the ones that need machinery this engine does not have stop
# start-up with the reason
SCHEDULE_POLICIES = ("fcfs", "lpm", "random", "dfs-weight", "lof", "priority")
REFUSED_SCHEDULE_POLICIES = {
    "routing-key": "it orders requests by the routing key sglang-router attaches for data-parallel attention, "
                   "which this engine neither receives nor serves",
    "hrrn": "highest-response-ratio-next is not implemented here",
    "shortest-prefill-first": "upstream's experimental shortest-prefill-first is not implemented here",
}
# --load-balance-method: upstream 0.5.23's choices (auto: round_robin, as upstream outside prefill/decode
# disaggregation) and the names of earlier upstream releases, each -> the method it means here
LOAD_BALANCE_METHODS = {"auto": "round_robin", "round_robin": "round_robin", "total_requests": "total_requests",
                        "shortest_queue": "total_requests", "total_tokens": "total_tokens",
                        "minimum_tokens": "total_tokens"}
REFUSED_LOAD_BALANCE_METHODS = {
    "follow_bootstrap_room": "it follows the bootstrap room of prefill/decode disaggregation, which this engine "
                             "does not serve",
}


def resolve_load_balance_method(name: str) -> str:
    """round_robin, total_requests or total_tokens; ValueError naming the choices otherwise."""
    if name in REFUSED_LOAD_BALANCE_METHODS:
        raise ValueError(f"--load-balance-method {name}: {REFUSED_LOAD_BALANCE_METHODS[name]}")
    if name not in LOAD_BALANCE_METHODS:
        raise ValueError(f"--load-balance-method {name}: choose one of {', '.join(LOAD_BALANCE_METHODS)}")
    return LOAD_BALANCE_METHODS[name]


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_LEVEL_ALIASES = {"warn": "warning", "fatal": "critical"}  # Python's logging takes these too
DEFAULT_MAX_PAYLOAD_SIZE = 64 * 2**20

DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class ServerArgs:
    model_path: str | None = field(default=None, metadata=_arg(
        "HF-format model directory, or a hub id found in the local Hugging Face cache (nothing is downloaded); "
        "omitted: the embedded tiny Qwen3-VL, generated on first use", aliases=("--model",)))
    tokenizer_path: str | None = field(default=None, metadata=_arg("tokenizer directory (default: model path)"))
    served_model_name: str | None = field(default=None, metadata=_arg("name reported by /v1/models"))
    host: str = field(default="127.0.0.1", metadata=_arg("HTTP bind address"))
    port: int = field(default=30000, metadata=_arg("HTTP port"))
    tp_size: int = field(default=1, metadata=_arg(
        "tensor-parallel ranks (one scheduler process each)", aliases=("--tensor-parallel-size",)))
    nnodes: int = field(default=1, metadata=_arg("number of nodes"))
    node_rank: int = field(default=0, metadata=_arg("this node's rank"))
    dist_init_addr: str | None = field(default=None, metadata=_arg(
        "host:port of the torch.distributed rendezvous", aliases=("--nccl-init-addr",)))
    context_length: int | None = field(default=None, metadata=_arg(
        "max prompt + output tokens (default: the model's); suffixes k M G T (x1000) and Ki Mi Gi Ti (x1024): "
        "128k = 128000, 128Ki = 131072", parse=parse_token_count))
    chunked_prefill_size: int = field(default=8192, metadata=_arg(
        "max tokens prefilled per step; longer prompts are split into chunks (-1: no chunking); 8k accepted",
        parse=parse_token_count))
    max_prefill_tokens: int = field(default=16384, metadata=_arg(
        "token budget of one prefill batch without chunking; 16k accepted", parse=parse_token_count))
    max_running_requests: int | None = field(default=None, metadata=_arg(
        "max requests running at once (default: derived from the KV cache size, 64 to 1024)"))
    max_total_tokens: int | None = field(default=None, metadata=_arg(
        "KV cache size in tokens (CPU default 65536; GPU default from --mem-fraction-static); 128k / 128Ki accepted",
        parse=parse_token_count))
    mem_fraction_static: float = field(default=0.85, metadata=_arg(
        "GPU: fraction of device memory for weights + KV cache"))
    page_size: int = field(default=1, metadata=_arg("KV cache page size in tokens"))
    disable_radix_cache: bool = field(default=False, metadata=_arg("disable the prefix cache"))
    schedule_policy: str = field(default="fcfs", metadata=_arg(
        "order of waiting requests: fcfs (arrival), lpm (longest cached prefix first), dfs-weight (depth-first over "
        "the prefix tree, heaviest subtrees first), lof (largest max_new_tokens first), random, priority (each "
        "request's priority, then arrival: implies --enable-priority-scheduling)",
        choices=(*SCHEDULE_POLICIES, *REFUSED_SCHEDULE_POLICIES)))
    enable_priority_scheduling: bool = field(default=False, metadata=_arg(
        "order waiting requests by their `priority` (higher first) before the --schedule-policy order, and let a "
        "request that cannot be admitted preempt running ones of lower priority; without it a request that "
        "gives a priority gets 400"))
    schedule_low_priority_values_first: bool = field(default=False, metadata=_arg(
        "with priority scheduling, lower priority values run first"))
    priority_scheduling_preemption_threshold: int = field(default=10, metadata=_arg(
        "smallest priority difference with which a waiting request preempts a running one"))
    disable_priority_preemption: bool = field(default=False, metadata=_arg(
        "priority scheduling orders the queue only: running requests are never preempted"))
    schedule_conservativeness: float = field(default=1.0, metadata=_arg(
        "how much KV admission holds back for the output of running requests (scales the new-token ratio; "
        "larger: fewer retractions, smaller batches)"))
    log_level: str = field(default="info", metadata=_arg(
        "logging level: debug, info, warning (warn), error or critical (fatal), any case"))
    enable_metrics: bool = field(default=False, metadata=_arg("serve Prometheus metrics on /metrics"))
    enable_vlm_stage_timer: bool = field(default=False, metadata=_arg(
        "time each VLM pipeline stage per request: log lines, meta_info['stage_timings_ms'], metrics"))
    limit_mm_per_prompt: int = field(default=32, metadata=_arg(
        "max images per request: N, or vLLM's JSON form '{\"image\": N, \"video\": M}' (videos: 8 by default)",
        parse=parse_mm_limits))
    limit_mm_data_per_request: str | None = field(default=None, metadata=_arg(
        "upstream's form of the limits, JSON '{\"image\": N, \"video\": M}' (overrides --limit-mm-per-prompt)"))
    allowed_local_media_path: str | None = field(default=None, metadata=_arg(
        "directory local image paths must lie under (default: local paths refused)"))
    media_fetch_timeout: float = field(default=10.0, metadata=_arg("seconds to fetch one http(s) image"))
    media_max_bytes: int = field(default=20 * 1024 * 1024, metadata=_arg("byte cap for one fetched image"))
    allowed_media_domains: tuple[str, ...] | None = field(default=None, metadata=_arg(
        "hosts http(s) image URLs may point at (and their subdomains), space- or comma-separated; "
        "default: any host with a public address"))
    allow_private_media_urls: bool = field(default=False, metadata=_arg(
        "also fetch image URLs whose host resolves to a loopback, private or link-local address "
        "(refused by default: the server must not be a proxy into its own network)"))
    max_payload_size: int | None = field(default=None, metadata=_arg(
        "largest HTTP request body accepted, in bytes (suffixes as for token counts: 64Mi); larger bodies get 413 "
        "(default 64 MiB)", parse=parse_token_count))
    max_request_body_mb: float | None = field(default=None, metadata=_arg(
        "the same limit in MiB (give one of the two)"))
    random_seed: int = field(default=0, metadata=_arg("seed for sampling without a per-request seed"))
    dtype: str = field(default="auto", metadata=_arg(
        "weight dtype", choices=("auto", "float32", "bfloat16", "float16", *DTYPE_ALIASES)))
    device: str = field(default="auto", metadata=_arg("device", choices=("auto", "cpu", "cuda")))
    attention_backend: str = field(default="auto", metadata=_arg(
        "language-model attention: triton (our paged Triton kernels; the default on CUDA), torch_native (pure "
        "torch, the CPU default and the tests' reference), auto", choices=("auto", "triton", "torch_native")))
    mm_feature_transport: str = field(default="cpu", metadata=_arg(
        "how multimodal features reach the schedulers (upstream's names): cpu (host memory: POSIX shared memory "
        "pointers where every rank shares this host, SGLANG_MM_SHM_TRANSPORT=0 for the inline-pickle baseline); "
        "cuda_ipc (CUDA machines, one host: pixels copied into a GPU pool of SGLANG_MM_FEATURE_CACHE_MB that every "
        "rank opens once by IPC handle); shm is accepted as an alias of cpu",
        choices=("cpu", "cuda_ipc", "shm")))
    stream_interval: int = field(default=1, metadata=_arg("decode steps between streamed chunks"))
    watchdog_timeout: float = field(default=300.0, metadata=_arg(
        "seconds any TP collective may wait for a peer rank before failing (a dead rank ends the server)"))
    api_key: str | None = field(default=None, metadata=_arg(
        "require 'Authorization: Bearer <key>' on every route except /health and /metrics"))
    chat_template: str | None = field(default=None, metadata=_arg(
        "a Jinja chat template file to use instead of the tokenizer's"))
    # ---- upstream flags accepted for compatibility (docs/compatibility.md); values the engine cannot
    # honour stop start-up with one line saying so
    enable_multimodal: bool = field(default=False, metadata=_arg(
        "accepted for compatibility: multimodal input is always on for vision-language models"))
    trust_remote_code: bool = field(default=False, metadata=_arg(
        "accepted for compatibility: the supported architectures are built in, no remote code is ever run"))
    skip_server_warmup: bool = field(default=False, metadata=_arg(
        "accepted for compatibility: the server does no warm-up request"))
    disable_cuda_graph: bool = field(default=False, metadata=_arg(
        "do not capture decode CUDA graphs (GPU only: with the triton attention backend, decode batches up to "
        "--cuda-graph-max-bs-decode replay captured graphs)"))
    cuda_graph_max_bs_decode: int | None = field(default=None, metadata=_arg(
        "largest decode batch captured in a CUDA graph (default min(160, max running requests); accepted and "
        "ignored on CPU)", aliases=("--cuda-graph-max-bs",)))
    cuda_graph_bs_decode: tuple[str, ...] | None = field(default=None, metadata=_arg(
        "decode batch sizes captured in CUDA graphs (GPU only; accepted and ignored on CPU)",
        aliases=("--cuda-graph-bs",)))
    mm_attention_backend: str | None = field(default=None, metadata=_arg(
        "vision-tower attention: triton_attn (upstream's name; triton is the same: one varlen kernel launch per "
        "layer for all images / windows; the default on CUDA) or sdpa (torch scaled_dot_product_attention per "
        "segment; the CPU default)"))
    attention_fp32_precision: str = field(default="tf32", metadata=_arg(
        "float32 matmuls inside our Triton attention kernels on CUDA (--dtype float32): tf32 (tensor cores; "
        "exact float32 dots run on the FMA units and spill registers) or ieee (exact; what the parity tests "
        "against transformers use). bf16/fp16 models and CPU are unaffected", choices=("tf32", "ieee")))
    enable_vit_ulysses_sp: bool = field(default=False, metadata=_arg(
        "vision tower with Ulysses sequence parallelism at --tp-size > 1: whole vision weights on every rank, "
        "the batch's patches split over the ranks, all-to-alls around attention instead of TP all-reduces "
        "(the vision heads must divide by --tp-size; no effect at --tp-size 1)"))
    dp_size: int = field(default=1, metadata=_arg(
        "data-parallel replicas: N copies of the scheduler group (each --tp-size ranks, on consecutive devices "
        "from --base-gpu-id) behind one data-parallel controller; one node only", aliases=("--data-parallel-size",)))
    load_balance_method: str = field(default="auto", metadata=_arg(
        "how the data-parallel controller picks a replica: round_robin (auto), total_requests (fewest requests "
        "held; shortest_queue is the older name) or total_tokens (fewest tokens held; minimum_tokens)",
        choices=(*LOAD_BALANCE_METHODS, *REFUSED_LOAD_BALANCE_METHODS)))
    base_gpu_id: int = field(default=0, metadata=_arg(
        "first GPU this server uses (replica k, rank r: GPU base + k * tp-per-node + r); no effect on CPU"))
    quantization: str | None = field(default=None, metadata=_arg(
        "fp8: quantize a float checkpoint's text linears to block FP8 while loading (a -FP8 checkpoint needs no flag)"))
    kv_cache_dtype: str = field(default="auto", metadata=_arg(
        "KV cache dtype: auto (the model dtype), fp8_e4m3 or fp8_e5m2 (half the bytes per token of bf16)"))
    fp8_gemm_backend: str = field(default="auto", metadata=_arg(
        "block-FP8 GEMM: auto or triton (our Triton kernel on CUDA, its torch reference elsewhere); others refused"))
    quantization_param_path: str | None = field(default=None, metadata=_arg(
        "JSON file of per-layer FP8 KV cache scales (vLLM's kv_cache.scaling_factor layout)"))
    revision: str | None = field(default=None, metadata=_arg("hub revision when --model-path is a hub id"))
    grammar_backend: str = field(default="xgrammar", metadata=_arg(
        "constrained output (json_schema, regex, ebnf, response_format): xgrammar, or none to refuse constraints "
        "with a 400 (upstream's outlines and llguidance are not available)"))
    constrained_json_disable_any_whitespace: bool = field(default=False, metadata=_arg(
        "JSON schema output without free whitespace between tokens (compact JSON)"))
    constrained_json_max_whitespace_cnt: int | None = field(default=None, metadata=_arg(
        "at most this many whitespace characters in a row in JSON schema output (default: unlimited)"))
    tool_call_parser: str | None = field(default=None, metadata=_arg(
        "the tool-call format of chat outputs with tools: qwen25 (qwen is the same: <tool_call> JSON blocks, as "
        "Qwen2.5 / Qwen3(-VL) templates use); unset or auto: qwen25 when the chat template uses <tool_call>",
        choices=TOOL_CALL_PARSER_CHOICES))
    reasoning_parser: str | None = field(default=None, metadata=_arg(
        "split the model's <think> reasoning into reasoning_content: qwen3 (reasoning when the output or the "
        "prompt opens <think>) or qwen3-thinking (the template opens it: every output begins reasoning)",
        choices=tuple(REASONING_PARSERS)))

    def __post_init__(self):
        problems = []
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))
        if isinstance(self.limit_mm_per_prompt, (dict, str)):  # vLLM's JSON form carries both limits
            try:
                limits = parse_mm_limits(self.limit_mm_per_prompt)
            except ValueError as e:
                problems.append(f"--limit-mm-per-prompt: {e}")
                limits = 0
            if isinstance(limits, dict) and self.limit_mm_data_per_request is None:
                object.__setattr__(self, "limit_mm_data_per_request", json.dumps(limits))
            object.__setattr__(self, "limit_mm_per_prompt", limits if isinstance(limits, int) else limits.get("image", 0))
        if self.limit_mm_data_per_request is not None:
            try:
                object.__setattr__(self, "limit_mm_per_prompt", parse_image_limit(self.limit_mm_data_per_request))
            except ValueError as e:
                problems.append(f"--limit-mm-data-per-request: {e}")
        if self.cuda_graph_bs_decode is not None:
            try:
                object.__setattr__(self, "cuda_graph_bs_decode", tuple(int(b) for b in self.cuda_graph_bs_decode))
            except ValueError:
                problems.append(f"--cuda-graph-bs-decode takes integers, got {list(self.cuda_graph_bs_decode)}")
        if self.mm_feature_transport == "shm":  # this engine's earlier name for the same behaviour
            object.__setattr__(self, "mm_feature_transport", "cpu")
        if self.mm_feature_transport == "cuda_ipc":
            problem = _cuda_ipc_problem(self)
            if problem:
                problems.append(f"--mm-feature-transport cuda_ipc: {problem}; use cpu (shared memory on one host)")
        problems += self._data_parallel_problems()
        if self.quantization not in (None, "", "none", "fp8"):
            problems.append(f"--quantization {self.quantization}: only fp8 (block FP8) is supported")
        if self.fp8_gemm_backend not in ("auto", "triton"):
            problems.append(f"--fp8-gemm-backend {self.fp8_gemm_backend}: only triton (auto) is built; "
                            "cutlass, deep_gemm and flashinfer need kernels this engine does not ship")
        if self.kv_cache_dtype not in ("auto", self.dtype, "fp8_e4m3", "fp8_e5m2"):
            problems.append(f"--kv-cache-dtype {self.kv_cache_dtype}: choose auto, fp8_e4m3 or fp8_e5m2")
        if self.mm_attention_backend == "triton_attn":  # upstream's name of the same backend
            object.__setattr__(self, "mm_attention_backend", "triton")
        if self.mm_attention_backend not in (None, "sdpa", "triton"):
            problems.append(f"--mm-attention-backend {self.mm_attention_backend}: choose sdpa or triton_attn "
                            "(triton is the same)")
        problems += self._scheduling_problems() + self._limit_problems()
        problems += _grammar_problems(self)
        for var in (envs.SGLANG_IMAGE_MAX_PIXELS, envs.SGLANG_RESIZE_RESAMPLE):  # read by the image processor
            try:
                var.get()
            except ValueError as e:
                problems.append(str(e))
        if self.tp_size < 1:
            problems.append("--tp-size must be >= 1")
        if self.page_size < 1:
            problems.append("--page-size must be >= 1")
        if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
            problems.append("--chunked-prefill-size must be positive or -1")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            problems.append("--max-running-requests must be >= 1")
        if self.context_length is not None and self.context_length < 2:
            problems.append("--context-length must be >= 2")
        if self.max_prefill_tokens < 1:
            problems.append("--max-prefill-tokens must be >= 1")
        if self.max_total_tokens is not None and self.max_total_tokens < 16:
            problems.append("--max-total-tokens must be >= 16")
        if self.schedule_conservativeness <= 0:
            problems.append("--schedule-conservativeness must be > 0")
        if not 0 < self.mem_fraction_static < 1:
            problems.append("--mem-fraction-static must be in (0, 1)")
        if self.limit_mm_per_prompt < 0:
            problems.append("--limit-mm-per-prompt must be >= 0")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            problems.append("--node-rank must be in [0, --nnodes)")
        elif self.tp_size % self.nnodes:
            problems.append("--tp-size must be a multiple of --nnodes")
        elif self.nnodes > 1 and not self.dist_init_addr:
            problems.append("--dist-init-addr host:port is required with --nnodes > 1")
        if problems:
            raise ValueError("; ".join(problems))

    def _data_parallel_problems(self) -> list[str]:
        problems = []
        if self.dp_size < 1:
            problems.append("--dp-size must be >= 1")
        elif self.dp_size > 1 and self.nnodes > 1:
            problems.append(f"--dp-size {self.dp_size} with --nnodes {self.nnodes}: data-parallel replicas run on "
                            "one node; run one server per node behind sglang-router (docs/deploy.md)")
        elif self.dp_size > 1 and self.dist_init_addr:
            problems.append("--dist-init-addr is for --nnodes > 1; at --dp-size > 1 every replica picks its own "
                            "loopback rendezvous")
        try:
            resolve_load_balance_method(self.load_balance_method)
        except ValueError as e:
            problems.append(str(e))
        if self.base_gpu_id < 0:
            problems.append("--base-gpu-id must be >= 0")
        return problems

    @property
    def limit_mm_video_per_prompt(self) -> int:
        """Videos per request: the `video` entry of the JSON limits, else DEFAULT_VIDEO_LIMIT."""
        if self.limit_mm_data_per_request is None:
            return DEFAULT_VIDEO_LIMIT
        limits = parse_mm_limits(self.limit_mm_data_per_request)
        return limits.get("video", DEFAULT_VIDEO_LIMIT) if isinstance(limits, dict) else DEFAULT_VIDEO_LIMIT

    def _scheduling_problems(self) -> list[str]:
        problems = []
        if self.schedule_policy in REFUSED_SCHEDULE_POLICIES:
            problems.append(f"--schedule-policy {self.schedule_policy}: {REFUSED_SCHEDULE_POLICIES[self.schedule_policy]}"
                            f"; choose one of {', '.join(SCHEDULE_POLICIES)}")
        elif self.schedule_policy not in SCHEDULE_POLICIES:
            problems.append(f"--schedule-policy {self.schedule_policy}: choose one of {', '.join(SCHEDULE_POLICIES)}")
        if self.schedule_policy == "priority":
            object.__setattr__(self, "enable_priority_scheduling", True)
        if self.priority_scheduling_preemption_threshold < 0:
            problems.append("--priority-scheduling-preemption-threshold must be >= 0")
        return problems

    def _limit_problems(self) -> list[str]:
        """--log-level and the request body limit, folded into one value each."""
        problems = []
        level = str(self.log_level).lower()
        level = LOG_LEVEL_ALIASES.get(level, level)
        if level not in LOG_LEVELS:
            problems.append(f"--log-level {self.log_level}: choose one of {', '.join(LOG_LEVELS)}")
        object.__setattr__(self, "log_level", level)
        mb, size = self.max_request_body_mb, self.max_payload_size
        if mb is not None and not mb > 0:
            problems.append("--max-request-body-mb must be > 0")
        elif size is not None and size < 1:
            problems.append("--max-payload-size must be >= 1 byte")
        elif mb is not None and size is not None and int(mb * 2**20) != size:
            problems.append(f"--max-payload-size {size} and --max-request-body-mb {mb} both set the request body "
                            "limit: give one")
        else:  # one limit, kept in both units (a copy re-validates consistent values)
            size = size if size is not None else int(mb * 2**20) if mb is not None else DEFAULT_MAX_PAYLOAD_SIZE
            object.__setattr__(self, "max_payload_size", size)
            object.__setattr__(self, "max_request_body_mb", size / 2**20)
        return problems

    # ------------------------------------------------------------------ derived
    def local_tp_ranks(self) -> range:
        """The TP ranks this node hosts: a contiguous block per node."""
        per_node = self.tp_size // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_attention_backends(self) -> tuple[str, str]:
        """(language model, vision tower) attention. On CUDA our Triton kernels unless told otherwise;
        elsewhere the pure-torch paths (Triton runs on CPU only interpreted: for tests, asked for)."""
        on_cuda = self.resolved_device() == "cuda" and _triton_importable()
        lm = self.attention_backend if self.attention_backend != "auto" else ("triton" if on_cuda else "torch_native")
        mm = self.mm_attention_backend or ("triton" if on_cuda else "sdpa")
        return lm, mm

    def resolved_model_path(self) -> str:
        """`model_path` as a local directory, or the embedded default model when none is given
        (`model_loader/default_model.py`)."""
        from sglang.srt.model_loader.default_model import resolve_model_path_or_default

        return resolve_model_path_or_default(self.model_path, self.revision)

    # ------------------------------------------------------------------ CLI
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            meta = dict(f.metadata)
            flags = ("--" + f.name.replace("_", "-"), *meta.get("aliases", ()))
            flag = flags[0]
            kwargs: dict[str, Any] = {"help": meta.get("help", ""), "dest": f.name}
            typ = hints[f.name]
            if typ is bool:
                parser.add_argument(*flags, action="store_true", default=f.default, **kwargs)
                continue
            base = _base_type(typ)
            if meta.get("parse") is not None:
                parser.add_argument(*flags, type=_named(meta["parse"], flag), default=f.default, **kwargs)
                continue
            if get_origin(base) is tuple:  # a list of words: space- or comma-separated
                parser.add_argument(*flags, nargs="+", type=str, default=f.default, **kwargs)
                continue
            kwargs["type"] = base
            kwargs["default"] = f.default
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            parser.add_argument(*flags, **kwargs)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        if getattr(args, "max_payload_size", None) is not None and getattr(args, "max_request_body_mb", None) is not None:
            raise ValueError(f"--max-payload-size {args.max_payload_size} and --max-request-body-mb "
                             f"{args.max_request_body_mb} both set the request body limit: give one")
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
        for name, value in values.items():
            if isinstance(value, list):
                values[name] = tuple(w for v in value for w in v.split(",") if w)
        return cls(**values)

    @classmethod
    def from_argv(cls, argv: list[str] | None = None, prog: str = "python -m sglang.launch_server") -> "ServerArgs":
        parser = argparse.ArgumentParser(prog=prog)
        cls.add_cli_args(parser)
        args = parser.parse_args(argv)
        try:
            return cls.from_cli_args(args)
        except ValueError as e:
            parser.error(str(e))


def _named(parse, flag: str):
    """argparse shows the callable's name in errors: make it the flag's."""

    def convert(raw: str):
        try:
            return parse(raw)
        except (ValueError, TypeError) as e:
            raise argparse.ArgumentTypeError(f"{raw!r}: {e}") from None

    convert.__name__ = flag
    return convert


def log_ignored_flags(args: "ServerArgs", device: str) -> list[str]:
    """One info line per accepted-but-inert flag, so a user sees what did not take effect."""
    lines = []
    if device != "cuda" and (args.cuda_graph_max_bs_decode or args.cuda_graph_bs_decode or args.disable_cuda_graph):
        lines.append("CUDA graphs: --cuda-graph-max-bs-decode / --cuda-graph-bs-decode / --disable-cuda-graph have no "
                     "effect on CPU")
    elif device == "cuda" and not args.disable_cuda_graph and args.resolved_attention_backends()[0] != "triton":
        lines.append("CUDA graphs for decode need --attention-backend triton: decode runs eagerly")
    if args.enable_vit_ulysses_sp and args.tp_size == 1:
        lines.append("--enable-vit-ulysses-sp: no effect at --tp-size 1 (nothing to split over)")
    for flag, on in (("--enable-multimodal", args.enable_multimodal), ("--trust-remote-code", args.trust_remote_code),
                     ("--skip-server-warmup", args.skip_server_warmup)):
        if on:
            lines.append(f"{flag}: accepted for compatibility, nothing to change here")
    import logging

    for line in lines:
        logging.getLogger(__name__).info(line)
    return lines


def _cuda_ipc_problem(args: "ServerArgs") -> str | None:
    """Why the cuda_ipc transport cannot run here, or None."""
    if args.device == "cpu":
        return "needs a CUDA device, and --device is cpu"
    if args.nnodes > 1:
        return "CUDA IPC handles reach only the GPUs of one host, and --nnodes is > 1"
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA device, and torch sees none"
    return None


def _base_type(typ):
    if get_origin(typ) is not None:
        args = [a for a in get_args(typ) if a is not type(None)]
        return args[0]
    return typ




def _triton_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec("sgl_kernel") is not None


def derive_max_running_requests(max_total_tokens: int, context_length: int) -> int:
    """Default --max-running-requests: one request per 256 KV tokens, between 64 and 1024, and no more
    rows than 512 MiB of request-to-token table (int64 per context position) holds."""
    by_kv = min(1024, max(64, max_total_tokens // 256))
    by_table = max(16, (512 << 20) // (8 * max(1, context_length)))
    return max(1, min(by_kv, by_table))
