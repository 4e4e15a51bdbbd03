"""What the tokenizer manager and the data-parallel controller (`--dp-size N`) agree on, so neither imports
the other's process module: the header frame a generation request is routed by, and how the replies of
every replica merge into the one answer a control request gets."""

from __future__ import annotations

import pickle
from typing import Any

from sglang.srt.managers.io_struct import FlushCacheReqOutput, ProfileReqOutput

# Server-info figures that add up over replicas; the rest (context length, chunk size, ...) is replica 0's.
SUMMED_INFO_KEYS = ("max_total_num_tokens", "max_running_requests", "available_kv_tokens", "free_kv_tokens",
                    "radix_cache_tokens", "num_running_reqs", "num_waiting_reqs", "free_req_slots",
                    "num_retractions", "num_request_errors", "num_grammar_queue_reqs")
# figures held as a dict of counts (a cache's entries, hits, misses, bytes): summed key by key
SUMMED_INFO_DICTS = ("grammar_cache",)


def merge_server_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """One replica: its info. Several: the sums of SUMMED_INFO_KEYS over replica 0's other fields, and every
    replica's own info under "replicas" (by dp_rank)."""
    if len(infos) == 1:
        return infos[0]
    infos = sorted(infos, key=lambda i: i.get("dp_rank", 0))
    merged = {k: v for k, v in infos[0].items() if k != "dp_rank"}
    for key in SUMMED_INFO_KEYS:
        if all(isinstance(i.get(key), (int, float)) for i in infos):
            merged[key] = sum(i[key] for i in infos)
    for key in SUMMED_INFO_DICTS:
        dicts = [i.get(key) for i in infos]
        if all(isinstance(d, dict) for d in dicts):
            merged[key] = {k: sum(d.get(k, 0) for d in dicts) for k in dicts[0]
                           if all(isinstance(d.get(k, 0), (int, float)) for d in dicts)}
    merged["replicas"] = infos
    return merged


def merge_flush_replies(outs: list[FlushCacheReqOutput]) -> FlushCacheReqOutput:
    failed = [o.message for o in outs if not o.success]
    if len(outs) == 1 or not failed:
        return outs[0] if len(outs) == 1 else FlushCacheReqOutput(True)
    return FlushCacheReqOutput(False, f"{len(failed)} of {len(outs)} replicas: {failed[0]}")


def merge_profile_replies(outs: list[ProfileReqOutput]) -> ProfileReqOutput:
    if len(outs) == 1:
        return outs[0]
    failed = [o.message for o in outs if not o.success]
    files = [f for o in outs for f in o.files]
    return ProfileReqOutput(not failed, failed[0] if failed else "", files)


def request_header(rid: str, num_tokens: int, routed_dp_rank: int | None = None) -> bytes:
    """The first frame of a generation request at dp size > 1: what the controller routes by."""
    return pickle.dumps((rid, num_tokens, routed_dp_rank), protocol=pickle.HIGHEST_PROTOCOL)


def read_request_header(frame: bytes) -> tuple[str, int, int | None]:
    """(rid, prompt tokens, routed dp rank or None) from `request_header`'s frame."""
    return pickle.loads(frame)
