"""``python -m tickwheel.node serve``: one node of a cluster, until SIGTERM or SIGINT.

Each member is given as ``RAFT_ADDRESS=GRPC_ADDRESS``; ``--self`` names this node's Raft address.
Deliveries go to the delivery journal (``DATA/deliveries.jsonl``) until consumers exist
(issue 4). ``--clock-skew-ms`` offsets this node's clock, for fault injection only.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from tickwheel.node.journal import DeliveryJournal
from tickwheel.node.peers import PeerFiles
from tickwheel.node.server import start_server
from tickwheel.replication.clock import SystemClock
from tickwheel.replication.dispatcher import Delivery
from tickwheel.replication.raft import RaftConfig
from tickwheel.replication.replica import Replica, ReplicaConfig
from tickwheel.wheel import Cursor

log = logging.getLogger("tickwheel.node")


class JournalSink:
    """Writes each delivery to the journal and acknowledges it at once."""

    def __init__(self, journal: DeliveryJournal) -> None:
        self._journal = journal
        self._term = 0
        self.replica: Replica | None = None

    def dispatch_started(self, term: int, epoch: int, cursor: Cursor, takeover_ms: int) -> None:
        self._term = term
        self._journal.dispatch_started(term, epoch, cursor, takeover_ms)

    def deliver(self, deliveries: list[Delivery]) -> None:
        self._journal.delivered(deliveries, self._term)
        for delivery in deliveries:
            self.replica.ack(delivery.epoch, delivery.message.position)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tickwheel.node serve", description=__doc__)
    parser.add_argument("--self", dest="self_address", required=True, metavar="RAFT_ADDRESS")
    parser.add_argument("--member", action="append", required=True,
                        metavar="RAFT_ADDRESS=GRPC_ADDRESS")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--clock-skew-ms", type=int, default=0)
    parser.add_argument("--fsync", action="store_true")
    parser.add_argument("--password", default=None)
    parser.add_argument("--snapshot-min-entries", type=int,
                        default=RaftConfig().snapshot_min_entries)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    members = dict(member.split("=", 1) for member in args.member)
    if args.self_address not in members:
        raise SystemExit(f"--self {args.self_address} is not among the --member addresses")
    clock = SystemClock(args.clock_skew_ms)
    journal = DeliveryJournal(args.data / "deliveries.jsonl", args.self_address, clock.now_ms)
    sink = JournalSink(journal)
    peers = [address for address in members if address != args.self_address]
    fetch = PeerFiles(members)
    config = ReplicaConfig(raft=RaftConfig(fsync=args.fsync, password=args.password,
                                           snapshot_min_entries=args.snapshot_min_entries))
    replica = Replica(args.self_address, peers, args.data, sink, fetch=fetch, clock=clock,
                      config=config)
    sink.replica = replica
    server = start_server(replica, members[args.self_address])
    replica.start()
    log.info("event=node_started raft=%s grpc=%s data=%s clock_skew_ms=%d", args.self_address,
             members[args.self_address], args.data, args.clock_skew_ms)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1).wait()
    replica.stop()
    journal.close()
    fetch.close()
    return 0
