"""Node configuration: flags override ``TICKWHEEL_*`` environment variables, which override a
TOML file, which overrides the defaults. The defaults are the embedded single-node cluster:
``tickwheel serve`` with nothing else runs one node on 127.0.0.1 with its data in ``./data``.

A TOML file uses the same names as the flags, with underscores::

    raft_address = "10.0.0.1:7500"
    members = ["10.0.0.1:7500=10.0.0.1:7400=10.0.0.1:7600",
               "10.0.0.2:7500=10.0.0.2:7400=10.0.0.2:7600",
               "10.0.0.3:7500=10.0.0.3:7400=10.0.0.3:7600"]
    data = "/var/lib/tickwheel"
    tls_cert_file = "/etc/tickwheel/tls/tls.crt"
    tls_key_file = "/etc/tickwheel/tls/tls.key"
    tls_ca_file = "/etc/tickwheel/tls/ca.crt"
    access_file = "/etc/tickwheel/access/access.toml"
    max_body_bytes = 1048576

In the environment, lists are comma-separated: ``TICKWHEEL_MEMBERS=a:7500=a:7400=a:7600,...``.

In a Kubernetes StatefulSet a node is given its pod name, the replica count, the headless
Service and its namespace (``TICKWHEEL_POD_NAME``, ``TICKWHEEL_REPLICAS``,
``TICKWHEEL_PEER_SERVICE``, ``TICKWHEEL_NAMESPACE``) and derives ``raft_address``,
``members``, ``raft_listen``, ``grpc_listen`` and ``peer_listen`` from them
(`tickwheel.node.settings.statefulset`); any of those given explicitly still wins. A pod of a
cluster of several shards is also given its shard and their number (``TICKWHEEL_SHARD``,
``TICKWHEEL_SHARDS``) and derives ``shard_members``, every other shard's members, unless they
are given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import PrivateAttr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tickwheel.node.api.admission import AdmissionLimits
from tickwheel.node.api.placement import ShardMap
from tickwheel.node.api.validation import Limits
from tickwheel.node.delivery.courier import CourierConfig
from tickwheel.node.delivery.levels import RetryPolicy, parse_levels
from tickwheel.node.ledger.writer import LedgerConfig
from tickwheel.node.listeners import ConnectionLimits
from tickwheel.node.ops.watchdog import HOLD_COMMITS_FILE
from tickwheel.node.security.access import AccessFile
from tickwheel.node.security.identity import check_certificate_pair
from tickwheel.node.settings import statefulset
from tickwheel.node.settings.config_fields import (
    DEFAULT_GRPC,
    AddressFields,
    DeliveryFields,
    LimitFields,
    PodFields,
    SecurityFields,
    StorageFields,
)
from tickwheel.node.settings.shards import ShardFields, preferred_leader, shard_map
from tickwheel.replication import DispatchConfig, ReplicaConfig, StateConfig
from tickwheel.replication.raft import RaftConfig
from tickwheel.wheel import DAY_MS, WheelConfig

_POD_FIELDS = ("pod_name", "replicas", "peer_service", "namespace")
_POD_KNOB_FIELDS = ("cluster_domain", "peer_host_template", "raft_port", "grpc_port",
                    "peer_port", "port_stride", "listen_host", "shard_statefulset_template")
_DERIVED_FIELDS = ("raft_address", "members", "raft_listen", "grpc_listen", "peer_listen",
                   "shard_members")
_MESSAGE_OVERHEAD_BYTES = 64 << 10
"""Room in a request for a message's id, topic and framing besides its body and properties."""
MIN_SECRET_BYTES = 16
"""The shortest Raft secret a node accepts: it keys every link, and a short one can be
guessed from one recorded handshake."""


def _address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return value


class NodeSettings(AddressFields, ShardFields, SecurityFields, StorageFields, LimitFields,
                   DeliveryFields, PodFields, BaseSettings):
    """Everything a node can be told; the fields, by group, are in
    `tickwheel.node.settings.config_fields`. Field names are the flag names
    (``--max-body-bytes``)."""

    model_config = SettingsConfigDict(env_prefix="TICKWHEEL_", extra="forbid",
                                      validate_default=True)

    _secrets: tuple[bytes, ...] = PrivateAttr(default=())
    _access: AccessFile | None = PrivateAttr(default=None)

    @field_validator("members", "shard_members", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return [part.strip() for part in value.split(",") if part.strip()] if isinstance(
            value, str) else value

    @field_validator("delay_levels")
    @classmethod
    def _check_levels(cls, value: str) -> str:
        parse_levels(value)
        return value

    @field_validator("raft_address", "raft_listen", "grpc_listen", "peer_listen",
                     "rocketmq_listen", "rocketmq_advertise")
    @classmethod
    def _check_address(cls, value: str | None) -> str | None:
        return value if value is None else _address(value)

    @field_validator("members")
    @classmethod
    def _check_members(cls, value: list[str]) -> list[str]:
        for member in value:
            parts = member.split("=")
            if len(parts) not in (2, 3):
                raise ValueError(f"{member!r} is not RAFT_ADDRESS=GRPC_ADDRESS=PEER_ADDRESS")
            for part in parts:
                _address(part)
        if len(value) > 1:
            missing = [member for member in value if member.count("=") != 2]
            if missing:
                raise ValueError(f"{missing[0]!r} has no peer address: the members of a "
                                 "cluster reach each other's peer listeners, "
                                 "RAFT_ADDRESS=GRPC_ADDRESS=PEER_ADDRESS")
        return value

    @field_validator("max_body_bytes", "max_delay_ms", "max_batch_msgs", "max_stream_msgs",
                     "max_credits", "max_request_bytes", "max_concurrent_rpcs",
                     "max_principal_rpcs", "max_request_memory_bytes",
                     "max_principal_request_memory_bytes", "request_read_timeout_ms",
                     "max_streams_per_connection", "max_metadata_bytes",
                     "handshake_timeout_ms", "idle_connection_ms",
                     "visibility_timeout_ms", "max_inflight_msgs", "max_inflight_bytes",
                     "max_queued_msgs", "snapshot_min_entries", "max_topic_labels",
                     "max_ready_msgs", "max_groups", "max_moved_msgs", "max_dedupe_ids")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be positive")
        return value

    @field_validator("ledger_max_age_s", "ledger_max_bytes", "ledger_segment_bytes",
                     "ledger_segment_age_ms", "ledger_buffer_rows")
    @classmethod
    def _positive_ledger(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be positive")
        return value

    @field_validator("min_free_bytes", "schedule_linger_ms", "max_unacked_timeouts")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 or more")
        return value

    @model_validator(mode="after")
    def _derive_from_statefulset(self) -> NodeSettings:
        """Fill the address settings not given from the pod's place in its StatefulSet."""
        pod_name, replicas, service = self.pod_name, self.replicas, self.peer_service
        namespace = self.namespace
        if pod_name is None or replicas is None or service is None or namespace is None:
            given = [name for name in _POD_FIELDS if getattr(self, name) is not None]
            if given:
                missing = ", ".join(name for name in _POD_FIELDS if name not in given)
                raise ValueError(f"{', '.join(given)} given without {missing}: a StatefulSet "
                                 f"pod needs all of {', '.join(_POD_FIELDS)}")
            knobs = [name for name in _POD_KNOB_FIELDS if name in self.model_fields_set]
            if knobs:
                raise ValueError(f"{', '.join(knobs)} only apply to a StatefulSet pod (with "
                                 f"{', '.join(_POD_FIELDS)})")
            return self
        if self.shard and self.shards is None and "shard_members" not in self.model_fields_set:
            raise ValueError(f"shard {self.shard} given without shards: a StatefulSet pod "
                             "derives the other shards' members from shards "
                             "(TICKWHEEL_SHARDS), or is given shard_members")
        derived = statefulset.addresses(statefulset.StatefulSetPod(
            pod_name=pod_name, replicas=replicas, service=service,
            namespace=namespace, domain=self.cluster_domain,
            host_template=self.peer_host_template, raft_port=self.raft_port,
            grpc_port=self.grpc_port, peer_port=self.peer_port,
            port_stride=self.port_stride,
            listen_host=self.listen_host, shard=self.shard,
            # shard_members given: nothing to derive, and the template need not fit
            shards=None if "shard_members" in self.model_fields_set else self.shards,
            shard_statefulset_template=self.shard_statefulset_template))
        for name in _DERIVED_FIELDS:
            if name not in self.model_fields_set:
                setattr(self, name, getattr(derived, name))
        return self

    @model_validator(mode="after")
    def _self_is_a_member(self) -> NodeSettings:
        if self.members and self.raft_address not in self.member_map():
            raise ValueError(f"raft_address {self.raft_address} is not among members")
        if self.max_delay_ms > 3660 * DAY_MS:
            raise ValueError("max_delay_ms beyond ten years")
        shards = self.shard_map()  # raises what is wrong with shard and shard_members
        if shards.grown_from and not shards.peers_known(shards.grown_from):
            raise ValueError("grown_from: a shard added by a growth asks the shards before it "
                             "whether they scheduled an id, through their peer listeners: "
                             "give every shard_members entry as SHARD=GRPC=PEER")
        if self.rocketmq_listen and shards.count > 1 and not shards.peers_known():
            raise ValueError("rocketmq_listen in a cluster of several shards sends a message to "
                             "the shard its id belongs to, through that shard's peer listeners: "
                             "give every shard_members entry as SHARD=GRPC=PEER")
        if self.sync_ledger is not None and not self.fsync:
            raise ValueError("sync_ledger notes what fsync made durable: it needs fsync")
        if not 1 <= self.stall_health_elections <= self.stall_exit_elections:
            raise ValueError("stall_health_elections must be at least 1, and "
                             "stall_exit_elections at least as many")
        if self.clock_skew_ms and not self.fault_injection:
            raise ValueError("clock_skew_ms runs the node's clock off on purpose: testing only, "
                             "with fault_injection")
        one_message_bytes = (self.max_body_bytes + self.max_properties_bytes
                             + _MESSAGE_OVERHEAD_BYTES)
        if self.max_request_bytes < one_message_bytes:
            raise ValueError(f"max_request_bytes {self.max_request_bytes} cannot hold one "
                             "message of max_body_bytes and max_properties_bytes "
                             f"({one_message_bytes})")
        if not (self.max_request_bytes <= self.max_principal_request_memory_bytes
                <= self.max_request_memory_bytes):
            raise ValueError("request memory must hold one request of max_request_bytes for a "
                             "principal: max_request_bytes <= "
                             "max_principal_request_memory_bytes <= max_request_memory_bytes")
        if self.max_principal_rpcs > self.max_concurrent_rpcs:
            raise ValueError("max_principal_rpcs is a share of max_concurrent_rpcs: it cannot "
                             "be larger")
        batch_bytes = CourierConfig().max_batch_bytes
        if one_message_bytes > batch_bytes:
            raise ValueError(f"max_body_bytes and max_properties_bytes: one message of them "
                             f"({one_message_bytes} bytes) would not fit a response to its "
                             f"consumer (at most {batch_bytes}: gRPC's message limit)")
        return self

    @model_validator(mode="after")
    def _check_retry(self) -> NodeSettings:
        """The ladder must fit the table, and every level within ``max_delay_ms``."""
        policy = self.retry_policy()
        longest_ms = max(policy.levels.delays_ms)
        if longest_ms > self.max_delay_ms:
            raise ValueError(f"delay_levels: the longest level is {longest_ms} ms, beyond "
                             f"max_delay_ms {self.max_delay_ms}")
        return self

    @model_validator(mode="after")
    def _check_raft_secret(self) -> NodeSettings:
        """A cluster of more than one member runs with a secret of at least
        ``MIN_SECRET_BYTES``, unless ``insecure_raft`` says otherwise on purpose."""
        if self.raft_secret is not None and self.raft_secret_file is not None:
            raise ValueError("raft_secret and raft_secret_file both given: give one")
        secrets = self._secrets = self._read_raft_secrets()
        if secrets and self.insecure_raft:
            raise ValueError("insecure_raft with a Raft secret: drop one of them")
        for secret in secrets:
            if len(secret) < MIN_SECRET_BYTES:
                raise ValueError(f"a Raft secret has {len(secret)} bytes, fewer than "
                                 f"{MIN_SECRET_BYTES} (make one with: openssl rand -base64 32)")
        if (self.raft_secret is not None or self.raft_secret_file is not None) and not secrets:
            raise ValueError("the Raft secret is empty")
        if not secrets and len(self.member_map()) > 1 and not self.insecure_raft:
            raise ValueError(
                f"a cluster of {len(self.member_map())} members needs a Raft secret, the "
                "same on every member: --raft-secret-file FILE or TICKWHEEL_RAFT_SECRET "
                "(make one with: openssl rand -base64 32); --insecure-raft runs the cluster "
                "open to anyone who can reach its Raft port")
        return self

    @model_validator(mode="after")
    def _check_grpc_security(self) -> NodeSettings:
        """TLS and an access file, unless ``insecure_grpc`` says otherwise on purpose; the
        files are read now, so that a missing or malformed one stops the start."""
        tls = {"tls_cert_file": self.tls_cert_file, "tls_key_file": self.tls_key_file,
               "tls_ca_file": self.tls_ca_file, "access_file": self.access_file}
        given = [name for name, value in tls.items() if value is not None]
        if self.insecure_grpc:
            if given or self.tls_client_certs:
                raise ValueError(f"insecure_grpc with {', '.join(given) or 'tls_client_certs'}"
                                 ": drop one of them")
            return self
        cert_file, key_file, access_file = self.tls_cert_file, self.tls_key_file, self.access_file
        if cert_file is None or key_file is None or access_file is None:
            missing = [name for name in ("tls_cert_file", "tls_key_file", "access_file")
                       if tls[name] is None]
            raise ValueError(
                f"gRPC is served over TLS to authenticated callers: give {', '.join(missing)} "
                "(flags --tls-cert-file, --tls-key-file, --access-file; `tickwheel certs DIR` "
                "makes a set to try things with); --insecure-grpc serves plaintext to anyone, "
                "with every permission")
        if self.tls_client_certs and self.tls_ca_file is None:
            raise ValueError("tls_client_certs needs tls_ca_file: the CA of client certificates")
        for name, path in tls.items():
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {path}: no such file")
        check_certificate_pair(cert_file, key_file)
        self._access = AccessFile(access_file)
        if self.rocketmq_listen and not self._secrets:
            raise ValueError("rocketmq_listen: RocketMQ secret keys are derived from the Raft "
                             "secret, and this node has none: give --raft-secret-file (or "
                             "TICKWHEEL_RAFT_SECRET)")
        return self

    def access(self) -> AccessFile | None:
        """The access file, read once when the settings were checked; None with
        ``insecure_grpc``."""
        return self._access

    def raft_secrets(self) -> tuple[bytes, ...]:
        """The Raft secrets as given (read once, when the settings were checked), the one to
        dial with first; none if none is given."""
        return self._secrets

    def _read_raft_secrets(self) -> tuple[bytes, ...]:
        if self.raft_secret is not None:
            return tuple(self.raft_secret.get_secret_value().encode().split())
        if self.raft_secret_file is None:
            return ()
        try:
            return tuple(self.raft_secret_file.read_bytes().split())
        except OSError as error:
            raise ValueError(f"raft_secret_file {self.raft_secret_file}: "
                             f"{error.strerror}") from None

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(parse_levels(self.delay_levels), self.retry_start_level,
                           self.max_attempts)

    def member_map(self) -> dict[str, str]:
        """Raft address -> gRPC address, this node included."""
        if not self.members:
            return {self.raft_address: self.grpc_listen or DEFAULT_GRPC}
        return {parts[0]: parts[1] for parts in map(_member_parts, self.members)}

    def peer_map(self) -> dict[str, str]:
        """Raft address -> peer listener address, of every member (none for a node alone)."""
        return {parts[0]: parts[2] for parts in map(_member_parts, self.members)
                if len(parts) == 3}

    def shard_map(self) -> ShardMap:
        """Every shard's members (`tickwheel.node.settings.shards`)."""
        peers = self.peer_map()
        return shard_map(self.shard, self.shard_members, list(self.member_map().values()),
                         self.shards, [peers.get(raft, "") for raft in self.member_map()],
                         self.shard_map_version, self.grown_from)

    def listen(self) -> str:
        return self.grpc_listen or self.member_map()[self.raft_address]

    def rocketmq_reach(self) -> str:
        """``HOST:PORT`` a route of another member names for this node's RocketMQ listener
        (``rocketmq_advertise``, else its gRPC host and the listener's port); "" without
        one."""
        if not self.rocketmq_listen:
            return ""
        if self.rocketmq_advertise:
            return self.rocketmq_advertise
        host = self.member_map()[self.raft_address].rpartition(":")[0]
        return f"{host}:{self.rocketmq_listen.rpartition(':')[2]}"

    def listen_peers(self) -> str | None:
        """Where to bind the peer listener; None for a node alone."""
        return self.peer_listen or self.peer_map().get(self.raft_address)

    def limits(self) -> Limits:
        return Limits(max_body_bytes=self.max_body_bytes, max_delay_ms=self.max_delay_ms,
                      max_properties=self.max_properties,
                      max_properties_bytes=self.max_properties_bytes,
                      max_batch_msgs=self.max_batch_msgs,
                      max_stream_msgs=self.max_stream_msgs, max_credits=self.max_credits,
                      max_request_bytes=self.max_request_bytes)

    def admission_limits(self) -> AdmissionLimits:
        return AdmissionLimits(
            max_concurrent_rpcs=self.max_concurrent_rpcs,
            max_principal_rpcs=self.max_principal_rpcs,
            max_request_bytes=self.max_request_bytes,
            max_request_memory_bytes=self.max_request_memory_bytes,
            max_principal_request_memory_bytes=self.max_principal_request_memory_bytes,
            request_read_timeout_ms=self.request_read_timeout_ms)

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(max_streams_per_connection=self.max_streams_per_connection,
                                max_metadata_bytes=self.max_metadata_bytes,
                                handshake_timeout_ms=self.handshake_timeout_ms,
                                idle_connection_ms=self.idle_connection_ms)

    def ledger_config(self) -> LedgerConfig:
        return LedgerConfig(max_segment_bytes=self.ledger_segment_bytes,
                            max_segment_age_ms=self.ledger_segment_age_ms,
                            max_buffer_rows=self.ledger_buffer_rows,
                            max_age_s=self.ledger_max_age_s, max_bytes=self.ledger_max_bytes,
                            reserve_bytes=self.min_free_bytes)

    def replica_config(self) -> ReplicaConfig:
        return ReplicaConfig(
            raft=RaftConfig(fsync=self.fsync, sync_ledger=self.sync_ledger,
                            secrets=self.raft_secrets(),
                            insecure=self.insecure_raft,
                            bind_address=self.raft_listen,
                            snapshot_min_entries=self.snapshot_min_entries,
                            hold_commits_file=(self.data / HOLD_COMMITS_FILE
                                               if self.fault_injection else None),
                            preferred_leader=preferred_leader(
                                list(self.member_map()), self.shard, self.shard_map().count)),
            dispatch=DispatchConfig(max_inflight_msgs=self.max_inflight_msgs,
                                    max_inflight_bytes=self.max_inflight_bytes,
                                    max_ready_ahead_msgs=DispatchConfig.ready_ahead_for(
                                        self.max_ready_msgs)),
            state=StateConfig(wheel=WheelConfig(max_delay_ms=self.max_delay_ms),
                              max_ready_msgs=self.max_ready_msgs, max_groups=self.max_groups,
                              max_moved_msgs=self.max_moved_msgs,
                              max_dedupe_ids=self.max_dedupe_ids),
            max_queued_msgs=self.max_queued_msgs, schedule_linger_ms=self.schedule_linger_ms,
            shard=self.shard)

    @classmethod
    def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


def _member_parts(member: str) -> list[str]:
    return member.split("=")


def load(config_file: Path | None, flags: dict[str, Any]) -> NodeSettings:
    """Settings from ``flags`` (those given), the environment, and ``config_file``."""
    if config_file is None:
        return NodeSettings(**flags)
    if not config_file.is_file():
        raise FileNotFoundError(f"config file {config_file} does not exist")

    class NodeSettingsFromFile(NodeSettings):
        model_config = SettingsConfigDict({**NodeSettings.model_config, "toml_file": config_file})

    return NodeSettingsFromFile(**flags)
