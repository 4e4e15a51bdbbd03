"""Choosing a free TCP port that stays free until it is bound.

A port taken from `bind(("127.0.0.1", 0))` lies in the kernel's ephemeral range, the same range the
kernel draws from for every outgoing connection. Between choosing such a port and binding it (seconds for
a server that loads a model first), a gloo or HTTP client connection on the machine can be given it, and
the bind then fails with EADDRINUSE. Ports below the ephemeral range are never handed out implicitly, so
only another explicit chooser can take one: picking at random there and checking that it binds makes a
clash unlikely instead of likely under load."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# used when /proc is unreadable: Linux's default net.ipv4.ip_local_port_range
_DEFAULT_EPHEMERAL = (32768, 60999)
_LOWEST = 10000  # below are well-known and registered services' habits
_ATTEMPTS = 64
_handed_out: set[int] = set()  # never the same port twice from one process
_rng = random.SystemRandom()


def ephemeral_port_range() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def _binds(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_unused_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to on `host`, outside the ephemeral range where that range leaves room
    below it; otherwise (an unusual range) whatever the kernel gives."""
    lo = _LOWEST
    hi = ephemeral_port_range()[0]
    if hi - lo >= 1000:
        for _ in range(_ATTEMPTS):
            port = _rng.randrange(lo, hi)
            if port not in _handed_out and _binds(port, host):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port
