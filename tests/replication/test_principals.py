"""Who asked, in the log and in every replica's ledger rows, without processes: an entry names
each request's principal once (runs, not a name per message), the leader writes the
``_by`` kinds only once the cluster's version has them (0.0.4 knows no such kind), and the
state machine hands the names to its ledger sink. Real nodes: tests/node/test_principals.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_ledger_rows import Recorder

from tickwheel.common.errors import InvariantViolation
from tickwheel.common.versions import BASELINE, CURRENT, PRINCIPAL_VERSION
from tickwheel.replication import commands
from tickwheel.replication.commands import Kind
from tickwheel.replication.group_commit import GroupCommitter
from tickwheel.replication.requests import Requests
from tickwheel.replication.state import StateConfig, StateMachine
from tickwheel.wheel import NewMessage

T0_MS = 1_800_000_000_000


def parts(*ids: str) -> list[bytes]:
    return [commands.encoded_message(NewMessage(i, "orders", b"x", T0_MS)) for i in ids]


class Proposed:
    """A stand-in for `Proposals`: what the leader would propose, in order."""

    def __init__(self) -> None:
        self.commands: list[bytes] = []

    def propose(self, command: bytes, target: Any) -> None:
        self.commands.append(command)

    def kinds(self) -> list[Kind]:
        return [commands.read_header(command)[0] for command in self.commands]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def state(tmp_path: Path, recorder: Recorder) -> Iterator[StateMachine]:
    opened = StateMachine.open(tmp_path, StateConfig(), fresh=True, ledger=recorder)
    yield opened
    opened.close()


def test_an_entry_names_each_principal_once_and_each_message_reads_its_own() -> None:
    committer = GroupCommitter(1 << 20, 1_000, lambda: None, principals=True)
    committer.submit(parts("a", "b"), principal="orders-service")
    committer.submit(parts("c"), principal="orders-service")
    committer.submit(parts("d", "e"), principal="audit")
    committer.submit(parts("f"))
    (entry,) = committer.drain()
    runs = entry.runs()
    assert runs == [("orders-service", 2), ("orders-service", 1), ("audit", 2), ("", 1)]
    plain = commands.schedule(T0_MS, entry.parts)
    named = commands.schedule(T0_MS, entry.parts, runs)
    assert commands.read_header(named)[0] is Kind.SCHEDULE_BY
    assert commands.read_schedule(named)[:3] == commands.read_schedule(plain)[:3]
    assert commands.read_schedule(named)[3] == ["orders-service"] * 3 + ["audit"] * 2 + [""]
    assert commands.read_schedule(plain)[3] == [""] * 6
    # names once (2 + 14, 2 + 5, 2 + 0 bytes, and a u16 count), 3 runs of 6 bytes (the two
    # of orders-service joined, and a u32 count): the entry does not grow per message
    assert len(named) - len(plain) == 2 + 16 + 7 + 2 + 4 + 3 * 6


def test_entries_with_principals_stay_within_max_entry_bytes() -> None:
    size = len(parts("m0")[0])
    committer = GroupCommitter(commands.SCHEDULE_OVERHEAD_BYTES + 6 + 3 * size + 40, 1_000,
                               lambda: None, principals=True)
    for index in range(12):
        committer.submit(parts(f"m{index:02d}"), principal=f"principal-number-{index % 3}")
    entries = committer.drain()
    assert len(entries) > 4
    for entry in entries:
        command = commands.schedule(T0_MS, entry.parts, entry.runs())
        assert len(command) <= committer._max_entry_bytes


def test_the_leader_writes_who_asked_only_once_the_cluster_version_has_it(
        state: StateMachine) -> None:
    requests = Requests(1 << 20, 1_000, lambda: None, lambda: None)

    def queue(principal: str) -> None:
        requests.schedules.submit(parts(f"s-{principal}"), principal=principal)
        requests.handle_op(lambda stamp_ms, by: commands.cancel(
            stamp_ms, [1], principal if by else None), None)
        requests.handle_op(lambda stamp_ms, by: commands.move(
            stamp_ms, [(1, T0_MS)], principal if by else None), None)

    def proposed() -> Proposed:
        found = Proposed()
        requests.propose(T0_MS, found, None, state)  # type: ignore[arg-type]
        return found
    assert state.cluster_version == BASELINE < PRINCIPAL_VERSION <= CURRENT
    queue("alice")
    assert proposed().kinds() == [Kind.SCHEDULE, Kind.CANCEL, Kind.MOVE]  # as 0.0.4 reads
    state.apply(commands.finalize(T0_MS, CURRENT))
    queue("alice")
    named = proposed()
    assert named.kinds() == [Kind.SCHEDULE_BY, Kind.CANCEL_BY, Kind.MOVE_BY]
    assert commands.read_schedule(named.commands[0])[3] == ["alice"]
    assert commands.read_cancel(named.commands[1]) == ([1], "alice")
    assert commands.read_move(named.commands[2]) == ([(1, T0_MS)], "alice")
    queue("")  # nobody named (a node without authentication): nothing to carry
    assert proposed().kinds() == [Kind.SCHEDULE, Kind.CANCEL, Kind.MOVE]


def test_every_row_names_who_asked_and_a_plain_entry_nobody(
        state: StateMachine, recorder: Recorder) -> None:
    first = commands.schedule(T0_MS, parts("a", "b", "c"), [("alice", 2), ("bob", 1)])
    a, b, c = (r.handle for r in state.apply(first))
    # a repeated id and one repeated within the entry: the message-by-message path
    mixed = commands.schedule(T0_MS + 1, parts("a", "d", "d", "e"), [("bob", 1), ("carol", 3)])
    _, d, _, e = (r.handle for r in state.apply(mixed))
    (f,) = (r.handle for r in state.apply(commands.schedule(T0_MS + 2, parts("f"))))
    state.apply(commands.cancel(T0_MS + 3, [b, a], "carol"))
    state.apply(commands.move(T0_MS + 4, [(c, T0_MS + 60_000)], "dave"))
    state.apply(commands.cancel(T0_MS + 5, [d]))
    rows = [(row["event"], row["handle"], row["principal"]) for row in recorder.flat()]
    assert rows == [
        ("scheduled", a, "alice"), ("scheduled", b, "alice"), ("scheduled", c, "bob"),
        ("scheduled", d, "carol"), ("scheduled", e, "carol"), ("scheduled", f, ""),
        ("cancelled", b, "carol"), ("cancelled", a, "carol"), ("rescheduled", c, "dave"),
        ("cancelled", d, "")]


def test_a_section_whose_runs_do_not_cover_its_messages_stops_the_replica(
        state: StateMachine) -> None:
    short = commands.schedule(T0_MS, parts("a", "b"), [("alice", 1)])
    with pytest.raises(InvariantViolation, match="runs do not cover"):
        state.apply(short)
