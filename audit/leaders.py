"""Who led each shard when, by the ledgers alone, and what each change of leader re-sent: the
failover figures of the production audit.

A *leadership* is a node's term as its shard's leader: the ``(node, term)`` of its
``dispatch_started`` and ``sent`` rows. A shard's leaderships in term order are its turns; a
*failover* is each turn after the first, from the node of the turn before (``old_leader``) to
this one's (``new_leader``, in ``term``). Its ``gap_ms`` is how long the shard sent nothing
across it: from the old leader's last ``sent`` row to the new leader's first (each its
``time_ms``, the cluster's time; null when either sent nothing in its turn).

A *repeated hand-out* is a ``sent`` row of a delivery ``(id, group)`` that had been handed out
before: a lease above 1 (an earlier lease was granted), or an earlier ``sent`` row of it in
the ledgers. Each counts for the turn it is sent in: a failover's are the repeats its new
leader sent, until the shard's next failover. It is ``flagged`` when the send carries
``possible_duplicate`` or is a retry (``attempt`` above 1: a nack's or a visibility
timeout's copy, which the consumer is told of), else ``unflagged`` (a consumer cannot tell it
from the first: a broken promise). Used by `tickwheel.audit.summary`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from tickwheel.audit.layout import Gap
from tickwheel.audit.lifecycle import DELIVERY


@dataclass(frozen=True, slots=True)
class Turn:
    """One leadership: a node's term as its shard's leader, as its ledger tells it."""

    shard: int
    term: int
    node: str
    takeover_ms: int | None
    """Its first ``dispatch_started`` row's ``time_ms`` (null: none fetched)."""
    first_sent_ms: int | None
    last_sent_ms: int | None
    sends: int


def turns(rows: DataFrame) -> list[Turn]:
    """Every shard's leaderships, in order of shard and term (a term whose rows name two
    nodes keeps the one that sent more)."""
    sent = F.col("event") == "sent"
    found = (rows.filter(F.col("event").isin("sent", "dispatch_started")
                         & F.col("term").isNotNull())
             .groupBy("shard", "term", "node_name").agg(
                 F.min(F.when(~sent, F.col("time_ms"))).alias("takeover_ms"),
                 F.min(F.when(sent, F.col("time_ms"))).alias("first_sent_ms"),
                 F.max(F.when(sent, F.col("time_ms"))).alias("last_sent_ms"),
                 F.count_if(sent).alias("sends"))
             .orderBy("shard", "term", F.col("sends").desc()).collect())
    kept: dict[tuple[int, int], Turn] = {}
    for row in found:
        key = (row.shard, row.term)
        if key not in kept:
            kept[key] = Turn(row.shard, row.term, row.node_name, row.takeover_ms,
                             row.first_sent_ms, row.last_sent_ms, row.sends)
    return list(kept.values())


def repeats(sent: DataFrame) -> DataFrame:
    """The repeated hand-outs among ``sent`` rows, with ``flagged`` (the module docstring)."""
    order = Window.partitionBy(*DELIVERY).orderBy("time_ms", "lease")
    earlier = F.lag("time_ms").over(order).isNotNull()
    return (sent.withColumn("repeat", (F.coalesce("lease", F.lit(1)) > 1) | earlier)
            .filter("repeat")
            .withColumn("flagged", F.coalesce("possible_duplicate", F.lit(False))
                        | (F.coalesce("attempt", F.lit(1)) > 1)))


def turn_of(frame: DataFrame, all_turns: list[Turn]) -> DataFrame:
    """``frame`` (with ``shard`` and ``term``) gains ``turn``: the index in its shard's turns
    of the one whose term range holds its term (null before the first)."""
    spark = frame.sparkSession
    ranges = []
    for shard in sorted({turn.shard for turn in all_turns}):
        mine = [turn for turn in all_turns if turn.shard == shard]
        for index, turn in enumerate(mine):
            until = mine[index + 1].term if index + 1 < len(mine) else None
            ranges.append((shard, index, turn.term, until))
    table = spark.createDataFrame(ranges,
                                  "t_shard INT, turn INT, t_from BIGINT, t_until BIGINT")
    inside = ((F.col("shard") == F.col("t_shard")) & (F.col("term") >= F.col("t_from"))
              & (F.col("t_until").isNull() | (F.col("term") < F.col("t_until"))))
    return (frame.join(F.broadcast(table), inside, "left")
            .drop("t_shard", "t_from", "t_until"))


def repeat_counts(repeated: DataFrame, all_turns: list[Turn]) -> dict[tuple[int, int | None],
                                                                      dict[str, int]]:
    """Per ``(shard, turn)``: repeated hand-outs ``flagged`` and ``unflagged``."""
    counts: dict[tuple[int, int | None], dict[str, int]] = {}
    rows = (turn_of(repeated, all_turns).groupBy("shard", "turn")
            .agg(F.count_if("flagged").alias("flagged"),
                 F.count_if(~F.col("flagged")).alias("unflagged")).collect())
    for row in rows:
        counts[(row.shard, row.turn)] = {"flagged": row.flagged, "unflagged": row.unflagged}
    return counts


def failovers(all_turns: list[Turn], counts: dict[tuple[int, int | None], dict[str, int]]
              ) -> dict[int, list[dict[str, Any]]]:
    """Per shard, its failovers as the summary gives them (the module docstring)."""
    found: dict[int, list[dict[str, Any]]] = {}
    for shard in sorted({turn.shard for turn in all_turns}):
        mine = [turn for turn in all_turns if turn.shard == shard]
        found[shard] = [_failover(old, new, counts.get((shard, index + 1), {}))
                        for index, (old, new) in enumerate(pairwise(mine))]
    return found


def _failover(old: Turn, new: Turn, repeated: dict[str, int]) -> dict[str, Any]:
    gap = (None if old.last_sent_ms is None or new.first_sent_ms is None
           else new.first_sent_ms - old.last_sent_ms)
    flagged, unflagged = repeated.get("flagged", 0), repeated.get("unflagged", 0)
    return {"old_leader": old.node, "new_leader": new.node, "old_term": old.term,
            "term": new.term, "takeover_ms": new.takeover_ms,
            "last_sent_ms": old.last_sent_ms, "first_sent_ms": new.first_sent_ms,
            "gap_ms": gap,
            "repeated": {"total": flagged + unflagged, "flagged": flagged,
                         "unflagged": unflagged}}


def leaders(all_turns: list[Turn]) -> dict[int, list[dict[str, Any]]]:
    """Per shard, its leaderships as plain dicts (for the summary)."""
    found: dict[int, list[dict[str, Any]]] = {}
    for turn in all_turns:
        plain = asdict(turn)
        del plain["shard"]
        found.setdefault(turn.shard, []).append(plain)
    return found


def unfetched(newest: dict[tuple[int, str], int | None], turns: list[Turn]) -> list[Gap]:
    """The stretches after each node's newest segment fetched (``newest``: `tickwheel.audit
    .layout.newest_rows`) in which the node's own missing rows could hold sends: from its last
    row until another node of its shard is seen leading (its first ``dispatch_started`` or
    ``sent`` row after it), or open when none is. A running node's open segment is never
    fetched (``ledger fetch`` without ``--close-open``), and a node down when its ledger was
    fetched has its last rows nowhere; the leader's are sends. A follower's tail ends where
    the leader's rows go on, and so adds nothing."""
    found = []
    for (shard, node), last_ms in sorted(newest.items()):
        if last_ms is None:
            continue
        after = [max(last_ms, _start(turn)) for turn in turns
                 if turn.shard == shard and turn.node != node and _end(turn) > last_ms]
        end = min(after, default=None)
        if end is None or end > last_ms:
            found.append(Gap(shard, node, "not_fetched", None, last_ms, end, []))
    return found


def _start(turn: Turn) -> int:
    return min(time for time in (turn.takeover_ms, turn.first_sent_ms) if time is not None)


def _end(turn: Turn) -> int:
    return max(time for time in (turn.takeover_ms, turn.last_sent_ms) if time is not None)
