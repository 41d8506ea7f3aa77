"""``tickwheel trace`` against 3 real nodes: a message scheduled, leased and sent, nacked,
its retry leased, sent and acked shows every step in order, each committed step held by
every node and each send by the leader alone, naming the consumer; the command finds it by id
or by handle; an unknown id says that no ledger holds it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import tickwheel

from tickwheel.client import Message
from tickwheel.client.ledger import LedgerClient, Trace
from tickwheel.harness.local_cluster import LocalCluster, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = Path(tmp_path_factory.mktemp("trace"))
    with LocalCluster(root, extra_args=("--retry-start-level", "1")) as cluster:
        yield cluster


def test_a_message_nacked_then_acked_shows_every_step_on_the_right_nodes(
        cluster: LocalCluster) -> None:
    leader = cluster.leader(timeout_s=30)
    with cluster.client(timeout_s=30) as client:
        client.schedule_many([Message("traced", b"x", delay_ms=0, id=f"other-{i}")
                              for i in range(50)])
        client.schedule_many([Message("traced", b"x", delay_ms=0, id="traced-1")])
        with client.consume("traced", prefetch=8, name="the-consumer") as consumer:
            for message in consumer:
                if message.id != "traced-1":
                    message.ack()
                elif message.attempt == 1:
                    message.nack()
                else:
                    message.ack()
                    break
    everyone = tuple(sorted(node.raft for node in cluster.nodes))
    with LedgerClient(cluster.nodes[1].grpc_address,
                      credentials=cluster.credentials()) as ledger:

        def acked_everywhere() -> Trace | None:
            found = ledger.trace("traced-1")
            acks = [e for e in found.events if e.event == "acked" and e.nodes == everyone]
            return found if acks else None
        found = wait_for(acked_everywhere, 20, "every node's ledger to hold the ack")
    assert [event.event for event in found.events] == [
        "scheduled", "leased", "sent", "nacked", "leased", "sent", "acked"]
    scheduled, leased, sent, nacked, leased_again, sent_again, acked = found.events
    assert sorted(found.nodes) == list(everyone) and found.missed == []
    for committed in (scheduled, leased, nacked, leased_again, acked):
        assert committed.nodes == everyone
    for send in (sent, sent_again):
        assert send.nodes == (leader.raft,) and send.consumer == "the-consumer"
        assert send.term and send.group == ""
    assert scheduled.id == "traced-1" and scheduled.attempt == 1
    assert leased.handle == sent.handle == nacked.handle == scheduled.handle
    assert leased.lease == 1 and leased.possible_duplicate is False
    assert nacked.new_handle not in (None, scheduled.handle) and nacked.attempt == 2
    assert leased_again.handle == sent_again.handle == acked.handle == nacked.new_handle
    assert sent_again.attempt == 2
    times = [event.time_ms for event in found.events]
    assert times == sorted(times)


def test_the_command_prints_the_table_and_json_and_says_when_no_ledger_holds_an_id(
        cluster: LocalCluster) -> None:
    assert cluster.security is not None
    env = cluster.security.environment()
    target = ",".join(node.grpc_address for node in cluster.nodes)
    with cluster.client(timeout_s=30) as client:
        [result] = client.schedule_many([Message("printed", b"x", delay_ms=3_600_000,
                                                  id="printed-1")])
    table = tickwheel("trace", "--target", target, "printed-1", "--close-open", env=env)
    assert table.returncode == 0, table.stdout + table.stderr
    assert "scheduled" in table.stdout and "message printed-1" in table.stdout
    answer = tickwheel("trace", "--target", target, "printed-1", "--json", env=env)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    events = json.loads(answer.stdout)["events"]
    assert [event["event"] for event in events] == ["scheduled"]
    assert len(events[0]["nodes"]) == 3 and events[0]["id"] == "printed-1"
    by_handle = tickwheel("trace", "--target", target, "--handle", str(result.handle),
                          "--json", env=env)
    assert by_handle.returncode == 0, by_handle.stdout + by_handle.stderr
    assert [e["id"] for e in json.loads(by_handle.stdout)["events"]] == ["printed-1"]
    unknown = tickwheel("trace", "--target", target, "no-such-id", env=env)
    assert unknown.returncode == 1
    assert "no ledger of the 3 nodes that answered holds id 'no-such-id'" in unknown.stdout
    for wrong in (("printed-1", "--handle", str(result.handle)), (), ("--handle", "abc")):
        refused = tickwheel("trace", "--target", target, *wrong, env=env)
        assert refused.returncode == 2 and "handle" in refused.stderr, refused.stderr
