"""`Wheel.lengths`: what a snapshot names, read from memory, is what the files hold once
written: before a flush, across cancels, hours closed for room, reopening; and it reads no
file to say so (a snapshot is captured on the Raft thread, docs/replication.md)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tickwheel.wheel import NewMessage, Wheel, WheelConfig

HOUR_MS = 3_600_000
NOW_MS = 1_000 * HOUR_MS


def on_disk(root: Path) -> dict[str, int]:
    """The wheel's append-only files that are not empty, by path under ``hours``."""
    hours = root / "hours"
    return {str(p.relative_to(root)): size for p in sorted(hours.rglob("*"))
            if p.is_file() and p.name != "heads" and (size := p.stat().st_size)}


def test_lengths_read_from_memory_are_the_files_once_flushed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    config = WheelConfig(max_open_hours=4)  # most hours are closed for room as it goes
    handles: list[int] = []
    for round_ in range(3):
        with Wheel.open(tmp_path, config) as wheel:
            assert wheel.lengths() == on_disk(tmp_path)  # as opened: closed hours, read once
            for step in range(40):
                messages = [NewMessage(f"m-{round_}-{step}-{i}", "orders",
                                       b"x" * rng.randrange(1, 300),
                                       NOW_MS + rng.randrange(1, 48) * HOUR_MS + i)
                            for i in range(rng.randrange(1, 20))]
                handles += wheel.schedule(messages, NOW_MS)
                for handle in rng.sample(handles, 3):
                    wheel.cancel(handle)
                with monkeypatch.context() as reads:  # not a stat, not an open
                    reads.setattr(os, "stat", _refused)
                    reads.setattr(os, "open", _refused)
                    named = wheel.lengths()
                wheel.flush()
                assert named == on_disk(tmp_path), step
            assert len(named) > 3 * 40  # the test covers many hours, most closed


def _refused(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"a file read while listing: {args}")
