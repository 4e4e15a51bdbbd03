"""Session-wide fixtures: tiny random-weight models generated once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_configure(config):
    """SGLANG_TEST_DEVICE=cuda on a machine without CUDA is a mistake, not a reason to test the CPU."""
    from sglang.srt.environ import envs

    device = envs.SGLANG_TEST_DEVICE.get()
    if device not in ("cpu", "cuda"):
        raise pytest.UsageError(f"SGLANG_TEST_DEVICE={device!r}: use cpu or cuda")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("SGLANG_TEST_DEVICE=cuda but torch sees no CUDA device")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Returns a function preset -> directory of that tiny preset (seed 0), built on first use."""
    from sglang.testing.make_model import make_model

    built: dict[str, Path] = {}

    def get(preset: str) -> Path:
        if preset not in built:
            out = tmp_path_factory.mktemp(preset.replace(".", "_"))
            built[preset] = Path(make_model(preset, out / "model", seed=0, progress=False))
        return built[preset]

    return get
