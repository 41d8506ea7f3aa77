"""What the production audit reads: a folder of ledgers as ``tickwheel ledger fetch --out DIR``
writes it, ``DIR/shard-<s>/<node>/ledger-<node>-<sequence>.parquet`` with the segment's
manifest (``.json``) beside each, and ``DIR/fetch.json``; and what the manifests say is
missing.

The segments are read by Spark (`read_ledger`: every row gains ``shard``, from its folder, and
``node_name``, its node's folder); the manifests, one small JSON file per segment, are read
here in Python (`find_gaps`): their ``gaps`` and the holes between sequence numbers are
*ledger gaps*, stretches of time a node's rows are missing from, never lost messages. The
segments' format is the node's (`tickwheel.node.ledger.schema`, docs/node.md "The ledger"):
`LEDGER_SCHEMA` names its columns for Spark. Used by `tickwheel.audit.summary` and, for a
chaos run's ``OUT/ledgers`` (fetched so), by `tickwheel.chaos.run_logs`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

LEDGER_SCHEMA: Final = (
    "event STRING, node STRING, node_ms BIGINT, time_ms BIGINT, term BIGINT, "
    "epoch BIGINT, handle BIGINT, new_handle BIGINT, id STRING, topic STRING, "
    "group STRING, consumer STRING, lease BIGINT, possible_duplicate BOOLEAN, "
    "attempt BIGINT, deliver_at_ms BIGINT, old_deliver_at_ms BIGINT, "
    "deadline_ms BIGINT, slot_second BIGINT, local_index BIGINT, principal STRING")
"""The ledger's columns (`tickwheel.node.ledger.schema`, docs/node.md); ``node`` is the Raft
address (behind a chaos proxy: the proxy's), so the audit names nodes by their folder.
Spark reads a column a segment lacks (``principal`` before ledger format 2) as null."""
SEGMENT: Final = re.compile(r"^ledger-[A-Za-z0-9._-]+-(?P<sequence>\d{12})\.parquet$")
FETCH_RECORD: Final = "fetch.json"


@dataclass(frozen=True, slots=True)
class Gap:
    """A stretch of one node's ledger that no segment holds (times: the node's clock)."""

    shard: int
    node: str
    reason: str
    """A manifest's gap reason (``buffer_full``, ``disk_low``, ``write_failed``,
    ``torn_segment``), ``missing_segment``: a sequence number between two segments that
    neither a segment nor a gap accounts for (deleted, or not fetched), or ``not_fetched``:
    a node's rows after its newest segment fetched, while no other node is seen leading
    (`tickwheel.audit.leaders.unfetched`)."""
    rows: int | None
    from_ms: int | None
    to_ms: int | None
    """The stretch: the gap's own ``first_ms``/``last_ms`` if it has them, else from the last
    row of the segment before it to the first row of the segment after it."""
    sequences: list[int]
    """The segments' sequence numbers missing (empty for rows dropped between segments)."""


Segments = dict[tuple[int, str], list[Path]]
"""Per ``(shard, node folder)``, its closed segments, oldest first."""


def fetched_segments(folder: Path) -> Segments:
    """Per ``(shard, node folder)``, the closed segments under ``folder``, oldest first."""
    found: dict[tuple[int, str], list[Path]] = {}
    for shard_dir in sorted(folder.glob("shard-*")):
        if not shard_dir.name.removeprefix("shard-").isdigit():
            continue
        shard = int(shard_dir.name.removeprefix("shard-"))
        for node_dir in sorted(path for path in shard_dir.iterdir() if path.is_dir()):
            paths = [path for path in node_dir.iterdir() if SEGMENT.match(path.name)]
            if paths:
                found[(shard, node_dir.name)] = sorted(paths, key=_sequence)
    return found


def read_ledger(spark: SparkSession, found: Segments, since_ms: int | None = None,
                until_ms: int | None = None) -> DataFrame:
    """Every row of the segments ``found`` with ``shard`` and ``node_name``, the key of its
    folder in ``found``; only rows whose ``time_ms`` lies in ``[since_ms, until_ms]`` when
    given. Each node folder is read by a scan of its own, the two columns constants of it:
    taking them from each row's file name cost a regular expression a row, twice."""
    scans = [spark.read.schema(LEDGER_SCHEMA).parquet(*[str(path) for path in paths])
             .withColumn("shard", F.lit(shard).cast("int"))
             .withColumn("node_name", F.lit(node))
             for (shard, node), paths in sorted(found.items()) if paths]
    if not scans:
        rows = spark.createDataFrame(spark.sparkContext.emptyRDD(), LEDGER_SCHEMA)
        return rows.withColumn("shard", F.lit(0)).withColumn("node_name", F.lit(""))
    rows = functools.reduce(DataFrame.unionByName, scans)
    if since_ms is not None:
        rows = rows.filter(F.col("time_ms") >= since_ms)
    if until_ms is not None:
        rows = rows.filter(F.col("time_ms") <= until_ms)
    return rows


def find_gaps(found: Segments) -> list[Gap]:
    """Every ledger gap of the segments ``found``: each manifest's ``gaps`` and each hole in
    a node's sequence numbers no gap names, in order of shard, node and sequence. A segment
    without a manifest counts as a hole's edge with unknown times."""
    gaps: list[Gap] = []
    for (shard, node), paths in sorted(found.items()):
        manifests = [_manifest(path) for path in paths]
        for before, (path, manifest) in zip([None, *manifests], zip(paths, manifests,
                                                                    strict=True), strict=False):
            gaps += _gaps_before(shard, node, _sequence(path), before, manifest)
    return gaps


def newest_rows(found: Segments) -> dict[tuple[int, str], int | None]:
    """Per ``(shard, node folder)``, where what was fetched of the node ends: its newest
    segment's ``complete_ms`` (every row the node stamped before it is in the segments or a
    gap), else, in a manifest written before that was kept, its ``last_ms``; None without a
    manifest."""
    ends = {}
    for key, paths in found.items():
        manifest = _manifest(paths[-1])
        ends[key] = manifest.get("complete_ms") or manifest.get("last_ms")
    return ends


def _gaps_before(shard: int, node: str, sequence: int, before: dict[str, Any] | None,
                 manifest: dict[str, Any]) -> list[Gap]:
    """The gaps between the segment ``before`` (None: the first fetched) and this one."""
    edge_from = None if before is None else before.get("last_ms")
    edge_to = manifest.get("first_ms")
    named = manifest.get("gaps") or []
    torn = {gap.get("sequence") for gap in named if gap.get("sequence") is not None}
    found = [Gap(shard, node, gap["reason"], gap.get("rows"),
                 gap.get("first_ms") if gap.get("first_ms") is not None else edge_from,
                 gap.get("last_ms") if gap.get("last_ms") is not None else edge_to,
                 [] if gap.get("sequence") is None else [gap["sequence"]])
             for gap in named]
    if before is not None:
        holes = [number for number in range(before["sequence"] + 1, sequence)
                 if number not in torn]
        if holes:
            found.append(Gap(shard, node, "missing_segment", None, edge_from, edge_to, holes))
    return found


def _manifest(segment: Path) -> dict[str, Any]:
    """A segment's manifest, or what its name says when it has none."""
    path = segment.with_suffix(".json")
    try:
        raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"sequence": _sequence(segment), "gaps": []}
    return raw


def _sequence(segment: Path) -> int:
    matched = SEGMENT.match(segment.name)
    return 0 if matched is None else int(matched["sequence"])


def fetch_record(folder: Path) -> dict[str, Any] | None:
    """``DIR/fetch.json`` as written by ``tickwheel ledger fetch`` (None if absent or not
    JSON): the audit copies it into its summary as it is."""
    try:
        raw: dict[str, Any] = json.loads((folder / FETCH_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw
