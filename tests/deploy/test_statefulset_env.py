"""A node finds its address and its peers from its place in a StatefulSet.

Unit tests of the derivation (`node/settings/statefulset.py`) and of how `NodeSettings` applies
it, then three real node processes given exactly the environment the prod StatefulSet gives
its pods (read from the rendered manifests), with the test knobs that map every pod name to
127.0.0.1 and give each ordinal its own ports: they must form one cluster and serve. Then a pod
of each shard of overlays/shards, which must derive each other and serve one shard map.
"""

from __future__ import annotations

import doctest
import os
import re
import secrets as secrets_module
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import ValidationError

from tickwheel.client import Client, Credentials, Message
from tickwheel.client.credentials import open_channel
from tickwheel.client.shards import handle_shard, shard_of
from tickwheel.harness.local_cluster import wait_for
from tickwheel.harness.ports import free_ports, port_range
from tickwheel.node.security import dev_credentials
from tickwheel.node.security.dev_credentials import DevCredentials
from tickwheel.node.settings import statefulset
from tickwheel.node.settings.config import NodeSettings, load
from tickwheel.node.settings.statefulset import StatefulSetPod, addresses, split_pod_name
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

from . import kustomize_lite

HEALTH_PORT = 7700
PROD = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "overlays" / "prod"
SHARDS_OVERLAY = PROD.parent / "shards"
POD_ENV = {"TICKWHEEL_POD_NAME": "tickwheel-1", "TICKWHEEL_REPLICAS": "3",
           "TICKWHEEL_PEER_SERVICE": "tickwheel-peers", "TICKWHEEL_NAMESPACE": "prod",
           "TICKWHEEL_RAFT_SECRET": "a-secret-for-settings-tests-only"}
PEERS = "tickwheel-peers.prod.svc.cluster.local"
FORM_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def pod(name: str = "tickwheel-1", replicas: int = 3, **knobs: object) -> StatefulSetPod:
    return StatefulSetPod(name, replicas=replicas, service="tickwheel-peers",
                          namespace="prod", **knobs)


# -- the derivation ---------------------------------------------------------------------------

def test_the_module_example_runs() -> None:
    results = doctest.testmod(statefulset, raise_on_error=False, verbose=False)
    assert results.attempted >= 6 and results.failed == 0


def test_a_pod_derives_its_identity_every_member_and_where_to_bind() -> None:
    found = addresses(pod("tickwheel-1"))
    assert found.raft_address == f"tickwheel-1.{PEERS}:7500"
    assert found.members == [
        f"tickwheel-{i}.{PEERS}:7500=tickwheel-{i}.{PEERS}:7400=tickwheel-{i}.{PEERS}:7600"
        for i in range(3)]
    assert (found.raft_listen, found.grpc_listen, found.peer_listen) == (
        "0.0.0.0:7500", "0.0.0.0:7400", "0.0.0.0:7600")


def test_the_cluster_domain_and_the_host_template_are_configurable() -> None:
    found = addresses(pod("tickwheel-0", replicas=1, domain="corp.example"))
    assert found.raft_address == "tickwheel-0.tickwheel-peers.prod.svc.corp.example:7500"
    found = addresses(pod("tw-2", host_template="{service}-{ordinal}.{namespace}"))
    assert found.members[0] == ("tickwheel-peers-0.prod:7500=tickwheel-peers-0.prod:7400="
                                "tickwheel-peers-0.prod:7600")
    assert found.raft_address == "tickwheel-peers-2.prod:7500"


def test_the_port_stride_gives_each_ordinal_its_own_ports() -> None:
    found = addresses(pod("tickwheel-2", host_template="127.0.0.1", raft_port=20_001,
                          grpc_port=20_000, peer_port=20_002, port_stride=3,
                          listen_host="127.0.0.1"))
    assert found.members == ["127.0.0.1:20001=127.0.0.1:20000=127.0.0.1:20002",
                             "127.0.0.1:20004=127.0.0.1:20003=127.0.0.1:20005",
                             "127.0.0.1:20007=127.0.0.1:20006=127.0.0.1:20008"]
    assert found.raft_address == "127.0.0.1:20007"
    assert (found.raft_listen, found.grpc_listen, found.peer_listen) == (
        "127.0.0.1:20007", "127.0.0.1:20006", "127.0.0.1:20008")


def test_pod_names_split_into_the_set_and_the_ordinal() -> None:
    assert split_pod_name("tickwheel-0") == ("tickwheel", 0)
    assert split_pod_name("my-tick-wheel-12") == ("my-tick-wheel", 12)
    for bad in ("tickwheel", "tickwheel-", "-3", "tickwheel-01", "Tickwheel-1", "tickwheel-x"):
        with pytest.raises(ValueError, match="not a StatefulSet pod name"):
            split_pod_name(bad)


@pytest.mark.parametrize(("bad_pod", "message"), [
    (pod("tickwheel"), "not a StatefulSet pod name"),
    (pod("tickwheel-3", replicas=3), "ordinal 3, but replicas is 3"),
    (pod("tickwheel-0", replicas=0), "replicas must be at least 1"),
    (pod("tickwheel-0", port_stride=-1), "port_stride must not be negative"),
    (pod("tickwheel-0", raft_port=65_535, port_stride=1), "raft_port 65535"),
    (pod("tickwheel-0", grpc_port=0), "grpc_port 0"),
    (pod("tickwheel-0", peer_port=70_000), "peer_port 70000"),
    (pod("tickwheel-0", host_template="{pod}.{zone}"), "peer_host_template"),
])
def test_impossible_places_are_configuration_errors(bad_pod: StatefulSetPod,
                                                     message: str) -> None:
    with pytest.raises(ValueError, match=message):
        addresses(bad_pod)


# -- the other shards -------------------------------------------------------------------------

def shard_pod(name: str = "tickwheel-s1-2", shard: int = 1, shards: int = 3,
              **knobs: object) -> StatefulSetPod:
    return pod(name, shard=shard, shards=shards, **knobs)


def test_a_pod_of_a_shard_derives_every_member_of_the_other_shards() -> None:
    found = addresses(shard_pod("tickwheel-s1-2"))
    assert found.raft_address == f"tickwheel-s1-2.{PEERS}:7500"
    assert [member.split("=")[1] for member in found.members] == [
        f"tickwheel-s1-{i}.{PEERS}:7400" for i in range(3)]
    assert found.shard_members == [
        f"{shard}=tickwheel-s{shard}-{i}.{PEERS}:7400=tickwheel-s{shard}-{i}.{PEERS}:7600"
        for shard in (0, 2) for i in range(3)]


def test_one_shard_derives_no_other_and_needs_no_shard_name() -> None:
    assert addresses(pod("tickwheel-1", shard=0, shards=1)).shard_members == []
    assert addresses(pod("tickwheel-1")).shard_members == []


def test_the_template_names_each_shards_statefulset_and_hosts_may_name_the_shard() -> None:
    found = addresses(shard_pod("tw-1-0", shard=1, shards=2,
                                shard_statefulset_template="tw-{shard}",
                                host_template="{pod}.shard-{shard}.{namespace}"))
    assert found.raft_address == "tw-1-0.shard-1.prod:7500"
    assert found.shard_members == [f"0=tw-0-{i}.shard-0.prod:7400=tw-0-{i}.shard-0.prod:7600"
                                   for i in range(3)]


def test_the_port_stride_counts_the_pods_of_every_shard() -> None:
    found = addresses(shard_pod("tickwheel-s1-0", shards=2, replicas=2,
                                host_template="127.0.0.1", raft_port=20_001, grpc_port=20_000,
                                peer_port=20_002, port_stride=3, listen_host="127.0.0.1"))
    # pod i of shard k is pod k * replicas + i of the cluster: shard 1's start at the third
    assert found.members == ["127.0.0.1:20007=127.0.0.1:20006=127.0.0.1:20008",
                             "127.0.0.1:20010=127.0.0.1:20009=127.0.0.1:20011"]
    assert found.grpc_listen == "127.0.0.1:20006"
    assert found.shard_members == ["0=127.0.0.1:20000=127.0.0.1:20002",
                                   "0=127.0.0.1:20003=127.0.0.1:20005"]
    last = addresses(shard_pod("tickwheel-s1-0", shards=3, replicas=2, raft_port=65_530,
                               grpc_port=60_000, peer_port=61_000, port_stride=1))
    assert last.raft_address.endswith(":65532")  # and pod 5 of the cluster gets 65535


@pytest.mark.parametrize(("bad_pod", "message"), [
    (shard_pod(shard=3, shards=3), "shard 3 is not below shards 3"),
    (shard_pod(shards=0), "shards must be 1 to 256, not 0"),
    (shard_pod(shards=257), "shards must be 1 to 256"),
    (shard_pod("tickwheel-s2-0"), "is of StatefulSet 'tickwheel-s2', but shard 1's is "
                                  "'tickwheel-s1'"),
    (shard_pod("tickwheel-1"), "does TICKWHEEL_SHARD match the StatefulSet"),
    (shard_pod(shard_statefulset_template="tickwheel"), "gives two shards the same"),
    (shard_pod(shard_statefulset_template="tw-{shard}-{zone}"), "the field is {shard}"),
    (shard_pod(shard_statefulset_template="Tick_{shard}"), "'Tick_0', which is no "
                                                          "StatefulSet name"),
    (shard_pod(host_template="{pod}.{zone}"), "{shard}, {service}"),
    # the last pod of the last shard (pod 5 of the cluster) would have port 65536
    (shard_pod("tickwheel-s1-0", shards=3, replicas=2, raft_port=65_531, port_stride=1),
     "raft_port 65531 with port_stride 1 gives port 65536 to the last pod"),
])
def test_impossible_shards_are_configuration_errors(bad_pod: StatefulSetPod,
                                                    message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        addresses(bad_pod)


# -- NodeSettings -----------------------------------------------------------------------------

@pytest.fixture
def pod_env(monkeypatch: pytest.MonkeyPatch, dev_security: DevCredentials
            ) -> Iterator[pytest.MonkeyPatch]:
    """The StatefulSet's environment for pod tickwheel-1 of 3 (with TLS files that exist),
    and no other TICKWHEEL_*."""
    for name in list(os.environ):
        if name.startswith("TICKWHEEL_"):
            monkeypatch.delenv(name)
    for name, value in {**POD_ENV, **dev_security.node_environment()}.items():
        monkeypatch.setenv(name, value)
    yield monkeypatch


def test_settings_derive_the_addresses_from_the_pod_environment(
        pod_env: pytest.MonkeyPatch) -> None:
    settings = load(None, {})
    assert settings.raft_address == f"tickwheel-1.{PEERS}:7500"
    assert len(settings.member_map()) == 3
    assert settings.member_map()[settings.raft_address] == f"tickwheel-1.{PEERS}:7400"
    assert (settings.raft_listen, settings.listen()) == ("0.0.0.0:7500", "0.0.0.0:7400")
    assert settings.replica_config().raft.bind_address == "0.0.0.0:7500"


def test_explicit_settings_win_over_derived_ones(pod_env: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    pod_env.setenv("TICKWHEEL_RAFT_LISTEN", "10.1.2.3:7500")
    settings = load(None, {"grpc_listen": "10.1.2.3:7400"})
    assert (settings.raft_listen, settings.grpc_listen) == ("10.1.2.3:7500", "10.1.2.3:7400")
    assert settings.raft_address == f"tickwheel-1.{PEERS}:7500"
    config = tmp_path / "node.toml"
    config.write_text('raft_address = "a:7500"\n'
                      'members = ["a:7500=a:7400=a:7600", "b:7500=b:7400=b:7600"]\n')
    settings = load(config, {})
    assert settings.raft_address == "a:7500"
    assert settings.member_map() == {"a:7500": "a:7400", "b:7500": "b:7400"}
    assert settings.raft_listen == "10.1.2.3:7500"
    assert settings.listen() == "0.0.0.0:7400"


def test_an_explicit_identity_outside_the_derived_members_is_refused(
        pod_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="is not among members"):
        load(None, {"raft_address": "10.0.0.1:7500"})


def test_half_a_pod_environment_is_refused(pod_env: pytest.MonkeyPatch) -> None:
    pod_env.delenv("TICKWHEEL_NAMESPACE")
    with pytest.raises(ValidationError, match="given without namespace"):
        load(None, {})


def test_without_a_pod_environment_nothing_is_derived(pod_env: pytest.MonkeyPatch) -> None:
    for name in POD_ENV:
        pod_env.delenv(name)
    settings = NodeSettings()
    assert (settings.raft_address, settings.members, settings.raft_listen) == (
        "127.0.0.1:7500", [], None)
    pod_env.setenv("TICKWHEEL_GRPC_PORT", "7401")
    with pytest.raises(ValidationError, match="grpc_port only apply to a StatefulSet pod"):
        NodeSettings()


def test_a_pod_of_a_shard_derives_the_whole_shard_map(pod_env: pytest.MonkeyPatch) -> None:
    pod_env.setenv("TICKWHEEL_POD_NAME", "tickwheel-s1-0")
    pod_env.setenv("TICKWHEEL_SHARD", "1")
    pod_env.setenv("TICKWHEEL_SHARDS", "2")
    settings = load(None, {})
    assert settings.raft_address == f"tickwheel-s1-0.{PEERS}:7500"
    shard_map = settings.shard_map()
    assert (shard_map.shard, shard_map.count) == (1, 2)
    assert shard_map.members == (
        tuple(f"tickwheel-s0-{i}.{PEERS}:7400" for i in range(3)),
        tuple(f"tickwheel-s1-{i}.{PEERS}:7400" for i in range(3)))
    assert settings.replica_config().shard == 1


def test_explicit_shard_members_win_over_derived_ones(pod_env: pytest.MonkeyPatch) -> None:
    """Given by hand, the other shards need not follow the template (this pod's StatefulSet is
    tickwheel, not tickwheel-s1), and shards checks their number."""
    pod_env.setenv("TICKWHEEL_SHARD", "1")
    pod_env.setenv("TICKWHEEL_SHARDS", "2")
    pod_env.setenv("TICKWHEEL_SHARD_MEMBERS", "0=a:7400,0=b:7400")
    assert load(None, {}).shard_map().members[0] == ("a:7400", "b:7400")
    pod_env.setenv("TICKWHEEL_SHARDS", "3")
    with pytest.raises(ValidationError, match=r"shards is 3, but shard 1 and shard_members "
                                              r"make a map of 2 shards"):
        load(None, {})


def test_a_pod_told_its_shard_but_not_how_many_is_refused(
        pod_env: pytest.MonkeyPatch) -> None:
    pod_env.setenv("TICKWHEEL_POD_NAME", "tickwheel-s1-0")
    pod_env.setenv("TICKWHEEL_SHARD", "1")
    with pytest.raises(ValidationError, match=r"shard 1 given without shards"):
        load(None, {})
    pod_env.setenv("TICKWHEEL_SHARDS", "2")
    pod_env.setenv("TICKWHEEL_SHARD", "2")
    with pytest.raises(ValidationError, match=r"shard 2 is not below shards 2"):
        load(None, {})


def test_the_shard_template_is_refused_outside_a_pod(pod_env: pytest.MonkeyPatch) -> None:
    for name in POD_ENV:
        pod_env.delenv(name)
    pod_env.setenv("TICKWHEEL_SHARD_STATEFULSET_TEMPLATE", "tw-{shard}")
    with pytest.raises(ValidationError, match="shard_statefulset_template only apply to a "
                                              "StatefulSet pod"):
        NodeSettings()


@pytest.mark.cluster
def test_serve_refuses_to_start_as_a_pod_outside_the_set(
        tmp_path: Path, dev_security: DevCredentials) -> None:
    env = {**_clean_environment(), **POD_ENV, **dev_security.node_environment(),
           "TICKWHEEL_POD_NAME": "tickwheel-3", "TICKWHEEL_DATA": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "tickwheel.node", "serve"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert "bad configuration" in run.stdout
    assert "ordinal 3, but replicas is 3" in " ".join(run.stdout.split())


# -- three real pods --------------------------------------------------------------------------

def _clean_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items()
            if not name.startswith("TICKWHEEL_")}


def _statefulset_environment(ordinal: int, namespace: str,
                             secrets: dict[tuple[str, str], str], overlay: Path = PROD,
                             shard: int = 0) -> dict[str, str]:
    """What the rendered StatefulSet of ``overlay`` (of its ``shard``-th, with several) puts in
    the environment of pod ``ordinal``: its ConfigMap (``envFrom``) and its ``env`` (downward
    API fields, Secret keys, values)."""
    objects = kustomize_lite.render(overlay)
    workload = [obj for obj in objects if obj["kind"] == "StatefulSet"][shard]
    [container] = workload["spec"]["template"]["spec"]["containers"]
    fields = {"metadata.name": f"{workload['metadata']['name']}-{ordinal}",
              "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for source in container["envFrom"]:
        name = source["configMapRef"]["name"]
        [config] = [obj for obj in objects
                    if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == name]
        env.update(config["data"])
    for variable in container["env"]:
        origin = variable.get("valueFrom", {})
        if "fieldRef" in origin:
            env[variable["name"]] = fields[origin["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in origin:
            ref = origin["secretKeyRef"]
            env[variable["name"]] = secrets[ref["name"], ref["key"]]
        else:
            env[variable["name"]] = variable["value"]
    return env


def _consecutive_free_ports(count: int, tries: int = 50) -> int:
    """The first of ``count`` consecutive ports that are free on 127.0.0.1 right now, all in
    `port_range` (a parallel worker's own)."""
    for _ in range(tries):
        first = free_ports(1)[0]
        if first + count - 1 not in port_range():
            continue
        sockets = [socket.socket() for _ in range(count)]
        try:
            for offset, sock in enumerate(sockets):
                sock.bind(("127.0.0.1", first + offset))
            return first
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports in {tries} tries")


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _every_info(stubs: list[pb_grpc.TickwheelStub], processes: list[subprocess.Popen],
                logs: list[Path]) -> list[pb.ClusterInfoResponse] | None:
    """Every node's ClusterInfo, None while one does not answer; a node that exited raises
    with its log."""
    for process, log in zip(processes, logs, strict=True):
        if process.poll() is not None:
            raise RuntimeError(f"node exited with {process.returncode}:\n{log.read_text()}")
    try:
        return [stub.ClusterInfo(pb.ClusterInfoRequest(), timeout=1) for stub in stubs]
    except grpc.RpcError:
        return None


def _one_cluster(stubs: list[pb_grpc.TickwheelStub], processes: list[subprocess.Popen],
                 logs: list[Path]) -> pb.ClusterInfoResponse | None:
    """The leader's ClusterInfo once every node names the same leader, exactly one says it
    leads, and each knows all the members; None before."""
    infos = _every_info(stubs, processes, logs)
    if infos is None:
        return None
    leaders = [info for info in infos if info.role == "leader"]
    if len(leaders) != 1 or {info.leader for info in infos} != {leaders[0].address}:
        return None
    if any(len(info.members) != len(stubs) for info in infos):
        return None
    return leaders[0]


def _serving(channels: list[grpc.Channel]) -> bool:
    request = health_pb2.HealthCheckRequest(service="")
    try:
        return all(health_pb2_grpc.HealthStub(channel).Check(request, timeout=1).status
                   == health_pb2.HealthCheckResponse.SERVING for channel in channels)
    except grpc.RpcError:
        return False


@pytest.mark.cluster
def test_three_pods_with_the_statefulset_environment_form_one_cluster_and_serve(
        tmp_path: Path) -> None:
    """The pods' TLS files and access file come from a Secret's mount in Kubernetes; here
    from a development set at the same paths' variables."""
    replicas = 3
    first_port = _consecutive_free_ports(4 * replicas)
    security = dev_credentials.make(tmp_path / "security")
    knobs = {"TICKWHEEL_PEER_HOST_TEMPLATE": "127.0.0.1", "TICKWHEEL_LISTEN_HOST": "127.0.0.1",
             "TICKWHEEL_GRPC_PORT": str(first_port), "TICKWHEEL_RAFT_PORT": str(first_port + 1),
             "TICKWHEEL_PEER_PORT": str(first_port + 2), "TICKWHEEL_PORT_STRIDE": "4",
             "TICKWHEEL_METRICS_LISTEN": "", **security.node_environment()}
    secrets = {("tickwheel-raft", "secret"): secrets_module.token_urlsafe(32)}
    grpc_addresses = [f"127.0.0.1:{first_port + 4 * i}" for i in range(replicas)]
    # The kubelet probes in plaintext (it cannot speak TLS): the health port, as in the
    # ConfigMap, here one per ordinal.
    health_addresses = [f"127.0.0.1:{first_port + 4 * i + 3}" for i in range(replicas)]
    logs = [tmp_path / f"tickwheel-{i}.log" for i in range(replicas)]
    processes: list[subprocess.Popen] = []
    credentials = Credentials.load(ca_file=security.ca_file,
                                   token_file=security.token_file("admin"))
    channels = [open_channel(address, credentials, ()) for address in grpc_addresses]
    probes = [grpc.insecure_channel(address) for address in health_addresses]
    try:
        for ordinal in range(replicas):
            env = {**_clean_environment(),
                   **_statefulset_environment(ordinal, "tickwheel-test", secrets), **knobs,
                   "TICKWHEEL_DATA": str(tmp_path / f"data-tickwheel-{ordinal}")}
            assert env["TICKWHEEL_REPLICAS"] == str(replicas)
            assert env["TICKWHEEL_HEALTH_LISTEN"] == f"0.0.0.0:{HEALTH_PORT}"
            env["TICKWHEEL_HEALTH_LISTEN"] = health_addresses[ordinal]
            with open(logs[ordinal], "wb") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "tickwheel.node", "serve"], env=env, stdout=log,
                    stderr=subprocess.STDOUT))
        stubs = [pb_grpc.TickwheelStub(channel) for channel in channels]
        leader = wait_for(lambda: _one_cluster(stubs, processes, logs), FORM_TIMEOUT_S,
                          "one cluster of three")
        assert {member.raft_address for member in leader.members} == {
            f"127.0.0.1:{first_port + 4 * i + 1}" for i in range(replicas)}
        wait_for(lambda: _serving(channels), FORM_TIMEOUT_S, "every node SERVING (TLS)")
        wait_for(lambda: _serving(probes), FORM_TIMEOUT_S, "every node SERVING (probe)")
        for probe in probes:  # the plaintext port tells health, and nothing else
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.TickwheelStub(probe).ClusterInfo(pb.ClusterInfoRequest(), timeout=2)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        _schedule_and_consume(grpc_addresses, credentials)
    finally:
        for channel in channels + probes:
            channel.close()
        _stop(processes)
    assert all(process.returncode == 0 for process in processes), [
        log.read_text()[-2_000:] for log in logs]


def _schedule_and_consume(grpc_addresses: list[str], credentials: Credentials) -> None:
    with Client(grpc_addresses, timeout_s=FORM_TIMEOUT_S, credentials=credentials) as client:
        client.schedule("deploy", b"hello from a pod", delay_ms=0, id="deploy-1")
        with client.consume("deploy", prefetch=1) as consumer:
            deadline = threading.Timer(FORM_TIMEOUT_S, consumer.close)
            deadline.start()
            try:
                message = next(consumer, None)
            finally:
                deadline.cancel()
            assert message is not None, f"nothing delivered within {FORM_TIMEOUT_S} s"
            assert (message.id, message.body) == ("deploy-1", b"hello from a pod")
            message.ack()


def _shard_map_served(stubs: list[pb_grpc.TickwheelStub], processes: list[subprocess.Popen],
                      logs: list[Path]) -> list[pb.ClusterInfoResponse] | None:
    """Every node's ClusterInfo once each leads its own shard and names every shard; None
    before."""
    infos = _every_info(stubs, processes, logs)
    if infos is None or any(info.role != "leader" or len(info.shards) != len(stubs)
                            for info in infos):
        return None
    return infos


@pytest.mark.cluster
def test_a_pod_of_each_shard_with_the_statefulset_environment_serves_one_shard_map(
        tmp_path: Path) -> None:
    """Pod 0 of tickwheel-s0 and of tickwheel-s1, each with its StatefulSet's environment
    from overlays/shards, one replica a shard (TICKWHEEL_REPLICAS=1: two processes, not six):
    each derives the other, serves the same map, and a client given one of them schedules to
    both shards and consumes from both."""
    shards = 2
    first_port = _consecutive_free_ports(4 * shards)
    security = dev_credentials.make(tmp_path / "security")
    knobs = {"TICKWHEEL_PEER_HOST_TEMPLATE": "127.0.0.1", "TICKWHEEL_LISTEN_HOST": "127.0.0.1",
             "TICKWHEEL_GRPC_PORT": str(first_port), "TICKWHEEL_RAFT_PORT": str(first_port + 1),
             "TICKWHEEL_PEER_PORT": str(first_port + 2), "TICKWHEEL_PORT_STRIDE": "4",
             "TICKWHEEL_METRICS_LISTEN": "", "TICKWHEEL_REPLICAS": "1",
             **security.node_environment()}
    secrets = {("tickwheel-raft", "secret"): secrets_module.token_urlsafe(32)}
    grpc_addresses = [f"127.0.0.1:{first_port + 4 * shard}" for shard in range(shards)]
    logs = [tmp_path / f"tickwheel-s{shard}-0.log" for shard in range(shards)]
    processes: list[subprocess.Popen] = []
    credentials = Credentials.load(ca_file=security.ca_file,
                                   token_file=security.token_file("admin"))
    channels = [open_channel(address, credentials, ()) for address in grpc_addresses]
    try:
        for shard in range(shards):
            env = {**_clean_environment(),
                   **_statefulset_environment(0, "tickwheel-test", secrets, SHARDS_OVERLAY,
                                              shard), **knobs,
                   "TICKWHEEL_HEALTH_LISTEN": f"127.0.0.1:{first_port + 4 * shard + 3}",
                   "TICKWHEEL_DATA": str(tmp_path / f"data-tickwheel-s{shard}-0")}
            assert (env["TICKWHEEL_POD_NAME"], env["TICKWHEEL_SHARD"]) == (
                f"tickwheel-s{shard}-0", str(shard))
            assert env["TICKWHEEL_SHARDS"] == str(shards)
            with open(logs[shard], "wb") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "tickwheel.node", "serve"], env=env, stdout=log,
                    stderr=subprocess.STDOUT))
        stubs = [pb_grpc.TickwheelStub(channel) for channel in channels]
        infos = wait_for(lambda: _shard_map_served(stubs, processes, logs), FORM_TIMEOUT_S,
                         "each shard led, the map served")
        for shard, info in enumerate(infos):
            assert info.shard == shard
            assert [list(s.grpc_addresses) for s in info.shards] == [[a] for a in grpc_addresses]
        _schedule_to_every_shard_and_consume(grpc_addresses[1], credentials, shards)
    finally:
        for channel in channels:
            channel.close()
        _stop(processes)
    assert all(process.returncode == 0 for process in processes), [
        log.read_text()[-2_000:] for log in logs]


def _schedule_to_every_shard_and_consume(target: str, credentials: Credentials,
                                         shards: int) -> None:
    ids = [f"sharded-{n}" for n in range(8)]
    assert {shard_of(message_id, shards) for message_id in ids} == set(range(shards))
    with Client(target, timeout_s=FORM_TIMEOUT_S, credentials=credentials) as client:
        results = client.schedule_many([Message("deploy-shards", "x", delay_ms=0, id=message_id)
                                        for message_id in ids])
        assert [handle_shard(r.handle) for r in results] == [shard_of(i, shards) for i in ids]
        got: set[str] = set()
        with client.consume("deploy-shards", prefetch=8) as consumer:
            deadline = threading.Timer(FORM_TIMEOUT_S, consumer.close)
            deadline.start()
            try:
                for message in consumer:
                    got.add(message.id)
                    message.ack()
                    if got == set(ids):
                        break
            finally:
                deadline.cancel()
        assert got == set(ids), f"delivered within {FORM_TIMEOUT_S} s: {sorted(got)}"
