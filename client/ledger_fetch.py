"""Copying every node's closed ledger segments into one folder, verified and resumable: what
``tickwheel ledger fetch`` does, and the layout the audit reads.

The folder's layout (fixed; docs/node.md, "Fetching the ledger")::

    DIR/fetch.json                                         what the last fetch did
    DIR/shard-<s>/<node>/ledger-<node>-<sequence>.parquet  a segment
    DIR/shard-<s>/<node>/ledger-<node>-<sequence>.json     its manifest, as the node keeps it

``<node>`` is the node's name in its segments' names (its Raft address, every character
outside ``[A-Za-z0-9._-]`` made ``_``). The rules kept: a segment is written under a temporary
name (``.part``), its SHA-256 and size checked against its manifest, its manifest written,
and only then renamed, so a ``.parquet`` in DIR is always whole and verified; a segment
already there whose SHA-256 matches is not fetched again (a second run fetches only what is
new); a node that cannot be reached, or fails mid-way, is reported in ``fetch.json`` and in
`FetchReport.missed`, and the others are fetched all the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from tickwheel.client.errors import TickwheelClientError
from tickwheel.client.ledger import LedgerClient, Node, Segment

FETCH_FILE: Final = "fetch.json"
FETCH_VERSION: Final = 1
SEGMENT_NAME: Final = re.compile(r"^ledger-(?P<node>[A-Za-z0-9._-]+)-\d{12}\.parquet$")
"""A segment's name as a node gives it: checked, so that no name leads out of DIR."""
_HASH_BLOCK: Final = 1 << 20

Progress = Callable[[int, int, int, int], None]
"""Told ``(segments done, segments in all, bytes done, bytes in all)`` as the fetch goes."""


class SegmentDamaged(Exception):
    """A segment's bytes did not match its manifest (its SHA-256 or its size)."""


@dataclass(slots=True)
class FetchReport:
    """What one fetch did (``fetch.json`` holds it, as JSON)."""

    version: int
    fetched_at_ms: int
    since_ms: int
    until_ms: int
    close_open: bool = False
    """Each node was asked to close its open segment first (its last rows are fetched)."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """Every member asked: ``shard``, ``grpc_address``, ``node`` (Raft address, "" if not
    reached) and ``reached``."""
    segments: list[dict[str, Any]] = field(default_factory=list)
    """Every segment in the range: ``shard``, ``node``, ``sequence``, ``file`` (relative to
    DIR), ``bytes``, ``sha256``, ``first_ms``, ``last_ms``, ``rows``, ``fetched`` (false:
    already in DIR, verified)."""
    missed: list[dict[str, Any]] = field(default_factory=list)
    """Every node that could not be read whole: ``shard``, ``grpc_address``, ``error``."""


def fetch(ledger: LedgerClient, out: Path, since_ms: int = 0, until_ms: int = 0,
          progress: Progress | None = None, now_ms: Callable[[], int] | None = None, *,
          close_open: bool = False) -> FetchReport:
    """Copy the closed segments overlapping ``[since_ms, until_ms]`` (0: unbounded) of every
    node into ``out`` (``close_open``: each node closes its open segment first, so that its
    last rows are fetched too); write ``out/fetch.json``; return what was done."""
    clock = now_ms or (lambda: int(time.time() * 1000))
    report = FetchReport(FETCH_VERSION, clock(), since_ms, until_ms, close_open)
    listed: list[tuple[Node, list[Segment]]] = []
    for node in ledger.nodes():
        try:
            name, segments = ledger.segments(node, since_ms, until_ms, close_open=close_open)
        except TickwheelClientError as error:
            _missed(report, node, error)
            continue
        report.nodes.append({"shard": node.shard, "grpc_address": node.grpc_address,
                             "node": name, "reached": True})
        listed.append((node, segments))
    total = [sum(len(found) for _, found in listed),
             sum(segment.bytes for _, found in listed for segment in found)]
    done = [0, 0]
    for node, segments in listed:
        for segment in segments:
            try:
                fetched = _fetch_segment(ledger, node, segment, out)
            except (TickwheelClientError, SegmentDamaged) as error:
                _missed(report, node, error)
                break
            report.segments.append({**_described(segment), "file": str(
                _target(out, segment).relative_to(out)), "fetched": fetched})
            done[0] += 1
            done[1] += segment.bytes
            if progress is not None:
                progress(done[0], total[0], done[1], total[1])
    out.mkdir(parents=True, exist_ok=True)
    _write_atomically(out / FETCH_FILE, json.dumps(asdict(report), indent=1))
    return report


def _fetch_segment(ledger: LedgerClient, node: Node, segment: Segment, out: Path) -> bool:
    """Make ``segment`` whole and verified in ``out``; whether its bytes were fetched (False:
    the copy already there matched its manifest)."""
    target = _target(out, segment)
    manifest = target.with_suffix(".json")
    if target.exists() and _sha256(target) == segment.sha256:
        if not manifest.exists() or manifest.read_text(encoding="utf-8") != (
                segment.manifest_json):
            _write_atomically(manifest, segment.manifest_json)
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    size = 0
    with open(part, "wb") as file:
        for data in ledger.read(node, segment.sequence):
            file.write(data)
            digest.update(data)
            size += len(data)
    if digest.hexdigest() != segment.sha256 or size != segment.bytes:
        part.unlink()
        raise SegmentDamaged(f"segment {segment.sequence} of {segment.node}: {size} bytes of "
                             f"SHA-256 {digest.hexdigest()}, its manifest says "
                             f"{segment.bytes} bytes of {segment.sha256}")
    _write_atomically(manifest, segment.manifest_json)
    os.replace(part, target)
    return True


def _target(out: Path, segment: Segment) -> Path:
    matched = SEGMENT_NAME.match(segment.name)
    if matched is None:
        raise SegmentDamaged(f"a node named a segment {segment.name!r}, not a ledger segment")
    return out / f"shard-{segment.shard}" / matched["node"] / segment.name


def _described(segment: Segment) -> dict[str, Any]:
    return {"shard": segment.shard, "node": segment.node, "sequence": segment.sequence,
            "bytes": segment.bytes, "sha256": segment.sha256, "first_ms": segment.first_ms,
            "last_ms": segment.last_ms, "rows": segment.rows}


def _missed(report: FetchReport, node: Node, error: Exception) -> None:
    report.missed.append({"shard": node.shard, "grpc_address": node.grpc_address,
                          "error": str(error)})
    if not any(seen["grpc_address"] == node.grpc_address for seen in report.nodes):
        report.nodes.append({"shard": node.shard, "grpc_address": node.grpc_address,
                             "node": "", "reached": False})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
