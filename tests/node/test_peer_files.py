"""Reading state files from a peer in batches (`Peer.ReadStateFiles`), for a follower that
installs a snapshot: the node's own peer service and client in one process, over gRPC; and a
peer of the build before, which has `ReadStateFile` alone (a rolling upgrade)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from tickwheel.client.credentials import Credentials
from tickwheel.node.listeners import MAX_READ_RANGES, PeerService
from tickwheel.node.peers import COPY_ASKS_PER_PEER, PeerFiles, ShortRead
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

PEER = "10.9.9.9:7500"
"""The peer's Raft address, as the replica names it."""


class Files:
    """What `PeerService` reads of the replica: its state files, here a folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read_state_file(self, path: str, offset: int, size: int) -> bytes:
        with open(self.root / path, "rb") as file:
            return os.pread(file.fileno(), size, offset)


class OlderPeer(PeerService):
    """A member of the build before: no `ReadStateFiles`."""

    async def ReadStateFiles(self, request: Any, context: Any) -> Any:  # type: ignore[override]
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        yield pb.FileChunk()


@contextmanager
def _serve(service: PeerService) -> Iterator[tuple[str, list[str]]]:
    """``service`` on a free port; its address and the methods called, in order."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    calls: list[str] = []

    class Counting(grpc.aio.ServerInterceptor):
        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            calls.append(details.method.rsplit("/", 1)[-1])
            return await continuation(details)

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=[Counting()])
        pb_grpc.add_PeerServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"127.0.0.1:{port}", calls
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, bytes]:
    written = {f"wheel/hours/{hour:08d}/log": os.urandom(100 + hour * 37) for hour in range(40)}
    written["wheel/big"] = os.urandom((1 << 20) + 300_000)  # more than one chunk of the reply
    for path, data in written.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    return written


@pytest.mark.parametrize("older", [False, True], ids=["batched", "older peer"])
def test_many_ranges_come_in_one_call_or_one_each_from_an_older_peer(
        tmp_path: Path, files: dict[str, bytes], older: bool) -> None:
    node = SimpleNamespace(replica=Files(tmp_path), disk=None)
    service = (OlderPeer if older else PeerService)(node)  # type: ignore[arg-type]
    with _serve(service) as (address, calls):
        peers = PeerFiles({PEER: address}, Credentials(insecure=True), ())
        ranges = [(path, 7, len(data) - 7) for path, data in sorted(files.items())]
        try:
            got = peers.many([PEER], ranges)
        finally:
            peers.close()
        assert got == [files[path][7:] for path, _, _ in ranges]
        assert calls == (["ReadStateFiles"] + ["ReadStateFile"] * len(ranges) if older
                         else ["ReadStateFiles"])


def test_a_batch_too_large_is_refused_and_a_short_range_is_no_answer(
        tmp_path: Path, files: dict[str, bytes]) -> None:
    node = SimpleNamespace(replica=Files(tmp_path), disk=None)
    with _serve(PeerService(node)) as (address, _):  # type: ignore[arg-type]
        peers = PeerFiles({PEER: address}, Credentials(insecure=True), ())
        try:
            with pytest.raises(grpc.RpcError) as refused:
                peers._read_many(PEER, [("wheel/big", 0, 1)] * (MAX_READ_RANGES + 1))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "ranges: 1025 ranges" in str(refused.value.details())
            short = [("wheel/hours/00000001/log", 0, len(files["wheel/hours/00000001/log"]) + 1)]
            with pytest.raises(ShortRead):  # a peer behind: the next one is asked
                peers._read_many(PEER, short)
        finally:
            peers.close()


class HangingPeer(PeerService):
    """A member that takes every ask for bytes and never answers: paused (SIGSTOP) or cut off,
    as the leader just deposed often is."""

    async def ReadStateFile(self, request: Any, context: Any) -> Any:  # type: ignore[override]
        self.asked = getattr(self, "asked", 0) + 1
        await asyncio.sleep(3600)
        yield pb.FileChunk()


def test_a_copy_comes_from_the_peer_that_answers_without_waiting_for_one_that_hangs(
        tmp_path: Path, files: dict[str, bytes]) -> None:
    """A mend runs on the Raft thread: a new leader that asked the paused old leader first
    waited out its timeout (2 s), missed its heartbeats and was deposed."""
    node = SimpleNamespace(replica=Files(tmp_path), disk=None)
    hanging = HangingPeer(node)  # type: ignore[arg-type]
    path = "wheel/hours/00000003/log"
    with _serve(hanging) as (stuck, _), _serve(PeerService(node)) as (good, _):  # type: ignore[arg-type]
        peers = PeerFiles({"paused:7500": stuck, PEER: good}, Credentials(insecure=True), ())
        try:
            copies = peers.copies(["paused:7500", PEER], path, 10, 40)
            assert next(copies) == files[path][10:50]  # the answer, not the silence first
            assert next(copies) is None  # the hanging peer, once its timeout ran out
            for _ in range(COPY_ASKS_PER_PEER + 3):  # a mend after another, the peer still hanging
                asked = peers.copies(["paused:7500", PEER], path, 0, 8)
                assert next(copy for copy in asked if copy is not None) == files[path][:8]
            # the first ask (timed out), then no more threads held by it at once than the bound
            assert hanging.asked == 1 + COPY_ASKS_PER_PEER
        finally:
            peers.close()
