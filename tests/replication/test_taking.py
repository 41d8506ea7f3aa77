"""A snapshot taken over several Raft steps (`replication/taking.py`), without processes: it
names the state as captured, the Raft thread's part of each step is bounded, it is put in
place only once every byte it names is written (with ``fsync``: synced), the previous
snapshot stays until then, a snapshot received from the leader voids it, and pysyncobj is
told it succeeded only once it is in place (docs/replication.md, "Snapshots")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SERIALIZER_STATE

from tickwheel.replication import commands, taking
from tickwheel.replication.raft import SyncLedger, read_snapshot, write_snapshot
from tickwheel.replication.raft.snapshot import DurableSerializer, ReceivingSerializer
from tickwheel.replication.state import StateConfig, StateMachine
from tickwheel.replication.state_files import manifest_of
from tickwheel.replication.taking import Takes
from tickwheel.wheel import NewMessage

T0_MS = 1_800_000_000_000
HOUR_MS = 3_600_000
RAFT_TAIL = (("noop", 40, 2), ("noop", 39, 2), ())


def schedule(state: StateMachine, prefix: str, hours: int) -> None:
    """Four messages an hour for ``hours`` hours, in commands of 50."""
    messages = [NewMessage(f"{prefix}-{i}", "orders", b"x" * 100, T0_MS + HOUR_MS + i * 900_000)
                for i in range(4 * hours)]
    for start in range(0, len(messages), 50):
        state.apply(commands.schedule(T0_MS, [commands.encoded_message(m)
                                              for m in messages[start:start + 50]]))


def sizes(root: Path, files: dict[str, int]) -> dict[str, int]:
    return {name: (root / name).stat().st_size for name in files}


def test_a_take_names_its_capture_and_goes_in_place_once_every_byte_is_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, path = tmp_path / "state", tmp_path / "raft" / "snapshot"
    path.parent.mkdir()
    state = StateMachine.open(root, StateConfig(), fresh=True)
    ledger = SyncLedger(tmp_path / "synced")
    takes = Takes(state, root, fsync=True, sync_ledger=ledger)
    schedule(state, "first", 50)
    takes.take(str(path), RAFT_TAIL)  # the previous snapshot, in one call
    previous = path.read_bytes()
    schedule(state, "second", 200)  # 200 hours with appends buffered, none written
    monkeypatch.setattr(taking, "FLUSH_SLICE_S", 0.0)  # an hour a step
    takes.begin(str(path), RAFT_TAIL)
    captured = takes._take.manifest if takes._take else None
    assert captured is not None and len(state.wheel.unflushed_hours()) == 200
    steps = 0
    while (done := takes.advance()) is None:
        steps += 1
        assert path.read_bytes() == previous  # the previous snapshot until the rename
        if steps % 50 == 0:
            schedule(state, f"meanwhile-{steps}", 1)
    assert done and steps >= 199  # the flush went an hour a step
    named = manifest_of(read_snapshot(str(path))[0])
    assert named == captured and len(named.files) > 400
    assert named.files != sizes(root, named.files)  # some grew after the capture: a prefix
    synced = ledger.read()
    for name, size in named.files.items():  # every byte it names on disk before it was
        assert (root / name).stat().st_size >= size
        assert synced[os.stat(root / name).st_ino] >= size, name
    assert not Path(f"{path}{taking.TAKING_SUFFIX}").exists()


def test_a_received_snapshot_voids_the_take_and_its_rename(tmp_path: Path) -> None:
    root, path = tmp_path / "state", tmp_path / "snapshot"
    state = StateMachine.open(root, StateConfig(), fresh=True)
    takes = Takes(state, root, fsync=False, sync_ledger=None)
    schedule(state, "m", 20)
    sent = tmp_path / "sent"
    write_snapshot(str(sent), ("the leader's",), (("noop", 90, 3), ("noop", 89, 3), ()), False)
    serializer = ReceivingSerializer(str(path), 1 << 20, False, None, read_snapshot, None,
                                     taking=takes)
    serializer.serialize((None, *RAFT_TAIL), 39)
    assert serializer.checkSerializing() == (SERIALIZER_STATE.SERIALIZING, 39)
    assert serializer.setTransmissionData((sent.read_bytes(), True, True))  # put in place
    assert serializer.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
    if takes._thread is not None:
        takes._thread.join(10)
    assert read_snapshot(str(path))[0] == ("the leader's",)  # not replaced by the voided take
    serializer.serialize((None, ("noop", 95, 3), ("noop", 94, 3), ()), 94)  # the next one
    while (answer := serializer.checkSerializing())[0] == SERIALIZER_STATE.SERIALIZING:
        pass
    assert answer == (SERIALIZER_STATE.SUCCESS, 94)
    assert read_snapshot(str(path))[1][0] == ("noop", 95, 3)


@pytest.mark.parametrize("serializer_class", [ReceivingSerializer, DurableSerializer])
def test_pysyncobj_hears_of_a_take_only_when_it_is_in_place(
        tmp_path: Path, serializer_class: type[ReceivingSerializer]) -> None:
    path = tmp_path / "snapshot"
    calls: list[str] = []

    class Steps:
        """Three steps, then in place (or failed)."""

        def __init__(self, outcome: bool) -> None:
            self.outcome, self.left = outcome, 3

        def begin(self, at: str, raft_tail: tuple[Any, ...]) -> None:
            calls.append(f"begin {Path(at).name} {raft_tail[0][1]}")

        def advance(self) -> bool | None:
            self.left -= 1
            return None if self.left else self.outcome

        def void(self) -> None:
            calls.append("void")
    for outcome, answer in ((True, SERIALIZER_STATE.SUCCESS), (False, SERIALIZER_STATE.FAILED)):
        serializer = serializer_class(str(path), 1 << 20, False, None, read_snapshot, None,
                                      taking=Steps(outcome))
        serializer.serialize((None, ("noop", 7, 1), ("noop", 6, 1), ()), 6)
        serializer.serialize((None, ("noop", 8, 1), ("noop", 7, 1), ()), 7)  # one at a time
        assert [serializer.checkSerializing() for _ in range(4)] == [
            (SERIALIZER_STATE.SERIALIZING, 6), (SERIALIZER_STATE.SERIALIZING, 6), (answer, 6),
            (SERIALIZER_STATE.NOT_SERIALIZING, None)]
    assert calls == ["begin snapshot 7"] * 2


def test_a_take_that_cannot_write_fails_and_leaves_the_previous_snapshot(
        tmp_path: Path) -> None:
    root = tmp_path / "state"
    state = StateMachine.open(root, StateConfig(), fresh=True)
    takes = Takes(state, root, fsync=False, sync_ledger=None)
    schedule(state, "m", 5)
    takes.begin(str(tmp_path / "missing" / "snapshot"), RAFT_TAIL)
    while (done := takes.advance()) is None:
        pass
    assert done is False and takes.advance() is False  # and nothing is under way
    assert state.wheel.passed_hours() == [] and (root / "wheel" / "hours").exists()
