"""Per topic and consumer group, per hour: what was scheduled, sent, acked, retried and
dead-lettered, and how late first sends went out. The production audit's traffic table.

Each row is counted in the UTC hour of its ``time_ms`` (the cluster's time): a message's
schedule in its group's row (every group of its topic, `tickwheel.audit.lifecycle`), a
``sent``, ``acked``, ``nacked`` (``retried``: a retry copy filed) or ``dead_lettered`` row in
its own topic and group (``dead_lettered`` rows name the ``%DLQ%`` topic; they are counted
under the topic the message was scheduled in, found by handle). Lateness is of first sends
(lease 1 of attempt 1): ``time_ms - deliver_at_ms``; p50 and p99 by ``percentile_approx``
at `ACCURACY` (exact below that many rows an hour, else within 1/`ACCURACY` of the rank),
and the maximum. Used by `tickwheel.audit.summary`; the report plots it.

`by_principal` is the same hours per principal and topic: the messages each principal
scheduled, cancelled and rescheduled (the ledger's ``principal``: ``""`` for nobody named,
null for rows of segments written before the column).
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

ACCURACY: Final = 10_000
FIGURES: Final = ("scheduled", "sent", "acked", "retried", "dead_lettered")
KEYS: Final = ("topic", "group", "hour")
ASKED: Final = ("scheduled", "cancelled", "rescheduled")
"""What a principal asks for, as the ledger's events name it."""


def _hour() -> Any:
    return F.date_format(F.timestamp_millis("time_ms"), "yyyy-MM-dd'T'HH'Z'")


def hourly(events: DataFrame, known: DataFrame, groups: DataFrame, sent: DataFrame,
           topics: DataFrame) -> list[dict[str, Any]]:
    """The traffic table, ordered by topic, group and hour. ``events``: committed rows with
    ids; ``known``: the messages; ``groups``: ``(topic, group)``; ``topics``: ``(shard, id,
    first_topic)``, the topic each id was scheduled in."""
    scheduled = (known.select("topic", F.col("scheduled_ms").alias("time_ms"))
                 .join(F.broadcast(groups), "topic").withColumn("figure", F.lit("scheduled")))
    named = {"acked": "acked", "nacked": "retried", "dead_lettered": "dead_lettered"}
    lifecycle = (events.filter(F.col("event").isin(*named))
                 .join(topics, ["shard", "id"], "left")
                 .withColumn("topic", F.coalesce("first_topic", "topic"))
                 .withColumn("figure", F.element_at(
                     F.create_map(*[F.lit(part) for pair in named.items() for part in pair]),
                     F.col("event"))))
    counted = (scheduled.select("topic", "group", "time_ms", "figure")
               .unionByName(sent.select("topic", "group", "time_ms",
                                        F.lit("sent").alias("figure")))
               .unionByName(lifecycle.select("topic", "group", "time_ms", "figure"))
               .withColumn("hour", _hour())
               .groupBy(*KEYS).pivot("figure", list(FIGURES)).count())
    first = sent.filter((F.coalesce("lease", F.lit(1)) == 1)
                        & (F.coalesce("attempt", F.lit(1)) == 1))
    lateness = (first.withColumn("hour", _hour())
                .withColumn("lateness_ms", F.col("time_ms") - F.col("deliver_at_ms"))
                .groupBy(*KEYS).agg(
                    F.percentile_approx("lateness_ms", [0.5, 0.99], ACCURACY).alias("p"),
                    F.max("lateness_ms").alias("max")))
    rows = counted.join(lateness, list(KEYS), "left").orderBy(*KEYS).collect()
    return [{"topic": row.topic, "group": row.group, "hour": row.hour,
             **{name: row[name] or 0 for name in FIGURES},
             "lateness_ms": {"p50": row.p[0] if row.p else None,
                             "p99": row.p[1] if row.p else None, "max": row.max}}
            for row in rows]


def by_principal(events: DataFrame) -> list[dict[str, Any]]:
    """Per principal, topic and hour, the ``ASKED`` rows (``events``: committed, each once),
    ordered by principal (null first), topic and hour."""
    keys = ("principal", "topic", "hour")
    rows = (events.filter(F.col("event").isin(*ASKED)).withColumn("hour", _hour())
            .groupBy(*keys).pivot("event", list(ASKED)).count()
            .orderBy(*[F.col(key).asc_nulls_first() for key in keys]).collect())
    return [{**{key: row[key] for key in keys}, **{name: row[name] or 0 for name in ASKED}}
            for row in rows]
