"""Upstream launch flags: accepted with upstream's names and meanings; values the engine cannot honour
stop start-up with one line naming the flag; size suffixes, dtype aliases and the JSON image limits."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from sglang.srt.server_args import ServerArgs
from sglang.srt.server_args_checks import log_ignored_flags
from sglang.srt.server_args_values import parse_image_limit, parse_token_count


def test_upstream_launch_command_parses():
    a = ServerArgs.from_argv(["--model-path", "/m", "--tp-size", "4", "--enable-multimodal", "--trust-remote-code",
                              "--skip-server-warmup", "--cuda-graph-max-bs", "32", "--disable-cuda-graph",
                              "--mm-attention-backend", "sdpa", "--dp-size", "1", "--kv-cache-dtype", "auto",
                              "--api-key", "k", "--chat-template", "/t.jinja"])
    assert a.tp_size == 4 and a.enable_multimodal and a.trust_remote_code and a.cuda_graph_max_bs_decode == 32
    assert a.api_key == "k" and a.chat_template == "/t.jinja" and a.mm_attention_backend == "sdpa"


TOKEN_COUNTS = [  # upstream's grammar: SI k M G T, IEC Ki Mi Gi Ti, case-sensitive, decimals with SI only
    ("4096", 4096), ("-1", -1), (" 512 ", 512), ("128k", 128_000), ("1M", 1_000_000), ("2G", 2 * 10**9),
    ("1T", 10**12), ("128Ki", 131_072), ("1Mi", 1_048_576), ("1Gi", 2**30), ("1Ti", 2**40), ("1.5k", 1500),
    ("25.6k", 25_600), ("0.5M", 500_000),
]
BAD_TOKEN_COUNTS = [
    ("1m", "did you mean 'M'"), ("1KI", "did you mean 'Ki'"), ("1mi", "did you mean 'Mi'"), ("128K", "write k"),
    ("1.5Ki", "decimals go with k M G T only"), ("1.2345k", "1234.5, not a whole number"), ("12x", "'x' is not"),
    ("k", "not a count"), ("", "not a count"), ("1.5", "not a count"), ("-1k", "not a count"), ("1 k", "not a count"),
]


@pytest.mark.parametrize("raw, value", TOKEN_COUNTS)
def test_token_counts_take_upstreams_suffixes(raw, value):
    assert parse_token_count(raw) == value


@pytest.mark.parametrize("raw, phrase", BAD_TOKEN_COUNTS)
def test_token_counts_refuse_other_suffixes_naming_the_intent(raw, phrase):
    with pytest.raises(ValueError, match=re.escape(phrase)):
        parse_token_count(raw)


@pytest.mark.parametrize("flag, field", [("--context-length", "context_length"), ("--max-total-tokens", "max_total_tokens"),
                                         ("--chunked-prefill-size", "chunked_prefill_size"),
                                         ("--max-prefill-tokens", "max_prefill_tokens")])
def test_every_token_count_flag_uses_the_one_parser(flag, field, capsys):
    assert getattr(ServerArgs.from_argv([flag, "16k"]), field) == 16_000
    assert getattr(ServerArgs.from_argv([flag, "32Ki"]), field) == 32_768
    with pytest.raises(SystemExit):
        ServerArgs.from_argv([flag, "1m"])
    err = capsys.readouterr().err
    assert f"argument {flag}: '1m': not a count" in err and "did you mean 'M'" in err


@pytest.mark.parametrize("argv, field, value", [
    (["--tensor-parallel-size", "2"], "tp_size", 2), (["--data-parallel-size", "1"], "dp_size", 1),
    (["--nccl-init-addr", "10.0.0.1:5000"], "dist_init_addr", "10.0.0.1:5000"), (["--model", "/m"], "model_path", "/m"),
    (["--cuda-graph-max-bs-decode", "8"], "cuda_graph_max_bs_decode", 8),
    (["--cuda-graph-max-bs", "8"], "cuda_graph_max_bs_decode", 8),
    (["--cuda-graph-bs-decode", "1", "2", "4"], "cuda_graph_bs_decode", (1, 2, 4)),
    (["--cuda-graph-bs", "1,2,4"], "cuda_graph_bs_decode", (1, 2, 4)),
    (["--mm-attention-backend", "triton_attn"], "mm_attention_backend", "triton"),
    (["--mm-attention-backend", "triton"], "mm_attention_backend", "triton"),
    (["--log-level", "critical"], "log_level", "critical"), (["--log-level", "WARNING"], "log_level", "warning"),
    (["--log-level", "warn"], "log_level", "warning"), (["--log-level", "FATAL"], "log_level", "critical"),
    (["--max-payload-size", "1048576"], "max_payload_size", 2**20), (["--max-payload-size", "8Mi"], "max_payload_size", 2**23),
    (["--max-request-body-mb", "2"], "max_payload_size", 2 * 2**20), ([], "max_payload_size", 64 * 2**20),
])
def test_upstream_spellings_reach_one_internal_value(argv, field, value):
    assert getattr(ServerArgs.from_argv(argv), field) == value


def test_one_request_body_limit_in_either_unit():
    assert ServerArgs(max_payload_size=2**20, max_request_body_mb=1.0).max_payload_size == 2**20  # consistent: one
    with pytest.raises(ValueError, match="both set the request body limit: give one"):
        ServerArgs(max_payload_size=100, max_request_body_mb=1)


def test_the_normalised_values_survive_a_copy():
    """Engine re-validates a dataclasses.replace copy: folded values must not clash the second time."""
    import dataclasses

    a = ServerArgs.from_argv(["--max-request-body-mb", "2", "--mm-attention-backend", "triton_attn",
                              "--schedule-policy", "priority"])
    b = dataclasses.replace(a, model_path="/x")
    assert (b.max_payload_size, b.mm_attention_backend, b.enable_priority_scheduling) == (2 * 2**20, "triton", True)


def test_dtype_aliases_and_image_limit_forms():
    assert ServerArgs.from_argv(["--dtype", "half"]).dtype == "float16"
    assert ServerArgs.from_argv(["--dtype", "float"]).dtype == "float32"
    assert ServerArgs.from_argv(["--limit-mm-per-prompt", '{"image": 7}']).limit_mm_per_prompt == 7
    assert ServerArgs.from_argv(["--limit-mm-data-per-request", json.dumps({"image": 3})]).limit_mm_per_prompt == 3
    assert parse_image_limit("5") == 5 and parse_image_limit('{"image": 2, "video": 0}') == 2
    with pytest.raises(ValueError, match="audio"):
        parse_image_limit('{"image": 2, "audio": 1}')


def test_video_limit_forms():
    """Both JSON forms carry a video limit (vLLM's --limit-mm-per-prompt, upstream's
    --limit-mm-data-per-request, which wins); unnamed, videos get DEFAULT_VIDEO_LIMIT."""
    from sglang.srt.server_args_values import DEFAULT_VIDEO_LIMIT

    a = ServerArgs.from_argv(["--limit-mm-per-prompt", '{"image": 2, "video": 1}'])
    assert (a.limit_mm_per_prompt, a.limit_mm_video_per_prompt) == (2, 1)
    b = ServerArgs.from_argv(["--limit-mm-per-prompt", '{"video": 3}', "--limit-mm-data-per-request", '{"image": 4, "video": 0}'])
    assert (b.limit_mm_per_prompt, b.limit_mm_video_per_prompt) == (4, 0)
    c = ServerArgs.from_argv(["--limit-mm-per-prompt", "6"])
    assert (c.limit_mm_per_prompt, c.limit_mm_video_per_prompt) == (6, DEFAULT_VIDEO_LIMIT)
    assert ServerArgs(limit_mm_per_prompt={"image": 1, "video": 2}).limit_mm_video_per_prompt == 2
    with pytest.raises(ValueError, match="video limit"):
        ServerArgs(limit_mm_data_per_request='{"video": -1}')


@pytest.mark.parametrize("argv, phrase", [
    (["--dp-size", "2", "--nnodes", "2", "--tp-size", "2", "--dist-init-addr", "127.0.0.1:5000"],
     "--dp-size 2 with --nnodes 2: data-parallel replicas run on one node"),
    (["--dp-size", "2", "--dist-init-addr", "127.0.0.1:5000"], "--dist-init-addr is for --nnodes > 1"),
    (["--dp-size", "0"], "--dp-size must be >= 1"),
    (["--load-balance-method", "follow_bootstrap_room"], "--load-balance-method follow_bootstrap_room: it follows"),
    (["--quantization", "awq"], "--quantization awq: only fp8 (block FP8) is supported"),
    (["--kv-cache-dtype", "int8"], "--kv-cache-dtype int8: choose auto, fp8_e4m3 or fp8_e5m2"),
    (["--fp8-gemm-backend", "cutlass"], "--fp8-gemm-backend cutlass: only triton (auto) is built"),
    (["--mm-attention-backend", "fa3"], "--mm-attention-backend fa3: choose sdpa or triton_attn"),
    (["--cuda-graph-bs", "1", "x"], "--cuda-graph-bs-decode takes integers"),
    (["--log-level", "verbose"], "--log-level verbose: choose one of debug, info, warning, error, critical"),
    (["--max-payload-size", "100", "--max-request-body-mb", "1"], "both set the request body limit: give one"),
    (["--max-payload-size", "0"], "--max-payload-size must be >= 1 byte"),
    (["--max-request-body-mb", "0"], "--max-request-body-mb must be > 0"),
    (["--schedule-policy", "routing-key"], "--schedule-policy routing-key: it orders requests by the routing key"),
    (["--schedule-policy", "hrrn"], "--schedule-policy hrrn: highest-response-ratio-next is not implemented"),
    (["--schedule-policy", "shortest-prefill-first"], "--schedule-policy shortest-prefill-first: upstream's"),
    (["--context-length", "1"], "--context-length must be >= 2"),
    (["--tp-size", "4", "--ep-size", "3"], "--ep-size 3 must divide --tp-size 4"),
    (["--ep", "2"], "--ep-size 2 must divide --tp-size 1"),
    (["--tp-size", "2", "--expert-parallel-size", "0"], "--ep-size must be >= 1"),
])
def test_unsupported_values_stop_with_one_clear_line(argv, phrase, capsys):
    with pytest.raises(SystemExit) as e:
        ServerArgs.from_argv(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert phrase in err and "unrecognized" not in err


def test_inert_flags_are_reported_once_each():
    a = ServerArgs.from_argv(["--cuda-graph-max-bs", "8", "--enable-multimodal"])
    lines = log_ignored_flags(a, "cpu")
    assert any("no effect on CPU" in x for x in lines) and any("--enable-multimodal" in x for x in lines)
    assert log_ignored_flags(ServerArgs(), "cpu") == []


def test_hub_id_not_in_cache_names_id_and_cache(tmp_path, monkeypatch):
    from sglang.srt.model_loader.model_path import ModelPathError, resolve_model_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelPathError, match="Qwen/Not-A-Real-Model.*local Hugging Face cache"):
        resolve_model_path("Qwen/Not-A-Real-Model")
    with pytest.raises(ModelPathError, match="not a directory"):
        resolve_model_path(str(tmp_path / "missing" / "dir" / "x"))
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


def test_api_key_guards_every_route_but_health_and_metrics():
    from sglang.srt.entrypoints.auth import ApiKeyAuth

    class Resp:
        def __init__(self, msg):
            self.msg = msg

        async def __call__(self, scope, receive, send):
            await send({"type": "http.response.start", "status": 401})

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200})

    def status(path, auth=None):
        sent = []

        async def send(m):
            sent.append(m)

        headers = [(b"authorization", auth.encode())] if auth else []
        asyncio.run(ApiKeyAuth(app, "sekret", Resp)({"type": "http", "path": path, "headers": headers}, None, send))
        return sent[0]["status"]

    assert status("/health") == 200 and status("/metrics") == 200
    assert status("/v1/chat/completions") == 401 and status("/generate", "Bearer wrong") == 401
    assert status("/generate", "Bearer sekret") == 200 and status("/get_server_info", "Bearer sekret") == 200


def test_feature_transport_takes_upstream_names():
    from sglang.srt.managers.request_builder import use_shm_transport

    assert ServerArgs().mm_feature_transport == "cpu"
    assert ServerArgs(mm_feature_transport="shm").mm_feature_transport == "cpu"  # this engine's earlier name
    assert use_shm_transport(ServerArgs()) is True
    assert use_shm_transport(ServerArgs(nnodes=2, node_rank=0, dist_init_addr="127.0.0.1:5000", tp_size=2)) is False


def test_cuda_ipc_transport_needs_cuda_on_one_host(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="^--mm-feature-transport cuda_ipc: needs a CUDA device, and torch sees none"):
        ServerArgs(mm_feature_transport="cuda_ipc")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ServerArgs(mm_feature_transport="cuda_ipc").mm_feature_transport == "cuda_ipc"
    with pytest.raises(ValueError, match="--device is cpu"):
        ServerArgs(mm_feature_transport="cuda_ipc", device="cpu")
    with pytest.raises(ValueError, match="one host"):
        ServerArgs(mm_feature_transport="cuda_ipc", nnodes=2, node_rank=0, dist_init_addr="127.0.0.1:5000", tp_size=2)
    from sglang.srt.managers.request_builder import use_shm_transport

    assert use_shm_transport(ServerArgs(mm_feature_transport="cuda_ipc")) is False  # items go to the pool


def test_shm_switch_off_is_the_inline_baseline(monkeypatch):
    from sglang.srt.managers.request_builder import use_shm_transport

    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")
    assert use_shm_transport(ServerArgs()) is False


def test_max_running_requests_is_derived_from_the_kv_cache_and_bounded():
    from sglang.srt.server_args import derive_max_running_requests

    assert ServerArgs().max_running_requests is None
    assert derive_max_running_requests(16384, 4096) == 64  # small CPU pool: the floor
    assert derive_max_running_requests(200_000, 32768) == 781  # one per 256 KV tokens in between
    assert derive_max_running_requests(10**8, 1024) == 1024  # the ceiling
    assert derive_max_running_requests(10**8, 262144) == 256  # the request table's memory cap


def test_vit_ulysses_switch_reaches_the_model_runner():
    """Off by default; on, it travels ServerArgs -> ModelRunnerConfig -> ViTStrategy (resolved once by the
    runner); at --tp-size 1 it is reported as having no effect."""
    from sglang.srt.configs.vit_strategy import ViTStrategy
    from sglang.srt.model_executor.model_runner import ModelRunnerConfig

    assert ServerArgs().enable_vit_ulysses_sp is False and ModelRunnerConfig("x").enable_vit_ulysses_sp is False
    assert ViTStrategy.from_env().ulysses_sp is False
    on = ServerArgs.from_argv(["--tp-size", "2", "--enable-vit-ulysses-sp"])
    assert on.enable_vit_ulysses_sp and ViTStrategy.from_env(ulysses_sp=True).ulysses_sp
    assert log_ignored_flags(on, "cpu") == []
    assert log_ignored_flags(ServerArgs(enable_vit_ulysses_sp=True), "cpu") == [
        "--enable-vit-ulysses-sp: no effect at --tp-size 1 (nothing to split over)"]


def test_ipc_sockets_fit_the_unix_path_limit_under_a_deep_tmpdir(tmp_path, monkeypatch):
    import shutil
    import tempfile

    from sglang.srt.server_args import PortArgs

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    args = PortArgs.create(ServerArgs())
    try:
        for name in (args.tokenizer_ipc_name, args.scheduler_input_ipc_name, args.detokenizer_ipc_name):
            assert len(name.removeprefix("ipc://")) <= 107, name
    finally:
        shutil.rmtree(args.ipc_dir)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # short enough: the directory stays there
    here = PortArgs.create(ServerArgs())
    try:
        assert here.ipc_dir.startswith(str(tmp_path))
    finally:
        shutil.rmtree(here.ipc_dir)


@pytest.mark.parametrize("name, method", [("auto", "round_robin"), ("round_robin", "round_robin"),
                                          ("total_requests", "total_requests"), ("shortest_queue", "total_requests"),
                                          ("total_tokens", "total_tokens"), ("minimum_tokens", "total_tokens")])
def test_load_balance_methods_upstreams_and_earlier_names(name, method):
    from sglang.srt.server_args_values import resolve_load_balance_method

    args = ServerArgs.from_argv(["--data-parallel-size", "2", "--load-balance-method", name])
    assert args.dp_size == 2 and resolve_load_balance_method(args.load_balance_method) == method


def test_replica_port_args_are_private_to_each_replica():
    from sglang.srt.server_args import PortArgs

    one = PortArgs.create(ServerArgs())
    assert (one.dp_load_ipc_name, one.replica_input_ipc_names) == ("", ())  # dp size 1: as before
    two = PortArgs.create(ServerArgs(dp_size=2))
    try:
        replicas = [two.for_replica(k) for k in range(2)]
        inputs = {two.scheduler_input_ipc_name, *(r.scheduler_input_ipc_name for r in replicas)}
        assert len(inputs) == 3  # the controller's socket and one per replica
        assert len({r.nccl_port for r in replicas}) == 2  # each TP group meets at its own rendezvous
        assert all(r.detokenizer_ipc_name == two.detokenizer_ipc_name for r in replicas)  # one shared detokenizer
    finally:
        import shutil

        shutil.rmtree(one.ipc_dir), shutil.rmtree(two.ipc_dir)


def test_ep_size_refusals_read_the_model_config(tmp_path, capsys):
    """--ep-size against the model: a dense model, an expert count ep does not divide, an expert width
    tp/ep does not divide; a fitting MoE config parses."""
    import json

    def model(**text):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "qwen3_vl_moe", "text_config": text}))
        return str(d)

    moe = dict(num_experts=8, moe_intermediate_size=96)
    a = ServerArgs.from_argv(["--model-path", model(**moe), "--tp-size", "4", "--ep", "2"])
    assert (a.tp_size, a.ep_size) == (4, 2)
    for argv, phrase in [
        (["--model-path", model(intermediate_size=64), "--tp-size", "2", "--ep-size", "2"], "is not a mixture-of-experts"),
        (["--model-path", model(num_experts=6, moe_intermediate_size=96), "--tp-size", "4", "--ep-size", "4"],
         "the model's 6 experts do not split into 4 equal groups"),
        (["--model-path", model(num_experts=8, moe_intermediate_size=90), "--tp-size", "8", "--ep-size", "2"],
         "moe_intermediate_size 90 is sharded over tp/ep = 4 ranks"),
    ]:
        with pytest.raises(SystemExit):
            ServerArgs.from_argv(argv)
        assert phrase in capsys.readouterr().err
