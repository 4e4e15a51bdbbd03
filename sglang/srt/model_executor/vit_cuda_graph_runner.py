"""ViT CUDA graphs at token budgets (`SGLANG_VIT_ENABLE_CUDA_GRAPH=1`).

A vision tower launches ~20 kernels per layer; at small batches the launches, not the math, set its
time. The tower is captured once per token-budget bucket and replayed for any batch that fits:

- the batch's patches are padded with zero rows up to the bucket (a multiple of the merge window);
- the padding forms attention segments of its own (pieces of at most PAD_PIECE rows: one long padding
  segment would cost attention quadratic in its length, more than the images at the larger buckets), and
  the segment table is filled up with empty segments to a fixed count, so attention (limited by the
  segment table) never mixes padding with an image: real rows come out exactly as unpadded, and the
  padded merged rows are dropped;
- position embeddings and rotary tables are computed outside the graph (host-driven gathers) and copied
  into the bucket's buffers with the patches and the segment table.

Batches larger than the largest bucket, or with more segments than the table holds, run eagerly. Without
CUDA the same padded path runs eagerly (no capture): that is how the CPU tests prove that bucketing and
padding leave the output unchanged. Qwen3-VL's tower (and the MoE models sharing it) only: Qwen2.5-VL's
windowed layers reorder tokens per window and run eagerly."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang.srt.layers.attention.vision_attention import VisionSegments
from sglang.srt.layers.vision_blocks import image_cu_seqlens

logger = logging.getLogger(__name__)

# steps of at most 1.5x: padding adds at most half a batch, a fifth on average
DEFAULT_BUCKETS = (512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
DEFAULT_MAX_SEGMENTS = 64  # real segments (images, video frames) a graph takes; more run eagerly
PAD_PIECE = 256


def token_buckets(spec: str | None, unit: int) -> tuple[int, ...]:
    """Bucket sizes in patches from a comma list (None: DEFAULT_BUCKETS), each rounded up to `unit` (the
    merge window: merged rows must not straddle the padding), sorted, deduplicated."""
    raw = DEFAULT_BUCKETS if not spec else tuple(int(x) for x in spec.split(",") if x.strip())
    if not raw or min(raw) <= 0:
        raise ValueError(f"ViT CUDA graph buckets must be positive patch counts, got {spec!r}")
    return tuple(sorted({-(-b // unit) * unit for b in raw}))


def pick_bucket(num_patches: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding `num_patches`, None when none does (the batch runs eagerly)."""
    return next((b for b in buckets if b >= num_patches), None)


def segment_slots(bucket: int, max_segments: int) -> int:
    """Entries - 1 of a bucket's segment table: the real segments and the padding's pieces."""
    return max_segments + -(-bucket // PAD_PIECE)


def padded_segments(cu: list[int], bucket: int, slots: int) -> list[int]:
    """`cu` (real segments over the first cu[-1] rows) extended to exactly slots + 1 entries: the rows
    cu[-1]..bucket in segments of at most PAD_PIECE rows, then empty segments at `bucket`."""
    out = list(cu)
    out += range(out[-1] + PAD_PIECE, bucket, PAD_PIECE)
    if bucket > out[-1]:
        out.append(bucket)
    if len(out) > slots + 1:
        raise ValueError(f"{len(out) - 1} segments exceed the graph's {slots}")
    return out + [bucket] * (slots + 1 - len(out))


@dataclass
class _Bucket:
    pixels: torch.Tensor
    pos: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    cu: torch.Tensor
    out: torch.Tensor | None = None
    graph: object | None = None


class ViTCudaGraphRunner:
    """Runs `tower.forward_embedded` on per-bucket static buffers; on CUDA (`capture=True`) each bucket's
    forward is captured on first use and replayed after."""

    def __init__(self, tower, buckets: tuple[int, ...], max_segments: int = DEFAULT_MAX_SEGMENTS,
                 capture: bool = True):
        self.tower = tower
        self.unit = tower.merge**2
        self.buckets = buckets
        self.max_segments = max_segments
        self.capture = capture
        self._bufs: dict[int, _Bucket] = {}
        self._pool = None
        self.replays = 0  # graph replays (CUDA) or padded eager runs (no capture); eager fallbacks not counted
        self.captures = 0
        self.fallbacks = 0  # calls no bucket fits (run eagerly, unpadded)
        self.by_bucket: dict[int, int] = {}

    def __call__(self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        n = pixel_values.shape[0]
        cu = image_cu_seqlens(grid_thw)
        bucket = pick_bucket(n, self.buckets)
        if bucket is None or len(cu) - 1 > self.max_segments:
            self.fallbacks += 1
            return self.tower(pixel_values, grid_thw)
        buf = self._buffers(bucket, pixel_values)
        cos, sin = self.tower.rotary_cos_sin(grid_thw, pixel_values.device)
        buf.pixels[:n].copy_(pixel_values)
        buf.pixels[n:].zero_()
        buf.pos[:n].copy_(self.tower.pos_embeds(grid_thw, buf.pos.dtype))
        buf.pos[n:].zero_()
        buf.cos[:n].copy_(cos)
        buf.cos[n:].fill_(1.0)
        buf.sin[:n].copy_(sin)
        buf.sin[n:].zero_()
        seg = padded_segments(cu, bucket, segment_slots(bucket, self.max_segments))
        buf.cu.copy_(torch.tensor(seg, dtype=torch.int32), non_blocking=True)
        self.replays += 1
        self.by_bucket[bucket] = self.by_bucket.get(bucket, 0) + 1
        if not self.capture:
            segments = VisionSegments(buf.cu, bucket, tuple(seg))
            return self.tower.forward_embedded(buf.pixels, buf.pos, buf.cos, buf.sin, segments)[: n // self.unit]
        if buf.graph is None:
            self._capture(bucket, buf)
        buf.graph.replay()
        return buf.out[: n // self.unit].clone()  # the next replay overwrites the static output

    def stats(self) -> dict:
        """What ran through the runner (observable: a runner attached but bypassed stays at zero)."""
        return {"replays": self.replays, "captures": self.captures, "fallbacks": self.fallbacks,
                "captured": self.capture, "by_bucket": {str(b): n for b, n in sorted(self.by_bucket.items())}}

    def _buffers(self, bucket: int, pixel_values: torch.Tensor) -> _Bucket:
        if bucket not in self._bufs:
            dev, dtype = pixel_values.device, self.tower.dtype
            rot = self.tower.rotary_cos_sin([(1, self.tower.merge, self.tower.merge)], dev)[0].shape[-1]
            self._bufs[bucket] = _Bucket(
                pixels=torch.zeros(bucket, pixel_values.shape[1], dtype=pixel_values.dtype, device=dev),
                pos=torch.zeros(bucket, self.tower.cfg.hidden_size, dtype=dtype, device=dev),
                cos=torch.ones(bucket, rot, dtype=torch.float32, device=dev),
                sin=torch.zeros(bucket, rot, dtype=torch.float32, device=dev),
                cu=torch.zeros(segment_slots(bucket, self.max_segments) + 1, dtype=torch.int32, device=dev),
            )
        return self._bufs[bucket]

    def _capture(self, bucket: int, buf: _Bucket) -> None:
        """Warm up on a side stream (Triton compiles, allocator settles), then capture into one memory
        pool shared by every bucket (only one bucket runs at a time)."""
        segments = VisionSegments(buf.cu, bucket, None)
        run = lambda: self.tower.forward_embedded(buf.pixels, buf.pos, buf.cos, buf.sin, segments)  # noqa: E731
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            run()
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool), torch.no_grad():
            buf.out = run()
        buf.graph = graph
        self.captures += 1
        logger.info("captured the ViT CUDA graph for %d patches", bucket)
