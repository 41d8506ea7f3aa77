"""What a chaos run leaves in its output folder, and how the audit reads it: ``run.json`` (the
run's window and tolerances, `Run`), the JSON-lines logs (`Logs`), each read with an explicit
schema, a malformed line dropped (a process killed mid-write tears its last line), and the
nodes' ledgers, ``OUT/ledgers`` as ``tickwheel ledger fetch`` writes it (the runner's copies of
wiped generations beside them, in the same layout), read and audited by the production audit
as production's are (`ledger_audit`); each node folder is named after its node by
``run.json``'s ``nodes`` (``ledgers``), as the client logs name nodes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tickwheel.audit import AuditOptions, audit_ledgers, fetched_segments, read_ledger

LEDGERS = "ledgers"
"""The run's ledgers, under its output folder."""

SCHEDULED_SCHEMA = ("id STRING, topic STRING, deliver_at_ms BIGINT, sent_ms BIGINT, "
                    "acked BOOLEAN, acked_ms BIGINT, handle BIGINT, kind STRING, shard BIGINT")
CANCELS_SCHEMA = ("id STRING, handle BIGINT, sent_ms BIGINT, done_ms BIGINT, outcome STRING, "
                  "deliver_at_ms BIGINT, raced BOOLEAN")
RESCHEDULES_SCHEMA = ("id STRING, handle BIGINT, sent_ms BIGINT, done_ms BIGINT, outcome STRING, "
                      "deliver_at_ms BIGINT, old_deliver_at_ms BIGINT, batch BIGINT, size BIGINT")
RECEIVED_SCHEMA = ("id STRING, topic STRING, group STRING, deliver_at_ms BIGINT, "
                   "delivered_at_ms BIGINT, received_ms BIGINT, attempt BIGINT, "
                   "possible_duplicate BOOLEAN, node STRING, consumer STRING, acked BOOLEAN")
LEADERS_SCHEMA = "at_ms BIGINT, leader STRING, term BIGINT, shard BIGINT"
FAULTS_SCHEMA = ("fault STRING, node STRING, shard BIGINT, started_ms BIGINT, ended_ms BIGINT, "
                 "detail STRING")
"""``shard`` is null in the logs of runs before shards: shard 0, the only one."""


@dataclass(frozen=True, slots=True)
class BurstPlan:
    """``run.json``'s ``burst``: a topic's messages, all due at one time (`tickwheel.chaos.burst`
    has the whole record)."""

    topic: str
    messages: int
    """Asked for (``scheduled.jsonl`` says which the cluster accepted)."""
    due_ms: int
    at_ms: int
    """When their scheduling began."""
    scheduled_ms: int | None = None
    """When it ended (None: it did not)."""


@dataclass(frozen=True, slots=True)
class Run:
    """``run.json``: the run's window and the tolerances it is judged by."""

    started_ms: int
    ended_ms: int
    seed: int | None
    grace_ms: int
    allowed_early_ms: int
    drained_due_ms: int | None = None
    """What the runner drained for: every message due by then had arrived (or the drain
    timed out). None in runs recorded before the runner wrote it."""
    groups: dict[str, list[str]] | None = None
    """Consumed topics and their groups; None (runs before groups): every topic, its default
    group."""
    idle_topics: list[str] = dataclasses.field(default_factory=list)
    shards: int = 1
    """The cluster's shards (Raft groups): a message is its id's shard's."""
    burst: BurstPlan | None = None
    """The run's burst, if it had one."""
    ledger_names: dict[str, str] = dataclasses.field(default_factory=dict)
    """Each node folder under ``OUT/ledgers/shard-<s>/`` -> the name of its node
    (``node1``), from ``run.json``'s ``nodes``."""

    @property
    def lost_cutoff_ms(self) -> int:
        """Messages due by then must have arrived."""
        cutoff = self.ended_ms - self.grace_ms
        return cutoff if self.drained_due_ms is None else min(cutoff, self.drained_due_ms)


@dataclass(frozen=True, slots=True)
class Logs:
    """One run's logs as DataFrames (the ledger's rows gain ``node_name``, their folder's node
    by `Run.ledger_names`; receipts without a group are the default group's)."""

    run: Run
    scheduled: DataFrame
    cancels: DataFrame
    reschedules: DataFrame
    received: DataFrame
    ledger: DataFrame
    leaders: DataFrame
    faults: DataFrame


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
               drained_due_ms=raw.get("drained_due_ms"), groups=raw.get("groups"),
               idle_topics=raw.get("idle_topics", []), shards=raw.get("shards", 1),
               burst=_burst(raw.get("burst")),
               ledger_names={folder.rsplit("/", 1)[-1]: node["name"]
                             for node in raw.get("nodes", [])
                             for folder in node.get("ledgers", [])})


def _burst(raw: dict[str, Any] | None) -> BurstPlan | None:
    """``run.json``'s ``burst``, its fields the audit reads."""
    if raw is None:
        return None
    missing = [key for key in ("topic", "messages", "due_ms", "at_ms") if raw.get(key) is None]
    if missing:
        raise ValueError(f"run.json's burst: missing {', '.join(missing)}")
    return BurstPlan(topic=raw["topic"], messages=raw["messages"], due_ms=raw["due_ms"],
                     at_ms=raw["at_ms"], scheduled_ms=raw.get("scheduled_ms"))


def load_logs(spark: SparkSession, out_dir: Path, run: Run) -> Logs:
    """The logs under ``out_dir`` as DataFrames with explicit schemas."""
    ledger = read_ledger(spark, fetched_segments(out_dir / LEDGERS)).drop("shard")
    folder = F.col("node_name")
    if run.ledger_names:
        names = F.create_map(*(F.lit(text) for item in run.ledger_names.items()
                               for text in item))
        folder = F.coalesce(names[F.col("node_name")], folder)
    return Logs(
        run=run,
        scheduled=_read_jsonl(spark, [out_dir / "scheduled.jsonl"], SCHEDULED_SCHEMA),
        cancels=_read_jsonl(spark, [out_dir / "cancels.jsonl"], CANCELS_SCHEMA),
        reschedules=_read_jsonl(spark, [out_dir / "reschedules.jsonl"], RESCHEDULES_SCHEMA),
        received=_read_jsonl(spark, [out_dir / "received.jsonl"], RECEIVED_SCHEMA)
        .withColumn("group", F.coalesce("group", F.lit(""))),
        ledger=ledger.withColumn("node_name", folder),
        leaders=_read_jsonl(spark, [out_dir / "leaders.jsonl"], LEADERS_SCHEMA),
        faults=_read_jsonl(spark, [out_dir / "faults.jsonl"], FAULTS_SCHEMA))


def ledger_audit(spark: SparkSession, out_dir: Path, run: Run) -> dict[str, Any]:
    """The production audit of the run's ledgers alone (`tickwheel.audit`), judged by the
    run's grace and allowed earliness, to the horizon ``lost_cutoff_ms + grace_ms``: what
    the chaos audit adds to it is the runner's client logs."""
    options = AuditOptions(grace_ms=run.grace_ms, allowed_early_ms=run.allowed_early_ms,
                           until_ms=run.lost_cutoff_ms + run.grace_ms)
    return audit_ledgers(spark, out_dir / LEDGERS, options)


def _read_jsonl(spark: SparkSession, paths: list[Path], schema: str) -> DataFrame:
    """The JSON lines of those ``paths`` that exist (none: no rows); malformed lines dropped."""
    existing = [str(path) for path in paths if path.is_file()]
    if not existing:
        return spark.createDataFrame(spark.sparkContext.emptyRDD(), schema)
    return spark.read.schema(schema).option("mode", "DROPMALFORMED").json(existing)
