"""The ``tickwheel`` command.

::

    tickwheel serve [--config FILE] [flags]       one node (default: a single-node cluster)
    tickwheel cluster up --nodes 3                 a local multi-process cluster, until Ctrl-C
                                                   (tickwheel.cli)
    tickwheel cluster grow --shards 4              more shards for the cluster up running
    tickwheel schedule --topic T --in 10s --body "hello"     (or --at ISO8601, --level N;
                                                              --file FILE)
    tickwheel consume --topic T [--count N] [--nack]         (T may be '%DLQ%orders')
    tickwheel cancel HANDLE [HANDLE ...]
    tickwheel reschedule (--in DURATION | --at ISO8601) HANDLE [HANDLE ...]
    tickwheel status
    tickwheel ledger fetch --out DIR [--since 6h] [--until ISO8601]   every node's ledger
    tickwheel trace (ID | --handle H) [--json]     a message's life from every node's ledger
    tickwheel upgrade finalize                     this release's formats from now on: no
                                                   going back (docs/replication.md)
    tickwheel certs DIR [--host H ...]             TLS files, a token and an access file to try
    tickwheel token [--name N]                     a bearer token and its access file lines

Client commands talk to ``--target`` (default ``$TICKWHEEL_TARGET`` or 127.0.0.1:7400; a
comma-separated list is fine) and find the leader on their own. They dial TLS and show a
token: ``--ca-file``, ``--token-file`` (or ``--cert-file`` and ``--key-file``), by default
``$TICKWHEEL_CA_FILE``, ``$TICKWHEEL_TOKEN_FILE``, ...; ``--insecure`` for a node run
``--insecure-grpc``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from rich.progress import Progress
from rich.table import Table

from tickwheel.client import Client, ClusterInfo, Credentials, Message, TickwheelClientError
from tickwheel.node.cli import credentials as cli_credentials
from tickwheel.node.cli import ledger as cli_ledger
from tickwheel.node.cli import serve as cli_serve
from tickwheel.node.cli.terminal import console
from tickwheel.node.cli.upgrade import add_upgrade_parser, upgrade_line
from tickwheel.node.settings.shards import shard_member

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_BATCH_MSGS = 500


def duration_ms(text: str) -> int:
    """``10s``, ``250ms``, ``1h30m``, ``2d`` -> milliseconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 10s, 250ms, 1h30m")
    return sum(int(number) * _UNIT_MS[unit] for number, unit in parts)


def instant_ms(text: str) -> int:
    """An ISO 8601 time (with a zone; local time without one) -> Unix ms."""
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time: {error}") from None


AddCommands = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
"""Adds commands of a layer above the node's (`tickwheel.cli` adds ``cluster up``)."""


def main(argv: list[str] | None = None, more: AddCommands | None = None) -> int:
    """The node's commands, and those ``more`` adds; ``python -m tickwheel.node`` runs the
    node's alone (everything but ``cluster up``)."""
    args = _parser(more).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.command == "serve" else logging.WARNING,
                        stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except TickwheelClientError as error:
        console.print(f"[red]error[/red] {error}")
        return 1
    except _BadCredentials as error:
        console.print(f"[red]bad credentials[/red] {error}")
        return 2
    except KeyboardInterrupt:
        return 130


class _BadCredentials(Exception):
    """A client command's credentials cannot be read."""


def _credentials(args: argparse.Namespace) -> Credentials:
    try:
        return Credentials.load(ca_file=args.ca_file, token_file=args.token_file,
                                cert_file=args.cert_file, key_file=args.key_file,
                                insecure=args.insecure)
    except ValueError as error:
        raise _BadCredentials(str(error)) from None


def _client(args: argparse.Namespace) -> Client:
    return Client(args.target, credentials=_credentials(args))


def _schedule(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.file is None:
            body = args.body if args.body is not None else ""
            result = client.schedule(args.topic, body, deliver_at_ms=args.at,
                                     delay_ms=args.delay, delay_level=args.level, id=args.id,
                                     properties=dict(args.property))
            clamped = (f" (level clamped to {result.clamped_delay_level}, the last)"
                       if result.clamped_delay_level else "")
            console.print(f"scheduled id={result.id} handle={result.handle} "
                          f"deliver_at={_iso(result.deliver_at_ms)}{clamped}"
                          f"{' (duplicate id: first result)' if result.duplicate else ''}")
            return 0
        return _schedule_file(client, args)


def _schedule_file(client: Client, args: argparse.Namespace) -> int:
    """One message per line: JSON objects (fields of `tickwheel.client.Message`; the flags
    give the defaults), or plain text bodies."""
    lines = args.file.read_text().splitlines()
    total = 0
    with Progress(console=console) as progress:
        task = progress.add_task(f"scheduling {args.file}", total=len(lines))
        for batch in _batches(_file_messages(lines, args), _BATCH_MSGS):
            total += len(client.schedule_many(batch))
            progress.advance(task, len(batch))
    console.print(f"scheduled {total} messages")
    return 0


def _file_messages(lines: list[str], args: argparse.Namespace) -> Iterator[Message]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = json.loads(line) if line.lstrip().startswith("{") else {"body": line}
        if not isinstance(fields, dict):
            raise SystemExit(f"{args.file}:{number}: not a JSON object")
        if not {"deliver_at_ms", "delay_ms", "delay_level"} & set(fields):
            fields["deliver_at_ms"], fields["delay_ms"] = args.at, args.delay
            fields["delay_level"] = args.level
        fields.setdefault("topic", args.topic)
        yield Message(**fields)


def _batches(items: Iterator[Message], size: int) -> Iterator[list[Message]]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _consume(args: argparse.Namespace) -> int:
    received = 0
    with _client(args) as client, client.consume(
            args.topic, prefetch=args.prefetch,
            visibility_timeout_ms=args.visibility_timeout or 0) as consumer:
        for message in consumer:
            flags = " possible-duplicate" if message.possible_duplicate else ""
            console.print(f"{_iso(message.delivered_at_ms)} id={message.id} "
                          f"attempt={message.attempt} late={message.lateness_ms}ms{flags} "
                          f"body={message.body[:200]!r}", highlight=False)
            if args.nack:
                message.nack()
            elif not args.no_ack:
                message.ack()
            received += 1
            if args.count and received >= args.count:
                break
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        for handle, outcome in zip(args.handles, client.cancel_outcomes(args.handles),
                                   strict=True):
            console.print(f"{handle}: {outcome.value.replace('_', ' ')}")
    return 0


def _reschedule(args: argparse.Namespace) -> int:
    with _client(args) as client:
        results = client.reschedule(args.handles, deliver_at_ms=args.at, delay_ms=args.delay)
        for handle, result in zip(args.handles, results, strict=True):
            due = f" deliver_at={_iso(result.deliver_at_ms)}" if result.deliver_at_ms else ""
            console.print(f"{handle}: {result.outcome.value.replace('_', ' ')}{due}")
    return 0


def _status(args: argparse.Namespace) -> int:
    """The cluster as tables: its members, messages and groups; per shard, with several."""
    with _client(args) as client:
        info = client.cluster_info()
        if not info.shards:
            _shard_status(client, info, "")
            return 0
        for shard in info.shards:
            view = None
            for address in shard.grpc_addresses:
                with contextlib.suppress(TickwheelClientError):
                    view = client.cluster_info(address)
                    break
            if view is None:
                console.print(f"[red]shard {shard.shard}: no member answers[/red] "
                              f"({', '.join(shard.grpc_addresses)})")
                continue
            _shard_status(client, view, f"shard {shard.shard} of {len(info.shards)} (map "
                                        f"version {view.map_version}): ")
    return 0


def _grow_shards(args: argparse.Namespace) -> int:
    """Copy the groups to the shards added, then have every shard take the new map."""
    added: dict[int, list[tuple[str, str]]] = {}
    for entry in args.shard_members:
        try:
            number, address, peer = shard_member(entry)
        except ValueError:
            peer = ""
        if not peer:
            console.print(f"[red]error[/red] --shard-member {entry!r} is not "
                          "SHARD=GRPC_ADDRESS=PEER_ADDRESS")
            return 2
        added.setdefault(number, []).append((address, peer))
    shards = sorted(added)
    if shards != list(range(shards[0], shards[0] + len(shards))):
        console.print(f"[red]error[/red] --shard-member names shards {shards}: the shards "
                      "added are numbered on from the cluster's, without gaps")
        return 2
    with _client(args) as client:
        count = client.refresh_shards().count
        if shards[0] not in (count, count - len(shards)):
            console.print(f"[red]error[/red] the cluster has {count} shards: the shards "
                          f"added are numbered from {count}")
            return 2
        version = client.grow_shards([[a for a, _ in added[k]] for k in shards],
                                     [[p for _, p in added[k]] for k in shards])
        console.print(f"shard map version {version}: {client.shards().count} shards")
    return 0


def _shard_status(client: Client, info: ClusterInfo, title: str) -> None:
    """One Raft group's tables, from ``info`` (a member's answer)."""
    leader = client.cluster_info(info.leader_grpc) if info.leader_grpc else info
    versions = {member.raft_address: member.version for member in leader.members}
    table = Table(title=f"{title}term {info.term}, leader {info.leader_grpc or 'unknown'}")
    for column in ("member (gRPC)", "Raft", "role", "term", "applied", "lag", "cursor",
                   "version"):
        table.add_column(column)
    for member in info.members:
        try:
            seen = client.cluster_info(member.grpc_address)
        except TickwheelClientError:
            table.add_row(member.grpc_address, member.raft_address, "[red]down[/red]",
                          "", "", "", "", "")
            continue
        table.add_row(member.grpc_address, member.raft_address, seen.role,
                      str(seen.term), str(seen.last_applied), str(member.lag_entries),
                      f"{_iso(seen.cursor_second * 1000)} #{seen.cursor_local_index}",
                      str(versions.get(member.raft_address) or "?"))
    console.print(table)
    if leader.topics or leader.pending or leader.pending_untracked:
        console.print(_topics_table(leader))
    if leader.groups:
        console.print(_groups_table(leader))
    console.print(f"cursor lag: {leader.cursor_lag_ms} ms; handed to groups past the "
                  f"cursor: {leader.readied_past_cursor}")
    console.print(upgrade_line(leader.cluster_version, list(versions.values())))


def _groups_table(info: ClusterInfo) -> Table:
    table = Table(title="consumer groups (ready and leased are replicated)")
    for column in ("topic", "group", "ready", "leased", "consumers", "dropped"):
        table.add_column(column)
    for group in info.groups:
        table.add_row(group.topic, group.group or "(default)", str(group.ready),
                      str(group.leased), str(group.consumers), str(group.dropped))
    return table


def _topics_table(info: ClusterInfo) -> Table:
    """Per topic: pending (replicated), and due on the leader (ready, unacked, consumers)."""
    table = Table(title="messages per topic (pending: not yet done; ready, unacked: due)")
    for column in ("topic", "pending", "ready", "unacked", "consumers"):
        table.add_column(column)
    due = {topic.topic: topic for topic in info.topics}
    pending = {topic.topic: topic.pending for topic in info.pending}
    for name in sorted(due.keys() | pending.keys()):
        topic = due.get(name)
        table.add_row(name, str(pending.get(name, 0)), *(
            ("", "", "") if topic is None else
            (str(topic.ready), str(topic.unacked), str(topic.consumers))))
    if info.pending_untracked:
        table.add_row("(untracked topics)", str(info.pending_untracked), "", "", "")
    return table


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).isoformat(timespec="milliseconds")


def _property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _parser(more: AddCommands | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickwheel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    cli_serve.add_parser(commands.add_parser("serve", help="run one node"))
    if more is not None:
        more(commands)
    connection = _connection_parser()

    cli_credentials.add_parsers(commands)

    schedule = commands.add_parser("schedule", parents=[connection],
                                   help="schedule a message (or a file of them)")
    schedule.add_argument("--topic", required=True)
    when = schedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--in", dest="delay", type=duration_ms, metavar="DURATION")
    when.add_argument("--at", type=instant_ms, metavar="ISO8601")
    when.add_argument("--level", type=int, metavar="N",
                      help="a delay level of the node's table (RocketMQ's messageDelayLevel: "
                           "1s 5s 10s 30s 1m ... 2h by default); above the last, the last")
    what = schedule.add_mutually_exclusive_group()
    what.add_argument("--body")
    what.add_argument("--file", type=Path, help="one message per line (JSON or text)")
    schedule.add_argument("--id")
    schedule.add_argument("--property", type=_property, action="append", default=[],
                          metavar="KEY=VALUE")
    schedule.set_defaults(handler=_schedule)

    consume = commands.add_parser("consume", parents=[connection],
                                  help="print (and acknowledge) due messages")
    consume.add_argument("--topic", required=True,
                         help="a topic, or its dead letters: '%%DLQ%%TOPIC'")
    consume.add_argument("--count", type=int, default=0, help="stop after this many")
    consume.add_argument("--prefetch", type=int, default=64)
    consume.add_argument("--visibility-timeout", type=duration_ms, metavar="DURATION")
    reply = consume.add_mutually_exclusive_group()
    reply.add_argument("--no-ack", action="store_true",
                       help="neither ack nor nack: each comes back after the visibility timeout")
    reply.add_argument("--nack", action="store_true",
                       help="nack each: retried on the back-off ladder, then dead-lettered")
    consume.set_defaults(handler=_consume)

    cancel = commands.add_parser("cancel", parents=[connection],
                                 help="cancel scheduled messages by handle")
    cancel.add_argument("handles", type=int, nargs="+")
    cancel.set_defaults(handler=_cancel)
    reschedule = commands.add_parser(
        "reschedule", parents=[connection],
        help="move pending messages to a new due time, by handle")
    when = reschedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--in", dest="delay", type=duration_ms, metavar="DURATION",
                      help="due this long from now ('0s': now)")
    when.add_argument("--at", type=instant_ms, metavar="ISO8601")
    reschedule.add_argument("handles", type=int, nargs="+")
    reschedule.set_defaults(handler=_reschedule)

    status = commands.add_parser("status", parents=[connection], help="the cluster as a table")
    status.set_defaults(handler=_status)

    grow = commands.add_parser(
        "grow-shards", parents=[connection],
        help="add shards to a running cluster, once their nodes run (docs/shards.md)")
    grow.add_argument("--shard-member", dest="shard_members", action="append", required=True,
                      metavar="SHARD=GRPC_ADDRESS=PEER_ADDRESS",
                      help="a member of a shard added (repeat for each, in member order)")
    grow.set_defaults(handler=_grow_shards)
    cli_ledger.add_parsers(commands, connection, duration_ms, _credentials)
    add_upgrade_parser(commands, connection, _client)
    return parser


def _connection_parser() -> argparse.ArgumentParser:
    """Where client commands connect, and as whom; defaults from ``TICKWHEEL_*``."""
    connection = argparse.ArgumentParser(add_help=False)
    env = os.environ.get
    connection.add_argument("--target", default=env("TICKWHEEL_TARGET", "127.0.0.1:7400"))
    connection.add_argument("--ca-file", type=Path, default=env("TICKWHEEL_CA_FILE"),
                            help="the CA of the nodes' certificates (default: "
                                 "$TICKWHEEL_CA_FILE, else the system's roots)")
    connection.add_argument("--token-file", type=Path, default=env("TICKWHEEL_TOKEN_FILE"),
                            help="a file holding the bearer token (default: "
                                 "$TICKWHEEL_TOKEN_FILE)")
    connection.add_argument("--cert-file", type=Path, default=env("TICKWHEEL_CERT_FILE"),
                            help="a client certificate, for nodes that ask for one")
    connection.add_argument("--key-file", type=Path, default=env("TICKWHEEL_KEY_FILE"))
    connection.add_argument("--insecure", action="store_true",
                            default=env("TICKWHEEL_INSECURE", "").lower() in ("1", "true"),
                            help="plaintext, no credentials: for a node run --insecure-grpc")
    return connection


