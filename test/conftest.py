"""Session-wide fixtures: tiny random-weight models generated once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


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
