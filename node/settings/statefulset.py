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

A pod name without an ordinal, or an ordinal outside ``0 .. replicas - 1``, is a configuration
error (`ValueError`): the node refuses to start rather than join a cluster it is not part of.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HOST_TEMPLATE = "{pod}.{service}.{namespace}.svc.{domain}"
"""How a pod name becomes a host. Fields: ``pod``, ``ordinal``, ``service``, ``namespace``,
``domain``."""
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


@dataclass(frozen=True)
class Addresses:
    """The settings a pod derives; each matches the `NodeSettings` field of the same name."""

    raft_address: str
    members: list[str]
    raft_listen: str
    grpc_listen: str
    peer_listen: str


def split_pod_name(pod_name: str) -> tuple[str, int]:
    """``tickwheel-2`` -> ``("tickwheel", 2)``."""
    match = _POD_NAME.fullmatch(pod_name)
    if match is None:
        raise ValueError(f"pod_name {pod_name!r} is not a StatefulSet pod name "
                         "(<statefulset>-<ordinal>, such as tickwheel-0)")
    return match["set"], int(match["ordinal"])


def addresses(pod: StatefulSetPod) -> Addresses:
    """This pod's Raft identity, every member's ``RAFT=GRPC=PEER``, and where to bind."""
    set_name, ordinal = split_pod_name(pod.pod_name)
    _check(pod, ordinal)
    hosts = [_host(pod, f"{set_name}-{i}", i) for i in range(pod.replicas)]
    members = ["=".join(f"{host}:{_port(port, pod, i)}"
                        for port in (pod.raft_port, pod.grpc_port, pod.peer_port))
               for i, host in enumerate(hosts)]
    return Addresses(
        raft_address=f"{hosts[ordinal]}:{_port(pod.raft_port, pod, ordinal)}",
        members=members,
        raft_listen=f"{pod.listen_host}:{_port(pod.raft_port, pod, ordinal)}",
        grpc_listen=f"{pod.listen_host}:{_port(pod.grpc_port, pod, ordinal)}",
        peer_listen=f"{pod.listen_host}:{_port(pod.peer_port, pod, ordinal)}")


def _check(pod: StatefulSetPod, ordinal: int) -> None:
    if pod.replicas < 1:
        raise ValueError(f"replicas must be at least 1, not {pod.replicas}")
    if ordinal >= pod.replicas:
        raise ValueError(f"pod_name {pod.pod_name!r} has ordinal {ordinal}, but replicas is "
                         f"{pod.replicas} (ordinals 0..{pod.replicas - 1}): does "
                         "TICKWHEEL_REPLICAS match the StatefulSet's spec.replicas?")
    if pod.port_stride < 0:
        raise ValueError(f"port_stride must not be negative, not {pod.port_stride}")
    for name, port in (("raft_port", pod.raft_port), ("grpc_port", pod.grpc_port),
                       ("peer_port", pod.peer_port)):
        last_port = _port(port, pod, pod.replicas - 1)
        if not 0 < port <= last_port <= MAX_PORT:
            raise ValueError(f"{name} {port} with port_stride {pod.port_stride} gives port "
                             f"{last_port} to the last pod, outside 1..{MAX_PORT}")


def _host(pod: StatefulSetPod, pod_name: str, ordinal: int) -> str:
    try:
        return pod.host_template.format(pod=pod_name, ordinal=ordinal, service=pod.service,
                                        namespace=pod.namespace, domain=pod.domain)
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(f"peer_host_template {pod.host_template!r}: {error!r}; the fields are "
                         "{pod}, {ordinal}, {service}, {namespace} and {domain}") from None


def _port(base_port: int, pod: StatefulSetPod, ordinal: int) -> int:
    return base_port + ordinal * pod.port_stride
