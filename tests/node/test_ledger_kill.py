"""A ledger whose process is SIGKILLed: what it had not closed into a segment (rows still
buffered, rows in its open segment) is recorded at the next start as a ``torn_segment`` gap
whose times cover every row lost, from the newest closed segment's last row to the restart;
a second kill before any segment closes does not lose that record; a ledger closed cleanly
records nothing. The writer runs in a child process (the real thread, the real clock), killed
with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tickwheel.node.ledger import read_manifest, read_table, segments
from tickwheel.node.ledger.metrics import LedgerMetrics
from tickwheel.node.ledger.schema import Gap
from tickwheel.node.ledger.writer import RUNNING, Ledger, LedgerConfig

pytestmark = pytest.mark.cluster  # it starts a process (a few seconds in all)
NODE = "127.0.0.1:7500"

CHILD = """
import json, sys, time
from pathlib import Path
from tickwheel.node.ledger.writer import Ledger, LedgerConfig
from tickwheel.replication import LedgerRows

def rows(first, count):
    return LedgerRows("sent", int(time.time() * 1000), {
        "handle": list(range(first, first + count)),
        "id": [f"m{i}" for i in range(first, first + count)]})

folder, flush_ms, opened = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "open"
clock = lambda: int(time.time() * 1000)
ledger = Ledger(folder, "127.0.0.1:7500", LedgerConfig(flush_ms=flush_ms,
                max_segment_age_ms=600_000), clock)
ledger.start()
ledger.add(rows(0, 10))
ledger.rotate()
lost_from_ms = clock()
ledger.add(rows(10, 10))
if opened:  # wait until the writer has written them into the open segment
    while not any(path.name.endswith(".open") for path in folder.iterdir()):
        time.sleep(0.005)
print(json.dumps({"lost_from_ms": lost_from_ms, "lost_to_ms": clock()}), flush=True)
time.sleep(600)
"""


def killed_child(folder: Path, opened: bool) -> dict[str, int]:
    """Run `CHILD` until it has rows it has not closed, SIGKILL it; returns the times of
    the rows it lost."""
    flush_ms = 20 if opened else 600_000
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(flush_ms),
                              "open" if opened else "buffered"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        lost = json.loads(child.stdout.readline())
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    return dict(lost)


def reopened(folder: Path) -> tuple[Ledger, int]:
    restarted_ms = int(time.time() * 1000)
    ledger = Ledger(folder, NODE, LedgerConfig(), lambda: int(time.time() * 1000),
                    LedgerMetrics())
    return ledger, restarted_ms


def the_gap(folder: Path) -> tuple[Gap, int]:
    """The one gap of the ledger's segments, and the sequence of the segment it is in."""
    found = [(gap, read_manifest(path).sequence) for path in segments(folder)
             for gap in read_manifest(path).gaps]
    assert len(found) == 1, found
    return found[0]


def test_rows_still_buffered_at_a_kill_are_a_gap_covering_them(tmp_path: Path) -> None:
    lost = killed_child(tmp_path, opened=False)
    assert (tmp_path / RUNNING).exists()
    assert read_table(tmp_path).num_rows == 10  # the second ten never reached a segment
    ledger, restarted_ms = reopened(tmp_path)
    ledger.start()
    ledger.close()
    gap, _ = the_gap(tmp_path)
    assert gap.reason == "torn_segment" and gap.sequence is None and gap.rows is None
    assert gap.first_ms is not None and gap.last_ms is not None
    assert gap.first_ms <= lost["lost_from_ms"]
    assert lost["lost_to_ms"] <= gap.last_ms
    assert restarted_ms <= gap.last_ms <= int(time.time() * 1000)
    assert gap.first_ms == read_manifest(segments(tmp_path)[0]).last_ms
    assert not (tmp_path / RUNNING).exists()


def test_rows_of_the_open_segment_at_a_kill_are_a_gap_naming_it(tmp_path: Path) -> None:
    lost = killed_child(tmp_path, opened=True)
    (torn,) = [path for path in tmp_path.iterdir() if path.name.endswith(".open")]
    ledger, _ = reopened(tmp_path)
    assert not torn.exists()
    ledger.close()
    gap, _ = the_gap(tmp_path)
    assert (gap.reason, gap.sequence) == ("torn_segment", 2)
    assert gap.first_ms is not None and gap.last_ms is not None
    assert gap.first_ms <= lost["lost_from_ms"] and lost["lost_to_ms"] <= gap.last_ms


def test_a_second_kill_before_any_segment_closes_keeps_the_first_gap(tmp_path: Path) -> None:
    killed_child(tmp_path, opened=False)
    killed_child(tmp_path, opened=False)  # its start recorded the first kill, then it died
    ledger, _ = reopened(tmp_path)
    ledger.close()
    gaps = [gap for path in segments(tmp_path) for gap in read_manifest(path).gaps]
    assert [gap.reason for gap in gaps] == ["torn_segment", "torn_segment"]
    first, second = gaps
    assert first.last_ms is not None and second.first_ms is not None
    assert second.first_ms >= first.last_ms  # the second begins where the first ended


def test_a_ledger_closed_cleanly_leaves_no_gap(tmp_path: Path) -> None:
    ledger, _ = reopened(tmp_path)
    ledger.start()
    ledger.close()
    again, _ = reopened(tmp_path)
    again.close()
    assert [read_manifest(path).gaps for path in segments(tmp_path)] == []
    assert not (tmp_path / RUNNING).exists()
