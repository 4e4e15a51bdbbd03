"""What this rank's model actually runs, as counters and facts read from the objects that do the work,
never from the switches that asked for it: a switch that is on while its path is silently skipped shows
here as a counter that does not move. Reported per rank in /get_server_info under "paths"
(docs/observability.md)."""

from __future__ import annotations


def _vit_graph(runner) -> dict | None:
    g = getattr(runner, "vit_graph_runner", None)
    if g is None:
        return None
    return g.stats()


def _moe(model) -> dict | None:
    """Expert placement read from the fused-MoE layers themselves (EP shards experts, TP shards each)."""
    layers = [m for m in model.modules() if hasattr(m, "num_local_experts") and hasattr(m, "first_expert")]
    if not layers:
        return None
    first = layers[0]
    return {"moe_layers": len(layers), "num_experts": first.num_experts, "ep_size": first.tp.ep_size,
            "ep_rank": first.tp.moe_ep_rank, "local_experts": [first.first_expert,
                                                               first.first_expert + first.num_local_experts],
            "local_expert_params": sum(p.numel() for m in layers for p in m.parameters(recurse=False))}


def _kv_cache(runner) -> dict:
    pool = runner.token_to_kv_pool
    scales = [s for s in getattr(pool, "scales", []) if tuple(s) != (1.0, 1.0)]
    flat = [float(v) for s in scales for v in s]
    return {"dtype": str(runner.kv_dtype).removeprefix("torch."), "layers_with_scales": len(scales),
            "scale_range": [min(flat), max(flat)] if flat else [1.0, 1.0]}


def path_stats(runner) -> dict:
    return {"vit_graph": _vit_graph(runner), "moe": _moe(runner.model), "kv_cache": _kv_cache(runner)}
