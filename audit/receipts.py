"""What consumers saw: the receipts the client library writes when a consumer is given
``receipts_dir=`` (`tickwheel.client.receipts`), set against what the ledgers say was sent.

A receipt is a JSON line, one per message a consumer took: ``id``, ``topic``, ``group``
(``""``: the default group), ``attempt``, ``possible_duplicate``, ``deliver_at_ms``,
``delivered_at_ms`` (the cluster's time the leader sent it), ``received_ms`` (the consumer's
clock), ``node`` and ``consumer``; `RECEIPT_SCHEMA` reads every ``*.jsonl`` file under the
folder, and drops a torn last line. Figures (deliveries are ``(id, group)``):

- ``received``: deliveries with a receipt; ``receipts``: receipts in all;
- ``lost_at_consumer``: deliveries the ledgers show sent (by ``horizon_ms - grace_ms``) that
  no consumer received: with the ledgers' ``overdue`` these are everything owed and not
  seen;
- ``duplicates``: receipts of a delivery after its first, ``flagged`` (the receipt says
  ``possible_duplicate`` or ``attempt`` > 1: the consumer could tell) or ``unflagged`` (a
  broken promise).

Used by `tickwheel.audit.summary`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tickwheel.audit.lifecycle import Judging, first_per_shard, label

RECEIPT_SCHEMA: Final = (
    "id STRING, topic STRING, group STRING, attempt BIGINT, possible_duplicate BOOLEAN, "
    "deliver_at_ms BIGINT, delivered_at_ms BIGINT, received_ms BIGINT, node STRING, "
    "consumer STRING")


def read_receipts(spark: SparkSession, folder: Path) -> DataFrame:
    """Every receipt under ``folder`` (none if it holds no ``.jsonl`` file)."""
    paths = sorted(str(path) for path in folder.rglob("*.jsonl"))
    if not paths:
        return spark.createDataFrame(spark.sparkContext.emptyRDD(), RECEIPT_SCHEMA)
    return (spark.read.schema(RECEIPT_SCHEMA).option("mode", "DROPMALFORMED").json(paths)
            .withColumn("group", F.coalesce("group", F.lit(""))))


def receipt_figures(receipts: DataFrame, sent: DataFrame, judging: Judging,
                    max_ids: int) -> dict[str, Any]:
    """The ``receipts`` section of the summary. ``sent``: the ledgers' ``sent`` rows."""
    order = Window.partitionBy("id", "group").orderBy("received_ms", "attempt")
    numbered = receipts.withColumn("number", F.row_number().over(order))
    repeats = numbered.filter(F.col("number") > 1).withColumn(
        "flagged", F.coalesce("possible_duplicate", F.lit(False))
        | (F.coalesce("attempt", F.lit(1)) > 1))
    counts = receipts.agg(F.count("*").alias("receipts"),
                          F.count_distinct("id", "group").alias("received")).first()
    dup = repeats.agg(F.count_if("flagged").alias("flagged"),
                      F.count_if(~F.col("flagged")).alias("unflagged")).first()
    due_by = judging.horizon_ms - judging.grace_ms
    lost = (sent.filter(F.col("time_ms") <= due_by).select("shard", "id", "group").distinct()
            .join(receipts.select("id", "group"), ["id", "group"], "left_anti"))
    lost_count = lost.count()
    unflagged = repeats.filter(~F.col("flagged")).withColumn("shard", F.lit(0))
    return {
        "receipts": counts["receipts"] if counts else 0,
        "received": counts["received"] if counts else 0,
        "lost_at_consumer": {
            "count": lost_count,
            "ids": _flat(first_per_shard(lost, label(), max_ids), max_ids)},
        "duplicates": {
            "total": (dup["flagged"] + dup["unflagged"]) if dup else 0,
            "flagged": dup["flagged"] if dup else 0,
            "unflagged": dup["unflagged"] if dup else 0,
            "unflagged_ids": first_per_shard(unflagged, label(), max_ids).get(0, [])},
    }


def _flat(per_shard: dict[int, list[str]], limit: int) -> list[str]:
    return sorted(name for names in per_shard.values() for name in names)[:limit]
