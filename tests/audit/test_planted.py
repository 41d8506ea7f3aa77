"""The production audit on the ledgers of real nodes: a clean run is clean, and each fault
planted in a copy of its ledgers (or of its consumer's receipts) is caught, each in its own
test.

The run: three nodes; ``orders`` read by an acknowledging consumer that writes its receipts
(``receipts_dir``); 24 messages due a second or two after scheduling (``moved`` rescheduled
a second later, ``cancelled`` cancelled before it is due); then SIGTERM, so every segment is
closed. The audit's horizon is the last due time plus the grace, so every message is owed by
then.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from ledgers import all_rows, copy_of, fetch_layout, rewrite, rows_of, segments
from pyspark.sql import SparkSession
from sparktests import spark_session

from tickwheel.audit import AuditOptions, audit_ledgers
from tickwheel.harness.local_cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
GRACE_MS = 2_000
MESSAGES = 24


@pytest.fixture(scope="module")
def spark(in_background: Callable[..., Any]) -> Iterator[SparkSession]:
    yield from spark_session(in_background)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The run's fetched ledgers, its horizon and its ids."""
    root = tmp_path_factory.mktemp("planted")
    received: set[str] = set()
    with LocalCluster(root / "cluster") as cluster, cluster.client(timeout_s=30) as client:
        cluster.leader(timeout_s=30)
        now_ms = int(time.time() * 1000)
        due = {f"m-{n}": now_ms + 1_500 + 40 * n for n in range(MESSAGES)}
        handles = {id_: client.schedule("orders", b"x", deliver_at_ms=at_ms, id=id_).handle
                   for id_, at_ms in due.items()}
        due["moved"] = now_ms + 1_500
        moved = client.schedule("orders", b"x", deliver_at_ms=due["moved"], id="moved")
        client.reschedule([moved.handle], deliver_at_ms=now_ms + 2_500)
        due["moved"] = now_ms + 2_500
        cancelled = client.schedule("orders", b"x", deliver_at_ms=now_ms + 2_000,
                                    id="cancelled")
        assert client.cancel(cancelled.handle)
        with client.consume("orders", name="audited", receipts_dir=root / "receipts") as taken:
            for message in taken:
                message.ack()
                received.add(message.id)
                if len(received) == MESSAGES + 1:
                    break
        leader = cluster.leader().data.name
        # The nodes run past the horizon, so that their ledgers cover it: a node's rows end
        # where it stopped, and a delivery due within a grace of that is unknown, not overdue.
        until_ms = max(due.values()) + GRACE_MS
        wait_for(lambda: time.time() * 1000 > until_ms + 100, 30, "the horizon")
    assert handles
    return {"folder": fetch_layout(cluster, root / "fetched"), "leader": leader,
            "options": AuditOptions(grace_ms=GRACE_MS, until_ms=until_ms),
            "receipts": root / "receipts"}


def audited(spark: SparkSession, folder: Path, options: AuditOptions) -> dict[str, Any]:
    return audit_ledgers(spark, folder, options)


def test_the_real_run_is_clean(spark: SparkSession, run: dict[str, Any]) -> None:
    summary = audited(spark, run["folder"], run["options"])
    shard = summary["shards"]["0"]
    assert summary["verdict"] == "clean", summary
    assert shard["messages"]["scheduled"] == MESSAGES + 2
    assert shard["messages"]["cancelled"] == 1
    assert shard["messages"]["rescheduled"] == 1
    assert shard["messages"]["deliveries"] == MESSAGES + 2  # one group, the default
    assert shard["messages"]["handled"] == MESSAGES + 1
    assert len(shard["nodes"]) == 3
    assert shard["leaders"][-1]["node"] == run["leader"]  # an election on a busy machine
    assert len(shard["failovers"]) == len(shard["leaders"]) - 1  # may add one before it
    assert shard["gaps"] == []
    hours = summary["hourly"]
    assert sum(row["scheduled"] for row in hours) == MESSAGES + 2
    assert sum(row["sent"] for row in hours) == MESSAGES + 1
    assert sum(row["acked"] for row in hours) == MESSAGES + 1
    assert all(row["lateness_ms"]["max"] < GRACE_MS for row in hours)


def test_a_send_whose_flag_is_dropped_is_caught(spark: SparkSession, run: dict[str, Any],
                                                 tmp_path: Path) -> None:
    """A second send of ``m-3`` (lease 2) that does not say it may be a duplicate."""
    folder = copy_of(run["folder"], tmp_path / "fetched")
    segment = next(path for path, row in all_rows(folder)
                   if row["event"] == "sent" and row["id"] == "m-3")

    def resend(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        first = next(row for row in rows if row["event"] == "sent" and row["id"] == "m-3")
        return [*rows, first | {"lease": 2, "possible_duplicate": False,
                                "time_ms": first["time_ms"] + 5}]
    rewrite(folder, resend, [segment])
    summary = audited(spark, folder, run["options"])
    assert summary["verdict"] == "dirty"
    assert summary["totals"]["unflagged_repeats"] == 1
    assert summary["shards"]["0"]["repeated"]["unflagged_ids"] == ["m-3"]
    flagged = copy_of(run["folder"], tmp_path / "flagged")
    rewrite(flagged, lambda rows: [*rows, *(row | {"lease": 2, "possible_duplicate": True}
                                            for row in rows if row["event"] == "sent"
                                            and row["id"] == "m-3")], [
        flagged / segment.relative_to(folder)])
    kept = audited(spark, flagged, run["options"])
    assert kept["verdict"] == "clean"
    assert kept["shards"]["0"]["repeated"] == {"flagged": 1, "unflagged": 0,
                                               "unflagged_ids": []}


def test_a_removed_segment_is_a_gap_not_a_lost_message(spark: SparkSession,
                                                       run: dict[str, Any],
                                                       tmp_path: Path) -> None:
    """The leader's segment holding sends is deleted, and (so that nothing else tells) the
    acks of those messages in every ledger: their sends are unknown, the gap is reported."""
    folder = copy_of(run["folder"], tmp_path / "fetched")
    mine = [path for path in segments(folder) if path.parent.name == run["leader"]]
    holding = [path for path in mine[1:-1]
               if any(row["event"] == "sent" for row in rows_of(path))]
    removed = holding[0]
    ids = {row["id"] for row in rows_of(removed) if row["event"] == "sent"}
    handles = {row["handle"] for _, row in all_rows(folder)
               if row["event"] == "scheduled" and row["id"] in ids}
    removed.unlink()
    removed.with_suffix(".json").unlink()
    rewrite(folder, lambda rows: [row for row in rows if not (
        row["event"] == "acked" and row["handle"] in handles)])
    summary = audited(spark, folder, run["options"])
    shard = summary["shards"]["0"]
    sequence = int(removed.stem.rsplit("-", 1)[1])
    assert [(gap["node"], gap["reason"], gap["sequences"]) for gap in shard["gaps"]] == [
        (run["leader"], "missing_segment", [sequence])]
    assert shard["overdue"]["count"] == 0
    assert shard["unknown"]["count"] == len(ids)
    assert sorted(shard["unknown"]["ids"]) == sorted(ids)
    assert summary["verdict"] == "clean"


def test_a_message_never_sent_is_overdue(spark: SparkSession, run: dict[str, Any],
                                         tmp_path: Path) -> None:
    """Every row of ``m-7`` after its schedule is taken out of every ledger."""
    folder = copy_of(run["folder"], tmp_path / "fetched")
    handle = next(row["handle"] for _, row in all_rows(folder)
                  if row["event"] == "scheduled" and row["id"] == "m-7")
    rewrite(folder, lambda rows: [row for row in rows if row["event"] == "scheduled"
                                  or (row["id"] != "m-7" and row["handle"] != handle)])
    summary = audited(spark, folder, run["options"])
    overdue = summary["shards"]["0"]["overdue"]
    assert summary["verdict"] == "dirty"
    assert overdue == {"count": 1, "never_sent": 1, "ids": ["m-7"]}


def test_receipts_agree_with_the_ledgers(spark: SparkSession, run: dict[str, Any]) -> None:
    lines = [json.loads(line) for path in run["receipts"].glob("receipts-audited-*.jsonl")
             for line in path.read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(
        [f"m-{n}" for n in range(MESSAGES)] + ["moved"])
    assert {(line["topic"], line["group"], line["consumer"]) for line in lines} == {
        ("orders", "", "audited")}
    options = replace(run["options"], receipts=run["receipts"])
    seen = audited(spark, run["folder"], options)["receipts"]
    assert seen == {"receipts": MESSAGES + 1, "received": MESSAGES + 1,
                    "lost_at_consumer": {"count": 0, "ids": []},
                    "duplicates": {"total": 0, "flagged": 0, "unflagged": 0,
                                   "unflagged_ids": []}}


def test_what_a_consumer_missed_or_saw_twice_is_caught(spark: SparkSession, run: dict[str, Any],
                                                      tmp_path: Path) -> None:
    """One receipt is taken out (``m-2``: sent, never seen) and another written twice
    (``m-5``, unflagged), with a flagged copy of a third (``m-6``)."""
    lines = [json.loads(line) for path in run["receipts"].glob("*.jsonl")
             for line in path.read_text().splitlines()]
    kept = [line for line in lines if line["id"] != "m-2"]
    kept += [line for line in lines if line["id"] == "m-5"]
    kept += [line | {"possible_duplicate": True} for line in lines if line["id"] == "m-6"]
    (tmp_path / "receipts-x.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in kept) + '{"id": "torn')
    summary = audited(spark, run["folder"], replace(run["options"], receipts=tmp_path))
    seen = summary["receipts"]
    assert summary["verdict"] == "dirty"
    assert seen["lost_at_consumer"] == {"count": 1, "ids": ["m-2"]}
    assert seen["duplicates"] == {"total": 2, "flagged": 1, "unflagged": 1,
                                  "unflagged_ids": ["m-5"]}
