"""Port choice: below the kernel's ephemeral range, never one that is bound, never twice from one process."""

from __future__ import annotations

import socket

from sglang.srt.utils import network
from sglang.srt.utils.network import ephemeral_port_range, pick_unused_port


def test_ports_lie_below_the_ephemeral_range_bind_and_do_not_repeat():
    lo, _ = ephemeral_port_range()
    ports = [pick_unused_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    for port in ports:
        assert 10000 <= port < lo
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # raises if the port was not free


def test_a_port_someone_listens_on_is_skipped(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(network, "ephemeral_port_range", lambda: (65000, 65535))
        draws = iter([taken, taken, 23456])
        monkeypatch.setattr(network._rng, "randrange", lambda lo, hi: next(draws))
        network._handed_out.discard(23456)
        assert pick_unused_port() == 23456


def test_an_ephemeral_range_without_room_below_falls_back_to_the_kernel(monkeypatch):
    monkeypatch.setattr(network, "ephemeral_port_range", lambda: (10500, 60999))
    port = pick_unused_port()
    assert port > 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
