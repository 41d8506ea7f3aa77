"""Consumer groups on a real 3-node cluster: fan-out, competition, no group or topic stalls
another, receipts bound to their group, a cancel that means never."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from nodetests import now_ms, topic

from tickwheel.client import (
    CancelOutcome,
    Client,
    InvalidArgument,
    Message,
    Rescheduled,
    RescheduleOutcome,
)
from tickwheel.harness.local_cluster import LocalCluster, wait_for

pytestmark = pytest.mark.cluster


def take(client: Client, name: str, count: int, group: str = "", ack: bool = True) -> list:
    got = []
    with client.consume(name, group=group, prefetch=64) as consumer:
        for message in consumer:
            got.append(message)
            if ack:
                message.ack()
            if len(got) == count:
                break
    return got


def test_every_group_gets_every_message_unflagged(client: Client) -> None:
    name = topic()
    assert client.create_group(name, "billing") is False
    assert client.create_group(name, "billing") is True
    client.create_group(name, "audit")
    client.schedule_many([Message(name, b"x", delay_ms=0, id=f"m{i}") for i in range(20)])
    billing, audit = take(client, name, 20, "billing"), take(client, name, 20, "audit")
    for got, group in ((billing, "billing"), (audit, "audit")):
        assert sorted(m.id for m in got) == sorted(f"m{i}" for i in range(20))
        assert {m.group for m in got} == {group}
        assert not any(m.possible_duplicate for m in got)
    # the acks of the last messages are applied after the consumer has them
    wait_for(lambda: {(g.group, g.ready, g.leased) for g in client.cluster_info().groups
                      if g.topic == name} == {("billing", 0, 0), ("audit", 0, 0)},
             10, "every ack to apply")
    assert client.delete_group(name, "audit") is True


def test_a_plain_consumer_keeps_getting_its_topic_once_a_named_group_appears(
        client: Client) -> None:
    """The default group is implicit (gone once drained) until the topic has a named group;
    a consumer of it must not be left out when one appears."""
    name = topic()
    with client.consume(name, prefetch=8) as plain:
        watchdog = threading.Timer(30, plain.close)  # ends the wait if nothing comes
        watchdog.start()
        try:
            client.schedule(name, b"x", delay_ms=0, id="before")
            first = next(plain)
            first.ack()
            wait_for(lambda: not [g for g in client.cluster_info().groups if g.topic == name],
                     10, "the drained default group to go away")
            assert client.create_group(name, "billing") is False
            client.schedule(name, b"x", delay_ms=0, id="after")
            second = next(plain, None)
            assert second is not None, "the plain consumer was left out"
            second.ack()
        finally:
            watchdog.cancel()
    assert (first.id, second.id) == ("before", "after")
    assert not first.possible_duplicate and not second.possible_duplicate
    assert [m.id for m in take(client, name, 1, "billing")] == ["after"]


def test_an_idle_topic_and_an_unread_dead_letter_topic_stall_nothing(client: Client) -> None:
    """12,000 due messages nobody consumes (more than max_inflight_msgs, 10,000): the first
    version stopped every other topic until they were drained."""
    idle, busy = topic(), topic()
    due_ms = now_ms()
    for start in range(0, 12_000, 1_000):
        client.schedule_many([Message(idle, b"x", deliver_at_ms=due_ms, id=f"i{start + i}")
                              for i in range(1_000)])
    client.schedule_many([Message(busy, b"y", delay_ms=200, id=f"b{i}") for i in range(5)])
    got = take(client, busy, 5)
    assert sorted(m.id for m in got) == [f"b{i}" for i in range(5)]
    assert max(m.lateness_ms for m in got) < 2_000
    (idle_group,) = [g for g in client.cluster_info().groups if g.topic == idle]
    assert idle_group.ready == 12_000 and idle_group.leased == 0


def test_only_what_a_consumer_was_sent_comes_back_flagged_after_it_leaves(
        cluster: LocalCluster, client: Client) -> None:
    """Consumers that take one message and close while grants keep coming (a message is due
    every 2 ms): grants committed for a stream that closed before the node sent them are
    given back, not released, so their next delivery is not a possible duplicate. Before, the
    flag also marked messages no consumer had ever been sent."""
    name = topic()
    first_ms = now_ms() + 500
    ids = [f"{name}-{i}" for i in range(1_500)]  # ids are unique cluster-wide: not "m{i}"
    client.schedule_many([Message(name, b"x", deliver_at_ms=first_ms + 2 * i, id=message_id)
                          for i, message_id in enumerate(ids)])
    quitters = 0
    while now_ms() < first_ms + 3_000:
        with client.consume(name, prefetch=200) as quitter:
            next(iter(quitter))  # never acked: it comes back, flagged, and rightly so
        quitters += 1
    got = take(client, name, 1_500)
    assert sorted(m.id for m in got) == sorted(ids)
    # The leader's ledger has a row per message sent, in order, with its flag: every
    # flagged send must follow a send of the same message. Its segments hold every send
    # once they hold a row the leader added after the last one: a marker's schedule.
    leader, taken_ms = cluster.leader(), now_ms()
    client.schedule_many([Message(f"{name}-mark", b"x", delay_ms=3_600_000)])

    def written() -> list[dict[str, Any]] | None:
        rows = leader.ledger()
        return rows if rows and rows[-1]["node_ms"] > taken_ms else None
    rows = wait_for(written, 10, "the leader's ledger to hold every send")
    sent_before: set[str] = set()
    flagged, unfounded = 0, []
    for event in rows:
        if event["topic"] == name and event["event"] == "sent":
            flagged += event["possible_duplicate"]
            if event["possible_duplicate"] and event["id"] not in sent_before:
                unfounded.append(event["id"])
            sent_before.add(event["id"])
    assert quitters > 10 and flagged >= quitters
    assert unfounded == []


def test_a_cancel_answered_cancelled_is_never_delivered(client: Client) -> None:
    """Hundreds of cancels sent a few ms before the due time, singly and in batches: whatever
    the race, a CANCELLED answer means the message never reaches a consumer."""
    name = topic()
    due_ms = now_ms() + 1_500
    scheduled = client.schedule_many([Message(name, b"x", deliver_at_ms=due_ms + i % 5,
                                              id=f"c{i}") for i in range(300)])
    while now_ms() < due_ms - 8:
        time.sleep(0.001)
    outcomes: dict[str, CancelOutcome] = {}
    for start in range(0, 300, 100):
        chunk = scheduled[start:start + 100]
        singles = chunk[:20]
        for result in singles:
            outcomes[result.id] = client.cancel_outcomes([result.handle])[0]
        batch = chunk[20:]
        for result, outcome in zip(batch, client.cancel_outcomes([r.handle for r in batch]),
                                   strict=True):
            outcomes[result.id] = outcome
    survivors = [i for i, o in outcomes.items() if o is not CancelOutcome.CANCELLED]
    got = take(client, name, len(survivors)) if survivors else []
    delivered = {m.id for m in got}
    cancelled = {i for i, o in outcomes.items() if o is CancelOutcome.CANCELLED}
    assert not delivered & cancelled
    assert cancelled, "no cancel won the race: the test proved nothing"
    assert delivered == set(survivors)


def test_a_receipt_of_another_group_is_refused_and_changes_nothing(client: Client) -> None:
    name = topic()
    client.create_group(name, "a")
    client.create_group(name, "b")
    client.schedule(name, b"x", delay_ms=0, id="only")
    (from_a,) = take(client, name, 1, "a", ack=False)
    with client.consume(name, group="b", prefetch=4, visibility_timeout_ms=60_000) as consumer:
        from_b = next(iter(consumer))
        from_b._send("ack", from_a.receipt)  # b acks with a's receipt
        from_b._send("ack", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")  # and with a forged one
        from_b.ack()  # then its own: the stream keeps the order

        def groups() -> dict[str, tuple[int, int]]:
            return {g.group: (g.ready, g.leased) for g in client.cluster_info().groups
                    if g.topic == name}
        wait_for(lambda: groups()["b"] == (0, 0), 10, "b's own ack applied")
    assert from_b.id == "only"
    assert groups()["a"] == (1, 0)  # a's message is still a's: released, not acked by b


def test_reschedule_moves_messages_later_and_to_now_and_a_repeat_moves_nothing(
        client: Client) -> None:
    name = topic()
    later, now_, kept = client.schedule_many([
        Message(name, b"x", delay_ms=1_500, id="later"),
        Message(name, b"x", delay_ms=3_600_000, id="now"),
        Message(name, b"x", delay_ms=2_000, id="kept")])
    new_due = now_ms() + 4_000
    for _ in range(2):  # the second call is a client's retry after a lost answer
        assert client.reschedule([later.handle], deliver_at_ms=new_due) == [
            Rescheduled(RescheduleOutcome.RESCHEDULED, new_due)]
    (to_now,) = client.reschedule([now_.handle], delay_ms=0)
    assert to_now.outcome is RescheduleOutcome.RESCHEDULED
    got = {m.id: m for m in take(client, name, 3)}
    assert set(got) == {"later", "now", "kept"}
    assert got["now"].deliver_at_ms == to_now.deliver_at_ms
    assert got["later"].deliver_at_ms == new_due
    assert got["later"].delivered_at_ms >= new_due  # not at its old time, 2.5 s earlier
    assert not any(m.possible_duplicate for m in got.values())
    # done now: acked (an ack is a replicated command of its own: wait until it is applied);
    # the handle still answers, and says so
    wait_for(lambda: not any(g.leased for g in client.cluster_info().groups if g.topic == name),
             10, "the three acks applied")
    assert client.reschedule([later.handle, kept.handle], delay_ms=0) == [
        Rescheduled(RescheduleOutcome.NOT_PENDING, 0)] * 2


def test_a_reschedule_naming_a_forged_handle_changes_nothing_and_names_the_field(
        client: Client) -> None:
    name = topic()
    (real,) = client.schedule_many([Message(name, b"x", delay_ms=60_000, id="real")])
    with pytest.raises(InvalidArgument) as refused:
        client.reschedule([real.handle, real.handle ^ 1], delay_ms=0)
    assert refused.value.field == "moves[1].handle"
    with pytest.raises(InvalidArgument) as refused:
        client.reschedule([real.handle], delay_ms=-5)
    assert refused.value.field == "moves[0].delay_ms"
    assert client.cancel_outcomes([real.handle]) == [CancelOutcome.CANCELLED]  # never moved
    assert client.reschedule([real.handle], delay_ms=0) == [
        Rescheduled(RescheduleOutcome.CANCELLED, 0)]


def test_a_reschedule_racing_the_due_time_delivers_each_message_once_at_the_time_it_answers(
        client: Client) -> None:
    """Hundreds of reschedules a few ms before the due time, singly and in batches, while a
    consumer takes what comes due: RESCHEDULED means delivered once, at the new time, never at
    the old; HANDED_OUT (or NOT_PENDING: acked already) means delivered once, at the old
    time."""
    name = topic()
    due_ms = now_ms() + 1_500
    scheduled = client.schedule_many([Message(name, b"x", deliver_at_ms=due_ms + i % 5,
                                              id=f"r{i}") for i in range(300)])
    received: list = []

    def consume() -> None:
        with client.consume(name, prefetch=64) as consumer:
            for message in consumer:
                received.append((message, now_ms()))
                message.ack()
                if len(received) == 300:
                    break
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    new_due = due_ms + 2_000
    # the leader readies a message up to slow_lead_ms (30 ms) before it is due: start before that,
    # by twice what a reschedule takes on this machine now (a loaded machine's answers are
    # slower), so the first reschedules win and the later ones race the hand-out and the due
    # time
    probe = client.schedule(topic(), b"probe", delay_ms=3_600_000)
    sent_ms = now_ms()
    client.reschedule([probe.handle], delay_ms=3_600_000)
    answer_ms = now_ms() - sent_ms
    while now_ms() < due_ms - 40 - 2 * answer_ms:
        time.sleep(0.001)
    outcomes = {}
    for start in range(0, 300, 100):
        chunk = scheduled[start:start + 100]
        for result in chunk[:20]:
            (outcomes[result.id],) = client.reschedule([result.handle], deliver_at_ms=new_due)
        batch = chunk[20:]
        for result, outcome in zip(batch, client.reschedule([r.handle for r in batch],
                                                            deliver_at_ms=new_due),
                                   strict=True):
            outcomes[result.id] = outcome
    wait_for(lambda: len(received) >= 300, 30, "every message delivered")
    consumer.join(10)
    by_id: dict[str, list] = {}
    for message, at_ms in received:
        by_id.setdefault(message.id, []).append((message, at_ms))
    assert sorted(by_id) == sorted(outcomes) and all(len(v) == 1 for v in by_id.values())
    moved = {i for i, r in outcomes.items() if r.outcome is RescheduleOutcome.RESCHEDULED}
    assert moved, "no reschedule won the race: the test proved nothing"
    assert {r.outcome for i, r in outcomes.items() if i not in moved} <= {
        RescheduleOutcome.HANDED_OUT, RescheduleOutcome.NOT_PENDING}  # NOT_PENDING: acked
    for message_id, [(message, at_ms)] in by_id.items():
        if message_id in moved:
            assert message.deliver_at_ms == new_due and at_ms >= new_due - 5, message_id
        else:
            assert message.deliver_at_ms < new_due and at_ms < new_due, message_id


# -- receiving without a stream: durable leases, settled by receipt from anywhere -----------

def receive_all(client: Client, name: str, count: int, **kwargs: object) -> list:
    got: list = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        got += client.receive(name, wait_ms=2_000, **kwargs)
    return got


def test_a_receive_without_a_stream_leases_until_acked_by_receipt_from_anywhere(
        client: Client, cluster: LocalCluster) -> None:
    name = topic()
    client.schedule_many([Message(name, b"x", delay_ms=0, id=f"u{i}") for i in range(5)])
    # two at a time: what comes due with them waits for the consumer's next call, unflagged
    got = receive_all(client, name, 5, consumer="worker-1", max_messages=2,
                      invisible_duration_ms=60_000)
    assert sorted(m.id for m in got) == [f"u{i}" for i in range(5)]
    assert not any(m.possible_duplicate for m in got) and {m.attempt for m in got} == {1}
    receipts = [m.receipt for m in got]
    with cluster.client() as other:
        assert other.ack_receipts(name, "", receipts[:3]) == [True] * 3
        assert other.ack_receipts(name, "", receipts[:3]) == [False] * 3  # once
        assert other.ack_receipts(name, "billing", receipts[3:]) == [False] * 2  # not its group
        assert other.change_invisible_duration(name, "", receipts[3:4], 0) == [True]
        with pytest.raises(InvalidArgument) as refused:
            other.ack_receipts(name, "", ["not-a-receipt"])
        assert refused.value.field == "receipts[0]"

    def leased() -> int:
        return sum(g.leased for g in client.cluster_info().groups if g.topic == name)
    wait_for(lambda: leased() == 1, 10, "u3's lease to run out at once")
    # its deadline was when it should come back: ready again at once, no ladder step (10 s)
    # on top; u4 stays invisible
    (again,) = client.receive(name, consumer="worker-2", wait_ms=5_000)
    assert (again.id, again.attempt) == ("u3", 2)


def test_a_receive_without_a_stream_waits_for_the_first_message_and_checks_its_fields(
        client: Client) -> None:
    name = topic()
    started = time.monotonic()
    assert client.receive(name, consumer="idle", wait_ms=400) == []
    assert time.monotonic() - started >= 0.4
    client.schedule(name, b"late", delay_ms=300, id="late")
    started = time.monotonic()
    (late,) = client.receive(name, consumer="idle", wait_ms=10_000)
    assert late.id == "late" and time.monotonic() - started < 5
    late.ack()
    for field, kwargs in (("consumer", {"consumer": ""}),
                          ("max_messages", {"consumer": "c", "max_messages": 0}),
                          ("wait_ms", {"consumer": "c", "wait_ms": 31_000}),
                          ("invisible_duration_ms", {"consumer": "c",
                                                     "invisible_duration_ms": 5})):
        with pytest.raises(InvalidArgument) as refused:
            client.receive(name, **kwargs)
        assert refused.value.field == field


def test_leases_of_a_receive_without_a_stream_outlive_a_leader_kill(tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as fresh, fresh.client(timeout_s=60) as client:
        old = fresh.leader()
        client.schedule_many([Message("durable", b"x", delay_ms=0, id=f"d{i}")
                              for i in range(20)])
        got = receive_all(client, "durable", 20, consumer="w", max_messages=20,
                          invisible_duration_ms=60_000)
        assert len(got) == 20
        fresh.signal(old, signal.SIGKILL)
        fresh.leader(among=[n for n in fresh.nodes if n is not old])
        # the new leader's barrier ends stream leases only: these are still leased, to us
        assert client.receive("durable", consumer="w2", wait_ms=1_000) == []
        assert client.ack_receipts("durable", "", [m.receipt for m in got]) == [True] * 20
