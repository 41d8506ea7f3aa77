"""The rows a node had not closed into a segment when its ledger was fetched (``ledger fetch``
without ``--close-open``, as the hourly Job runs it: a running node's open segment, up to
``ledger_segment_age_ms`` of rows; or a node down at the fetch) are not lost messages. The
leader's are its sends: a delivery it sent in them, whose consumer acked later than the
grace, read as overdue and never sent before, a false dirty verdict at the end of every run
with a slow consumer. It is now *unknown* while no other node is seen leading after the
leader's last fetched row; and a delivery the leader's fetched rows pass over is still
overdue."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from sparktests import spark_session

from tickwheel.audit import AuditOptions, audit_ledgers
from tickwheel.node.ledger.writer import Ledger, LedgerConfig
from tickwheel.replication import LedgerRows
from tickwheel.wheel import encode_record

pytestmark = pytest.mark.cluster  # a JVM

DUE_MS = 1_700_000_000_000
GRACE_MS = 5_000


@pytest.fixture(scope="module")
def spark(in_background: Callable[..., Any]) -> Iterator[SparkSession]:
    yield from spark_session(in_background)


def write(folder: Path, node: str, *batches: LedgerRows) -> None:
    """A node's closed segment of ``batches``, each stamped with its own time (``node_ms``)."""
    now = [0]
    ledger = Ledger(folder, node, LedgerConfig(), lambda: now[0], measure_free=lambda _: 1 << 40)
    ledger.start()
    for rows in batches:
        now[0] = rows.time_ms
        ledger.add(rows)
    ledger.close()


def sent(time_ms: int, handle: int, message_id: str) -> LedgerRows:
    return LedgerRows("sent", time_ms, {
        "handle": [handle], "id": [message_id], "topic": ["orders"], "group": [""],
        "lease": [1], "possible_duplicate": [False], "attempt": [1],
        "deliver_at_ms": [DUE_MS], "term": [2]})


def ledgers(root: Path, leader_goes_on: bool) -> Path:
    """m1 and m2 due at once on a shard of three; the leader (node0) sends m2 at once and the
    consumer acks it; m1's send is in the leader's open segment (not fetched), and its ack
    comes 8 s later, past the grace. With ``leader_goes_on``, the leader's fetched rows go
    on past m1's grace (another send at +8.5 s), so they show it did not send m1."""
    records = [encode_record(f"m{i}", "orders", b"x", DUE_MS, {}, 1) for i in (1, 2)]
    committed = [
        LedgerRows("scheduled", DUE_MS - 60_000, {
            "handle": [1, 2], "deliver_at_ms": [DUE_MS] * 2, "principal": [""] * 2}, records),
        LedgerRows("leased", DUE_MS, {"handle": [1, 2], "group": ["", ""], "lease": [1, 1],
                                      "possible_duplicate": [False, False]}),
        LedgerRows("acked", DUE_MS + 20, {"handle": [2], "group": [""], "lease": [1]}),
        LedgerRows("acked", DUE_MS + 8_000, {"handle": [1], "group": [""], "lease": [1]})]
    started = LedgerRows("dispatch_started", DUE_MS - 30_000, {"term": [2]})
    own = [started, sent(DUE_MS + 5, 2, "m2")]
    if leader_goes_on:
        own.append(sent(DUE_MS + 8_500, 2, "m2"))
    leader = sorted([*committed[:2], *own], key=lambda rows: rows.time_ms)
    write(root / "shard-0" / "node0", "10.0.0.1:7500", *leader)
    for number in (1, 2):
        write(root / "shard-0" / f"node{number}", f"10.0.0.{number + 1}:7500", *committed)
    return root


def test_a_send_in_the_leaders_unfetched_rows_is_unknown_not_overdue(
        spark: SparkSession, tmp_path: Path) -> None:
    summary = audit_ledgers(spark, ledgers(tmp_path, leader_goes_on=False),
                            AuditOptions(grace_ms=GRACE_MS))
    shard = summary["shards"]["0"]
    assert (shard["overdue"]["ids"], shard["unknown"]["ids"]) == ([], ["m1"])
    assert shard["unfetched"] == [  # nobody is seen leading after any of them
        {"node": "node0", "from_ms": DUE_MS + 5, "to_ms": None},
        {"node": "node1", "from_ms": DUE_MS + 8_000, "to_ms": None},
        {"node": "node2", "from_ms": DUE_MS + 8_000, "to_ms": None}]
    assert shard["gaps"] == []
    assert summary["verdict"] == "clean"


def test_a_delivery_the_leaders_fetched_rows_pass_over_is_still_overdue(
        spark: SparkSession, tmp_path: Path) -> None:
    summary = audit_ledgers(spark, ledgers(tmp_path, leader_goes_on=True),
                            AuditOptions(grace_ms=GRACE_MS))
    shard = summary["shards"]["0"]
    assert (shard["overdue"]["ids"], shard["unknown"]["ids"]) == (["m1"], [])
    assert summary["verdict"] == "dirty"
