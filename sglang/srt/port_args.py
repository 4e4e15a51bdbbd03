"""The ZMQ endpoints and torch.distributed rendezvous of one server instance (`PortArgs`), made from
its `ServerArgs`; `sglang.srt.server_args` re-exports it under upstream's import path (so this module
never imports `server_args`: `create` reads the fields it needs from the object it is given)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PortArgs:
    """ZMQ endpoints (process-local ipc:// sockets in one private directory) and the torch.distributed
    rendezvous of one server instance."""

    ipc_dir: str
    tokenizer_ipc_name: str  # detokenizer -> tokenizer manager
    scheduler_input_ipc_name: str  # tokenizer manager -> scheduler rank 0
    detokenizer_ipc_name: str  # scheduler rank 0 -> detokenizer
    nccl_port: int  # torch.distributed init port when --dist-init-addr is not given
    # --dp-size > 1: the controller binds scheduler_input_ipc_name and dp_load_ipc_name; replica k's rank 0
    # binds replica_input_ipc_names[k], and its TP group meets at replica_nccl_ports[k]
    dp_load_ipc_name: str = ""
    replica_input_ipc_names: tuple[str, ...] = ()
    replica_nccl_ports: tuple[int, ...] = ()
    # --language-only (EPD): the tcp:// endpoint encoders push embeddings to (bound by scheduler rank 0, the
    # data-parallel controller at --dp-size > 1, or the tokenizer manager under zmq_to_tokenizer)
    epd_embedding_addr: str = ""

    def for_replica(self, dp_rank: int) -> "PortArgs":
        """What replica `dp_rank`'s schedulers see: their own input socket and rendezvous port."""
        import dataclasses

        return dataclasses.replace(self, scheduler_input_ipc_name=self.replica_input_ipc_names[dp_rank],
                                   nccl_port=self.replica_nccl_ports[dp_rank])

    @classmethod
    def create(cls, server_args) -> "PortArgs":
        import os
        import tempfile

        from sglang.srt.utils.network import pick_unused_port

        d = tempfile.mkdtemp(prefix="sglang-ipc-")
        if len(f"{d}/detokenizer") > _UNIX_SOCKET_PATH_MAX:  # a deep TMPDIR: ZMQ could not bind there
            os.rmdir(d)
            d = tempfile.mkdtemp(prefix="sglang-ipc-", dir="/tmp")
        port = pick_unused_port()
        dp = server_args.dp_size
        return cls(
            ipc_dir=d,
            tokenizer_ipc_name=f"ipc://{d}/tokenizer",
            scheduler_input_ipc_name=f"ipc://{d}/scheduler",
            detokenizer_ipc_name=f"ipc://{d}/detokenizer",
            nccl_port=port,
            dp_load_ipc_name=f"ipc://{d}/dp-load" if dp > 1 else "",
            replica_input_ipc_names=tuple(f"ipc://{d}/scheduler-dp{k}" for k in range(dp)) if dp > 1 else (),
            replica_nccl_ports=tuple(pick_unused_port() for _ in range(dp)) if dp > 1 else (),
            epd_embedding_addr=_epd_embedding_addr(server_args),
        )


# sockaddr_un holds 108 bytes on Linux, the terminating NUL included
_UNIX_SOCKET_PATH_MAX = 107


def _epd_embedding_addr(server_args) -> str:
    if not getattr(server_args, "language_only", False):
        return ""
    from sglang.srt.utils.network import pick_unused_port

    host = server_args.host
    if host in ("0.0.0.0", "::", ""):  # encoders on other machines reach this host by its name's address
        import socket

        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    from sglang.srt.environ import envs

    return f"tcp://{host}:{envs.SGLANG_EPD_EMBEDDING_PORT.get() or pick_unused_port()}"
