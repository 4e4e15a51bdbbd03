"""`auto` attention: one rule for the server's flags and a ModelRunner built directly."""

import pytest

from sglang.srt.configs import attention_defaults
from sglang.srt.configs.attention_defaults import default_attention_backends
from sglang.srt.server_args import ServerArgs


def test_cpu_takes_the_torch_paths():
    assert default_attention_backends("cpu") == ("torch_native", "sdpa")


@pytest.mark.parametrize("importable,want", [(True, ("triton", "triton")), (False, ("torch_native", "sdpa"))])
def test_cuda_takes_triton_when_it_imports(monkeypatch, importable, want):
    monkeypatch.setattr(attention_defaults, "triton_importable", lambda: importable)
    assert default_attention_backends("cuda") == want
    assert default_attention_backends("cuda:1") == want


def test_server_flags_resolve_auto_by_the_same_rule_and_keep_explicit_choices(monkeypatch):
    monkeypatch.setattr(attention_defaults, "triton_importable", lambda: True)
    args = ServerArgs(model_path="m", device="cuda")
    assert args.resolved_attention_backends() == ("triton", "triton")
    args = ServerArgs(model_path="m", device="cuda", attention_backend="torch_native", mm_attention_backend="sdpa")
    assert args.resolved_attention_backends() == ("torch_native", "sdpa")


def test_a_model_runner_built_directly_resolves_auto(tiny_model_dir):
    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig

    runner = ModelRunner(ModelRunnerConfig(model_path=str(tiny_model_dir("qwen3-vl-tiny")), dtype="float32",
                                           max_total_tokens=256, max_running_requests=2, context_length=256))
    assert (runner.attention_backend, runner.mm_attention_backend) == ("torch_native", "sdpa")
