"""The audit's figures of a run's burst (``run.json``'s ``burst``): did every message of it
arrive, how long it took to drain, and how late everybody else was meanwhile.

A burst is N messages of one topic all due at one time (`tickwheel.chaos.burst`); the
promise it tests is that one topic's backlog leaves room for the others (docs/wheel.md, "Fair
takes"). Its figures, ``summary["burst"]`` (None for a run without one):

- ``topic``, ``messages`` (asked for), ``acked`` (accepted), ``owed``, ``received`` and
  ``lost``: its deliveries, counted as every other topic's (`tickwheel.chaos.deliveries`);
- ``at_ms`` and ``due_ms``: when its scheduling began, and when every message of it was due;
  ``scheduling_ms``, how long scheduling took (None if it did not end);
- ``drained_ms``: from ``due_ms`` to the last first receipt of the burst's messages;
- ``others_*``: the first receipts of every other topic's messages whose lateness counts from
  within the burst (the later of their due time and their acceptance, as ``lateness_ms``
  counts it, from ``due_ms`` to the burst's last first receipt): ``others_messages``, and the
  exact nearest-rank ``others_p50_ms`` and ``others_p99_ms`` of their lateness, and its
  ``others_max_ms``; ``others_sent_p99_ms`` and ``others_sent_max_ms``, the same of the
  leader's sending alone (the receipt's ``delivered_at_ms``, the leader's cluster time, minus
  where lateness counts from): a consumer's own queue is not in it (the workload's slow
  consumers, 20-150 ms a message with 32 on their way, hold up to 3 s of them at any time);
  ``others_groups``, per ``topic/group``: ``messages``, ``p99``, ``max`` and ``sent_p99``;
  ``others_seconds``, their ``messages``, ``p50``, ``p99`` and ``max`` lateness apart for
  those due within the burst's own second (``its_second``: the wheel files them in the same
  chain as the burst, docs/wheel.md) and those due after it (``later``);
- ``faults``: the faults that overlapped the burst, from its scheduling to its last receipt
  (``fault``, ``node``, ``started_ms``), and ``failovers``, the failovers seen then.

Without any first receipt of the burst, ``drained_ms`` and the ``others_*`` figures are None.
`tickwheel.chaos.audit` calls `burst_figures`; the verdict is the audit's as ever (a lost or
unflagged burst message makes the run dirty like any other).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tickwheel.chaos.aggregates import only_row, percentile, spread
from tickwheel.chaos.failovers import Fault
from tickwheel.chaos.run_logs import BurstPlan, Run


def burst_figures(run: Run, messages: DataFrame, owed: DataFrame, first: DataFrame,
                  lost: DataFrame, faults: list[Fault],
                  failovers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``burst`` figures (the module docstring's), from the audit's frames: one row per
    scheduled id (``messages``), per delivery owed (``owed``) and lost (``lost``), and per
    first receipt with its ``lateness_ms`` and ``accepted_ms`` (``first``)."""
    plan = run.burst
    if plan is None:
        return None
    in_burst = F.col("topic") == plan.topic
    counts = only_row(
        messages.filter(in_burst).agg(F.count_if("acked").alias("acked"))
        .crossJoin(owed.filter(in_burst).agg(F.count("*").alias("owed")))
        .crossJoin(first.filter(in_burst).agg(F.count("*").alias("received"),
                                              F.max("received_ms").alias("last_ms")))
        .crossJoin(lost.filter(in_burst).agg(F.count("*").alias("lost")))).asDict()
    last_ms: int | None = counts.pop("last_ms")
    until_ms = run.ended_ms if last_ms is None else last_ms
    return {"topic": plan.topic, "messages": plan.messages, **counts,
            "at_ms": plan.at_ms, "due_ms": plan.due_ms,
            "scheduling_ms": (None if plan.scheduled_ms is None
                              else plan.scheduled_ms - plan.at_ms),
            "drained_ms": None if last_ms is None else last_ms - plan.due_ms,
            **_others(plan, first.filter(~in_burst), last_ms),
            "faults": [{"fault": fault.fault, "node": fault.node,
                        "started_ms": fault.started_ms} for fault in faults
                       if fault.started_ms <= until_ms
                       and (fault.ended_ms is None or fault.ended_ms >= plan.at_ms)],
            "failovers": sum(plan.at_ms <= failover["at_ms"] <= until_ms
                             for failover in failovers)}


def _others(plan: BurstPlan, others: DataFrame, last_ms: int | None) -> dict[str, Any]:
    """The ``others_*`` figures: other topics' first receipts whose lateness counts from
    within ``[due_ms, last_ms]``."""
    if last_ms is None:
        return {"others_messages": 0, **dict.fromkeys(
            ("others_p50_ms", "others_p99_ms", "others_max_ms", "others_sent_p99_ms",
             "others_sent_max_ms")), "others_groups": {}, "others_seconds": {}}
    ready_ms = F.greatest("deliver_at_ms", "accepted_ms")
    during = (others.filter(ready_ms.between(plan.due_ms, last_ms))
              .withColumn("send_lateness_ms", F.col("delivered_at_ms") - ready_ms))
    received, sent = spread(during), spread(during, "send_lateness_ms")
    in_its_second = ready_ms < (plan.due_ms // 1000 + 1) * 1000
    groups = (during.groupBy("topic", "group")
              .agg(F.count("*").alias("messages"), percentile("lateness_ms", 0.99).alias("p99"),
                   F.max("lateness_ms").alias("max"), percentile("send_lateness_ms", 0.99)
                   .alias("sent_p99"))
              .orderBy("topic", "group").collect())
    return {"others_messages": sum(row.messages for row in groups),
            "others_p50_ms": received["p50"], "others_p99_ms": received["p99"],
            "others_max_ms": received["max"], "others_sent_p99_ms": sent["p99"],
            "others_sent_max_ms": sent["max"],
            "others_groups": {f"{row.topic}/{row.group}": {
                "messages": row.messages, "p99": row.p99, "max": row.max,
                "sent_p99": row.sent_p99} for row in groups},
            "others_seconds": {name: {"messages": part.count(), **spread(part)}
                               for name, part in (("its_second", during.filter(in_its_second)),
                                                  ("later", during.filter(~in_its_second)))}}
