"""FP8 KV-cache scales that would make attention NaN or garbage (inf, 1e308, NaN, <= 0, above 1e4) are refused
where they are read, from the checkpoint's tensors or the --quantization-param-path file, in one line naming
the layer and value; the file is refused before it is read when it is not a regular file (a FIFO hung the
start-up, /dev/zero grew it by GBs) or is larger than a scale file can be. The FIFO and /dev/zero cases run
in a child process, bounded in time and memory, so a regression fails the test instead of the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from sglang.srt.layers.quantization.kv_cache import checkpoint_kv_scales, param_file_kv_scales

# values a scale file or tensor may carry that no attention can use; each must be refused
BAD_SCALES = [float("inf"), 1e308, float("nan"), 0.0, -2.0, 1e5]


def _scale_file(tmp_path, scale, rank="0"):
    f = tmp_path / "scales.json"
    # allow_nan: Python writes inf / nan as Infinity / NaN, which its reader (and vLLM's files) accept
    f.write_text(json.dumps({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {rank: {"0": scale, "1": 0.5}}}}))
    return str(f)


def test_unusable_scales_in_the_param_file_are_refused_naming_the_layer(tmp_path):
    for bad in [*BAD_SCALES, "0.5", True]:
        with pytest.raises(ValueError) as e:
            param_file_kv_scales(_scale_file(tmp_path, bad), 0, 2)
        msg = str(e.value)
        assert "layer 0" in msg and "\n" not in msg, (bad, msg)
        if isinstance(bad, float):
            assert repr(bad) in msg, (bad, msg)
    # the bounds are inclusive on the large side: 1e4 (K or V of ~4.5e6) and any tiny positive scale load
    for ok in (1e4, 1e-6):
        assert param_file_kv_scales(_scale_file(tmp_path, ok), 0, 2) == {0: [ok, ok], 1: [0.5, 0.5]}


def test_unusable_checkpoint_scale_tensors_are_refused_naming_the_tensor():
    name = "model.language_model.layers.2.self_attn.k_scale"
    for bad in BAD_SCALES:
        with pytest.raises(ValueError) as e:
            checkpoint_kv_scales([(name, torch.tensor(bad, dtype=torch.float64))])
        msg = str(e.value)
        assert name in msg and f"layer 2 k_scale {bad!r}" in msg and "\n" not in msg, msg
    with pytest.raises(ValueError, match="one number"):  # a scale is a scalar, not a per-channel vector
        checkpoint_kv_scales([(name, torch.tensor([0.5, 0.5]))])
    with pytest.raises(ValueError, match="the model has 2 layers"):
        checkpoint_kv_scales([(name, torch.tensor(0.5))], num_layers=2)
    assert checkpoint_kv_scales([(name, torch.tensor(0.5))], num_layers=3) == {2: [0.5, 1.0]}


_CHILD = """
import os, resource, sys
from sglang.srt.layers.quantization.kv_cache import param_file_kv_scales
# after the imports: at most 512 MiB more address space, so reading /dev/zero whole fails fast instead of
# taking the machine's memory
with open("/proc/self/statm") as f:
    used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (used + (512 << 20), resource.RLIM_INFINITY))
try:
    param_file_kv_scales(sys.argv[1], 0, 2)
except ValueError as e:
    print("REFUSED", e)
else:
    print("ACCEPTED")
"""


def _refusal_in_a_child(path: str) -> str:
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {path} as a scale file did not return in 300 s (it blocks)")
    assert out.returncode == 0 and out.stdout.startswith("REFUSED"), (out.stdout, out.stderr[-2000:])
    return out.stdout


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "scales.json"
    os.mkfifo(fifo)
    line = _refusal_in_a_child(str(fifo))
    assert "FIFO" in line and str(fifo) in line


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_dev_zero_is_refused_before_it_is_read():
    line = _refusal_in_a_child("/dev/zero")
    assert "device" in line and "/dev/zero" in line


def test_directories_and_oversized_files_are_refused_before_a_byte_is_read(tmp_path, monkeypatch):
    from sglang.srt.configs import kv_scales

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(kv_scales.MAX_PARAM_FILE_BYTES + 1)  # sparse: no disk, no time
    reads = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    for path, words in ((tmp_path, "directory"), (big, f"more than the {kv_scales.MAX_PARAM_FILE_BYTES}")):
        with pytest.raises(ValueError) as e:
            param_file_kv_scales(str(path), 0, 2)
        assert words in str(e.value) and "\n" not in str(e.value)
    assert reads == []
    assert param_file_kv_scales(_scale_file(tmp_path, 2.0), 0, 2) == {0: [2.0, 2.0], 1: [0.5, 0.5]}


def test_the_start_up_check_reads_every_ranks_scales_before_any_process(tmp_path):
    from sglang.srt.configs.startup_checks import startup_problems
    from sglang.testing.hf_configs import build_config_dict

    (tmp_path / "config.json").write_text(json.dumps(build_config_dict("qwen3-vl-tiny")))
    bad = tmp_path / "ranks.json"  # rank 0's scales are usable, rank 1's are not: its scheduler would fail
    bad.write_text(json.dumps({"kv_cache": {"scaling_factor": {"0": {"0": 0.5}, "1": {"0": float("inf")}}}}))
    bad = str(bad)
    assert startup_problems(str(tmp_path), "auto", bad, 2) == []  # no FP8 cache: the file is not used
    problems = startup_problems(str(tmp_path), "fp8_e4m3", bad, 2)
    assert len(problems) == 1 and "layer 0" in problems[0] and "inf" in problems[0] and "\n" not in problems[0]
    assert startup_problems(str(tmp_path), "fp8_e4m3", _scale_file(tmp_path, 0.25), 2) == []
