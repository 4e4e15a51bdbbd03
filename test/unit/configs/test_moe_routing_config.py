"""A MoE config whose router cannot pick (top-k above the expert count, top-k below 1, no experts) is refused
where config.json is read, in one line naming the fields, instead of starting and failing every request;
and by the start-up check that runs before any process is spawned."""

from __future__ import annotations

import json

import pytest

from sglang.srt.configs.model_config import ModelConfig
from sglang.testing.hf_configs import build_config_dict

PRESET = "qwen3-vl-moe-tiny"  # 8 experts, 2 per token


def _raw(**text_fields) -> dict:
    raw = build_config_dict(PRESET)
    for key, value in text_fields.items():
        if value is None:
            raw["text_config"].pop(key, None)
        else:
            raw["text_config"][key] = value
    return raw


def _write(tmp_path, raw: dict):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def test_the_tiny_moe_model_with_top_k_9_over_8_experts_is_refused_by_the_config_reader(tmp_path):
    raw = build_config_dict(PRESET)
    text = raw["text_config"]
    experts = text.get("num_experts", text.get("num_local_experts"))
    assert experts == 8 and text["num_experts_per_tok"] == 2
    text["num_experts_per_tok"] = 9
    with pytest.raises(ValueError) as e:
        ModelConfig.from_pretrained(_write(tmp_path, raw))
    msg = str(e.value)
    assert "\n" not in msg and "num_experts_per_tok 9" in msg and "8 experts" in msg
    for top_k in (1, 8):  # the bounds are inclusive; transformers 5 writes the count as num_local_experts
        for fields in ({}, {"num_experts": None, "num_local_experts": 8}):
            moe = ModelConfig.from_dict(_raw(num_experts_per_tok=top_k, **fields)).text.moe
            assert (moe.num_experts, moe.num_experts_per_tok) == (8, top_k)


@pytest.mark.parametrize("fields, words", [
    ({"num_experts_per_tok": 0}, "num_experts_per_tok 0"),
    ({"num_experts_per_tok": -1}, "num_experts_per_tok -1"),
    ({"num_experts_per_tok": 8.5}, "8.5"),
    ({"num_experts_per_tok": True}, "True"),
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),
    ({"num_experts": 0, "num_local_experts": None}, ">= 1, got 0"),
    ({"num_experts": None, "num_local_experts": 0}, ">= 1, got 0"),
])
def test_top_k_below_one_and_no_experts_are_refused(fields, words):
    with pytest.raises(ValueError) as e:
        ModelConfig.from_dict(_raw(**fields))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_start_up_check_names_the_problem_in_one_line_before_any_process(tmp_path):
    from sglang.srt.configs.startup_checks import startup_problems

    assert startup_problems(str(_write(tmp_path, _raw()))) == []
    problems = startup_problems(str(_write(tmp_path, _raw(num_experts_per_tok=9))))
    assert len(problems) == 1 and "num_experts_per_tok 9" in problems[0] and "\n" not in problems[0]
    # what it cannot judge yet (no local config.json: a Hub id, the default model) it leaves to the loader
    assert startup_problems(str(tmp_path / "absent")) == [] and startup_problems(None) == []
