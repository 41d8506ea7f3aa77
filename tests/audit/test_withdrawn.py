"""A cancel that comes after one consumer group leased a message withdraws it from the
groups that had not (the cancel answers ``HANDED_OUT``): the ledger's ``withdrawn`` row says
so, and the audit owes the message to those groups no more. Without it a chaos run's audit
of the ledgers called such deliveries overdue and never sent, where the consumers' logs
rightly saw nothing lost."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from sparktests import spark_session
from test_ledger_principal import NOW_MS, write_segments

from tickwheel.audit import AuditOptions, audit_ledgers
from tickwheel.replication import LedgerRows
from tickwheel.wheel import encode_record

pytestmark = pytest.mark.cluster  # a JVM

DUE_MS = NOW_MS - 50_000


@pytest.fixture(scope="module")
def spark(in_background: Callable[..., Any]) -> Iterator[SparkSession]:
    yield from spark_session(in_background)


def _ledger(folder: Path, withdrawn: bool, sent_after: bool = False) -> Path:
    """m1 leased, sent and acked by shipping, then cancelled (withdrawn from billing, if
    ``withdrawn``; and sent to billing after that, if ``sent_after``); m2 delivered to both
    groups, so that both consume ``orders``."""
    records = [encode_record(f"m{i}", "orders", b"x", DUE_MS, {}, 1) for i in (1, 2)]
    groups = ["shipping", "shipping", "billing"]
    handles = [1, 2, 2]
    batches = [
        LedgerRows("scheduled", NOW_MS - 60_000, {
            "handle": [1, 2], "deliver_at_ms": [DUE_MS] * 2, "principal": [""] * 2}, records),
        LedgerRows("leased", DUE_MS, {"handle": handles, "group": groups, "lease": [1] * 3,
                                      "possible_duplicate": [False] * 3}),
        LedgerRows("sent", DUE_MS + 5, {
            "handle": handles, "id": ["m1", "m2", "m2"], "topic": ["orders"] * 3,
            "group": groups, "lease": [1] * 3, "possible_duplicate": [False] * 3,
            "attempt": [1] * 3, "deliver_at_ms": [DUE_MS] * 3, "term": [1] * 3}),
        LedgerRows("acked", DUE_MS + 20, {"handle": handles, "group": groups,
                                          "lease": [1] * 3})]
    if withdrawn:
        batches.append(LedgerRows("withdrawn", DUE_MS + 10, {
            "handle": [1], "id": ["m1"], "topic": ["orders"], "deliver_at_ms": [DUE_MS],
            "principal": ["orders-service"]}))
    if sent_after:
        batches.append(LedgerRows("sent", DUE_MS + 30, {
            "handle": [1], "id": ["m1"], "topic": ["orders"], "group": ["billing"],
            "lease": [1], "possible_duplicate": [False], "attempt": [1],
            "deliver_at_ms": [DUE_MS], "term": [1]}))
    write_segments(folder / "shard-0" / "node0", *batches)
    return folder


@pytest.mark.parametrize(("withdrawn", "overdue"), [(True, []), (False, ["billing/m1"])])
def test_a_message_withdrawn_from_a_group_is_not_owed_to_it(
        spark: SparkSession, tmp_path: Path, withdrawn: bool, overdue: list[str]) -> None:
    summary = audit_ledgers(spark, _ledger(tmp_path, withdrawn),
                            AuditOptions(grace_ms=5_000, until_ms=NOW_MS))
    assert summary["shards"]["0"]["overdue"]["ids"] == overdue
    assert summary["verdict"] == ("clean" if withdrawn else "dirty")


def test_a_send_to_a_group_after_the_message_was_withdrawn_from_it_is_after_cancel(
        spark: SparkSession, tmp_path: Path) -> None:
    summary = audit_ledgers(spark, _ledger(tmp_path, True, sent_after=True),
                            AuditOptions(grace_ms=5_000, until_ms=NOW_MS))
    shard = summary["shards"]["0"]
    assert (shard["after_cancel"]["ids"], shard["overdue"]["ids"]) == (["billing/m1"], [])
    assert summary["verdict"] == "dirty"
