"""A snapshot's files gathered beside the state and switched to (`replication/staging.py`,
`Snapshots.prefetch`), without processes: the generation holds exactly what the snapshot
names, the live state is untouched until the switch, what a stop leaves is put right, and an
install whose fetch failed stops the node (exit 70)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tickwheel.common.clock import SystemClock
from tickwheel.common.exits import EXIT_FATAL
from tickwheel.replication import commands
from tickwheel.replication.raft import RaftConfig, write_snapshot
from tickwheel.replication.snapshots import PeerFiles, Snapshots
from tickwheel.replication.staging import stage, switch, tidy
from tickwheel.replication.state import StateConfig, StateMachine
from tickwheel.replication.state_files import manifest_parts
from tickwheel.wheel import NewMessage

T0_MS = 1_800_000_000_000


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_a_generation_holds_exactly_the_named_files_and_the_state_is_untouched(
        tmp_path: Path) -> None:
    root = tmp_path / "state"
    for name, data in {"wheel/hours/00000001/log": b"whole", "wheel/hours/00000001/heads": b"h",
                       "wheel/hours/00000002/log": b"par", "wheel/hours/00000003/log": b"gone",
                       "dedupe/000000000001": b"longer!"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    before = files_under(root)
    peer = {"wheel/hours/00000001/log": b"whole", "wheel/hours/00000002/log": b"partial",
            "wheel/hours/00000004/log": b"new", "dedupe/000000000001": b"longer!"}
    named = {"wheel/hours/00000001/log": 5, "wheel/hours/00000002/log": 7,
             "wheel/hours/00000004/log": 3, "dedupe/000000000001": 6}
    asked: list[tuple[str, int, int]] = []

    def fetch(path: str, offset: int, size: int) -> bytes:
        asked.append((path, offset, size))
        return peer[path][offset:offset + size]
    folder, fetched = stage(root, named, fetch)
    assert folder == tmp_path / "state.1" and fetched == 4 + 3
    assert sorted(asked) == [("wheel/hours/00000002/log", 3, 4), ("wheel/hours/00000004/log", 0, 3)]
    assert files_under(folder) == {"wheel/hours/00000001/log": b"whole",
                                   "wheel/hours/00000001/heads": b"h",
                                   "wheel/hours/00000002/log": b"partial",
                                   "wheel/hours/00000004/log": b"new",
                                   "dedupe/000000000001": b"longer"}
    assert os.stat(folder / "wheel/hours/00000001/log").st_ino == os.stat(
        root / "wheel/hours/00000001/log").st_ino  # held whole: linked, not copied
    assert files_under(root) == before
    assert switch(root, folder) == tmp_path / "state.old"  # a plain folder, moved aside
    assert root.is_symlink() and files_under(root) == files_under(folder)
    tidy(root)  # what a restart does first: the folder moved aside goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state", "state.1"]
    second, _ = stage(root, named, fetch)
    assert second.name == "state.2" and switch(root, second) == folder


def test_a_stop_midway_leaves_a_state_that_tidy_puts_right(tmp_path: Path) -> None:
    root = tmp_path / "state"
    (root / "wheel").mkdir(parents=True)
    (tmp_path / "state.1" / "wheel").mkdir(parents=True)  # a generation half gathered
    tidy(root)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"] and not root.is_symlink()
    os.rename(root, tmp_path / "state.old")  # stopped between the first switch's renames
    (tmp_path / "state.1").mkdir()
    tidy(root)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"] and (root / "wheel").is_dir()


def test_an_install_whose_files_could_not_be_fetched_stops_the_node(tmp_path: Path) -> None:
    source = StateMachine.open(tmp_path / "source" / "state", StateConfig(), fresh=True)
    source.apply(commands.schedule(T0_MS, [commands.encoded_message(
        NewMessage("m", "t", b"x" * 200, T0_MS + 4_000_000))]))
    snapshot = tmp_path / "snapshot.1.tmp"
    write_snapshot(str(snapshot), manifest_parts(source.manifest()), (), fsync=False)
    data = tmp_path / "follower"
    state = StateMachine.open(data / "state", StateConfig(), fresh=True)

    def unfound(*_: object) -> bytes:
        raise RuntimeError("no peer has it")  # as the node's ShortRead, once out of retries
    died: list[int] = []

    def die(_: str, reason: str, code: int) -> None:
        died.append(code)
        raise SystemExit(code)
    snapshots = Snapshots("a", data, state, PeerFiles(["b"], unfound, lambda: "b", lambda: False),
                          RaftConfig(), SystemClock(), die)
    done = threading.Event()
    snapshots.prefetch(str(snapshot), done.set)
    assert done.wait(10) and snapshots.prefetched()
    assert not (data / "state").is_symlink()  # nothing switched
    with pytest.raises(SystemExit):
        snapshots.install(str(snapshot))
    assert died == [EXIT_FATAL] == [70]
    source.close()
