"""The fields of `tickwheel.node.settings.config.NodeSettings`, in groups: what each setting
means and its default. The checks that join fields (a member list that holds this node, TLS
files that exist, a secret long enough) live with `NodeSettings`, which inherits every group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import NoDecode

from tickwheel.node.api.admission import AdmissionLimits
from tickwheel.node.api.validation import Limits
from tickwheel.node.delivery.courier import CourierConfig
from tickwheel.node.delivery.levels import DEFAULT_LEVELS
from tickwheel.node.ledger.writer import LedgerConfig
from tickwheel.node.listeners import ConnectionLimits
from tickwheel.node.ops.disk import DEFAULT_RESERVE_BYTES
from tickwheel.node.settings import statefulset
from tickwheel.replication import DispatchConfig, ReplicaConfig, StateConfig
from tickwheel.replication.raft import RaftConfig

DEFAULT_RAFT = "127.0.0.1:7500"
DEFAULT_GRPC = "127.0.0.1:7400"


class AddressFields(BaseModel):
    """Where a node is reached and what it binds."""

    raft_address: str = DEFAULT_RAFT
    """This node's Raft address, as the other members reach it; its identity."""
    raft_listen: str | None = None
    """Where to bind Raft; default: ``raft_address``. Set it when the identity is a name the
    node cannot bind (a Kubernetes DNS name: bind ``0.0.0.0:7500``) or a proxy fronts it."""
    members: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """``RAFT=GRPC=PEER`` for every member, this one included: its Raft address, its client
    gRPC address and its peer listener's; empty: a cluster of this node alone (at
    ``raft_address`` and ``grpc_listen``, with no peer listener)."""
    grpc_listen: str | None = None
    """Where to bind the client gRPC listener; default: this node's gRPC address in
    ``members``."""
    peer_listen: str | None = None
    """Where to bind the peer listener (members only: snapshot files, forwarded calls);
    default: this node's peer address in ``members``."""
    rocketmq_listen: str | None = None
    """Where to serve RocketMQ 5's client protocol (``apache.rocketmq.v2.MessagingService``,
    docs/rocketmq.md); off unless set. Secured as the client listener is: TLS with this node's
    certificate, and calls signed with an access key of the access file."""
    rocketmq_advertise: str | None = None
    """``HOST:PORT`` that RocketMQ routes name for this node (clients connect there after
    ``QueryRoute``); default: in a cluster of one shard, the address the client itself asked
    with; of several shards, the host of this node's gRPC address with the listener's port
    (each shard's queue names that shard's leader)."""
    metrics_listen: str | None = "127.0.0.1:9400"
    """Where to serve Prometheus ``/metrics``; empty to serve none."""
    health_listen: str | None = None
    """Where to serve ``grpc.health.v1`` alone, in plaintext and to anyone: for probes that
    cannot speak TLS (a kubelet's gRPC probe). It tells only whether the node serves. The
    health service is also on the gRPC listener, to authenticated callers."""


class SecurityFields(BaseModel):
    """Who may call a node and join its cluster (checked in `NodeSettings`)."""

    tls_cert_file: Path | None = None
    """This node's TLS certificate (PEM, the chain), for both gRPC listeners. Its names must
    cover every address clients and members dial it at."""
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    """The CA that signed the members' certificates: a node checks its peers with it. With
    ``tls_client_certs``, also the CA of client certificates."""
    tls_client_certs: bool = False
    """Clients must present a certificate signed by ``tls_ca_file`` (mutual TLS); its common
    name names the principal (or a bearer token does)."""
    access_file: Path | None = None
    """The principals, their tokens and certificates, and their grants
    (`tickwheel.node.security.access`); reread when it changes."""
    insecure_grpc: bool = False
    """Serve gRPC in plaintext to anyone, with every permission: no TLS, no tokens. Logged
    loudly at every start; for a laptop behind a firewall, never a shared network."""
    raft_secret: SecretStr | None = None
    """The cluster's shared Raft secret, the same on every member (at least
    ``MIN_SECRET_BYTES``; ``openssl rand -base64 32`` makes a good one). Only from the
    environment (``TICKWHEEL_RAFT_SECRET``) or the TOML file: there is no flag, because a
    process's arguments are visible to every user of the machine (``ps``). Secrets are
    separated by white space: during a rotation give two, the one to dial with first; links
    are accepted with either (docs/security.md)."""
    raft_secret_file: Path | None = None
    """A file holding the Raft secret(s), as ``raft_secret``: a Kubernetes Secret's mount, or
    what ``tickwheel cluster up`` writes."""
    insecure_raft: bool = False
    """Run a cluster's Raft links without a secret, in the clear: anyone who can reach the
    Raft port can join, read every message and rewrite the log. Logged loudly; never needed by
    a single node, which locks its port with a random secret of its own."""


class StorageFields(BaseModel):
    """Where and how a node keeps its data."""

    data: Path = Path("data")
    fsync: bool = False
    sync_ledger: Path | None = None
    """With ``fsync``: where to note what each sync made durable, for the chaos runner's
    simulated power cut (docs/chaos.md). Testing only."""
    snapshot_min_entries: int = RaftConfig().snapshot_min_entries
    min_free_bytes: int = DEFAULT_RESERVE_BYTES
    """Disk space under ``data`` kept for what a node must still write (hand-outs, acks,
    retries, the Raft journal's growth and compaction, snapshots): while any member has less,
    Schedule and Reschedule answer RESOURCE_EXHAUSTED and everything stored is still
    delivered (`tickwheel.node.ops.disk`); 0 turns the check off."""
    ledger: bool = True
    """Keep the ledger (``DATA/ledger/``, docs/node.md "The ledger"): every replica's record
    of the committed lifecycle of messages and of its own sends. Off only to measure what it
    costs (``harness/ledger_bench.py``): the audit has nothing to read from a node without."""
    ledger_max_age_s: int = LedgerConfig().max_age_s
    """Closed segments older than this are deleted (7 days)."""
    ledger_max_bytes: int = LedgerConfig().max_bytes
    """The oldest closed segments are deleted while all take more than this (1 GiB)."""
    ledger_segment_bytes: int = LedgerConfig().max_segment_bytes
    """A segment is closed once it reaches this size (64 MiB)..."""
    ledger_segment_age_ms: int = LedgerConfig().max_segment_age_ms
    """... or this age (60 s): a node killed loses at most this long of its ledger."""
    ledger_buffer_rows: int = LedgerConfig().max_buffer_rows
    """Rows waiting for the ledger's writer; past it rows are dropped and counted as a gap,
    so that the Raft thread and the courier never wait for the disk."""
    clock_skew_ms: int = 0
    """Testing only: offsets this node's clock; refused without ``fault_injection``."""
    fault_injection: bool = False
    """Testing only: obey live faults the chaos harness and the tests inject through the data
    folder (a clock step: ``DATA/clock-offset-ms``, `tickwheel.node.ops.clock_step`). Off, a
    node ignores them and logs ``event=fault_injection_refused``."""


class LimitFields(BaseModel):
    """What a node accepts, keeps and hands out at once: every resource bounded."""

    max_body_bytes: int = Limits().max_body_bytes
    max_delay_ms: int = Limits().max_delay_ms
    """Must be the same on every member: replicas check it again when they apply."""
    max_properties: int = Limits().max_properties
    max_properties_bytes: int = Limits().max_properties_bytes
    max_batch_msgs: int = Limits().max_batch_msgs
    max_stream_msgs: int = Limits().max_stream_msgs
    max_credits: int = Limits().max_credits
    max_request_bytes: int = Limits().max_request_bytes
    """The largest request a node reads; at least one message of ``max_body_bytes`` and
    ``max_properties_bytes`` (with 64 KiB for its other fields)."""
    max_concurrent_rpcs: int = AdmissionLimits().max_concurrent_rpcs
    """Authenticated calls and streams a node serves at once, over all its listeners; beyond
    it, ``RESOURCE_EXHAUSTED``. Callers without credentials are refused before they count."""
    max_principal_rpcs: int = AdmissionLimits().max_principal_rpcs
    """Calls and streams one principal may have at once on a node: a tenant's share."""
    max_request_memory_bytes: int = AdmissionLimits().max_request_memory_bytes
    """Request bytes a node holds at once (being read, or read and not yet answered);
    beyond it new calls get ``RESOURCE_EXHAUSTED`` at once."""
    max_principal_request_memory_bytes: int = (
        AdmissionLimits().max_principal_request_memory_bytes)
    """The same, for one principal."""
    request_read_timeout_ms: int = AdmissionLimits().request_read_timeout_ms
    """How long an admitted call's request (a stream's subscription) may take to arrive."""
    max_streams_per_connection: int = ConnectionLimits().max_streams_per_connection
    max_metadata_bytes: int = ConnectionLimits().max_metadata_bytes
    handshake_timeout_ms: int = ConnectionLimits().handshake_timeout_ms
    idle_connection_ms: int = ConnectionLimits().idle_connection_ms
    max_inflight_msgs: int = DispatchConfig().max_inflight_msgs
    max_inflight_bytes: int = DispatchConfig().max_inflight_bytes
    max_queued_msgs: int = ReplicaConfig().max_queued_msgs
    schedule_linger_ms: int = ReplicaConfig().schedule_linger_ms
    """A schedule request waits for the leader's next turn when that comes within this long
    (while messages come due: the next dispatch step), riding in its Raft round instead of
    making one of its own; 0: every request is proposed at once."""
    max_ready_msgs: int = StateConfig().max_ready_msgs
    """Due messages a consumer group keeps for its consumers; past it the oldest unleased
    ones are dropped (logged, counted): the retention of a group nobody reads."""
    max_groups: int = StateConfig().max_groups
    """Named consumer groups, over all topics."""
    max_moved_msgs: int = StateConfig().max_moved_msgs
    """Rescheduled messages whose handles are remembered."""
    max_dedupe_ids: int = StateConfig().max_dedupe_ids
    """Scheduled ids the dedupe window remembers at most (about 150 bytes each of the leader's
    memory and every replica's), the oldest forgotten first even within the window's 10
    minutes; the same on every member (it decides whether a retried id is filed again)."""
    max_topic_labels: int = 1_000
    """Topics with a label of their own in ``/metrics``; later ones share ``%other%``."""
    stall_health_elections: int = 10
    """Election timeouts (``election_max_ms``, 800 ms) for which the applied index may stand
    still while the commit index moves before health reports NOT_SERVING, saying why
    (``event=apply_stalled``; `tickwheel.node.ops.watchdog`)."""
    stall_exit_elections: int = 60
    """... and before the node exits with `EXIT_STALLED` (7): a restart rebuilds it from its
    snapshot and journal, or says why it cannot."""


class DeliveryFields(BaseModel):
    """How long a lease lasts and how a nacked message is retried."""

    visibility_timeout_ms: int = CourierConfig().default_visibility_timeout_ms
    delay_levels: str = DEFAULT_LEVELS
    """RocketMQ's ``messageDelayLevel``: what ``delay_level`` 1, 2, ... mean, and the retry
    ladder's steps (`tickwheel.node.delivery.levels`). Units s, m, h, d."""
    retry_start_level: int = 3
    """The level a first nack waits (10 s by default); each further nack one level more."""
    max_attempts: int = 16
    """A nack of this attempt sends the message to ``%DLQ%<topic>`` instead."""
    max_unacked_timeouts: int = CourierConfig().max_unacked_timeouts
    """A consumer stream that has acked nothing is closed (``FAILED_PRECONDITION``) once
    this many of its messages ran out their visibility timeout, and its messages go to the
    group's other consumers (`tickwheel.node.delivery.no_acks`); 0: never."""


class PodFields(BaseModel):
    """A StatefulSet pod's place, from which it derives its addresses
    (`tickwheel.node.settings.statefulset`)."""

    pod_name: str | None = None
    """This pod's name in a StatefulSet (``tickwheel-2``; downward API ``metadata.name``). With
    ``replicas``, ``peer_service`` and ``namespace`` it derives ``raft_address``, ``members``,
    ``raft_listen`` and ``grpc_listen`` unless those are given
    (`tickwheel.node.settings.statefulset`)."""
    replicas: int | None = None
    """The StatefulSet's ``spec.replicas``: every ordinal below it is a member."""
    peer_service: str | None = None
    """The headless Service that gives each pod its DNS name."""
    namespace: str | None = None
    """The pod's namespace (downward API ``metadata.namespace``)."""
    cluster_domain: str = statefulset.CLUSTER_DOMAIN
    peer_host_template: str = statefulset.HOST_TEMPLATE
    """How a pod name becomes a host (fields ``pod``, ``ordinal``, ``shard``, ``service``,
    ``namespace``, ``domain``); tests map every pod to ``127.0.0.1``."""
    raft_port: int = statefulset.RAFT_PORT
    grpc_port: int = statefulset.GRPC_PORT
    peer_port: int = statefulset.PEER_PORT
    port_stride: int = 0
    """Tests only: pod ``i`` of shard ``k`` uses ``raft_port + (k * replicas + i) *
    port_stride`` (and the same for gRPC and the peer port), so pods on one host do not
    collide."""
    listen_host: str = statefulset.LISTEN_HOST
    """Where a StatefulSet pod binds Raft and gRPC; tests bind ``127.0.0.1``."""
    shard_statefulset_template: str = statefulset.SHARD_STATEFULSET_TEMPLATE
    """With ``shards`` above 1: the StatefulSet of each shard, ``{shard}`` standing for its
    number; every shard's has ``replicas`` pods and the headless Service ``peer_service``."""
