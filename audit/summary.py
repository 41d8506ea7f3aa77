"""The production audit: from a folder of fetched ledgers (and, optionally, consumers'
receipts) to the summary, whose every field docs/audit.md defines; `verdict` says whether a
promise was broken.

It keeps one rule for scale: nothing per message comes back to the driver but bounded lists
(the first `AuditOptions.max_ids` ids of each problem, sorted, beside its count); counts,
percentiles and the per-hour tables are aggregated in Spark. The definitions live with the
frames: `tickwheel.audit.lifecycle` (overdue, early, after cancel, contrary to a
reschedule), `tickwheel.audit.leaders` (failovers, repeated hand-outs),
`tickwheel.audit.hourly` (traffic, and who asked for it), `tickwheel.audit.receipts` (what
consumers saw), `tickwheel.audit.layout` (gaps). Called by the command
(`tickwheel.audit.command`) and by the chaos audit (`tickwheel.chaos.audit`) on a run's
ledgers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tickwheel.audit import hourly as traffic
from tickwheel.audit import layout, leaders, lifecycle
from tickwheel.audit.lifecycle import Judging, first_per_shard, label
from tickwheel.audit.receipts import read_receipts, receipt_figures

PROBLEMS = ("overdue", "early", "after_cancel", "contrary_to_reschedule")
"""The problem lists of each shard, beside its unflagged repeated hand-outs."""


@dataclass(frozen=True, slots=True)
class AuditOptions:
    """What the audit judges by (docs/audit.md, "Options")."""

    grace_ms: int = 60_000
    """A delivery is overdue when not handled this long after its due time."""
    allowed_early_ms: int = 0
    """A send this much before its due time is not early."""
    since_ms: int | None = None
    until_ms: int | None = None
    """Only rows whose ``time_ms`` lies in ``[since_ms, until_ms]``; ``until_ms`` is also the
    horizon (default: the latest ``time_ms`` read)."""
    max_ids: int = 50
    """Ids listed per problem and shard."""
    receipts: Path | None = None
    """A folder of consumers' receipts (`tickwheel.audit.receipts`)."""


def audit_ledgers(spark: SparkSession, folder: Path,
                  options: AuditOptions | None = None) -> dict[str, Any]:
    """The summary of the fetched ledgers under ``folder`` (the layout of
    `tickwheel.audit.layout`); writes nothing."""
    return audit_segments(spark, layout.fetched_segments(folder), options or AuditOptions(),
                          fetch=layout.fetch_record(folder))


def audit_segments(spark: SparkSession, found: layout.Segments, options: AuditOptions,
                   fetch: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary of the segments ``found`` (`tickwheel.audit.layout.fetched_segments`),
    with ``fetch`` (``fetch.json``) copied into it."""
    rows = layout.read_ledger(spark, found, options.since_ms, options.until_ms).cache()
    try:
        return summarize(rows, layout.find_gaps(found), options, fetch)
    finally:
        rows.unpersist()


def summarize(rows: DataFrame, gaps: list[layout.Gap], options: AuditOptions,
              fetch: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every figure of the summary, from the ledgers' rows (with ``shard`` and
    ``node_name``) and their gaps."""
    spark = rows.sparkSession
    totals = rows.agg(F.count("*").alias("rows"), F.max("time_ms").alias("last_ms"),
                      F.min("time_ms").alias("first_ms")).first()
    horizon_ms = options.until_ms if options.until_ms is not None else (
        totals["last_ms"] if totals and totals["last_ms"] is not None else 0)
    judging = Judging(horizon_ms, options.grace_ms, options.allowed_early_ms)
    copies = lifecycle.handles(lifecycle.committed(rows))
    events = lifecycle.with_ids(lifecycle.committed(rows), copies).cache()
    sent = lifecycle.sends(rows).cache()
    known = lifecycle.messages(events).cache()
    groups = lifecycle.topic_groups(events, sent).cache()
    acked = events.filter(F.col("event") == "acked")
    owed = lifecycle.deliveries(known, groups, sent, acked,
                                events.filter(F.col("event") == "leased"))
    gap_frame = spark.createDataFrame(
        [(gap.shard, gap.from_ms, gap.to_ms) for gap in gaps],
        "shard INT, from_ms BIGINT, to_ms BIGINT")
    late = lifecycle.overdue(owed, judging, gap_frame).cache()
    turns = leaders.turns(rows)
    repeated = leaders.repeats(sent)
    problems = {
        "overdue": late.filter(~F.col("in_gap")),
        "early": lifecycle.early(sent, judging),
        "after_cancel": lifecycle.after_cancel(sent, known, owed),
        "contrary_to_reschedule": lifecycle.contrary_to_reschedule(sent, known, judging),
    }
    shards = _shards(rows, known, owed, sent, late, problems, repeated, turns, gaps, options)
    topics = known.select("shard", "id", F.col("topic").alias("first_topic"))
    summary: dict[str, Any] = {
        "window": {"since_ms": options.since_ms, "until_ms": options.until_ms,
                   "first_ms": totals["first_ms"] if totals else None,
                   "horizon_ms": horizon_ms, "grace_ms": options.grace_ms,
                   "allowed_early_ms": options.allowed_early_ms},
        "fetch": fetch,
        "rows": totals["rows"] if totals else 0,
        "totals": _totals(shards),
        "shards": {str(shard): figures for shard, figures in sorted(shards.items())},
        "hourly": traffic.hourly(events, known, groups, sent, topics),
        "principals": traffic.by_principal(events),
        "receipts": None if options.receipts is None else receipt_figures(
            read_receipts(spark, options.receipts), sent, judging, options.max_ids),
    }
    for frame in (events, sent, known, groups, late):
        frame.unpersist()
    return {"verdict": verdict(summary), **summary}


def verdict(summary: dict[str, Any]) -> str:
    """``clean`` iff no delivery is overdue, no send was early, after a cancel or contrary to
    a reschedule, no repeated hand-out was unflagged, and (with receipts) no delivery sent
    was lost at the consumer and no duplicate seen was unflagged; else ``dirty``. Ledger gaps
    and unknown deliveries alone leave it clean."""
    totals = summary["totals"]
    broken = [totals[name] for name in (*PROBLEMS, "unflagged_repeats")]
    seen = summary.get("receipts")
    if seen is not None:
        broken += [seen["lost_at_consumer"]["count"], seen["duplicates"]["unflagged"]]
    return "dirty" if any(broken) else "clean"


def _shards(rows: DataFrame, known: DataFrame, owed: DataFrame, sent: DataFrame,
            late: DataFrame, problems: dict[str, DataFrame], repeated: DataFrame,
            turns: list[leaders.Turn], gaps: list[layout.Gap],
            options: AuditOptions) -> dict[int, dict[str, Any]]:
    """Every shard's figures, each computed for all shards at once."""
    count_of = _counts_by_shard
    nodes = {row.shard: sorted(row.nodes) for row in rows.groupBy("shard").agg(
        F.collect_set("node_name").alias("nodes")).collect()}
    messages = {
        "scheduled": count_of(known),
        "cancelled": count_of(known.filter(F.col("cancelled_ms").isNotNull())),
        "rescheduled": count_of(known.filter(F.col("moved_at_ms").isNotNull())),
        "deliveries": count_of(owed),
        "sent": count_of(sent),
        "handled": count_of(owed.filter(F.col("sent_ms").isNotNull()
                                        | F.col("acked_ms").isNotNull())),
    }
    counts = leaders.repeat_counts(repeated, turns)
    failovers = leaders.failovers(turns, counts)
    led = leaders.leaders(turns)
    lists = {name: (count_of(frame), first_per_shard(frame, label(), options.max_ids))
             for name, frame in problems.items()}
    never = count_of(late.filter(~F.col("in_gap") & F.col("never_sent")))
    unknown = late.filter("in_gap")
    unknown_lists = (count_of(unknown), first_per_shard(unknown, label(), options.max_ids))
    unflagged = repeated.filter(~F.col("flagged"))
    unflagged_ids = first_per_shard(unflagged, label(), options.max_ids)
    numbers = sorted(set(nodes) | {gap.shard for gap in gaps})
    figures: dict[int, dict[str, Any]] = {}
    for shard in numbers:
        mine = [value for (number, _), value in counts.items() if number == shard]
        figures[shard] = {
            "nodes": nodes.get(shard, []),
            "messages": {name: values.get(shard, 0) for name, values in messages.items()},
            **{name: {"count": values[0].get(shard, 0), "ids": values[1].get(shard, [])}
               for name, values in lists.items()},
            "unknown": {"count": unknown_lists[0].get(shard, 0),
                        "ids": unknown_lists[1].get(shard, [])},
            "leaders": led.get(shard, []),
            "failovers": failovers.get(shard, []),
            "repeated": {"flagged": sum(value["flagged"] for value in mine),
                         "unflagged": sum(value["unflagged"] for value in mine),
                         "unflagged_ids": unflagged_ids.get(shard, [])},
            "gaps": [dataclasses.asdict(gap) for gap in gaps if gap.shard == shard],
        }
        figures[shard]["overdue"]["never_sent"] = never.get(shard, 0)
    return figures


def _counts_by_shard(frame: DataFrame) -> dict[int, int]:
    return {row.shard: row["count"] for row in frame.groupBy("shard").count().collect()}


def _totals(shards: dict[int, dict[str, Any]]) -> dict[str, int]:
    """The shards' problems added up, and their ledger gaps."""
    totals = {name: sum(figures[name]["count"] for figures in shards.values())
              for name in (*PROBLEMS, "unknown")}
    totals["unflagged_repeats"] = sum(figures["repeated"]["unflagged"]
                                      for figures in shards.values())
    totals["failovers"] = sum(len(figures["failovers"]) for figures in shards.values())
    totals["gaps"] = sum(len(figures["gaps"]) for figures in shards.values())
    return totals
