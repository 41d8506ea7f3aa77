"""What the audit reads of a fetched folder without Spark: its ledger gaps (from manifests and
holes in sequence numbers) and the times ``--since`` and ``--until`` take."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tickwheel.audit import Gap, find_gaps
from tickwheel.audit.command import parse_time_ms
from tickwheel.audit.layout import fetched_segments, newest_rows
from tickwheel.audit.leaders import Turn, unfetched


def segment(folder: Path, sequence: int, first_ms: int, last_ms: int,
            gaps: list[dict[str, object]] | None = None, manifest: bool = True,
            complete_ms: int | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    name = f"ledger-127.0.0.1_7500-{sequence:012d}"
    (folder / f"{name}.parquet").write_bytes(b"")
    if manifest:
        (folder / f"{name}.json").write_text(json.dumps(
            {"sequence": sequence, "first_ms": first_ms, "last_ms": last_ms,
             "gaps": gaps or [], "complete_ms": complete_ms}))


def test_holes_and_named_gaps_are_found_per_node(tmp_path: Path) -> None:
    node = tmp_path / "shard-1" / "node0"
    segment(node, 3, 100, 200)
    segment(node, 4, 300, 400, [{"reason": "buffer_full", "rows": 7, "first_ms": 250,
                                 "last_ms": 260}])
    segment(node, 6, 600, 700, [{"reason": "torn_segment", "sequence": 5}])
    segment(node, 9, 900, 950)
    segment(tmp_path / "shard-0" / "node1", 1, 0, 10)
    (tmp_path / "shard-0" / "node1" / "notes.txt").write_text("not a segment")
    assert find_gaps(fetched_segments(tmp_path)) == [
        Gap(1, "node0", "buffer_full", 7, 250, 260, []),
        Gap(1, "node0", "torn_segment", None, 400, 600, [5]),
        Gap(1, "node0", "missing_segment", None, 700, 900, [7, 8]),
    ]


def test_a_segment_without_manifest_still_shows_the_hole(tmp_path: Path) -> None:
    node = tmp_path / "shard-0" / "node0"
    segment(node, 1, 0, 10)
    segment(node, 3, 30, 40, manifest=False)
    assert find_gaps(fetched_segments(tmp_path)) == [
        Gap(0, "node0", "missing_segment", None, 10, None, [2])]


def test_a_nodes_rows_after_its_newest_segment_are_a_gap_while_nobody_else_leads(
        tmp_path: Path) -> None:
    segment(tmp_path / "shard-0" / "node0", 1, 0, 4_000)   # the leader of term 2
    segment(tmp_path / "shard-0" / "node1", 1, 0, 3_000)   # a follower
    segment(tmp_path / "shard-0" / "node2", 4, 0, 800)     # term 1's leader, killed
    segment(tmp_path / "shard-1" / "node3", 2, 0, 50, manifest=False)
    segment(tmp_path / "shard-1" / "node4", 2, 0, 50, complete_ms=90)  # idle after 50
    newest = newest_rows(fetched_segments(tmp_path))
    assert newest == {(0, "node0"): 4_000, (0, "node1"): 3_000, (0, "node2"): 800,
                      (1, "node3"): None, (1, "node4"): 90}
    turns = [Turn(0, 1, "node2", 0, 10, 900, 50), Turn(0, 2, "node0", 1_000, 1_010, 5_000, 9)]
    assert unfetched(newest, turns) == [
        Gap(0, "node0", "not_fetched", None, 4_000, None, []),
        Gap(0, "node2", "not_fetched", None, 800, 1_000, []),
        Gap(1, "node4", "not_fetched", None, 90, None, [])]


@pytest.mark.parametrize(("text", "expected"), [
    ("2h", 1_000_000_000 - 7_200_000), ("90m", 1_000_000_000 - 5_400_000),
    ("1700000000000", 1_700_000_000_000), ("2023-11-14T22:13:20Z", 1_700_000_000_000)])
def test_times_are_ms_iso_or_ages(text: str, expected: int) -> None:
    assert parse_time_ms(text, now_ms=1_000_000_000) == expected


def test_a_time_that_is_none_of_those_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_time_ms("yesterday")
