"""The storage faults on a real data folder (the upgrade fixture's): what they damage is what
they say, and inside what the snapshot lists."""

from __future__ import annotations

import random
import tarfile
from pathlib import Path

import pytest

from tickwheel.chaos import storage
from tickwheel.replication.raft import SnapshotDamaged, read_snapshot, write_snapshot

FIXTURE = Path(__file__).parent.parent / "fixtures" / "upgrade" / "data.tar.gz"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE) as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path / "node0"


def differing(before: bytes, after: bytes) -> list[int]:
    return [at for at, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]


def test_rot_flips_records_and_a_unit_inside_what_the_snapshot_lists(data: Path) -> None:
    (_, _, files, *_), _ = read_snapshot(str(data / "raft" / "snapshot"))
    hours = data / "state" / "wheel" / "hours"
    before = {path: path.read_bytes() for path in hours.rglob("*") if path.is_file()}
    detail = storage.rot(data, random.Random(3))
    changed = {path: differing(content, path.read_bytes())
               for path, content in before.items() if path.read_bytes() != content}
    by_name = {path.name: flips for path, flips in changed.items()}
    assert set(by_name) == {"log", "index"}, detail
    assert len(by_name["index"]) == 1 and 1 <= len(by_name["log"]) <= 3
    for path, flips in changed.items():
        listed = files[str(path.relative_to(data / "state"))]
        assert max(flips) < listed, (path, flips, listed)


def test_cut_shortens_an_hour_and_rot_snapshot_makes_it_fail_its_check(data: Path) -> None:
    sizes = {path: path.stat().st_size for path in data.rglob("*") if path.is_file()}
    assert "cut hour" in storage.cut(data, random.Random(5))
    shorter = [path.name for path, size in sizes.items() if path.stat().st_size < size]
    assert sorted(shorter) == ["index", "log"]
    snapshot = str(data / "raft" / "snapshot")  # the previous build's has no check: rewrite
    write_snapshot(snapshot, *read_snapshot(snapshot), fsync=False)
    storage.rot_snapshot(data, random.Random(5))
    with pytest.raises(SnapshotDamaged):
        read_snapshot(str(data / "raft" / "snapshot"))
