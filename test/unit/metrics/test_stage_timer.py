"""Stage timer inside the scheduler: stage figures in meta_info, exact log-line format, nothing when off."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "managers"))
from scheduler_utils import InProcessScheduler  # noqa: E402

LINE = re.compile(r"^\[TP0\] \[VLM_STAGE_TIMER\] (\w+) \| req=(\S+) \| wall=\d+\.\d{3} ms$")
SCHEDULER_STAGES = {"recv", "broadcast", "hash", "vit_encode", "embed_merge", "llm_prefill", "first_token", "decode"}


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    proc = QwenVLProcessor.from_pretrained(path)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8))
    return path, proc.process([1, 2, 151652, 151655, 151653, 3, 4], [img])


def test_stages_in_meta_info_and_log_lines(setup, caplog):
    path, (ids, mm) = setup
    s = InProcessScheduler(path, enable_vlm_stage_timer=True, chunked_prefill_size=8)
    with caplog.at_level(logging.INFO, logger="sglang.vlm_stage_timer"):
        rid = s.submit(ids, mm, max_new_tokens=4, ignore_eos=True)
        s.run_until_idle()
    timings = s.meta[rid]["stage_timings_ms"]
    assert SCHEDULER_STAGES - {"recv"} <= set(timings)  # recv needs the tokenizer's send stamp
    assert all(v >= 0 for v in timings.values())
    assert timings["vit_encode"] > 0 and timings["llm_prefill"] > 0 and timings["decode"] > 0
    # the first token waits for the ViT, the merge and every prefill chunk
    assert timings["first_token"] >= timings["vit_encode"] + timings["llm_prefill"]
    logged = {}
    for rec in caplog.records:
        m = LINE.match(rec.getMessage())
        assert m, rec.getMessage()
        logged[m.group(1)] = m.group(2)
    assert set(logged) == set(timings) and set(logged.values()) == {rid}


def test_off_records_nothing(setup, caplog, monkeypatch):
    monkeypatch.delenv("SGLANG_VLM_STAGE_TIMER", raising=False)
    path, (ids, mm) = setup
    s = InProcessScheduler(path)
    with caplog.at_level(logging.INFO, logger="sglang.vlm_stage_timer"):
        rid = s.submit(ids, mm, max_new_tokens=2)
        s.run_until_idle()
    assert "stage_timings_ms" not in s.meta[rid]
    assert not [r for r in caplog.records if "VLM_STAGE_TIMER" in r.getMessage()]


def test_env_switch_turns_it_on(setup, monkeypatch):
    monkeypatch.setenv("SGLANG_VLM_STAGE_TIMER", "1")
    path, (ids, mm) = setup
    s = InProcessScheduler(path)
    rid = s.submit(ids, mm, max_new_tokens=2)
    s.run_until_idle()
    assert "vit_encode" in s.meta[rid]["stage_timings_ms"]


def test_replica_schedulers_name_their_replica_in_each_line(caplog):
    """--dp-size > 1: two replicas' rank-0 lines are told apart by the DP prefix; dp size 1 keeps [TP0]."""
    from sglang.srt.metrics.stage_timer import VlmStageTimer

    with caplog.at_level(logging.INFO, logger="sglang.vlm_stage_timer"):
        VlmStageTimer(True, 0, 1).emit("r1", {"decode": 1.5})
        VlmStageTimer(True, 0).emit("r2", {"decode": 2.0})
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["[DP1 TP0] [VLM_STAGE_TIMER] decode | req=r1 | wall=1.500 ms",
                     "[TP0] [VLM_STAGE_TIMER] decode | req=r2 | wall=2.000 ms"]
