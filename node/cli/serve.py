"""``tickwheel serve``: one node, its settings from flags, ``TICKWHEEL_*``, a TOML file and
defaults (`tickwheel.node.settings.config`), in that order (`tickwheel.node.cli.commands` adds
it to the command)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from tickwheel.node.cli.terminal import console


def add_parser(serve: argparse.ArgumentParser) -> None:
    """Flags mirror `NodeSettings` fields; a flag not given leaves env, file or default."""
    serve.add_argument("--config", type=Path, help="a TOML file")
    serve.add_argument("--raft-address")
    serve.add_argument("--raft-listen", help="where to bind Raft (default: --raft-address)")
    serve.add_argument("--member", dest="members", action="append",
                       metavar="RAFT_ADDRESS=GRPC_ADDRESS=PEER_ADDRESS")
    serve.add_argument("--shard", type=int,
                       help="the shard this node's Raft group is (default 0; docs/shards.md)")
    serve.add_argument("--shard-member", dest="shard_members", action="append",
                       metavar="SHARD=GRPC_ADDRESS[=PEER_ADDRESS]",
                       help="a member of another shard (repeat for each)")
    serve.add_argument("--shards", type=int,
                       help="how many shards the cluster has: the map must have as many (a "
                            "StatefulSet pod derives --shard-member from it)")
    serve.add_argument("--shard-map-version", type=int,
                       help="the map's version: 1, plus 1 per growth (docs/shards.md)")
    serve.add_argument("--grown-from", type=int,
                       help="how many shards the map had before its last growth (a node of a "
                            "shard added by it)")
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
                            "chaos runner's power cut (testing only)")
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
    serve.add_argument("--stall-health-elections", type=int,
                       help="election timeouts of an applied index standing still while the "
                            "commit index moves before health is NOT_SERVING (default 10)")
    serve.add_argument("--stall-exit-elections", type=int,
                       help="... before the node exits with code 7, EXIT_STALLED (default 60)")
    serve.add_argument("--no-ledger", dest="ledger", action="store_false", default=None,
                       help="keep no ledger (DATA/ledger/): only to measure what it costs")
    serve.add_argument("--fault-injection", action="store_true", default=None,
                       help="testing only: obey live faults written to the data folder (a "
                            "clock step); never on a production node")
    serve.add_argument("--delay-levels", metavar="TABLE",
                       help="what delay_level 1, 2, ... mean and the retry ladder's steps "
                            "(RocketMQ's messageDelayLevel; units s m h d; default "
                            "'1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h')")
    serve.add_argument("--retry-start-level", type=int,
                       help="the level a first nack waits (default 3: 10 s)")
    serve.add_argument("--max-attempts", type=int,
                       help="a nack of this attempt dead-letters the message to "
                            "'%%DLQ%%TOPIC' (default 16)")
    serve.add_argument("--max-unacked-timeouts", type=int,
                       help="a consumer stream that has acked nothing is closed once this many "
                            "of its messages' visibility timeouts ran out (default 3; 0: never)")
    for name in ("snapshot_min_entries", "max_body_bytes", "max_delay_ms", "max_properties",
                 "max_properties_bytes", "max_batch_msgs", "max_stream_msgs", "max_credits",
                 "max_request_bytes", "max_concurrent_rpcs", "max_principal_rpcs",
                 "max_request_memory_bytes", "max_principal_request_memory_bytes",
                 "request_read_timeout_ms", "max_streams_per_connection", "max_metadata_bytes",
                 "handshake_timeout_ms", "idle_connection_ms",
                 "visibility_timeout_ms", "max_inflight_msgs", "max_inflight_bytes",
                 "max_queued_msgs", "max_topic_labels", "max_ready_msgs", "max_groups",
                 "max_moved_msgs", "min_free_bytes", "schedule_linger_ms", "ledger_max_age_s",
                 "ledger_max_bytes", "ledger_segment_bytes", "ledger_segment_age_ms",
                 "ledger_buffer_rows"):
        serve.add_argument(f"--{name.replace('_', '-')}", type=int)
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    # Here, not at the top: the node's face imports the commands, and a process that takes
    # only the credentials from it must not load the server (`tickwheel.node`).
    from tickwheel.node.serve import run  # noqa: PLC0415
    from tickwheel.node.settings import config as node_config  # noqa: PLC0415

    flags = {name: value for name, value in vars(args).items()
             if name in node_config.NodeSettings.model_fields and value is not None}
    try:
        settings = node_config.load(args.config, flags)
    except (ValidationError, FileNotFoundError) as error:
        console.print(f"[red]bad configuration[/red]\n{error}")
        return 2
    return run(settings)
