"""The snapshot file's check: every flipped byte is found, snapshots of the previous build
(no check) still read, and the previous build reads this build's (the check comes after the
pickle, where an unpickler stops). With ``--fsync``, a snapshot received from the leader is
whole after a power cut."""

from __future__ import annotations

import pickle
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest
from pysyncobj.config import SERIALIZER_STATE

from tickwheel.chaos.storage import power_cut
from tickwheel.replication.raft import SnapshotDamaged, read_snapshot, write_snapshot
from tickwheel.replication.raft.durability import SyncLedger
from tickwheel.replication.raft.snapshot import (
    SNAPSHOT_CHECK,
    STATE_FORMAT_VERSION,
    DurableSerializer,
    ReceivingSerializer,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "upgrade"
MANIFEST = ((1_764_000_000, 3), 1_764_000_000_123, {"wheel/hours/00490000/log": 4_096},
            ({"orders": 7}, 0), (1, [], {}), {}, b"k" * 32, {})
RAFT_TAIL = (("noop", 12, 3),)


def test_a_snapshot_reads_back(tmp_path: Path) -> None:
    path = str(tmp_path / "snapshot")
    write_snapshot(path, MANIFEST, RAFT_TAIL, fsync=True)
    assert read_snapshot(path) == (MANIFEST, RAFT_TAIL)


def test_every_flipped_byte_is_found(tmp_path: Path) -> None:
    """A bit of every byte (each bit position in turn), and every bit of the check."""
    path = tmp_path / "snapshot"
    write_snapshot(str(path), MANIFEST, RAFT_TAIL, fsync=False)
    good = path.read_bytes()
    check_from = len(good) - SNAPSHOT_CHECK.size
    for at in range(len(good)):
        for bit in range(8) if at >= check_from else [at % 8]:
            damaged = bytearray(good)
            damaged[at] ^= 1 << bit
            path.write_bytes(bytes(damaged))
            with pytest.raises(SnapshotDamaged):
                read_snapshot(str(path))
    path.write_bytes(good[:-3])  # torn
    with pytest.raises(SnapshotDamaged):
        read_snapshot(str(path))


def test_a_snapshot_of_the_previous_build_without_a_check_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    with open(path, "wb") as file:
        pickle.dump((MANIFEST, RAFT_TAIL), file, protocol=pickle.HIGHEST_PROTOCOL)
    assert read_snapshot(str(path)) == (MANIFEST, RAFT_TAIL)


@pytest.mark.cluster
def test_the_previous_build_reads_this_builds_snapshot(tmp_path: Path) -> None:
    """A rolling upgrade: a new leader sends its snapshot to a follower not yet upgraded."""
    previous = tmp_path / "previous"
    with zipfile.ZipFile(FIXTURE / "tickwheel-0.0.4-c5effa3.whl") as wheel:
        wheel.extractall(previous)
    path = tmp_path / "snapshot"
    write_snapshot(str(path), MANIFEST, RAFT_TAIL, fsync=False)
    reader = subprocess.run(
        [sys.executable, "-c", "import sys; from tickwheel.replication.raft import "
         "read_snapshot; print(repr(read_snapshot(sys.argv[1])))", str(path)],
        env={"PYTHONPATH": str(previous)}, capture_output=True, text=True, timeout=60,
        check=False)
    assert reader.returncode == 0, reader.stderr[-2_000:]
    assert reader.stdout.strip() == repr((MANIFEST, RAFT_TAIL))


def test_a_snapshot_of_a_newer_state_format_is_refused_not_misread(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    data = pickle.dumps((MANIFEST, RAFT_TAIL), protocol=pickle.HIGHEST_PROTOCOL)
    head = SNAPSHOT_CHECK.pack(b"TWCK", STATE_FORMAT_VERSION + 1, 0)[:-4]
    path.write_bytes(data + head + zlib.crc32(head, zlib.crc32(data)).to_bytes(4, "little"))
    with pytest.raises(SnapshotDamaged, match="newer release"):
        read_snapshot(str(path))


@pytest.mark.parametrize("chunks", [1, 3])
def test_a_snapshot_received_from_the_leader_survives_a_power_cut_right_after(
        tmp_path: Path, chunks: int) -> None:
    """pysyncobj renamed a received snapshot over this node's own without syncing it: the
    power cut left an empty file where a good snapshot had been (run against its
    ``Serializer``, this test finds the snapshot empty)."""
    (tmp_path / "data" / "raft").mkdir(parents=True)
    path = tmp_path / "data" / "raft" / "snapshot"
    ledger = SyncLedger(tmp_path / "synced")
    write_snapshot(str(path), ("old",), RAFT_TAIL, fsync=True, ledger=ledger)
    sent = tmp_path / "sent"
    write_snapshot(str(sent), MANIFEST, RAFT_TAIL, fsync=False)
    data = sent.read_bytes()
    receiver = DurableSerializer(str(path), 1 << 20, False, None, None, None, ledger=ledger)
    size = -(-len(data) // chunks)
    parts = [data[at:at + size] for at in range(0, len(data), size)]
    done = [receiver.setTransmissionData((part, at == 0, at == len(parts) - 1))
            for at, part in enumerate(parts)]
    assert done == [False] * (len(parts) - 1) + [True]
    power_cut(tmp_path / "data", ledger)
    assert read_snapshot(str(path)) == (MANIFEST, RAFT_TAIL)


@pytest.mark.parametrize("durable", [False, True], ids=["plain", "fsync"])
def test_a_snapshot_received_voids_the_one_this_node_took_before_its_journal_cut(
        tmp_path: Path, durable: bool) -> None:
    """pysyncobj cuts the journal to this node's own snapshot at the tick after taking it; a
    snapshot received in between had replaced the journal with its older entries, and the cut
    emptied it: the node died on its next look at the log (chaos run of stop 33). Run against
    pysyncobj's ``Serializer``, ``checkSerializing`` still answers SUCCESS with the stale
    index, and pysyncobj cuts."""
    path = tmp_path / "snapshot"
    sent = tmp_path / "sent"
    write_snapshot(str(sent), MANIFEST, RAFT_TAIL, fsync=False)

    def own(tmp: str, raft_tail: tuple) -> None:
        write_snapshot(tmp, MANIFEST, raft_tail, fsync=False)

    args = (str(path), 1 << 20, False, own, read_snapshot, None)
    serializer = (DurableSerializer(*args, ledger=SyncLedger(tmp_path / "synced")) if durable
                  else ReceivingSerializer(*args))
    serializer.serialize((None, ("noop", 150_756, 9), ("noop", 150_755, 9), ()), 150_755)
    assert path.exists()  # this node's own snapshot is written; the cut waits for the next tick
    assert serializer.setTransmissionData((sent.read_bytes(), True, True))
    assert serializer.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)
    assert read_snapshot(str(path)) == (MANIFEST, RAFT_TAIL)  # the received one is in place
    serializer.serialize((None, ("noop", 12, 3), ("noop", 11, 3), ()), 11)  # and later ones cut
    assert serializer.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 11)


@pytest.mark.parametrize("durable", [False, True], ids=["plain", "fsync"])
def test_a_snapshot_no_newer_than_what_the_follower_applied_is_refused(
        tmp_path: Path, durable: bool) -> None:
    """pysyncobj installed any snapshot its leader sent: one older than what the follower had
    applied took it back there and dropped entries it had acknowledged. It is refused: this
    node's own snapshot stays, nothing is staged, `refused` says so; a newer one is put in
    place."""
    path = tmp_path / "snapshot"
    write_snapshot(str(path), ("own",), (("noop", 200, 3),), fsync=False)
    applied = 200

    def received(index: int) -> bytes:
        sent = tmp_path / "sent"
        write_snapshot(str(sent), MANIFEST, (("noop", index, 3), ("noop", index - 1, 3)),
                       fsync=False)
        return sent.read_bytes()

    args = (str(path), 1 << 20, False, None, read_snapshot, None)
    serializer = (DurableSerializer(*args, applied=lambda: applied,
                                    ledger=SyncLedger(tmp_path / "synced"))
                  if durable else ReceivingSerializer(*args, applied=lambda: applied))
    for index in (150, 200):
        data = received(index)
        chunks = [(data[:20], True, False), (data[20:], False, False), (b"", False, True)]
        assert [serializer.setTransmissionData(chunk) for chunk in chunks] == [False] * 3
        assert serializer.refused
        serializer.refused = False
        assert read_snapshot(str(path))[0] == ("own",)
        assert not path.with_name("snapshot.1.tmp").exists()
    data = received(201)
    assert serializer.setTransmissionData((data, True, True))
    assert not serializer.refused
    assert read_snapshot(str(path))[1][0] == ("noop", 201, 3)
