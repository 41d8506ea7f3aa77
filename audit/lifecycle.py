"""What the ledgers say happened to each message, as Spark frames: the definitions the
production audit counts (docs/audit.md has them for users).

Every replica records the committed lifecycle, so each committed row is in up to as many
ledgers as the shard has members (and twice in a node that applied its log again after a
restart): `committed` keeps one of each. ``sent`` rows are the sending leader's own.

- **messages**: one row per ``(shard, id)`` with a ``scheduled`` row: its ``topic``, when it
  was first scheduled (``scheduled_ms``), its due time (``due_ms``: the latest
  ``rescheduled`` row's ``deliver_at_ms``, else the schedule's), and its first ``cancelled``
  row's time (``cancelled_ms``), and its first ``withdrawn`` row's (``withdrawn_ms``: a cancel
  that came after some group had leased it, which withdraws it from the groups that had not).
- **deliveries**: a message is owed to every consumer group of its topic, the groups any
  ``sent`` or ``leased`` row names for that topic (``""``: the default group); a topic no
  group ever consumed is owed to nobody. A delivery is *handled* at its first ``sent`` row or
  its first ``acked`` row (replicated, so it survives the sending leader's lost segment),
  whichever is earlier.
- **overdue**: a delivery not cancelled by ``due_ms + grace_ms`` (nor withdrawn by then from
  its group, which had leased it before the withdrawal: ``leased_ms``), due so that
  ``due_ms + grace_ms <= horizon_ms``, and not handled by then; ``never_sent`` of those have
  no ``sent`` or ``acked`` row at all. An overdue delivery whose window ``[due_ms, due_ms +
  grace_ms]`` meets a ledger gap of its shard (`tickwheel.audit.layout.Gap`; an edge it does
  not know is open: a gap with no start began before anything) is *unknown*, not overdue:
  its send may be in the rows missing.
- **early**: ``sent`` rows with ``time_ms < deliver_at_ms - allowed_early_ms``, the cluster's
  time against the due time the send carries.
- **after_cancel**: ``sent`` rows of a message later than its first ``cancelled`` row, and
  ``sent`` rows to a group later than a ``withdrawn`` row, the group not having leased it
  before.
- **contrary_to_reschedule**: ``sent`` rows of a rescheduled message at or after its latest
  ``rescheduled`` row and more than ``allowed_early_ms`` before the due time that row set.

Used by `tickwheel.audit.summary`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

OWN: tuple[str, ...] = ("sent", "dispatch_started")
"""Events a node records of itself (all others are committed, on every replica)."""
DELIVERY = ("shard", "id", "group")
SAME_ROW = ("shard", "handle", "event", "new_handle", "group", "lease", "time_ms")
"""What tells one committed row from another: its copies in the replicas' ledgers agree."""
COMMITTED = (*SAME_ROW, "id", "topic", "deliver_at_ms", "principal")
"""The columns of committed rows the audit reads (all it carries through their shuffles)."""


@dataclass(frozen=True, slots=True)
class Judging:
    """What the audit judges by: ``horizon_ms`` (deliveries due by ``horizon_ms - grace_ms``
    must have been handled), ``grace_ms`` and ``allowed_early_ms``."""

    horizon_ms: int
    grace_ms: int
    allowed_early_ms: int


def committed(rows: DataFrame) -> DataFrame:
    """The committed rows, each once (every replica records them), in `COMMITTED`'s
    columns, partitioned by ``(shard, handle)``: one shuffle serves both the duplicates'
    removal and `with_ids`' join (a row's copies come from different files, so removing
    them before the shuffle would find none)."""
    return (rows.filter(~F.col("event").isin(*OWN)).select(*COMMITTED)
            .withColumn("group", F.coalesce("group", F.lit("")))
            .repartition("shard", "handle")
            .dropDuplicates(list(SAME_ROW)))


def own(rows: DataFrame) -> DataFrame:
    """The rows nodes record of themselves (`OWN`: ``sent`` and ``dispatch_started``), group
    ``""`` for the default group."""
    return (rows.filter(F.col("event").isin(*OWN))
            .withColumn("group", F.coalesce("group", F.lit(""))))


def handles(events: DataFrame) -> DataFrame:
    """``(shard, handle, id)`` of every copy a committed row filed."""
    filed = events.filter(F.col("event").isin("rescheduled", "nacked", "dead_lettered"))
    return (events.filter(F.col("event") == "scheduled").select("shard", "handle", "id")
            .unionByName(filed.select("shard", F.col("new_handle").alias("handle"), "id"))
            .dropDuplicates(["shard", "handle"]))


def with_ids(events: DataFrame) -> DataFrame:
    """``events`` (`committed`) with the ``id`` of their handle (`handles`) where they carry
    none."""
    named = handles(events).select("shard", "handle", F.col("id").alias("id_of_handle"))
    return (events.join(named, ["shard", "handle"], "left")
            .withColumn("id", F.coalesce("id", "id_of_handle")).drop("id_of_handle"))


def messages(events: DataFrame) -> DataFrame:
    """One row per scheduled ``(shard, id)`` (see the module docstring)."""
    event = F.col("event")
    moved = event == "rescheduled"
    return (events.filter(event.isin("scheduled", "rescheduled", "cancelled", "withdrawn"))
            .groupBy("shard", "id").agg(
                F.first(F.when(event == "scheduled", F.col("topic")), ignorenulls=True)
                .alias("topic"),
                F.min(F.when(event == "scheduled", F.col("time_ms"))).alias("scheduled_ms"),
                F.min_by(F.when(event == "scheduled", F.col("deliver_at_ms")),
                         F.when(event == "scheduled", F.col("time_ms"))).alias("first_due_ms"),
                F.max_by(F.when(moved, F.col("deliver_at_ms")), F.when(moved, F.col("time_ms")))
                .alias("moved_to_ms"),
                F.max(F.when(moved, F.col("time_ms"))).alias("moved_at_ms"),
                F.min(F.when(event == "cancelled", F.col("time_ms"))).alias("cancelled_ms"),
                F.min(F.when(event == "withdrawn", F.col("time_ms"))).alias("withdrawn_ms"))
            .filter(F.col("scheduled_ms").isNotNull())
            .withColumn("due_ms", F.coalesce("moved_to_ms", "first_due_ms"))
            .drop("first_due_ms"))


def topic_groups(events: DataFrame, sent: DataFrame) -> DataFrame:
    """``(topic, group)``: every group a ``sent`` or ``leased`` row names for a topic."""
    leased = events.filter(F.col("event") == "leased").select("topic", "group")
    return (sent.select("topic", "group").unionByName(leased)
            .filter(F.col("topic").isNotNull()).distinct())


def deliveries(known: DataFrame, groups: DataFrame, sent: DataFrame,
               events: DataFrame) -> DataFrame:
    """One row per delivery owed (``shard, id, group, topic, due_ms, cancelled_ms,
    withdrawn_ms``), with ``sent_ms``, ``acked_ms`` and ``leased_ms``, its first ``sent``,
    ``acked`` and ``leased`` rows' times (null if none): one grouping of the three."""
    event = F.col("event")
    firsts = (sent.select(*DELIVERY, "time_ms", F.lit("sent").alias("event"))
              .unionByName(events.filter(event.isin("acked", "leased") & F.col("id").isNotNull())
                           .select(*DELIVERY, "time_ms", "event"))
              .groupBy(*DELIVERY).agg(*[F.min(F.when(event == name, F.col("time_ms")))
                                       .alias(f"{name}_ms")
                                       for name in ("sent", "acked", "leased")]))
    return (known.join(F.broadcast(groups), "topic")
            .select("shard", "id", "group", "topic", "due_ms", "cancelled_ms", "withdrawn_ms")
            .join(firsts, list(DELIVERY), "left"))


def overdue(owed: DataFrame, window: Judging, gaps: DataFrame) -> DataFrame:
    """Overdue deliveries (the module docstring), with ``never_sent`` and ``in_gap``."""
    by_ms = F.col("due_ms") + window.grace_ms
    handled_ms = F.least("sent_ms", "acked_ms")
    withdrawn = F.col("withdrawn_ms")
    never_had_it = F.col("leased_ms").isNull() | (F.col("leased_ms") > withdrawn)
    late = (owed.filter((by_ms <= window.horizon_ms)
                        & (F.col("cancelled_ms").isNull() | (F.col("cancelled_ms") > by_ms))
                        & ~(withdrawn.isNotNull() & (withdrawn <= by_ms) & never_had_it)
                        & (handled_ms.isNull() | (handled_ms > by_ms)))
            .withColumn("never_sent", handled_ms.isNull()))
    begun = F.col("from_ms").isNull() | (F.col("from_ms") <= by_ms)
    ended = F.col("to_ms").isNull() | (F.col("to_ms") >= F.col("due_ms"))
    meets = (late.join(F.broadcast(gaps), "shard").filter(begun & ended)
             .select(*DELIVERY).distinct().withColumn("in_gap", F.lit(True)))
    return (late.join(meets, list(DELIVERY), "left")
            .withColumn("in_gap", F.coalesce("in_gap", F.lit(False))))


def early(sent: DataFrame, window: Judging) -> DataFrame:
    """``sent`` rows more than ``allowed_early_ms`` before the due time they carry."""
    return sent.filter(F.col("time_ms") < F.col("deliver_at_ms") - window.allowed_early_ms)


def after_cancel(sent: DataFrame, known: DataFrame, owed: DataFrame) -> DataFrame:
    """``sent`` rows of a message later than its first ``cancelled`` row, and those to a
    group later than the message's ``withdrawn`` row when the group had not leased it
    before."""
    cancelled = known.filter(F.col("cancelled_ms").isNotNull()).select(
        "shard", "id", "cancelled_ms")
    withdrawn = owed.filter(F.col("withdrawn_ms").isNotNull() & (
        F.col("leased_ms").isNull() | (F.col("leased_ms") > F.col("withdrawn_ms")))).select(
        *DELIVERY, "withdrawn_ms")
    return (sent.join(cancelled, ["shard", "id"])
            .filter(F.col("time_ms") > F.col("cancelled_ms")).drop("cancelled_ms")
            .unionByName(sent.join(withdrawn, list(DELIVERY))
                         .filter(F.col("time_ms") > F.col("withdrawn_ms"))
                         .drop("withdrawn_ms"))
            .dropDuplicates())


def contrary_to_reschedule(sent: DataFrame, known: DataFrame, window: Judging) -> DataFrame:
    """``sent`` rows at or after a message's latest ``rescheduled`` row, early for the due
    time it set."""
    moved = known.filter(F.col("moved_at_ms").isNotNull()).select(
        "shard", "id", "moved_at_ms", "moved_to_ms")
    return (sent.join(moved, ["shard", "id"])
            .filter((F.col("time_ms") >= F.col("moved_at_ms"))
                    & (F.col("time_ms") < F.col("moved_to_ms") - window.allowed_early_ms)))


def label() -> Column:
    """A delivery's name in the summary: ``id`` in the default group, else ``group/id``."""
    return F.when(F.coalesce("group", F.lit("")) == "", F.col("id")).otherwise(
        F.concat(F.col("group"), F.lit("/"), F.col("id")))


def counted(frame: DataFrame, names: Column, limit: int
            ) -> tuple[dict[int, int], dict[int, list[str]]]:
    """Per shard, ``frame``'s rows and the first ``limit`` distinct ``names`` among them,
    sorted (as `first_per_shard`), in one job: ``frame`` is computed once for both."""
    by_shard = Window.partitionBy("shard")
    ranked = (frame.groupBy("shard", names.alias("name")).count()
              .withColumn("rows", F.sum("count").over(by_shard))
              .withColumn("rank", F.row_number().over(by_shard.orderBy("name"))))
    counts: dict[int, int] = {}
    lists: dict[int, list[str]] = {}
    for row in (ranked.filter(F.col("rank") <= max(limit, 1)).orderBy("shard", "name")
                .collect()):
        counts[row.shard] = row.rows
        if row["rank"] <= limit:
            lists.setdefault(row.shard, []).append(row.name)
    return counts, lists


def first_per_shard(frame: DataFrame, names: Column, limit: int) -> dict[int, list[str]]:
    """Per shard, the first ``limit`` distinct ``names`` of ``frame``'s rows, sorted: the
    only per-message values the audit brings back to the driver (`counted`'s lists)."""
    return counted(frame, names, limit)[1]
