"""Raft links over TCP (pysyncobj's ``TcpConnection`` and ``TcpServer`` replaced): the protocol
of `tickwheel.replication.raft.link_protocol` on non-blocking sockets, driven by pysyncobj's poller
on the Raft thread; `tickwheel.replication.raft.transport` plugs them into pysyncobj's transport.
The handshake's logic is `tickwheel.replication.raft.handshake`; the listener is
`tickwheel.replication.raft.link_server`.

pysyncobj's own connection unpickles whatever arrives on the Raft port, buffers announced frames
of up to 2 GiB (quadratically) before any check, and answers ``status`` to anyone; its
optional password (Fernet) still leaves the length and the buffering open before
authentication. Here, until the handshake ends an acceptor reads exactly the bytes the step
needs (never more than `link_protocol.HELLO`'s 45), drops a link that has not finished within
``handshake_timeout_ms``, and keeps at most ``max_unauthenticated`` such links (a new one
pushes out the oldest); after it, a frame longer than ``max_frame_bytes`` drops the link, as
does a frame that fails its tag or does not unpickle into plain data. Refusals are logged at
most once every `REFUSAL_LOG_INTERVAL_S`.

Callbacks and states use pysyncobj's names and values (``CONNECTION_STATE``,
``POLL_EVENT_TYPE``), which `tickwheel.replication.raft.transport` checks against pysyncobj's own.
"""

from __future__ import annotations

import logging
import pickle
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tickwheel.replication.raft.handshake import (
    AWAIT_HELLO,
    AWAIT_PROOF,
    DIALING,
    OPEN,
    Handshake,
    Refused,
)
from tickwheel.replication.raft.link_protocol import (
    FRAME_HEAD,
    PICKLE_PROTOCOL,
    LinkSettings,
    frame_nonce,
    safe_loads,
)

log = logging.getLogger("tickwheel.replication")

READ, WRITE, ERROR = 1, 2, 4
"""Poller event bits (pysyncobj's ``POLL_EVENT_TYPE``)."""
DISCONNECTED, CONNECTING, CONNECTED = 0, 1, 2
"""Link states as pysyncobj's transport reads them (its ``CONNECTION_STATE``)."""


class Poller(Protocol):
    """pysyncobj's poller, as links use it."""

    def subscribe(self, fileno: int, callback: Callable[[int, int], None], events: int
                  ) -> None: ...

    def unsubscribe(self, fileno: int) -> None: ...


SEND_BATCH_BUFFERS = 64
"""Buffers handed to one ``sendmsg``."""
REFUSAL_LOG_INTERVAL_S = 10.0


class Link:
    """One Raft link (pysyncobj's ``TcpConnection`` interface): dialled with `connect`, or
    accepted by `LinkServer` with ``sock``. Owned by the Raft thread; ``on_message`` sees
    only what an authenticated peer sent."""

    def __init__(self, poller: Poller, settings: LinkSettings, *,
                 sock: socket.socket | None = None) -> None:
        self._poller = poller
        self._settings = settings
        self._socket: socket.socket | None = None
        self._fileno: int | None = None
        self._on_message: Callable[[object], None] | None = None
        self._on_connected: Callable[[], None] | None = None
        self._on_disconnected: Callable[[], None] | None = None
        self.encryptor = self.sendRandKey = self.recvRandKey = None  # pysyncobj sets them
        self.peer = "-"
        self.state = DISCONNECTED
        self._reset()
        if sock is not None:
            self._adopt(sock, accepted=True)

    # -- what pysyncobj's transport calls ---------------------------------------------------

    def setOnConnectedCallback(self, callback: Callable[[], None] | None) -> None:
        self._on_connected = callback

    def setOnMessageReceivedCallback(
            self, callback: Callable[[object], None] | None) -> None:
        self._on_message = callback

    def setOnDisconnectedCallback(
            self, callback: Callable[[], None] | None) -> None:
        self._on_disconnected = callback

    def connect(self, host: str | None, port: int) -> bool:
        if host is None:
            return False
        sock = socket.socket(family(host), socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect((host, port))
        except BlockingIOError:
            pass
        except OSError:
            sock.close()
            return False
        self._adopt(sock, accepted=False)
        self.peer = f"{host}:{port}"
        return True

    def send(self, message: object) -> None:
        if self.state != CONNECTED:
            return
        data = pickle.dumps(message, protocol=PICKLE_PROTOCOL)
        if self._send_aead is not None:
            data = self._send_aead.encrypt(frame_nonce(self._send_count), data, None)
            self._send_count += 1
        self._queue(FRAME_HEAD.pack(len(data)), data)

    def disconnect(self) -> None:
        was = self.state
        if self._socket is not None:
            if self._fileno is not None:
                self._poller.unsubscribe(self._fileno)
            self._socket.close()
        self._socket = self._fileno = None
        self.state = DISCONNECTED
        self._reset()
        if was != DISCONNECTED and self._on_disconnected is not None:
            self._on_disconnected()

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:
        return self._out_bytes

    # -- what the Raft thread's tick calls --------------------------------------------------

    @property
    def authenticated(self) -> bool:
        return self._handshake.step == OPEN

    def check_deadlines(self, now_s: float) -> None:
        """Drop the link if its handshake or its silence has gone on too long."""
        if self.state == DISCONNECTED:
            return
        if self._handshake.step != OPEN and now_s > self._handshake_deadline_s:
            if self._handshake.step in (AWAIT_HELLO, AWAIT_PROOF):
                self.refuse("handshake_timeout")  # a stranger, or a peer that stalled
            else:
                self.disconnect()  # a peer we dial that is down or cut off: not a refusal
        elif now_s - self._last_read_s > self._settings.idle_timeout_ms / 1000:
            self.disconnect()

    # -- internals --------------------------------------------------------------------------

    def _reset(self, *, dialler: bool = True) -> None:
        self._handshake = Handshake(self._settings.keys, dialler=dialler)
        self._in = bytearray()
        self._out: deque[memoryview] = deque()
        self._out_bytes = 0
        self._send_aead: AESGCM | None = None
        self._recv_aead: AESGCM | None = None
        self._send_count = self._recv_count = 0
        self._last_read_s = time.monotonic()
        self._handshake_deadline_s = (self._last_read_s
                                      + self._settings.handshake_timeout_ms / 1000)

    def _adopt(self, sock: socket.socket, *, accepted: bool) -> None:
        self._reset(dialler=not accepted)
        settings = self._settings
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, settings.send_buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, settings.recv_buffer_bytes)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self._socket, self._fileno = sock, sock.fileno()
        self.state = CONNECTING
        if accepted:
            try:
                host, port = sock.getpeername()[:2]
                self.peer = f"{host}:{port}"
            except OSError:
                self.peer = "?"
        self._subscribe(dialling=not accepted)

    def _subscribe(self, dialling: bool = False) -> None:
        if self._fileno is None:
            return
        events = READ | ERROR
        if dialling or self._out:
            events |= WRITE
        self._poller.subscribe(self._fileno, self._on_event, events)

    def _on_event(self, fileno: int, events: int) -> None:
        if fileno != self._fileno or self._socket is None:
            self._poller.unsubscribe(fileno)
            return
        if events & ERROR or self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.disconnect()
            return
        if self._handshake.step == DIALING:
            self._queue(self._handshake.hello())
            return
        if events & WRITE:
            self._flush()
        if events & READ and self.state != DISCONNECTED:
            self._read()

    def _queue(self, *buffers: bytes) -> None:
        for buffer in buffers:
            self._out.append(memoryview(buffer))
            self._out_bytes += len(buffer)
        self._flush()

    def _flush(self) -> None:
        while self._out and self._socket is not None:
            try:
                sent = self._socket.sendmsg(list(_head(self._out, SEND_BATCH_BUFFERS)))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.disconnect()
                return
            self._out_bytes -= sent
            while sent:
                first = self._out[0]
                if sent >= len(first):
                    sent -= len(first)
                    self._out.popleft()
                else:
                    self._out[0] = first[sent:]
                    sent = 0
        self._subscribe()

    def _read(self) -> None:
        """Read what the current step may take (exactly its bytes during the handshake),
        then act on every complete unit."""
        while self.state != DISCONNECTED and self._socket is not None:
            wanted = self._wanted()
            try:
                chunk = self._socket.recv(wanted)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.disconnect()
                return
            if not chunk:
                self.disconnect()
                return
            self._last_read_s = time.monotonic()
            self._in += chunk
            self._consume()

    def _wanted(self) -> int:
        step = self._handshake.wanted
        if step is None:
            return self._settings.recv_buffer_bytes
        return step - len(self._in)

    def _consume(self) -> None:
        handshake = self._handshake
        if handshake.step == OPEN:
            self._deliver_frames()
            return
        if len(self._in) != handshake.wanted:
            return
        step = bytes(self._in)
        self._in.clear()
        try:
            answer = handshake.receive(step)
        except Refused as refused:
            self.refuse(refused.reason)
            return
        if answer:
            self._queue(answer)
        if handshake.step == OPEN:
            self._open()

    def _open(self) -> None:
        if not self._settings.insecure:
            self._send_aead, self._recv_aead = self._handshake.ciphers()
        self.state = CONNECTED
        if self._handshake.dialler and self._on_connected is not None:
            self._on_connected()

    def _deliver_frames(self) -> None:
        buffer, position = self._in, 0
        limit = self._settings.max_frame_bytes
        while len(buffer) - position >= FRAME_HEAD.size:
            (length,) = FRAME_HEAD.unpack_from(buffer, position)
            if length > limit:
                self.refuse("frame_too_large", length=length)
                return
            end = position + FRAME_HEAD.size + length
            if len(buffer) < end:
                break
            frame = bytes(buffer[position + FRAME_HEAD.size:end])
            position = end
            message = self._open_frame(frame)
            if message is None:
                return
            if self._on_message is not None:
                self._on_message(message)
            if self.state == DISCONNECTED or self._in is not buffer:
                return
        del buffer[:position]

    def _open_frame(self, frame: bytes) -> object | None:
        try:
            if self._recv_aead is not None:
                frame = self._recv_aead.decrypt(frame_nonce(self._recv_count), frame, None)
                self._recv_count += 1
        except InvalidTag:
            self.refuse("bad_frame_tag")
            return None
        try:
            return safe_loads(frame)
        except Exception as error:  # any malformed pickle: drop the link, never the node
            self.refuse("bad_frame_content", error=repr(error)[:200])
            return None

    def refuse(self, reason: str, **details: object) -> None:
        """Drop the link for ``reason``, counted and (rate-limited) logged."""
        _refusals.note(reason, self.peer, details)
        self.disconnect()


class _Refusals:
    """Refused links, logged at most once every `REFUSAL_LOG_INTERVAL_S` (a port scan or a
    flood must not flood the log), with how many were not logged."""

    def __init__(self) -> None:
        self._logged_s = -float("inf")
        self._unlogged = 0
        self.total = 0

    def note(self, reason: str, peer: str, details: dict[str, object]) -> None:
        self.total += 1
        now_s = time.monotonic()
        if now_s - self._logged_s < REFUSAL_LOG_INTERVAL_S:
            self._unlogged += 1
            return
        extra = "".join(f" {key}={value!r}" for key, value in details.items())
        log.warning("event=raft_link_refused reason=%s peer=%r%s not_logged_since_last=%d",
                    reason, peer, extra, self._unlogged)
        self._logged_s, self._unlogged = now_s, 0


_refusals = _Refusals()

def family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _head(buffers: deque[memoryview], count: int) -> list[memoryview]:
    return [buffers[i] for i in range(min(count, len(buffers)))]
