"""A new release in Kubernetes keeps the cluster-version rule (docs/replication.md#compatibility,
deploy/README.md "Upgrading"), checked offline on every kustomization and on the finalize Job.

Each shard's StatefulSet replaces one pod at a time, the highest ordinal first (a partition
there to step down by hand), and goes on only once the replaced pod is Ready, which is the
node's caught-up health, and has stayed Ready longer than a stalled apply takes to make it
unready; the disruption budget lets no drain take a second pod meanwhile. The finalize step is
a Job applied by hand (no kustomization holds it), valid against the strict Kubernetes schemas,
whose command the real ``tickwheel`` parser reads as ``upgrade finalize`` against the client
Service, with the CA and an admin token from the Secrets it mounts. deploy/README.md's commands
name the StatefulSet's container and the Job.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tickwheel.node.cli import commands
from tickwheel.node.settings.config import NodeSettings
from tickwheel.replication.raft.config import RaftConfig

from . import kustomize_lite
from .kustomize_lite import Manifest
from .test_manifests import (
    HEALTH_PORT,
    K8S,
    KUSTOMIZATIONS,
    TLS_SECRET,
    budget_of,
    node_container,
    one,
    statefulsets,
)

FINALIZE_JOB = K8S / "jobs" / "upgrade-finalize.yaml"
README = K8S.parent / "README.md"
ADMIN_TOKEN_SECRET = ("tickwheel-admin-token", "token")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    return {name: kustomize_lite.render(K8S / name) for name in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def job() -> Manifest:
    [document] = kustomize_lite.load_documents(FINALIZE_JOB)
    return document


def setting(config: dict[str, str], name: str, default: int) -> int:
    return int(config.get(f"TICKWHEEL_{name.upper()}", default))


def test_each_statefulset_replaces_one_pod_at_a_time_with_a_partition_to_step_down(
        rendered: dict[str, list[Manifest]]) -> None:
    """RollingUpdate goes from the highest ordinal to the partition; none of the alpha
    maxUnavailable, which would replace several at once. Parallel creation stays (a Raft node
    is not Ready alone): it does not touch how an update goes."""
    for name, objects in rendered.items():
        for statefulset in statefulsets(objects):
            where = f"{name}: {statefulset['metadata']['name']}"
            spec = statefulset["spec"]
            assert spec["updateStrategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"partition": 0}}, where
            assert spec["podManagementPolicy"] == "Parallel", where


def test_the_next_pod_goes_only_once_the_last_is_caught_up_and_stays_so(
        rendered: dict[str, list[Manifest]]) -> None:
    """The gate between pods is readiness: the node's own health (service "", SERVING once it
    knows a leader and has applied to within 1,000 entries of the leader's commit index), not
    the storage one. A replaced pod whose apply stalls turns unready after the watchdog's
    election timeouts plus the probe's failures: minReadySeconds must outlast that, or the
    update would take the next pod first."""
    for name, objects in rendered.items():
        config = one(objects, "ConfigMap", "tickwheel-config")["data"]
        elections = setting(config, "stall_health_elections",
                            NodeSettings.model_fields["stall_health_elections"].default)
        stall_s = elections * RaftConfig().election_max_ms / 1000
        for statefulset in statefulsets(objects):
            where = f"{name}: {statefulset['metadata']['name']}"
            readiness = node_container(statefulset)["readinessProbe"]
            assert readiness["grpc"] == {"port": HEALTH_PORT}, where  # service "": caught up
            assert readiness.get("successThreshold", 1) == 1, where
            unready_s = stall_s + readiness["failureThreshold"] * readiness["periodSeconds"]
            min_ready_s = statefulset["spec"]["minReadySeconds"]
            assert min_ready_s > unready_s, f"{where}: {min_ready_s} s <= {unready_s} s"


def test_no_drain_takes_a_second_pod_while_one_catches_up(
        rendered: dict[str, list[Manifest]]) -> None:
    """A pod not Ready (just replaced, catching up) is the budget's one unavailable: healthy
    pods are not evicted until it is Ready, so a majority stays."""
    for name, replicas in KUSTOMIZATIONS.items():
        for statefulset in statefulsets(rendered[name]):
            budget = budget_of(rendered[name], statefulset)
            assert budget["maxUnavailable"] == 1, name
            assert budget["unhealthyPodEvictionPolicy"] == "IfHealthyBudget", name
            assert replicas == 1 or replicas - 1 >= replicas // 2 + 1, name


def test_the_finalize_job_is_valid_and_in_no_kustomization(
        job: Manifest, rendered: dict[str, list[Manifest]]) -> None:
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    assert job["kind"] == "Job"
    for kustomization in K8S.rglob("kustomization.yaml"):
        resources = yaml.safe_load(kustomization.read_text()).get("resources", [])
        assert not any("jobs" in Path(resource).parts or resource.endswith(FINALIZE_JOB.name)
                       for resource in resources), kustomization
    for name, objects in rendered.items():
        assert "Job" not in {obj["kind"] for obj in objects}, name
    spec = job["spec"]
    assert spec["backoffLimit"] == 0  # a refusal would be refused again
    assert spec["template"]["spec"]["restartPolicy"] == "Never"


def mounted(pod: dict[str, Any], path: Path) -> tuple[str, str]:
    """The Secret and key a file of the pod's one container comes from."""
    [container] = pod["containers"]
    [mount] = [mount for mount in container["volumeMounts"]
               if Path(mount["mountPath"]) == path.parent]
    assert mount["readOnly"] is True and "subPath" not in mount
    [volume] = [volume for volume in pod["volumes"] if volume["name"] == mount["name"]]
    secret = volume["secret"]
    items = {item["path"]: item["key"] for item in secret.get("items", [])}
    assert not items or path.name in items, f"{path} is not among the Secret's items"
    return secret["secretName"], items.get(path.name, path.name)


def test_the_finalize_job_runs_tickwheel_upgrade_finalize_as_an_admin_over_tls(
        job: Manifest, rendered: dict[str, list[Manifest]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The command as the real parser reads it, with the Job's environment: the client Service
    (every shard behind it), the CA and the admin token from their Secrets; on the image the
    StatefulSet runs, not as root."""
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    for variable in container["env"]:
        monkeypatch.setenv(variable["name"], variable["value"])
    command = container["command"]
    assert command[0] == "tickwheel"
    args = commands._parser(None).parse_args(command[1:])
    assert (args.command, args.step, args.insecure) == ("upgrade", "finalize", False)
    client = one(rendered["base"], "Service", "tickwheel")
    assert args.target == f"{client['metadata']['name']}:{client['spec']['ports'][0]['port']}"
    assert mounted(pod, args.ca_file) == (TLS_SECRET, "ca.crt")
    assert mounted(pod, args.token_file) == ADMIN_TOKEN_SECRET
    assert args.cert_file is None and args.key_file is None
    [statefulset] = statefulsets(rendered["base"])
    assert container["image"] == node_container(statefulset)["image"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    token_mode = next(volume["secret"]["defaultMode"] for volume in pod["volumes"]
                      if volume["secret"]["secretName"] == ADMIN_TOKEN_SECRET[0])
    assert token_mode & 0o004 == 0  # not for everyone; readable through fsGroup
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_readme_upgrades_with_the_statefulsets_container_and_the_finalize_job(
        rendered: dict[str, list[Manifest]]) -> None:
    """Every `kubectl set image statefulset/...` in deploy/README.md names a container of
    that StatefulSet, and "Upgrading" applies the Job, after the pods and before nothing."""
    text = README.read_text()
    named = {statefulset["metadata"]["name"]: statefulset
             for objects in rendered.values() for statefulset in statefulsets(objects)}
    found = re.findall(r"kubectl [^`\n]*set image statefulset/([\w-]+) ([^`\n]+)", text)
    assert found
    for name, rest in found:
        containers = {container["name"]
                      for container in named[name]["spec"]["template"]["spec"]["containers"]}
        for word in shlex.split(rest):
            if "=" in word and not word.startswith("-"):
                assert word.split("=")[0] in containers, (name, word)
    upgrading = text.split("## Upgrading", 1)[1].split("\n## ", 1)[0]
    job_path = str(FINALIZE_JOB.relative_to(K8S.parents[1]))
    assert job_path in upgrading
    assert upgrading.index("rollout status") < upgrading.index(job_path)
