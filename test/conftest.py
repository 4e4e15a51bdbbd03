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


@pytest.fixture(scope="session")
def tiny_dirs(tiny_model_dir) -> dict[str, Path]:
    """Every tiny preset of PRESETS (seed 0), read-only to the tests: the make_model tests' fixture. (It lives
    here, not in a conftest.py of their folder: a second module named `conftest` would shadow test/e2e's, which
    the e2e tests import by that name.)"""
    from sglang.testing.presets import TINY_PRESETS

    return {name: tiny_model_dir(name) for name in TINY_PRESETS}


@pytest.fixture
def quiet_transformers():
    """transformers' warnings and progress bars off, for tests that load its models (`pytestmark`)."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    yield
