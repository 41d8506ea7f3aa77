"""The ``tickwheel`` command.

::

    tickwheel serve [--config FILE] [flags]       one node (default: a single-node cluster)
    tickwheel cluster up --nodes 3                 a local multi-process cluster, until Ctrl-C
    tickwheel schedule --topic T --in 10s --body "hello"     (or --at ISO8601, --level N;
                                                              --file FILE)
    tickwheel consume --topic T [--count N] [--nack]         (T may be '%DLQ%orders')
    tickwheel cancel HANDLE [HANDLE ...]
    tickwheel reschedule (--in DURATION | --at ISO8601) HANDLE [HANDLE ...]
    tickwheel status
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
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tickwheel.client import Client, Credentials, Message, TickwheelClientError
from tickwheel.node import config as node_config
from tickwheel.node.access import ACCESS_KEY_PATTERN, new_token, token_digest
from tickwheel.node.rocketmq.signature import secret_key
from tickwheel.node.serve import run
from tickwheel.replication import dev_credentials
from tickwheel.replication.local_cluster import LocalCluster
from tickwheel.v1 import tickwheel_pb2 as pb

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_BATCH_MSGS = 500
console = Console()


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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.command == "serve" else logging.WARNING,
                        stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return args.handler(args)
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


def _client(args: argparse.Namespace) -> Client:
    try:
        credentials = Credentials.load(ca_file=args.ca_file, token_file=args.token_file,
                                       cert_file=args.cert_file, key_file=args.key_file,
                                       insecure=args.insecure)
    except ValueError as error:
        raise _BadCredentials(str(error)) from None
    return Client(args.target, credentials=credentials)


def _serve(args: argparse.Namespace) -> int:
    flags = {name: value for name, value in vars(args).items()
             if name in node_config.NodeSettings.model_fields and value is not None}
    try:
        settings = node_config.load(args.config, flags)
    except (ValidationError, FileNotFoundError) as error:
        console.print(f"[red]bad configuration[/red]\n{error}")
        return 2
    return run(settings)


def _cluster_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.data.resolve(), args.nodes, base_port=args.base_port,
                           metrics=True, insecure_grpc=args.insecure_grpc)
    with cluster:
        leader = cluster.leader(timeout_s=30)
        table = Table(title=f"tickwheel: {args.nodes}-node cluster (Ctrl-C stops it)")
        for column in ("node", "gRPC", "Raft", "metrics", "pid", "log"):
            table.add_column(column)
        for i, node in enumerate(cluster.nodes):
            table.add_row(f"{i}{' (leader)' if node is leader else ''}", node.grpc_address,
                          node.raft, node.metrics_address or "-", str(node.pid),
                          str(node.log_path))
        console.print(table)
        targets = ",".join(node.grpc_address for node in cluster.nodes)
        environment = cluster.security.environment() if cluster.security else {
            "TICKWHEEL_INSECURE": "1"}
        console.print("try:\n  export " + " ".join(
            f"{name}={value}" for name, value in {"TICKWHEEL_TARGET": targets,
                                                  **environment}.items())
            + "\n  tickwheel status", highlight=False, soft_wrap=True)
        try:
            while all(node.alive() for node in cluster.nodes):
                time.sleep(0.5)
            console.print("[red]a node exited; stopping the cluster[/red]")
            return 1
        except KeyboardInterrupt:
            console.print("stopping")
    return 0


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
    with _client(args) as client:
        info = client.cluster_info()
        table = Table(title=f"term {info.term}, leader {info.leader_grpc or 'unknown'}")
        for column in ("member (gRPC)", "Raft", "role", "term", "applied", "lag", "cursor"):
            table.add_column(column)
        for member in info.members:
            try:
                seen = client.cluster_info(member.grpc_address)
            except TickwheelClientError:
                table.add_row(member.grpc_address, member.raft_address, "[red]down[/red]",
                              "", "", "", "")
                continue
            table.add_row(member.grpc_address, member.raft_address, seen.role,
                          str(seen.term), str(seen.last_applied), str(member.lag_entries),
                          f"{_iso(seen.cursor_second * 1000)} #{seen.cursor_local_index}")
        console.print(table)
        leader = client.cluster_info(info.leader_grpc) if info.leader_grpc else info
        if leader.topics or leader.pending or leader.pending_untracked:
            console.print(_topics_table(leader))
        if leader.groups:
            console.print(_groups_table(leader))
        console.print(f"cursor lag: {leader.cursor_lag_ms} ms; handed to groups past the "
                      f"cursor: {leader.readied_past_cursor}")
    return 0


def _groups_table(info: pb.ClusterInfoResponse) -> Table:
    table = Table(title="consumer groups (ready and leased are replicated)")
    for column in ("topic", "group", "ready", "leased", "consumers", "dropped"):
        table.add_column(column)
    for group in info.groups:
        table.add_row(group.topic, group.group or "(default)", str(group.ready),
                      str(group.leased), str(group.consumers), str(group.dropped))
    return table


def _topics_table(info: pb.ClusterInfoResponse) -> Table:
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickwheel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    _serve_parser(commands.add_parser("serve", help="run one node"))
    cluster = commands.add_parser("cluster", help="a local multi-process cluster")
    up = cluster.add_subparsers(dest="action", required=True).add_parser("up")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--data", type=Path, default=Path("data/cluster"))
    up.add_argument("--base-port", type=int, default=7400,
                    help="gRPC on BASE+i, Raft on BASE+100+i, peers on BASE+200+i, metrics "
                         "on BASE+2000+i")
    up.add_argument("--insecure-grpc", action="store_true",
                    help="serve gRPC in plaintext to anyone (default: TLS and a token, made "
                         "under DATA/security)")
    up.set_defaults(handler=_cluster_up)
    connection = _connection_parser()

    _credential_parsers(commands)

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


def _certs(args: argparse.Namespace) -> int:
    hosts = args.host or ["127.0.0.1", "localhost"]
    made = dev_credentials.make(args.dir.resolve(), hosts)
    console.print(f"made in {made.root} (an existing set is kept; not for production):\n"
                  f"  tickwheel serve {' '.join(made.node_flags())}\n"
                  f"  export {' '.join(f'{k}={v}' for k, v in made.environment().items())}",
                  highlight=False, soft_wrap=True)
    return 0


def _token(args: argparse.Namespace) -> int:
    token = new_token()
    console.print(f"token (give it to the client; it is not stored anywhere):\n  {token}\n"
                  f"for the node's access file:\n"
                  f"  [[principal]]\n  name = {json.dumps(args.name)}\n"
                  f"  tokens = [\"{token_digest(token)}\"]", highlight=False, soft_wrap=True)
    return 0


def _credential_parsers(commands: argparse._SubParsersAction) -> None:
    """``certs``, ``token`` and ``rocketmq-key``: what a node and its clients prove
    themselves with."""
    certs = commands.add_parser(
        "certs", help="make a CA, a node certificate, an admin token and an access file "
                      "to try a node with (not for production)")
    certs.add_argument("dir", type=Path)
    certs.add_argument("--host", action="append", default=[],
                       help="a name or IP the node certificate covers (repeatable; default "
                            "127.0.0.1 and localhost)")
    certs.set_defaults(handler=_certs)
    token = commands.add_parser("token", help="make a bearer token and its access file lines")
    token.add_argument("--name", default="my-service", help="the principal's name")
    token.set_defaults(handler=_token)
    _rocketmq_key_parser(commands.add_parser(
        "rocketmq-key", help="the SecretKey of a RocketMQ AccessKey, and its access file line"))


def _rocketmq_key_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("access_key", help="the AccessKey, as the client will send it")
    parser.add_argument("--raft-secret-file", type=Path,
                        default=os.environ.get("TICKWHEEL_RAFT_SECRET_FILE"),
                        help="the cluster's Raft secret (default: TICKWHEEL_RAFT_SECRET_FILE, "
                             "or TICKWHEEL_RAFT_SECRET)")
    parser.set_defaults(handler=_rocketmq_key)


def _rocketmq_key(args: argparse.Namespace) -> int:
    if not re.fullmatch(ACCESS_KEY_PATTERN, args.access_key):
        console.print(f"[red]error[/red] {args.access_key!r} is not 1-128 of [A-Za-z0-9_.-]")
        return 2
    try:
        text = (args.raft_secret_file.read_text() if args.raft_secret_file
                else os.environ.get("TICKWHEEL_RAFT_SECRET", ""))
    except OSError as error:
        console.print(f"[red]error[/red] {args.raft_secret_file}: {error.strerror}")
        return 2
    raft_secrets = text.split()
    if not raft_secrets:
        console.print("[red]error[/red] no Raft secret: give --raft-secret-file (or "
                      "TICKWHEEL_RAFT_SECRET)")
        return 2
    key = secret_key(raft_secrets[0].encode(), args.access_key)
    console.print(f"SecretKey of AccessKey {args.access_key} (give it to the client; the "
                  f"nodes derive it, nothing stores it):\n  {key}\n"
                  f"in the principal's entry of the access file:\n"
                  f"  rocketmq_access_keys = [{json.dumps(args.access_key)}]",
                  highlight=False, soft_wrap=True)
    return 0


def _serve_parser(serve: argparse.ArgumentParser) -> None:
    """Flags mirror `NodeSettings` fields; a flag not given leaves env, file or default."""
    serve.add_argument("--config", type=Path, help="a TOML file")
    serve.add_argument("--raft-address")
    serve.add_argument("--raft-listen", help="where to bind Raft (default: --raft-address)")
    serve.add_argument("--member", dest="members", action="append",
                       metavar="RAFT_ADDRESS=GRPC_ADDRESS=PEER_ADDRESS")
    serve.add_argument("--grpc-listen")
    serve.add_argument("--rocketmq-listen",
                       help="HOST:PORT to serve RocketMQ 5's client protocol at (off unless "
                            "given; docs/rocketmq.md)")
    serve.add_argument("--rocketmq-advertise",
                       help="HOST:PORT RocketMQ routes name (default: the address the client "
                            "asked with)")
    serve.add_argument("--metrics-listen", help="HOST:PORT, or '' for none")
    serve.add_argument("--health-listen",
                       help="HOST:PORT for grpc.health.v1 alone, in plaintext (probes)")
    serve.add_argument("--data", type=Path)
    serve.add_argument("--fsync", action="store_true", default=None)
    serve.add_argument("--sync-ledger", type=Path,
                       help="with --fsync: note what each sync made durable here, for the "
                            "chaos harness's power cut (testing only)")
    serve.add_argument("--raft-secret-file", type=Path,
                       help="the cluster's shared Raft secret, from this file (or "
                            "TICKWHEEL_RAFT_SECRET; never on the command line)")
    serve.add_argument("--insecure-raft", action="store_true", default=None,
                       help="run a cluster's Raft links without a secret: anyone who can "
                            "reach the port can join it")
    serve.add_argument("--peer-listen", help="where to bind the peer listener (default: this "
                                             "node's PEER in --member)")
    serve.add_argument("--tls-cert-file", type=Path, help="this node's certificate (PEM)")
    serve.add_argument("--tls-key-file", type=Path)
    serve.add_argument("--tls-ca-file", type=Path,
                       help="the CA of the members' (and client) certificates")
    serve.add_argument("--tls-client-certs", action="store_true", default=None,
                       help="clients must present a certificate signed by --tls-ca-file")
    serve.add_argument("--access-file", type=Path,
                       help="principals, their tokens and grants (TOML; reread on change)")
    serve.add_argument("--insecure-grpc", action="store_true", default=None,
                       help="serve gRPC in plaintext to anyone, with every permission")
    serve.add_argument("--clock-skew-ms", type=int, help="fault injection only")
    serve.add_argument("--delay-levels", metavar="TABLE",
                       help="what delay_level 1, 2, ... mean and the retry ladder's steps "
                            "(RocketMQ's messageDelayLevel; units s m h d; default "
                            "'1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h')")
    serve.add_argument("--retry-start-level", type=int,
                       help="the level a first nack waits (default 3: 10 s)")
    serve.add_argument("--max-attempts", type=int,
                       help="a nack of this attempt dead-letters the message to "
                            "'%%DLQ%%TOPIC' (default 16)")
    for name in ("snapshot_min_entries", "max_body_bytes", "max_delay_ms", "max_properties",
                 "max_properties_bytes", "max_batch_msgs", "max_stream_msgs", "max_credits",
                 "max_request_bytes", "max_concurrent_rpcs",
                 "visibility_timeout_ms", "max_inflight_msgs", "max_inflight_bytes",
                 "max_queued_msgs", "max_topic_labels", "max_ready_msgs", "max_groups",
                 "max_moved_msgs", "min_free_bytes"):
        serve.add_argument(f"--{name.replace('_', '-')}", type=int)
    serve.set_defaults(handler=_serve)
