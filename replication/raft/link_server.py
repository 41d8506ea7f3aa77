"""The Raft port's listener (pysyncobj's ``TcpServer`` replaced): accepts links and bounds how
many may be in their handshake at once (`tickwheel.replication.raft.wire`)."""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable

from tickwheel.replication.raft.link_protocol import LinkSettings
from tickwheel.replication.raft.wire import DISCONNECTED, ERROR, READ, Link, Poller, family


class LinkServer:
    """Listens on exactly ``host:port`` (pysyncobj's ``TcpServer`` interface) and hands each
    accepted `Link` to ``on_link``; keeps at most ``max_unauthenticated`` links in their
    handshake, pushing out the oldest."""

    def __init__(self, poller: Poller, host: str, port: int,
                 on_link: Callable[[Link], None], settings: LinkSettings) -> None:
        self._poller = poller
        self._address = (host, port)
        self._on_link = on_link
        self._settings = settings
        self._socket: socket.socket | None = None
        self._handshaking: deque[Link] = deque()

    def bind(self) -> None:
        sock = socket.socket(family(self._address[0]), socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self._address)
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self._poller.subscribe(sock.fileno(), self._on_event, READ | ERROR)

    def unbind(self) -> None:
        if self._socket is not None:
            self._poller.unsubscribe(self._socket.fileno())
            self._socket.close()
            self._socket = None
        for link in list(self._handshaking):
            link.disconnect()
        self._handshaking.clear()

    def _on_event(self, _fileno: int, events: int) -> None:
        if events & ERROR:
            self.unbind()
            return
        while self._socket is not None:
            try:
                sock, _ = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._admit(Link(self._poller, self._settings, sock=sock))

    def _admit(self, link: Link) -> None:
        pending = self._handshaking = deque(
            waiting for waiting in self._handshaking
            if waiting.state != DISCONNECTED and not waiting.authenticated)
        if len(pending) >= self._settings.max_unauthenticated:
            oldest = pending.popleft()
            oldest.refuse("too_many_unauthenticated")
        pending.append(link)
        self._on_link(link)
