"""Reading state files from peers, for a replica that installs a snapshot."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import grpc
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_random_exponential

from tickwheel.client.credentials import Credentials, open_channel
from tickwheel.v1 import tickwheel_pb2, tickwheel_pb2_grpc

log = logging.getLogger("tickwheel.node.peers")

FETCH_TIMEOUT_S = 30.0
COPY_TIMEOUT_S = 2.0
"""How long one peer may take to answer for a copy of damaged bytes."""
COPY_ASKS_PER_PEER = 4
"""Asks for copies one peer may have unanswered at once; past them, that peer is passed over
(it has not answered the earlier ones), so a peer that hangs holds no more threads."""


class ShortRead(Exception):
    """A peer had fewer bytes than asked for (it may be behind); another may have them."""


Answer = TypeVar("Answer")


@retry(retry=retry_if_exception_type((grpc.RpcError, ShortRead)), reraise=True,
       wait=wait_random_exponential(multiplier=0.05, max=1.0),
       stop=stop_after_delay(FETCH_TIMEOUT_S))
def _first_answer(peers: list[str], read: Callable[[str], Answer], what: str) -> Answer:
    """``read(peer)`` of the first of ``peers`` that answers; the round again, with jittered
    back-off, for up to ``FETCH_TIMEOUT_S`` while none does."""
    last_error: Exception | None = None
    for peer in peers:
        try:
            return read(peer)
        except (grpc.RpcError, ShortRead) as error:
            log.warning("event=peer_read_failed peer=%s %s error=%r", peer, what, str(error))
            last_error = error
    raise last_error if last_error else ValueError("no peers to read state files from")


class PeerFiles:
    """``fetch(peers, path, offset, size)`` over gRPC; ``peer_address`` maps Raft addresses to
    the peers' peer listeners, dialed with ``credentials`` and showing
    ``metadata`` (the peer token). Tries the peers in the order given, and retries the round
    with jittered back-off for up to ``FETCH_TIMEOUT_S``."""

    def __init__(self, peer_address: Mapping[str, str],
                 credentials: Credentials,
                 metadata: tuple[tuple[str, str], ...]) -> None:
        self._peer_address = dict(peer_address)
        self._credentials = credentials
        self._metadata = metadata
        self._channels: dict[str, grpc.Channel] = {}
        self._opening = threading.Lock()
        """A restore fetches from several threads at once (`FETCH_PARALLEL`): one channel a
        peer."""
        self._asking: dict[str, threading.BoundedSemaphore] = {}
        """Each peer's asks for copies not yet answered (`copies`)."""

    def __call__(self, peers: list[str], path: str, offset: int, size: int) -> bytes:
        return _first_answer(peers, lambda peer: self._read(peer, path, offset, size),
                             f"path={path} offset={offset}")

    def many(self, peers: list[str], ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """The bytes of each of ``ranges`` (``(path, offset, size)``, one a file), in order, in
        one call to the first of ``peers`` that has them all, retried as `__call__`. A peer
        whose build lacks ``ReadStateFiles`` (a rolling upgrade) is asked range by range."""
        return _first_answer(peers, lambda peer: self._read_many(peer, ranges),
                             f"files={len(ranges)}")

    def copies(self, peers: list[str], path: str, offset: int, size: int
               ) -> Iterator[bytes | None]:
        """What each of ``peers`` holds of ``path`` at ``offset``, in the order they answer
        (None for a peer that cannot answer, has fewer bytes there, or still has
        ``COPY_ASKS_PER_PEER`` asks unanswered). All are asked at once, each with a short
        timeout: a mend runs on the Raft thread, and ends at the first good copy, so a paused
        or cut-off peer (often the leader just lost) must not keep it waiting."""
        answers: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        for peer in peers:
            with self._opening:
                asking = self._asking.setdefault(peer, threading.BoundedSemaphore(
                    COPY_ASKS_PER_PEER))
            if not asking.acquire(blocking=False):
                log.warning("event=peer_copy_failed peer=%s path=%s offset=%d error=%r", peer,
                            path, offset, f"{COPY_ASKS_PER_PEER} earlier asks unanswered")
                answers.put(None)
                continue
            threading.Thread(target=self._copy, args=(asking, answers, peer, path, offset,
                                                      size),
                             name=f"peer-copy-{peer}", daemon=True).start()
        for _ in peers:
            yield answers.get()

    def _copy(self, asking: threading.BoundedSemaphore, answers: queue.SimpleQueue[bytes | None],
              peer: str, path: str, offset: int, size: int) -> None:
        copy: bytes | None = None
        try:
            copy = self._read(peer, path, offset, size, COPY_TIMEOUT_S)
        except (grpc.RpcError, ShortRead) as error:
            log.warning("event=peer_copy_failed peer=%s path=%s offset=%d error=%r", peer,
                        path, offset, str(error))
        finally:
            asking.release()
            answers.put(copy)

    def _read_many(self, peer: str, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        stub = tickwheel_pb2_grpc.PeerStub(self._channel(peer))
        request = tickwheel_pb2.ReadStateFilesRequest(ranges=[
            tickwheel_pb2.ReadStateFileRequest(path=path, offset=offset, size=size)
            for path, offset, size in ranges])
        try:
            chunks = list(stub.ReadStateFiles(request, timeout=FETCH_TIMEOUT_S,
                                              metadata=self._metadata))
        except grpc.RpcError as error:
            if error.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise
            return [self._read(peer, path, offset, size) for path, offset, size in ranges]
        pieces: dict[str, list[bytes]] = {}
        ends: dict[str, int] = {path: offset for path, offset, _ in ranges}
        for chunk in chunks:
            if ends.get(chunk.path) != chunk.offset:
                raise ShortRead(f"{peer} sent {chunk.path} at {chunk.offset}, not where its "
                                f"range went on ({ends.get(chunk.path)})")
            pieces.setdefault(chunk.path, []).append(chunk.data)
            ends[chunk.path] += len(chunk.data)
        data = [b"".join(pieces.get(path, ())) for path, _, _ in ranges]
        for (path, _, size), got in zip(ranges, data, strict=True):
            if len(got) != size:
                raise ShortRead(f"{peer} returned {len(got)} bytes of {path}, wanted {size}")
        return data

    def _channel(self, peer: str) -> grpc.Channel:
        with self._opening:
            channel = self._channels.get(peer)
            if channel is None:
                channel = self._channels[peer] = open_channel(self._peer_address[peer],
                                                              self._credentials, ())
            return channel

    def _read(self, peer: str, path: str, offset: int, size: int,
              timeout_s: float = 10.0) -> bytes:
        stub = tickwheel_pb2_grpc.PeerStub(self._channel(peer))
        request = tickwheel_pb2.ReadStateFileRequest(path=path, offset=offset, size=size)
        data = b"".join(chunk.data for chunk in stub.ReadStateFile(
            request, timeout=timeout_s, metadata=self._metadata))
        if len(data) != size:
            raise ShortRead(f"{peer} returned {len(data)} bytes of {path}, wanted {size}")
        return data

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
