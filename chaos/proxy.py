"""TCP proxies on every Raft link, so the runner can cut a node off from its peers and heal it.

pysyncobj names a node by its address and opens each link from one side only: the node whose
address is greater (as a string) dials the other, and says who it is in its first message. So
every link can be put behind a proxy of its own without the nodes noticing:

- node ``i`` binds its own address ``A_i`` (its identity);
- for a pair with ``A_i > A_j``, node ``i`` is told that ``j`` lives at ``P_ij``, a proxy that
  forwards to ``A_j``; node ``j`` knows ``i`` as ``A_i`` (it never dials it);
- every ``P_ij`` must sort below every ``A_i``, so that ``i`` still dials ``j``: all ports have
  five digits and the proxies get the lowest.

Each node therefore has its own member list (`RaftMesh.members_of`). To partition node ``x``, the
runner blocks the proxies of every link ``x`` is on, in one of two ways:

- ``reset``: open connections are closed, new ones are accepted and closed at once, so pysyncobj
  sees its peers drop and redials them every ``connection_retry_ms`` (a host that is down);
- ``blackhole``: connections stay open (new ones are accepted too) but every byte is dropped,
  as when packets are lost; pysyncobj still counts its peers connected, so a cut-off node stands
  for election as it would in a real network partition. Healing closes the blackholed
  connections (a byte stream with a hole in it is no longer a valid one) and pysyncobj redials.

Healing unblocks every link. The proxies run on an asyncio loop in a daemon
thread; they bind 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field

log = logging.getLogger("tickwheel.chaos.proxy")

_CHUNK_BYTES = 64 << 10
PARTITION_MODES = ("reset", "blackhole")


@dataclass
class _Link:
    """The proxy for one Raft link: ``dialer`` reaches ``target`` through ``port``."""

    dialer: int
    target: int
    port: int
    target_port: int
    blocked: bool = False
    blackhole: bool = False
    server: asyncio.AbstractServer | None = None
    writers: set[asyncio.StreamWriter] = field(default_factory=set)


class RaftMesh:
    """Proxies for every pair of ``len(node_ports)`` nodes. ``node_ports`` and ``proxy_ports``
    (``n * (n - 1) / 2`` of them) are free ports; the mesh sorts them as the trick needs."""

    def __init__(self, node_ports: list[int], proxy_ports: list[int]) -> None:
        ports = sorted(node_ports + proxy_ports)
        if any(not 10_000 <= port <= 65_535 for port in ports):
            raise ValueError("the mesh needs five-digit ports (string order = number order)")
        links = len(node_ports) * (len(node_ports) - 1) // 2
        if len(proxy_ports) != links:
            raise ValueError(f"{len(node_ports)} nodes need {links} proxy ports")
        self.node_ports = ports[links:]
        self._links: dict[tuple[int, int], _Link] = {}
        pairs = itertools.combinations(range(len(self.node_ports)), 2)
        for port, (low, high) in zip(ports[:links], pairs, strict=True):
            self._links[(high, low)] = _Link(high, low, port, self.node_ports[low])
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raft-mesh",
                                        daemon=True)

    def address(self, node: int) -> str:
        """Node ``node``'s Raft address (its identity, and where it binds)."""
        return f"127.0.0.1:{self.node_ports[node]}"

    def members_of(self, node: int) -> list[str]:
        """The Raft address under which ``node`` knows each node (itself included), by index."""
        return [self.address(other) if (node, other) not in self._links
                else f"127.0.0.1:{self._links[(node, other)].port}"
                for other in range(len(self.node_ports))]

    def start(self) -> None:
        self._thread.start()
        self._run(self._start_all())

    def stop(self) -> None:
        self._run(self._stop_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def isolate(self, node: int, mode: str = "reset") -> None:
        """Cut every link of ``node``: it can reach no peer, and no peer can reach it.
        ``mode`` is ``reset`` or ``blackhole`` (see the module docstring)."""
        if mode not in PARTITION_MODES:
            raise ValueError(f"partition mode {mode!r} is not one of {PARTITION_MODES}")
        self._run(self._set_blocked(node, blocked=True, blackhole=mode == "blackhole"))

    def heal(self) -> None:
        """Restore every link."""
        self._run(self._set_blocked(None, blocked=False))

    def blocked_links(self) -> int:
        return sum(link.blocked for link in self._links.values())

    def __enter__(self) -> RaftMesh:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- on the loop ------------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[object, object, None]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _start_all(self) -> None:
        for link in self._links.values():
            link.server = await asyncio.start_server(
                functools.partial(self._accept, link), "127.0.0.1", link.port)

    async def _stop_all(self) -> None:
        servers = [link.server for link in self._links.values() if link.server is not None]
        for server in servers:
            server.close()
        for link in self._links.values():
            self._drop(link)
        for server in servers:
            await server.wait_closed()

    async def _set_blocked(self, node: int | None, *, blocked: bool,
                           blackhole: bool = False) -> None:
        for link in self._links.values():
            if node is None or node in (link.dialer, link.target):
                if (blocked and not blackhole) or link.blackhole:
                    self._drop(link)
                link.blocked, link.blackhole = blocked, blocked and blackhole
        log.info("event=mesh_%s node=%s blackhole=%s", "isolate" if blocked else "heal", node,
                 blackhole)

    @staticmethod
    def _drop(link: _Link) -> None:
        for writer in list(link.writers):
            writer.transport.abort()
        link.writers.clear()

    async def _accept(self, link: _Link, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        if link.blocked and not link.blackhole:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", link.target_port)
        except OSError:
            writer.transport.abort()
            return
        if link.blocked and not link.blackhole:  # cut while this connection was being made
            writer.transport.abort()
            upstream_writer.transport.abort()
            return
        pair = (writer, upstream_writer)
        link.writers.update(pair)
        try:
            await asyncio.gather(self._pipe(link, reader, upstream_writer),
                                 self._pipe(link, upstream_reader, writer))
        finally:
            for end in pair:
                link.writers.discard(end)
                end.transport.abort()

    @staticmethod
    async def _pipe(link: _Link, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(_CHUNK_BYTES):
                if link.blackhole:
                    continue
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
