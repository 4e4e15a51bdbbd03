"""docs/compatibility.md stays true. Upstream SGLang 0.5.23's launch flags named on the page are kept here
as data (names, aliases, defaults, choices), so each row is checked against both sides: a **same** row is
proven (the flag and upstream's aliases parse to one value, our default is upstream's, every upstream
choice is accepted), **different** and **ours** flags exist, **missing** ones (and their upstream aliases)
do not, no upstream flag is called ours, and every flag our parser accepts has a row."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from sglang.srt.environ import envs
from sglang.srt.server_args import ServerArgs

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
UNKNOWN = object()  # a default this data does not assert (the row must not claim same)


def _flag(default=None, aliases: tuple[str, ...] = (), choices: tuple = ()) -> dict:
    return {"default": default, "aliases": aliases, "choices": choices}


# Upstream 0.5.23 (python/sglang/srt/server_args.py): the flags this page names.
UPSTREAM = {
    "--model-path": _flag(aliases=("--model",)),
    "--revision": _flag(),
    "--tokenizer-path": _flag(),
    "--served-model-name": _flag(),
    "--host": _flag("127.0.0.1"),
    "--port": _flag(30000),
    "--tp-size": _flag(1, ("--tensor-parallel-size",)),
    "--nnodes": _flag(1),
    "--node-rank": _flag(0),
    "--dist-init-addr": _flag(None, ("--nccl-init-addr",)),
    "--dp-size": _flag(1, ("--data-parallel-size",)),
    "--max-mamba-cache-size": _flag(None),
    "--mamba-track-interval": _flag(256),
    "--load-balance-method": _flag("auto", choices=("auto", "round_robin", "follow_bootstrap_room", "total_requests",
                                                    "total_tokens")),
    "--base-gpu-id": _flag(0),
    "--context-length": _flag(),
    "--max-total-tokens": _flag(),
    "--max-prefill-tokens": _flag(16384),
    "--chunked-prefill-size": _flag(),  # unset: sized from the GPU's memory
    "--page-size": _flag(),  # unset: chosen per attention backend
    "--max-running-requests": _flag(),
    "--mem-fraction-static": _flag(),  # unset: sized from the GPU's memory
    "--disable-radix-cache": _flag(False),
    "--schedule-conservativeness": _flag(1.0),
    "--schedule-policy": _flag("fcfs", choices=("lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key",
                                                "hrrn", "shortest-prefill-first")),
    "--enable-priority-scheduling": _flag(False),
    "--max-queued-requests": _flag(),
    "--schedule-low-priority-values-first": _flag(False),
    "--priority-scheduling-preemption-threshold": _flag(10),
    "--disable-priority-preemption": _flag(False),
    "--default-priority-value": _flag(),
    "--abort-on-priority-when-disabled": _flag(False),
    "--dtype": _flag("auto", choices=("auto", "half", "float16", "bfloat16", "float", "float32")),
    "--kv-cache-dtype": _flag("auto", choices=("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16")),
    "--quantization": _flag(),
    "--quantization-param-path": _flag(),
    "--fp8-gemm-backend": _flag("auto"),
    "--device": _flag(),  # unset: detected
    "--attention-backend": _flag(choices=("triton", "torch_native", "flex_attention", "fa3", "fa4", "flashinfer")),
    "--mm-attention-backend": _flag(choices=("sdpa", "fa3", "fa4", "triton_attn", "ascend_attn", "aiter_attn",
                                             "flashinfer_cudnn")),
    "--cuda-graph-max-bs-decode": _flag(),
    "--cuda-graph-bs-decode": _flag(),
    "--cuda-graph-max-bs": _flag(),  # the legacy names, still accepted
    "--cuda-graph-bs": _flag(),
    "--disable-cuda-graph": _flag(False),
    "--cuda-graph-max-bs-prefill": _flag(),
    "--cuda-graph-backend-decode": _flag(),
    "--enable-multimodal": _flag(False),
    "--trust-remote-code": _flag(False),
    "--skip-server-warmup": _flag(False),
    "--mm-feature-transport": _flag("cpu", choices=("cpu", "cuda_ipc")),
    "--limit-mm-data-per-request": _flag(),
    "--mm-processor-worker-num": _flag(),  # unset: 2 for the processors that support it
    "--mm-io-worker-num": _flag(),  # unset: 16
    "--mm-process-config": _flag(),
    "--chat-template": _flag(),
    "--api-key": _flag(),
    "--random-seed": _flag(),  # unset: random per launch
    "--watchdog-timeout": _flag(300),
    "--stream-interval": _flag(1),
    "--stream-output": _flag(False),
    "--skip-tokenizer-init": _flag(False),
    "--enable-custom-logit-processor": _flag(False),
    "--weight-version": _flag("default"),
    "--enable-metrics": _flag(False),
    "--log-level": _flag("info", choices=("debug", "info", "warning", "error", "critical")),
    "--allowed-media-domains": _flag(UNKNOWN),
    "--media-url-max-file-size-mb": _flag(64),
    "--max-payload-size": _flag(UNKNOWN),
    "--enable-torch-compile": _flag(False),
    "--speculative-algorithm": _flag(),
    "--lora-paths": _flag(),
    "--tool-call-parser": _flag(),
    "--reasoning-parser": _flag(),
    "--grammar-backend": _flag(choices=("xgrammar", "outlines", "llguidance", "none")),  # unset: xgrammar
    "--constrained-json-disable-any-whitespace": _flag(False),
    "--constrained-json-max-whitespace-cnt": _flag(),
    "--constrained-json-disable-any-whitespace": _flag(False),
    "--constrained-json-max-whitespace-cnt": _flag(),
    "--ep-size": _flag(1, ("--expert-parallel-size", "--ep")),
    "--load-format": _flag("auto"),
    "--enable-mixed-chunk": _flag(False),
    "--disable-overlap-schedule": _flag(False),
    "--mm-enable-dp-encoder": _flag(False),
    "--encoder-only": _flag(False),
    "--language-only": _flag(False),
    "--encoder-urls": _flag([]),
    "--encoder-transfer-backend": _flag("zmq_to_scheduler", choices=("zmq_to_scheduler", "zmq_to_tokenizer",
                                                                     "mooncake")),
}
STATUSES = ("same", "different", "missing", "ours")


def _rows(section: str) -> list[tuple[list[str], str, str]]:
    text = DOC.read_text().split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[1] in STATUSES:
            rows.append((re.findall(r"`(--[a-z0-9-]+)`", cells[0]), cells[1], cells[2]))
    return rows


FLAG_ROWS = _rows("Launch flags")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def _dests() -> dict[str, str]:
    return {opt: a.dest for a in _parser()._actions for opt in a.option_strings}


def _ids(rows):
    return [" ".join(flags) + f" ({status})" for flags, status, _ in rows]


def test_the_page_has_flag_rows_of_every_status():
    assert {status for _, status, _ in FLAG_ROWS} == set(STATUSES) and len(FLAG_ROWS) > 40
    assert all(flags for flags, _, _ in FLAG_ROWS)


def test_every_flag_the_parser_accepts_has_a_row():
    documented = {f for flags, status, _ in FLAG_ROWS if status != "missing" for f in flags}
    undocumented = sorted(set(_dests()) - {"-h", "--help"} - documented)
    assert not undocumented, f"flags without a row in docs/compatibility.md: {undocumented}"


def test_the_upstream_data_is_all_on_the_page():
    named = {f for flags, _, _ in FLAG_ROWS for f in flags}
    aliases = {a for spec in UPSTREAM.values() for a in spec["aliases"]}
    assert set(UPSTREAM) <= named, sorted(set(UPSTREAM) - named)
    assert not aliases - named - set(UPSTREAM), "name upstream's aliases in their flag's row"


@pytest.mark.parametrize("flags, status, notes", FLAG_ROWS, ids=_ids(FLAG_ROWS))
def test_flag_row_matches_upstream_and_the_parser(flags, status, notes):
    dests = _dests()
    upstream_aliases = {a: name for name, spec in UPSTREAM.items() for a in spec["aliases"]}
    for flag in flags:
        if status == "ours":
            assert flag not in UPSTREAM and flag not in upstream_aliases, f"{flag} is upstream's, not ours"
            assert flag in dests, f"{flag} is documented as ours but the parser does not know it"
            continue
        assert flag in UPSTREAM or flag in upstream_aliases, f"{flag}: not an upstream flag (add it to UPSTREAM or call it ours)"
        spellings = [flag, *UPSTREAM.get(flag, {"aliases": ()})["aliases"]]
        if status == "missing":
            assert not set(spellings) & set(dests), f"{flag} is accepted now: update docs/compatibility.md"
            continue
        assert flag in dests, f"{flag} is documented as {status} but the parser does not know it"
        if status == "different":
            assert notes, f"{flag}: a different row says how"


SAME = [(f, UPSTREAM[f]) for flags, status, _ in FLAG_ROWS if status == "same" for f in flags if f in UPSTREAM]


@pytest.mark.parametrize("flag, spec", SAME, ids=[f for f, _ in SAME])
def test_a_same_row_is_proven(flag, spec, monkeypatch):
    import torch

    dests = _dests()
    dest = dests[flag]
    for alias in spec["aliases"]:
        assert dests.get(alias) == dest, f"{flag}: upstream's alias {alias} is not accepted as the same flag"
    assert spec["default"] is not UNKNOWN, f"{flag}: upstream's default is not recorded, the row cannot claim same"
    ours = getattr(ServerArgs(), dest)
    is_bool = isinstance(getattr(ServerArgs, dest, None), bool) or type(ours) is bool
    assert (bool(ours) == bool(spec["default"])) if is_bool else ours == spec["default"], \
        f"{flag}: our default {ours!r}, upstream's {spec['default']!r}"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # choices that need CUDA are checked as on a GPU
    for choice in spec["choices"]:
        ServerArgs.from_argv([flag, choice])  # a refusal exits with the reason


def _env_rows() -> list[tuple[str, str]]:
    text = DOC.read_text().split("## Environment switches", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`SGLANG_"):
            rows.append((cells[0].strip("`"), cells[1].strip("`")))
    return rows


ENV_ROWS = _env_rows()


def _as_default(text: str):
    if text in ("on", "off"):
        return text == "on"
    if text == "unset":
        return None
    try:
        return float(text)
    except ValueError:
        return text


@pytest.mark.parametrize("name, here", ENV_ROWS, ids=[r[0] for r in ENV_ROWS])
def test_environment_rows_state_our_defaults(name, here):
    default = getattr(envs, name).default
    want = _as_default(here)
    if want is None:
        assert default in (None, ""), (name, default)
    elif isinstance(want, float) and not isinstance(default, bool):
        assert float(default) == want, (name, default)
    else:
        assert default == want or str(default) == here, (name, default)


def test_environment_table_is_there():
    assert {"SGLANG_MM_PRECOMPUTE_HASH", "SGLANG_MM_FEATURE_CACHE_MB", "SGLANG_IMAGE_MAX_PIXELS"} <= {n for n, _ in ENV_ROWS}
