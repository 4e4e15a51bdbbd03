import importlib.util
import sys
import types

import pytest

import sgl_kernel

_HAS_TRITON = importlib.util.find_spec("triton") is not None


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_false_when_triton_not_importable(monkeypatch):
    # A None entry in sys.modules makes `import triton` raise ImportError.
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert sgl_kernel.triton_available() is False


def test_true_with_stub_triton_and_interpreter(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert sgl_kernel.triton_available() is True


def test_without_interpreter_follows_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert sgl_kernel.triton_available() is _cuda()


def test_interpreter_value_must_be_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert sgl_kernel.triton_available() is _cuda()


@pytest.mark.skipif(not _HAS_TRITON, reason="triton is not installed")
def test_real_triton_with_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert sgl_kernel.triton_available() is True


@pytest.mark.skipif(_HAS_TRITON, reason="triton is installed")
def test_real_environment_without_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert sgl_kernel.triton_available() is False
