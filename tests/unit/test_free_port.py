"""free_port picks a listening port outside the kernel's ephemeral range: a port taken from that
range (bind to port 0) is also the pool every outgoing connection's local port comes from, so a
client of another process could hold it before the caller binds it (seen under two pytest
workers: a replica's metrics port "Address already in use")."""

from __future__ import annotations

import socket

from icesink.app.embedded import ephemeral_ports, free_port


def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    low, _ = ephemeral_ports()
    ports = {free_port() for _ in range(50)}
    assert all(1024 <= p < low for p in ports), sorted(ports)
    assert len(ports) > 40  # drawn at random: two processes rarely pick the same one
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", ports.pop()))  # free on every interface (metrics listen on 0.0.0.0)


def test_the_ephemeral_range_is_read_from_the_kernel() -> None:
    low, high = ephemeral_ports()
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        assert (low, high) == tuple(int(x) for x in f.read().split())
