"""Data parallelism (`--dp-size N`): one process between the tokenizer manager and N replicas of the
scheduler group (each `--tp-size` ranks with its own model copy and KV cache).

The tokenizer manager pushes to the controller's socket exactly as it pushes to scheduler rank 0 at dp
size 1. A generation request arrives as two frames, a small header (rid, prompt tokens) and the request's
pickled bytes; the controller picks a replica from the header alone and forwards the bytes untouched
(shared-memory pointers and all: they are opened by that replica only). Every other message (abort,
flush_cache, server info, load, profiling) is one frame and goes to every replica; the tokenizer manager
waits for a reply from each. Replies and outputs travel from each replica's rank 0 to the one shared
detokenizer, as at dp size 1.

`--load-balance-method` (upstream's names): `round_robin`; `total_requests` (fewest requests held, the
older name `shortest_queue`); `total_tokens` (fewest tokens held, the older name `minimum_tokens`).
Live counts come from the replicas (`ReplicaLoadReport`, sent by rank 0 whenever its load changed) plus
what the controller sent that a replica has not received yet, so a burst is spread before any report.
"""

from __future__ import annotations

import logging
from sglang.srt.managers.data_parallel_messages import read_request_header
from sglang.srt.managers.io_struct import ReplicaLoadReport
from sglang.srt.server_args_values import resolve_load_balance_method

logger = logging.getLogger(__name__)


class LoadBalancer:
    """Picks a replica per request. No I/O: the controller feeds it reports and asks it for picks."""

    def __init__(self, method: str, dp_size: int):
        self.method = resolve_load_balance_method(method)
        self.dp_size = dp_size
        self.sent_reqs = [0] * dp_size
        self.sent_tokens = [0] * dp_size
        self.reports: list[ReplicaLoadReport | None] = [None] * dp_size
        self._next = 0  # round robin, and the tie-break of the load-based methods

    def on_report(self, report: ReplicaLoadReport) -> None:
        self.reports[report.dp_rank] = report

    def held(self, k: int) -> tuple[int, int]:
        """(requests, tokens) replica k holds or is about to receive."""
        r = self.reports[k]
        if r is None:
            return self.sent_reqs[k], self.sent_tokens[k]
        return (r.num_reqs + self.sent_reqs[k] - r.num_received_reqs,
                r.num_tokens + self.sent_tokens[k] - r.num_received_tokens)

    def pick(self, num_tokens: int, routed: int | None = None) -> int:
        """The replica for a request of `num_tokens` prompt tokens; `routed`: the one the caller named
        (an external router's routed_dp_rank, checked to be in range where the request entered)."""
        n = self.dp_size
        if routed is not None:
            k = routed
        elif self.method == "round_robin":
            k = self._next
        else:
            key = 0 if self.method == "total_requests" else 1
            # equal loads: the next replica in round-robin order, so an idle server spreads a burst
            k = min(range(n), key=lambda i: (self.held(i)[key], (i - self._next) % n))
        if routed is None:
            self._next = (k + 1) % n
        self.sent_reqs[k] += 1
        self.sent_tokens[k] += num_tokens
        return k


class EmbeddingRouter:
    """EPD (zmq_to_scheduler) at --dp-size > 1: which replica each request went to, so that the embeddings
    encoders push for it follow it there; embeddings that arrive before their request wait for it. No I/O."""

    def __init__(self, max_routes: int = 65536, ttl_s: float = 120.0, clock=None, max_early: int = 1024):
        import time
        from collections import OrderedDict

        self.clock = clock or time.monotonic
        self.routes: OrderedDict[str, int] = OrderedDict()  # recent rid -> replica
        self.early: dict[str, tuple[float, list]] = {}  # rid -> (first arrival, payload frames)
        self.max_routes = max_routes
        self.max_early = max_early
        self.ttl_s = ttl_s

    def on_request(self, rid: str, replica: int) -> list:
        """Records the route; returns the embeddings already here for it (to send first)."""
        self.routes[rid] = replica
        if len(self.routes) > self.max_routes:
            self.routes.popitem(last=False)
        return self.early.pop(rid, (0.0, []))[1]

    def on_embeddings(self, rid: str, payload) -> int | None:
        """The replica to send them to now, or None (kept until their request is routed; at most
        `max_early` requests' worth, the oldest dropped first)."""
        k = self.routes.get(rid)
        if k is None:
            self.early.setdefault(rid, (self.clock(), []))[1].append(payload)
            while len(self.early) > self.max_early:
                self.early.pop(next(iter(self.early)))
        return k

    def expire(self) -> None:
        now = self.clock()
        for rid, (t, _) in list(self.early.items()):
            if now - t > self.ttl_s:
                del self.early[rid]  # its request failed on another encoder and was never sent


# ----------------------------------------------------------------------------- the process
class DataParallelController:
    def __init__(self, server_args, port_args):
        import zmq

        self.balancer = LoadBalancer(server_args.load_balance_method, server_args.dp_size)
        self.ctx = zmq.Context(1)
        self.recv_requests = self.ctx.socket(zmq.PULL)
        self.recv_requests.bind(port_args.scheduler_input_ipc_name)
        self.recv_loads = self.ctx.socket(zmq.PULL)
        self.recv_loads.bind(port_args.dp_load_ipc_name)
        # --language-only with zmq_to_scheduler: encoders push embeddings here; each goes to its request's replica
        self.epd = None
        if server_args.language_only and server_args.encoder_transfer_backend == "zmq_to_scheduler":
            from sglang.srt.disaggregation.encode_protocol import bind_endpoint
            from sglang.srt.disaggregation.encode_wire import mac_key
            from sglang.srt.environ import envs

            self.epd = EmbeddingRouter()
            self.epd_limits = (mac_key(server_args.api_key), envs.SGLANG_EPD_MAX_EMBEDDING_MB.get() << 20)
            self.recv_embeddings = self.ctx.socket(zmq.PULL)
            self.recv_embeddings.setsockopt(zmq.MAXMSGSIZE, self.epd_limits[1])
            self.recv_embeddings.bind(bind_endpoint(port_args.epd_embedding_addr, server_args.host))
        self.replicas = []
        for k in range(server_args.dp_size):
            sock = self.ctx.socket(zmq.PUSH)
            sock.connect(port_args.for_replica(k).scheduler_input_ipc_name)
            self.replicas.append(sock)

    def event_loop(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self.recv_loads, zmq.POLLIN)
        poller.register(self.recv_requests, zmq.POLLIN)
        if self.epd is not None:
            poller.register(self.recv_embeddings, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(1000 if self.epd is not None else None))
            self._drain_loads()  # the freshest counts before routing what arrived with them
            if self.recv_requests in ready:
                self._forward(self.recv_requests.recv_multipart(copy=False))
            if self.epd is not None:
                if self.recv_embeddings in ready:
                    self._route_embeddings(self.recv_embeddings.recv_multipart(copy=False))
                self.epd.expire()

    def _route_embeddings(self, frames: list) -> None:
        """Checked here (the wire format, the MAC): a bad message is dropped alone, never the loop. The
        replica gets the checked message over its own ipc socket, as any message from this process."""
        import pickle

        from sglang.srt.disaggregation.encode_wire import decode_embedding_frames

        try:
            msg = decode_embedding_frames(frames, *self.epd_limits)
        except ValueError as e:
            logger.warning("dropped an embedding message: %s", e)
            return
        payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        k = self.epd.on_embeddings(msg.rid, payload)
        if k is not None:
            self.replicas[k].send(payload, copy=False)

    def _drain_loads(self) -> None:
        import zmq

        while True:
            try:
                self.balancer.on_report(self.recv_loads.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                return

    def _forward(self, frames: list) -> None:
        if len(frames) == 2:  # header + a generation request: one replica
            rid, num_tokens, routed = read_request_header(frames[0].bytes)
            k = self.balancer.pick(num_tokens, routed)
            if self.epd is not None:  # embeddings that came first go ahead of it, on the same socket
                for early in self.epd.on_request(rid, k):
                    self.replicas[k].send(early, copy=False)
            self.replicas[k].send(frames[1], copy=False)
            return
        data = frames[0].bytes
        for sock in self.replicas:  # control (abort, flush, info, load, profile): every replica
            sock.send(data)

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def run_data_parallel_controller_process(server_args, port_args, ready_writer) -> None:
    """Process entry: ("ready", None) once the sockets are bound, ("error", message) if that fails."""
    try:
        controller = DataParallelController(server_args, port_args)
    except Exception as e:
        logger.exception("data-parallel controller failed to start")
        ready_writer.send(("error", f"data-parallel controller failed to start: {type(e).__name__}: {e}"))
        raise
    ready_writer.send(("ready", None))
    ready_writer.close()
    try:
        controller.event_loop()
    finally:
        controller.close()
