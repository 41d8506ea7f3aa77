"""The Raft link layer on its own: real sockets on 127.0.0.1, one thread, a small poller."""

from __future__ import annotations

import os
import pickle
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tickwheel.replication.raft import link_protocol, wire
from tickwheel.replication.raft.link_protocol import LinkSettings
from tickwheel.replication.raft.link_server import LinkServer
from tickwheel.replication.raft.wire import CONNECTED, DISCONNECTED, Link

SECRET = b"a-test-secret-of-enough-bytes-0123"
SETTINGS = LinkSettings(secrets=(SECRET,), max_frame_bytes=16 << 20)


class Poller:
    """pysyncobj's poller interface over `selectors`."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()

    def subscribe(self, fileno: int, callback: Callable[[int, int], None], events: int) -> None:
        mask = ((selectors.EVENT_READ if events & (wire.READ | wire.ERROR) else 0)
                | (selectors.EVENT_WRITE if events & wire.WRITE else 0))
        if fileno in self._selector.get_map():
            self._selector.modify(fileno, mask, callback)
        else:
            self._selector.register(fileno, mask, callback)

    def unsubscribe(self, fileno: int) -> None:
        if fileno in self._selector.get_map():
            self._selector.unregister(fileno)

    def poll(self, timeout_s: float) -> None:
        for key, mask in self._selector.select(timeout_s):
            events = ((wire.READ if mask & selectors.EVENT_READ else 0)
                      | (wire.WRITE if mask & selectors.EVENT_WRITE else 0))
            key.data(key.fd, events)

    def until(self, condition: Callable[[], object], timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not met")
            self.poll(0.01)


class Ends:
    """A server and what it accepted, plus a dialled link."""

    def __init__(self, poller: Poller, server_settings: LinkSettings = SETTINGS) -> None:
        self.poller = poller
        self.accepted: list[Link] = []
        self.received: list[object] = []
        self.server = LinkServer(poller, "127.0.0.1", 0, self._accept, server_settings)
        self.server.bind()
        self.port = self.server._socket.getsockname()[1]

    def _accept(self, link: Link) -> None:
        link.setOnMessageReceivedCallback(self.received.append)
        self.accepted.append(link)

    def dial(self, settings: LinkSettings = SETTINGS) -> tuple[Link, list[object]]:
        link, got = Link(self.poller, settings), []
        link.setOnMessageReceivedCallback(got.append)
        assert link.connect("127.0.0.1", self.port)
        return link, got

    def raw(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        self.poller.until(lambda: len(self.accepted) > 0 and self.accepted[-1].peer
                          == f"127.0.0.1:{sock.getsockname()[1]}")
        return sock


@pytest.fixture
def ends() -> Iterator[Ends]:
    result = Ends(Poller())
    yield result
    result.server.unbind()


def test_members_with_the_same_secret_talk_both_ways_also_in_large_frames(ends: Ends) -> None:
    dialled, got = ends.dial()
    ends.poller.until(lambda: dialled.state == CONNECTED and ends.accepted
                      and ends.accepted[0].state == CONNECTED)
    big = {"type": "append_entries", "entries": [(os.urandom(1 << 20), i, 3) for i in range(8)]}
    dialled.send("127.0.0.1:9999")
    dialled.send(big)
    ends.accepted[0].send({"type": "reply", "term": 3})
    ends.poller.until(lambda: len(ends.received) == 2 and got)
    assert ends.received == ["127.0.0.1:9999", big]
    assert got == [{"type": "reply", "term": 3}]


def test_a_wrong_secret_never_connects_and_delivers_nothing(ends: Ends) -> None:
    wrong, _ = ends.dial(LinkSettings(secrets=(b"another-secret-of-enough-bytes-99",)))
    refused_before = wire._refusals.total
    ends.poller.until(lambda: wire._refusals.total > refused_before
                      and wrong.state == DISCONNECTED)
    assert ends.received == []


def test_an_insecure_node_and_a_secure_one_refuse_each_other(ends: Ends) -> None:
    insecure, _ = ends.dial(LinkSettings(secrets=(b"",), insecure=True))
    refused_before = wire._refusals.total
    ends.poller.until(lambda: wire._refusals.total > refused_before
                      and insecure.state == DISCONNECTED)


def test_insecure_nodes_talk_in_the_clear() -> None:
    insecure = LinkSettings(secrets=(b"",), insecure=True)
    ends = Ends(Poller(), insecure)
    try:
        dialled, _ = ends.dial(insecure)
        ends.poller.until(lambda: dialled.state == CONNECTED)
        dialled.send({"type": "hello"})
        ends.poller.until(lambda: ends.received)
        assert ends.received == [{"type": "hello"}]
    finally:
        ends.server.unbind()


def test_a_flipped_byte_in_a_frame_drops_the_link_before_anything_is_delivered(
        ends: Ends) -> None:
    dialled, _ = ends.dial()
    ends.poller.until(lambda: dialled.state == CONNECTED and ends.accepted
                      and ends.accepted[0].state == CONNECTED)
    nonce = link_protocol.frame_nonce(0)
    frame = bytearray(dialled._send_aead.encrypt(nonce, pickle.dumps("x"), None))
    frame[3] ^= 0x01
    dialled._socket.sendall(link_protocol.FRAME_HEAD.pack(len(frame)) + frame)
    ends.poller.until(lambda: ends.accepted[0].state == DISCONNECTED)
    assert ends.received == []


def test_a_replayed_frame_drops_the_link(ends: Ends) -> None:
    dialled, _ = ends.dial()
    ends.poller.until(lambda: dialled.state == CONNECTED)
    nonce = link_protocol.frame_nonce(0)
    frame = dialled._send_aead.encrypt(nonce, pickle.dumps("127.0.0.1:1"), None)
    dialled._send_count = 1
    dialled._socket.sendall((link_protocol.FRAME_HEAD.pack(len(frame)) + frame) * 2)
    ends.poller.until(lambda: ends.accepted[0].state == DISCONNECTED)
    assert ends.received == ["127.0.0.1:1"]


def test_an_authenticated_peer_cannot_make_a_node_run_code(ends: Ends, tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    dialled, _ = ends.dial()
    ends.poller.until(lambda: dialled.state == CONNECTED)
    dialled.send(Payload())
    ends.poller.until(lambda: ends.accepted[0].state == DISCONNECTED)
    assert ends.received == []
    assert not marker.exists()


def test_a_member_announcing_a_frame_beyond_the_limit_is_dropped(ends: Ends) -> None:
    dialled, _ = ends.dial()
    ends.poller.until(lambda: dialled.state == CONNECTED and ends.accepted
                      and ends.accepted[0].state == CONNECTED)
    dialled._socket.sendall(link_protocol.FRAME_HEAD.pack(SETTINGS.max_frame_bytes + 1))
    ends.poller.until(lambda: ends.accepted[0].state == DISCONNECTED)


def test_before_authentication_a_link_buffers_only_the_step_it_waits_for(ends: Ends) -> None:
    sock = ends.raw()
    # pysyncobj's framing: a little-endian length of 2 GiB - 1, then data.
    sock.sendall(struct.pack("<i", 2**31 - 1) + b"\0" * (link_protocol.HELLO.size - 4))
    link = ends.accepted[-1]
    ends.poller.until(lambda: link.state == DISCONNECTED)
    assert len(link._in) == 0
    sock.close()


def test_a_silent_link_is_dropped_at_its_handshake_deadline(ends: Ends) -> None:
    sock = ends.raw()
    link = ends.accepted[-1]
    link.check_deadlines(time.monotonic())
    assert link.state != DISCONNECTED
    link.check_deadlines(time.monotonic() + SETTINGS.handshake_timeout_ms / 1000 + 0.1)
    assert link.state == DISCONNECTED
    sock.settimeout(5)
    assert sock.recv(1) == b""
    sock.close()


def test_a_flood_of_unauthenticated_links_pushes_out_the_oldest_not_the_members(
        ends: Ends) -> None:
    socks = [ends.raw() for _ in range(SETTINGS.max_unauthenticated + 4)]
    states = [link.state for link in ends.accepted]
    assert states[:4] == [DISCONNECTED] * 4
    assert DISCONNECTED not in states[4:]
    dialled, _ = ends.dial()
    ends.poller.until(lambda: dialled.state == CONNECTED)
    for sock in socks:
        sock.close()


def test_safe_loads_builds_plain_data_and_refuses_every_class() -> None:
    plain = {"type": "append_entries", "entries": [(b"x", 1, 2)], "set": {1}, "f": 1.5}
    assert link_protocol.safe_loads(pickle.dumps(plain, protocol=5)) == plain
    for thing in (Path("/"), ValueError("x"), print):
        with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
            link_protocol.safe_loads(pickle.dumps(thing))


def test_settings_refuse_a_secret_with_insecure_and_no_secret_without_it() -> None:
    for secrets, insecure in (((), False), ((b"",), False), ((SECRET, b""), False),
                              ((SECRET,), True), ((), True)):
        with pytest.raises(ValueError, match="secrets"):
            LinkSettings(secrets=secrets, insecure=insecure)


def test_a_rotation_accepts_the_old_and_the_new_secret_and_dials_with_the_first() -> None:
    old, new = SECRET, b"the-next-secret-of-enough-bytes-42"
    rotating = LinkSettings(secrets=(new, old))
    ends = Ends(Poller(), rotating)
    try:
        for dialling in ((old,), (new,), (old, new), (new, old)):
            link, _ = ends.dial(LinkSettings(secrets=dialling))
            ends.poller.until(lambda link=link: link.state == CONNECTED)
            link.send("hello")
        ends.poller.until(lambda: len(ends.received) == 4)
        refused_before = wire._refusals.total
        stale, _ = ends.dial(LinkSettings(secrets=(b"a-retired-secret-of-enough-bytes",)))
        ends.poller.until(lambda: wire._refusals.total > refused_before
                          and stale.state == DISCONNECTED)
        # a node that has moved on dials with the new secret: one that knows only the old
        # one refuses it
        moved_on = LinkSettings(secrets=(new,))
        only_old = Ends(Poller(), LinkSettings(secrets=(old,)))
        link, _ = only_old.dial(moved_on)
        only_old.poller.until(lambda: link.state == DISCONNECTED)
        only_old.server.unbind()
    finally:
        ends.server.unbind()
