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

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from tickwheel.audit import hourly as traffic
from tickwheel.audit import layout, leaders, lifecycle
from tickwheel.audit.lifecycle import Judging, counted, first_per_shard, label
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
    rows = layout.read_ledger(spark, found, options.since_ms, options.until_ms)
    return summarize(rows, layout.find_gaps(found), options, fetch, layout.newest_rows(found))


def summarize(rows: DataFrame, gaps: list[layout.Gap], options: AuditOptions,
              fetch: dict[str, Any] | None = None,
              newest: dict[tuple[int, str], int | None] | None = None) -> dict[str, Any]:
    """Every figure of the summary, from the ledgers' rows (with ``shard`` and
    ``node_name``), their gaps, and where each node's fetched rows end (``newest``:
    `tickwheel.audit.layout.newest_rows`; a tail no other node's rows cover is judged as a
    gap, `tickwheel.audit.leaders.unfetched`).

    ``rows`` is read three times, each time only the columns wanted: what each shard holds;
    its committed rows, each once, with their ids; the nodes' own. What the figures read more
    than once is persisted once (`_Kept`) and released at the end."""
    kept = _Kept()
    try:
        return _summarize(rows, gaps, newest or {}, options, fetch, kept)
    finally:
        kept.release()


class _Kept:
    """The frames persisted for one summary (memory, else the local disk)."""

    def __init__(self) -> None:
        self.frames: list[DataFrame] = []

    def __call__(self, frame: DataFrame) -> DataFrame:
        self.frames.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return frame

    def release(self) -> None:
        for frame in self.frames:
            frame.unpersist()
        self.frames.clear()


def _summarize(rows: DataFrame, gaps: list[layout.Gap],
               newest: dict[tuple[int, str], int | None], options: AuditOptions,
               fetch: dict[str, Any] | None, keep: _Kept) -> dict[str, Any]:
    spark = rows.sparkSession
    held = {row.shard: row for row in rows.groupBy("shard").agg(
        F.count("*").alias("rows"), F.max("time_ms").alias("last_ms"),
        F.min("time_ms").alias("first_ms"),
        F.collect_set("node_name").alias("nodes")).collect()}
    last = [row.last_ms for row in held.values() if row.last_ms is not None]
    first = [row.first_ms for row in held.values() if row.first_ms is not None]
    horizon_ms = options.until_ms if options.until_ms is not None else max(last, default=0)
    judging = Judging(horizon_ms, options.grace_ms, options.allowed_early_ms)
    unique = lifecycle.committed(rows).persist(StorageLevel.MEMORY_AND_DISK)
    events = keep(lifecycle.with_ids(unique))
    events.count()  # computed now, so that what it was computed from can go
    unique.unpersist()
    own = keep(lifecycle.own(rows))
    sent = own.filter(F.col("event") == "sent")
    known = keep(lifecycle.messages(events))
    groups = keep(lifecycle.topic_groups(events, sent))
    owed = keep(lifecycle.deliveries(known, groups, sent, events))
    turns = leaders.turns(own)
    tails = leaders.unfetched(newest, turns)
    gap_frame = spark.createDataFrame(
        [(gap.shard, gap.from_ms, gap.to_ms) for gap in (*gaps, *tails)],
        "shard INT, from_ms BIGINT, to_ms BIGINT")
    late = keep(lifecycle.overdue(owed, judging, gap_frame))
    repeated = keep(leaders.repeats(sent))
    problems = {
        "overdue": late.filter(~F.col("in_gap")),
        "early": lifecycle.early(sent, judging),
        "after_cancel": lifecycle.after_cancel(sent, known, owed),
        "contrary_to_reschedule": lifecycle.contrary_to_reschedule(sent, known, judging),
    }
    shards = _shards(held, known, owed, sent, late, problems, repeated, turns, gaps, tails,
                     options)
    topics = known.select("shard", "id", F.col("topic").alias("first_topic"))
    summary: dict[str, Any] = {
        "window": {"since_ms": options.since_ms, "until_ms": options.until_ms,
                   "first_ms": min(first, default=None),
                   "horizon_ms": horizon_ms, "grace_ms": options.grace_ms,
                   "allowed_early_ms": options.allowed_early_ms},
        "fetch": fetch,
        "rows": sum(row.rows for row in held.values()),
        "totals": _totals(shards),
        "shards": {str(shard): figures for shard, figures in sorted(shards.items())},
        "hourly": traffic.hourly(events, known, groups, sent, topics),
        "principals": traffic.by_principal(events),
        "receipts": None if options.receipts is None else receipt_figures(
            read_receipts(spark, options.receipts), sent, judging, options.max_ids),
    }
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


def _shards(held: dict[int, Row], known: DataFrame, owed: DataFrame, sent: DataFrame,
            late: DataFrame, problems: dict[str, DataFrame], repeated: DataFrame,
            turns: list[leaders.Turn], gaps: list[layout.Gap], tails: list[layout.Gap],
            options: AuditOptions) -> dict[int, dict[str, Any]]:
    """Every shard's figures, each computed for all shards at once. ``held``: per shard,
    its rows' ``nodes``."""
    messages = _by_shard(known, scheduled=F.count("*"), cancelled=F.count("cancelled_ms"),
                         rescheduled=F.count("moved_at_ms"))
    messages |= _by_shard(owed, deliveries=F.count("*"), handled=F.count_if(
        F.col("sent_ms").isNotNull() | F.col("acked_ms").isNotNull()))
    messages |= _by_shard(sent, sent=F.count("*"))
    counts = leaders.repeat_counts(repeated, turns)
    failovers = leaders.failovers(turns, counts)
    led = leaders.leaders(turns)
    lists = {name: counted(frame, label(), options.max_ids) for name, frame in problems.items()}
    never = _counts_by_shard(late.filter(~F.col("in_gap") & F.col("never_sent")))
    unknown = counted(late.filter("in_gap"), label(), options.max_ids)
    unflagged_ids = first_per_shard(repeated.filter(~F.col("flagged")), label(),
                                    options.max_ids)
    numbers = sorted(set(held) | {gap.shard for gap in gaps})
    figures: dict[int, dict[str, Any]] = {}
    for shard in numbers:
        mine = [value for (number, _), value in counts.items() if number == shard]
        figures[shard] = {
            "nodes": sorted(held[shard].nodes) if shard in held else [],
            "messages": {name: values.get(shard, 0) for name, values in messages.items()},
            **{name: {"count": values[0].get(shard, 0), "ids": values[1].get(shard, [])}
               for name, values in lists.items()},
            "unknown": {"count": unknown[0].get(shard, 0), "ids": unknown[1].get(shard, [])},
            "leaders": led.get(shard, []),
            "failovers": failovers.get(shard, []),
            "repeated": {"flagged": sum(value["flagged"] for value in mine),
                         "unflagged": sum(value["unflagged"] for value in mine),
                         "unflagged_ids": unflagged_ids.get(shard, [])},
            "gaps": [dataclasses.asdict(gap) for gap in gaps if gap.shard == shard],
            "unfetched": [{"node": tail.node, "from_ms": tail.from_ms, "to_ms": tail.to_ms}
                          for tail in tails if tail.shard == shard],
        }
        figures[shard]["overdue"]["never_sent"] = never.get(shard, 0)
    return figures


def _by_shard(frame: DataFrame, **figures: Column) -> dict[str, dict[int, int]]:
    """Per figure, its value per shard: one job for all of them."""
    rows = frame.groupBy("shard").agg(*[value.alias(name) for name, value in figures.items()])
    found: dict[str, dict[int, int]] = {name: {} for name in figures}
    for row in rows.collect():
        for name in figures:
            found[name][row.shard] = row[name]
    return found


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
