"""What language servers and encoder servers exchange in encoder disaggregation (EPD).

A language server (`--language-only`) POSTs an `EncodeRequest` (pickled) to an encoder's `/encode`: the
request id, the indices of the items this encoder takes and the items themselves as the language
server's processor left them (a plain JPEG still compressed, `EncodedImage`; other images and videos as
pixel values, or uint8 with their `PixelNorm`), each with its content hash and grid. The encoder answers
with the embeddings as `EncodedEmbeddings`, pushed over ZMQ (two frames: the request id, the pickle) to
`reply_to`: scheduler rank 0 (or the data-parallel controller) under `zmq_to_scheduler`, the tokenizer
manager under `zmq_to_tokenizer`; then it answers the HTTP call with a small JSON acknowledgement. A
problem with an item is a 400 naming it (not retried); anything else is the encoder's failure (retried
on another one).

Our own processes on both sides: pickle is the wire format, as between the engine's processes.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

ENCODE_PATH = "/encode"
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

    def frames(self) -> list[bytes]:
        return [self.rid.encode(), pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)]

    @staticmethod
    def from_frames(frames: list) -> "EncodedEmbeddings":
        return pickle.loads(frames[-1] if isinstance(frames[-1], bytes) else frames[-1].bytes)


def bind_endpoint(addr: str) -> str:
    """The bind form of an advertised tcp:// endpoint on this host: every interface, same port."""
    port = addr.rsplit(":", 1)[1]
    return f"tcp://*:{port}"
