"""The built-in stages' steps of ``scripts/gpu_check.sh``: ``tests``, ``first``, ``anchor`` and ``hybrid``
(standard library only). The other stages read their commands from the benchmark lists; the plan, the
budgets and the CLI are ``gpu_check_plan.py``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded by file path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_step import Step  # noqa: E402


def tests_steps() -> list[Step]:
    # The 1,000-request CUDA IPC e2e is gpu-marked; the suite part is the device-following tests
    # (model parity on cuda, server fixtures with --device cuda, NCCL start-up, scheduler e2e).
    return [
        Step("tests: gpu-marked", 180,
             '"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/junit-gpu-marked.xml" '
             "test sgl-kernel/tests",
             pytest=True, outputs=("junit-gpu-marked.xml",)),
        Step("tests: suite on cuda", 320,
             '"$PYTHON" -m pytest -q -x -p no:cacheprovider -m "not slow" --junitxml="$OUT/junit-cuda.xml" '
             "test/unit/models test/unit/model_loader test/unit/layers test/e2e",
             pytest=True, outputs=("junit-cuda.xml",)),
    ]


# the short replica of stage first: qwen3-vl-4b's widths and vision tower, 4 of its 36 text layers
FIRST_MODEL = '"$GPU_CACHE/models/qwen3-vl-4b-4l"'


def first_steps() -> list[Step]:
    """Stage `first`, in the order of what a first GPU call must answer: are the kernels and the engine
    right on CUDA, how fast is a forward against its floor, how fast does it serve, how fast are the
    attention kernels at the real shapes."""
    junit = '--junitxml="$OUT/junit-first-{}.xml"'
    return [
        Step("first: kernels", 100,
             '"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider ' + junit.format("kernels")
             + " sgl-kernel/tests test/unit/layers/test_vision_pos_embed.py "
               "test/unit/model_executor/test_cuda_graph_runner.py test/unit/model_executor/test_vit_cuda_graph_runner.py",
             pytest=True, outputs=("junit-first-kernels.xml",),
             display="gpu-marked kernel tests against their references (attention, sampling, pos-embed, "
                     "fp8/MoE when present), decode and ViT CUDA graph runners"),
        Step("first: parity", 100,
             '"$PYTHON" -m pytest -q -x -p no:cacheprovider -m "not slow" ' + junit.format("parity")
             + " test/unit/models/test_model_parity.py test/e2e/test_openai_api.py "
               '-k "test_model_parity or (greedy_chat_matches_transformers and default) or stream_equals"',
             pytest=True, outputs=("junit-first-parity.xml",),
             display="model parity with transformers on cuda; greedy chat parity through the server on "
                     "qwen3-vl-tiny (CUDA graphs on)"),
        Step("first: replica", 45,
             '"$PYTHON" -m sglang.testing.make_model --preset qwen3-vl-4b --num-layers 4 --dtype bfloat16 '
             f"--out {FIRST_MODEL} --no-progress",
             display="qwen3-vl-4b with 4 text layers (real widths, full vision tower), bf16"),
        Step("first: forward", 75,
             f'"$PYTHON" benchmark/performance/bench_forward.py --model-path {FIRST_MODEL} --device cuda '
             '--dtype bfloat16 --decode-batch-sizes 1,32,64 --repeat 2 --output "$RAW/first-forward.json"',
             display="decode step vs the bandwidth floor, prefill tok/s and MFU, ViT MFU"),
        Step("first: serving", 90,
             f'"$PYTHON" benchmark/multimodal/run_hash_serving_ab.py --modes on --model-path {FIRST_MODEL} '
             "--device cuda --dtype bfloat16 --num-prompts 384 --max-concurrency 16 --random-input-len 128 "
             '--random-output-len 64 --warmup 4 --output "$RAW/first-serving.json"',
             display="image chat (one 1280x720 JPEG each), concurrency 16: req/s, TTFT"),
        Step("first: attention", 35,
             '"$PYTHON" sgl-kernel/benchmark/bench_attention.py --shapes report --iters 10 '
             '--out "$RAW/first-attention.jsonl"',
             display="Triton decode and extend attention vs SDPA at every preset's text shape"),
    ]


# full-depth replicas of stage anchor: config, tokenizer and processor files only; weights made on the GPU
ANCHOR_8B = '"$GPU_CACHE/models/qwen3-vl-8b-config"'
ANCHOR_4B = '"$GPU_CACHE/models/qwen3-vl-4b-config"'
# the #36411 shape as far as it is published (unique 1280x720-class images, Qwen3-VL, one H100), with
# upstream's usual image-benchmark lengths (128 in, 256 out), scaled in count to fit the call
ANCHOR_SERVING = ("--device cuda --dtype bfloat16 --num-prompts 256 --max-concurrency 64 --random-input-len 128 "
                  "--random-output-len 256 --warmup 8")


def anchor_steps() -> list[Step]:
    """Stage `anchor`, most valuable first: the decode step and the ViT of a full-depth 8B against their
    floors, then serving with the overlap scheduler on and off (the A/B), then the seed-002 4B workload."""
    dummy = "--server-args '--load-format dummy{}'"
    return [
        Step("anchor: configs", 15,
             f'"$PYTHON" -m sglang.testing.make_model --preset qwen3-vl-8b --config-only --out {ANCHOR_8B} && '
             f'"$PYTHON" -m sglang.testing.make_model --preset qwen3-vl-4b --config-only --out {ANCHOR_4B}',
             fatal=True, display="qwen3-vl-8b and qwen3-vl-4b config, tokenizer and processor files (no weights)"),
        Step("anchor: forward", 130,
             f'"$PYTHON" benchmark/performance/bench_forward.py --model-path {ANCHOR_8B} --load-format dummy '
             "--device cuda --dtype bfloat16 --decode-batch-sizes 1,32,128 --prefill-batch-sizes 1 --vit-images 20 "
             '--vit-image-size 960x1280 --mm-attention-backends triton,sdpa --repeat 2 --output "$RAW/anchor-forward.json"',
             display="full-depth qwen3-vl-8b (dummy bf16): decode ms at batch 1/32/128 vs the bandwidth floor; "
                     "ViT MFU on 20 x 960x1280 under the triton and sdpa ViT attention (head_dim 72)"),
        Step("anchor: serving overlap", 110,
             f'"$PYTHON" benchmark/multimodal/run_hash_serving_ab.py --modes on --model-path {ANCHOR_8B} '
             f'{dummy.format("")} {ANCHOR_SERVING} --output "$RAW/anchor-serving-overlap.json"',
             display="#36411-shaped image serving on qwen3-vl-8b: req/s, TTFT median and p99, overlap scheduler on"),
        Step("anchor: serving no overlap", 110,
             f'"$PYTHON" benchmark/multimodal/run_hash_serving_ab.py --modes on --model-path {ANCHOR_8B} '
             f'{dummy.format(" --disable-overlap-schedule")} {ANCHOR_SERVING} '
             '--output "$RAW/anchor-serving-no-overlap.json"',
             display="the same with --disable-overlap-schedule (the A/B)"),
        Step("anchor: seed-002 4B", 80,
             f'"$PYTHON" benchmark/multimodal/run_hash_serving_ab.py --modes on --model-path {ANCHOR_4B} '
             f'{dummy.format("")} {ANCHOR_SERVING} --output "$RAW/anchor-serving-4b.json"',
             display="the seed-002 workload on a full-depth qwen3-vl-4b (dummy), if time is left"),
    ]


HYBRID_4B = '"$GPU_CACHE/models/qwen3.5-4b-4l-config"'


def hybrid_steps() -> list[Step]:
    return [
        Step("hybrid: kernel tests", 150,
             '"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/junit-hybrid-kernels.xml" '
             "sgl-kernel/tests/test_gdn_chunk_kernel.py sgl-kernel/tests/test_gdn_recurrent_kernel.py "
             "sgl-kernel/tests/test_gdn_conv_kernel.py",
             pytest=True, outputs=("junit-hybrid-kernels.xml",),
             display="the Gated DeltaNet kernels in bf16 at Qwen3.5 shapes, and the decode step under CUDA-graph "
                     "capture against eager"),
        Step("hybrid: decode graphs", 80,
             '"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/junit-hybrid-graphs.xml" '
             "test/unit/model_executor/test_hybrid_decode_graph.py",
             pytest=True, outputs=("junit-hybrid-graphs.xml",),
             display="qwen3.5-tiny decode through captured CUDA graphs (GDN state slots as graph inputs, padding "
                     "to the pool's padding row) against eager: tokens and states, float32 then bf16"),
        Step("hybrid: bench_gdn", 120,
             '"$PYTHON" sgl-kernel/benchmark/bench_gdn.py --presets qwen3.5-4b,qwen3.5-27b --tps 1,8 '
             '--out "$RAW/hybrid-gdn.jsonl"',
             display="chunk kernel TFLOP/s, recurrent step GB/s against the bandwidth floor"),
        Step("hybrid: one batch", 90,
             f'"$PYTHON" -m sglang.testing.make_model --preset qwen3.5-4b --num-layers 4 --config-only --out {HYBRID_4B} '
             f'&& "$PYTHON" -m sglang.bench_one_batch --model-path {HYBRID_4B} --load-format dummy --device cuda '
             '--dtype bfloat16 --batch-size 4 --output-len 16 --json > "$RAW/hybrid-one-batch.json"',
             display="bench_one_batch on a 4-layer qwen3.5-4b replica (dummy bf16 weights): prefill and decode ms"),
    ]

