"""Tuned fused-MoE configs (sgl_kernel.moe.configs): upstream's file names, the nearest-M lookup, and the
fallback to the default tiles with one warning per shape."""

import json
import logging

import pytest
import torch

pytest.importorskip("triton")

from sgl_kernel.moe import configs  # noqa: E402

H100 = "NVIDIA_H100_80GB_HBM3"


def test_file_names_are_upstreams():
    assert configs.config_file_name(128, 768, None, H100) == "E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert configs.config_file_name(128, 384, "fp8_w8a8", H100, [128, 128]) == \
        "E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert configs.dtype_str(torch.bfloat16) is None and configs.dtype_str(torch.float32) == "float32"
    assert configs.dtype_str(torch.bfloat16, fp8_w8a8=True) == "fp8_w8a8"


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path))
    configs.load_configs.cache_clear()
    yield tmp_path
    configs.load_configs.cache_clear()


def test_a_tuned_file_is_read_and_the_nearest_m_taken(config_dir):
    entry = lambda m: {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16,  # noqa: E731
                       "num_warps": 8, "num_stages": 4}
    (config_dir / configs.config_file_name(64, 384, None, H100)).write_text(json.dumps({"1": entry(16), "256": entry(64)}))
    assert configs.pick_config(3, 8, 64, 384, None, H100) == dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, GROUP_M=16,
                                                                   num_warps=8, num_stages=4)
    assert configs.pick_config(200, 8, 64, 384, None, H100)["BLOCK_M"] == 64
    assert configs.to_json(configs.to_launch(entry(32))) == entry(32)


def test_no_file_falls_back_to_the_default_tiles_and_warns_once_per_shape(config_dir, caplog):
    from sgl_kernel.moe._moe_triton import moe_block_config

    with caplog.at_level(logging.WARNING, logger=configs.__name__):
        for t in (1, 7, 4096):
            assert configs.pick_config(t, 8, 128, 768, None, "Some_GPU") == moe_block_config(t, 8, 128)
        configs.pick_config(1, 8, 128, 384, None, "Some_GPU")  # another shape: its own warning
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 2, lines
    assert "E=128,N=768,device_name=Some_GPU.json" in lines[0] and "tune_fused_moe.py" in lines[0]
    assert "E=128,N=384,device_name=Some_GPU.json" in lines[1]

