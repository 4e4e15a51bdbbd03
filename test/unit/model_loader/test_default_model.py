"""The default model (no --model-path): resolved in model_loader/default_model.py, so server_args.py
needs no test tooling; a given path is resolved as before."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sglang.srt.server_args as server_args_module
from sglang.srt.model_loader import default_model
from sglang.srt.model_loader.model_path import ModelPathError
from sglang.srt.server_args import ServerArgs


def test_server_args_does_not_import_the_testing_package():
    tree = ast.parse(Path(server_args_module.__file__).read_text())
    mods = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    mods += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in mods if m.startswith("sglang.testing")], mods


def test_no_model_path_gives_the_embedded_preset(monkeypatch, tmp_path):
    import sglang.testing.make_model as make_model

    asked = []
    monkeypatch.setattr(make_model, "ensure_model", lambda preset: asked.append(preset) or tmp_path / preset)
    assert ServerArgs().resolved_model_path() == str(tmp_path / "qwen3-vl-tiny")
    assert default_model.resolve_model_path_or_default(None) == default_model.default_model_path()
    assert asked == ["qwen3-vl-tiny"] * 3 and default_model.DEFAULT_MODEL_PRESET == "qwen3-vl-tiny"


def test_a_given_path_is_resolved_not_replaced(tmp_path):
    assert ServerArgs(model_path=str(tmp_path)).resolved_model_path() == str(tmp_path)
    with pytest.raises(ModelPathError):
        ServerArgs(model_path=str(tmp_path / "missing")).resolved_model_path()
