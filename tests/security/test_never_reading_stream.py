"""A consumer stream that never reads (issues 17 and 37): what it can make the leader hold.

The first release pinned every body sent to such a stream, retries included, in an unbounded
outbox (592 -> 946 MB, never released). Then a group's leases stopped at its in-flight budget
(``max_inflight_bytes``) and a stream whose messages waited unsent past their visibility
timeout was closed (``event=consumer_stalled``); but when they ran out, each was first
retried, a copy with its body proposed through Raft, the whole budget at once, and glibc
kept what was freed (issue 37: with 200 MiB due, 219 -> 1,352 MB, and 931 MB kept after the
stream was closed). On that build this test saw the leader grow by 393-427 MiB and keep
139 MiB 15 s after the close (on 3 nodes: 571-643 MiB, 378 MiB kept). Now a stalled
stream's leases are released with it, not retried, and the heaps are trimmed once they are
freed: 186-187 MiB at the peak, and below the baseline after the close.

A real node started as users start it, attacked over its public gRPC API: one node, since a
stalled stream's messages now cost the followers nothing but the leases' commands (issue 37
measured 3 nodes, and so did docs/security.md's figures), and it runs in half the time.
Memory is the leader's anonymous memory (``RssAnon``): the wheel's segment files are mapped
read-only, and the pages of the 200 MiB read from them count in RSS too, as page cache the
kernel drops when it needs to, with any consumer alike.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tickwheel.client import Client, Message
from tickwheel.client.credentials import open_channel
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

pytestmark = pytest.mark.cluster

BODY = 256 << 10
COUNT = 800
"""200 MiB due at once."""
BUDGET = 128 << 20
"""The group's in-flight bytes (``--max-inflight-bytes``): below what is due, so that the
budget is what stops the hoarder (the default, 256 MiB, would hold all 200 MiB and not show
it), and large enough that the retries of the build before this (a copy of the budget in
each of several places) stand well clear of the constant."""
CREDITS = 128
"""Credits the hoarder gives at a time: one response of 32 MiB. A response above gRPC's
64 MiB send limit fails and ends the stream, which 256 credits of these bodies at once get."""
CONSTANT = 3 * CREDITS * BODY + (16 << 20)
"""What a hoarder may make the leader hold beyond its budget, as docs/security.md states it:
the response being written to it three times (the message gRPC writes, its encoding, gRPC's
copy) and the allocator's slack. The bodies kept of ready messages are none here (every
message came due before the hoarder subscribed), and so is a last grant past the budget
(the bodies fill it exactly)."""
PROBE = 4
"""Messages another group's consumer reads meanwhile (its 4 credits, their bodies written
three times: within the slack)."""
MARGIN = 16 << 20
"""How far above its baseline the leader may stay once the stream is closed."""
VISIBILITY_MS = 4_000
TOPIC = "hoard"
HOARDERS, WATCHERS = "hoarders", "watchers"
"""Two groups of the topic: each gets its own copy of every message."""


def anon_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("RssAnon:")[1].split()[0]) << 10


class PeakMemory:
    """The highest `anon_bytes` of a process while the context is open, read every 10 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = anon_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, anon_bytes(self.pid))

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Hoarder:
    """Subscribes to ``HOARDERS``, gives credits when asked, never reads a response."""

    def __init__(self, node: LocalNode) -> None:
        self._credits: queue.Queue[int | None] = queue.Queue()
        self._channel = open_channel(node.grpc_address, node.credentials, ())
        self.call = pb_grpc.TickwheelStub(self._channel).Receive(self._requests(), timeout=120)

    def _requests(self) -> Iterator[pb.ReceiveRequest]:
        yield pb.ReceiveRequest(subscribe=pb.Subscribe(
            topic=TOPIC, group=HOARDERS, credits=CREDITS, consumer="never-reads",
            visibility_timeout_ms=VISIBILITY_MS))
        while (credits := self._credits.get()) is not None:
            yield pb.ReceiveRequest(credit=pb.Credit(credits=credits))

    def take_budget(self, client: Client) -> pb.GroupInfo:
        """Credits a response at a time, each once the last is leased, to the budget."""
        for given in range(CREDITS, BUDGET // BODY + 1, CREDITS):
            if given > CREDITS:
                self._credits.put(CREDITS)
            wait_for(lambda wanted=given: group_info(client, HOARDERS).leased >= wanted, 30,
                     f"{given} messages leased to the hoarder")
        return group_info(client, HOARDERS)

    def close(self) -> None:
        self._credits.put(None)
        self.call.cancel()
        self._channel.close()


def group_info(client: Client, group: str) -> pb.GroupInfo:
    found = [info for info in client.cluster_info().groups
             if info.topic == TOPIC and info.group == group]
    return found[0] if found else pb.GroupInfo()


def received_ids(client: Client, group: str, count: int, prefetch: int) -> set[str]:
    ids: set[str] = set()
    with client.consume(TOPIC, group=group, prefetch=prefetch) as consumer:
        timer = threading.Timer(60, consumer.close)
        timer.start()
        try:
            for message in consumer:
                ids.add(message.id)
                message.ack()
                if len(ids) == count:
                    break
        finally:
            timer.cancel()
    return ids


def schedule_due(client: Client) -> list[str]:
    due_ms = time.time_ns() // 1_000_000
    ids = [f"m-{i:04}" for i in range(COUNT)]
    for start in range(0, COUNT, 16):
        client.schedule_many([Message(topic=TOPIC, body=b"x" * BODY, id=message_id,
                                      deliver_at_ms=due_ms)
                              for message_id in ids[start:start + 16]])
    return ids


def test_a_stream_that_never_reads_holds_its_budget_then_is_closed_and_gives_it_back(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=1, extra_args=(
            "--max-inflight-bytes", str(BUDGET))) as cluster:
        leader = cluster.leader(timeout_s=30)
        with cluster.client(timeout_s=30) as client:
            for group in (HOARDERS, WATCHERS):
                client.create_group(TOPIC, group)
            ids = schedule_due(client)
            wait_for(lambda: group_info(client, HOARDERS).ready == COUNT, 60,
                     "every message due")
            before = anon_bytes(leader.pid)
            hoarder = Hoarder(leader)
            try:
                with PeakMemory(leader.pid) as memory:
                    held = hoarder.take_budget(client)
                    assert held.leased * BODY <= BUDGET, held
                    # other groups go on while it hoards
                    assert len(received_ids(client, WATCHERS, PROBE, PROBE)) == PROBE
                    wait_for(lambda: "event=consumer_stalled" in leader.log_path.read_text(),
                             VISIBILITY_MS / 1000 + 30, "the hoarder to be closed")
                    # its leases are released with it: ready again, none retried
                    wait_for(lambda: group_info(client, HOARDERS).ready == COUNT, 30,
                             "the hoarder's messages ready again")
                grown = memory.peak - before
                assert grown <= BUDGET + CONSTANT, (
                    f"the leader grew by {grown >> 20} MiB (from {before >> 20} MiB), "
                    f"above its budget and the constant ({(BUDGET + CONSTANT) >> 20} MiB)")
                assert "event=message_retried" not in leader.log_path.read_text()
                assert not hoarder.call.done()  # its connection is still open
            finally:
                hoarder.close()
            deadline = time.monotonic() + 30
            while (after := anon_bytes(leader.pid)) > before + MARGIN:
                assert time.monotonic() < deadline, (
                    f"the leader kept {(after - before) >> 20} MiB after the stream was "
                    f"closed ({before >> 20} -> {after >> 20} MiB)")
                time.sleep(0.1)
            # its messages come back to its group
            assert received_ids(client, HOARDERS, COUNT, 16) == set(ids)
            # once their acks are applied, the group holds nothing
            def holds() -> tuple[int, int, int]:
                left = group_info(client, HOARDERS)
                return left.leased, left.ready, left.consumers
            wait_for(lambda: holds() == (0, 0, 0), 30, "the last acks to apply")
