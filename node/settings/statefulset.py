"""A node's addresses, derived from its place in a Kubernetes StatefulSet.

A StatefulSet names its pods ``<set>-0`` .. ``<set>-<replicas - 1>``, and a headless Service
gives each pod a stable DNS name, ``<pod>.<service>.<namespace>.svc.<cluster domain>``, which
resolves as soon as the pod has an IP (``publishNotReadyAddresses``: peers must find each other
before any of them is ready). So a pod that knows its own name, the replica count, the Service
and its namespace knows the whole membership, and no member list has to be written by hand::

    >>> pod = StatefulSetPod("tw-2", replicas=3, service="tw-peers", namespace="prod")
    >>> found = addresses(pod)
    >>> found.raft_address                        # its identity, as peers reach it
    'tw-2.tw-peers.prod.svc.cluster.local:7500'
    >>> for address in found.members[0].split("="):  # RAFT=GRPC=PEER, one per ordinal
    ...     print(address)
    tw-0.tw-peers.prod.svc.cluster.local:7500
    tw-0.tw-peers.prod.svc.cluster.local:7400
    tw-0.tw-peers.prod.svc.cluster.local:7600
    >>> len(found.members), found.raft_listen, found.grpc_listen, found.peer_listen
    (3, '0.0.0.0:7500', '0.0.0.0:7400', '0.0.0.0:7600')

Tests run every "pod" on one machine: ``host_template`` maps every pod name to a host
(``"127.0.0.1"``), ``port_stride`` gives pod ``i`` the ports ``raft_port + i * port_stride``,
``grpc_port + i * port_stride`` and ``peer_port + i * port_stride``, and ``listen_host`` binds
loopback only::

    >>> local = StatefulSetPod("tw-1", replicas=3, service="tw-peers", namespace="prod",
    ...                        host_template="127.0.0.1", raft_port=9000, grpc_port=9100,
    ...                        peer_port=9200, port_stride=10, listen_host="127.0.0.1")
    >>> found = addresses(local)
    >>> found.raft_address, found.members[2], found.grpc_listen
    ('127.0.0.1:9010', '127.0.0.1:9020=127.0.0.1:9120=127.0.0.1:9220', '127.0.0.1:9110')

In a cluster of several shards each shard is a StatefulSet of ``replicas`` pods, named by
``shard_statefulset_template`` (``tickwheel-s{shard}``) and governed by the same headless
Service; told its shard and how many there are, a pod derives the other shards' members too,
``SHARD=GRPC=PEER`` as ``shard_members`` takes them::

    >>> sharded = StatefulSetPod("tw-s1-0", replicas=2, service="tw-peers", namespace="prod",
    ...                          shard=1, shards=3, shard_statefulset_template="tw-s{shard}")
    >>> found = addresses(sharded)
    >>> found.raft_address
    'tw-s1-0.tw-peers.prod.svc.cluster.local:7500'
    >>> for entry in found.shard_members:
    ...     print(entry)
    0=tw-s0-0.tw-peers.prod.svc.cluster.local:7400=tw-s0-0.tw-peers.prod.svc.cluster.local:7600
    0=tw-s0-1.tw-peers.prod.svc.cluster.local:7400=tw-s0-1.tw-peers.prod.svc.cluster.local:7600
    2=tw-s2-0.tw-peers.prod.svc.cluster.local:7400=tw-s2-0.tw-peers.prod.svc.cluster.local:7600
    2=tw-s2-1.tw-peers.prod.svc.cluster.local:7400=tw-s2-1.tw-peers.prod.svc.cluster.local:7600

With ``port_stride``, pod ``i`` of shard ``k`` is the ``k * replicas + i``-th pod of the
cluster: its ports are ``raft_port + (k * replicas + i) * port_stride`` and so on.

A pod name without an ordinal, an ordinal outside ``0 .. replicas - 1``, a shard outside
``0 .. shards - 1`` or a pod whose StatefulSet is not its shard's by the template is a
configuration error (`ValueError`): the node refuses to start rather than join a cluster it is
not part of.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tickwheel.client.shards import MAX_SHARDS

HOST_TEMPLATE = "{pod}.{service}.{namespace}.svc.{domain}"
"""How a pod name becomes a host. Fields: ``pod``, ``ordinal``, ``shard``, ``service``,
``namespace``, ``domain``."""
SHARD_STATEFULSET_TEMPLATE = "tickwheel-s{shard}"
"""How a shard's number becomes the name of its StatefulSet, in a cluster of several shards."""
CLUSTER_DOMAIN = "cluster.local"
RAFT_PORT = 7500
GRPC_PORT = 7400
PEER_PORT = 7600
LISTEN_HOST = "0.0.0.0"
MAX_PORT = 65_535

_POD_NAME = re.compile(r"(?P<set>[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)-(?P<ordinal>0|[1-9][0-9]*)")


@dataclass(frozen=True)
class StatefulSetPod:
    """What a pod is told about its place (downward API and ConfigMap), and the local knobs."""

    pod_name: str
    replicas: int
    service: str
    namespace: str
    domain: str = CLUSTER_DOMAIN
    host_template: str = HOST_TEMPLATE
    raft_port: int = RAFT_PORT
    grpc_port: int = GRPC_PORT
    peer_port: int = PEER_PORT
    port_stride: int = 0
    listen_host: str = LISTEN_HOST
    shard: int = 0
    """The shard this pod's StatefulSet serves."""
    shards: int | None = None
    """How many shards the cluster has, each a StatefulSet named by
    ``shard_statefulset_template``; None: derive no other shard's members."""
    shard_statefulset_template: str = SHARD_STATEFULSET_TEMPLATE


@dataclass(frozen=True)
class Addresses:
    """The settings a pod derives; each matches the `NodeSettings` field of the same name."""

    raft_address: str
    members: list[str]
    raft_listen: str
    grpc_listen: str
    peer_listen: str
    shard_members: list[str] = field(default_factory=list)


def split_pod_name(pod_name: str) -> tuple[str, int]:
    """``tickwheel-2`` -> ``("tickwheel", 2)``."""
    match = _POD_NAME.fullmatch(pod_name)
    if match is None:
        raise ValueError(f"pod_name {pod_name!r} is not a StatefulSet pod name "
                         "(<statefulset>-<ordinal>, such as tickwheel-0)")
    return match["set"], int(match["ordinal"])


def addresses(pod: StatefulSetPod) -> Addresses:
    """This pod's Raft identity, every member's ``RAFT=GRPC=PEER``, where to bind, and (with
    ``shards``) every member of the other shards as ``SHARD=GRPC=PEER``."""
    set_name, ordinal = split_pod_name(pod.pod_name)
    _check(pod, ordinal)
    others = _other_shards(pod, set_name)
    members = ["=".join(_address(pod, set_name, pod.shard, i, port)
                        for port in (pod.raft_port, pod.grpc_port, pod.peer_port))
               for i in range(pod.replicas)]
    return Addresses(
        raft_address=_address(pod, set_name, pod.shard, ordinal, pod.raft_port),
        members=members,
        raft_listen=_bind(pod, ordinal, pod.raft_port),
        grpc_listen=_bind(pod, ordinal, pod.grpc_port),
        peer_listen=_bind(pod, ordinal, pod.peer_port),
        shard_members=["=".join((str(shard), *(_address(pod, shard_set, shard, i, port)
                                               for port in (pod.grpc_port, pod.peer_port))))
                       for shard, shard_set in others for i in range(pod.replicas)])


def _address(pod: StatefulSetPod, set_name: str, shard: int, ordinal: int,
             base_port: int) -> str:
    """``HOST:PORT`` of pod ``ordinal`` of StatefulSet ``set_name`` (shard ``shard``)."""
    return (f"{_host(pod, f'{set_name}-{ordinal}', ordinal, shard)}:"
            f"{_port(base_port, pod, shard, ordinal)}")


def _bind(pod: StatefulSetPod, ordinal: int, base_port: int) -> str:
    return f"{pod.listen_host}:{_port(base_port, pod, pod.shard, ordinal)}"


def _check(pod: StatefulSetPod, ordinal: int) -> None:
    if pod.replicas < 1:
        raise ValueError(f"replicas must be at least 1, not {pod.replicas}")
    if ordinal >= pod.replicas:
        raise ValueError(f"pod_name {pod.pod_name!r} has ordinal {ordinal}, but replicas is "
                         f"{pod.replicas} (ordinals 0..{pod.replicas - 1}): does "
                         "TICKWHEEL_REPLICAS match the StatefulSet's spec.replicas?")
    if pod.shards is not None and not 1 <= pod.shards <= MAX_SHARDS:
        raise ValueError(f"shards must be 1 to {MAX_SHARDS}, not {pod.shards}")
    if pod.shards is not None and not 0 <= pod.shard < pod.shards:
        raise ValueError(f"shard {pod.shard} is not below shards {pod.shards} (shards "
                         f"0..{pod.shards - 1}): do TICKWHEEL_SHARD and TICKWHEEL_SHARDS "
                         "match the StatefulSets?")
    if pod.port_stride < 0:
        raise ValueError(f"port_stride must not be negative, not {pod.port_stride}")
    last_shard = pod.shard if pod.shards is None else pod.shards - 1
    for name, port in (("raft_port", pod.raft_port), ("grpc_port", pod.grpc_port),
                       ("peer_port", pod.peer_port)):
        last_port = _port(port, pod, last_shard, pod.replicas - 1)
        if not 0 < port <= last_port <= MAX_PORT:
            raise ValueError(f"{name} {port} with port_stride {pod.port_stride} gives port "
                             f"{last_port} to the last pod, outside 1..{MAX_PORT}")


def _other_shards(pod: StatefulSetPod, set_name: str) -> list[tuple[int, str]]:
    """Every other shard and the name of its StatefulSet; none unless ``shards`` is above 1."""
    if pod.shards is None or pod.shards == 1:
        return []
    names = [_shard_statefulset(pod, shard) for shard in range(pod.shards)]
    if len(set(names)) < len(names):
        raise ValueError(f"shard_statefulset_template {pod.shard_statefulset_template!r} gives "
                         "two shards the same StatefulSet: it needs {shard}")
    if names[pod.shard] != set_name:
        raise ValueError(f"pod_name {pod.pod_name!r} is of StatefulSet {set_name!r}, but shard "
                         f"{pod.shard}'s is {names[pod.shard]!r} by shard_statefulset_template "
                         f"{pod.shard_statefulset_template!r}: does TICKWHEEL_SHARD match the "
                         "StatefulSet?")
    return [(shard, name) for shard, name in enumerate(names) if shard != pod.shard]


def _shard_statefulset(pod: StatefulSetPod, shard: int) -> str:
    template = pod.shard_statefulset_template
    try:
        name = template.format(shard=shard)
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(f"shard_statefulset_template {template!r}: {error!r}; the field is "
                         "{shard}") from None
    if _POD_NAME.fullmatch(f"{name}-0") is None:
        raise ValueError(f"shard_statefulset_template {template!r} names shard {shard}'s "
                         f"StatefulSet {name!r}, which is no StatefulSet name (lower-case "
                         "letters, digits and '-')")
    return name


def _host(pod: StatefulSetPod, pod_name: str, ordinal: int, shard: int) -> str:
    try:
        return pod.host_template.format(pod=pod_name, ordinal=ordinal, shard=shard,
                                        service=pod.service, namespace=pod.namespace,
                                        domain=pod.domain)
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(f"peer_host_template {pod.host_template!r}: {error!r}; the fields are "
                         "{pod}, {ordinal}, {shard}, {service}, {namespace} and {domain}"
                         ) from None


def _port(base_port: int, pod: StatefulSetPod, shard: int, ordinal: int) -> int:
    return base_port + (shard * pod.replicas + ordinal) * pod.port_stride
