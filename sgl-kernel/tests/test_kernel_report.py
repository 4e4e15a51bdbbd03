"""The H100 machine-code report (benchmark/kernel_report.py): its parsing, its specialization, and the
kernels it reads. Compiling for sm_90a needs triton (no GPU); reading registers and spills needs a
ptxas in the triton wheel that accepts the PTX it emitted."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from sgl_kernel.codegen_report import I64, Ptr, _signature, ptx_loads, ptx_mma

# Kernels imported with TRITON_INTERPRET=1 are interpreter functions: nothing to compile. The normal
# (compiled-mode) run of this file covers the report; the interpreter subprocess of the kernel tests skips it.
compiles = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                              reason="this process interprets the kernels; the report needs them compiled")
_REPORT = os.path.join(os.path.dirname(__file__), "..", "benchmark", "kernel_report.py")


def _load_report():
    spec = importlib.util.spec_from_file_location("kernel_report", _REPORT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_ptx_loads_count_plain_vector_and_async_loads():
    ptx = "\n".join([
        "ld.global.b16 { %rs1 }, [ %rd1 + 0 ];",
        "ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd2 + 0 ];",
        "ld.global.nc.L1::evict_last.v2.b32 { %r5, %r6 }, [ %rd3 + 0 ];",
        "cp.async.cg.shared.global [ %r54 + 0 ], [ %rd28 + 0 ], 0x10, %r59;",
        "cp.async.ca.shared.global [ %r55 + 0 ], [ %rd29 + 0 ], 4, %r61;",
        "cp.async.commit_group;",
    ])
    assert ptx_loads(ptx) == {"ld.global 16": 1, "ld.global 128": 1, "ld.global 64": 1,
                              "cp.async 128": 1, "cp.async 32": 1}


def test_ptx_mma_names_the_tensor_core_path():
    assert ptx_mma("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == "wgmma"
    assert ptx_mma("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == "mma.sync"
    assert ptx_mma("fma.rn.f32 %f1, %f2, %f3, %f4;") == "none"


def test_signature_specializes_like_a_launch():
    class Fn:
        __name__ = "k"
        arg_names = ["x_ptr", "n", "stride_a", "stride_b", "one", "scale", "big", "BLOCK"]

    sig, consts, attrs = _signature(
        Fn, dict(x_ptr=Ptr("bf16"), n=100, stride_a=1152, stride_b=72, one=1, scale=0.5, big=I64(1 << 40)),
        dict(BLOCK=64))
    assert sig == {"x_ptr": "*bf16", "n": "i32", "stride_a": "i32", "stride_b": "i32", "one": "constexpr",
                   "scale": "fp32", "big": "i64", "BLOCK": "constexpr"}
    assert consts == {(4,): 1, (7,): 64}
    # pointers 16-byte aligned; 1152 and 2**40 divisible by 16; 100 and 72 are not
    assert attrs == {(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]],
                     (6,): [["tt.divisibility", 16]]}


def test_stride_unit_is_16_bytes_only_when_every_stride_allows_it():
    from sgl_kernel.attention._common import stride_unit

    assert stride_unit((1152, 72, 3456, 72), 2) == 8  # Qwen3-VL-8B's tower: 72-element heads, bf16
    assert stride_unit((1152, 72), 4) == 4
    assert stride_unit((1152, 73), 2) == 1
    assert stride_unit((0, 8), 2) == 8


@pytest.mark.parametrize("longest, block_m, programs", [(64, 64, 1), (49, 64, 1), (65, 128, 1), (4800, 128, 38)])
@compiles
def test_vision_query_block_follows_the_longest_segment(longest, block_m, programs):
    pytest.importorskip("triton", reason="the launch plan lives in the kernel module")
    import torch

    from sgl_kernel.attention._prefill_triton import plan_prefill

    q = torch.empty(16384, 16, 80, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(257, dtype=torch.int32, device="meta")
    plan = plan_prefill(q, q, q, q, cu, cu, None, longest, 0.1, causal=False, on_cuda=True)
    assert plan.constexprs["BLOCK_M"] == block_m
    assert plan.grid == (programs, 256, 16)


def _compiled_rows(cases_of) -> list:
    """The report's rows on sm_90a for `cases_of(report module, torch)`; skipped where they cannot be read
    (kernels interpreted in this process, no triton, no ptxas, or a ptxas that refuses this triton's PTX)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process interprets the kernels; the report needs them compiled")
    pytest.importorskip("triton", reason="the report compiles with triton")
    from sgl_kernel.codegen_report import ptxas_candidates

    if not ptxas_candidates():
        pytest.skip("this triton wheel ships no ptxas: registers and spills cannot be read")
    mod = _load_report()
    import torch

    rows = mod.report(cases_of(mod, torch), "sm_90a", progress=False)
    if any(r.registers is None for r in rows):
        pytest.skip("no bundled ptxas accepts the PTX this triton emits")
    return rows


def _attention_cases(mod, torch) -> list:
    cases = mod.build_cases(["extend", "decode", "varlen"], ["qwen3-vl-4b", "qwen3-vl-8b", "qwen2.5-vl-3b"], [torch.bfloat16])
    # Qwen3.5's full-attention layers: head_dim 256, in the serving dtype and in float32 (tf32 tiles twice the bytes)
    return cases + mod.build_cases(["extend", "decode"], ["qwen3.5-4b"], [torch.bfloat16, torch.float32])


@pytest.fixture(scope="module")
def report_rows():
    return _compiled_rows(_attention_cases)


def test_report_covers_every_kernel_and_shape(report_rows):
    kinds = {r.case.split()[0] for r in report_rows}
    assert kinds == {"extend", "decode", "varlen"}
    assert {r.head_dim for r in report_rows if r.case.startswith("varlen")} == {64, 72, 80}
    # --kv-cache-dtype fp8_e4m3: the decode and extend kernels over an e4m3 pool are rows too
    assert {r.case.split()[0] for r in report_rows if r.case.endswith("kv-fp8")} == {"extend", "decode"}
    assert all(r.shared_bytes >= 0 and r.registers > 0 for r in report_rows)


def test_head_dim_256_rows_cover_both_dtypes_in_one_block(report_rows):
    rows = [r for r in report_rows if r.head_dim == 256]
    assert {(r.case.split()[0], r.dtype) for r in rows} == {(k, d) for k in ("extend", "decode") for d in ("bf16", "fp32")}
    assert all("BLOCK_D=256" in r.note for r in rows)  # one power-of-two block, no padded remainder
    assert all("BLOCK_DT=0" in r.note for r in rows if r.case.startswith("extend"))


def test_vision_heads_of_72_and_80_are_not_padded_to_128(report_rows):
    """The towers' head dims run as 64 + 16 columns: 80 dot columns instead of 128 (-37.5% of the
    tensor-core work; 72 wastes 8 of 80 instead of 56 of 128)."""
    rows = [r for r in report_rows if r.case.startswith("varlen") and r.head_dim in (72, 80)]
    assert rows and all("BLOCK_D=64 BLOCK_DT=16" in r.note for r in rows), [r.note for r in rows]


def test_attention_kernels_on_sm90_do_not_spill_use_tensor_cores_and_wide_loads(report_rows):
    for r in report_rows:
        where = f"{r.kernel} {r.case}"
        assert r.spill_bytes == 0, f"{where}: {r.spill_bytes} bytes spilled ({r.registers} registers)"
        assert r.min_load_bits >= 32, f"{where}: sub-word global loads {r.loads}"
        if r.kernel != "_decode_merge_kernel":  # the merge is a weighted sum, no matrix work
            assert r.mma in ("wgmma", "mma.sync"), f"{where}: no tensor-core instruction"
            assert r.max_load_bits == 128, f"{where}: no 128-bit load of q/k/v: {r.loads}"


def test_ptx_mma_operands_names_the_input_types():
    from sgl_kernel.codegen_report import ptx_mma_operands

    assert ptx_mma_operands("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {") == "e4m3.e4m3"
    assert ptx_mma_operands("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == "bf16.bf16"
    assert ptx_mma_operands("fma.rn.f32 %f1, %f2, %f3, %f4;") == ""


def test_fp8_shards_that_start_inside_a_block_keep_finer_scales():
    mod = _load_report()
    assert mod.fp8_linear_shapes("qwen3-vl-4b", 4)["gate_up"] == (4864, 2560, 128, 128)
    # 9728 / 8 = 1216 rows a rank: every other shard starts 64 rows into a 128-block
    assert mod.fp8_linear_shapes("qwen3-vl-4b", 8)["gate_up"] == (2432, 2560, 64, 128)
    assert mod.fp8_linear_shapes("qwen3-vl-4b", 8)["down"] == (2560, 1216, 128, 64)
    assert mod.fp8_linear_shapes("qwen3-vl-32b", 8) == {"qkv": (1280, 5120, 128, 128), "o": (5120, 1024, 128, 128),
                                                        "gate_up": (6400, 5120, 128, 128), "down": (5120, 3200, 128, 128)}


def test_block_fp8_gemm_on_sm90_takes_e4m3_wgmma_without_spills_and_with_wide_loads(report_rows):
    """Both launch shapes (decode-sized and prefill-sized M) at the largest shards and at shards with
    finer scale groups."""
    mod = _load_report()
    cases = [c for c in mod.fp8_gemm_cases(["qwen3-vl-4b", "qwen3-vl-32b"], __import__("torch").bfloat16, tps=(1, 8))
             if c.name.split()[2] in ("gate_up", "down")]
    rows = mod.report(cases, "sm_90a", progress=False)
    assert len(rows) == 16  # qwen3-vl-4b at TP 8 included: 64-row and 64-column scale groups
    for r in rows:
        where = f"{r.kernel} {r.case}"
        assert r.mma == "wgmma" and r.mma_operands == "e4m3.e4m3", f"{where}: {r.mma} {r.mma_operands}"
        assert r.spill_bytes == 0, f"{where}: {r.spill_bytes} bytes spilled ({r.registers} registers)"
        assert r.max_load_bits == 128, f"{where}: no 128-bit load of the e4m3 tiles: {r.loads}"


def test_moe_grouped_gemm_on_sm90_uses_tensor_cores_without_spills_and_with_wide_loads(report_rows):
    """Qwen3-VL-30B-A3B and -235B-A22B experts (E=128, k=8) at TP 1/2/4/8, decode- and prefill-sized: both
    GEMMs (gate_up with SiLU * mul, down with the routing weights) and the router, bf16."""
    mod = _load_report()
    import torch

    cases = mod.build_cases(["moe_gemm", "moe_topk"], list(mod.MOE), [torch.bfloat16])
    rows = mod.report(cases, "sm_90a", progress=False)
    gemms = [r for r in rows if r.case.startswith("moe-gemm")]
    assert len(gemms) == 2 * 4 * 2 * 2 and len(rows) == len(gemms) + 4
    for r in rows:
        where = f"{r.kernel} {r.case}"
        assert r.spill_bytes == 0, f"{where}: {r.spill_bytes} bytes spilled ({r.registers} registers)"
    for r in gemms:
        where = f"{r.kernel} {r.case}"
        assert r.mma in ("wgmma", "mma.sync") and r.mma_operands == "bf16.bf16", f"{where}: {r.mma} {r.mma_operands}"
        assert r.max_load_bits == 128, f"{where}: no 128-bit load of the activation / expert tiles: {r.loads}"
        if "T4096" in r.case:  # 64-row tiles: the Hopper warpgroup MMA
            assert r.mma == "wgmma", where


@pytest.mark.slow  # ~40 s: 32 compiles for sm_90a
def test_moe_fp8_grouped_gemm_on_sm90_compiles_without_spills(report_rows):
    """Block-FP8 experts through the grouped kernel (USE_FP8), both presets at TP 1/2/4/8: 64-row tiles take
    the e4m3 warpgroup MMA; 16-row (decode) tiles mma.sync on f16 operands (e4m3 widened exactly)."""
    mod = _load_report()
    import torch

    rows = mod.report(mod.build_cases(["moe_fp8"], list(mod.MOE), [torch.bfloat16]), "sm_90a", progress=False)
    assert len(rows) == 2 * 4 * 2 * 2
    for r in rows:
        where = f"{r.kernel} {r.case}"
        assert r.spill_bytes == 0 and r.max_load_bits == 128, f"{where}: {r.spill_bytes} spilled, {r.loads}"
        want = ("wgmma", "e4m3.e4m3") if "T4096" in r.case else ("mma.sync", "f16.f16")
        assert (r.mma, r.mma_operands) == want, f"{where}: {r.mma} {r.mma_operands}"


@compiles
def test_cli_writes_json_rows(tmp_path):
    pytest.importorskip("triton", reason="the report compiles with triton")
    mod = _load_report()
    out = tmp_path / "rows.json"
    assert mod.main(["--kernels", "pos_embed", "--presets", "qwen3-vl-8b", "--dtypes", "bfloat16",
                     "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [r["kernel"] for r in rows] == ["_gather_blend_kernel"]
    assert {"kernel", "head_dim", "registers", "spill_bytes", "shared_bytes", "mma", "min_load_bits"} <= set(rows[0])
    assert rows[0]["mma"] == "none"


def test_float32_dots_use_tensor_cores_on_cuda_unless_asked_for_ieee():
    import torch

    from sgl_kernel.attention._common import dot_precision

    assert dot_precision(torch.float32, on_cuda=True) == "tf32"
    assert dot_precision(torch.float32, on_cuda=True, fp32_precision="ieee") == "ieee"
    assert dot_precision(torch.float32, on_cuda=False, fp32_precision="tf32") == "ieee"  # the interpreter is exact
    assert dot_precision(torch.bfloat16, on_cuda=True, fp32_precision="ieee") == "tf32"


def test_unknown_fp32_precision_is_refused_before_any_launch():
    import torch

    from sgl_kernel.attention import varlen_attention_fwd

    q = torch.zeros(4, 2, 16)
    with pytest.raises(ValueError, match="fp32_precision"):
        varlen_attention_fwd(q, q, q, torch.tensor([0, 4]), 4, 0.25, fp32_precision="fp64")


@compiles
def test_bitmask_kernel_on_sm90_loads_128_bit_words_without_spills():
    """The token-bitmask kernel: one 128-bit load of 4 packed words per thread (the engine pads the rows
    to `padded_words`), no spills, and no tensor cores (there is no matrix work in it)."""
    pytest.importorskip("triton", reason="the report compiles with triton")
    from sgl_kernel.codegen_report import ptxas_candidates

    mod = _load_report()
    import torch

    rows = mod.report(mod.bitmask_cases(["qwen3-vl-4b", "qwen2.5-vl-7b"], torch.float32), "sm_90a", progress=False)
    assert [r.case for r in rows] == ["bitmask vocab 151936 rows64", "bitmask vocab 152064 rows64"]
    for r in rows:
        assert r.mma == "none" and r.max_load_bits == 128, f"{r.case}: {r.mma} {r.loads}"
        if ptxas_candidates() and r.registers is not None:
            assert r.spill_bytes == 0, f"{r.case}: {r.spill_bytes} bytes spilled"


GDN_KINDS = ["gdn_chunk", "gdn_recurrent", "conv1d", "conv1d_update"]


def test_gdn_cases_follow_the_presets_heads_and_tp():
    """Qwen3.5's linear-attention shapes per TP rank: heads and conv channels divided by TP (27B: 48 value heads
    over 16 key heads, a GQA ratio of 3); two launches per prefill case, one per decode case."""
    mod = _load_report()
    import torch

    cases = mod.build_cases(GDN_KINDS, list(mod.GDN), [torch.bfloat16])
    assert len(cases) == 3 * 4 * 4 and not mod.build_cases(GDN_KINDS, list(mod.GDN), [torch.float32])
    names = {c.name for c in cases}
    assert "conv1d qwen3.5-4b tp1 Hk16 Hv32 C8192 K4 T8192" in names
    assert "conv1d-update qwen3.5-27b tp8 Hk2 Hv6 C1280 K4 bs64" in names
    assert "gdn-chunk qwen3.5-27b tp1 Hk16 Hv48 T8192" in names
    assert "gdn-recurrent qwen3.5-35b-a3b tp4 Hk4 Hv8 bs64" in names
    assert all(len(c.plans) == (2 if c.name.split()[0] in ("gdn-chunk", "conv1d") else 1) for c in cases)
    chunk = next(c for c in cases if c.name == "gdn-chunk qwen3.5-27b tp8 Hk2 Hv6 T8192")
    assert chunk.plans[0].args["GROUP"] == 3 and chunk.plans[1].constexprs["BT"] == 64


@pytest.fixture(scope="module")
def gdn_rows():
    return _compiled_rows(lambda mod, torch: mod.build_cases(GDN_KINDS, list(mod.GDN), [torch.bfloat16]))


def test_gdn_report_covers_every_preset_tp_and_kernel(gdn_rows):
    assert len(gdn_rows) == 3 * 4 * 6
    assert {r.case.split()[0] for r in gdn_rows} == {"gdn-chunk", "gdn-recurrent", "conv1d", "conv1d-update"}
    assert {(r.case.split()[1], r.case.split()[2]) for r in gdn_rows} == \
        {(p, f"tp{tp}") for p in ("qwen3.5-4b", "qwen3.5-27b", "qwen3.5-35b-a3b") for tp in (1, 2, 4, 8)}
    by_kind = {}
    for r in gdn_rows:
        by_kind.setdefault(r.case.split()[0], set()).add(r.kernel)
    assert by_kind == {"gdn-chunk": {"_gdn_chunk_prepare_kernel", "_gdn_chunk_fwd_kernel"},
                       "gdn-recurrent": {"_gdn_recurrent_kernel"},
                       "conv1d": {"_conv1d_fwd_kernel", "_conv1d_edge_kernel"},
                       "conv1d-update": {"_conv1d_update_kernel"}}


def test_gdn_chunk_kernels_on_sm90_use_tensor_cores_without_spills_and_with_wide_loads(gdn_rows):
    """Both launches of the chunked prefill (the UT transform of every chunk; the sequential pass over each
    sequence's chunks with the state carried): warpgroup MMA on tf32 operands, no spills, 128-bit loads."""
    rows = [r for r in gdn_rows if r.case.startswith("gdn-chunk")]
    assert len(rows) == 24
    for r in rows:
        where = f"{r.kernel} {r.case}"
        assert r.spill_bytes == 0, f"{where}: {r.spill_bytes} bytes spilled ({r.registers} registers)"
        assert r.mma == "wgmma" and r.mma_operands == "tf32.tf32", f"{where}: {r.mma} {r.mma_operands}"
        assert r.max_load_bits == 128, f"{where}: no 128-bit load: {r.loads}"
    # the sequential kernel's q, k, W, U tiles are copied asynchronously, 16 bytes at a time, into shared memory
    assert all(r.loads.get("cp.async 128", 0) > 0 for r in rows if r.kernel == "_gdn_chunk_fwd_kernel")


def test_gdn_recurrent_and_conv_kernels_on_sm90_do_not_spill_and_load_128_bits(gdn_rows):
    """The decode step (state tiles of Dk x 32 float32), the prefill conv (x tiles, then each sequence's edge
    rows and new state) and the decode conv: no spills, no tensor cores (no matrix work), and the bulk of
    their traffic (state rows, x rows) in 128-bit loads; the (C, K-1) conv state's 3-element rows load
    element-wise (16-bit in bf16)."""
    rows = [r for r in gdn_rows if not r.case.startswith("gdn-chunk")]
    assert len(rows) == 48
    for r in rows:
        where = f"{r.kernel} {r.case}"
        assert r.spill_bytes == 0, f"{where}: {r.spill_bytes} bytes spilled ({r.registers} registers)"
        assert r.mma == "none", where
        assert r.max_load_bits == 128, f"{where}: no 128-bit load: {r.loads}"
    assert all(r.min_load_bits >= 32 for r in rows if r.kernel == "_conv1d_fwd_kernel"), "x rows load scalar"
