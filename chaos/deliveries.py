"""What each consumer group was owed and what it received, as Spark frames: the definitions the
audit (`tickwheel.chaos.audit`) counts, and which the chaos CI test relies on.

- **deliveries owed**: every consumer group is owed every message of its topic. ``run.json``'s
  ``groups`` maps each consumed topic to its groups ("": the default group); a topic it does not
  name (``idle_topics``: written to, never read) is owed to nobody. A run without ``groups``
  owes every topic's messages to its default group. A delivery is a ``(id, group)``; receipts
  without a ``group`` are the default group's. Ids in the summary are ``id`` for the default
  group and ``group/id`` otherwise.
- **moved**: an id whose reschedule answered ``rescheduled`` is owed at that reschedule's
  ``deliver_at_ms`` (the latest answered, if several); one whose reschedule's outcome is
  ``unknown`` at the later of its old and asked times.
- **lost**: owed deliveries of scheduled and acked messages (``acked`` true; a message whose
  schedule call failed is never counted lost, since it may or may not exist), not cancelled (no
  cancel with outcome ``cancelled``, ``already_cancelled`` (a retried cancel whose first try got
  it), ``unknown``, or ``handed_out``: some group had it, and the groups that had not never
  will), due (moved, as above) by the cutoff, and never received in their group.
  The cutoff is ``ended_ms - grace_ms``, and no later than ``drained_due_ms`` when ``run.json``
  has it: the runner drains delivery until every delivery due by the end of production has
  arrived, and one due after that may still sit, delivered, in a slow consumer's queue when the
  run ends. Must be 0.
- **duplicates**: every receipt of a delivery but its original: the first *plain* receipt
  (``possible_duplicate`` false and ``attempt`` 1) if there is one, else the first by
  ``received_ms``. Each is ``flagged`` (``possible_duplicate``), else a ``redelivery``
  (``attempt`` > 1: the consumer is told it is a retry), else ``unflagged`` (a second plain
  receipt: the consumer could not tell, a bug). ``after_ack`` counts the
  duplicates whose previous receipt had been acknowledged by the consumer.
- **false_alarms**: deliveries whose original is flagged ``possible_duplicate``: a first
  receipt that says it may be a repeat. Most were sent before and never handled (they sat in a
  consumer's buffer when its stream broke, or were granted to a receive call whose answer was
  lost); ``false_alarms_unsent`` counts those no ledger shows sent to the group before (fewer
  than two ``delivered`` lines for the delivery): hand-outs a leader committed and died before
  sending, the only false alarms the design allows.
- **cancelled_but_delivered**: messages with a cancel of outcome ``cancelled`` or
  ``already_cancelled`` and a receipt with ``received_ms`` after that cancel's ``done_ms``.
  Must be 0.
- **contrary_to_reschedule**: receipts of a moved message (answered ``rescheduled``) more than
  ``allowed_early_ms`` before its new due time: a delivery at the time the answer said it had
  left. Must be 0. (A move to an earlier time that also delivers at the old one shows as an
  unflagged duplicate.)
- **delivered_early**: receipts with ``received_ms < deliver_at_ms - allowed_early_ms``.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from tickwheel.chaos.run_logs import Run

CLASSES = ("flagged", "redelivery", "unflagged")
"""The duplicate classes, in order of precedence."""
CANCELLED_OUTCOMES = ("cancelled", "already_cancelled")
"""Cancel outcomes that mean the message is cancelled (`tickwheel.client.CancelOutcome`)."""
DELIVERY = ("id", "group")
"""What is owed and received: a message, to one consumer group."""


def messages(scheduled: DataFrame) -> DataFrame:
    """One row per scheduled id; acked if any attempt to schedule it was."""
    return scheduled.groupBy("id").agg(
        F.first("topic").alias("topic"),
        F.min("deliver_at_ms").alias("deliver_at_ms"), F.min("sent_ms").alias("sent_ms"),
        F.bool_or("acked").alias("acked"), F.min("acked_ms").alias("acked_ms"))


def cancels(cancels: DataFrame) -> DataFrame:
    """One row per id cancels were sent for: ``cancelled_ms``, when the first cancel that
    says it is cancelled returned (None if none did), and ``maybe_cancelled``, true if any
    cancel did, may have (outcome ``unknown``), or did for the groups that had not had it yet
    (``handed_out``)."""
    outcome = F.col("outcome")
    cancelled = outcome.isin(*CANCELLED_OUTCOMES)
    return cancels.groupBy("id").agg(
        F.min(F.when(cancelled, F.col("done_ms"))).alias("cancelled_ms"),
        F.bool_or(cancelled | outcome.isin("unknown", "handed_out")).alias("maybe_cancelled"))


def moves(reschedules: DataFrame) -> DataFrame:
    """One row per id reschedules were sent for: ``moved_ms``, the new due time of the latest
    answered ``rescheduled`` (None if none), and ``maybe_moved_ms``, the latest asked time of
    those whose outcome is ``unknown``."""
    moved = F.col("outcome") == "rescheduled"
    return reschedules.groupBy("id").agg(
        F.max_by(F.when(moved, F.col("deliver_at_ms")), F.when(moved, F.col("done_ms")))
        .alias("moved_ms"),
        F.max(F.when(F.col("outcome") == "unknown", F.col("deliver_at_ms")))
        .alias("maybe_moved_ms"))


def owed(run: Run, messages: DataFrame, moves: DataFrame) -> DataFrame:
    """One row per delivery owed (``id``, ``topic``, ``group``) of an acked message, with
    ``owed_ms``: when it is due, moved as the module docstring says."""
    spark = messages.sparkSession
    if run.groups is None:
        groups = messages.select("topic").distinct().withColumn("group", F.lit(""))
    else:
        pairs = [(topic, group) for topic, names in run.groups.items() for group in names]
        groups = spark.createDataFrame(pairs, "topic STRING, group STRING")
    due = F.coalesce("moved_ms", "deliver_at_ms")
    return (messages.filter("acked").join(groups, "topic").join(moves, "id", "left")
            .withColumn("owed_ms", F.greatest(due, F.col("maybe_moved_ms")))
            .select("id", "topic", "group", "owed_ms"))


def label() -> Column:
    """A delivery's name in the summary: ``id`` in the default group, else ``group/id``."""
    return F.when(F.col("group") == "", F.col("id")).otherwise(
        F.concat(F.col("group"), F.lit("/"), F.col("id")))


def false_alarm() -> Column:
    """An original receipt (see `ordered_receipts`) flagged as a possible duplicate."""
    return ~F.col("duplicate") & F.col("possible_duplicate")


def unsent_alarm() -> Column:
    """A false alarm that no ledger shows sent to its group before (its own send only)."""
    return false_alarm() & (F.coalesce("sends", F.lit(0)) <= 1)


def sends(ledger: DataFrame) -> DataFrame:
    """``sends``: how many ``sent`` ledger rows each delivery has, on any node."""
    return (ledger.filter(F.col("event") == "sent")
            .withColumn("group", F.coalesce("group", F.lit("")))
            .groupBy(*DELIVERY).agg(F.count("*").alias("sends")))


def ordered_receipts(received: DataFrame) -> DataFrame:
    """Receipts numbered per delivery in order of arrival (``receipt``, from 1), with the
    duplicate ``class`` (see `CLASSES`) and whether the previous receipt was acked
    (``after_ack``)."""
    order = Window.partitionBy(*DELIVERY).orderBy("received_ms", "attempt", "possible_duplicate")
    plain = ~F.col("possible_duplicate") & (F.col("attempt") == 1)
    # The original is the first plain receipt if there is one: a consumer may handle an early,
    # unflagged copy after the flagged re-send overtook it (it sat in a slow consumer's
    # buffer), and that is no bug; two plain receipts of one id are.
    original = Window.partitionBy(*DELIVERY).orderBy(plain.desc(), "received_ms", "attempt",
                                                     "possible_duplicate")
    return (received
            .withColumn("receipt", F.row_number().over(order))
            .withColumn("duplicate", F.row_number().over(original) > 1)
            .withColumn("after_ack", F.coalesce(F.lag("acked").over(order), F.lit(False)))
            .withColumn("class", F.when(F.col("possible_duplicate"), CLASSES[0])
                        .when(F.col("attempt") > 1, CLASSES[1]).otherwise(CLASSES[2])))


def first_receipts(receipts: DataFrame, messages: DataFrame) -> DataFrame:
    """First receipts with ``lateness_ms``, judged from the later of the due time and the time
    the schedule was accepted (acked, else sent; just the due time for unknown ids)."""
    accepted = messages.select("id", F.coalesce("acked_ms", "sent_ms").alias("accepted_ms"))
    return (receipts.filter(F.col("receipt") == 1).join(accepted, "id", "left")
            .withColumn("lateness_ms", F.col("received_ms")
                        - F.greatest("deliver_at_ms", "accepted_ms")))


def lost(run: Run, owed: DataFrame, cancels: DataFrame, received: DataFrame) -> DataFrame:
    """Deliveries owed by the cutoff, of messages not (maybe) cancelled, never received in
    their group."""
    due = owed.filter(F.col("owed_ms") <= run.lost_cutoff_ms)
    return (due.join(cancels.filter("maybe_cancelled"), "id", "left_anti")
            .join(received, list(DELIVERY), "left_anti"))


def cancelled_but_delivered(cancels: DataFrame, received: DataFrame) -> DataFrame:
    """Ids received after a cancel that found them pending had returned."""
    return (received.join(cancels, "id")
            .filter(F.col("received_ms") > F.col("cancelled_ms")).select("id").distinct())


def contrary_to_reschedule(run: Run, moves: DataFrame, received: DataFrame) -> DataFrame:
    """Receipts (one row each) of moved messages more than ``allowed_early_ms`` before their
    new due time."""
    early = F.col("received_ms") < F.col("moved_ms") - run.allowed_early_ms
    return (received.join(moves.filter(F.col("moved_ms").isNotNull()), "id").filter(early)
            .select("id"))


def delivered_early(run: Run, received: DataFrame) -> DataFrame:
    """Receipts (one row each) more than ``allowed_early_ms`` before their due time."""
    early = F.col("received_ms") < F.col("deliver_at_ms") - run.allowed_early_ms
    return received.filter(early).select("id")
