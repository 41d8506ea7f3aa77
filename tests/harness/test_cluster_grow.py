"""``tickwheel cluster grow``, as a user runs it: ``tickwheel cluster up --shards 2`` in one
process, a producer and a consumer on the client library, then ``tickwheel cluster grow
--shards 4`` from another process while the producer goes on. Nothing is lost, the shards
added serve, and SIGTERM to ``cluster up`` stops every node, those the growth started too
(checked by PID, and by every process on the machine that names the data folder). A growth
whose new node cannot start (its port taken) changes nothing and cluster up runs on. Then what
the folder remembers: ``cluster up`` again on it runs the grown cluster, and refuses the
layout it started with."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numbered_ports
import pytest

from tickwheel.client import Client, Credentials, Message, Received
from tickwheel.client.shards import handle_shard, receipt_shard, shard_of
from tickwheel.harness.local_cluster import wait_for

pytestmark = pytest.mark.cluster

TICKWHEEL = Path(sys.executable).with_name("tickwheel")
DUE_IN_MS = 1_500
"""How far ahead the producer's messages are due: some are still pending as the cluster grows."""
BATCH_MSGS = 10


@dataclass
class Up:
    """A running ``tickwheel cluster up`` and what it printed."""

    process: subprocess.Popen[str]
    data: Path
    base_port: int
    printed: list[str] = field(default_factory=list)

    def client(self, shards: int) -> Client:
        security = self.data / "security"
        return Client([f"127.0.0.1:{self.base_port + j}" for j in range(shards)],
                      credentials=Credentials.load(ca_file=security / "ca.pem",
                                                   token_file=security / "tokens/admin.token"),
                      timeout_s=60)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def cluster_up(data: Path, base_port: int, shards: int) -> Up:
    """``tickwheel cluster up --shards SHARDS --nodes 1``, once it printed its table; what it
    prints later is read on a thread (so that it never blocks on a full pipe)."""
    process = subprocess.Popen([str(TICKWHEEL), "cluster", "up", "--shards", str(shards),
                                "--nodes", "1", "--data", str(data), "--base-port",
                                str(base_port)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "COLUMNS": "300"})
    up = Up(process, data, base_port)
    assert process.stdout is not None
    stdout = process.stdout
    wait_for(lambda: bool(up.printed.append(stdout.readline()) or "tickwheel status"
                          in up.printed[-1] or process.poll() is not None), 90, "the table")
    assert process.poll() is None, "".join(up.printed)
    threading.Thread(target=lambda: up.printed.extend(stdout), daemon=True).start()
    return up


def tickwheel(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TICKWHEEL), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "300"}, check=False)


def node_processes(data: Path) -> set[int]:
    """Every process on this machine serving a node whose data lies under ``data``."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"serve" in command and any(arg.startswith(os.fsencode(data)) for arg in command):
            found.add(int(entry.name))
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


class Load:
    """A producer (``BATCH_MSGS`` messages every 50 ms, on a thread) and a consumer of group
    ``audit`` started before the growth; what each saw."""

    def __init__(self, up: Up) -> None:
        self.topic = f"grow-{uuid.uuid4().hex[:8]}"
        self.producer, self.reader = up.client(2), up.client(2)
        self.reader.create_group(self.topic, "audit")
        self.scheduled: dict[str, int] = {}
        """id -> its handle"""
        self.grown_at = 0
        """How many had been scheduled when ``cluster grow`` returned."""
        self.delivered: list[Received] = []
        self.failures: list[BaseException] = []
        self.stopping = threading.Event()
        self.consumer = self.reader.consume(self.topic, group="audit", prefetch=64)
        self.threads = [threading.Thread(target=self._guarded, args=(work,), daemon=True)
                        for work in (self._produce, self._consume)]
        for thread in self.threads:
            thread.start()

    def _guarded(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as error:  # the test reports it
            self.failures.append(error)

    def _produce(self) -> None:
        batch = 0
        while not self.stopping.is_set():
            due_ms = int(time.time() * 1000) + DUE_IN_MS
            messages = [Message(self.topic, f"b{batch}", deliver_at_ms=due_ms,
                                id=f"{self.topic}-{batch}-{n}") for n in range(BATCH_MSGS)]
            for result in self.producer.schedule_many(messages):
                self.scheduled.setdefault(result.id, result.handle)
            batch += 1
            self.stopping.wait(0.05)  # the load's pace

    def _consume(self) -> None:
        for message in self.consumer:
            self.delivered.append(message)
            message.ack()

    def scheduled_more_than(self, count: int) -> bool:
        return bool(self.failures) or len(self.scheduled) > count

    def all_delivered(self) -> bool:
        return bool(self.failures) or {m.id for m in self.delivered} >= set(self.scheduled)

    def close(self) -> None:
        self.stopping.set()
        self.threads[0].join(60)
        wait_for(self.all_delivered, 90, "every message scheduled to be delivered")
        self.consumer.close(timeout_s=0.5)
        self.threads[1].join(10)
        self.producer.close()
        self.reader.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two shards grown to four under load, then ``cluster up`` stopped: what happened."""
    data = tmp_path_factory.mktemp("grow") / "cluster"
    base_port = numbered_ports.base_port("cluster_grow")
    up = cluster_up(data, base_port, shards=2)
    try:
        seen: dict = {"data": data, "base_port": base_port,
                      "not_more": tickwheel("cluster", "grow", "--shards", "2", "--data",
                                            str(data))}
        with socket.socket() as taken:  # the gRPC port of the first node a growth adds
            taken.bind(("127.0.0.1", base_port + 2))
            seen["failed"] = tickwheel("cluster", "grow", "--shards", "4", "--data", str(data))
        seen["after_failed"] = (up.process.poll(), node_processes(data))
        load = Load(up)
        try:
            wait_for(lambda: load.scheduled_more_than(300), 60, "300 messages before growing")
            seen["before"] = set(load.scheduled)
            grow = seen["grow"] = tickwheel("cluster", "grow", "--shards", "4", "--data",
                                            str(data))
            assert grow.returncode == 0, grow.stdout + grow.stderr
            load.grown_at = len(load.scheduled)
            wait_for(lambda: load.scheduled_more_than(load.grown_at + 300), 60,
                     "300 messages after growing")
        finally:
            load.close()
        assert not load.failures, load.failures
        seen["too_soon"] = tickwheel("cluster", "grow", "--shards", "5", "--data", str(data))
        with up.client(4) as client:
            seen["info"] = client.cluster_info()
        seen.update(scheduled=load.scheduled, delivered=load.delivered,
                    after=list(load.scheduled)[load.grown_at:], nodes=node_processes(data))
    finally:
        seen["stopped"] = up.stop()
    seen["printed"] = "".join(up.printed)
    seen["stopped_grow"] = tickwheel("cluster", "grow", "--shards", "8", "--data", str(data))
    return seen


def test_growing_loses_nothing_and_delivers_each_message_once(run: dict) -> None:
    assert "shard map version 2: 4 shards" in run["grow"].stdout
    counts = Counter(message.id for message in run["delivered"])
    assert set(counts) == set(run["scheduled"])  # none lost
    assert [i for i, count in counts.items() if count > 1] == []  # none twice
    # the consumer, started on two shards, read the two added as well
    assert {receipt_shard(m.receipt) for m in run["delivered"]} == {0, 1, 2, 3}


def test_the_shards_added_serve_with_the_grown_map(run: dict) -> None:
    info = run["info"]
    assert info.map_version == 2
    base = run["base_port"]
    assert [list(shard.grpc_addresses) for shard in info.shards] == [
        [f"127.0.0.1:{base + j}"] for j in range(4)]  # node j of all is shard j here
    after = run["after"]
    assert {handle_shard(run["scheduled"][i]) for i in after} == {0, 1, 2, 3}
    assert all(handle_shard(run["scheduled"][i]) == shard_of(i, 4) for i in after)
    assert {handle_shard(run["scheduled"][i]) for i in run["before"]} == {0, 1}


def test_stopping_cluster_up_stops_every_node_the_growth_started_too(run: dict) -> None:
    nodes = run["nodes"]
    assert len(nodes) == 4, nodes  # two started by cluster up, two by the growth
    assert sum(str(pid) in run["grow"].stdout for pid in nodes) == 2  # it named those two
    assert run["stopped"] == 0, run["printed"]
    wait_for(lambda: all(gone(pid) for pid in nodes), 10, "every node to be gone")
    assert node_processes(run["data"]) == set()


def test_a_growth_that_cannot_be_is_refused_with_the_reason(run: dict) -> None:
    not_more = run["not_more"]
    assert not_more.returncode == 2
    assert "has 2 shards already" in not_more.stdout
    too_soon = run["too_soon"]
    assert too_soon.returncode == 2 and "dedupe window" in too_soon.stdout
    stopped = run["stopped_grow"]
    assert stopped.returncode == 2 and "has stopped" in stopped.stdout
    nowhere = tickwheel("cluster", "grow", "--shards", "4", "--data",
                        str(run["data"].parent / "elsewhere"))
    assert nowhere.returncode == 2 and "no tickwheel cluster up has run" in nowhere.stdout


def test_cluster_up_again_runs_the_grown_cluster_and_refuses_the_first_layout(
        run: dict) -> None:
    data, base_port = run["data"], run["base_port"]
    first = tickwheel("cluster", "up", "--shards", "2", "--nodes", "1", "--data", str(data),
                      "--base-port", str(base_port))
    assert first.returncode == 2 and "--shards 4" in first.stdout
    up = cluster_up(data, base_port, shards=4)
    try:
        with up.client(4) as client:
            info = client.cluster_info()
            assert (info.map_version, len(info.shards)) == (2, 4)
            topic = f"again-{uuid.uuid4().hex[:8]}"
            ids = [next(f"{topic}-{n}" for n in range(1000) if shard_of(f"{topic}-{n}", 4) == k)
                   for k in range(4)]
            results = client.schedule_many([Message(topic, "x", delay_ms=0, id=i) for i in ids])
            assert [handle_shard(r.handle) for r in results] == [0, 1, 2, 3]
            got: set[str] = set()

            def received_all() -> bool:
                for message in client.receive(topic, consumer="again", wait_ms=500):
                    got.add(message.id)
                    message.ack()
                return got >= set(ids)
            wait_for(received_all, 60, "a message of each shard")
    finally:
        assert up.stop() == 0


def test_a_growth_whose_node_does_not_start_changes_nothing(run: dict) -> None:
    """A new node that cannot bind its port: the growth stops the nodes it started, and
    cluster up runs on with the two shards it had (grown once the port was free)."""
    failed = run["failed"]
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "nothing changed" in failed.stdout
    running, nodes = run["after_failed"]
    assert running is None and len(nodes) == 2
