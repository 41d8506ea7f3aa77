"""Consumer groups and leases in the replicated state: every promise of the hand-out, applied
command by command as every replica applies them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.common.errors import InvalidMessage, Overloaded
from tickwheel.replication import commands
from tickwheel.replication.commands import Grant, LeaseOp, LeaseRef, Ready
from tickwheel.replication.dispatcher import DispatchConfig
from tickwheel.replication.group import DURABLE, STREAM
from tickwheel.replication.groups import Groups
from tickwheel.replication.handout import (
    MIN_DEADLINES_KEPT,
    TARGET_GROUP_PROPERTY,
    ConsumerSlot,
    Planner,
    decode_receipt,
    encode_receipt,
    encode_receipts,
)
from tickwheel.replication.outcomes import Accepted, Moved, MoveOutcome, Rejected, Retried
from tickwheel.replication.state import StateConfig, StateMachine
from tickwheel.wheel import CancelResult, Cursor, DueMessage, NewMessage

T0_MS = 1_800_000_000_000


def schedule(state: StateMachine, messages: list[NewMessage]) -> list[int]:
    parts = [commands.encoded_message(m) for m in messages]
    return [r.handle for r in state.apply(commands.schedule(T0_MS, parts))]


def ready(state: StateMachine, handles: list[int], grants: list[Grant] = ()) -> list[int]:
    """Ready ``handles`` (as a leader that took them from the wheel would) and grant."""
    items = []
    for handle in handles:
        message, _ = state.wheel.handles.read(handle)
        items.append(Ready(handle, message.slot_second, message.local_index, message.topic,
                           message.properties.get(TARGET_GROUP_PROPERTY)))
    return state.apply(commands.handout(T0_MS, items, list(grants)))


def grant(handle: int, group: str = "", nonce: int = 7, mode: int = STREAM,
          topic: str = "orders") -> Grant:
    return Grant(handle, topic, group, nonce, T0_MS + 30_000, mode)


@pytest.fixture
def state(tmp_path: Path) -> StateMachine:
    opened = StateMachine.open(tmp_path, StateConfig(max_ready_msgs=5), fresh=True)
    yield opened
    opened.close()


def test_every_group_gets_every_message_and_a_topic_without_groups_gets_its_default(
        state: StateMachine) -> None:
    (early,) = schedule(state, [NewMessage("e", "orders", b"x", T0_MS)])
    ready(state, [early])
    assert [g.name for g in state.groups.of_topic("orders")] == [""]  # the default group
    state.apply(commands.group(T0_MS, True, "orders", "billing"))
    (later,) = schedule(state, [NewMessage("l", "orders", b"x", T0_MS)])
    ready(state, [later])
    default, billing = state.groups.of_topic("orders")
    assert list(default.ready) == [early, later]
    assert list(billing.ready) == [later]  # it exists since after "e" came due


def test_a_cancel_ordered_before_the_grant_means_never(state: StateMachine) -> None:
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS) for i in "ab"])
    # the leader took both from the wheel; a cancel of a is applied before its handout
    assert state.apply(commands.cancel(T0_MS, [a])) == [CancelResult.CANCELLED]
    assert ready(state, [a, b], [grant(a), grant(b)]) == [0, 1]  # a is not granted
    assert state.apply(commands.cancel(T0_MS, [a])) == [CancelResult.ALREADY_CANCELLED]
    (group,) = state.groups.of_topic("orders")
    assert list(group.leases) == [b]


def test_a_cancel_after_a_grant_answers_handed_out_and_stops_the_other_groups(
        state: StateMachine) -> None:
    state.apply(commands.group(T0_MS, True, "orders", "billing"))
    state.apply(commands.group(T0_MS, True, "orders", "audit"))
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS) for i in "ab"])
    assert ready(state, [a, b], [grant(a, "billing")]) == [1]
    assert state.apply(commands.cancel(T0_MS, [a, b])) == [CancelResult.HANDED_OUT,
                                                          CancelResult.CANCELLED]
    billing, audit = state.groups.of_topic("orders")
    assert list(audit.ready) == [] and list(billing.leases) == [a]
    assert ready(state, [], [grant(a, "audit")]) == [0]  # audit never gets a
    assert state.apply(commands.cancel(T0_MS, [a])) == [CancelResult.HANDED_OUT]
    # once billing acks it, a is done everywhere
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, [LeaseRef(billing.id, a, 1, 7)])) == [
        True]
    assert state.apply(commands.cancel(T0_MS, [a])) == [CancelResult.NOT_PENDING]


def test_a_cancel_after_one_group_acked_answers_handed_out_though_another_still_waits(
        state: StateMachine) -> None:
    state.apply(commands.group(T0_MS, True, "orders", "billing"))
    state.apply(commands.group(T0_MS, True, "orders", "audit"))
    (a,) = schedule(state, [NewMessage("a", "orders", b"x", T0_MS)])
    billing, audit = state.groups.of_topic("orders")
    assert ready(state, [a], [grant(a, "billing")]) == [1]
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, [LeaseRef(billing.id, a, 1, 7)])) == [
        True]
    assert list(audit.ready) == [a]  # billing is done with it; audit's consumers are not
    assert state.apply(commands.cancel(T0_MS, [a])) == [CancelResult.HANDED_OUT]
    assert list(audit.ready) == []


def test_a_handout_applied_twice_readies_and_grants_nothing_the_second_time(
        state: StateMachine) -> None:
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS) for i in "ab"])
    items = [Ready(h, m.slot_second, m.local_index, m.topic, None)
             for h in (a, b) for m in [state.wheel.handles.read(h)[0]]]
    command = commands.handout(T0_MS, items, [grant(a)])
    assert state.apply(command) == [1]
    (group,) = state.groups.of_topic("orders")
    assert state.apply(command) == [0]  # a leader's proposal committed twice
    assert list(group.ready) == [b] and list(group.leases) == [a]
    assert group.leases[a].seq == 1


def test_a_rejected_cancel_changes_nothing(state: StateMachine) -> None:
    (a,) = schedule(state, [NewMessage("a", "orders", b"x", T0_MS)])
    (refused,) = state.apply(commands.cancel(T0_MS, [a, (a | 0xFFFF)]))
    assert isinstance(refused, Rejected) and refused.error.field == "handles[1]"
    assert state.apply(commands.cancel(T0_MS, [a])) == [CancelResult.CANCELLED]


def test_forged_foreign_and_never_granted_receipts_change_nothing(state: StateMachine) -> None:
    state.apply(commands.group(T0_MS, True, "orders", "billing"))
    state.apply(commands.group(T0_MS, True, "orders", "audit"))
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS) for i in "ab"])
    ready(state, [a, b], [grant(a, "billing", nonce=1234)])
    billing, audit = state.groups.of_topic("orders")
    genuine = LeaseRef(billing.id, a, 1, 1234)
    attempts = [genuine._replace(nonce=1235),           # forged nonce
                genuine._replace(group_id=audit.id),     # another group's
                LeaseRef(billing.id, b, 1, 1234),        # never granted (b is only ready)
                genuine._replace(seq=2),                 # a lease that never was
                LeaseRef(99, a, 1, 1234)]                # no such group
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, attempts)) == [False] * 5
    assert state.apply(commands.leases(T0_MS, LeaseOp.RELEASE, attempts)) == [False] * 5
    assert list(billing.leases) == [a] and list(audit.ready) == [a, b]
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, [genuine])) == [True]
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, [genuine])) == [False]  # once


def test_receipts_round_trip_and_garbage_is_no_receipt() -> None:
    lease = LeaseRef(3, 1 << 40 | 17, 2, 2**64 - 1)
    assert decode_receipt(encode_receipt(lease), "ack.receipts[0]") == lease
    for garbage in ("", "1.2.3", "é", encode_receipt(lease)[:-4]):
        with pytest.raises(InvalidMessage, match=r"ack\.receipts\[0\]"):
            decode_receipt(garbage, "ack.receipts[0]")


def test_a_batch_of_receipts_names_each_lease_as_a_single_receipt_does() -> None:
    leases = [LeaseRef(group_id, handle, seq, nonce) for group_id, handle, seq, nonce in
              [(0, 0, 1, 0), (3, 1 << 40 | 17, 2, 2**64 - 1), (2**32 - 1, 2**63 - 1, 7, 5)]]
    for count in range(len(leases) + 1):
        batch = encode_receipts(leases[:count])
        assert batch == [encode_receipt(lease) for lease in leases[:count]]
        assert [decode_receipt(receipt, "r") for receipt in batch] == leases[:count]


def test_a_released_lease_comes_back_first_and_its_next_lease_is_the_second(
        state: StateMachine) -> None:
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS) for i in "ab"])
    assert ready(state, [a, b], [grant(a, nonce=5), grant(b, nonce=6, mode=DURABLE)]) == [1, 1]
    (group,) = state.groups.of_topic("orders")
    # a new leader's barrier ends the stream lease, not the durable one
    state.apply(commands.barrier(T0_MS, state.cursor))
    assert list(group.ready.items()) == [(a, (1, 5))] and list(group.leases) == [b]
    # an ack of the released lease still counts: the consumer did handle it
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, [LeaseRef(group.id, a, 1, 5)])) == [
        True]
    assert state.apply(commands.leases(T0_MS, LeaseOp.RELEASE,
                                       [LeaseRef(group.id, b, 1, 6)])) == [True]
    assert ready(state, [], [grant(b, nonce=8)]) == [2]  # flagged possible_duplicate


def test_a_lease_given_back_unsent_does_not_count_toward_the_next_flag(
        state: StateMachine) -> None:
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS) for i in "ab"])
    assert ready(state, [a, b], [grant(a, nonce=5), grant(b, nonce=6)]) == [1, 1]
    (group,) = state.groups.of_topic("orders")
    forged = [LeaseRef(group.id, a, 1, 4), LeaseRef(group.id, a, 2, 5)]
    assert state.apply(commands.leases(T0_MS, LeaseOp.RETURN, forged)) == [False, False]
    # a's consumer left before the courier sent it; b's had it sent, then left
    assert state.apply(commands.leases(T0_MS, LeaseOp.RETURN, [LeaseRef(group.id, a, 1, 5)])) == [
        True]
    assert state.apply(commands.leases(T0_MS, LeaseOp.RELEASE, [LeaseRef(group.id, b, 1, 6)])) == [
        True]
    assert list(group.ready) == [b, a]  # both first in line, latest first
    assert ready(state, [], [grant(a, nonce=8), grant(b, nonce=9)]) == [1, 2]  # only b flagged
    # the given-back lease's receipt is nobody's: it acks nothing, the new one does
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, [LeaseRef(group.id, a, 1, 5)])) == [
        False]
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, [LeaseRef(group.id, a, 1, 8)])) == [
        True]


def test_a_planner_gives_back_what_a_departing_consumer_was_never_sent(
        state: StateMachine) -> None:
    planner = Planner(DispatchConfig(), epoch=1)
    planner.join(ConsumerSlot(1, "orders", "", 10, visibility_ms=500, mode=STREAM))
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS) for i in "ab"])

    def read(handle: int) -> DueMessage | None:
        return state.wheel.handles.read(handle)[0]

    plan = planner.plan(state.groups, [read(a), read(b)], T0_MS, T0_MS, read)
    seqs = state.apply(commands.handout(T0_MS, plan.ready, plan.grants))
    sent, unsent = (d.lease for d in planner.granted(plan, seqs, state.groups))
    planner.sent(1, [sent], T0_MS + 5)  # the stream closed before the courier sent the other
    assert planner.leave(1) == ([sent], [unsent])
    assert planner.leave(1) == ([], [])


def test_a_planner_says_when_ready_messages_wait_for_credits(state: StateMachine) -> None:
    # what decides whether a credit wakes the Raft thread (`Replica.credit`)
    planner = Planner(DispatchConfig(), epoch=1)
    planner.join(ConsumerSlot(1, "orders", "", 1, visibility_ms=500, mode=STREAM))
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS) for i in "ab"])

    def read(handle: int) -> DueMessage | None:
        return state.wheel.handles.read(handle)[0]

    plan = planner.plan(state.groups, [read(a), read(b)], T0_MS, T0_MS, read)
    assert len(plan.grants) == 1 and planner.waiting  # b: readied, no credit left for it
    state.apply(commands.handout(T0_MS, plan.ready, plan.grants))
    assert planner.plan(state.groups, [], T0_MS, T0_MS, read).grants == []
    assert planner.waiting  # b waits in the group's ready set
    planner.credit(1, 1)
    plan = planner.plan(state.groups, [], T0_MS, T0_MS, read)
    assert len(plan.grants) == 1 and not planner.waiting  # b is being granted: nothing waits
    state.apply(commands.handout(T0_MS, plan.ready, plan.grants))
    planner.plan(state.groups, [], T0_MS, T0_MS, read)
    assert not planner.waiting


def test_a_group_nobody_reads_drops_its_oldest_past_its_bound_and_says_so(
        state: StateMachine, caplog: pytest.LogCaptureFixture) -> None:
    handles = schedule(state, [NewMessage(f"m{i}", "orders", b"x", T0_MS) for i in range(8)])
    with caplog.at_level(logging.WARNING, "tickwheel.replication.groups"):
        ready(state, handles[:1], [grant(handles[0])])  # leased: never dropped
        ready(state, handles[1:])
    (group,) = state.groups.of_topic("orders")
    assert list(group.ready) == handles[3:] and group.dropped == 2
    assert list(group.leases) == handles[:1]
    assert "event=ready_dropped" in caplog.text


def test_a_retry_copy_goes_to_its_group_only_and_ends_the_lease_once(
        state: StateMachine) -> None:
    state.apply(commands.group(T0_MS, True, "orders", "billing"))
    state.apply(commands.group(T0_MS, True, "orders", "audit"))
    (a,) = schedule(state, [NewMessage("a", "orders", b"x", T0_MS)])
    ready(state, [a], [grant(a, "billing", nonce=9)])
    billing, audit = state.groups.of_topic("orders")
    lease = LeaseRef(billing.id, a, 1, 9)
    copy = NewMessage("a", "orders", b"x", T0_MS + 10_000, {TARGET_GROUP_PROPERTY: "billing"},
                      attempt=2)
    part = commands.encoded_leased_retry(lease, copy)
    (retried,) = state.apply(commands.retry(T0_MS, [part]))
    assert isinstance(retried, Retried) and retried.handle is not None
    assert state.apply(commands.retry(T0_MS, [part])) == [Retried(None, T0_MS + 10_000)]
    ready(state, [retried.handle])
    assert list(billing.ready) == [retried.handle]
    assert list(audit.ready) == [a]  # audit still has the original, and not the copy


def test_groups_and_leases_come_back_from_a_manifest(tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path / "a", StateConfig(), fresh=True)
    state.apply(commands.group(T0_MS, True, "orders", "billing"))
    handles = schedule(state, [NewMessage(f"m{i}", "orders", b"x", T0_MS) for i in range(3)])
    ready(state, handles, [grant(handles[0], "billing")])
    manifest = state.manifest()
    state.apply(commands.group(T0_MS, False, "orders", "billing"))
    assert state.groups.summary() == []
    state.groups.restore(manifest.groups)
    (billing,) = state.groups.of_topic("orders")
    assert (list(billing.leases), list(billing.ready)) == (handles[:1], handles[1:])
    assert manifest.readied == state.readied
    state.close()


def test_a_default_group_goes_away_once_drained_so_passing_topics_leave_nothing(
        tmp_path: Path) -> None:
    # max_groups bounds named groups only: far more topics than that come due and none of
    # their messages is lost for want of a group
    state = StateMachine.open(tmp_path, StateConfig(max_groups=2), fresh=True)
    topics = [f"t{i}" for i in range(10)]
    handles = schedule(state, [NewMessage(t, t, b"x", T0_MS) for t in topics])
    ready(state, handles, [grant(h, topic=t, nonce=i) for i, (h, t) in
                           enumerate(zip(handles, topics, strict=True))])
    assert [len(state.groups.of_topic(t)[0].leases) for t in topics] == [1] * 10
    refs = [LeaseRef(state.groups.get(t, "").id, h, 1, i)
            for i, (h, t) in enumerate(zip(handles, topics, strict=True))]
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, refs)) == [True] * 10
    assert state.groups.summary() == [] and len(state.groups) == 0
    # asking for a topic's default group while it has no named group creates nothing
    assert state.apply(commands.group(T0_MS, True, "t0", "")) is True
    assert len(state.groups) == 0
    assert state.apply(commands.group(T0_MS, True, "t0", "a")) is True
    assert state.apply(commands.group(T0_MS, True, "t1", "b")) is True
    assert state.apply(commands.group(T0_MS, True, "t2", "c")) is False  # max_groups named
    state.close()


def test_a_default_group_beside_a_named_one_stays_and_a_retry_copy_finds_its_group(
        state: StateMachine) -> None:
    (a,) = schedule(state, [NewMessage("a", "orders", b"x", T0_MS)])
    ready(state, [a], [grant(a, nonce=3)])
    default = state.groups.get("orders", "")
    copy = NewMessage("a", "orders", b"x", T0_MS + 10_000, {TARGET_GROUP_PROPERTY: ""},
                      attempt=2)
    (retried,) = state.apply(commands.retry(T0_MS, [commands.encoded_leased_retry(
        LeaseRef(default.id, a, 1, 3), copy)]))
    assert state.groups.get("orders", "") is None  # drained: gone
    # a named group appears and the default group is asked for (it has consumers)
    state.apply(commands.group(T0_MS, True, "orders", "billing"))
    ready(state, [retried.handle])  # the copy is for the default group only
    default = state.groups.get("orders", "")
    assert list(default.ready) == [retried.handle]
    assert list(state.groups.get("orders", "billing").ready) == []
    (b,) = schedule(state, [NewMessage("b", "orders", b"x", T0_MS)])
    ready(state, [b], [grant(b, nonce=4), grant(retried.handle, nonce=5)])
    refs = [LeaseRef(default.id, b, 1, 4), LeaseRef(default.id, retried.handle, 1, 5)]
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, refs)) == [True, True]
    # beside a named group the default group is a subscription of its own: it stays
    assert state.groups.get("orders", "") is default
    assert list(state.groups.get("orders", "billing").ready) == [b]
    state.apply(commands.group(T0_MS, False, "orders", "billing"))
    assert len(state.groups) == 0  # with billing gone, the drained default goes too


def test_a_visibility_timeout_counts_from_the_send_not_from_the_grant(
        state: StateMachine) -> None:
    planner = Planner(DispatchConfig(), epoch=1)
    planner.join(ConsumerSlot(1, "orders", "", 10, visibility_ms=500, mode=STREAM))
    (a,) = schedule(state, [NewMessage("a", "orders", b"x", T0_MS)])

    def read(handle: int) -> DueMessage | None:
        return state.wheel.handles.read(handle)[0]

    plan = planner.plan(state.groups, [read(a)], T0_MS, T0_MS, read)
    seqs = state.apply(commands.handout(T0_MS, plan.ready, plan.grants))
    (delivery,) = planner.granted(plan, seqs, state.groups)
    # the commit round took 40 ms, the send 10 more: the consumer saw it at T0 + 50
    planner.sent(1, [delivery.lease], T0_MS + 50)
    for now_ms in (T0_MS + 500, T0_MS + 549):
        assert planner.expired(state.groups, now_ms, read) == []
    assert planner.next_deadline_ms() == T0_MS + 550
    (expired,) = planner.expired(state.groups, T0_MS + 550, read)
    assert expired.lease == delivery.lease and expired.consumer == 1
    assert planner.expired(state.groups, T0_MS + 10_000, read) == []  # once


def test_an_expired_lease_of_this_leader_is_retried_from_the_message_it_sent(
        state: StateMachine) -> None:
    """Reading it from the wheel again made a second copy of every body a stalled stream
    held, at the moment its whole budget expired."""
    planner = Planner(DispatchConfig(), epoch=1)
    planner.join(ConsumerSlot(1, "orders", "", 10, visibility_ms=500, mode=STREAM))
    (a,) = schedule(state, [NewMessage("a", "orders", b"x" * 1000, T0_MS)])
    reads: list[int] = []

    def read(handle: int) -> DueMessage | None:
        reads.append(handle)
        return state.wheel.handles.read(handle)[0]

    plan = planner.plan(state.groups, [read(a)], T0_MS, T0_MS, read)
    seqs = state.apply(commands.handout(T0_MS, plan.ready, plan.grants))
    (delivery,) = planner.granted(plan, seqs, state.groups)
    reads.clear()
    (expired,) = planner.expired(state.groups, T0_MS + 30_000, read)
    assert expired.message is delivery.message and reads == []
    # a lease this leader did not grant (an earlier leader's) is read from the wheel
    other = Planner(DispatchConfig(), epoch=2)
    other.watch(T0_MS + 500, delivery.lease.group_id, a, delivery.lease.seq)
    (theirs,) = other.expired(state.groups, T0_MS + 30_000, read)
    assert theirs.message == delivery.message and reads == [a]


def test_the_deadlines_of_leases_acked_long_before_they_run_out_are_not_kept_that_long(
        tmp_path: Path) -> None:
    """Each grant's deadline stayed queued until the visibility timeout passed, acked or not:
    at 13,000 msg/s with 30 s, 390,000 entries (66 MB) on a leader draining a burst."""
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    handles = schedule(state, [NewMessage(f"m{i}", "orders", b"x", T0_MS)
                               for i in range(3 * MIN_DEADLINES_KEPT)])
    ready(state, handles, [grant(handle, nonce=i) for i, handle in enumerate(handles)])
    group = state.groups.get("orders", "")
    planner = Planner(DispatchConfig(), epoch=2)
    for handle in handles:  # a new leader watches the leases it finds
        planner.watch(T0_MS + 30_000, group.id, handle, 1)
    held = handles[::1000]
    acked = [LeaseRef(group.id, h, 1, i) for i, h in enumerate(handles) if h not in held]
    assert all(state.apply(commands.leases(T0_MS, LeaseOp.ACK, acked)))

    def read(handle: int) -> DueMessage | None:
        return state.wheel.handles.read(handle)[0]

    assert planner.expired(state.groups, T0_MS + 1, read) == []
    assert len(planner._deadlines) == len(held)  # the acked leases' deadlines are gone
    assert sorted(e.lease.handle for e in planner.expired(state.groups, T0_MS + 30_000, read)
                  ) == sorted(held)
    state.close()


# -- reschedule: a move is a cancel and a schedule in one command, ordered with the handouts --

def move(state: StateMachine, *moves: tuple[int, int]) -> list:
    return state.apply(commands.move(T0_MS, list(moves)))


def test_a_reschedule_moves_a_pending_message_once_and_its_handle_follows(
        state: StateMachine) -> None:
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS + 60_000) for i in "ab"])
    before = state.pending.snapshot()
    assert move(state, (a, T0_MS + 5_000)) == [Moved(MoveOutcome.RESCHEDULED, T0_MS + 5_000)]
    copy = state.moves[a]
    message, tombstoned = state.wheel.handles.read(copy)
    assert (message.id, message.deliver_at_ms, tombstoned) == ("a", T0_MS + 5_000, False)
    assert state.wheel.handles.is_cancelled(a)  # the original will not come due
    assert state.pending.snapshot() == before  # still one pending message each
    # a repeat (its answer was lost) finds it there already: nothing moves again
    assert move(state, (a, T0_MS + 5_000)) == [Moved(MoveOutcome.RESCHEDULED, T0_MS + 5_000)]
    assert state.moves[a] == copy and state.pending.snapshot() == before
    # the client's handle names the copy now: moved again, then cancelled through it
    assert move(state, (a, T0_MS + 9_000)) == [Moved(MoveOutcome.RESCHEDULED, T0_MS + 9_000)]
    assert state.wheel.handles.is_cancelled(copy)
    assert state.apply(commands.cancel(T0_MS, [a, b])) == [CancelResult.CANCELLED] * 2
    assert move(state, (a, T0_MS), (b, T0_MS)) == [Moved(MoveOutcome.CANCELLED, 0)] * 2


def test_a_retried_schedule_of_a_moved_message_answers_its_new_time(state: StateMachine) -> None:
    """A producer whose schedule answer was lost retries it after someone rescheduled the
    message: the answer is the same handle, flagged duplicate, due when it now is."""
    (a,) = schedule(state, [NewMessage("a", "orders", b"x", T0_MS + 60_000)])
    move(state, (a, T0_MS + 5_000))
    parts = [commands.encoded_message(NewMessage("a", "orders", b"x", T0_MS + 60_000))]
    assert state.apply(commands.schedule(T0_MS, parts)) == [
        Accepted(a, T0_MS + 5_000, duplicate=True)]


def test_a_reschedule_ordered_after_a_grant_answers_handed_out_and_moves_nothing(
        state: StateMachine) -> None:
    state.apply(commands.group(T0_MS, True, "orders", "billing"))
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS) for i in "ab"])
    assert ready(state, [a, b], [grant(a, "billing")]) == [1]
    assert move(state, (a, T0_MS + 60_000), (b, T0_MS + 60_000)) == [
        Moved(MoveOutcome.HANDED_OUT, T0_MS), Moved(MoveOutcome.RESCHEDULED, T0_MS + 60_000)]
    (billing,) = state.groups.of_topic("orders")
    assert list(billing.leases) == [a] and list(billing.ready) == []  # b left the group
    assert a not in state.moves
    # the copy of b comes due later and is readied like any message
    assert ready(state, [state.moves[b]], [grant(state.moves[b], "billing")]) == [1]
    assert state.apply(commands.leases(T0_MS, LeaseOp.ACK, [LeaseRef(billing.id, a, 1, 7)])) == [
        True]
    assert move(state, (a, T0_MS)) == [Moved(MoveOutcome.NOT_PENDING, 0)]


def test_a_reschedule_ordered_before_the_handout_means_the_old_time_never_comes(
        state: StateMachine) -> None:
    (a,) = schedule(state, [NewMessage("a", "orders", b"x", T0_MS)])
    # the leader took a from the wheel; the move is applied before its handout
    assert move(state, (a, T0_MS + 60_000)) == [Moved(MoveOutcome.RESCHEDULED, T0_MS + 60_000)]
    assert ready(state, [a], [grant(a)]) == [0]
    assert state.groups.of_topic("orders") == []


def test_a_rejected_reschedule_changes_nothing(state: StateMachine) -> None:
    (a,) = schedule(state, [NewMessage("a", "orders", b"x", T0_MS + 60_000)])
    (refused,) = move(state, (a, T0_MS), (a | 0xFFFF, T0_MS))
    assert isinstance(refused, Rejected) and refused.error.field == "moves[1].handle"
    far = T0_MS + StateConfig().wheel.max_delay_ms + 1
    (refused,) = move(state, (a, T0_MS), (a, far))
    assert isinstance(refused, Rejected) and refused.error.field == "moves[1].deliver_at_ms"
    assert state.moves == {} and not state.wheel.handles.is_cancelled(a)


def test_moved_messages_are_bounded_remembered_in_snapshots_and_forgotten_once_passed(
        tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path, StateConfig(max_moved_msgs=1), fresh=True)
    a, b = schedule(state, [NewMessage(i, "orders", b"x", T0_MS + 60_000) for i in "ab"])
    assert move(state, (a, T0_MS + 3_600_000)) == [
        Moved(MoveOutcome.RESCHEDULED, T0_MS + 3_600_000)]
    (refused,) = move(state, (b, T0_MS))
    assert isinstance(refused, Rejected) and isinstance(refused.error, Overloaded)
    assert move(state, (a, T0_MS + 7_200_000)) == [  # a moved message may move again
        Moved(MoveOutcome.RESCHEDULED, T0_MS + 7_200_000)]
    assert state.manifest().moves == state.moves == {a: state.moves[a]}
    # past a's first hour the handle still finds its copy, due two hours on
    state.apply(commands.cursor(T0_MS + 3_700_000, Cursor((T0_MS + 3_700_000) // 1000, 0)))
    assert move(state, (a, T0_MS + 7_200_000)) == [
        Moved(MoveOutcome.RESCHEDULED, T0_MS + 7_200_000)]
    # two hours after both hours, the move is forgotten: the handle reads passed
    state.apply(commands.cursor(T0_MS + 11_000_000, Cursor((T0_MS + 11_000_000) // 1000, 0)))
    assert list(state.moves) == [a]
    state.apply(commands.cursor(T0_MS + 18_000_000, Cursor((T0_MS + 18_000_000) // 1000, 0)))
    assert state.moves == {}
    assert state.apply(commands.cancel(T0_MS, [a])) == [CancelResult.NOT_PENDING]
    state.close()



_TOPICS = ["a", "b"]
_NAMES = ["", "x", "y"]
_KINDS = st.sampled_from(["group", "ready", "ready", "grant", "grant", "ack", "ack"])


def _held(groups: Groups, ready: bool) -> list[tuple[int, int, str, int, int]]:
    """``(group id, handle, group name, seq, nonce)`` of every lease, or every ready message."""
    _, plain, _ = groups.snapshot()
    if ready:
        return [(gid, handle, name, seq, nonce)
                for gid, _, name, _, _, items, _ in plain for handle, (seq, nonce) in items]
    return [(gid, handle, name, seq, nonce)
            for gid, _, name, _, _, _, leases in plain for handle, seq, nonce, _, _ in leases]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_batched_ready_grant_and_ack_leave_the_groups_as_item_by_item_does(
        data: st.DataObject) -> None:
    # Every replica applies every hand-out and ack in batches (`ready_many`, `grant_many`,
    # `resolve_many`); a replica of a release before them went item by item. The two must
    # agree on every result and every byte of state: drops past the bound, fan-out, retired
    # default groups, grants on messages no longer ready, acks of stale or foreign leases.
    batched, single = Groups(max_ready_msgs=4, max_groups=8), Groups(max_ready_msgs=4,
                                                                     max_groups=8)
    strings = _TOPICS + _NAMES
    handles = st.integers(1, 8)
    for _ in range(data.draw(st.integers(0, 30))):
        kind = data.draw(_KINDS)
        if kind == "group":
            topic, name = data.draw(st.sampled_from(_TOPICS)), data.draw(st.sampled_from(_NAMES))
            assert batched.create(topic, name, T0_MS) == single.create(topic, name, T0_MS)
        elif kind == "ready":
            items = data.draw(st.lists(st.tuples(handles, st.sampled_from(_TOPICS), st.sampled_from(
                [None, None, None, "", "x"])), max_size=8))
            batched.ready_many(items, T0_MS)
            for handle, topic, target in items:
                single.ready(handle, topic, target, T0_MS)
        elif kind == "grant":  # mostly of ready messages, some of anything
            ready = [(h, _TOPICS.index(topic), 2 + _NAMES.index(name))
                     for g in batched for h in g.ready for topic, name in [(g.topic, g.name)]]
            target = st.sampled_from(ready) if ready else st.nothing()
            picks = data.draw(st.lists(st.one_of(target, st.tuples(
                handles, st.integers(0, 1), st.integers(2, 4))), max_size=8))
            rows = [(handle, topic, name, data.draw(st.integers(1, 2)), T0_MS, STREAM)
                    for handle, topic, name in picks]
            assert batched.grant_many(rows, strings) == [
                seq for row in rows for seq in single.grant_many([row], strings)]
        else:  # mostly of current leases, some stale, forged or of ready messages
            held = _held(batched, ready=False) + _held(batched, ready=True)
            target = st.sampled_from(held) if held else st.nothing()
            picks = data.draw(st.lists(st.one_of(target, target, st.tuples(
                st.integers(1, 3), handles, st.just(""), st.integers(0, 2), st.integers(1, 2))),
                max_size=8))
            refs = [LeaseRef(gid, handle, seq, nonce) for gid, handle, _, seq, nonce in picks]
            assert batched.resolve_many(refs) == [single.resolve(ref) for ref in refs]
        assert batched.snapshot() == single.snapshot()
