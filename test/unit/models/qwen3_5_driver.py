"""A standalone forward for Qwen3.5 in tests: no scheduler, no KV pool.

`ListKVBackend` keeps every full-attention layer's keys and values per request in plain lists (a
stand-in for the paged KV cache); `Qwen3_5Driver` owns one `GDNRequestState` per request and runs
prefill chunks and decode steps through real `ForwardBatch`es (`build_forward_batch`), carrying both
kinds of state between calls, with the model runner's `MultimodalEmbedder` for images.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.layers.attention.sdpa import sdpa
from sglang.srt.model_executor.forward_batch_info import (
    ForwardMode,
    build_forward_batch,
    compute_positions,
    mrope_delta,
)
from sglang.srt.multimodal.embedder import MultimodalEmbedConfig, MultimodalEmbedder
from sglang.srt.multimodal.mm_types import MultimodalInputs


class ListKVBackend:
    """Causal attention over all of a request's keys so far; (layer id, request id) -> (K, V)."""

    def __init__(self):
        self.kv: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        lens = (forward_batch.extend_seq_lens_cpu if forward_batch.forward_mode.is_extend()
                else [1] * forward_batch.batch_size)
        outs, start = [], 0
        for rid, n in zip(forward_batch.rids, lens):
            key = (layer.layer_id, rid)
            k_all, v_all = k[start:start + n], v[start:start + n]
            if key in self.kv:
                k_all, v_all = torch.cat([self.kv[key][0], k_all]), torch.cat([self.kv[key][1], v_all])
            self.kv[key] = (k_all, v_all)
            past = k_all.shape[0] - n
            group = layer.tp_q_head_num // layer.tp_k_head_num
            # query i sits at position past + i and sees keys 0 .. past + i (one new token: all of them)
            mask = None if n == 1 else torch.arange(past + n)[None, :] <= (past + torch.arange(n))[:, None]
            o = sdpa(q[start:start + n].transpose(0, 1), k_all.repeat_interleave(group, 1).transpose(0, 1),
                     v_all.repeat_interleave(group, 1).transpose(0, 1),
                     attn_mask=None if mask is None else mask.to(q.device), scale=layer.scaling)
            outs.append(o.transpose(0, 1))
            start += n
        return torch.cat(outs)

    def release(self, rid: str) -> None:
        for key in [key for key in self.kv if key[1] == rid]:
            del self.kv[key]


@dataclass
class _Request:
    ids: list[int]
    mm: MultimodalInputs | None
    state: object  # GDNRequestState
    done: int = 0  # tokens through the model so far


class Qwen3_5Driver:
    def __init__(self, model, device: str = "cpu"):
        self.model = model
        self.device = device
        self.backend = ListKVBackend()
        self.embedder = MultimodalEmbedder(MultimodalEmbedConfig(chunk_per_image=True))
        self.reqs: dict[str, _Request] = {}

    def add(self, rid: str, ids: list[int], mm: MultimodalInputs | None = None) -> None:
        self.reqs[rid] = _Request(list(ids), mm, self.model.gdn_state_shape().new_request(self.device))

    def state(self, rid: str):
        return self.reqs[rid].state

    def _run(self, fb, states) -> object:
        fb.gdn_states = states
        with torch.no_grad():
            return self.model(fb.input_ids, fb.positions, fb)

    def extend(self, chunks: dict[str, int], return_all: bool = True):
        """Prefill the next `chunks[rid]` prompt tokens of each request (a chunk of it, or the rest), in
        one batch. Returns the logits output (full_logits: every row of the batch, in request order)."""
        ids, positions, lens, prefix, seq_lens, rids, mms = [], [], [], [], [], [], []
        for rid, n in chunks.items():
            r = self.reqs[rid]
            ids += r.ids[r.done:r.done + n]
            positions.append(compute_positions(r.mm, len(r.ids), r.done, r.done + n))
            lens.append(n)
            prefix.append(r.done)
            seq_lens.append(r.done + n)
            rids.append(rid)
            mms.append(r.mm)
        fb = build_forward_batch(
            ForwardMode.EXTEND, ids, torch.cat(positions, dim=1), list(range(len(rids))), seq_lens,
            torch.zeros(len(ids), dtype=torch.int64), self.device, extend_lens=lens, prefix_lens=prefix,
            mm_inputs=mms, rids=rids, attn_backend=self.backend, mm_embedder=self.embedder,
            return_all_logits=return_all)
        out = self._run(fb, [self.reqs[rid].state for rid in rids])
        for rid, n in chunks.items():
            self.reqs[rid].done += n
        return out

    def prefill(self, rid: str, chunks: int | list[int] | None = None) -> torch.Tensor:
        """The whole remaining prompt of one request in one forward (None), in chunks of `chunks`
        tokens, or in chunks of the listed sizes, the last size repeated; every row's logits."""
        r = self.reqs[rid]
        sizes = [] if chunks is None else [chunks] if isinstance(chunks, int) else list(chunks)
        rows = []
        while r.done < len(r.ids):
            want = sizes.pop(0) if len(sizes) > 1 else sizes[0] if sizes else len(r.ids)
            rows.append(self.extend({rid: min(want, len(r.ids) - r.done)}).full_logits)
        return torch.cat(rows)

    def decode(self, tokens: dict[str, int]) -> torch.Tensor:
        """One step: each request appends its token. Returns the next-token logits (batch, vocab)."""
        rids = list(tokens)
        for rid in rids:
            self.reqs[rid].ids.append(tokens[rid])
        seq_lens = [self.reqs[rid].done + 1 for rid in rids]
        fb = build_forward_batch(
            ForwardMode.DECODE, [tokens[rid] for rid in rids], None, list(range(len(rids))), seq_lens,
            torch.zeros(len(rids), dtype=torch.int64), self.device,
            mrope_deltas=[mrope_delta(self.reqs[rid].mm) for rid in rids], rids=rids, attn_backend=self.backend)
        out = self._run(fb, [self.reqs[rid].state for rid in rids])
        for rid in rids:
            self.reqs[rid].done += 1
        return out.next_token_logits

    def greedy(self, rid: str, n: int, chunks: int | list[int] | None = None) -> tuple[list[int], list[torch.Tensor]]:
        """Prefill, then n greedy tokens; returns them and the logits each was chosen from."""
        logits = [self.prefill(rid, chunks)[-1]]
        tokens = [int(logits[-1].argmax())]
        while len(tokens) < n:
            logits.append(self.decode({rid: tokens[-1]})[0])
            tokens.append(int(logits[-1].argmax()))
        return tokens, logits


# ----------------------------------------------------------------------------- shared test inputs
IMAGE_PAD, VISION_START, VISION_END, VIDEO_PAD = 248056, 248053, 248054, 248057  # Qwen3.5's special ids
PLACEHOLDER = [VISION_START, IMAGE_PAD, VISION_END]


def tiny_processor():
    """Qwen3-VL's placement rules with Qwen3.5's ids and tight pixel limits (images of a few dozen tokens)."""
    from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

    ip = QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3, min_pixels=4 * 32 * 32,
                              max_pixels=48 * 32 * 32)
    return QwenVLProcessor(None, ip, model_type="qwen3_vl", image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
                           vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)


def text_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 3000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def noise_image(seed: int, w: int = 96, h: int = 64):
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def prompt(kind: str, proc, seed: int = 0):
    """("text": 90 tokens, across the DeltaNet's 64-token chunk) or ("image": text, one image, text)."""
    if kind == "text":
        return text_ids(90, seed), None
    return proc.process(text_ids(5, seed) + PLACEHOLDER + text_ids(7, seed + 1), [noise_image(seed)])


def ref_kwargs(ids: list[int], mm) -> dict:
    """transformers' forward inputs for a prompt of our processor's ids, images and videos (float32 pixel
    values: the baseline processor's items)."""
    from sglang.srt.multimodal.mm_types import Modality

    t = torch.tensor([ids])
    kw = {"input_ids": t, "mm_token_type_ids": (t == IMAGE_PAD).long()}
    items = mm.mm_items if mm is not None else []
    for it in items:  # a video's tokens by its spans: a generated token may be VIDEO_PAD and is text
        if it.modality == Modality.VIDEO:
            for a, b in it.offsets:
                kw["mm_token_type_ids"][0, a:b] = 2
    for key, modality in (("", Modality.IMAGE), ("_videos", Modality.VIDEO)):
        mine = [it for it in items if it.modality == modality]
        if mine:
            kw["pixel_values" + key] = torch.cat([torch.as_tensor(it.feature) for it in mine])
            kw[("image" if modality == Modality.IMAGE else "video") + "_grid_thw"] = torch.tensor(
                [list(it.image_grid_thw) for it in mine])
    return kw
