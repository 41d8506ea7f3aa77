"""pysyncobj's TCP transport on our links (`tickwheel.replication.raft.wire`): members only."""

from __future__ import annotations

import functools
import time
from typing import Any

import pysyncobj.poller
import pysyncobj.tcp_connection
from pysyncobj import SyncObj
from pysyncobj.transport import TCPTransport

from tickwheel.common.errors import invariant
from tickwheel.replication.raft import wire
from tickwheel.replication.raft.clocks import PeerClocks
from tickwheel.replication.raft.link_protocol import LinkSettings
from tickwheel.replication.raft.link_server import LinkServer
from tickwheel.replication.raft.tenure import TenureClock
from tickwheel.replication.raft.versions import MemberVersions

SWEEP_INTERVAL_S = 0.1


class LinkTransport(TCPTransport):
    """pysyncobj's TCP transport on `wire.Link`s: it listens on exactly its address, and a
    link counts only once it has proven the secret and named a member. pysyncobj's utility
    commands (``status``, ``add``, ...) and read-only nodes are not offered. Every message
    sent gets its tenure stamp (`TenureClock.outgoing`), and every answer this node's clock
    (`PeerClocks.outgoing`) and version (`MemberVersions.outgoing`)."""

    def __init__(self, syncObj: SyncObj, selfNode: object, otherNodes: object, *,
                 links: LinkSettings, tenure: TenureClock, clocks: PeerClocks,
                 versions: MemberVersions | None = None) -> None:
        self._links = links
        self._tenure = tenure
        self._clocks = clocks
        self._versions = versions or MemberVersions()
        self._next_sweep_s = 0.0
        super().__init__(syncObj, selfNode, otherNodes)

    def _createServer(self) -> None:
        address = self._syncObj.conf.bindAddress or self._selfNode.address
        host, port = address.rsplit(":", 1)
        self._server = LinkServer(self._syncObj._poller, host, int(port),
                                       self._onNewIncomingConnection, self._links)

    def addNode(self, node: Any) -> None:  # pysyncobj's TCPNode
        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        if self._shouldConnect(node):
            link = wire.Link(self._syncObj._poller, self._links)
            link.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, link))
            link.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            link.setOnDisconnectedCallback(functools.partial(self._onDisconnected, link))
            self._connections[node] = link

    def send(self, node: Any, message: Any) -> bool:
        if isinstance(message, dict):
            self._tenure.outgoing(node, message)
            self._clocks.outgoing(message)
            self._versions.outgoing(message)
        return bool(super().send(node, message))

    def _onIncomingMessageReceived(self, conn: wire.Link, message: object) -> None:
        """The first message of an accepted, authenticated link: the member it comes from."""
        self._unknownConnections.discard(conn)
        node = self._nodeAddrToNode.get(message) if isinstance(message, str) else None
        if node is None:
            conn.refuse("not_a_member", claimed=repr(message)[:100])
            return
        self._connections[node] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        self._onNodeConnected(node)

    def _onTick(self) -> None:
        """pysyncobj's (bind, redial), then every `SWEEP_INTERVAL_S` the links' deadlines:
        they are seconds long, and a busy Raft thread ticks thousands of times a second."""
        super()._onTick()
        now_s = time.monotonic()
        if now_s < self._next_sweep_s:
            return
        self._next_sweep_s = now_s + SWEEP_INTERVAL_S
        for link in [*self._connections.values(), *self._unknownConnections]:
            link.check_deadlines(now_s)


invariant((wire.DISCONNECTED, wire.CONNECTING, wire.CONNECTED) == (
    pysyncobj.tcp_connection.CONNECTION_STATE.DISCONNECTED,
    pysyncobj.tcp_connection.CONNECTION_STATE.CONNECTING,
    pysyncobj.tcp_connection.CONNECTION_STATE.CONNECTED),
    "the link layer speaks pysyncobj's connection states by value")
invariant((wire.READ, wire.WRITE, wire.ERROR) == (
    pysyncobj.poller.POLL_EVENT_TYPE.READ, pysyncobj.poller.POLL_EVENT_TYPE.WRITE,
    pysyncobj.poller.POLL_EVENT_TYPE.ERROR), "the link layer speaks pysyncobj's poller events")
