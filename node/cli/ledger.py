"""``tickwheel ledger fetch`` and ``tickwheel trace``: every node's ledger, from outside the
cluster, for its admins (docs/node.md, "Reading a running cluster's ledger").

::

    tickwheel ledger fetch --out DIR [--since 6h|ISO8601] [--until ...] [--close-open] [--quiet]
    tickwheel trace ID | --handle HANDLE [--json] [--close-open]

``ledger fetch`` copies the closed segments of every node of every shard into DIR
(`tickwheel.client.fetch_ledger`: verified, resumable), shows its progress on stderr, and
exits 1 if any node was missed, naming each. ``trace`` prints a message's life from every
node's ledger as a table by time (`tickwheel.client.LedgerClient`), or JSON, found by its id
or by a handle ``schedule`` returned; 1 if no ledger holds it. Wired into the command by
`tickwheel.node.cli.commands`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TypeAlias

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn
from rich.table import Table

from tickwheel.client import Credentials, LedgerClient, Trace, TracedEvent, fetch_ledger
from tickwheel.node.cli.terminal import console

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
CredentialsOf = Callable[[argparse.Namespace], Credentials]


def add_parsers(commands: Subcommands, connection: argparse.ArgumentParser,
                duration_ms: Callable[[str], int], credentials: CredentialsOf) -> None:
    """``ledger fetch`` and ``trace``; ``credentials`` reads a client command's flags."""
    def when(text: str) -> int:
        """``6h`` (that long ago) or an ISO 8601 time -> Unix ms."""
        try:
            return int(time.time() * 1000) - duration_ms(text)
        except argparse.ArgumentTypeError:
            pass
        try:
            return int(datetime.fromisoformat(text).timestamp() * 1000)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is neither a duration like 6h nor an "
                                             "ISO 8601 time") from None

    ledger = commands.add_parser("ledger", help="every node's ledger (admins)")
    verbs = ledger.add_subparsers(dest="verb", required=True)
    fetching = verbs.add_parser(
        "fetch", parents=[connection], help="copy every node's closed ledger segments into "
        "a folder (verified against their manifests; run again to fetch only what is new)")
    fetching.add_argument("--out", type=Path, required=True, metavar="DIR",
                          help="DIR/shard-<s>/<node>/ledger-<node>-<sequence>.parquet (and "
                               ".json), DIR/fetch.json")
    fetching.add_argument("--since", type=when, default=0, metavar="6h|ISO8601",
                          help="segments with rows at or after this (default: the oldest)")
    fetching.add_argument("--until", type=when, default=0, metavar="6h|ISO8601",
                          help="segments with rows at or before this (default: the newest)")
    fetching.add_argument("--close-open", action="store_true",
                          help="have each node close its open ledger segment first, so that "
                               "its last rows (up to ledger_segment_age_ms) are fetched too")
    fetching.add_argument("--quiet", action="store_true", help="no progress on stderr")
    fetching.set_defaults(handler=lambda args: _fetch(args, credentials(args)))

    tracing = commands.add_parser(
        "trace", parents=[connection],
        help="a message's life from every node's ledger (admins)")
    tracing.add_argument("id", nargs="?", help="the message's id")
    tracing.add_argument("--handle", type=_handle, metavar="HANDLE",
                         help="find the message by a handle schedule returned, not by id")
    tracing.add_argument("--json", action="store_true", help="JSON instead of a table")
    tracing.add_argument("--close-open", action="store_true",
                         help="have each node close its open ledger segment first, so that "
                              "its last rows (up to ledger_segment_age_ms) are searched too")
    tracing.set_defaults(handler=lambda args: _trace(args, credentials(args), tracing))


def _fetch(args: argparse.Namespace, credentials: Credentials) -> int:
    errors = Console(stderr=True, quiet=args.quiet)
    with LedgerClient(args.target, credentials=credentials) as ledger, Progress(
            TextColumn("ledger segments {task.description}"), BarColumn(), DownloadColumn(),
            console=errors) as progress:
        segments = progress.add_task("", total=None)
        report = fetch_ledger(ledger, args.out, args.since, args.until,
                              lambda done, total, done_bytes, total_bytes: progress.update(
                                  segments, completed=done_bytes, total=total_bytes,
                                  description=f"{done}/{total}"),
                              close_open=args.close_open)
    fetched = [segment for segment in report.segments if segment["fetched"]]
    console.print(f"{len(report.segments)} segments in {args.out} ({len(fetched)} fetched, "
                  f"{sum(s['bytes'] for s in fetched)} bytes; the others were there, "
                  f"verified) from {len(report.nodes) - len(report.missed)} nodes")
    for missed in report.missed:
        console.print(f"[red]missed[/red] shard {missed['shard']} node "
                      f"{missed['grpc_address']}: {missed['error']}", highlight=False)
    return 1 if report.missed else 0


def _handle(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is no handle (a number schedule returned)")
    return int(text)


def _trace(args: argparse.Namespace, credentials: Credentials,
           parser: argparse.ArgumentParser) -> int:
    if (args.id is None) == (args.handle is None):
        parser.error("give a message's id or --handle HANDLE, one of them")
    with LedgerClient(args.target, credentials=credentials) as ledger:
        found = (ledger.trace(args.id, close_open=args.close_open) if args.handle is None
                 else ledger.trace_handle(args.handle, close_open=args.close_open))
    if args.json:
        console.print_json(json.dumps({**asdict(found), "missed": [
            {"shard": node.shard, "grpc_address": node.grpc_address, "error": error}
            for node, error in found.missed]}))
    elif found.events:
        console.print(_table(found))
    for node, error in found.missed:
        console.print(f"[red]not reached[/red] shard {node.shard} node {node.grpc_address}: "
                      f"{error}", highlight=False)
    if not found.events:
        named = f"id {args.id!r}" if args.handle is None else f"handle {args.handle}"
        console.print(f"no ledger of the {len(found.nodes)} nodes that answered holds {named} "
                      "(their closed segments: add --close-open for the last rows)",
                      highlight=False)
        return 1
    return 0


def _table(found: Trace) -> Table:
    table = Table(title=f"message {found.id}" + (" (some rows left out)" if found.truncated
                                                 else ""))
    for column in ("time", "event", "by", "nodes", "term", "group", "consumer", "lease", "flag",
                   "attempt", "due", "detail"):
        table.add_column(column)
    for event in found.events:
        table.add_row(_iso(event.time_ms), event.event, event.principal or "",
                      ", ".join(event.nodes),
                      _text(event.term), _group(event), event.consumer or "",
                      _text(event.lease), "possible duplicate" if event.possible_duplicate
                      else "", _text(event.attempt),
                      _iso(event.deliver_at_ms) if event.deliver_at_ms else "", _detail(event))
    return table


def _detail(event: TracedEvent) -> str:
    parts = [f"handle {event.handle}"]
    if event.new_handle is not None:
        parts.append(f"copy {event.new_handle}" + (f" in {event.topic}"
                                                    if event.event == "dead_lettered" else ""))
    if event.deadline_ms is not None:
        parts.append(f"deadline {_iso(event.deadline_ms)}")
    if event.old_deliver_at_ms is not None:
        parts.append(f"was due {_iso(event.old_deliver_at_ms)}")
    return "; ".join(parts)


def _group(event: TracedEvent) -> str:
    if event.group is None:
        return ""
    return event.group or "(default)"


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).isoformat(timespec="milliseconds")
