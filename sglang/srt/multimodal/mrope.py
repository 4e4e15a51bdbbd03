"""M-RoPE (multimodal rotary position) indices for Qwen2-VL / Qwen2.5-VL / Qwen3-VL.

``compute_mrope_positions`` reproduces transformers' ``get_rope_index`` (v5.x) for a
single, unpadded sequence:

* text tokens get the same position in all three rows, counting up by one;
* the tokens of one image / video frame block get ``(t, h, w)`` grid indices of the
  merged grid, each offset by the position where the block starts;
* after a vision block, the next position is ``start + max(h, w) // merge``
  (transformers 5.x).  For images (t == 1) this equals ``max(block positions) + 1``,
  the rule used by transformers 4.x / the original Qwen code; the two differ only
  for Qwen2/2.5-VL videos whose scaled temporal extent exceeds the spatial one, and
  ``text_start_after_vision="max"`` selects the 4.x rule for those.

Model differences:

* ``qwen2_5_vl``: video temporal indices are ``floor(i * tokens_per_second *
  second_per_grid_t)`` (computed in float32 like the reference); images are not scaled.
* ``qwen2_vl``: video temporal indices are ``i`` (no scaling).
* ``qwen3_vl`` (and ``qwen3_vl_moe``): every video is split into single frames
  (``t`` grids of ``(1, h, w)``), as frames are separated by timestamp text.

The delta follows transformers' ``rope_deltas``: ``max(positions) + 1 - seq_len``;
the token at absolute index ``i >= seq_len`` has position ``i + delta`` in all rows.

Only numpy / torch tensors are used here (no model code).
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch

# Qwen3.5 (and its MoE) places images and videos exactly as Qwen3-VL does (its processor and rope index
# are Qwen3-VL's); only the special token ids differ, and those are read from config.json
QWEN3_VL_MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
QWEN2_5_VL_MODEL_TYPES = ("qwen2_5_vl",)
QWEN2_VL_MODEL_TYPES = ("qwen2_vl",)
SUPPORTED_MROPE_MODEL_TYPES = QWEN3_VL_MODEL_TYPES + QWEN2_5_VL_MODEL_TYPES + QWEN2_VL_MODEL_TYPES

# transformers' Qwen2_5_VLVisionConfig default (real checkpoints set 2 in config.json).
DEFAULT_TOKENS_PER_SECOND = 4


class MRopeError(ValueError):
    """The input ids and the vision grids do not fit together."""


def _to_int_list(x) -> list[int]:
    if isinstance(x, torch.Tensor):
        return x.reshape(-1).tolist()
    if isinstance(x, np.ndarray):
        return x.reshape(-1).tolist()
    return [int(v) for v in x]


def _grid_list(grids) -> list[tuple[int, int, int]]:
    if grids is None:
        return []
    if isinstance(grids, (torch.Tensor, np.ndarray)):
        grids = grids.tolist()
    out = []
    for g in grids:
        g = _to_int_list(g)
        if len(g) != 3:
            raise MRopeError(f"grid_thw entries must have 3 values (t, h, w), got {g}")
        out.append((int(g[0]), int(g[1]), int(g[2])))
    return out


def _vision_block_positions(
    start: int, t: int, h: int, w: int, temporal: np.ndarray
) -> np.ndarray:
    """(3, t*h*w) positions for a merged grid of (t, h, w); ``temporal`` holds t offsets."""
    n = t * h * w
    pos = np.empty((3, n), dtype=np.int64)
    pos[0] = np.repeat(temporal, h * w) + start
    pos[1] = np.tile(np.repeat(np.arange(h, dtype=np.int64), w), t) + start
    pos[2] = np.tile(np.arange(w, dtype=np.int64), t * h) + start
    return pos


def _video_blocks(videos, model_type: str, tokens_per_second, second_per_grid_ts) -> list:
    """Per video block: (grid, temporal offsets before adding the start position). Qwen3-VL gives every
    frame group its own block with timestamps in the text; Qwen2.5-VL steps time by tokens_per_second;
    Qwen2-VL by one per temporal patch."""
    video_blocks: list[tuple[tuple[int, int, int], np.ndarray]] = []
    if model_type in QWEN3_VL_MODEL_TYPES:
        for t, h, w in videos:
            for _ in range(t):
                video_blocks.append(((1, h, w), np.zeros(1, dtype=np.int64)))
    elif model_type in QWEN2_5_VL_MODEL_TYPES:
        tps = DEFAULT_TOKENS_PER_SECOND if tokens_per_second is None else tokens_per_second
        if second_per_grid_ts is not None:
            secs = _to_float_list(second_per_grid_ts)
            if len(secs) < len(videos):
                raise MRopeError(
                    f"second_per_grid_ts has {len(secs)} entries but there are {len(videos)} videos"
                )
        else:
            secs = None
        for vi, (t, h, w) in enumerate(videos):
            if secs is None:
                # reference: integer tokens_per_second * 1 -> exact integer steps
                step = tps * 1
                if float(step).is_integer():
                    temporal = np.arange(t, dtype=np.int64) * int(step)
                else:
                    temporal = (np.arange(t, dtype=np.float32) * np.float32(step)).astype(np.int64)
            else:
                # reference: tokens_per_second * float32 tensor -> float32 interval;
                # arange(t) * interval in float32, then truncated to int64.
                interval = np.float32(np.float32(tps) * np.float32(secs[vi]))
                temporal = (np.arange(t, dtype=np.float32) * interval).astype(np.int64)
            video_blocks.append(((t, h, w), temporal))
    else:  # qwen2_vl
        for t, h, w in videos:
            video_blocks.append(((t, h, w), np.arange(t, dtype=np.int64)))
    return video_blocks


def _fill_positions(positions, ids, token_type, images, video_blocks, m: int, image_token_id: int,
                    num_videos: int, text_start_after_vision: str) -> tuple[int, int]:
    """Fills `positions` run by run: text runs count on, a placeholder run is split into its images (or
    video blocks) by their token counts. Returns how many images and video blocks were placed."""
    n = int(ids.shape[0])
    if n:  # run boundaries of equal token type
        change = np.flatnonzero(np.diff(token_type)) + 1
        starts = np.concatenate(([0], change))
        ends = np.concatenate((change, [n]))
    else:
        starts = ends = np.zeros(0, dtype=np.int64)
    img_i = 0
    vid_i = 0
    cur = 0
    for s, e in zip(starts.tolist(), ends.tolist()):
        kind = int(token_type[s])
        if kind == 0:
            positions[:, s:e] = np.arange(cur, cur + (e - s), dtype=np.int64)
            cur += e - s
            continue
        pos = s
        while pos < e:
            if kind == 1:
                if img_i >= len(images):
                    raise MRopeError(
                        f"more image placeholder tokens than images: {int((ids == image_token_id).sum())} "
                        f"image tokens but only {len(images)} image grid(s)"
                    )
                t, h, w = images[img_i]
                temporal = np.arange(t // 1, dtype=np.int64)  # images: time_interval 1
                img_i += 1
                what = f"image {img_i - 1}"
            else:
                if vid_i >= len(video_blocks):
                    raise MRopeError(
                        f"more video placeholder tokens than video grids ({num_videos} video(s))"
                    )
                (t, h, w), temporal = video_blocks[vid_i]
                vid_i += 1
                what = f"video block {vid_i - 1}"
            if h % m or w % m:
                raise MRopeError(f"{what}: grid (t={t}, h={h}, w={w}) is not divisible by merge size {m}")
            lh, lw = h // m, w // m
            count = t * lh * lw
            if count <= 0:
                raise MRopeError(f"{what}: empty grid (t={t}, h={h}, w={w})")
            if pos + count > e:
                raise MRopeError(
                    f"{what} needs {count} placeholder tokens (grid t={t}, h={h}, w={w}, merge={m}) but only "
                    f"{e - pos} remain in the placeholder run at [{s}, {e})"
                )
            block = _vision_block_positions(cur, t, lh, lw, temporal)
            positions[:, pos : pos + count] = block
            if text_start_after_vision == "grid":
                cur += max(h, w) // m
            else:
                cur = int(block.max()) + 1
            pos += count
    return img_i, vid_i


def compute_mrope_positions(
    input_ids,
    image_grid_thw=None,
    spatial_merge_size: int = 2,
    image_token_id: int = 151655,
    video_token_id: int = 151656,
    vision_start_token_id: int | None = 151652,
    model_type: str = "qwen3_vl",
    tokens_per_second: float | None = None,
    second_per_grid_ts: Sequence[float] | None = None,
    video_grid_thw=None,
    text_start_after_vision: Literal["grid", "max"] = "grid",
) -> tuple[torch.Tensor, int]:
    """Compute the ``(3, seq_len)`` int64 M-RoPE positions and the decode delta.

    Args:
        input_ids: the request's (expanded) token ids: list, numpy array or 1-D tensor.
        image_grid_thw: per-image ``(t, h, w)`` in patches (before merge), in order.
        spatial_merge_size: the vision tower's spatial merge size.
        image_token_id / video_token_id: placeholder token ids.
        vision_start_token_id: accepted for API compatibility; transformers 5.x
            locates vision blocks by token type, not by this token.
        model_type: ``"qwen3_vl"``, ``"qwen3_vl_moe"``, ``"qwen2_5_vl"`` or ``"qwen2_vl"``.
        tokens_per_second: Qwen2.5-VL ``vision_config.tokens_per_second`` (videos only).
        second_per_grid_ts: Qwen2.5-VL seconds per temporal grid, one per video.
        video_grid_thw: per-video ``(t, h, w)``.
        text_start_after_vision: ``"grid"`` (transformers 5.x) or ``"max"`` (4.x / original).

    A run of consecutive placeholder tokens may hold several images back to back;
    it is split by each grid's token count. Mismatches raise :class:`MRopeError`.
    """
    del vision_start_token_id  # not needed (see docstring)
    if model_type not in SUPPORTED_MROPE_MODEL_TYPES:
        raise MRopeError(
            f"unsupported model_type {model_type!r} for M-RoPE; expected one of {SUPPORTED_MROPE_MODEL_TYPES}"
        )
    if text_start_after_vision not in ("grid", "max"):
        raise MRopeError(f"text_start_after_vision must be 'grid' or 'max', got {text_start_after_vision!r}")
    m = int(spatial_merge_size)
    ids = np.asarray(_to_int_list(input_ids), dtype=np.int64)
    n = int(ids.shape[0])

    images = _grid_list(image_grid_thw)
    videos = _grid_list(video_grid_thw)

    video_blocks = _video_blocks(videos, model_type, tokens_per_second, second_per_grid_ts)
    positions = np.empty((3, n), dtype=np.int64)
    token_type = np.zeros(n, dtype=np.int8)
    token_type[ids == image_token_id] = 1
    token_type[ids == video_token_id] = 2

    img_i, vid_i = _fill_positions(positions, ids, token_type, images, video_blocks, m, image_token_id,
                                   len(videos), text_start_after_vision)
    if img_i != len(images):
        raise MRopeError(
            f"{len(images)} image grid(s) given but the input ids hold placeholder tokens for only {img_i}"
        )
    if vid_i != len(video_blocks):
        raise MRopeError(
            f"{len(videos)} video grid(s) given but the input ids hold placeholder tokens for only part of them"
        )

    delta = int(positions.max()) + 1 - n if n else 0
    return torch.from_numpy(positions), delta


def _to_float_list(x) -> list[float]:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return [float(v) for v in x.reshape(-1).tolist()]
    return [float(v) for v in x]


def compute_text_mrope_positions(seq_len: int, start: int = 0) -> torch.Tensor:
    """Positions for a text-only sequence: all three rows ``start .. start + seq_len - 1``."""
    return torch.arange(start, start + seq_len, dtype=torch.int64).unsqueeze(0).expand(3, -1).contiguous()


def decode_mrope_positions(seq_len_so_far: int, delta: int, num_new_tokens: int = 1) -> torch.Tensor:
    """Positions ``(3, num_new_tokens)`` for tokens appended at index ``seq_len_so_far`` onwards.

    Every row equals ``index + delta`` (transformers: ``arange(past_len, past_len + n) + rope_deltas``).
    """
    start = int(seq_len_so_far) + int(delta)
    return compute_text_mrope_positions(num_new_tokens, start)
