"""A burst in a chaos run: the audit's burst figures on hand-made logs in which every figure is
known, then a short real scenario with a burst amid kills and pauses, judged by the audit.

The hand-made run (times in ms after ``T0_MS``; it lasts 100 s): the burst's scheduling began
at 10,000 and ended at 12,000; five messages were asked for, all due at 20,000, and four
accepted (``burst-4``'s call failed: not owed). They arrive at 20,100, 20,400, 21,000 and
23,000 (drained in 3,000 ms); ``burst-1`` comes again, flagged, at 25,000 (after the drain:
it does not count). The other topics' first receipts whose lateness counts from within
[20,000, 23,000]: ``o-1`` 30 ms late, ``o-2`` 300, ``o-accepted`` (scheduled already due,
accepted at 21,500) 20, all of ``orders/a``; ``r-1`` 100, of ``reminders/``; of them, only
``o-1`` is due within the burst's own second. Left out:
``o-before`` (due 19,000) and ``o-after`` (due 23,500). A kill from 15,000 to 18,000 overlaps
the burst, a pause from 30,000 does not; node0 -> node1 at 16,000 is its one failover.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from sparktests import QUICK_JVM, spark_session

from tickwheel.chaos.audit import audit
from tickwheel.chaos.report import write_report

T0_MS = 1_700_000_000_000
pytestmark = pytest.mark.cluster


def t(ms: int) -> int:
    return T0_MS + ms


def scheduled(id_: str, topic: str, due_ms: int, *, acked: bool = True,
              acked_ms: int = 10_500) -> dict[str, Any]:
    return {"id": id_, "topic": topic, "deliver_at_ms": t(due_ms), "sent_ms": t(acked_ms - 10),
            "acked": acked, "acked_ms": t(acked_ms) if acked else None,
            "handle": 1 if acked else None, "kind": "burst" if topic == "burst" else "near"}


def receipt(id_: str, topic: str, due_ms: int, received_ms: int, group: str = "",
            possible_duplicate: bool = False) -> dict[str, Any]:
    return {"id": id_, "topic": topic, "group": group, "deliver_at_ms": t(due_ms),
            "delivered_at_ms": t(received_ms - 1), "received_ms": t(received_ms), "attempt": 1,
            "possible_duplicate": possible_duplicate, "node": "node0", "consumer": "c0",
            "acked": True}


def write_run(out_dir: Path, burst: dict[str, Any] | None) -> Path:
    """The hand-made run of the module docstring (without ``burst``: the same logs, and
    ``run.json`` naming no burst)."""
    out_dir.mkdir(parents=True)
    (out_dir / "run.json").write_text(json.dumps({
        "started_ms": T0_MS, "ended_ms": t(100_000), "seed": 1, "grace_ms": 5_000,
        "allowed_early_ms": 2, "groups": {"orders": ["a"], "reminders": [""], "burst": [""]},
        "idle_topics": [], "burst": burst}))
    plan = [scheduled(f"burst-{k}", "burst", 20_000, acked=k < 4) for k in range(5)]
    plan += [scheduled(id_, topic, due_ms) for id_, topic, due_ms in (
        ("o-before", "orders", 19_000), ("o-1", "orders", 20_500), ("o-2", "orders", 21_000),
        ("r-1", "reminders", 22_000), ("o-after", "orders", 23_500))]
    plan.append(scheduled("o-accepted", "orders", 15_000, acked_ms=21_500))
    got = [receipt(f"burst-{k}", "burst", 20_000, at_ms)
           for k, at_ms in enumerate((20_100, 20_400, 21_000, 23_000))]
    got += [receipt("burst-1", "burst", 20_000, 25_000, possible_duplicate=True),
            receipt("o-before", "orders", 19_000, 19_010, "a"),
            receipt("o-1", "orders", 20_500, 20_530, "a"),
            receipt("o-2", "orders", 21_000, 21_300, "a"),
            receipt("r-1", "reminders", 22_000, 22_100),
            receipt("o-after", "orders", 23_500, 23_600, "a"),
            receipt("o-accepted", "orders", 15_000, 21_520, "a")]
    faults = [{"fault": fault, "node": node, "shard": 0, "started_ms": t(start_ms),
               "ended_ms": t(end_ms), "detail": ""} for fault, node, start_ms, end_ms in (
        ("kill", "node0", 15_000, 18_000), ("pause", "node1", 30_000, 32_500))]
    leaders = [{"at_ms": t(0), "leader": "node0", "term": 1, "shard": 0},
               {"at_ms": t(16_000), "leader": "node1", "term": 2, "shard": 0}]
    for name, rows in (("scheduled", plan), ("received", got), ("faults", faults),
                       ("leaders", leaders)):
        (out_dir / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out_dir


BURST = {"topic": "burst", "group": "", "messages": 5, "acked": 4, "at_ms": t(10_000),
         "due_ms": t(20_000), "scheduled_ms": t(12_000)}


@pytest.fixture(scope="module")
def spark(in_background: Callable[..., Any]) -> Iterator[SparkSession]:
    yield from spark_session(in_background)


def test_the_burst_figures_of_a_hand_made_run(spark: SparkSession, tmp_path: Path,
                                              in_background: Callable[..., Any]) -> None:
    summary = in_background(audit, spark, write_run(tmp_path / "burst", BURST))
    assert summary["verdict"] == "clean"
    assert summary["burst"] == {
        "topic": "burst", "messages": 5, "acked": 4, "owed": 4, "received": 4, "lost": 0,
        "at_ms": t(10_000), "due_ms": t(20_000), "scheduling_ms": 2_000, "drained_ms": 3_000,
        "others_messages": 4, "others_p50_ms": 30, "others_p99_ms": 300, "others_max_ms": 300,
        "others_sent_p99_ms": 299, "others_sent_max_ms": 299,  # sent 1 ms before the receipt
        "others_groups": {"orders/a": {"messages": 3, "p99": 300, "max": 300, "sent_p99": 299},
                          "reminders/": {"messages": 1, "p99": 100, "max": 100,
                                         "sent_p99": 99}},
        "others_seconds": {"its_second": {"messages": 1, "p50": 30, "p99": 30, "max": 30},
                           "later": {"messages": 3, "p50": 100, "p99": 300, "max": 300}},
        "faults": [{"fault": "kill", "node": "node0", "started_ms": t(15_000)}],
        "failovers": 1}
    assert summary["groups"]["burst/"]["received"] == 4
    write_report(tmp_path / "audit", summary, [])
    report = (tmp_path / "audit" / "report.md").read_text()
    assert "| drained in (ms: from its due time to its last first receipt) | 3,000 |" in report
    assert "| orders/a | 3 | 300 | 300 | 299 |" in report
    assert ("| of them, due after it: messages; lateness p50 / p99 / max (ms) "
            "| 3; 100 / 300 / 300 |") in report
    without = in_background(audit, spark, write_run(tmp_path / "none", None))
    assert without["burst"] is None
    assert without["messages"] == summary["messages"]


@pytest.mark.timeout(400)
def test_a_burst_amid_kills_and_pauses_arrives_whole_and_the_others_are_measured(
        tmp_path: Path, in_background: Callable[..., Any]) -> None:
    """3,000 messages due at once, scheduled 15 s into a 45 s run of kills and pauses of the
    leader: every one is accepted, delivered and audited, none lost, every duplicate flagged,
    and the audit reports how late the other topics were while the burst drained."""
    out = tmp_path / "chaos"
    runner = subprocess.run(
        [sys.executable, "-m", "tickwheel.chaos", "run", "--out", str(out), "--duration", "45",
         "--rate", "100", "--seed", "3", "--faults", "kill,pause", "--warmup", "4",
         "--interval", "5", "--near-max-ms", "15000", "--burst", "3000", "--burst-at", "15",
         "--burst-lead", "4"], capture_output=True, text=True, timeout=300, check=False)
    assert runner.returncode == 0, runner.stdout + runner.stderr[-4_000:]
    record = json.loads((out / "run.json").read_text())
    assert record["groups"]["burst"] == [""]
    assert (record["burst"]["messages"], record["burst"]["acked"]) == (3_000, 3_000)
    assert record["burst"]["scheduled_ms"] is not None
    audit_run = in_background(subprocess.run, [sys.executable, "-m", "tickwheel.chaos.audit",
                                               str(out), "--json"],
                              env={**os.environ, QUICK_JVM[0]: QUICK_JVM[1]},
                              capture_output=True, text=True, timeout=300, check=False)
    summary = json.loads(audit_run.stdout)
    assert summary["verdict"] == "clean", {key: summary[key] for key in ("lost", "duplicates")}
    assert audit_run.returncode == 0, audit_run.stderr[-4_000:]
    assert summary["duplicates"]["unflagged"] == 0 and summary["delivered_early"] == 0
    burst = summary["burst"]
    assert (burst["acked"], burst["owed"], burst["received"], burst["lost"]) == (
        3_000, 3_000, 3_000, 0), burst
    assert summary["groups"]["burst/"]["received"] == 3_000
    assert burst["drained_ms"] is not None and burst["others_p99_ms"] is not None
    assert burst["others_messages"] > 0
    assert set(burst["others_groups"]) == {"orders/billing", "orders/shipping", "reminders/"}
    assert {fault["fault"] for fault in summary["faults"]} == {"kill", "pause"}
    assert "## The burst" in (out / "audit" / "report.md").read_text()
