"""What language servers and encoder servers exchange in encoder disaggregation (EPD).

A language server (`--language-only`) POSTs an `EncodeRequest` to an encoder's `/encode`: the
request id, the indices of the items this encoder takes and the items themselves as the language
server's processor left them (a plain JPEG still compressed, `EncodedImage`; other images and videos as
pixel values, or uint8 with their `PixelNorm`), each with its content hash and grid. The encoder answers
with the embeddings as `EncodedEmbeddings`, pushed over ZMQ to
`reply_to`: scheduler rank 0 (or the data-parallel controller) under `zmq_to_scheduler`, the tokenizer
manager under `zmq_to_tokenizer`; then it answers the HTTP call with a small JSON acknowledgement. A
problem with an item is a 400 naming it (not retried); anything else is the encoder's failure (retried
on another one).

These cross machines: their wire form is `encode_wire.py` (typed metadata and raw tensor bytes, never a
pickle); a language server registers its `reply_to` with each encoder first (`/register`, which also
answers the encoder's model identity), and an encoder pushes only to registered endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENCODE_PATH = "/encode"
REGISTER_PATH = "/register"
TRANSFER_BACKENDS = ("zmq_to_scheduler", "zmq_to_tokenizer")


@dataclass
class EncodeRequest:
    rid: str
    item_indices: list[int]  # positions of `items` in the request's mm_items
    items: list[Any]  # MultimodalDataItem, feature and hash set, offsets dropped
    reply_to: str  # tcp:// endpoint the embeddings are pushed to
    backend: str = "zmq_to_scheduler"


@dataclass
class EncodedEmbeddings:
    """One encoder's share of one request: an embedding matrix per item index,
    (tokens, out_hidden * (1 + deepstack)) on the CPU."""

    rid: str
    item_indices: list[int]
    embeddings: list[Any]
    encode_ms: float = 0.0
    cached: int = 0  # items served from the encoder's embedding cache
    encoder: str = ""  # the encoder's own address, for logs


def bind_endpoint(addr: str, host: str) -> str:
    """The bind form of an advertised tcp:// endpoint: the interface the server was told (`--host`; every
    interface only where that is what it was told: 0.0.0.0 or ::), same port."""
    port = addr.rsplit(":", 1)[1]
    if host in ("", "0.0.0.0", "::", "*"):
        return f"tcp://*:{port}"
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
