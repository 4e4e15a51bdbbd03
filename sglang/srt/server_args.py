"""All server arguments: one frozen dataclass; the argparse CLI is generated from its fields."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin, get_type_hints

from sglang.srt.configs.attention_defaults import default_attention_backends
from sglang.srt.port_args import PortArgs  # noqa: F401  (upstream's import path)
from sglang.srt.server_args_checks import check_and_normalize
from sglang.srt.server_args_values import (
    DEFAULT_VIDEO_LIMIT,
    DTYPE_ALIASES,
    LOAD_BALANCE_METHODS,
    REASONING_PARSER_CHOICES,
    REFUSED_LOAD_BALANCE_METHODS,
    REFUSED_SCHEDULE_POLICIES,
    SCHEDULE_POLICIES,
    TOOL_CALL_PARSER_CHOICES,
    _arg,
    parse_mm_limits,
    parse_token_count,
)


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
    ep_size: int = field(default=1, metadata=_arg(
        "expert parallelism inside the --tp-size ranks (MoE models): the experts split into ep_size groups, each "
        "held by tp_size/ep_size ranks that shard its experts' intermediate dim; must divide --tp-size and the "
        "expert count; partial outputs combined by the TP all-reduce", aliases=("--expert-parallel-size", "--ep")))
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
    max_mamba_cache_size: int | None = field(default=None, metadata=_arg(
        "hybrid models (Qwen3.5): recurrent-state snapshots the prefix cache may keep, beside one state per "
        "running request (default: as many as request rows)"))
    mamba_track_interval: int = field(default=256, metadata=_arg(
        "hybrid models: the prefix cache snapshots a prompt's recurrent state every this many tokens (also at "
        "the end of each image and video item and of each request); 0: only those"))
    disable_overlap_schedule: bool = field(default=False, metadata=_arg(
        "run the scheduler step by step: without this, the next decode step is built and launched while the "
        "current one runs, its input tokens taken from the current step's samples on the device (outputs are "
        "the same either way)"))
    schedule_policy: str = field(default="fcfs", metadata=_arg(
        "order of waiting requests: fcfs (arrival), lpm (longest cached prefix first), dfs-weight (depth-first over "
        "the prefix tree, heaviest subtrees first), lof (largest max_new_tokens first), random, priority (each "
        "request's priority, then arrival: implies --enable-priority-scheduling)",
        choices=(*SCHEDULE_POLICIES, *REFUSED_SCHEDULE_POLICIES)))
    enable_priority_scheduling: bool = field(default=False, metadata=_arg(
        "order waiting requests by their `priority` (higher first) before the --schedule-policy order, and let a "
        "request that cannot be admitted preempt running ones of lower priority; without it a request that "
        "gives a priority gets 400"))
    max_queued_requests: int | None = field(default=None, metadata=_arg(
        "most requests a scheduler holds waiting (compiling grammars included); one more is a 503 'The request "
        "queue is full.', or with priority scheduling displaces a queued request of lower priority"))
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
    mm_processor_worker_num: int | None = field(default=None, metadata=_arg(
        "image preprocessing worker processes (sglang-mmproc{k}, each with its own processor and tokenizer): each "
        "encoded image is fetched, decoded, preprocessed, hashed and written to shared memory there, outside the "
        "tokenizer manager's process; 0: in that process's threads (the baseline); unset: the default for this "
        "machine's CPU count, logged at start-up (docs/optimizations/mm-frontend.md); needs the shared-memory "
        "transport (--mm-feature-transport cpu on one host)"))
    mm_io_worker_num: int | None = field(default=None, metadata=_arg(
        "threads that fetch and decode images: in each preprocessing worker (default 4), or, with "
        "--mm-processor-worker-num 0, the tokenizer manager's media pool (default min(32, CPUs + 4))"))
    mm_max_in_flight_per_request: int | None = field(default=None, metadata=_arg(
        "most images (and videos) of one request fetched, decoded and preprocessed at a time: a request with many "
        "images is processed in windows of this many, so its transient memory is bounded and other requests' "
        "images interleave with it in the shared pool; unset: half the preprocessing slots (worker processes x "
        "--mm-io-worker-num, else the media pool's threads), at least 2; 0: no bound (every image at once)"))
    max_payload_size: int | None = field(default=None, metadata=_arg(
        "largest HTTP request body accepted, in bytes (suffixes as for token counts: 64Mi); larger bodies get 413 "
        "(default 64 MiB; 1 GiB on an --encoder-only server, whose /encode bodies carry pixels)", parse=parse_token_count))
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
    stream_output: bool = field(default=False, metadata=_arg(
        "streamed /generate chunks carry only what is new since the last chunk (text and output_ids deltas) "
        "instead of the whole output so far"))
    skip_tokenizer_init: bool = field(default=False, metadata=_arg(
        "token ids in, token ids out: /generate takes input_ids only and answers output_ids with no text (nothing "
        "is tokenized or detokenized per request); text prompts, chat, stop strings, grammars and token texts "
        "are refused with a 400 naming this flag"))
    enable_custom_logit_processor: bool = field(default=False, metadata=_arg(
        "accept requests' custom_logit_processor (upstream's field: a Python class pickled by the client with "
        "dill, run on that request's logits before sampling). This runs code sent by the client inside the "
        "server: enable it only where every client is trusted (docs/reliability.md). Off: such a request is a 400"))
    weight_version: str = field(default="default", metadata=_arg(
        "the version name of the weights served, reported in meta_info and /get_model_info; "
        "/update_weights_from_disk may set a new one"))
    weight_update_drain_timeout: float = field(default=30.0, metadata=_arg(
        "seconds /update_weights_from_disk waits for the requests in flight to end (a request ends when the "
        "scheduler finishes it, read by its client or not); past it the update answers 409 naming how many still "
        "run and loads nothing, or, when the update asks abort_all_requests or abort_on_drain_timeout, aborts them "
        "and goes on. New requests wait meanwhile: at most this long (twice when aborting) plus the load itself"))
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
    mm_enable_dp_encoder: bool = field(default=False, metadata=_arg(
        "data-parallel vision encoder at --tp-size > 1: whole vision weights on every rank, each encode call's "
        "images (and videos) split over the ranks balanced by patch count, the embeddings all-gathered back "
        "(no collective inside the tower; not with --enable-vit-ulysses-sp; no effect at --tp-size 1)"))
    encoder_only: bool = field(default=False, metadata=_arg(
        "encoder disaggregation (EPD): serve only the vision tower (no text decoder, no KV cache): /health and "
        "/encode for language servers started with --language-only --encoder-urls (docs/optimizations/epd.md)"))
    language_only: bool = field(default=False, metadata=_arg(
        "encoder disaggregation (EPD): load no vision weights; images and videos are encoded by the servers of "
        "--encoder-urls (least outstanding work first, another one on failure, 503 when none answers)"))
    encoder_urls: tuple[str, ...] | None = field(default=None, metadata=_arg(
        "with --language-only: the encoder servers' base URLs (http://host:port), space- or comma-separated"))
    encoder_transfer_backend: str = field(default="zmq_to_scheduler", metadata=_arg(
        "with --language-only, where encoders send the embeddings: zmq_to_scheduler (to scheduler rank 0, or the "
        "data-parallel controller, which the TP broadcast / replica routing carries on) or zmq_to_tokenizer "
        "(to the tokenizer manager, which sends them with the request); mooncake is refused",
        choices=("zmq_to_scheduler", "zmq_to_tokenizer", "mooncake")))
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
    load_format: str = field(default="auto", metadata=_arg(
        "auto / safetensors: read the checkpoint; dummy: random weights made on the device from config.json alone, "
        "seeded by --random-seed (outputs are meaningless: for measuring full-size models without their files)",
        choices=("auto", "safetensors", "dummy")))
    grammar_backend: str = field(default="xgrammar", metadata=_arg(
        "constrained output (json_schema, regex, ebnf, response_format, structural_tag): xgrammar, llguidance, or "
        "none to refuse constraints with a 400 (upstream's outlines is not available)"))
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
        choices=REASONING_PARSER_CHOICES))

    def __post_init__(self):
        problems = check_and_normalize(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def limit_mm_video_per_prompt(self) -> int:
        """Videos per request: the `video` entry of the JSON limits, else DEFAULT_VIDEO_LIMIT."""
        if self.limit_mm_data_per_request is None:
            return DEFAULT_VIDEO_LIMIT
        limits = parse_mm_limits(self.limit_mm_data_per_request)
        return limits.get("video", DEFAULT_VIDEO_LIMIT) if isinstance(limits, dict) else DEFAULT_VIDEO_LIMIT

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
        lm_auto, mm_auto = default_attention_backends(self.resolved_device())
        lm = self.attention_backend if self.attention_backend != "auto" else lm_auto
        return lm, self.mm_attention_backend or mm_auto

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


def _base_type(typ):
    if get_origin(typ) is not None:
        args = [a for a in get_args(typ) if a is not type(None)]
        return args[0]
    return typ




def derive_max_running_requests(max_total_tokens: int, context_length: int) -> int:
    """Default --max-running-requests: one request per 256 KV tokens, between 64 and 1024, and no more
    rows than 512 MiB of request-to-token table (int64 per context position) holds."""
    by_kv = min(1024, max(64, max_total_tokens // 256))
    by_table = max(16, (512 << 20) // (8 * max(1, context_length)))
    return max(1, min(by_kv, by_table))
