"""The three places embeddings arrive from the network (scheduler rank 0, the data-parallel controller, the
tokenizer manager's inbox): a garbage, truncated or forged frame is dropped alone, and the requests around
it are answered. On a018ab2 one non-pickle frame failed every request received in that step, and a
non-UTF-8 first frame killed the data-parallel controller."""

from __future__ import annotations

import asyncio
import pickle
import time

import torch
import zmq

from sglang.srt.disaggregation.encode_protocol import EncodedEmbeddings
from sglang.srt.managers.encode_receiver import EmbeddingInbox, EmbeddingRendezvous
from sglang.srt.disaggregation.encode_wire import embedding_frames, mac_key
from sglang.srt.managers.data_parallel_controller import DataParallelController, EmbeddingRouter
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler_io_mixin import SchedulerIOMixin
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs
from sglang.srt.sampling.sampling_params import SamplingParams

GARBAGE = [[b"\xff\xfe\xfd", b"\x80\x04junk"], [b"r", b"{}"], [b"only one frame"], [b"a", b"b", b"c" * 1000]]


def _held(rid: str) -> TokenizedGenerateReqInput:
    item = MultimodalDataItem(Modality.IMAGE, None, (1, 2, 2))  # one token
    req = TokenizedGenerateReqInput(rid, [1, 2], SamplingParams(), MultimodalInputs([item]))
    req.epd_pending_items = (0,)
    return req


def _emb(rid: str) -> EncodedEmbeddings:
    return EncodedEmbeddings(rid, [0], [torch.full((1, 4), 3.0)])


class _Rank0:
    """Scheduler rank 0's embedding intake, without the rest of the scheduler."""
    _admit_epd = SchedulerIOMixin._admit_epd
    _num_queued = SchedulerIOMixin._num_queued

    def __init__(self, sock, key):
        from types import SimpleNamespace

        self.waiting, self.grammar_queue = [], None
        self.server_args = SimpleNamespace(max_queued_requests=None)
        self.epd_socket = sock
        self.epd_limits = (key, 1 << 20)
        self.epd_rendezvous = EmbeddingRendezvous(wait_s=60)


def test_scheduler_rank0_drops_bad_frames_and_answers_everyone_else():
    key = mac_key("k")
    ctx = zmq.Context(1)
    try:
        pull = ctx.socket(zmq.PULL)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push = ctx.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{port}")
        rank0 = _Rank0(pull, key)
        reqs = [_held(f"r{k}") for k in range(8)]
        other = TokenizedGenerateReqInput("text-only", [1], SamplingParams())
        for frames in GARBAGE:
            push.send_multipart(frames)
        push.send_multipart(embedding_frames(_emb("r0"), mac_key("wrong key")))  # forged: dropped
        for r in reqs:
            push.send_multipart(embedding_frames(_emb(r.rid), key))
        out = rank0._admit_epd(reqs + [other])
        released = [m for m in out if m.rid != "text-only"]
        deadline = time.monotonic() + 30
        while len(released) < 8:  # pushes land asynchronously: drain until every request is released
            assert time.monotonic() < deadline, f"only {len(released)} of 8 released"
            pull.poll(100)
            released += rank0._admit_epd([])
        assert other in out
        assert sorted(r.rid for r in released) == sorted(r.rid for r in reqs)
        assert all(r.epd_error is None and r.mm_inputs.mm_items[0].precomputed_embeddings is not None for r in released)
        assert rank0.epd_rendezvous.dropped == len(GARBAGE) + 1
    finally:
        ctx.destroy(linger=0)


class _Sock:
    def __init__(self):
        self.sent = []

    def send(self, data, copy=True):
        self.sent.append(bytes(data))


class _Controller:
    _route_embeddings = DataParallelController._route_embeddings

    def __init__(self, key):
        self.epd = EmbeddingRouter()
        self.epd_limits = (key, 1 << 20)
        self.replicas = [_Sock(), _Sock()]


def test_the_data_parallel_controller_survives_garbage_and_forwards_checked_messages():
    key = mac_key("k")
    c = _Controller(key)
    for frames in GARBAGE:
        c._route_embeddings([zmq.Frame(f) for f in frames])  # on a018ab2 the first one raised out of the loop
    c.epd.on_request("r1", 1)
    c._route_embeddings([zmq.Frame(f) for f in embedding_frames(_emb("r1"), key)])
    assert c.replicas[0].sent == [] and len(c.replicas[1].sent) == 1
    msg = pickle.loads(c.replicas[1].sent[0])  # our own ipc hop, after the checks
    assert isinstance(msg, EncodedEmbeddings) and msg.rid == "r1" and torch.equal(msg.embeddings[0], _emb("r1").embeddings[0])


def test_the_tokenizer_inbox_drops_bad_frames_and_delivers_good_ones():
    import zmq.asyncio

    key = mac_key("k")

    async def run():
        ctx = zmq.asyncio.Context(1)
        try:
            pull = ctx.socket(zmq.PULL)
            port = pull.bind_to_random_port("tcp://127.0.0.1")
            push = ctx.socket(zmq.PUSH)
            push.connect(f"tcp://127.0.0.1:{port}")
            inbox = EmbeddingInbox()
            waiter = inbox.expect("r1", [0])
            task = asyncio.ensure_future(inbox.run(pull, key, 1 << 20))
            for frames in GARBAGE:
                await push.send_multipart(frames)
            await push.send_multipart(embedding_frames(_emb("r1"), key))
            got, _ = await asyncio.wait_for(waiter, 30)
            assert not task.done()  # the loop is still receiving
            task.cancel()
            return got
        finally:
            ctx.destroy(linger=0)

    got = asyncio.run(run())
    assert torch.equal(got[0], _emb("r1").embeddings[0])
