"""What the audit tests share (importable: ``tests/audit`` is on pytest's path): a real
cluster's ledgers laid out as ``tickwheel ledger fetch --out DIR`` writes them, ways to plant
a fault in such a copy, and a Spark session per test module."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.node.ledger.schema import SCHEMA

SEGMENTS = "ledger-*.parquet"


def fetch_layout(cluster: LocalCluster, out: Path) -> Path:
    """Copy every node's closed segments and their manifests to
    ``out/shard-<s>/<node's data folder>/`` (what ``ledger fetch`` writes); returns ``out``."""
    for shard, members in enumerate(cluster.shards):
        for node in members:
            target = out / f"shard-{shard}" / node.data.name
            target.mkdir(parents=True, exist_ok=True)
            for segment in sorted((node.data / "ledger").glob(SEGMENTS)):
                shutil.copy2(segment, target / segment.name)
                shutil.copy2(segment.with_suffix(".json"), target / segment.with_suffix(
                    ".json").name)
    (out / "fetch.json").write_text(json.dumps({"copied_by": "tests"}))
    return out


def copy_of(folder: Path, to: Path) -> Path:
    """A copy of a fetched folder, to plant a fault in."""
    shutil.copytree(folder, to)
    return to


def segments(folder: Path) -> list[Path]:
    """Every segment under a fetched folder, by node and sequence."""
    return sorted(folder.glob(f"shard-*/*/{SEGMENTS}"))


def rows_of(segment: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(segment, schema=SCHEMA).to_pylist()
    return rows


def rewrite(folder: Path, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
            only: Iterable[Path] | None = None) -> None:
    """Rewrite segments (all, or ``only``) with their rows as ``change`` returns them; the
    manifests are left as they were (the audit does not check their SHA-256)."""
    for segment in segments(folder) if only is None else only:
        pq.write_table(pa.Table.from_pylist(change(rows_of(segment)), schema=SCHEMA), segment,
                       compression="zstd")


def all_rows(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    return [(segment, row) for segment in segments(folder) for row in rows_of(segment)]
