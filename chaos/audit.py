"""``python -m tickwheel.chaos.audit OUT_DIR``: did every message arrive, once, on time?

Reads the logs a chaos run left in ``OUT_DIR`` (``run.json``, ``scheduled.jsonl``,
``cancels.jsonl``, ``received.jsonl``, ``journals/<node>.<generation>.jsonl``,
``leaders.jsonl``, ``faults.jsonl``) with PySpark, writes ``OUT_DIR/audit/summary.json``,
``report.md`` and two plots (`tickwheel.chaos.report`), and exits 0 when the verdict is clean, 1
when it is not. Also ``spark-submit chaos/audit.py OUT_DIR``. Missing or empty ``.jsonl`` files
are no rows; lines that are not JSON (a killed writer's torn last line) are skipped. Times are
Unix ms on the harness machine, except ``delivered_at_ms`` (the sending leader's clock).

The definitions, which the chaos CI test relies on:

- **lost**: scheduled and acked (``acked`` true; a message whose schedule call failed is never
  counted lost, since it may or may not exist), not cancelled (no cancel with outcome
  ``cancelled``, ``already_cancelled`` (a retried cancel whose first try got it) or
  ``unknown``), due by the cutoff, and never received. The cutoff is ``ended_ms - grace_ms``,
  and no later than ``drained_due_ms`` when ``run.json`` has it: the harness drains delivery
  until every message due by the end of production has arrived, and a message due after that
  may still sit, delivered, in a slow consumer's queue when the run ends.
  Must be 0.
- **duplicates**: every receipt of an id but its original: the first *plain* receipt
  (``possible_duplicate`` false and ``attempt`` 1) if there is one, else the first by
  ``received_ms``. Each is ``flagged`` (``possible_duplicate``), else a ``redelivery``
  (``attempt`` > 1: the consumer is told it is a retry), else ``unflagged`` (a second plain
  receipt: the consumer could not tell, a bug). ``after_ack`` counts the
  duplicates whose previous receipt had been acknowledged by the consumer.
- **cancelled_but_delivered**: messages with a cancel of outcome ``cancelled`` or
  ``already_cancelled`` and a receipt with
  ``received_ms`` after that cancel's ``done_ms``.
- **delivered_early**: receipts with ``received_ms < deliver_at_ms - allowed_early_ms``.
- **lateness_ms** of first receipts: ``received_ms - max(deliver_at_ms, acked_ms or sent_ms)``, so
  a message scheduled already due is judged from when it was accepted. ``p50`` and ``p99`` are
  exact nearest-rank percentiles (the smallest lateness that at least that share of first
  receipts does not exceed).
- **failovers** (from ``leaders.jsonl``): an entry naming a leader other than the last leader
  named before it (the run's first leader is no failover). For each: ``old_leader``,
  ``new_leader``, ``term``, ``at_ms`` (when the harness saw the new leader); ``lost_at_ms``, the
  first entry after the last one naming the old leader, or, when that is the failover itself,
  the start of the latest fault started after that entry and no later than the failover, else
  the failover's ``at_ms``; ``no_leader_ms = at_ms - lost_at_ms``; ``first_delivery_ms``, from
  ``lost_at_ms`` to the first ``delivered`` journal event of the new leader (by node name) in the
  failover's term or later; ``catch_up_ms``, from the new leader's first ``dispatch_started``
  (``takeover_ms``) in a term >= the failover's to the first delivery of that term at most
  `CAUGHT_UP_MS` after its due time; ``duplicates``, by class, received in ``[lost_at_ms, the
  next failover's lost_at_ms)``; ``fault``, the latest fault started at or before
  ``lost_at_ms``. Both delivery figures are null when the journals have no such event.
- **verdict**: ``clean`` iff nothing is lost, no duplicate is unflagged and nothing arrived early;
  else ``dirty``.

The summary (`audit` returns it; ``--json`` prints it)::

    {"verdict": "clean" | "dirty",
     "run": {started_ms, ended_ms, seed, grace_ms, allowed_early_ms},
     "messages": {scheduled, acked, cancelled, received_unique, receipts},
     "lost": {count, ids},
     "duplicates": {total, flagged, redelivery, unflagged, after_ack},  # receipts
     "cancelled_but_delivered": count, "delivered_early": count of receipts,
     "lateness_ms": {p50, p99, max},
     "failovers": [{old_leader, new_leader, term, at_ms, lost_at_ms, no_leader_ms,
                    first_delivery_ms, catch_up_ms,
                    duplicates: {total, flagged, redelivery, unflagged},
                    fault: {fault, node} | null}],
     "faults": [{fault, node, started_ms, ended_ms, detail}],
     "examples": {unflagged_duplicates, cancelled_but_delivered, delivered_early}}  # ids

Counts are of messages (distinct ids) unless marked receipts; id lists (``lost.ids`` and the
``examples``) are sorted and hold at most `MAX_IDS`. ``scheduled`` counts ids (a retried schedule
logged twice counts once, acked if any attempt was). ``--grace-ms`` and ``--allowed-early-ms``
override ``run.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tickwheel.chaos import report

MAX_IDS = 50
"""At most this many example ids per problem class in the summary."""
CAUGHT_UP_MS = 100
"""A new leader has caught up once it delivers a message at most this late (its own clock)."""
PERCENTILE_ACCURACY = 10_000_000
"""``percentile_approx`` is exact while there are fewer first receipts than this."""
SHUFFLE_PARTITIONS = 4
"""The logs of one run fit one machine; Spark's default of 200 only adds overhead."""
CLASSES = ("flagged", "redelivery", "unflagged")
"""The duplicate classes, in order of precedence."""
CANCELLED_OUTCOMES = ("cancelled", "already_cancelled")
"""Cancel outcomes that mean the message is cancelled (`tickwheel.client.CancelOutcome`)."""

SCHEDULED_SCHEMA = ("id STRING, topic STRING, deliver_at_ms BIGINT, sent_ms BIGINT, "
                    "acked BOOLEAN, acked_ms BIGINT, handle BIGINT, kind STRING")
CANCELS_SCHEMA = "id STRING, handle BIGINT, sent_ms BIGINT, done_ms BIGINT, outcome STRING"
RECEIVED_SCHEMA = ("id STRING, topic STRING, deliver_at_ms BIGINT, delivered_at_ms BIGINT, "
                   "received_ms BIGINT, attempt BIGINT, possible_duplicate BOOLEAN, "
                   "node STRING, consumer STRING, acked BOOLEAN")
JOURNAL_SCHEMA = ("event STRING, node STRING, term BIGINT, epoch BIGINT, cursor ARRAY<BIGINT>, "
                  "takeover_ms BIGINT, id STRING, topic STRING, handle BIGINT, "
                  "deliver_at_ms BIGINT, delivered_at_ms BIGINT, position ARRAY<BIGINT>, "
                  "possible_duplicate BOOLEAN, attempt BIGINT")
"""``node`` is the Raft address; the audit names nodes by the journal's file name instead."""
LEADERS_SCHEMA = "at_ms BIGINT, leader STRING, term BIGINT"
FAULTS_SCHEMA = "fault STRING, node STRING, started_ms BIGINT, ended_ms BIGINT, detail STRING"
JOURNAL_NAME = r"([^/]+)\.\d+\.jsonl$"
"""``journals/<node name>.<generation>.jsonl``: group 1 is the node's name."""


@dataclass(frozen=True, slots=True)
class Run:
    """``run.json``: the run's window and the tolerances it is judged by."""

    started_ms: int
    ended_ms: int
    seed: int | None
    grace_ms: int
    allowed_early_ms: int
    drained_due_ms: int | None = None
    """What the harness drained for: every message due by then had arrived (or the drain
    timed out). None in runs recorded before the harness wrote it."""

    @property
    def lost_cutoff_ms(self) -> int:
        """Messages due by then must have arrived."""
        cutoff = self.ended_ms - self.grace_ms
        return cutoff if self.drained_due_ms is None else min(cutoff, self.drained_due_ms)


@dataclass(frozen=True, slots=True)
class Logs:
    """One run's logs as DataFrames (journals gain ``node_name``, from the file name)."""

    run: Run
    scheduled: DataFrame
    cancels: DataFrame
    received: DataFrame
    journals: DataFrame
    leaders: DataFrame
    faults: DataFrame


@dataclass(frozen=True, slots=True)
class LeaderChange:
    """A line of ``leaders.jsonl``; ``leader`` is None while the harness sees none."""

    at_ms: int
    leader: str | None
    term: int | None


@dataclass(frozen=True, slots=True)
class Fault:
    """A line of ``faults.jsonl``: what was done to which node (None: the whole cluster)."""

    fault: str
    node: str | None
    started_ms: int
    ended_ms: int | None
    detail: str | None


@dataclass(frozen=True, slots=True)
class Failover:
    """Leadership moved from ``old_leader`` to ``new_leader`` (see the module docstring)."""

    old_leader: str
    new_leader: str
    term: int | None
    at_ms: int
    lost_at_ms: int
    fault: Fault | None


@dataclass(frozen=True, slots=True)
class Leadership:
    """What one node's journals say about one term: when it took over, first delivered, and
    first delivered a message at most `CAUGHT_UP_MS` late (each None if never)."""

    node_name: str
    term: int
    takeover_ms: int | None
    first_delivered_at_ms: int | None
    caught_up_at_ms: int | None


# -- reading -----------------------------------------------------------------------------------

def read_run(out_dir: Path, grace_ms: int | None = None,
             allowed_early_ms: int | None = None) -> Run:
    """``OUT_DIR/run.json``; ``grace_ms`` and ``allowed_early_ms`` override its values when given.
    Raises `OSError` if it is unreadable, `ValueError` if a field is missing."""
    path = out_dir / "run.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in ("started_ms", "ended_ms", "grace_ms", "allowed_early_ms")
               if raw.get(key) is None]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)} (did the run finish?)")
    return Run(started_ms=raw["started_ms"], ended_ms=raw["ended_ms"], seed=raw.get("seed"),
               grace_ms=raw["grace_ms"] if grace_ms is None else grace_ms,
               allowed_early_ms=(raw["allowed_early_ms"] if allowed_early_ms is None
                                 else allowed_early_ms),
               drained_due_ms=raw.get("drained_due_ms"))


def load_logs(spark: SparkSession, out_dir: Path, run: Run) -> Logs:
    """The logs under ``out_dir`` as DataFrames with explicit schemas."""
    journals = _read_jsonl(spark, sorted((out_dir / "journals").glob("*.jsonl")), JOURNAL_SCHEMA)
    return Logs(
        run=run,
        scheduled=_read_jsonl(spark, [out_dir / "scheduled.jsonl"], SCHEDULED_SCHEMA),
        cancels=_read_jsonl(spark, [out_dir / "cancels.jsonl"], CANCELS_SCHEMA),
        received=_read_jsonl(spark, [out_dir / "received.jsonl"], RECEIVED_SCHEMA),
        journals=journals.withColumn(
            "node_name", F.regexp_extract(F.input_file_name(), JOURNAL_NAME, 1)),
        leaders=_read_jsonl(spark, [out_dir / "leaders.jsonl"], LEADERS_SCHEMA),
        faults=_read_jsonl(spark, [out_dir / "faults.jsonl"], FAULTS_SCHEMA))


def _read_jsonl(spark: SparkSession, paths: list[Path], schema: str) -> DataFrame:
    """The JSON lines of those ``paths`` that exist (none: no rows); malformed lines dropped."""
    existing = [str(path) for path in paths if path.is_file()]
    if not existing:
        return spark.createDataFrame(spark.sparkContext.emptyRDD(), schema)
    return spark.read.schema(schema).option("mode", "DROPMALFORMED").json(existing)


# -- the audit ---------------------------------------------------------------------------------

def audit(spark: SparkSession, out_dir: Path, grace_ms: int | None = None,
          allowed_early_ms: int | None = None) -> dict[str, Any]:
    """The summary of the run logged in ``out_dir`` (see the module docstring); writes nothing."""
    return summarize(load_logs(spark, out_dir, read_run(out_dir, grace_ms, allowed_early_ms)))


def summarize(logs: Logs) -> dict[str, Any]:
    """Every figure of the summary, from the loaded logs."""
    messages = _messages(logs.scheduled)
    cancels = _cancels(logs.cancels)
    receipts = _ordered_receipts(logs.received)
    duplicates = receipts.filter(F.col("duplicate"))
    faults = [Fault(**row.asDict()) for row in logs.faults.orderBy("started_ms").collect()]
    changes = [LeaderChange(**row.asDict())
               for row in logs.leaders.orderBy("at_ms", "term").collect()]
    failovers = find_failovers(changes, faults)
    duplicate_counts, unflagged_ids = _duplicate_counts(duplicates)
    late_cancels = _problem(_cancelled_but_delivered(cancels, logs.received))
    early = _problem(_delivered_early(logs.run, logs.received))
    summary: dict[str, Any] = {
        "run": dataclasses.asdict(logs.run),
        "messages": _message_counts(messages, cancels, logs.received),
        "lost": _problem(_lost(logs.run, messages, cancels, logs.received)),
        "duplicates": duplicate_counts,
        "cancelled_but_delivered": late_cancels["count"],
        "delivered_early": early["count"],
        "lateness_ms": _lateness_percentiles(_first_receipts(receipts, messages)),
        "failovers": _failover_figures(failovers, _leaderships(logs.journals), duplicates),
        "faults": [dataclasses.asdict(fault) for fault in faults],
        "examples": {"unflagged_duplicates": unflagged_ids,
                     "cancelled_but_delivered": late_cancels["ids"],
                     "delivered_early": early["ids"]},
    }
    clean = (summary["lost"]["count"] == 0 and summary["duplicates"]["unflagged"] == 0
             and summary["delivered_early"] == 0)
    return {"verdict": "clean" if clean else "dirty", **summary}


def lateness_points(logs: Logs, max_points: int = 100_000) -> list[tuple[int, int]]:
    """``(received_ms, lateness_ms)`` of first receipts, by receipt time, for the plot; a seeded
    sample of about ``max_points`` when there are more."""
    first = _first_receipts(_ordered_receipts(logs.received), _messages(logs.scheduled))
    count = first.count()
    if count > max_points:
        first = first.sample(fraction=max_points / count, seed=0)
    rows = first.select("received_ms", "lateness_ms").orderBy("received_ms").collect()
    return [(row.received_ms, row.lateness_ms) for row in rows]


def _messages(scheduled: DataFrame) -> DataFrame:
    """One row per scheduled id; acked if any attempt to schedule it was."""
    return scheduled.groupBy("id").agg(
        F.min("deliver_at_ms").alias("deliver_at_ms"), F.min("sent_ms").alias("sent_ms"),
        F.bool_or("acked").alias("acked"), F.min("acked_ms").alias("acked_ms"))


def _cancels(cancels: DataFrame) -> DataFrame:
    """One row per id cancels were sent for: ``cancelled_ms``, when the first cancel that
    says it is cancelled returned (None if none did), and ``maybe_cancelled``, true if any
    cancel did or may have (outcome ``unknown``)."""
    outcome = F.col("outcome")
    cancelled = outcome.isin(*CANCELLED_OUTCOMES)
    return cancels.groupBy("id").agg(
        F.min(F.when(cancelled, F.col("done_ms"))).alias("cancelled_ms"),
        F.bool_or(cancelled | (outcome == "unknown")).alias("maybe_cancelled"))


def _ordered_receipts(received: DataFrame) -> DataFrame:
    """Receipts numbered per id in order of arrival (``receipt``, from 1), with the duplicate
    ``class`` (see `CLASSES`) and whether the previous receipt was acked (``after_ack``)."""
    order = Window.partitionBy("id").orderBy("received_ms", "attempt", "possible_duplicate")
    plain = ~F.col("possible_duplicate") & (F.col("attempt") == 1)
    # The original is the first plain receipt if there is one: a consumer may handle an early,
    # unflagged copy after the flagged re-send overtook it (it sat in a slow consumer's
    # buffer), and that is no bug; two plain receipts of one id are.
    original = Window.partitionBy("id").orderBy(plain.desc(), "received_ms", "attempt",
                                                "possible_duplicate")
    return (received
            .withColumn("receipt", F.row_number().over(order))
            .withColumn("duplicate", F.row_number().over(original) > 1)
            .withColumn("after_ack", F.coalesce(F.lag("acked").over(order), F.lit(False)))
            .withColumn("class", F.when(F.col("possible_duplicate"), CLASSES[0])
                        .when(F.col("attempt") > 1, CLASSES[1]).otherwise(CLASSES[2])))


def _first_receipts(receipts: DataFrame, messages: DataFrame) -> DataFrame:
    """First receipts with ``lateness_ms``, judged from the later of the due time and the time
    the schedule was accepted (acked, else sent; just the due time for unknown ids)."""
    accepted = messages.select("id", F.coalesce("acked_ms", "sent_ms").alias("accepted_ms"))
    return (receipts.filter(F.col("receipt") == 1).join(accepted, "id", "left")
            .withColumn("lateness_ms", F.col("received_ms")
                        - F.greatest("deliver_at_ms", "accepted_ms")))


def _message_counts(messages: DataFrame, cancels: DataFrame,
                    received: DataFrame) -> dict[str, int]:
    """The ``messages`` figures, in one Spark job."""
    row = (messages.agg(F.count("*").alias("scheduled"), F.count_if("acked").alias("acked"))
           .crossJoin(cancels.agg(F.count("cancelled_ms").alias("cancelled")))
           .crossJoin(received.agg(F.count_distinct("id").alias("received_unique"),
                                   F.count("*").alias("receipts")))
           .first())
    return row.asDict()


def _lost(run: Run, messages: DataFrame, cancels: DataFrame, received: DataFrame) -> DataFrame:
    """Ids acked, due by the cutoff, not (maybe) cancelled, never received."""
    due = messages.filter(F.col("acked") & (F.col("deliver_at_ms") <= run.lost_cutoff_ms))
    return (due.join(cancels.filter("maybe_cancelled"), "id", "left_anti")
            .join(received, "id", "left_anti").select("id"))


def _cancelled_but_delivered(cancels: DataFrame, received: DataFrame) -> DataFrame:
    """Ids received after a cancel that found them pending had returned."""
    return (received.join(cancels, "id")
            .filter(F.col("received_ms") > F.col("cancelled_ms")).select("id").distinct())


def _delivered_early(run: Run, received: DataFrame) -> DataFrame:
    """Receipts (one row each) more than ``allowed_early_ms`` before their due time."""
    early = F.col("received_ms") < F.col("deliver_at_ms") - run.allowed_early_ms
    return received.filter(early).select("id")


def _problem(ids: DataFrame) -> dict[str, Any]:
    """``{"count": rows, "ids": the first MAX_IDS distinct ids, sorted}``."""
    row = ids.agg(F.count("*").alias("count"), _first_ids(F.col("id")).alias("ids")).first()
    return {"count": row["count"], "ids": row["ids"]}


def _first_ids(ids: Column) -> Column:
    """The first `MAX_IDS` distinct non-null values of ``ids``, sorted."""
    return F.slice(F.array_sort(F.collect_set(ids)), 1, MAX_IDS)


def _duplicate_counts(duplicates: DataFrame) -> tuple[dict[str, int], list[str]]:
    """The ``duplicates`` figures, and example ids of unflagged duplicates."""
    unflagged = F.col("class") == CLASSES[2]
    row = duplicates.agg(F.count("*").alias("total"),
                         *(F.count_if(F.col("class") == name).alias(name) for name in CLASSES),
                         F.count_if("after_ack").alias("after_ack"),
                         _first_ids(F.when(unflagged, F.col("id"))).alias("unflagged_ids")
                         ).first().asDict()
    unflagged_ids = row.pop("unflagged_ids")
    return row, unflagged_ids


def _lateness_percentiles(first: DataFrame) -> dict[str, int | None]:
    """Exact nearest-rank p50 and p99, and the maximum (all None without receipts)."""
    row = first.agg(F.percentile_approx("lateness_ms", [0.5, 0.99], PERCENTILE_ACCURACY)
                    .alias("percentiles"), F.max("lateness_ms").alias("max")).first()
    p50, p99 = row.percentiles or (None, None)
    return {"p50": p50, "p99": p99, "max": row.max}


# -- failovers ---------------------------------------------------------------------------------

def find_failovers(changes: list[LeaderChange], faults: list[Fault]) -> list[Failover]:
    """The failovers in ``changes`` (in time order), each with when leadership was lost and the
    fault blamed; ``faults`` in any order. See the module docstring for the rules."""
    failovers: list[Failover] = []
    named: int | None = None  # index of the latest change that named a leader
    for index, change in enumerate(changes):
        if change.leader is None:
            continue
        if named is not None and change.leader != changes[named].leader:
            lost_at_ms = _lost_at_ms(changes, named, index, faults)
            failovers.append(Failover(
                old_leader=changes[named].leader, new_leader=change.leader, term=change.term,
                at_ms=change.at_ms, lost_at_ms=lost_at_ms, fault=_blamed(faults, lost_at_ms)))
        named = index
    return failovers


def _lost_at_ms(changes: list[LeaderChange], named: int, index: int,
                faults: list[Fault]) -> int:
    """When the old leader (last named at ``changes[named]``) was lost, for the failover at
    ``changes[index]``."""
    if named + 1 < index:
        return changes[named + 1].at_ms
    started = [fault.started_ms for fault in faults
               if changes[named].at_ms < fault.started_ms <= changes[index].at_ms]
    return max(started, default=changes[index].at_ms)


def _blamed(faults: list[Fault], at_ms: int) -> Fault | None:
    """The latest fault started at or before ``at_ms``."""
    return max((fault for fault in faults if fault.started_ms <= at_ms),
               key=lambda fault: fault.started_ms, default=None)


def _leaderships(journals: DataFrame) -> list[Leadership]:
    """Per node name and term, the journal figures a failover is measured by."""
    delivered = F.col("event") == "delivered"
    caught_up = delivered & (F.col("delivered_at_ms") - F.col("deliver_at_ms") <= CAUGHT_UP_MS)
    rows = journals.groupBy("node_name", "term").agg(
        F.min(F.when(F.col("event") == "dispatch_started", F.col("takeover_ms")))
        .alias("takeover_ms"),
        F.min(F.when(delivered, F.col("delivered_at_ms"))).alias("first_delivered_at_ms"),
        F.min(F.when(caught_up, F.col("delivered_at_ms"))).alias("caught_up_at_ms")).collect()
    return [Leadership(**row.asDict()) for row in rows]


def _failover_figures(failovers: list[Failover], leaderships: list[Leadership],
                      duplicates: DataFrame) -> list[dict[str, Any]]:
    per_failover = _duplicates_per_failover(failovers, duplicates)
    return [{"old_leader": failover.old_leader, "new_leader": failover.new_leader,
             "term": failover.term, "at_ms": failover.at_ms, "lost_at_ms": failover.lost_at_ms,
             "no_leader_ms": failover.at_ms - failover.lost_at_ms,
             "first_delivery_ms": _first_delivery_ms(failover, leaderships),
             "catch_up_ms": _catch_up_ms(failover, leaderships),
             "duplicates": counts,
             "fault": None if failover.fault is None else {"fault": failover.fault.fault,
                                                           "node": failover.fault.node}}
            for failover, counts in zip(failovers, per_failover, strict=True)]


def _new_leaderships(failover: Failover, leaderships: list[Leadership]) -> list[Leadership]:
    """The new leader's terms from the failover's on, in term order."""
    term = failover.term or 0
    return sorted((leadership for leadership in leaderships
                   if leadership.node_name == failover.new_leader and leadership.term >= term),
                  key=lambda leadership: leadership.term)


def _first_delivery_ms(failover: Failover, leaderships: list[Leadership]) -> int | None:
    delivered = [leadership.first_delivered_at_ms
                 for leadership in _new_leaderships(failover, leaderships)
                 if leadership.first_delivered_at_ms is not None]
    return min(delivered) - failover.lost_at_ms if delivered else None


def _catch_up_ms(failover: Failover, leaderships: list[Leadership]) -> int | None:
    started = [leadership for leadership in _new_leaderships(failover, leaderships)
               if leadership.takeover_ms is not None]
    if not started or started[0].caught_up_at_ms is None:
        return None
    return started[0].caught_up_at_ms - started[0].takeover_ms


def _duplicates_per_failover(failovers: list[Failover],
                             duplicates: DataFrame) -> list[dict[str, int]]:
    """Duplicates by class received in each failover's window ``[lost_at_ms, the next one's)``."""
    counts = [{"total": 0, **dict.fromkeys(CLASSES, 0)} for _ in failovers]
    if not failovers:
        return counts
    rows = (duplicates.groupBy(_failover_index(failovers).alias("failover"), "class").count()
            .filter(F.col("failover").isNotNull()).collect())
    for row in rows:
        counts[row.failover][row["class"]] += row["count"]
        counts[row.failover]["total"] += row["count"]
    return counts


def _failover_index(failovers: list[Failover]) -> Column:
    """The index of the failover whose window holds ``received_ms`` (null: before the first)."""
    received_ms = F.col("received_ms")
    index = F.lit(None).cast("int")
    for number in reversed(range(len(failovers))):
        inside = received_ms >= failovers[number].lost_at_ms
        if number + 1 < len(failovers):
            inside &= received_ms < failovers[number + 1].lost_at_ms
        index = F.when(inside, number).otherwise(index)
    return index


# -- the command -------------------------------------------------------------------------------

def build_session(master: str | None = None) -> SparkSession:
    """A quiet Spark session sized for one run's logs. Without ``master``, spark-submit's
    applies, else ``local[*]``."""
    builder = (SparkSession.builder.appName("tickwheel-audit")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "WARN")
               .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS)))
    if master is not None:
        builder = builder.master(master)
    return builder.getOrCreate()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tickwheel.chaos.audit",
        description="Audit the delivery logs a chaos run left in OUT_DIR; exit 1 unless clean.")
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="a chaos run's logs")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--grace-ms", type=int, help="override run.json's grace_ms")
    parser.add_argument("--allowed-early-ms", type=int,
                        help="override run.json's allowed_early_ms")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    args = parser.parse_args(argv)
    try:
        run = read_run(args.out_dir, args.grace_ms, args.allowed_early_ms)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    spark = build_session(args.master)
    try:
        logs = load_logs(spark, args.out_dir, run)
        summary = summarize(logs)
        points = lateness_points(logs)
    finally:
        spark.stop()
    report.write_report(args.out_dir / "audit", summary, points)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        report.print_summary(summary)
    return 0 if summary["verdict"] == "clean" else 1


if __name__ == "__main__":
    sys.exit(main())
