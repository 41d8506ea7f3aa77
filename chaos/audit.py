"""``python -m tickwheel.chaos.audit OUT_DIR``: did every message arrive, once, on time?

Reads the logs a chaos run left in ``OUT_DIR`` (``run.json``, ``scheduled.jsonl``,
``cancels.jsonl``, ``reschedules.jsonl``, ``received.jsonl``, ``leaders.jsonl``,
``faults.jsonl``, and the nodes' ledgers as ``tickwheel ledger fetch`` lays them out,
``ledgers/shard-<s>/<node>/*.parquet``) with PySpark,
writes ``OUT_DIR/audit/summary.json``, ``report.md`` and two plots (`tickwheel.chaos.report`),
and exits 0 when the verdict is clean, 1 when it is not. Also ``spark-submit chaos/audit.py
OUT_DIR``. Missing or empty ``.jsonl`` files are no rows; lines that are not JSON (a killed
writer's torn last line) are skipped. Times are Unix ms on the runner's machine, except
``delivered_at_ms`` and a ledger's ``time_ms`` (the cluster's time the sending leader read).

What is owed, lost, a duplicate or a false alarm is defined in `tickwheel.chaos.deliveries`;
the figures built on them:

- **lateness_ms** of first receipts: ``received_ms - max(deliver_at_ms, acked_ms or sent_ms)``, so
  a message scheduled already due is judged from when it was accepted (``deliver_at_ms`` is the
  receipt's: a moved message's new time). ``p50`` and ``p99`` are exact nearest-rank
  percentiles (the smallest lateness that at least that share of first receipts does not
  exceed).
- **groups**: per ``topic/group`` owed: ``owed``, ``received``, ``lost``, duplicates by class,
  ``false_alarms`` and the lateness ``p99``; ``idle``: per idle topic, messages ``acked`` and
  ``received`` (nobody reads it: received is 0).
- **races**: the cancels and reschedules the runner sent just before due (``raced``), by
  outcome, and how long their answers took (``answer_ms`` p50, p99, max).
- **failovers** (from ``leaders.jsonl``), of each shard: an entry naming a leader other than
  the last leader of the shard named before it, or the same leader in a later term after an
  entry naming none (every node restarted and the old leader won again); the run's first
  leader of a shard is no failover. For each: its ``shard``, ``old_leader``,
  ``new_leader``, ``term``, ``at_ms`` (when the runner saw the new leader); ``lost_at_ms``, the
  first entry after the last one naming the old leader, or, when that is the failover itself,
  the start of the latest fault started after that entry and no later than the failover, else
  the failover's ``at_ms``; ``no_leader_ms = at_ms - lost_at_ms``; ``first_delivery_ms``, from
  ``lost_at_ms`` to the first ``sent`` ledger row of the new leader (by node name) in the
  leadership the failover begins (its term or later, before the shard's next failover's);
  ``delivery_gap_ms``, from the old leader's last ``sent`` ledger row in the terms of
  the leadership the failover ends (from the term the runner first saw it lead in, since the
  failover before, to before the failover's term) to that same first delivery of the new
  leader: how long nothing was delivered. A leadership that delivered nothing before it was
  deposed has no gap of its own (it counts as ``undelivered``) and hands its start on: the
  next failover's gap runs from the last delivery before it (`gaps_in_turn`); the first
  failover's, with none, from ``lost_at_ms``;
  ``catch_up_ms``, from the new leader's first ``dispatch_started``
  (its ``time_ms``) in a term >= the failover's to the first delivery of that term at most
  `CAUGHT_UP_MS` after its due time; ``duplicates``, by class, received in ``[lost_at_ms, the
  shard's next failover's lost_at_ms)``, of messages of the shard; ``fault``, the latest
  fault of the shard started at or before ``lost_at_ms``. The delivery figures are null when
  the ledgers have no such row.
- **per_fault**: the failovers by the fault blamed (``none`` for none): how many, how many the
  new leader never delivered after (``undelivered``), and the nearest-rank p50, p99 and max of
  ``no_leader_ms`` and ``delivery_gap_ms``.
- **shards** (several shards only): per shard, by the shard of each message's id: deliveries
  ``owed``, ``received`` and ``lost``, ``unflagged`` duplicates, receipts ``delivered_early``,
  the lateness ``p99`` of first receipts, its ``failovers`` and their ``delivery_gap_ms``.
- **burst** (a run with one, `tickwheel.chaos.burst_audit`): its deliveries owed, received
  and lost, how long it took to drain, and the other topics' lateness p50, p99 and max (and
  per group) while it drained.
- **verdict**: ``clean`` iff nothing is lost, no duplicate is unflagged, nothing arrived early,
  nothing was delivered after a ``cancelled`` answer or contrary to a ``rescheduled`` one; else
  ``dirty``. Judged by the client logs alone.
- **ledgers**: the production audit of the run's ledgers alone (`tickwheel.audit`,
  docs/audit.md; its own ``verdict``), to the horizon ``lost_cutoff_ms + grace_ms``: what
  the cluster says it did, beside what the runner saw.

The summary (`audit` returns it; ``--json`` prints it)::

    {"verdict": "clean" | "dirty",
     "run": {started_ms, ended_ms, seed, grace_ms, allowed_early_ms, drained_due_ms, groups,
             idle_topics},
     "messages": {scheduled, acked, cancelled, rescheduled, owed, received_unique, receipts},
     "lost": {count, ids},
     "duplicates": {total, flagged, redelivery, unflagged, after_ack},  # receipts
     "false_alarms": count, "false_alarms_unsent": count,
     "cancelled_but_delivered": count, "contrary_to_reschedule": count of receipts,
     "delivered_early": count of receipts,
     "lateness_ms": {p50, p99, max},
     "groups": {"topic/group": {owed, received, lost, flagged, redelivery, unflagged,
                                false_alarms, p99}},
     "idle": {topic: {acked, received}},
     "races": {cancels: {outcome: count}, reschedules: {outcome: count},
               answer_ms: {p50, p99, max}},
     "failovers": [{shard, old_leader, new_leader, term, at_ms, lost_at_ms, no_leader_ms,
                    first_delivery_ms, delivery_gap_ms, catch_up_ms,
                    duplicates: {total, flagged, redelivery, unflagged}, false_alarms,
                    false_alarms_unsent,
                    fault: {fault, node} | null}],
     "per_fault": {fault: {failovers, undelivered, no_leader_ms: {p50, p99, max},
                           delivery_gap_ms: {p50, p99, max}}},
     "shards": {shard: {owed, received, lost, unflagged, delivered_early, p99, failovers,
                        delivery_gap_ms: {p50, p99, max}}},  # several shards only
     "burst": {topic, messages, acked, owed, received, lost, at_ms, due_ms, scheduling_ms,
               drained_ms, others_messages, others_p50_ms, others_p99_ms, others_max_ms,
               others_groups: {"topic/group": {messages, p99, max}},
               faults: [{fault, node, started_ms}], failovers} | null,
     "faults": [{fault, node, started_ms, ended_ms, detail}],
     "examples": {unflagged_duplicates, cancelled_but_delivered, contrary_to_reschedule,
                  delivered_early},  # ids
     "ledgers": the production audit's summary (docs/audit.md)}

Counts are of messages (distinct ids) where a message is meant (``scheduled``, ``acked``,
``cancelled``, ``rescheduled``, ``cancelled_but_delivered``), of deliveries (distinct
``(id, group)``) for ``owed``, ``received_unique``, ``lost`` and the false alarms, and of
receipts where marked; id lists (``lost.ids`` and the
``examples``) are sorted and hold at most `MAX_IDS`. ``scheduled`` counts ids (a retried schedule
logged twice counts once, acked if any attempt was). ``--grace-ms`` and ``--allowed-early-ms``
override ``run.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from tickwheel.audit import build_session, jvm_output_to_stderr
from tickwheel.chaos import deliveries, report
from tickwheel.chaos.aggregates import only_row, percentile, spread
from tickwheel.chaos.burst_audit import burst_figures
from tickwheel.chaos.deliveries import CLASSES, DELIVERY
from tickwheel.chaos.failovers import (
    Failover,
    Fault,
    LeaderChange,
    Leadership,
    catch_up_ms,
    failover_index,
    find_failovers,
    first_delivery_ms,
    gaps_in_turn,
    leaderships,
    per_fault,
    percentiles,
)
from tickwheel.chaos.run_logs import Logs, Run, ledger_audit, load_logs, read_run

MAX_IDS = 50
"""At most this many example ids per problem class in the summary."""

# -- the audit ---------------------------------------------------------------------------------

def audit(spark: SparkSession, out_dir: Path, grace_ms: int | None = None,
          allowed_early_ms: int | None = None) -> dict[str, Any]:
    """The summary of the run logged in ``out_dir`` (the module docstring has its shape), with
    the production audit of its ledgers; writes nothing."""
    run = read_run(out_dir, grace_ms, allowed_early_ms)
    return summarize(load_logs(spark, out_dir, run)) | {
        "ledgers": ledger_audit(spark, out_dir, run)}


def summarize(logs: Logs) -> dict[str, Any]:
    """Every figure of the summary, from the loaded logs."""
    run = logs.run
    messages = deliveries.messages(logs.scheduled)
    cancels = deliveries.cancels(logs.cancels)
    moves = deliveries.moves(logs.reschedules)
    owed = deliveries.owed(run, messages, moves)
    placed = _placement(logs.scheduled)
    receipts = deliveries.ordered_receipts(logs.received).join(
        deliveries.sends(logs.ledger), list(DELIVERY), "left").join(placed, "id", "left")
    duplicates = receipts.filter(F.col("duplicate"))
    first = deliveries.first_receipts(receipts, messages)
    lost = deliveries.lost(run, owed, cancels, logs.received)
    faults = [Fault(**row.asDict()) for row in logs.faults.orderBy("started_ms").collect()]
    changes = [LeaderChange(**row.asDict())
               for row in logs.leaders.orderBy("at_ms", "term").collect()]
    failovers = find_failovers(changes, faults)
    duplicate_counts, unflagged_ids = _duplicate_counts(duplicates)
    late_cancels = _problem(deliveries.cancelled_but_delivered(cancels, logs.received))
    contrary = _problem(deliveries.contrary_to_reschedule(run, moves, logs.received))
    early_receipts = deliveries.delivered_early(run, logs.received)
    early = _problem(early_receipts)
    failover_figures = _failover_figures(failovers, leaderships(logs.ledger), receipts)
    summary: dict[str, Any] = {
        "run": dataclasses.asdict(run),
        "messages": _message_counts(messages, cancels, moves, owed, logs.received),
        "lost": _problem(lost.select(deliveries.label().alias("id"))),
        "duplicates": duplicate_counts,
        "false_alarms": receipts.filter(deliveries.false_alarm()).count(),
        "false_alarms_unsent": receipts.filter(deliveries.unsent_alarm()).count(),
        "cancelled_but_delivered": late_cancels["count"],
        "contrary_to_reschedule": contrary["count"],
        "delivered_early": early["count"],
        "lateness_ms": spread(first),
        "groups": _per_group(owed, receipts, first, lost),
        "idle": _idle(run, messages, logs.received),
        "races": _races(logs.cancels, logs.reschedules),
        "failovers": failover_figures,
        "per_fault": per_fault(failover_figures),
        "shards": _per_shard(run, placed, owed, receipts, first, lost, early_receipts,
                             failover_figures),
        "burst": burst_figures(run, messages, owed, first, lost, faults, failover_figures),
        "faults": [dataclasses.asdict(fault) for fault in faults],
        "examples": {"unflagged_duplicates": unflagged_ids,
                     "cancelled_but_delivered": late_cancels["ids"],
                     "contrary_to_reschedule": contrary["ids"],
                     "delivered_early": early["ids"]},
    }
    return {"verdict": verdict(summary), **summary}


def verdict(summary: dict[str, Any]) -> str:
    """``clean`` iff no promise was broken (the ``verdict`` above), else ``dirty``."""
    broken = (summary["lost"]["count"], summary["duplicates"]["unflagged"],
              summary["delivered_early"], summary["cancelled_but_delivered"],
              summary["contrary_to_reschedule"])
    return "dirty" if any(broken) else "clean"


def lateness_points(logs: Logs, max_points: int = 100_000) -> list[tuple[int, int]]:
    """``(received_ms, lateness_ms)`` of first receipts, by receipt time, for the plot; a seeded
    sample of about ``max_points`` when there are more."""
    first = deliveries.first_receipts(deliveries.ordered_receipts(logs.received),
                                      deliveries.messages(logs.scheduled))
    count = first.count()
    if count > max_points:
        first = first.sample(fraction=max_points / count, seed=0)
    rows = first.select("received_ms", "lateness_ms").orderBy("received_ms").collect()
    return [(row.received_ms, row.lateness_ms) for row in rows]


def _message_counts(messages: DataFrame, cancels: DataFrame, moves: DataFrame, owed: DataFrame,
                    received: DataFrame) -> dict[str, int]:
    """The ``messages`` figures, in one Spark job."""
    counts = (messages.agg(F.count("*").alias("scheduled"), F.count_if("acked").alias("acked"))
              .crossJoin(cancels.agg(F.count("cancelled_ms").alias("cancelled")))
              .crossJoin(moves.agg(F.count("moved_ms").alias("rescheduled")))
              .crossJoin(owed.agg(F.count("*").alias("owed")))
              .crossJoin(received.agg(F.count_distinct(*DELIVERY).alias("received_unique"),
                                      F.count("*").alias("receipts"))))
    return only_row(counts).asDict()


def _problem(ids: DataFrame) -> dict[str, Any]:
    """``{"count": rows, "ids": the first MAX_IDS distinct ids, sorted}``."""
    row = only_row(ids.agg(F.count("*").alias("count"), _first_ids(F.col("id")).alias("ids")))
    return {"count": row["count"], "ids": row["ids"]}


def _first_ids(ids: Column) -> Column:
    """The first `MAX_IDS` distinct non-null values of ``ids``, sorted."""
    return F.slice(F.array_sort(F.collect_set(ids)), 1, MAX_IDS)


def _duplicate_counts(duplicates: DataFrame) -> tuple[dict[str, int], list[str]]:
    """The ``duplicates`` figures, and example ids of unflagged duplicates."""
    unflagged = F.col("class") == CLASSES[2]
    row = only_row(duplicates.agg(
        F.count("*").alias("total"),
        *(F.count_if(F.col("class") == name).alias(name) for name in CLASSES),
        F.count_if("after_ack").alias("after_ack"),
        _first_ids(F.when(unflagged, F.col("id"))).alias("unflagged_ids"))).asDict()
    unflagged_ids = row.pop("unflagged_ids")
    return row, unflagged_ids


def _per_group(owed: DataFrame, receipts: DataFrame, first: DataFrame,
               lost: DataFrame) -> dict[str, dict[str, int | None]]:
    """The ``groups`` figures, keyed ``topic/group``."""
    keys = ["topic", "group"]
    duplicate = F.col("duplicate")
    counts = (
        owed.groupBy(*keys).agg(F.count("*").alias("owed"))
        .join(receipts.groupBy(*keys).agg(
            F.count_distinct("id").alias("received"),
            *(F.count_if(duplicate & (F.col("class") == name)).alias(name) for name in CLASSES),
            F.count_if(deliveries.false_alarm()).alias("false_alarms")), keys, "full")
        .join(first.groupBy(*keys).agg(percentile("lateness_ms", 0.99).alias("p99")), keys,
              "left")
        .join(lost.groupBy(*keys).agg(F.count("*").alias("lost")), keys, "left"))
    figures = ("owed", "received", "lost", *CLASSES, "false_alarms")
    return {f"{row.topic}/{row.group}": {name: row[name] or 0 for name in figures}
            | {"p99": row.p99}
            for row in counts.orderBy(*keys).collect()}


def _idle(run: Run, messages: DataFrame, received: DataFrame) -> dict[str, dict[str, int]]:
    """Per idle topic: messages acked, and receipts (nobody reads it)."""
    if not run.idle_topics:
        return {}
    acked = {row.topic: row["count"] for row in messages.filter(
        F.col("acked") & F.col("topic").isin(*run.idle_topics)).groupBy("topic").count().collect()}
    got = {row.topic: row["count"] for row in received.filter(
        F.col("topic").isin(*run.idle_topics)).groupBy("topic").count().collect()}
    return {topic: {"acked": acked.get(topic, 0), "received": got.get(topic, 0)}
            for topic in run.idle_topics}


def _races(cancels: DataFrame, reschedules: DataFrame) -> dict[str, Any]:
    """The ``races`` figures: raced calls by outcome, and their answer times."""
    raced = cancels.filter(F.coalesce("raced", F.lit(False)))
    outcomes = {name: {row.outcome: row["count"]
                       for row in frame.groupBy("outcome").count().collect()}
                for name, frame in (("cancels", raced), ("reschedules", reschedules))}
    answers = (raced.select("sent_ms", "done_ms")
               .unionByName(reschedules.select("sent_ms", "done_ms"))
               .select((F.col("done_ms") - F.col("sent_ms")).alias("answer_ms")))
    return outcomes | {"answer_ms": spread(answers, "answer_ms")}


def _failover_figures(failovers: list[Failover], terms: list[Leadership],
                      receipts: DataFrame) -> list[dict[str, Any]]:
    per_failover = _duplicates_per_failover(failovers, receipts)
    gaps = gaps_in_turn(failovers, terms)
    return [{"shard": failover.shard,
             "old_leader": failover.old_leader, "new_leader": failover.new_leader,
             "term": failover.term, "at_ms": failover.at_ms, "lost_at_ms": failover.lost_at_ms,
             "no_leader_ms": failover.at_ms - failover.lost_at_ms,
             "first_delivery_ms": first_delivery_ms(failover, terms, until_term),
             "delivery_gap_ms": gap,
             "catch_up_ms": catch_up_ms(failover, terms, until_term),
             "duplicates": {key: counts[key] for key in ("total", *CLASSES)},
             "false_alarms": counts["false_alarms"],
             "false_alarms_unsent": counts["false_alarms_unsent"],
             "fault": None if failover.fault is None else {"fault": failover.fault.fault,
                                                           "node": failover.fault.node}}
            for failover, counts, (gap, until_term)
            in zip(failovers, per_failover, gaps, strict=True)]


def _duplicates_per_failover(failovers: list[Failover],
                             receipts: DataFrame) -> list[dict[str, int]]:
    """Duplicates by class, their total, and false alarms (all, and unsent), received in each
    failover's window ``[lost_at_ms, the next one's)``."""
    counts = [{"total": 0, "false_alarms": 0, "false_alarms_unsent": 0,
               **dict.fromkeys(CLASSES, 0)} for _ in failovers]
    kind = (F.when(F.col("duplicate"), F.col("class"))
            .when(deliveries.unsent_alarm(), F.lit("unsent"))
            .when(deliveries.false_alarm(), F.lit("sent")))
    marked = receipts.withColumn("kind", kind).filter(F.col("kind").isNotNull())
    for shard in sorted({failover.shard for failover in failovers}):
        numbers = [n for n, failover in enumerate(failovers) if failover.shard == shard]
        _count_per_failover(marked.filter(F.col("shard") == shard),
                            [failovers[n] for n in numbers], [counts[n] for n in numbers])
    return counts


def _count_per_failover(marked: DataFrame, failovers: list[Failover],
                        counts: list[dict[str, int]]) -> None:
    """Add one shard's ``marked`` receipts to the ``counts`` of its ``failovers`` (in time
    order) whose windows hold them."""
    rows = (marked.groupBy(failover_index(failovers).alias("failover"), "kind").count()
            .filter(F.col("failover").isNotNull()).collect())
    for row in rows:
        figures = counts[row.failover]
        if row.kind in CLASSES:
            figures[row.kind] += row["count"]
            figures["total"] += row["count"]
        else:
            figures["false_alarms"] += row["count"]
            if row.kind == "unsent":
                figures["false_alarms_unsent"] += row["count"]


def _placement(scheduled: DataFrame) -> DataFrame:
    """``id`` and ``shard``: the shard each scheduled id belongs to (0 in the logs of runs
    before shards)."""
    return (scheduled.groupBy("id")
            .agg(F.coalesce(F.first("shard", ignorenulls=True), F.lit(0)).alias("shard")))


def _per_shard(run: Run, placed: DataFrame, owed: DataFrame, receipts: DataFrame,
               first: DataFrame, lost: DataFrame, early: DataFrame,
               failovers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """In a cluster of several shards, per shard (``placed``: each id's): deliveries
    ``owed``, ``received`` (distinct) and ``lost``, ``unflagged`` duplicates, receipts
    ``delivered_early``, the ``p99`` lateness of first receipts, its ``failovers`` and their
    ``delivery_gap_ms``; empty for one shard."""
    if run.shards == 1:
        return {}

    def by_shard(frame: DataFrame, figure: Column) -> dict[int, Any]:
        if "shard" not in frame.columns:
            frame = frame.join(placed, "id", "left")
        return {row.shard: row.figure
                for row in frame.groupBy("shard").agg(figure.alias("figure")).collect()}
    counts = {"owed": by_shard(owed, F.count("*")),
              "received": by_shard(receipts, F.count_distinct(*DELIVERY)),
              "lost": by_shard(lost, F.count("*")),
              "unflagged": by_shard(receipts.filter(F.col("duplicate")),
                                    F.count_if(F.col("class") == CLASSES[2])),
              "delivered_early": by_shard(early, F.count("*")),
              "p99": by_shard(first, percentile("lateness_ms", 0.99))}
    return {str(number): {name: figures.get(number, None if name == "p99" else 0)
                          for name, figures in counts.items()}
            | {"failovers": sum(f["shard"] == number for f in failovers),
               "delivery_gap_ms": percentiles([f["delivery_gap_ms"] for f in failovers
                                               if f["shard"] == number
                                               and f["delivery_gap_ms"] is not None])}
            for number in range(run.shards)}


# -- the command -------------------------------------------------------------------------------

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
    with jvm_output_to_stderr():
        spark = build_session(args.master, app="tickwheel-chaos-audit")
        try:
            logs = load_logs(spark, args.out_dir, run)
            summary = summarize(logs) | {"ledgers": ledger_audit(spark, args.out_dir, run)}
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
