"""A checkpoint tensor as the layers' weight loaders receive it: `LazyWeight` (a region of a safetensors
tensor not read yet; narrowing only narrows the region) and `materialize`. Every region is checked for
NaN/inf as it is read, once, before any of it reaches a parameter: a checkpoint holding one is refused
naming the tensor. The layers' own helper (the model loader reads files and hands these over), so layers
never import the loader."""

from __future__ import annotations

import torch

from sglang.srt.errors import ServeRefusal


class NonFiniteWeightError(ServeRefusal):
    """A checkpoint tensor holds NaN or inf."""


# e4m3fn has no inf; its NaNs are S.1111.111 (0x7F, 0xFF)
_E4M3_NAN = 0x7F


def has_non_finite(t: torch.Tensor) -> bool:
    """Whether a floating tensor holds a NaN or an inf (integer tensors never do)."""
    if not t.is_floating_point() or t.numel() == 0:
        return False
    if t.dtype == torch.float8_e4m3fn:
        return bool(((t.view(torch.uint8) & _E4M3_NAN) == _E4M3_NAN).any())
    if t.element_size() == 1:  # other 8-bit floats (e5m2 has inf): widen first, they are small
        t = t.float()
    return not bool(torch.isfinite(t).all())


def check_finite(t: torch.Tensor, name: str) -> torch.Tensor:
    if has_non_finite(t):
        raise NonFiniteWeightError(f"checkpoint tensor {name!r} holds non-finite values (NaN or inf): "
                                   "refusing to load it")
    return t


def tensor_name(w, fallback: str) -> str:
    """The checkpoint name of `w` (a LazyWeight the loader handed over) for error messages."""
    return getattr(w, "name", None) or fallback


class LazyWeight:
    """A checkpoint tensor not yet read: `narrow` and `split` only narrow the region to read, so a
    TP rank that loads its shard reads just those bytes from disk. `load()` reads the region and
    refuses it when it holds NaN/inf. `sl` is a safetensors slice, or a tensor already in memory
    (`LazyWeight.of`); `name` is the checkpoint name, kept by every narrowed view for messages."""

    def __init__(self, sl, shape: tuple[int, ...], region: tuple[tuple[int, int], ...] | None = None, name: str = ""):
        self._slice = sl
        self._full_shape = tuple(shape)
        self._region = region or tuple((0, n) for n in shape)
        self.name = name

    @classmethod
    def of(cls, tensor: torch.Tensor, name: str) -> "LazyWeight":
        """A tensor already read, behind the same interface (its load is checked the same way)."""
        return cls(tensor, tuple(tensor.shape), name=name)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(e - s for s, e in self._region)

    def dim(self) -> int:
        return len(self._full_shape)

    def narrow(self, dim: int, start: int, length: int) -> "LazyWeight":
        dim = dim % self.dim()
        s, e = self._region[dim]
        if start < 0 or start + length > e - s:
            raise IndexError(f"narrow({dim}, {start}, {length}) out of range for shape {tuple(self.shape)}")
        region = list(self._region)
        region[dim] = (s + start, s + start + length)
        return LazyWeight(self._slice, self._full_shape, tuple(region), self.name)

    def split(self, sizes: list[int], dim: int = 0) -> list["LazyWeight"]:
        out, start = [], 0
        for n in sizes:
            out.append(self.narrow(dim, start, n))
            start += n
        return out

    def load(self) -> torch.Tensor:
        return check_finite(self._slice[tuple(slice(s, e) for s, e in self._region)], self.name or "<unnamed>")


def materialize(w) -> torch.Tensor:
    return w.load() if isinstance(w, LazyWeight) else w
