"""Next-token sampling: the engine's torch path (`sglang.srt.layers.sampler.sample_torch`) against the
one-launch Triton kernel (`sgl_kernel.sampling.sample_from_logits`), on float32 (B, vocab) logits at a
Qwen3 vocabulary, for three parameter mixes: plain (temperature 0.7), min-p 0.05, and top-k 20 + top-p 0.8.

Each row reports the number of passes over the (B, vocab) block (aten ops reading or writing it, views and
allocations left out; a kernel launch counts as one) and the time per sampling step (CUDA: mean over the
timed steps; CPU: the fastest of them). On CUDA both paths are timed and their ids compared first;
elsewhere only the torch path is timed (the Triton interpreter would take minutes) and the kernel's figure
is its pass count.

  python benchmark/kernels/sampling/bench_sampling.py [--batch-sizes 1,64,160] [--vocab 151936] [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from sgl_kernel.benchmarking import timed_ms
from sglang.srt.layers.sampler import Sampler, SamplingBatchInfo, sample_torch
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.testing.op_count import count_large_passes

MIXES = {
    "plain": dict(temperature=0.7),
    "min_p": dict(temperature=0.7, min_p=0.05),
    "top_k_top_p": dict(temperature=0.7, top_k=20, top_p=0.8),
}


def _metadata_only(name: str) -> bool:
    if name.startswith("empty"):
        return True
    packet = getattr(torch.ops.aten, name)
    return any(getattr(packet, o).is_view for o in packet.overloads())


def _batch(b: int, v: int, mix: str, device: str):
    g = torch.Generator().manual_seed(b)
    logits = (torch.randn(b, v, generator=g) * 3).to(device)
    params = [SamplingParams(**MIXES[mix])] * b
    info = SamplingBatchInfo.from_params(params, [None] * b, v, device, list(range(b)), random.Random(0))
    return logits, info


def torch_passes(mix: str) -> int:
    logits, info = _batch(4, 1000, mix, "cpu")
    _, _, ops = count_large_passes(lambda: sample_torch(logits, info), logits.numel(), by_op=True)
    return sum(c for name, c in ops.items() if not _metadata_only(name))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="1,64,160")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--iters", type=int, default=0, help="timed steps per row (default 50 on CUDA, 5 on CPU)")
    ap.add_argument("--out", default=None, help="also write the rows as JSON lines here")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    iters = args.iters or (50 if cuda else 5)
    kernel = Sampler(0, backend="triton") if cuda else None
    rows = []
    print(f"device {torch.cuda.get_device_name() if cuda else f'cpu ({torch.get_num_threads()} threads)'}, "
          f"vocab {args.vocab}, {iters} timed steps per row")
    print(f"{'batch':>6} {'mix':>12} {'torch passes':>13} {'kernel passes':>14} {'torch ms':>10} {'kernel ms':>10}"
          f" {'speedup':>8}")
    for mix in args.mixes.split(","):
        passes = torch_passes(mix)
        for b in (int(x) for x in args.batch_sizes.split(",")):
            logits, info = _batch(b, args.vocab, mix, device)
            row = dict(batch=b, vocab=args.vocab, mix=mix, device=device, torch_passes=passes, kernel_passes=1)
            if kernel is not None:
                want = sample_torch(logits, info)
                got = kernel(logits, info)
                row["ids_equal"] = float((got == want).float().mean())
                row["kernel_ms"] = timed_ms(lambda: kernel(logits, info), iters, cuda)
            row["torch_ms"] = timed_ms(lambda: sample_torch(logits, info), iters, cuda)
            rows.append(row)
            k_ms, t_ms = row.get("kernel_ms"), row["torch_ms"]
            k_txt = f"{k_ms:.3f}" if k_ms is not None else "-"
            ratio = f"{t_ms / k_ms:.1f}x" if k_ms else "-"
            print(f"{b:>6} {mix:>12} {passes:>13} {1:>14} {t_ms:>10.2f} {k_txt:>10} {ratio:>8}")
            del logits, info
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
