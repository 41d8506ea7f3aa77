"""The snapshot file's check: every flipped byte is found, snapshots of the previous build
(no check) still read, and the previous build reads this build's (the check comes after the
pickle, where an unpickler stops)."""

from __future__ import annotations

import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tickwheel.replication.raft import SnapshotDamaged, read_snapshot, write_snapshot

FIXTURE = Path(__file__).parent.parent / "fixtures" / "upgrade"
MANIFEST = ((1_764_000_000, 3), 1_764_000_000_123, {"wheel/hours/00490000/log": 4_096},
            ({"orders": 7}, 0), (1, [], {}), {}, b"k" * 32, {})
RAFT_TAIL = (("noop", 12, 3),)


def test_a_snapshot_reads_back(tmp_path: Path) -> None:
    path = str(tmp_path / "snapshot")
    write_snapshot(path, MANIFEST, RAFT_TAIL, fsync=True)
    assert read_snapshot(path) == (MANIFEST, RAFT_TAIL)


def test_every_flipped_byte_is_found(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    write_snapshot(str(path), MANIFEST, RAFT_TAIL, fsync=False)
    good = path.read_bytes()
    for at in range(len(good)):
        damaged = bytearray(good)
        damaged[at] ^= 0x04
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


def test_the_previous_build_reads_this_builds_snapshot(tmp_path: Path) -> None:
    """A rolling upgrade: a new leader sends its snapshot to a follower not yet upgraded."""
    previous = tmp_path / "previous"
    with zipfile.ZipFile(FIXTURE / "tickwheel-a782c5f.whl") as wheel:
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
