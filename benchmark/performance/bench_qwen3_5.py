"""Qwen3.5 against Qwen3-VL at the 4B size: what a fixed KV budget holds, and one static batch's prefill
and decode time on shape-true replicas cut to a few decoder layers.

    python benchmark/performance/bench_qwen3_5.py [--layers 4] [--budget-gib 40] [--rows 128] [--json FILE]

1. Capacity, full depth (from the presets, the formulas the model runner sizes its pools with; checked
   against the pools of the replicas it loads): KV bytes per token, recurrent-state bytes per request
   row, and the tokens that fit in `--budget-gib` once `--rows` rows and as many prefix-cache snapshots
   are set aside (the server's default: one snapshot slot per row).
2. Speed, `--layers`-layer replicas (every width and the vision tower as released), written by
   make_model, each run by `python -m sglang.bench_one_batch` in its own process: prefill ms and decode
   ms per step for `--batch-size` requests of one image and a short question.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from sglang.testing.make_model import make_model
from sglang.testing.presets import get_preset, with_text_layers

PAIR = ("qwen3-vl-4b", "qwen3.5-4b")


def capacity(preset, budget: int, rows: int, dtype_bytes: int = 2) -> dict:
    """Per-token KV and per-row state bytes of the full-depth preset on one rank, and the KV tokens left in
    `budget` after `rows` rows plus as many snapshots (hybrid models only)."""
    t = get_preset(preset).text
    linear = getattr(t, "linear", None)
    kv_layers = t.num_hidden_layers if linear is None else linear.layer_types.count("full_attention")
    kv = 2 * kv_layers * t.num_key_value_heads * t.head_dim * dtype_bytes
    state = 0
    if linear is not None:
        n = linear.layer_types.count("linear_attention")
        conv_dim = 2 * linear.num_key_heads * linear.key_head_dim + linear.num_value_heads * linear.value_head_dim
        conv = conv_dim * (linear.conv_kernel - 1) * dtype_bytes
        recurrent = linear.num_value_heads * linear.key_head_dim * linear.value_head_dim * 4  # float32
        state = n * (conv + recurrent)
    reserved = 2 * rows * state
    return {"kv_layers": kv_layers, "layers": t.num_hidden_layers, "kv_bytes_per_token": kv,
            "state_bytes_per_row": state, "state_reserved_gib": round(reserved / 2**30, 2),
            "kv_tokens": max(0, budget - reserved) // kv, "kv_tokens_without_state": budget // kv}


def check_against_runner(model_dir: Path, cut) -> None:
    """The capacity formulas give the pools the model runner builds for the replica (bfloat16)."""
    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig

    runner = ModelRunner(ModelRunnerConfig(model_path=str(model_dir), dtype="bfloat16", max_total_tokens=1024,
                                           max_running_requests=2))
    want = capacity(cut, 0, 0)
    assert runner.token_to_kv_pool.bytes_per_token() == want["kv_bytes_per_token"], (cut.name, want)
    got_state = runner.state_pool.bytes_per_request() if runner.state_pool is not None else 0
    assert got_state == want["state_bytes_per_row"], (cut.name, got_state, want)


def run_one_batch(model_dir: Path, batch: int, output_len: int, dtype: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "sglang.bench_one_batch", "--model-path", str(model_dir),
                          "--dtype", dtype, "--batch-size", str(batch), "--output-len", str(output_len), "--json"],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: r[k] for k in ("input_len", "prefill_ms", "decode_ms_per_step", "load_s")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the speed replicas (default 4)")
    ap.add_argument("--budget-gib", type=float, default=40.0, help="KV + state budget per rank (default 40)")
    ap.add_argument("--rows", type=int, default=128, help="request rows the state pool holds (default 128)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--workdir", default=None, help="where the replicas are written (default: a temporary dir)")
    ap.add_argument("--json", default=None, help="also write the summary here")
    args = ap.parse_args(argv)

    budget = int(args.budget_gib * 2**30)
    summary = {"budget_gib": args.budget_gib, "rows": args.rows, "capacity": {}, "speed": {}}
    for p in PAIR:
        summary["capacity"][p] = capacity(p, budget, args.rows)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_qwen3_5_"))
    for p in tqdm(PAIR, desc="replicas", unit="model"):
        cut = with_text_layers(p, args.layers)
        d = make_model(cut, work / f"{p}-{args.layers}l", seed=0, dtype=args.dtype, progress=False)
        check_against_runner(Path(d), cut)
        summary["speed"][f"{p}-{args.layers}l"] = run_one_batch(Path(d), args.batch_size, args.output_len, args.dtype)
    a, b = (summary["capacity"][p]["kv_tokens"] for p in PAIR)
    summary["kv_tokens_ratio"] = round(b / a, 2) if a else None
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
