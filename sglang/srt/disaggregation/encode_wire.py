"""The typed wire format of encoder disaggregation: what crosses machines between language servers and
encoders. Nothing here unpickles: JSON metadata (msgspec, unknown fields refused) with every field
checked, and raw tensor bytes whose dtype, shape and size are validated against that metadata.

`POST /encode` body (language server -> encoder):
    MAGIC_REQUEST | u32 header length | header JSON (EncodeHeader) | item bytes, back to back in order
`EncodedEmbeddings` frames (encoder -> language server, ZMQ PUSH):
    [rid, header JSON (EmbeddingHeader), one frame of raw bytes per item, MAC (only with a key)]

The MAC is a keyed BLAKE3 over every frame before it, length-prefixed, keyed from `--api-key`: a frame
that a holder of the key did not make is refused. Any check that fails raises `WireError` (a
ValueError: the sender's fault) naming the field; receivers drop that message alone.
"""

from __future__ import annotations

import hmac
import math
import struct

import msgspec
import torch

from sglang.srt.disaggregation.encode_protocol import TRANSFER_BACKENDS, EncodedEmbeddings, EncodeRequest
from sglang.srt.multimodal.mm_types import EncodedImage, Modality, MultimodalDataItem, PixelNorm

MAGIC_REQUEST = b"SGLEPD\x01Q"
MAX_HEADER_BYTES = 1 << 20
MAX_RID_CHARS = 512
MAX_ITEMS = 4096
MAX_GRID = 1 << 16  # one grid dimension, in patches
EMBEDDING_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAC_BYTES = 32


class WireError(ValueError):
    """A message that fails a check of this format (malformed, truncated, oversized, forged)."""


class WireNorm(msgspec.Struct, forbid_unknown_fields=True):
    kind: str
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_mean: list[float]
    image_std: list[float]
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool


class WireItem(msgspec.Struct, forbid_unknown_fields=True):
    index: int  # position in the request's mm_items
    modality: str  # "image" | "video"
    grid_thw: list[int]
    kind: str  # "jpeg" (compressed file) | "float32" (pixel_values) | "uint8" (after the resize, with norm)
    shape: list[int]  # of the raw bytes as a tensor ("jpeg": [nbytes])
    nbytes: int
    spatial_merge_size: int = 2
    target_hw: list[int] | None = None  # "jpeg"
    orientation: int = 1  # "jpeg"
    norm: WireNorm | None = None  # "uint8"


class EncodeHeader(msgspec.Struct, forbid_unknown_fields=True):
    rid: str
    reply_to: str
    backend: str
    items: list[WireItem]


class EmbeddingHeader(msgspec.Struct, forbid_unknown_fields=True):
    rid: str
    item_indices: list[int]
    shapes: list[list[int]]
    dtype: str
    encode_ms: float = 0.0
    cached: int = 0
    encoder: str = ""


# ------------------------------------------------------------------------------------------ checks
def _check(cond: bool, message: str) -> None:
    if not cond:
        raise WireError(message)


def _check_rid(rid: str) -> None:
    _check(0 < len(rid) <= MAX_RID_CHARS and rid.isprintable(), f"rid must be 1-{MAX_RID_CHARS} printable characters")


def _check_indices(indices: list[int]) -> None:
    _check(len(indices) <= MAX_ITEMS, f"more than {MAX_ITEMS} items")
    _check(all(0 <= i < MAX_ITEMS for i in indices), "an item index is out of range")
    _check(len(set(indices)) == len(indices), "an item index repeats")


def _norm_of(w: WireNorm) -> PixelNorm:
    _check(w.kind in ("image", "video"), f"norm.kind must be image or video, got {w.kind!r}")
    _check(all(1 <= v <= 64 for v in (w.patch_size, w.temporal_patch_size, w.merge_size)),
           "norm patch, temporal patch and merge sizes must be in 1..64")
    _check(len(w.image_mean) == 3 and len(w.image_std) == 3, "norm mean and std need 3 values")
    values = [*w.image_mean, *w.image_std, w.rescale_factor]
    _check(all(math.isfinite(v) for v in values) and all(v != 0 for v in w.image_std), "norm values must be "
           "finite and std non-zero")
    return PixelNorm(w.kind, w.patch_size, w.temporal_patch_size, w.merge_size, tuple(w.image_mean),
                     tuple(w.image_std), w.do_rescale, w.rescale_factor, w.do_normalize)


def _wire_norm(n: PixelNorm) -> WireNorm:
    return WireNorm(n.kind, n.patch_size, n.temporal_patch_size, n.merge_size, list(n.image_mean),
                    list(n.image_std), n.do_rescale, n.rescale_factor, n.do_normalize)


def _item_shape(w: WireItem) -> tuple[torch.dtype, tuple[int, ...]]:
    _check(w.modality in ("image", "video"), f"item {w.index}: modality must be image or video")
    _check(len(w.grid_thw) == 3 and all(1 <= v <= MAX_GRID for v in w.grid_thw), f"item {w.index}: bad grid_thw")
    _check(1 <= w.spatial_merge_size <= 16, f"item {w.index}: bad spatial_merge_size")
    _check(all(isinstance(v, int) and v >= 1 for v in w.shape) and w.shape, f"item {w.index}: bad shape")
    if w.kind == "jpeg":
        _check(w.modality == "image" and len(w.shape) == 1 and w.target_hw is not None and len(w.target_hw) == 2
               and all(1 <= v <= MAX_GRID * 64 for v in w.target_hw) and 1 <= w.orientation <= 8,
               f"item {w.index}: a jpeg item needs an image modality, target_hw and an orientation 1-8")
        return torch.uint8, tuple(w.shape)
    if w.kind == "float32":
        _check(len(w.shape) == 2 and w.norm is None, f"item {w.index}: float32 pixel_values are 2-D, without norm")
        return torch.float32, tuple(w.shape)
    if w.kind == "uint8":
        _check(w.norm is not None and len(w.shape) == (3 if w.norm.kind == "image" else 4) and w.shape[-1] == 3,
               f"item {w.index}: uint8 pixels need a norm and an (H, W, 3) or (F, H, W, 3) shape")
        return torch.uint8, tuple(w.shape)
    raise WireError(f"item {w.index}: kind must be jpeg, float32 or uint8, got {w.kind!r}")


def _tensor(buf, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor owning a copy of `buf` (the receive buffer is read-only and reused)."""
    return torch.frombuffer(bytearray(buf), dtype=torch.uint8).view(dtype).reshape(shape)


# ------------------------------------------------------------------------------- encode requests
def encode_request_body(req: EncodeRequest) -> bytes:
    """The `/encode` body of `req` (its items as the language server's processor left them)."""
    wires, blobs = [], []
    for index, item in zip(req.item_indices, req.items):
        feature = item.feature
        common = dict(index=index, modality=item.modality.value, grid_thw=[int(v) for v in item.image_grid_thw],
                      spatial_merge_size=int(item.spatial_merge_size))
        if isinstance(feature, EncodedImage):
            data = bytes(feature.data)
            wires.append(WireItem(kind="jpeg", shape=[len(data)], nbytes=len(data),
                                  target_hw=list(feature.target_hw), orientation=int(feature.orientation), **common))
        else:
            t = torch.as_tensor(feature).contiguous()
            kind = "uint8" if item.pixel_norm is not None else "float32"
            t = t.to(torch.uint8 if kind == "uint8" else torch.float32)
            data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
            wires.append(WireItem(kind=kind, shape=list(t.shape), nbytes=len(data),
                                  norm=_wire_norm(item.pixel_norm) if item.pixel_norm is not None else None, **common))
        blobs.append(data)
    header = msgspec.json.encode(EncodeHeader(req.rid, req.reply_to, req.backend, wires))
    return b"".join([MAGIC_REQUEST, struct.pack("<I", len(header)), header, *blobs])


def decode_request_body(body: bytes, max_bytes: int) -> tuple[EncodeRequest, list[tuple[str, bytes]]]:
    """(the request, each item's (kind, raw bytes) for content hashing). Items come back as
    MultimodalDataItems whose `hash` is None (an encoder never trusts a stated hash) and whose JPEGs carry
    no processor config (the encoder applies its own)."""
    _check(len(body) <= max_bytes, f"body of {len(body)} bytes is over the {max_bytes}-byte limit")
    head = len(MAGIC_REQUEST) + 4
    _check(len(body) >= head and body[: len(MAGIC_REQUEST)] == MAGIC_REQUEST, "not an encode request (bad magic)")
    (hlen,) = struct.unpack_from("<I", body, len(MAGIC_REQUEST))
    _check(hlen <= MAX_HEADER_BYTES and head + hlen <= len(body), "header length out of range")
    try:
        hdr = msgspec.json.decode(body[head : head + hlen], type=EncodeHeader)
    except msgspec.ValidationError as e:
        raise WireError(f"header: {e}") from None
    except msgspec.DecodeError as e:
        raise WireError(f"header is not JSON: {e}") from None
    _check_rid(hdr.rid)
    _check(hdr.backend in TRANSFER_BACKENDS, f"backend must be one of {', '.join(TRANSFER_BACKENDS)}")
    _check(hdr.reply_to.startswith("tcp://") and len(hdr.reply_to) <= 300, "reply_to must be a tcp:// endpoint")
    _check(hdr.items, "no items")
    _check_indices([w.index for w in hdr.items])
    at, items, raw, view = head + hlen, [], [], memoryview(body)
    for w in hdr.items:
        dtype, shape = _item_shape(w)
        expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        _check(w.nbytes == expected, f"item {w.index}: {w.nbytes} bytes do not hold {w.kind} {list(shape)}")
        _check(at + w.nbytes <= len(body), f"item {w.index}: truncated ({len(body) - at} of {w.nbytes} bytes)")
        data = view[at : at + w.nbytes]
        at += w.nbytes
        grid = tuple(w.grid_thw)
        if w.kind == "jpeg":
            feature = EncodedImage(bytes(data), tuple(w.target_hw), grid, w.orientation, None)
            norm = None
        else:
            norm = _norm_of(w.norm) if w.norm is not None else None
            feature = _tensor(data, dtype, shape)
        items.append(MultimodalDataItem(Modality(w.modality), feature, grid, spatial_merge_size=w.spatial_merge_size,
                                        pixel_norm=norm))
        raw.append((f"{w.kind}|{grid}|{list(shape)}|{norm!r}", data))
    _check(at == len(body), f"{len(body) - at} bytes after the last item")
    return EncodeRequest(hdr.rid, [w.index for w in hdr.items], items, hdr.reply_to, hdr.backend), raw


# ------------------------------------------------------------------------------------ embeddings
def mac_key(api_key: str | None) -> bytes | None:
    """The embedding frames' MAC key derived from `--api-key` (None: frames carry no MAC)."""
    if not api_key:
        return None
    import blake3

    return blake3.blake3(b"sglang-epd-embeddings\x00" + api_key.encode()).digest()


def _mac(key: bytes, frames) -> bytes:
    import blake3

    h = blake3.blake3(key=key)
    for f in frames:
        mv = memoryview(f)
        h.update(struct.pack("<Q", mv.nbytes))
        h.update(mv)
    return h.digest()


def embedding_frames(msg: EncodedEmbeddings, key: bytes | None = None) -> list:
    """The frames of `msg` (each embedding as its raw bytes, no copy for a contiguous CPU tensor)."""
    tensors = [torch.as_tensor(e).detach().to("cpu").contiguous() for e in msg.embeddings]
    dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors}
    if len(dtypes) > 1 or not dtypes <= set(EMBEDDING_DTYPES) or any(t.dim() != 2 for t in tensors):
        raise ValueError(f"embeddings must be 2-D {', '.join(EMBEDDING_DTYPES)} tensors of one dtype")
    header = EmbeddingHeader(msg.rid, list(msg.item_indices), [list(t.shape) for t in tensors],
                             dtypes.pop() if dtypes else "float32", float(msg.encode_ms), int(msg.cached), msg.encoder)
    frames = [msg.rid.encode(), msgspec.json.encode(header),
              *(t.view(torch.uint8).numpy() if t.numel() else b"" for t in tensors)]
    if key is not None:
        frames.append(_mac(key, frames))
    return frames


def decode_embedding_frames(frames: list, key: bytes | None, max_bytes: int) -> EncodedEmbeddings:
    """The message the frames carry, every check passed (WireError otherwise)."""
    bufs = [f.buffer if hasattr(f, "buffer") else memoryview(f) for f in frames]
    _check(len(bufs) >= 2, "fewer than 2 frames")
    if key is not None:
        _check(len(bufs) >= 3 and bufs[-1].nbytes == MAC_BYTES, "missing MAC (the encoders need the same --api-key)")
        _check(hmac.compare_digest(_mac(key, bufs[:-1]), bytes(bufs[-1])), "bad MAC (another --api-key, or forged)")
        bufs = bufs[:-1]
    _check(bufs[1].nbytes <= MAX_HEADER_BYTES, "header too large")
    try:
        hdr = msgspec.json.decode(bytes(bufs[1]), type=EmbeddingHeader)
        rid = bytes(bufs[0]).decode("utf-8")
    except msgspec.ValidationError as e:
        raise WireError(f"header: {e}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise WireError(f"undecodable frame: {e}") from None
    _check_rid(hdr.rid)
    _check(rid == hdr.rid, "the rid frame differs from the header's")
    _check_indices(hdr.item_indices)
    _check(hdr.dtype in EMBEDDING_DTYPES, f"dtype must be one of {', '.join(EMBEDDING_DTYPES)}")
    _check(len(hdr.shapes) == len(hdr.item_indices) == len(bufs) - 2, "item, shape and frame counts differ")
    _check(math.isfinite(hdr.encode_ms) and hdr.encode_ms >= 0 and 0 <= hdr.cached <= len(hdr.item_indices),
           "bad encode_ms or cached count")
    dtype = EMBEDDING_DTYPES[hdr.dtype]
    size = torch.empty((), dtype=dtype).element_size()
    total = 0
    embs = []
    for shape, buf in zip(hdr.shapes, bufs[2:]):
        _check(len(shape) == 2 and all(isinstance(v, int) and 1 <= v <= 1 << 24 for v in shape), "bad shape")
        _check(buf.nbytes == shape[0] * shape[1] * size, f"{buf.nbytes} bytes do not hold {hdr.dtype} {shape}")
        total += buf.nbytes
        _check(total <= max_bytes, f"embeddings over the {max_bytes}-byte limit")
        embs.append(_tensor(buf, dtype, tuple(shape)))
    return EncodedEmbeddings(hdr.rid, list(hdr.item_indices), embs, hdr.encode_ms, hdr.cached, hdr.encoder[:300])


def content_key(raw: tuple[str, bytes]) -> int:
    """An encoder's cache key for one item: its own hash of what it decodes, never the sender's."""
    import xxhash

    desc, data = raw
    h = xxhash.xxh3_128(desc.encode())
    h.update(memoryview(data))
    return h.intdigest() & ((1 << 63) - 1)
