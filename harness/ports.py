"""The ports `LocalCluster` gives its nodes: free ones below the kernel's ephemeral range, from
a part of it of each parallel test worker's own."""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
PORT_RANGE_ENV = "TICKWHEEL_PORT_RANGE"
"""``FIRST-LAST``: the ports `free_ports` picks from, a part of its usual range. Parallel test
workers are each given a range of their own (tests/conftest.py), so that two never pick the
same port; the processes they start inherit it."""


def port_range() -> range:
    """Where `free_ports` picks: from `LOWEST_PORT` to the kernel's ephemeral range, or the
    part of it that ``TICKWHEEL_PORT_RANGE`` names."""
    try:
        first_ephemeral = int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32_768  # Linux's default
    usual = range(LOWEST_PORT, first_ephemeral)
    named = os.environ.get(PORT_RANGE_ENV)
    if not named:
        return usual
    first, _, last = named.partition("-")
    try:
        chosen = range(int(first), int(last) + 1)
    except ValueError:
        raise ValueError(f"{PORT_RANGE_ENV}={named!r}: not FIRST-LAST") from None
    if not chosen or chosen.start < usual.start or chosen.stop > usual.stop:
        raise ValueError(f"{PORT_RANGE_ENV}={named!r}: must lie within {usual.start}-"
                         f"{usual.stop - 1}, below the ephemeral range")
    return chosen


_given: set[int] = set()
"""Ports this process handed out: free when picked, but bound only later (a chaos cluster
picks its nodes' ports, then its proxies' ports, and binds the proxies' first: one of them
took a node's gRPC port, and the node could not start). None is handed out twice until every
port of the range has been."""
_giving = threading.Lock()


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now, from `port_range`: below the kernel's
    ephemeral range, and none this process handed out before (`_given`). A node killed and
    started again binds its ports again, and a port from the ephemeral range may by then be
    the local end of any outgoing connection (a chaos run saw a restarted node fail to bind
    its peer port that way)."""
    usable = port_range()
    candidates = list(usable)
    random.SystemRandom().shuffle(candidates)
    with _giving:
        for attempt in range(2):
            ports: list[int] = []
            for port in candidates:
                if port in _given:
                    continue
                with socket.socket() as sock:
                    try:
                        sock.bind(("127.0.0.1", port))
                    except OSError:
                        continue
                ports.append(port)
                if len(ports) == count:
                    _given.update(ports)
                    return ports
            if attempt == 0:
                _given.difference_update(usable)  # every one given once: start over
    raise OSError(f"fewer than {count} free ports in {usable.start}-{usable.stop - 1}")
