"""What the engine refuses to serve stops the launch with one line naming it, no traceback: a MoE config
whose router could never pick (top-k 9 of 8 experts: on a018ab2 it started, then answered every request
500), a KV scale file that is a FIFO (start-up hung) or holds an infinite scale (NaN outputs)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import ServerProcess


def _refused(model_dir, tmp_path, *args) -> str:
    server = ServerProcess(model_dir, tmp_path / "run", list(args))
    code = server.proc.wait(300)
    log = server.log_tail()
    assert code != 0, log
    assert "Traceback" not in log, log
    return log


def test_a_moe_config_whose_router_cannot_pick_is_refused_in_one_line(tiny_model_dir, tmp_path):
    bad = tmp_path / "moe-top9"
    shutil.copytree(tiny_model_dir("qwen3-vl-moe-tiny"), bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["text_config"]["num_experts_per_tok"] = 9
    (bad / "config.json").write_text(json.dumps(cfg))
    log = _refused(bad, tmp_path)
    assert "num_experts_per_tok 9 must be between 1 and the model's 8 experts" in log, log


@pytest.mark.parametrize("kind", ["fifo", "inf"])
def test_a_kv_scale_file_it_cannot_use_is_refused_in_one_line(model_dir, tmp_path, kind):
    path = tmp_path / "scales.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text('{"kv_cache": {"scaling_factor": {"0": {"0": Infinity}}}}')
    log = _refused(model_dir, tmp_path, "--kv-cache-dtype", "fp8_e4m3", "--quantization-param-path", str(path))
    assert str(path) in log and ("FIFO" in log or "finite" in log), log


def test_the_command_line_refuses_them_before_any_process_starts(tiny_model_dir, tmp_path, capsys):
    """The same refusals through ServerArgs' checks: argparse's one line, before a scheduler is spawned."""
    from sglang.srt.server_args import ServerArgs

    bad = tmp_path / "moe-top9"
    shutil.copytree(tiny_model_dir("qwen3-vl-moe-tiny"), bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["text_config"]["num_experts_per_tok"] = 9
    (bad / "config.json").write_text(json.dumps(cfg))
    fifo = tmp_path / "scales.fifo"
    os.mkfifo(fifo)
    for argv, words in [(["--model-path", str(bad)], "num_experts_per_tok 9"),
                        (["--kv-cache-dtype", "fp8_e4m3", "--quantization-param-path", str(fifo)], "FIFO")]:
        with pytest.raises(SystemExit):
            ServerArgs.from_argv(argv)
        assert words in capsys.readouterr().err
