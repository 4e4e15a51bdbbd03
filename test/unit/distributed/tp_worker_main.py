"""Entry point of one spawned TP rank for the tests: runs a Scheduler over a fixed list of
requests (fed on rank 0, broadcast to all like the tokenizer's), returns rank 0's outputs."""

from __future__ import annotations


class _ListSocket:
    """Stands in for rank 0's ZMQ socket: hands out the prepared requests, then nothing."""

    def __init__(self, items: list):
        self.items = items

    def poll(self, timeout=None) -> bool:
        return bool(self.items)

    def recv_pyobj(self, flags=0):
        import zmq

        if not self.items:
            raise zmq.Again()
        return self.items.pop(0)


def gate_up_rows(layer) -> int:
    """Rows of the layer's gate_up projection on this rank (per expert for a MoE layer)."""
    experts = getattr(layer.mlp, "experts", None)
    return experts.gate_up_proj.shape[1] if experts is not None else layer.mlp.gate_up_proj.weight.shape[0]


def run_rank(rank: int, size: int, port: int, args_kw: dict, requests: list, result_queue) -> None:
    import torch

    from sglang.srt.distributed.communication_op import broadcast_pyobj
    from sglang.srt.distributed.parallel_state import init_tp_group
    from sglang.srt.managers.io_struct import BatchTokenIDOut
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs

    torch.set_num_threads(1)
    tp = init_tp_group(size, rank, f"127.0.0.1:{port}", "gloo", 60, args_kw.get("ep_size", 1))
    sched = Scheduler(ServerArgs(**args_kw), None, tp)
    sent = []
    sched.send = sent.append
    inbox = list(requests) if rank == 0 else []

    if rank == 0:
        sched.recv_socket = _ListSocket(inbox)
    while True:
        sched.step()
        if broadcast_pyobj(sched.is_idle() and not inbox, tp):
            break
    outputs: dict[str, list[int]] = {}
    broadcast_ms = {}
    for msg in sent:
        if isinstance(msg, BatchTokenIDOut):
            for rid, ids, meta in zip(msg.rids, msg.new_token_ids, msg.meta_info):
                outputs.setdefault(rid, []).extend(ids)
                broadcast_ms[rid] = meta["tp_broadcast_ms"]
    runner = sched.worker.model_runner
    layer = runner.model.model.layers[0]
    attn = next(lay for lay in runner.model.model.layers if hasattr(lay, "self_attn"))  # hybrid: a full-attention one
    shard_info = {
        "gate_up_rows": gate_up_rows(layer),
        "qkv_rows": attn.self_attn.qkv_proj.weight.shape[0],
        "vision_qkv_rows": runner.model.visual.blocks[0].attn.qkv.weight.shape[0],
        "embed_rows": runner.model.model.embed_tokens.weight.shape[0],
        "free_after": sched.kv.available_tokens(),
        "max_tokens": sched.max_total_num_tokens,
        "broadcast_ms": broadcast_ms,
        "overlap": sched.enable_overlap,
    }
    result_queue.put((rank, outputs if rank == 0 else None, shard_info))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
