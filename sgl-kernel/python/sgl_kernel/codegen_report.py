"""Machine-code report of a Triton kernel for a GPU this machine does not have.

Triton compiles for any target without a device: `triton.compile(ASTSource(...), target=GPUTarget(...))`
runs the whole pipeline down to PTX (and a cubin when its own ptxas accepts the PTX). The report then
reads what decides the kernel's speed on that GPU:

- registers and spill bytes, from the wheel's bundled `ptxas -v` (the first bundled ptxas that accepts
  the PTX version triton emitted: triton 3.9 emits PTX 9.x, which only its `ptxas-blackwell` reads);
- shared memory (triton allocates it dynamically: the compiled kernel's metadata, not ptxas, knows it);
- the tensor-core instruction in the PTX (`wgmma` on Hopper, `mma.sync` the Ampere path, or none);
- the width of every global load, counting both `ld.global` and the asynchronous copies
  (`cp.async ... 4|8|16`) that software pipelining turns loads into.

A kernel is compiled exactly as a real launch specializes it: pointers 16-byte aligned, integer
arguments divisible by 16 marked so (`tt.divisibility`), integers equal to 1 folded to constants.
Callers describe arguments with example values (`Ptr("bf16")`, ints, floats) and pass the
constexprs and launch options the launcher itself would pick.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Ptr:
    """A pointer argument: element type in triton's spelling (bf16, fp16, fp32, i32, i64, i8, u8)."""

    dtype: str


@dataclass(frozen=True)
class I64:
    """An integer argument that a launch passes as int64 (a value at or past 2**31)."""

    value: int


@dataclass
class CodegenRow:
    kernel: str
    case: str
    head_dim: int | None
    dtype: str
    registers: int | None
    spill_bytes: int | None
    shared_bytes: int
    mma: str
    min_load_bits: int | None
    max_load_bits: int | None
    loads: dict = field(default_factory=dict)  # "ld.global 16", "cp.async 128" -> count in the PTX
    num_warps: int = 4
    num_stages: int = 3
    ptxas: str | None = None  # which ptxas read the PTX; None: none could (registers unknown)
    note: str = ""
    mma_operands: str = ""  # the tensor-core instruction's input types, e.g. "e4m3.e4m3", "bf16.bf16"

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def require_triton() -> None:
    """The report compiles with triton (no GPU needed); without it, one clear error."""
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError("the machine-code report compiles kernels with triton: pip install 'triton>=3.0' "
                           "(no GPU needed)")


def parse_target(name: str):
    """"sm_90a" / "sm_90" / "sm90" -> GPUTarget("cuda", 90, 32)."""
    require_triton()
    from triton.backends.compiler import GPUTarget

    m = re.fullmatch(r"sm_?(\d+)a?", name.strip())
    if not m:
        raise ValueError(f"target must look like sm_90a, got {name!r}")
    return GPUTarget("cuda", int(m.group(1)), 32)


def ptxas_candidates() -> list[str]:
    """The ptxas binaries a triton wheel ships (newest-PTX-capable first), after TRITON_PTXAS_PATH."""
    require_triton()
    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    found = []
    for name in ("ptxas-blackwell", "ptxas"):
        path = os.path.join(bin_dir, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            found.append(path)
    env = os.environ.get("TRITON_PTXAS_PATH")
    if env and os.path.isfile(env):
        found.insert(0, env)
    return found


def _signature(fn, args: dict, constexprs: dict):
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            consts[(i,)] = constexprs[name]
            continue
        if name not in args:
            raise KeyError(f"{fn.__name__}: no value for argument {name!r}")
        val = args[name]
        if isinstance(val, Ptr):
            sig[name] = "*" + val.dtype
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(val, I64):
            sig[name] = "i64"
            if val.value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(val, bool) or not isinstance(val, (int, float)):
            raise TypeError(f"{fn.__name__}: argument {name!r} must be Ptr, I64, int or float, got {val!r}")
        elif isinstance(val, float):
            sig[name] = "fp32"
        elif val == 1:
            # a launch folds integer arguments equal to 1 into constants
            sig[name] = "constexpr"
            consts[(i,)] = 1
        else:
            sig[name] = "i32"
            if val % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


_LD = re.compile(r"\bld\.global(?:\.[\w:]+)*?(?:\.v(\d))?\.(?:b|u|s|f)(\d+)\b")
_CP_ASYNC = re.compile(r"\bcp\.async\.(?:ca|cg)\.shared\.global(?:\.[\w:]+)*\s+\[[^\]]*\],\s*\[[^\]]*\],\s*(0x[0-9a-fA-F]+|\d+)")


def ptx_loads(ptx: str) -> Counter:
    """Global loads by kind and width in bits: {"ld.global 128": n, "cp.async 32": m, ...}."""
    out: Counter = Counter()
    for vec, bits in _LD.findall(ptx):
        out[f"ld.global {int(vec or 1) * int(bits)}"] += 1
    for nbytes in _CP_ASYNC.findall(ptx):
        out[f"cp.async {int(nbytes, 0) * 8}"] += 1
    if "cp.async.bulk.tensor" in ptx:
        out["tma"] += ptx.count("cp.async.bulk.tensor")
    return out


def ptx_mma(ptx: str) -> str:
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    if re.search(r"\bmma\.sync\b", ptx):
        return "mma.sync"
    return "none"


_MMA_OPERANDS = re.compile(r"\b(?:wgmma\.mma_async|mma\.sync)[\w.]*?\.f(?:16|32)\.(\w+)\.(\w+)\b")


def ptx_mma_operands(ptx: str) -> str:
    """Input types of the tensor-core instructions ("e4m3.e4m3", "bf16.bf16", ...; several joined by
    commas), "" without any."""
    found = dict.fromkeys(f"{a}.{b}" for a, b in _MMA_OPERANDS.findall(ptx))
    return ",".join(found)


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def run_ptxas(ptx: str, arch: str) -> tuple[int, int, str] | None:
    """(registers, spill bytes (stores + loads), ptxas path) from the first bundled ptxas that accepts
    the PTX; None when none does."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        for exe in ptxas_candidates():
            proc = subprocess.run([exe, "-v", f"--gpu-name={arch}", src, "-o", os.path.join(tmp, "k.cubin")],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                continue
            text = proc.stdout + proc.stderr
            regs = _PTXAS_REGS.search(text)
            spill = _PTXAS_SPILL.search(text)
            if regs is None or spill is None:
                continue
            return int(regs.group(1)), int(spill.group(1)) + int(spill.group(2)), exe
    return None


def compile_kernel(fn, args: dict, constexprs: dict, options: dict, target: str = "sm_90a"):
    """The compiled kernel (asm dict with 'ptx', metadata with 'shared') for `target`."""
    require_triton()
    import triton
    from triton.compiler import ASTSource

    sig, consts, attrs = _signature(fn, args, constexprs)
    src = ASTSource(fn, sig, consts, attrs)
    return triton.compile(src, target=parse_target(target), options=dict(options))


def report_kernel(fn, case: str, args: dict, constexprs: dict, options: dict, *, head_dim: int | None,
                  dtype: str, target: str = "sm_90a", note: str = "") -> CodegenRow:
    compiled = compile_kernel(fn, args, constexprs, options, target)
    ptx = compiled.asm["ptx"]
    arch = "sm_" + re.fullmatch(r"sm_?(\d+a?)", target).group(1)
    if arch == "sm_90":
        arch = "sm_90a"  # triton emits sm_90a PTX for capability 90
    ptxas = run_ptxas(ptx, arch)
    loads = ptx_loads(ptx)
    widths = [int(k.split()[1]) for k in loads if k != "tma"]
    meta = compiled.metadata
    shared = meta.shared if hasattr(meta, "shared") else meta["shared"]
    return CodegenRow(
        kernel=fn.__name__, case=case, head_dim=head_dim, dtype=dtype,
        registers=ptxas[0] if ptxas else None, spill_bytes=ptxas[1] if ptxas else None,
        shared_bytes=int(shared), mma=ptx_mma(ptx),
        min_load_bits=min(widths) if widths else None, max_load_bits=max(widths) if widths else None,
        loads=dict(sorted(loads.items())), num_warps=int(options.get("num_warps", 4)),
        num_stages=int(options.get("num_stages", 3)),
        ptxas=os.path.basename(ptxas[2]) if ptxas else None, note=note, mma_operands=ptx_mma_operands(ptx),
    )
