"""``tickwheel serve``: one node of a cluster, until SIGTERM or SIGINT.

Wires the parts together: the `Replica` (Raft and the wheel, on its own thread), the consumer
`Courier` and the gRPC server (on the asyncio loop), the ledger (on its own thread), metrics, and a
housekeeping task that keeps health, gauges and the leader-change log current.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
import time
from functools import partial

from grpc_health.v1 import health, health_pb2

from tickwheel.client import Credentials
from tickwheel.common.clock import SystemClock
from tickwheel.common.errors import InvariantViolation, StorageIncomplete, StorageLocked
from tickwheel.common.exits import EXIT_STORAGE_REFUSED
from tickwheel.node.api.admission import Admission
from tickwheel.node.api.context import NodeContext
from tickwheel.node.api.forward import Forwarder
from tickwheel.node.api.info import cursor_lag_ms
from tickwheel.node.api.placement import LiveShardMap
from tickwheel.node.api.server import SERVICE_NAME
from tickwheel.node.api.unary import UnaryConsumers
from tickwheel.node.delivery.courier import Courier, CourierConfig
from tickwheel.node.ledger import LEDGER_FOLDER
from tickwheel.node.ledger.metrics import LedgerMetrics
from tickwheel.node.ledger.writer import Ledger
from tickwheel.node.listeners import Listeners, start_server
from tickwheel.node.ops.allocator import Allocator, give_back_released
from tickwheel.node.ops.clock_step import ClockStep
from tickwheel.node.ops.disk import DiskWatch, poll_peers
from tickwheel.node.ops.metrics import Metrics
from tickwheel.node.ops.watchdog import ApplyWatchdog, WatchdogLimits
from tickwheel.node.peers import PeerFiles
from tickwheel.node.rocketmq.signature import Signatures
from tickwheel.node.security.access import AccessFile
from tickwheel.node.security.identity import (
    ClientCallers,
    PeerCallers,
    ServerCertificates,
)
from tickwheel.node.security.quotas import Quotas
from tickwheel.node.settings.config import NodeSettings
from tickwheel.replication import Replica

log = logging.getLogger("tickwheel.node")

HOUSEKEEPING_S = 0.2
GC_YOUNG_THRESHOLD = 10_000
"""Allocations between collections of the youngest generation (Python's default is 700)."""
GC_PAUSE_LOG_MS = 50.0
"""A collection this long is logged."""
GIL_SWITCH_INTERVAL_S = 0.001
"""How long a thread holding the GIL keeps it while another waits (Python's default is 5 ms).
The Raft thread (commits, dispatch) and the event loop (validating a 5,000-message request
takes ~15 ms) each wait on the other; at 20,000 due msg/s 1 ms cut the lateness p99 by a
fifth in three alternating pairs of runs (53-71 -> 44-54 ms), for ~2% of batched
scheduling (within its noise)."""
ACCESS_CHECK_S = 2.0
"""How often a node looks whether its access file changed."""
HEALTH_MAX_LAG_ENTRIES = 1_000
"""A node serves (health) when it knows a leader and has applied to within this many entries
of the leader's commit index."""
STORAGE_HEALTH = "tickwheel.storage"
"""A health service name of its own: NOT_SERVING while this node's disk is below its reserve.
Not what the kubelet probes (a node out of space still delivers): for alerts and operators."""


async def serve(settings: NodeSettings) -> None:
    members = settings.member_map()
    own_clock = SystemClock(settings.clock_skew_ms)
    metrics = Metrics(settings.max_topic_labels, settings.shard)
    ledger = _start_ledger(settings, own_clock, metrics)
    retry = settings.retry_policy()

    def cluster_ms() -> int:
        """The courier sends by the cluster's time: the replica's, made below with the
        courier as its sink."""
        return replica.clock.now_ms()
    courier = Courier(CourierConfig(default_visibility_timeout_ms=settings.visibility_timeout_ms,
                                    max_unacked_timeouts=settings.max_unacked_timeouts),
                      retry, cluster_ms, ledger, metrics)
    access = settings.access()
    peer_callers = PeerCallers(settings.raft_secrets(), access)
    secure = not settings.insecure_grpc
    # how a member dials another's peer listener: TLS trusting the members' CA (or the
    # system's roots without one); its proof of membership is the peer token, per call
    peer_credentials = (Credentials.load(ca_file=settings.tls_ca_file) if secure
                        else Credentials(insecure=True))
    fetch = PeerFiles(settings.peer_map(), peer_credentials, peer_callers.metadata())
    peers = [address for address in members if address != settings.raft_address]
    replica = Replica(settings.raft_address, peers, settings.data, courier, fetch=fetch,
                      copies=fetch.copies, fetch_many=fetch.many, clock=own_clock,
                      config=settings.replica_config(), ledger=ledger)
    courier.attach(replica)
    forwarder = Forwarder(peer_credentials)
    disk = DiskWatch(settings.raft_address, settings.data, settings.min_free_bytes)
    node = NodeContext(replica, courier, members, settings.peer_map(), peer_callers,
                       settings.limits(), retry, replica.clock, metrics, forwarder,
                       UnaryConsumers(courier, replica, replica.clock.now_ms), disk,
                       Admission(settings.admission_limits()),
                       LiveShardMap(settings.shard_map(), lambda: replica.shard_map),
                       Quotas(lambda: int(own_clock.monotonic_s() * 1000),
                              lambda: replica.status().pending,
                              lambda refused: metrics.quota_refusals.labels(
                                  refused.principal, refused.quota).inc()),
                       settings.rocketmq_reach(),
                       ledger_folder=None if ledger is None else ledger.folder,
                       rotate_ledger=None if ledger is None else ledger.rotate)
    servers, health_servicer = await start_server(node, _listeners(settings))
    replica.start()
    if settings.metrics_listen:
        metrics.serve(settings.metrics_listen)
    if not secure:
        log.warning("event=grpc_insecure gRPC is served in plaintext to anyone, with every "
                    "permission (--insecure-grpc): anyone who can reach %s can schedule, read "
                    "and cancel every topic's messages", settings.listen())
    if settings.fault_injection:
        log.warning("event=fault_injection_on this node obeys faults written into %s (a clock "
                    "step): for testing only, never in production", settings.data)
    log.info("event=node_started raft=%s grpc=%s peer=%s rocketmq=%s health=%s metrics=%s "
             "data=%s members=%d shard=%d shards=%d tls=%s client_certs=%s principals=%s "
             "clock_skew_ms=%d fault_injection=%s",
             settings.raft_address, settings.listen(), settings.listen_peers() or "-",
             settings.rocketmq_listen or "-", settings.health_listen or "-",
             settings.metrics_listen or "-", settings.data, len(members), settings.shard,
             settings.shard_map().count, secure, settings.tls_client_certs,
             len(access.current) if access else "-", settings.clock_skew_ms,
             settings.fault_injection)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    clock_step = ClockStep(own_clock, settings.data, settings.fault_injection)
    keeper = asyncio.create_task(_housekeeping(node, health_servicer, access, clock_step,
                                               ApplyWatchdog(settings.raft_address, WatchdogLimits(
                                                   settings.replica_config().raft.election_max_ms,
                                                   settings.stall_health_elections,
                                                   settings.stall_exit_elections))))
    peer_stubs = {member: partial(forwarder.peer_stub, address)
                  for member, address in settings.peer_map().items()
                  if member != settings.raft_address}
    disk_poller = asyncio.create_task(poll_peers(disk, peer_stubs, peer_callers.metadata()))
    trimmer = asyncio.create_task(give_back_released(Allocator(),
                                                     lambda: courier.released_bytes))
    _settle_gc()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    await stop.wait()
    log.info("event=node_stopping")
    keeper.cancel()
    disk_poller.cancel()
    trimmer.cancel()
    await health_servicer.enter_graceful_shutdown()
    await asyncio.gather(*(server.stop(grace=1) for server in servers))
    courier.close()
    await node.forwarder.close()
    await asyncio.to_thread(replica.stop)
    _close_ledger(ledger)
    fetch.close()


def _start_ledger(settings: NodeSettings, clock: SystemClock, metrics: Metrics) -> Ledger | None:
    """The node's ledger, its writer started (None with ``--no-ledger``)."""
    if not settings.ledger:
        return None
    ledger = Ledger(settings.data / LEDGER_FOLDER, settings.raft_address,
                    settings.ledger_config(), clock.now_ms, LedgerMetrics(metrics.registry))
    ledger.start()
    return ledger


def _close_ledger(ledger: Ledger | None) -> None:
    """Write what the ledger holds and close its segment (after the replica stopped)."""
    if ledger is not None:
        ledger.close()


def _listeners(settings: NodeSettings) -> Listeners:
    client_credentials = peer_credentials = rocketmq_credentials = None
    if not settings.insecure_grpc:
        cert_file, key_file = settings.tls_cert_file, settings.tls_key_file
        if cert_file is None or key_file is None:
            raise InvariantViolation("TLS settings were checked")
        client_credentials = ServerCertificates(
            cert_file, key_file,
            settings.tls_ca_file if settings.tls_client_certs else None).credentials()
        peer_credentials = ServerCertificates(cert_file, key_file, None).credentials()
        if settings.rocketmq_listen:
            # RocketMQ's clients present no certificate: a signature names the caller
            rocketmq_credentials = ServerCertificates(cert_file, key_file, None).credentials()
    return Listeners(settings.listen(), client_credentials, ClientCallers(settings.access()),
                     settings.listen_peers(), peer_credentials, settings.health_listen or None,
                     settings.rocketmq_listen or None, rocketmq_credentials,
                     settings.rocketmq_advertise,
                     Signatures(settings.access(), settings.raft_secrets())
                     if settings.rocketmq_listen else None, settings.connection_limits())


def _settle_gc() -> None:
    """Keep the cyclic garbage collector from stalling delivery. Everything allocated by the
    start (modules, grpc, protobuf, pysyncobj: a few hundred thousand objects) is moved out of
    its reach, so a full collection walks only what was made since; and young collections run
    less often. Measured at 5,000 msg/s before this: full collections of 57-213 ms on the
    leader, 57-68 ms on followers, each one a delivery stall."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)
    gc.callbacks.append(_GcPauses().observe)


class _GcPauses:
    """Logs a collection of ``GC_PAUSE_LOG_MS`` or more (``event=gc_pause``): every thread
    stops for it, the Raft thread's heartbeats included."""

    def __init__(self) -> None:
        self._started_s = 0.0

    def observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started_s = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - self._started_s) * 1000
        if pause_ms >= GC_PAUSE_LOG_MS:
            log.warning("event=gc_pause generation=%d pause_ms=%.1f collected=%d",
                        info["generation"], pause_ms, info["collected"])


async def _housekeeping(node: NodeContext, health_servicer: health.aio.HealthServicer,
                        access_file: AccessFile | None, clock_step: ClockStep,
                        watchdog: ApplyWatchdog) -> None:
    """Health (NOT_SERVING without a leader, far behind it, or with an apply that stalled:
    the watchdog), gauges, one log line per leader change, a changed access file reread,
    and a clock step asked for (testing only)."""
    leader, serving, disk_ok = None, None, None
    access, next_access_check = access_file, 0.0
    while True:
        clock_step.check()
        status = node.replica.status()
        if status.leader != leader:
            if leader is not None or status.leader is not None:
                node.metrics.leader_changes.inc()
                log.info("event=leader_changed leader=%s term=%d role=%s", status.leader,
                         status.term, status.role)
            leader = status.leader
            node.forwarder.leader_moved(node.leader_peer(leader))
        caught_up = status.last_applied + HEALTH_MAX_LAG_ENTRIES >= max(
            status.commit_index, status.leader_commit_index)
        commit = max(status.commit_index, status.leader_commit_index)
        why = (watchdog.check(status.last_applied, commit, time.monotonic())
               or ("no_leader" if status.leader is None else None if caught_up else "behind"))
        now_serving = why is None
        if now_serving != serving:
            serving = now_serving
            code = (health_pb2.HealthCheckResponse.SERVING if serving
                    else health_pb2.HealthCheckResponse.NOT_SERVING)
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, code)
            log.info("event=health serving=%s reason=%s", serving, why or "-")
        metrics = node.metrics
        metrics.is_leader.set(1 if status.role == "leader" else 0)
        metrics.term.set(status.term)
        metrics.shard_map_version.set(node.shards.version)
        metrics.commit_index.set(status.commit_index)
        metrics.cursor_lag.set(cursor_lag_ms(status, node.clock.now_ms()) / 1000)
        metrics.set_topics(node.courier.topics())
        metrics.set_groups(status.groups)
        metrics.set_member_lag(status.commit_index,
                               status.match_index if status.role == "leader" else {})
        metrics.set_pending(status.pending, status.pending_untracked)
        metrics.set_storage(status.mended, status.damage_held)
        metrics.set_clocks(node.replica.clock.observe())
        metrics.raft_steps.summary = status.raft_steps
        spaces = node.disk.spaces()
        metrics.set_disks(spaces)
        if disk_ok != (not spaces[0].low):
            disk_ok = not spaces[0].low
            await health_servicer.set(STORAGE_HEALTH, health_pb2.HealthCheckResponse.SERVING
                                      if disk_ok else health_pb2.HealthCheckResponse.NOT_SERVING)
        if access is not None and time.monotonic() >= next_access_check:
            next_access_check = time.monotonic() + ACCESS_CHECK_S
            await asyncio.to_thread(access.refresh)
        await asyncio.sleep(HOUSEKEEPING_S)


def run(settings: NodeSettings) -> int:
    """Serve until SIGTERM or SIGINT; `EXIT_STORAGE_REFUSED` if the data folder cannot be served
    (locked by another process, or missing state it needs: `StorageIncomplete`)."""
    try:
        asyncio.run(serve(settings))
    except (StorageLocked, StorageIncomplete) as error:
        log.critical("event=node_refused reason=%s data=%s %s", type(error).__name__,
                     settings.data, error)
        return EXIT_STORAGE_REFUSED
    return 0
