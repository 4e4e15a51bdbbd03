"""The checks `ServerArgs` runs when it is built: each returns one line per problem naming the flag, and the
aliases and folded values are written back on the frozen dataclass (`object.__setattr__`), so every process
reads one spelling. `log_ignored_flags` names the accepted flags that have no effect."""

from __future__ import annotations

import json

from sglang.srt.configs.startup_checks import startup_problems
from sglang.srt.environ import envs
from sglang.srt.server_args_values import (
    DEFAULT_ENCODER_MAX_PAYLOAD_SIZE,
    DEFAULT_MAX_PAYLOAD_SIZE,
    DTYPE_ALIASES,
    GRAMMAR_BACKENDS,
    LOG_LEVEL_ALIASES,
    LOG_LEVELS,
    REASONING_PARSER_CHOICES,
    REFUSED_SCHEDULE_POLICIES,
    SCHEDULE_POLICIES,
    TOOL_CALL_PARSER_CHOICES,
    parse_image_limit,
    parse_mm_limits,
    resolve_load_balance_method,
)


def check_and_normalize(args) -> list[str]:
    """What is wrong with `args`, one line per flag (empty: nothing); on the way, values given in another
    spelling (aliases, JSON limits, units) are folded into the one the engine reads, in place on the frozen
    dataclass."""
    problems = []
    object.__setattr__(args, "dtype", DTYPE_ALIASES.get(args.dtype, args.dtype))
    if isinstance(args.limit_mm_per_prompt, (dict, str)):  # vLLM's JSON form carries both limits
        try:
            limits = parse_mm_limits(args.limit_mm_per_prompt)
        except ValueError as e:
            problems.append(f"--limit-mm-per-prompt: {e}")
            limits = 0
        if isinstance(limits, dict) and args.limit_mm_data_per_request is None:
            object.__setattr__(args, "limit_mm_data_per_request", json.dumps(limits))
        object.__setattr__(args, "limit_mm_per_prompt", limits if isinstance(limits, int) else limits.get("image", 0))
    if args.limit_mm_data_per_request is not None:
        try:
            object.__setattr__(args, "limit_mm_per_prompt", parse_image_limit(args.limit_mm_data_per_request))
        except ValueError as e:
            problems.append(f"--limit-mm-data-per-request: {e}")
    if args.cuda_graph_bs_decode is not None:
        try:
            object.__setattr__(args, "cuda_graph_bs_decode", tuple(int(b) for b in args.cuda_graph_bs_decode))
        except ValueError:
            problems.append(f"--cuda-graph-bs-decode takes integers, got {list(args.cuda_graph_bs_decode)}")
    if args.mm_feature_transport == "shm":  # this engine's earlier name for the same behaviour
        object.__setattr__(args, "mm_feature_transport", "cpu")
    if args.mm_feature_transport == "cuda_ipc":
        problem = _cuda_ipc_problem(args)
        if problem:
            problems.append(f"--mm-feature-transport cuda_ipc: {problem}; use cpu (shared memory on one host)")
    problems += _data_parallel_problems(args)
    problems += _encoder_disaggregation_problems(args)
    problems += _mm_worker_problems(args)
    if args.mm_enable_dp_encoder and args.enable_vit_ulysses_sp:
        problems.append("--mm-enable-dp-encoder with --enable-vit-ulysses-sp: both replicate the vision tower and "
                        "split its work over the ranks (whole images vs. patches); choose one")
    if args.quantization not in (None, "", "none", "fp8"):
        problems.append(f"--quantization {args.quantization}: only fp8 (block FP8) is supported")
    if args.fp8_gemm_backend not in ("auto", "triton"):
        problems.append(f"--fp8-gemm-backend {args.fp8_gemm_backend}: only triton (auto) is built; "
                        "cutlass, deep_gemm and flashinfer need kernels this engine does not ship")
    if args.kv_cache_dtype not in ("auto", args.dtype, "fp8_e4m3", "fp8_e5m2"):
        problems.append(f"--kv-cache-dtype {args.kv_cache_dtype}: choose auto, fp8_e4m3 or fp8_e5m2")
    if args.mm_attention_backend == "triton_attn":  # upstream's name of the same backend
        object.__setattr__(args, "mm_attention_backend", "triton")
    if args.mm_attention_backend not in (None, "sdpa", "triton"):
        problems.append(f"--mm-attention-backend {args.mm_attention_backend}: choose sdpa or triton_attn "
                        "(triton is the same)")
    problems += _scheduling_problems(args) + _limit_problems(args)
    problems += _grammar_problems(args)
    for var in (envs.SGLANG_IMAGE_MAX_PIXELS, envs.SGLANG_RESIZE_RESAMPLE):  # read by the image processor
        try:
            var.get()
        except ValueError as e:
            problems.append(str(e))
    if args.tp_size < 1:
        problems.append("--tp-size must be >= 1")
    else:
        problems += _expert_parallel_problems(args)
    if args.page_size < 1:
        problems.append("--page-size must be >= 1")
    if args.max_mamba_cache_size is not None and args.max_mamba_cache_size < 0:
        problems.append("--max-mamba-cache-size must be >= 0")
    if args.mamba_track_interval < 0:
        problems.append("--mamba-track-interval must be >= 0")
    if args.chunked_prefill_size == 0 or args.chunked_prefill_size < -1:
        problems.append("--chunked-prefill-size must be positive or -1")
    if args.max_running_requests is not None and args.max_running_requests < 1:
        problems.append("--max-running-requests must be >= 1")
    if args.context_length is not None and args.context_length < 2:
        problems.append("--context-length must be >= 2")
    if args.max_prefill_tokens < 1:
        problems.append("--max-prefill-tokens must be >= 1")
    if args.max_total_tokens is not None and args.max_total_tokens < 16:
        problems.append("--max-total-tokens must be >= 16")
    if not 0 < args.weight_update_drain_timeout < float("inf"):  # NaN fails too
        problems.append("--weight-update-drain-timeout must be a finite number of seconds > 0")
    if args.schedule_conservativeness <= 0:
        problems.append("--schedule-conservativeness must be > 0")
    if not 0 < args.mem_fraction_static < 1:
        problems.append("--mem-fraction-static must be in (0, 1)")
    if args.limit_mm_per_prompt < 0:
        problems.append("--limit-mm-per-prompt must be >= 0")
    if args.mm_processor_worker_num is not None and not 0 <= args.mm_processor_worker_num <= 64:
        problems.append("--mm-processor-worker-num must be in [0, 64]")
    if args.mm_io_worker_num is not None and not 1 <= args.mm_io_worker_num <= 256:
        problems.append("--mm-io-worker-num must be in [1, 256]")
    if args.mm_max_in_flight_per_request is not None and not 0 <= args.mm_max_in_flight_per_request <= 4096:
        problems.append("--mm-max-in-flight-per-request must be in [0, 4096] (0: no bound)")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        problems.append("--node-rank must be in [0, --nnodes)")
    elif args.tp_size % args.nnodes:
        problems.append("--tp-size must be a multiple of --nnodes")
    elif args.nnodes > 1 and not args.dist_init_addr:
        problems.append("--dist-init-addr host:port is required with --nnodes > 1")
    # what the model directory and the scale file make impossible, before any process starts (one line each)
    problems += startup_problems(args.model_path, args.kv_cache_dtype, args.quantization_param_path, args.tp_size)
    return problems


def _mm_worker_problems(args) -> list[str]:
    """Preprocessing workers hand the pixels over in shared memory: where that transport is off, asking for
    workers is refused (unset, the default resolves to none there)."""
    n = args.mm_processor_worker_num
    if not n:
        return []
    why = ("--language-only sends the images to the encoders" if args.language_only
           else "--mm-feature-transport cuda_ipc puts them in the GPU pool" if args.mm_feature_transport != "cpu"
           else "SGLANG_MM_SHM_TRANSPORT=0 sends them inline" if not envs.SGLANG_MM_SHM_TRANSPORT.get()
           else f"--nnodes {args.nnodes} sends them inline" if args.nnodes > 1 else None)
    if why is None:
        return []
    return [f"--mm-processor-worker-num {n}: the workers hand pixels over in shared memory and {why}; "
            "use --mm-processor-worker-num 0"]


def _expert_parallel_problems(args) -> list[str]:
    """--ep-size splits the experts inside the TP ranks (upstream's semantics): ep | tp, and, read from a local
    config.json, a MoE model whose expert count ep divides and whose expert width tp/ep divides."""
    import os

    ep, tp = args.ep_size, args.tp_size
    if ep < 1:
        return ["--ep-size must be >= 1"]
    if tp % ep:
        return [f"--ep-size {ep} must divide --tp-size {tp}: the experts are split over the TP ranks (ep groups "
                f"of tp/ep ranks each), as upstream does"]
    path = os.path.join(str(args.model_path or ""), "config.json")
    if ep == 1 or not os.path.isfile(path):
        return []
    with open(path) as f:
        raw = json.load(f)
    text = raw.get("text_config", raw)
    experts = text.get("num_experts") or text.get("num_local_experts") or 0
    if not experts:
        return [f"--ep-size {ep}: {args.model_path} is not a mixture-of-experts model (no num_experts); "
                "drop --ep-size"]
    if experts % ep:
        return [f"--ep-size {ep}: the model's {experts} experts do not split into {ep} equal groups"]
    inter = text.get("moe_intermediate_size", 0)
    if inter % (tp // ep):
        return [f"--ep-size {ep} --tp-size {tp}: each expert's moe_intermediate_size {inter} is sharded over "
                f"tp/ep = {tp // ep} ranks and does not divide"]
    return []


def _data_parallel_problems(args) -> list[str]:
    problems = []
    if args.dp_size < 1:
        problems.append("--dp-size must be >= 1")
    elif args.dp_size > 1 and args.nnodes > 1:
        problems.append(f"--dp-size {args.dp_size} with --nnodes {args.nnodes}: data-parallel replicas run on "
                        "one node; run one server per node behind sglang-router (docs/deploy.md)")
    elif args.dp_size > 1 and args.dist_init_addr:
        problems.append("--dist-init-addr is for --nnodes > 1; at --dp-size > 1 every replica picks its own "
                        "loopback rendezvous")
    try:
        resolve_load_balance_method(args.load_balance_method)
    except ValueError as e:
        problems.append(str(e))
    if args.base_gpu_id < 0:
        problems.append("--base-gpu-id must be >= 0")
    return problems


def _encoder_disaggregation_problems(args) -> list[str]:
    """EPD (--encoder-only / --language-only --encoder-urls): the combinations that cannot work, one line each."""
    object.__setattr__(args, "encoder_urls", tuple(args.encoder_urls or ()))
    if args.encoder_only and args.language_only:
        return ["--encoder-only with --language-only: a server is either the vision encoder or the language "
                "model; start one of each"]
    problems = []
    if args.encoder_transfer_backend == "mooncake":
        problems.append("--encoder-transfer-backend mooncake: the Mooncake transfer engine is not built into this "
                        "engine; use zmq_to_scheduler (default) or zmq_to_tokenizer")
    elif args.encoder_transfer_backend not in ("zmq_to_scheduler", "zmq_to_tokenizer"):
        problems.append(f"--encoder-transfer-backend {args.encoder_transfer_backend}: choose zmq_to_scheduler or "
                        "zmq_to_tokenizer")
    if args.language_only and not args.encoder_urls:
        problems.append("--language-only needs --encoder-urls: the servers that encode its images and videos "
                        "(started with --encoder-only)")
    if args.encoder_urls and not args.language_only:
        problems.append("--encoder-urls is for --language-only servers (a server with its own vision tower "
                        "encodes its images itself)")
    bad = [u for u in args.encoder_urls if not str(u).startswith(("http://", "https://"))]
    if bad:
        problems.append(f"--encoder-urls {' '.join(bad)}: each must be an http(s)://host:port URL")
    if args.encoder_only:
        if args.tp_size != 1 or args.dp_size != 1 or args.nnodes != 1:
            problems.append("--encoder-only runs one vision tower per process: --tp-size, --dp-size and --nnodes "
                            "must be 1 (start more encoders and list them all in --encoder-urls)")
        if args.mm_feature_transport == "cuda_ipc":
            problems.append("--encoder-only with --mm-feature-transport cuda_ipc: the encoder receives its items "
                            "over HTTP; drop the flag")
    if args.language_only and (args.mm_enable_dp_encoder or args.enable_vit_ulysses_sp):
        problems.append("--language-only loads no vision tower: --mm-enable-dp-encoder and --enable-vit-ulysses-sp "
                        "belong on the encoders")
    return problems


def _scheduling_problems(args) -> list[str]:
    problems = []
    if args.schedule_policy in REFUSED_SCHEDULE_POLICIES:
        problems.append(f"--schedule-policy {args.schedule_policy}: {REFUSED_SCHEDULE_POLICIES[args.schedule_policy]}"
                        f"; choose one of {', '.join(SCHEDULE_POLICIES)}")
    elif args.schedule_policy not in SCHEDULE_POLICIES:
        problems.append(f"--schedule-policy {args.schedule_policy}: choose one of {', '.join(SCHEDULE_POLICIES)}")
    if args.schedule_policy == "priority":
        object.__setattr__(args, "enable_priority_scheduling", True)
    if args.max_queued_requests is not None and args.max_queued_requests < 1:
        problems.append("--max-queued-requests must be >= 1")
    if args.priority_scheduling_preemption_threshold < 0:
        problems.append("--priority-scheduling-preemption-threshold must be >= 0")
    return problems

def _limit_problems(args) -> list[str]:
    """--log-level and the request body limit, folded into one value each."""
    problems = []
    level = str(args.log_level).lower()
    level = LOG_LEVEL_ALIASES.get(level, level)
    if level not in LOG_LEVELS:
        problems.append(f"--log-level {args.log_level}: choose one of {', '.join(LOG_LEVELS)}")
    object.__setattr__(args, "log_level", level)
    mb, size = args.max_request_body_mb, args.max_payload_size
    if mb is not None and not mb > 0:
        problems.append("--max-request-body-mb must be > 0")
    elif size is not None and size < 1:
        problems.append("--max-payload-size must be >= 1 byte")
    elif mb is not None and size is not None and int(mb * 2**20) != size:
        problems.append(f"--max-payload-size {size} and --max-request-body-mb {mb} both set the request body "
                        "limit: give one")
    else:  # one limit, kept in both units (a copy re-validates consistent values)
        default = DEFAULT_ENCODER_MAX_PAYLOAD_SIZE if getattr(args, "encoder_only", False) else DEFAULT_MAX_PAYLOAD_SIZE
        size = size if size is not None else int(mb * 2**20) if mb is not None else default
        object.__setattr__(args, "max_payload_size", size)
        object.__setattr__(args, "max_request_body_mb", size / 2**20)
    return problems


def _grammar_problems(args) -> list[str]:
    problems = []
    if args.grammar_backend not in GRAMMAR_BACKENDS:
        problems.append(f"--grammar-backend {args.grammar_backend}: choose xgrammar, llguidance or none (upstream's "
                        "outlines backend is not available here)")
    cnt = args.constrained_json_max_whitespace_cnt
    if cnt is not None and cnt < 1:
        problems.append("--constrained-json-max-whitespace-cnt must be >= 1")
    if args.tool_call_parser not in (None, *TOOL_CALL_PARSER_CHOICES):
        problems.append(f"--tool-call-parser {args.tool_call_parser}: choose one of {', '.join(TOOL_CALL_PARSER_CHOICES)}")
    if args.reasoning_parser not in (None, *REASONING_PARSER_CHOICES):
        problems.append(f"--reasoning-parser {args.reasoning_parser}: choose one of {', '.join(REASONING_PARSER_CHOICES)}")
    return problems


def _cuda_ipc_problem(args) -> str | None:
    """Why the cuda_ipc transport cannot run here, or None."""
    if args.device == "cpu":
        return "needs a CUDA device, and --device is cpu"
    if args.nnodes > 1:
        return "CUDA IPC handles reach only the GPUs of one host, and --nnodes is > 1"
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA device, and torch sees none"
    return None


def log_ignored_flags(args, device: str) -> list[str]:
    """One info line per accepted-but-inert flag, so a user sees what did not take effect."""
    lines = []
    if device != "cuda" and (args.cuda_graph_max_bs_decode or args.cuda_graph_bs_decode or args.disable_cuda_graph):
        lines.append("CUDA graphs: --cuda-graph-max-bs-decode / --cuda-graph-bs-decode / --disable-cuda-graph have no "
                     "effect on CPU")
    elif device == "cuda" and not args.disable_cuda_graph and args.resolved_attention_backends()[0] != "triton":
        lines.append("CUDA graphs for decode need --attention-backend triton: decode runs eagerly")
    if args.enable_vit_ulysses_sp and args.tp_size == 1:
        lines.append("--enable-vit-ulysses-sp: no effect at --tp-size 1 (nothing to split over)")
    if args.mm_enable_dp_encoder and args.tp_size == 1:
        lines.append("--mm-enable-dp-encoder: no effect at --tp-size 1 (nothing to split over)")
    for flag, on in (("--enable-multimodal", args.enable_multimodal), ("--trust-remote-code", args.trust_remote_code),
                     ("--skip-server-warmup", args.skip_server_warmup)):
        if on:
            lines.append(f"{flag}: accepted for compatibility, nothing to change here")
    import logging

    for line in lines:
        logging.getLogger(__name__).info(line)
    return lines
