"""What the state machine tells its ledger sink, command by command: a row for each change a
command made, none for what changed nothing (a remembered id, a stale receipt, a cancel of a
leased message), in the order applied; a cancel of a message some group leased withdraws it
from the others, a row of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tickwheel.replication import LedgerRows, commands, record_columns
from tickwheel.replication.commands import Grant, LeaseOp, LeaseRef, Ready
from tickwheel.replication.group import STREAM
from tickwheel.replication.state import StateConfig, StateMachine
from tickwheel.wheel import NewMessage

T0_MS = 1_800_000_000_000


class Recorder:
    def __init__(self) -> None:
        self.rows: list[LedgerRows] = []

    def add(self, rows: LedgerRows) -> None:
        self.rows.append(rows)

    def flat(self) -> list[dict[str, Any]]:
        """Every row as a dict, records read as the ledger's thread reads them."""
        out = []
        for batch in self.rows:
            columns = dict(batch.columns)
            if batch.records is not None:
                columns["id"], columns["topic"], columns["attempt"] = record_columns(
                    batch.records)
            out += [{"event": batch.event, "time_ms": batch.time_ms,
                     **{name: values[i] for name, values in columns.items()}}
                    for i in range(batch.size)]
        return out


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def state(tmp_path: Path, recorder: Recorder) -> Iterator[StateMachine]:
    opened = StateMachine.open(tmp_path, StateConfig(), fresh=True, ledger=recorder)
    yield opened
    opened.close()


def schedule(state: StateMachine, ids: str, at_ms: int = T0_MS) -> list[int]:
    parts = [commands.encoded_message(NewMessage(i, "orders", b"x", T0_MS)) for i in ids]
    return [r.handle for r in state.apply(commands.schedule(at_ms, parts))]


def handout(state: StateMachine, handles: list[int], nonce: int = 7) -> list[int]:
    items = []
    for handle in handles:
        message, _ = state.wheel.handles.read(handle)
        items.append(Ready(handle, message.slot_second, message.local_index, "orders", None))
    grants = [Grant(h, "orders", "", nonce, T0_MS + 30_000, STREAM) for h in handles]
    return state.apply(commands.handout(T0_MS + 1, items, grants))


def test_each_change_is_a_row_and_what_changed_nothing_is_none(
        state: StateMachine, recorder: Recorder) -> None:
    a, b, c, d = schedule(state, "abcd")
    schedule(state, "a")  # remembered: no row
    assert handout(state, [a, b]) == [1, 1]
    group_id = state.groups.get("orders", "").id
    lease_a, lease_b = LeaseRef(group_id, a, 1, 7), LeaseRef(group_id, b, 1, 7)
    state.apply(commands.leases(T0_MS + 2, LeaseOp.ACK, [lease_a, LeaseRef(group_id, b, 1, 9)]))
    state.apply(commands.leases(T0_MS + 3, LeaseOp.RELEASE, [lease_b]))
    assert handout(state, [b], nonce=8) == [2]
    copy = NewMessage("b", "%DLQ%orders", b"x", T0_MS + 60_000, attempt=2)
    state.apply(commands.retry(T0_MS + 4, [commands.encoded_leased_retry(
        LeaseRef(group_id, b, 2, 8), copy)]))
    state.apply(commands.cancel(T0_MS + 5, [c, a]))  # a was acked: not pending, no row
    state.apply(commands.move(T0_MS + 6, [(d, T0_MS + 90_000)]))
    rows = recorder.flat()
    assert [(row["event"], row.get("id"), row["handle"]) for row in rows] == [
        ("scheduled", "a", a), ("scheduled", "b", b), ("scheduled", "c", c),
        ("scheduled", "d", d), ("leased", None, a), ("leased", None, b), ("acked", None, a),
        ("released", None, b), ("leased", None, b), ("nacked", "b", b),
        ("cancelled", "c", c), ("rescheduled", "d", d)]
    leased = [row for row in rows if row["event"] == "leased"]
    assert [(row["lease"], row["possible_duplicate"], row["group"]) for row in leased] == [
        (1, False, ""), (1, False, ""), (2, True, "")]
    nacked = rows[9]
    assert (nacked["topic"], nacked["attempt"], nacked["lease"], nacked["group"]) == (
        "%DLQ%orders", 2, 2, "")
    assert nacked["new_handle"] not in (None, b)
    moved = rows[11]
    assert (moved["old_deliver_at_ms"], moved["deliver_at_ms"]) == (T0_MS, T0_MS + 90_000)
    assert [row["time_ms"] for row in rows[6:]] == [
        T0_MS + 2, T0_MS + 3, T0_MS + 1, T0_MS + 4, T0_MS + 5, T0_MS + 6]


def test_a_state_machine_without_a_sink_tells_no_one(tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    try:
        (a,) = schedule(state, "a")
        assert handout(state, [a]) == [1]
    finally:
        state.close()


def test_a_cancel_after_a_lease_is_a_withdrawn_row(
        state: StateMachine, recorder: Recorder) -> None:
    """The cancel answers HANDED_OUT and changes something: groups that had not leased the
    message never will. Without a row, the audit owed it to them (overdue, never sent)."""
    a, b = schedule(state, "ab")
    assert handout(state, [a]) == [1]
    state.apply(commands.cancel(T0_MS + 5, [a, b]))
    rows = [row for row in recorder.flat() if row["event"] in ("cancelled", "withdrawn")]
    assert [(row["event"], row["id"], row["handle"], row["time_ms"]) for row in rows] == [
        ("cancelled", "b", b, T0_MS + 5), ("withdrawn", "a", a, T0_MS + 5)]
