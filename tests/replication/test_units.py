"""The pure parts of replication, without Raft: commands, group commit, state, dispatcher."""

from __future__ import annotations

import hashlib
import pickle
import random
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sim_raft import NodeClock, SimCluster, SimRaft, World

from tickwheel.common.errors import InvariantViolation, MapChanged, NotLeader
from tickwheel.replication import (
    ConsumerSlot,
    Replica,
    ReplicaConfig,
    commands,
    state_files,
)
from tickwheel.replication.dispatcher import DispatchConfig, Dispatcher
from tickwheel.replication.group_commit import GroupCommitter
from tickwheel.replication.outcomes import Accepted, Rejected, Retried
from tickwheel.replication.raft.link_protocol import safe_loads
from tickwheel.replication.state import StateConfig, StateMachine
from tickwheel.wheel import CancelResult, Cursor, NewMessage

T0_MS = 1_800_000_000_000


def schedule_command(stamp_ms: int, batch: list[NewMessage]) -> bytes:
    return commands.schedule(stamp_ms, [commands.encoded_message(m) for m in batch])


def test_a_damaged_command_stops_the_replica_instead_of_diverging() -> None:
    command = bytearray(schedule_command(T0_MS, [NewMessage("a", "t", b"x", T0_MS)]))
    command[-1] ^= 1
    with pytest.raises(InvariantViolation, match="checksum"):
        commands.read_header(bytes(command))


def test_group_commit_packs_requests_into_bounded_entries_and_answers_each_caller() -> None:
    committer = GroupCommitter(max_entry_bytes=1_000, max_queued_msgs=1_000, wake=lambda: None)
    parts = [commands.encoded_message(NewMessage(f"m{i}", "t", b"x" * 100, T0_MS))
             for i in range(30)]
    futures = [committer.submit(parts[:7]), committer.submit(parts[7:30])]
    entries = committer.drain()
    assert len(entries) > 3
    assert all(sum(map(len, e.parts)) + commands.SCHEDULE_OVERHEAD_BYTES <= 1_000
               for e in entries)
    assert [p for e in entries for p in e.parts] == parts
    for number, entry in enumerate(entries):
        entry.settle([f"{number}:{i}" for i in range(len(entry.parts))], None)
    results = futures[0].result(0) + futures[1].result(0)
    assert len(results) == 30 and len(set(results)) == 30


def test_group_commit_fails_a_whole_request_when_any_of_its_entries_fails() -> None:
    committer = GroupCommitter(max_entry_bytes=400, max_queued_msgs=100, wake=lambda: None)
    parts = [commands.encoded_message(NewMessage(f"m{i}", "t", b"x" * 100, T0_MS))
             for i in range(6)]
    future = committer.submit(parts)
    first, second, *rest = committer.drain()
    first.settle([None] * len(first.parts), None)
    second.settle(None, NotLeader("127.0.0.1:1"))
    for entry in rest:
        entry.settle([None] * len(entry.parts), None)
    with pytest.raises(NotLeader):
        future.result(0)


def test_a_request_whose_caller_gave_up_is_settled_without_an_error() -> None:
    """A cancelled gRPC call cancels the future it awaits; settling it later (leadership lost,
    or the entry applied) must not raise on the Raft thread, which would stop the node."""
    committer = GroupCommitter(max_entry_bytes=1 << 20, max_queued_msgs=100, wake=lambda: None)
    part = commands.encoded_message(NewMessage("m", "t", b"x", T0_MS))
    abandoned, kept = committer.submit([part]), committer.submit([part])
    assert abandoned.cancel()
    (entry,) = committer.drain()
    entry.settle(None, NotLeader("127.0.0.1:1"))
    assert abandoned.cancelled()
    with pytest.raises(NotLeader):
        kept.result(0)
    applied = committer.submit([part])
    applied.cancel()
    (entry,) = committer.drain()
    entry.settle(["scheduled"], None)  # committed, but nobody waits for the answer
    queued = committer.submit([part])
    queued.cancel()
    committer.fail_all(NotLeader(None))
    assert applied.cancelled() and queued.cancelled()


def test_replicas_applying_the_same_commands_hold_identical_files(tmp_path: Path) -> None:
    log = [schedule_command(T0_MS + i, [NewMessage(f"m{i}-{j}", "t", bytes([i, j]) * 50,
                                                   T0_MS + 1_000 * (i * 7 % 13) + j)
                                        for j in range(5)])
           for i in range(40)]
    states = [StateMachine.open(tmp_path / name, StateConfig(), fresh=True) for name in "ab"]
    results = [[state.apply(command) for command in log] for state in states]
    handles = [scheduled.handle for scheduled in results[0][3]]
    log = [commands.cancel(T0_MS + 50, [handles[1], 1 << 40]),
           commands.cancel(T0_MS + 50, [handles[0], handles[3], handles[1]]),
           commands.cursor(T0_MS + 60, Cursor(T0_MS // 1000 + 2, 1))]
    for state, applied in zip(states, results, strict=True):
        applied += [state.apply(command) for command in log]
    assert repr(results[0]) == repr(results[1])
    (refused,) = results[0][-3]  # a handle no schedule returned: the whole cancel is refused
    assert isinstance(refused, Rejected) and refused.error.field == "handles[1]"
    assert results[0][-2] == [CancelResult.CANCELLED] * 3  # handles[1] was left alone
    manifests = [state.manifest() for state in states]
    for state in states:
        state.close()
    assert manifests[0] == manifests[1]
    digests = [{path: hashlib.sha256((tmp_path / name / path).read_bytes()).hexdigest()
                for path in manifest.files} for name, manifest in zip("ab", manifests,
                                                                       strict=True)]
    assert digests[0] == digests[1]


def test_a_repeated_id_returns_its_first_result_also_within_one_entry(tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    first = state.apply(schedule_command(T0_MS, [NewMessage("a", "t", b"1", T0_MS + 5_000),
                                                 NewMessage("a", "t", b"2", T0_MS + 9_000)]))
    again = state.apply(schedule_command(T0_MS + 1, [NewMessage("a", "t", b"3", T0_MS)]))
    assert first[0] == Accepted(first[0].handle, T0_MS + 5_000, duplicate=False)
    assert first[1] == again[0] == first[0]._replace(duplicate=True)
    state.close()


def test_an_entry_mixing_new_retried_and_too_late_messages_answers_each_in_order(
        tmp_path: Path) -> None:
    # An entry whose messages are all new is filed column by column; any other goes message
    # by message. The remembered ids must come back from the files after a reopen too.
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    first = state.apply(schedule_command(T0_MS, [NewMessage("a", "t", b"1", T0_MS + 5_000)]))
    state.close()
    state = StateMachine.open(tmp_path, StateConfig(), fresh=False)
    too_late_ms = T0_MS + 1 + state.wheel._config.max_delay_ms + 1
    mixed = state.apply(schedule_command(T0_MS + 1, [
        NewMessage("b", "u", b"2", T0_MS + 6_000),
        NewMessage("a", "t", b"3", T0_MS),
        NewMessage("c", "t", b"4", too_late_ms),
        NewMessage("b", "u", b"5", T0_MS),
        NewMessage("d", "t", b"6", T0_MS + 7_000)]))
    assert mixed[0] == Accepted(mixed[0].handle, T0_MS + 6_000, duplicate=False)
    assert mixed[1] == first[0]._replace(duplicate=True)
    assert isinstance(mixed[2], Rejected) and mixed[2].error.field == "deliver_at_ms"
    assert mixed[3] == mixed[0]._replace(duplicate=True)
    assert mixed[4] == Accepted(mixed[4].handle, T0_MS + 7_000, duplicate=False)
    assert len({first[0].handle, mixed[0].handle, mixed[4].handle}) == 3
    assert state.pending.by_topic() == {"t": 1, "u": 1}  # this entry's (open read no manifest)
    state.close()


def test_the_dedupe_window_forgets_ids_after_its_time(tmp_path: Path) -> None:
    config = StateConfig(dedupe_window_ms=60_000)
    state = StateMachine.open(tmp_path, config, fresh=True)
    state.apply(schedule_command(T0_MS, [NewMessage("a", "t", b"1", T0_MS + 500_000)]))
    later = state.apply(schedule_command(T0_MS + 120_000,
                                         [NewMessage("a", "t", b"1", T0_MS + 500_000)]))
    assert later[0].duplicate is False
    assert state.dedupe.ids == 1
    state.close()


def test_install_cuts_longer_files_and_fetches_missing_tails(tmp_path: Path) -> None:
    source = StateMachine.open(tmp_path / "source", StateConfig(), fresh=True)
    behind = StateMachine.open(tmp_path / "behind", StateConfig(), fresh=True)
    early = schedule_command(T0_MS, [NewMessage(f"m{i}", "t", b"x" * 200, T0_MS + 4_000_000)
                                     for i in range(50)])
    for state in (source, behind):
        state.apply(early)
    manifest = source.manifest()
    source.apply(schedule_command(T0_MS + 1, [NewMessage("z", "t", b"z", T0_MS + 4_000_000)]))
    source.manifest()  # writes the newer bytes; the manifest still names the older lengths
    behind.apply(schedule_command(T0_MS + 2, [NewMessage("q", "t", b"q", T0_MS + 9_000_000)]))
    fetched = []

    def fetch(path: str, offset: int, size: int) -> bytes:
        fetched.append(path)
        with open(tmp_path / "source" / path, "rb") as file:
            file.seek(offset)
            return file.read(size)
    behind.manifest()  # flushed, so there is a file to lose
    (tmp_path / "behind" / next(iter(manifest.files))).unlink()
    behind.install(manifest, fetch)
    assert fetched
    assert behind.manifest() == manifest
    source.close()
    behind.close()


def test_install_fetches_files_side_by_side(tmp_path: Path) -> None:
    # One at a time, each fetch waited its turn of a busy leader: a wiped follower of a chaos
    # run spent 8-10 s installing, its Raft thread blocked meanwhile.
    source, empty, manifest = source_and_empty(tmp_path, hours=8)
    assert len(manifest.files) > 2
    in_flight, most = [0], [0]
    overlapped = threading.Event()
    lock = threading.Lock()

    def fetch(path: str, offset: int, size: int) -> bytes:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            if in_flight[0] > 1:
                overlapped.set()
        overlapped.wait(5)  # the first waits for a second to be asked meanwhile
        with lock:
            in_flight[0] -= 1
        return read_range(tmp_path / "source", path, offset, size)
    empty.install(manifest, fetch)
    assert most[0] > 1
    assert empty.manifest() == manifest
    source.close()
    empty.close()


def test_install_fetches_small_tails_in_batches_and_a_long_one_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A call per file waited a turn of the leader's loop each: 5-13 ms a file, 15 s for the
    # 1,548 files of a wiped follower of a chaos run.
    source, empty, manifest = source_and_empty(tmp_path, hours=40)
    read = partial(read_range, tmp_path / "source")
    batches: list[list[tuple[str, int, int]]] = []
    alone: list[str] = []

    def fetch_many(ranges: list[tuple[str, int, int]]) -> list[bytes]:
        batches.append(ranges)
        return [read(*asked) for asked in ranges]

    def fetch(path: str, offset: int, size: int) -> bytes:
        alone.append(path)
        return read(path, offset, size)
    longest = max(manifest.files, key=manifest.files.__getitem__)
    monkeypatch.setattr(state_files, "FETCH_CHUNK_BYTES", manifest.files[longest] - 1)
    empty.install(manifest, fetch, fetch_many)
    assert alone == [longest, longest]  # longer than a batch may carry: on its own, in two
    assert sum(map(len, batches)) == len([f for f in manifest.files if manifest.files[f]]) - 1
    assert all(len(batch) <= state_files.FETCH_BATCH_FILES for batch in batches)
    assert len(batches) < len(manifest.files) / 10
    assert empty.manifest() == manifest
    source.close()
    empty.close()


def source_and_empty(tmp_path: Path, hours: int) -> tuple[StateMachine, StateMachine, Any]:
    """A state with a message in each of ``hours`` hours, an empty one, and the first's
    manifest."""
    source = StateMachine.open(tmp_path / "source", StateConfig(), fresh=True)
    empty = StateMachine.open(tmp_path / "empty", StateConfig(), fresh=True)
    source.apply(schedule_command(T0_MS, [
        NewMessage(f"m{i}", "t", b"x" * 200, T0_MS + hour * 3_600_000)
        for i, hour in enumerate(range(1, hours + 1))]))
    return source, empty, source.manifest()


def read_range(root: Path, path: str, offset: int, size: int) -> bytes:
    with open(root / path, "rb") as file:
        file.seek(offset)
        return file.read(size)


def ready_all(state: StateMachine, taken: list) -> None:
    """Apply a handout that readies ``taken`` (no grants)."""
    state.apply(commands.handout(T0_MS, [
        commands.Ready(m.handle, m.slot_second, m.local_index, m.topic, None) for m in taken],
        []))


def test_the_cursor_passes_readied_and_cancelled_messages_and_waits_for_a_closed_second(
        tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    second = T0_MS // 1000
    scheduled = state.apply(schedule_command(T0_MS, [
        NewMessage(f"m{i}", "t", b"x", T0_MS + 100 * i) for i in range(3)]))
    assert state.apply(commands.cancel(T0_MS, [scheduled[1].handle])) == [
        CancelResult.CANCELLED]
    dispatcher = Dispatcher(DispatchConfig())
    dispatcher.begin(state.wheel, state.readied)
    taken = dispatcher.take(state.wheel, T0_MS + 999)
    assert [m.id for m in taken] == ["m0", "m2"]
    # taken is not readied: the cursor waits for the handout to be applied
    assert dispatcher.next_cursor(state.wheel, state.readied, T0_MS + 999) == (
        Cursor(second, 0), False)
    ready_all(state, taken[:1])
    assert dispatcher.next_cursor(state.wheel, state.readied, T0_MS + 999) == (
        Cursor(second, 2), False)
    ready_all(state, taken[1:])
    # all of the second is readied, but the stamp is still in it: more may be filed there
    assert dispatcher.next_cursor(state.wheel, state.readied, T0_MS + 999) == (
        Cursor(second, 3), False)
    state.apply(commands.cursor(T0_MS + 1_500, Cursor(second, 3)))
    assert state.readied == {}  # behind the cursor now
    state.apply(schedule_command(T0_MS + 1_500, [NewMessage("n", "t", b"x", T0_MS + 5_000)]))
    assert dispatcher.next_cursor(state.wheel, state.readied, T0_MS + 1_600)[0] == Cursor(
        second + 1, 0)
    state.close()


def test_a_new_leader_takes_again_exactly_what_no_handout_readied(tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    second = T0_MS // 1000
    state.apply(schedule_command(T0_MS, [
        NewMessage(f"m{i}", "t", b"x", T0_MS + i) for i in range(8)]))
    old = Dispatcher(DispatchConfig())
    old.begin(state.wheel, state.readied)
    taken = old.take(state.wheel, T0_MS + 100)
    ready_all(state, [m for m in taken if m.id not in ("m0", "m5")])  # their handout was lost
    ready_all(state, taken[1:3])  # a handout proposed twice readies once
    assert sum(len(g.ready) for g in state.groups) == 6
    cursor, _ = old.next_cursor(state.wheel, state.readied, T0_MS + 100)
    assert cursor == Cursor(second, 0)
    state.apply(commands.barrier(T0_MS + 110, cursor))
    new = Dispatcher(DispatchConfig())
    new.begin(state.wheel, state.readied)
    again = new.take(state.wheel, T0_MS + 200)
    assert [m.id for m in again] == ["m0", "m5"]
    ready_all(state, again)
    assert new.next_cursor(state.wheel, state.readied, T0_MS + 200)[0] == Cursor(second, 8)
    state.close()


def test_readied_positions_go_through_a_snapshot_as_the_release_before_reads_them(
        tmp_path: Path) -> None:
    """Readied positions are compressed bitmaps in memory; a snapshot holds each second's as
    a tuple, which the release before (sets) reads with ``set(indexes)`` and its restricted
    unpickler accepts, and a snapshot of that release (sets) is read back as bitmaps."""
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    second = T0_MS // 1000
    state.apply(schedule_command(T0_MS, [
        NewMessage(f"m{i}", "t", b"x", T0_MS + i % 1000) for i in range(3_000)]))
    dispatcher = Dispatcher(DispatchConfig(max_take_msgs=1_000, max_unapplied_msgs=3_000))
    dispatcher.begin(state.wheel, state.readied)
    taken = [m for _ in range(3) for m in dispatcher.take(state.wheel, T0_MS + 999)]
    ready_all(state, [m for m in taken if m.local_index % 3 and m.local_index != 2_000])
    expected = {i for i in range(3_000) if i % 3 and i != 2_000}
    parts = safe_loads(pickle.dumps(state_files.manifest_parts(state.manifest())))
    assert isinstance(parts, tuple)
    assert {s: set(indexes) for s, indexes in parts[5].items()} == {second: expected}
    assert state_files.manifest_of(parts).readied == state.readied
    older = (*parts[:5], {second: expected}, *parts[6:])
    assert set(state_files.manifest_of(older).readied[second]) == expected
    # the cursor forgets what it passed, and a new leader takes again exactly the gaps
    state.apply(commands.cursor(T0_MS + 999, Cursor(second, 1_000)))
    assert set(state.readied[second]) == {i for i in expected if i >= 1_000}
    again = Dispatcher(DispatchConfig(max_take_msgs=1_000, max_unapplied_msgs=3_000))
    again.begin(state.wheel, state.readied)
    taken_again = [m for _ in range(3) for m in again.take(state.wheel, T0_MS + 999)]
    assert sorted(m.local_index for m in taken_again) == [
        i for i in range(1_000, 3_000) if i % 3 == 0 or i == 2_000]
    state.close()


def retry_command(stamp_ms: int, retries: list[tuple[int, NewMessage]]) -> bytes:
    return commands.reschedule(stamp_ms, [commands.encoded_retry(h, m) for h, m in retries])


def test_a_reschedule_retires_the_original_and_files_its_copy_once(tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    (original,) = state.apply(schedule_command(T0_MS, [NewMessage("a", "t", b"x", T0_MS)]))
    copy = NewMessage("a", "t", b"x", T0_MS + 10_000, attempt=2)
    (retried,) = state.apply(retry_command(T0_MS + 5, [(original.handle, copy)]))
    assert retried.handle is not None and retried.deliver_at_ms == T0_MS + 10_000
    assert state.pending.by_topic() == {"t": 1}  # the copy replaces the original
    # the same nack again (a second leader's): the original is retired, nothing more is filed
    assert state.apply(retry_command(T0_MS + 6, [(original.handle, copy)])) == [
        Retried(None, T0_MS + 10_000)]
    # the copy keeps the id the dedupe window remembers, and was not swallowed by it; a
    # producer's retry of the original still gets the original's result
    (again,) = state.apply(schedule_command(T0_MS + 7, [NewMessage("a", "t", b"x", T0_MS)]))
    assert again == original._replace(duplicate=True)
    dispatcher = Dispatcher(DispatchConfig())
    dispatcher.begin(state.wheel, state.readied)
    assert dispatcher.take(state.wheel, T0_MS + 9_999) == []
    (message,) = dispatcher.take(state.wheel, T0_MS + 10_000)
    assert (message.id, message.attempt, message.handle) == ("a", 2, retried.handle)
    # the retired original counts as done: the cursor moves over it
    assert dispatcher.next_cursor(state.wheel, state.readied, T0_MS + 10_000)[0] == Cursor(
        T0_MS // 1000, 1)
    state.close()


def test_a_reschedule_that_frees_a_topic_tag_keeps_every_copy_counted_under_its_topic(
        tmp_path: Path) -> None:
    """Two retries of topic ``a``: the second original takes ``a``'s count to zero and frees
    its tag, which the second copy's topic ``b`` then gets; the first copy, of ``a``, must
    not end up counted as ``b``."""
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    originals = state.apply(schedule_command(T0_MS, [
        NewMessage(f"a{i}", "a", b"x", T0_MS) for i in range(2)]))
    state.apply(retry_command(T0_MS + 5, [
        (originals[0].handle, NewMessage("a0", "a", b"x", T0_MS + 10_000, attempt=2)),
        (originals[1].handle, NewMessage("a1", "b", b"x", T0_MS + 10_000, attempt=2))]))
    assert state.pending.by_topic() == {"a": 1, "b": 1}
    state.close()


def test_a_reschedule_refused_at_apply_leaves_the_original_pending(tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    (original,) = state.apply(schedule_command(T0_MS, [NewMessage("a", "t", b"x", T0_MS)]))
    too_far = NewMessage("a", "t", b"x", T0_MS + 400 * 86_400_000, attempt=2)
    (refused,) = state.apply(retry_command(T0_MS, [(original.handle, too_far)]))
    assert isinstance(refused, Rejected)
    assert state.apply(commands.cancel(T0_MS, [original.handle])) == [CancelResult.CANCELLED]
    state.close()


def test_pending_counts_follow_schedules_cancels_and_the_cursor_and_come_back_from_a_manifest(
        tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path / "a", StateConfig(max_tracked_topics=2), fresh=True)
    topics = ["a", "b", "a", "c", "b", "a"]  # "c" is over the cap of two tracked topics
    batch = [NewMessage(f"m{i}", t, b"x", T0_MS + 1_000 * (i % 3)) for i, t in enumerate(topics)]
    results = state.apply(schedule_command(T0_MS, batch))
    state.apply(schedule_command(T0_MS, batch[:2]))  # retried ids count once
    assert (state.pending.by_topic(), state.pending.untracked) == ({"a": 3, "b": 2}, 1)
    assert state.apply(commands.cancel(T0_MS, [results[0].handle, results[0].handle])) == [
        CancelResult.CANCELLED, CancelResult.ALREADY_CANCELLED]
    state.apply(commands.cursor(T0_MS + 1_000, Cursor(T0_MS // 1_000 + 1, 1)))  # m0 m3 m1
    assert (state.pending.by_topic(), state.pending.untracked) == ({"a": 2, "b": 1}, 0)
    manifest = state.manifest()
    state.apply(commands.cursor(T0_MS + 3_000, Cursor(T0_MS // 1_000 + 3, 0)))
    assert (state.pending.by_topic(), state.pending.untracked) == ({}, 0)
    state.apply(schedule_command(T0_MS + 3_000, [NewMessage("n", "c", b"x", T0_MS + 9_000)]))
    assert state.pending.by_topic() == {"c": 1}  # a tag came free: "c" is tracked now
    state.pending.restore(manifest.pending)
    assert (state.pending.by_topic(), state.pending.untracked) == ({"a": 2, "b": 1}, 0)
    state.close()


class _Sink:
    def __init__(self, clock: NodeClock | None = None) -> None:
        self.delivered: list[object] = []
        self.at_ms: list[int] = []
        self._clock = clock

    def dispatch_started(self, *_: object) -> None:
        pass

    def deliver(self, deliveries: list[object]) -> None:
        self.delivered += deliveries
        if self._clock is not None:
            self.at_ms += [self._clock.now_ms()] * len(deliveries)

    def expired(self, _: list[object]) -> None:
        pass

    def dispatch_stopped(self, _: int) -> None:
        pass


def _alone(tmp_path: Path, world: World, sink: _Sink, wakes: list[None]
           ) -> tuple[Replica, SimCluster]:
    """A replica alone on the simulated Raft port, counting its wakes."""
    cluster = SimCluster(world, random.Random(0))

    def raft(address: str, _peers: list[str], raft_dir: Path, _config: object,
             apply: object, snapshot: tuple, wall_ms: object, prefetch: object,
             taking: object) -> SimRaft:
        node = cluster.nodes[address] = SimRaft(cluster, address, raft_dir, apply, snapshot)
        node.wake = lambda: wakes.append(None)
        return node
    replica = Replica("n0", [], tmp_path, sink, fetch=lambda *_: b"", clock=NodeClock(world),
                      raft=raft)
    return replica, cluster


def _turns(cluster: SimCluster, replica: Replica, world: World, step_s: float,
           count: int = 4) -> None:
    """``count`` turns of the replica alone: replicate, turn, and let ``step_s`` pass."""
    for _ in range(count):
        cluster.replicate()
        replica.turn(0.0)
        world.now_s += step_s


DISPATCH = ReplicaConfig().dispatch


@pytest.mark.parametrize(("per_ms", "span_ms", "lead_ms"), [
    (1, DISPATCH.slow_lead_ms - DISPATCH.min_lead_ms, DISPATCH.slow_lead_ms),
    (10, DISPATCH.lead_ms - DISPATCH.min_lead_ms, DISPATCH.lead_ms)],
    ids=["slow: steps of few take ahead", "fast: full steps come every 10 ms"])
def test_at_a_steady_rate_a_dispatch_step_takes_what_came_within_the_lead(
        tmp_path: Path, per_ms: int, span_ms: int, lead_ms: int) -> None:
    """One handout every ``span_ms``, not one per turn nor one per few ms; each message
    readied ``min_lead_ms`` to ``lead_ms`` ahead of its due time. At 1,000 msg/s a step would
    carry 10 (under ``slow_step_msgs``), so it takes ahead to ``slow_lead_ms`` and comes every
    20 ms; at 10,000 msg/s steps are full and come every 10 ms, readied at most ``lead_ms``
    ahead."""
    world, wakes = World(), []
    sink = _Sink(NodeClock(world))
    replica, cluster = _alone(tmp_path, world, sink, wakes)
    cluster.elect("n0")
    handouts: list[int] = []
    apply = replica._state.apply

    def counting(command: bytes) -> object:
        if commands.read_header(command)[0] is commands.Kind.HANDOUT:
            handouts.append(NodeClock(world).now_ms())
        return apply(command)
    replica._state.apply = counting
    for _ in range(3):
        cluster.replicate()
        replica.turn(0.0)
        world.now_s += 0.001
    replica.join(ConsumerSlot(1, "t", "", 100_000, 30_000, 0))
    start_ms = NodeClock(world).now_ms() + 200
    count = 1_000 * per_ms
    replica.schedule([NewMessage(f"m{i}", "t", b"x", start_ms + i // per_ms)
                      for i in range(count)])
    while world.now_s * 1000 < start_ms - 1_800_000_000_000 + 1_000:
        cluster.replicate()
        replica.turn(0.0)
        world.now_s += 0.001  # a turn every millisecond, as replies and requests make them
    assert len(sink.delivered) == count
    # a step every span_ms + 1 (whole ms)
    assert 1_000 / (span_ms + 2) <= len(handouts) <= 1_000 / span_ms + 3, len(handouts)
    ahead_ms = [d.message.deliver_at_ms - at_ms for d, at_ms in zip(
        sink.delivered, sink.at_ms, strict=True)]
    assert DISPATCH.min_lead_ms - 2 <= min(ahead_ms) and max(ahead_ms) <= lead_ms
    replica.stop()


def test_reports_that_nothing_waits_for_do_not_wake_the_raft_thread(tmp_path: Path) -> None:
    world, sink, wakes = World(), _Sink(), []
    replica, cluster = _alone(tmp_path, world, sink, wakes)
    turns = partial(_turns, cluster, replica, world, 0.005)
    cluster.elect("n0")
    turns()
    replica.join(ConsumerSlot(1, "t", "", 1, 30_000, 0))
    now_ms = NodeClock(world).now_ms()
    replica.schedule([NewMessage(i, "t", b"x", now_ms) for i in "ab"])
    turns(6)
    (delivery,) = sink.delivered  # one credit: b waits for the next
    wakes.clear()
    replica.sent(1, [delivery.lease], now_ms)
    replica.ack([delivery.lease], wake=False)
    assert wakes == []  # read at the next turn
    replica.credit(1, 1)
    assert len(wakes) == 1  # b waits for it
    turns(6)
    assert len(sink.delivered) == 2
    wakes.clear()
    replica.credit(1, 1)
    assert wakes == []  # nothing waits: the next dispatch step reads it first
    replica.ack([sink.delivered[1].lease])
    assert len(wakes) == 1  # a caller waits for this answer
    replica.stop()


def test_a_schedule_joins_a_turn_due_soon_and_wakes_a_leader_with_nothing_due(
        tmp_path: Path) -> None:
    """While messages come due the leader turns every dispatch step: a schedule request waits
    for that turn, which proposes it with the step's handout (one Raft round for both, where
    a wake made a round of its own per request); a leader with nothing due soon is woken."""
    world, sink, wakes = World(), _Sink(), []
    replica, cluster = _alone(tmp_path, world, sink, wakes)
    linger_ms = ReplicaConfig().schedule_linger_ms
    turns = partial(_turns, cluster, replica, world, 0.001)
    cluster.elect("n0")
    turns()
    replica.join(ConsumerSlot(1, "t", "", 100_000, 30_000, 0))
    now_ms = NodeClock(world).now_ms()
    wakes.clear()
    far = replica.schedule([NewMessage("far", "t", b"x", now_ms + 60_000)])
    assert len(wakes) == 1  # nothing due: the next turn is cursor_sync_ms away
    turns()
    assert not far.result(0)[0].duplicate
    replica.schedule([NewMessage(f"due{i}", "t", b"x", now_ms + 20 + i) for i in range(400)])
    turns(40)  # dispatching: a step every 20 ms at this rate (slow_lead_ms - min_lead_ms)
    wakes.clear()
    answered = []
    for i in range(100):
        replica.schedule([NewMessage(f"joined{i}", "t", b"x", now_ms + 60_000)]
                         ).add_done_callback(lambda _: answered.append(world.now_s))
        turns(1)
    assert wakes == []
    span_ms = DISPATCH.slow_lead_ms - DISPATCH.min_lead_ms  # the slow rate's step span
    turns(max(linger_ms, span_ms) + 2)
    assert len(answered) == 100  # each with the next step
    replica.stop()


def test_a_turn_in_which_nothing_changed_skips_the_step(tmp_path: Path) -> None:
    """The leader's turn for a follower's answer that commits nothing: its step would find
    everything as it left it, so it is not run until the time it asked to be woken at."""
    world, sink, wakes = World(), _Sink(), []
    replica, cluster = _alone(tmp_path, world, sink, wakes)
    steps: list[float] = []
    step = replica._step
    replica._step = lambda: (steps.append(world.now_s), step())[-1]
    cluster.elect("n0")

    def turn() -> float:
        cluster.replicate()
        return replica.turn(0.0)
    while not replica.status().dispatching:
        turn()
        world.now_s += 0.001
    turn()
    wait_s = turn()  # the dispatch started: nothing queued, nothing applied since
    assert wait_s > 0.01
    steps.clear()
    world.now_s += wait_s / 2
    assert turn() == pytest.approx(wait_s / 2)  # the same wake-up time, without a step
    assert steps == []
    replica.credit(1, 5)  # something queued: the step reads it
    turn()
    assert len(steps) == 1
    now_ms = NodeClock(world).now_ms()
    replica.schedule([NewMessage("a", "t", b"x", now_ms + 60_000)])
    turn()  # proposed: the step ran
    turn()  # applied (the simulated Raft applies at the next tick): the step runs again
    assert len(steps) == 3
    world.now_s += 0.06
    turn()  # past its time
    assert len(steps) == 4
    replica.stop()


def test_a_schedule_placed_by_an_older_shard_map_is_refused_once_a_newer_is_proposed(
        tmp_path: Path) -> None:
    """A growth's shard map goes into the log after every schedule queued before it, and a
    schedule placed by the older map but queued after it is refused (`MapChanged`): else it
    could be applied after the switch, on a shard the id no longer belongs to, while the shard
    that owns it now has been told the id is new."""
    world, sink, wakes = World(), _Sink(), []
    replica, cluster = _alone(tmp_path, world, sink, wakes)
    turns = partial(_turns, cluster, replica, world, 0.001)
    cluster.elect("n0")
    turns()
    due_ms = NodeClock(world).now_ms() + 60_000
    order: list[commands.Kind] = []
    apply = replica._state.apply

    def noting(command: bytes) -> object:
        order.append(commands.read_header(command)[0])
        return apply(command)
    replica._state.apply = noting
    switched = replica.change_shard_map(2, b'{"map": 2}')
    queued_before = replica.schedule([NewMessage("a", "t", b"x", due_ms)], map_version=1)
    replica.turn(0.0)  # proposes "a", then the map: not applied yet
    placed_by_old = replica.schedule([NewMessage("b", "t", b"x", due_ms)], map_version=1)
    placed_by_new = replica.schedule([NewMessage("c", "t", b"x", due_ms)], map_version=2)
    turns()
    assert [r.duplicate for r in queued_before.result(0)] == [False]
    assert switched.result(0) == 2
    with pytest.raises(MapChanged):
        placed_by_old.result(0)
    assert [r.duplicate for r in placed_by_new.result(0)] == [False]
    scheduling = [kind for kind in order if kind in (commands.Kind.SCHEDULE,
                                                     commands.Kind.SHARD_MAP)]
    assert scheduling == [commands.Kind.SCHEDULE, commands.Kind.SHARD_MAP,
                          commands.Kind.SCHEDULE]
    # an older version changes nothing; the map in force is kept by a snapshot
    assert replica.change_shard_map(1, b"{}") is not None
    turns()
    record = replica.shard_map
    assert record is not None and (record.version, record.body) == (2, b'{"map": 2}')
    manifest = replica._state.manifest()
    assert manifest.shard_map == record
    pickled = pickle.loads(pickle.dumps(state_files.manifest_parts(manifest)))
    assert state_files.manifest_of(pickled).shard_map == record
    assert state_files.manifest_of(pickled[:8]).shard_map is None  # an older release's
    assert sorted(replica.remembered(["c", "b", "a"])) == [0, 2]  # "b" was never scheduled
    replica.stop()
