"""The container image and the Kubernetes manifests, checked offline.

Each kustomization is rendered by the stand-in beside this file (no process: the facts below
run in ``make check``; with kubectl on PATH, ``kubectl kustomize`` must render the same, and
renders the README's recipes), every object is validated against
the Kubernetes OpenAPI schemas that ``kubernetes_validate`` ships (strict: unknown fields are
errors), and the facts the cluster's safety rests on are asserted one by one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tickwheel.node.settings.config import NodeSettings
from tickwheel.node.settings.shards import shard_map
from tickwheel.node.settings.statefulset import (
    SHARD_STATEFULSET_TEMPLATE,
    StatefulSetPod,
    addresses,
)

from . import kustomize_lite
from .kustomize_lite import Manifest

PROJECT = Path(__file__).resolve().parents[2]
DEPLOY = PROJECT / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = {"base": 3, "overlays/dev": 1, "overlays/prod": 3, "overlays/shards": 3}
"""Each kustomization and the replica count it must give (each shard's)."""
SHARDED = {"overlays/shards": 2}
"""The kustomizations of several shards, and how many each runs."""
SHARD_LABEL = "tickwheel/shard"
"""The label of a shard's objects and pods in overlays/shards: its number."""
MIN_SCHEMA_VERSION = (1, 30)
SCHEMA_VERSION = kubernetes_validate.latest_version()
"""The newest Kubernetes release whose schemas the installed ``kubernetes_validate`` ships."""
KUBECTL = shutil.which("kubectl")
DATA_PATH = "/var/lib/tickwheel"
GRPC_PORT = 7400
ROCKETMQ_PORT = 8081
HEALTH_PORT = 7700
METRICS_PORT = 9400
RAFT_SECRET = ("tickwheel-raft", "secret")
TLS_SECRET = "tickwheel-tls"
ACCESS_SECRET = "tickwheel-access"
CERT_MANAGER = K8S / "cert-manager.yaml"


def kubectl_kustomize(directory: Path) -> list[Manifest]:
    run = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True,
                         text=True, check=True, timeout=60)
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc]


def render(directory: Path) -> list[Manifest]:
    return kubectl_kustomize(directory) if KUBECTL else kustomize_lite.render(directory)


def by_kind(objects: list[Manifest]) -> dict[str, list[Manifest]]:
    kinds: dict[str, list[Manifest]] = {}
    for obj in objects:
        kinds.setdefault(obj["kind"], []).append(obj)
    return kinds


def one(objects: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [obj for obj in by_kind(objects).get(kind, [])
             if name is None or obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def statefulsets(objects: list[Manifest]) -> list[Manifest]:
    """Every StatefulSet: one per shard."""
    found = by_kind(objects).get("StatefulSet", [])
    assert found, "no StatefulSet"
    return found


def node_container(statefulset: Manifest) -> Manifest:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def pod_labels(statefulset: Manifest) -> dict[str, str]:
    labels: dict[str, str] = statefulset["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], statefulset: Manifest) -> bool:
    """Whether the labels of ``selector`` pick the pods of ``statefulset``."""
    return selector.items() <= pod_labels(statefulset).items()


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    """Each kustomization by the stand-in, which starts no process: with kubectl on PATH,
    test_the_stand_in_renders_what_kubectl_kustomize_renders holds it to kubectl's output."""
    return {name: kustomize_lite.render(K8S / name) for name in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def audit_job() -> Manifest:
    documents = kustomize_lite.load_documents(K8S / "audit-job.yaml")
    assert len(documents) == 1
    return documents[0]


def test_every_object_is_valid_against_the_kubernetes_schemas(
        rendered: dict[str, list[Manifest]], audit_job: Manifest) -> None:
    assert tuple(int(part) for part in SCHEMA_VERSION.split(".")[:2]) >= MIN_SCHEMA_VERSION
    for name, objects in [*rendered.items(), ("audit-job.yaml", [audit_job])]:
        for obj in objects:
            where = f"{name}: {obj['kind']}/{obj['metadata']['name']}"
            try:
                kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{where} against Kubernetes {SCHEMA_VERSION}: {error.message} "
                            f"at {list(error.absolute_path)}")


@pytest.mark.cluster
@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")
def test_the_stand_in_renders_what_kubectl_kustomize_renders() -> None:
    def key(obj: Manifest) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    for name in KUSTOMIZATIONS:
        assert sorted(kustomize_lite.render(K8S / name), key=key) == sorted(
            kubectl_kustomize(K8S / name), key=key), name


def test_each_overlay_gives_its_replica_count_and_tells_the_pods_the_same(
        rendered: dict[str, list[Manifest]]) -> None:
    for name, replicas in KUSTOMIZATIONS.items():
        config = one(rendered[name], "ConfigMap", "tickwheel-config")["data"]
        assert config["TICKWHEEL_REPLICAS"] == str(replicas), name
        for statefulset in statefulsets(rendered[name]):
            assert statefulset["spec"]["replicas"] == replicas, name
            # Ordinals must be 0..replicas-1: that is what the pods derive the members from.
            assert "ordinals" not in statefulset["spec"], name


def test_the_statefulset_starts_pods_together_each_with_its_own_volume_on_its_own_machine(
        rendered: dict[str, list[Manifest]]) -> None:
    """A shard's pods on different machines; the pods of different shards may share one (the
    anti-affinity is the shard's: S shards of R replicas need R machines, not S * R)."""
    for name, objects in rendered.items():
        for statefulset in statefulsets(objects):
            spec = statefulset["spec"]
            assert spec["podManagementPolicy"] == "Parallel", name
            claims = spec["volumeClaimTemplates"]
            assert [claim["metadata"]["name"] for claim in claims] == ["data"], name
            assert claims[0]["spec"]["accessModes"] == ["ReadWriteOnce"], name
            assert {"name": "data", "mountPath": DATA_PATH} in node_container(statefulset)[
                "volumeMounts"], name
            anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
            [term] = anti["requiredDuringSchedulingIgnoredDuringExecution"]
            assert term["topologyKey"] == "kubernetes.io/hostname", name
            assert term["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"], name
            assert [other["metadata"]["name"] for other in statefulsets(objects)
                    if selects(term["labelSelector"]["matchLabels"], other)] == [
                statefulset["metadata"]["name"]], name


def test_pods_run_as_a_non_root_user_with_bounded_resources(
        rendered: dict[str, list[Manifest]]) -> None:
    for name, objects in rendered.items():
        for statefulset in statefulsets(objects):
            pod = statefulset["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, name
            assert pod["securityContext"]["runAsUser"] > 0, name
            container = node_container(statefulset)
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], name
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind]), (name, kind)
            # Service links would add TICKWHEEL_SERVICE_HOST etc. to the settings' prefix.
            assert pod["enableServiceLinks"] is False, name


def test_probes_use_the_plaintext_health_port_and_liveness_is_patient(
        rendered: dict[str, list[Manifest]]) -> None:
    """A kubelet's gRPC probe cannot speak TLS: on the TLS gRPC port it would fail forever."""
    for name, objects in rendered.items():
        config = one(objects, "ConfigMap", "tickwheel-config")["data"]
        assert config["TICKWHEEL_HEALTH_LISTEN"] == f"0.0.0.0:{HEALTH_PORT}", name
        for statefulset in statefulsets(objects):
            container = node_container(statefulset)
            readiness, liveness = container["readinessProbe"], container["livenessProbe"]
            assert readiness["grpc"] == {"port": HEALTH_PORT}, name
            assert liveness["grpc"] == {"port": HEALTH_PORT}, name
            patience_s = liveness["failureThreshold"] * liveness["periodSeconds"]
            assert patience_s >= 120, f"{name}: liveness gives up after {patience_s} s"
            assert patience_s > readiness["failureThreshold"] * readiness["periodSeconds"], name


def budget_of(objects: list[Manifest], statefulset: Manifest) -> Manifest:
    """The spec of the one PodDisruptionBudget over the pods of ``statefulset``, which must
    select no other StatefulSet's."""
    [budget] = [budget["spec"] for budget in by_kind(objects)["PodDisruptionBudget"]
                if selects(budget["spec"]["selector"]["matchLabels"], statefulset)]
    assert [other for other in statefulsets(objects)
            if selects(budget["selector"]["matchLabels"], other)] == [statefulset]
    return budget


def test_the_disruption_budget_keeps_a_majority_up(rendered: dict[str, list[Manifest]]) -> None:
    """One budget per shard (each is a Raft group of its own), over its pods alone."""
    for name, replicas in KUSTOMIZATIONS.items():
        for statefulset in statefulsets(rendered[name]):
            budget = budget_of(rendered[name], statefulset)
            assert "minAvailable" not in budget, name
            assert budget["maxUnavailable"] == 1, name
            if replicas >= 3:
                assert replicas - budget["maxUnavailable"] >= replicas // 2 + 1, name


@pytest.mark.cluster
def test_the_five_node_recipe_of_the_readme_renders_a_consistent_cluster(
        tmp_path: Path) -> None:
    overlay = tmp_path / "five"
    overlay.mkdir()
    prod = yaml.safe_load((K8S / "overlays/prod/kustomization.yaml").read_text())
    prod["resources"] = [os.path.relpath(K8S / "base", overlay)]  # kustomize: no absolute
    prod["replicas"][0]["count"] = 5
    replicas_patch = prod["patches"][0]["patch"].replace('value: "3"', 'value: "5"')
    assert replicas_patch != prod["patches"][0]["patch"]
    prod["patches"][0]["patch"] = replicas_patch
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(prod))
    objects = render(overlay)
    assert one(objects, "StatefulSet")["spec"]["replicas"] == 5
    assert one(objects, "ConfigMap")["data"]["TICKWHEEL_REPLICAS"] == "5"
    assert 5 - one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] >= 3


def test_peers_find_each_other_before_they_are_ready_and_clients_reach_ready_nodes(
        rendered: dict[str, list[Manifest]]) -> None:
    """One headless Service names the pods of every shard (so one certificate name covers
    them all), and the client Service reaches every shard's pods."""
    for name, objects in rendered.items():
        config = one(objects, "ConfigMap", "tickwheel-config")["data"]
        client = one(objects, "Service", "tickwheel")
        # clients only (gRPC and RocketMQ's protocol): no peer port (members only), no metrics
        assert [port["port"] for port in client["spec"]["ports"]] == [GRPC_PORT,
                                                                       ROCKETMQ_PORT], name
        assert config["TICKWHEEL_ROCKETMQ_LISTEN"] == f"0.0.0.0:{ROCKETMQ_PORT}", name
        assert config["TICKWHEEL_METRICS_LISTEN"] == f"0.0.0.0:{METRICS_PORT}", name
        for statefulset in statefulsets(objects):
            peers = one(objects, "Service", statefulset["spec"]["serviceName"])["spec"]
            assert config["TICKWHEEL_PEER_SERVICE"] == statefulset["spec"]["serviceName"], name
            assert peers["clusterIP"] == "None" and peers["publishNotReadyAddresses"], name
            assert selects(peers["selector"], statefulset), name
            assert {port["port"] for port in peers["ports"]} == {RAFT_PORT, PEER_PORT}, name
            assert selects(client["spec"]["selector"], statefulset), name
            annotations = statefulset["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/scrape"] == "true", name
            assert annotations["prometheus.io/port"] == str(METRICS_PORT), name


def test_settings_come_from_the_configmap_and_the_raft_secret_from_a_secret(
        rendered: dict[str, list[Manifest]]) -> None:
    settings = {f"TICKWHEEL_{name.upper()}" for name in NodeSettings.model_fields}
    """Every shard's pods read the one ConfigMap and the one Raft secret."""
    for name, objects in rendered.items():
        config = one(objects, "ConfigMap", "tickwheel-config")["data"]
        assert "TICKWHEEL_RAFT_SECRET" not in config, name
        assert "Secret" not in by_kind(objects), f"{name} must not ship a Secret"
        for statefulset in statefulsets(objects):
            container = node_container(statefulset)
            assert container["envFrom"] == [{"configMapRef": {"name": "tickwheel-config"}}], (
                name)
            env = {variable["name"]: variable for variable in container["env"]}
            assert set(config) | set(env) <= settings, f"{name}: not node settings"
            assert env["TICKWHEEL_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
                "metadata.name")
            assert env["TICKWHEEL_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
                "metadata.namespace")
            secret_ref = env["TICKWHEEL_RAFT_SECRET"]["valueFrom"]["secretKeyRef"]
            assert (secret_ref["name"], secret_ref["key"]) == RAFT_SECRET, name


def test_tls_and_the_access_file_come_from_secrets_mounted_where_the_configmap_points(
        rendered: dict[str, list[Manifest]]) -> None:
    """The same TLS Secret and access file on every shard's pods."""
    expected = {"TICKWHEEL_TLS_CERT_FILE": (TLS_SECRET, "tls.crt"),
                "TICKWHEEL_TLS_KEY_FILE": (TLS_SECRET, "tls.key"),
                "TICKWHEEL_TLS_CA_FILE": (TLS_SECRET, "ca.crt"),
                "TICKWHEEL_ACCESS_FILE": (ACCESS_SECRET, "access.toml")}
    for name, objects in rendered.items():
        config = one(objects, "ConfigMap", "tickwheel-config")["data"]
        assert "TICKWHEEL_INSECURE_GRPC" not in config, name
        for statefulset in statefulsets(objects):
            pod = statefulset["spec"]["template"]["spec"]
            secrets = {volume["name"]: volume["secret"] for volume in pod["volumes"]
                       if "secret" in volume}
            mounts = {mount["mountPath"]: mount
                      for mount in node_container(statefulset)["volumeMounts"]}
            for variable, (secret_name, key) in expected.items():
                path = Path(config[variable])
                assert path.name == key, (name, variable)
                mount = mounts[str(path.parent)]  # the folder: an updated Secret reaches it
                assert "subPath" not in mount and mount["readOnly"] is True, (name, variable)
                assert secrets[mount["name"]]["secretName"] == secret_name, (name, variable)


# -- several shards ---------------------------------------------------------------------------

HOSTNAME = "kubernetes.io/hostname"


def shard_statefulsets(objects: list[Manifest]) -> tuple[list[Manifest], str]:
    """Each shard's StatefulSet in shard order, by the names the pods derive them by (the
    ConfigMap's template), and the template."""
    config = one(objects, "ConfigMap", "tickwheel-config")["data"]
    template = config.get("TICKWHEEL_SHARD_STATEFULSET_TEMPLATE", SHARD_STATEFULSET_TEMPLATE)
    named = {statefulset["metadata"]["name"]: statefulset for statefulset in statefulsets(objects)}
    names = [template.format(shard=shard) for shard in range(int(config["TICKWHEEL_SHARDS"]))]
    assert sorted(named) == sorted(names), "a StatefulSet per shard, named by the template"
    return [named[name] for name in names], template


def without_shard(statefulset: Manifest) -> Manifest:
    """``statefulset`` less what makes it a shard's: its name, the shard label wherever it is,
    and TICKWHEEL_SHARD."""
    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: strip(value) for key, value in node.items() if key != SHARD_LABEL}
        if isinstance(node, list):
            return [strip(item) for item in node
                    if not (isinstance(item, dict) and item.get("name") == "TICKWHEEL_SHARD")]
        return node

    stripped: Manifest = strip(statefulset)
    del stripped["metadata"]["name"]
    return stripped


def check_shards(objects: list[Manifest], shards: int, where: str) -> None:
    """What a cluster of ``shards`` shards rests on, beyond the facts every kustomization is
    checked for above (each StatefulSet's own disruption budget, anti-affinity, Secrets)."""
    config = one(objects, "ConfigMap", "tickwheel-config")["data"]
    assert config["TICKWHEEL_SHARDS"] == str(shards), where
    ordered, template = shard_statefulsets(objects)
    for shard, statefulset in enumerate(ordered):
        env = {variable["name"]: variable for variable in node_container(statefulset)["env"]}
        assert env["TICKWHEEL_SHARD"] == {"name": "TICKWHEEL_SHARD", "value": str(shard)}, where
        assert statefulset["metadata"]["labels"][SHARD_LABEL] == str(shard), where
        assert statefulset["spec"]["selector"]["matchLabels"][SHARD_LABEL] == str(shard), where
        assert pod_labels(statefulset)[SHARD_LABEL] == str(shard), where
        # every shard the same pods, Secrets, probes and settings: only the shard differs
        assert without_shard(statefulset) == without_shard(ordered[0]), (where, shard)
        # pods of other shards prefer other machines: the leaders can spread
        preferred = statefulset["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"]
        assert any(term["podAffinityTerm"]["topologyKey"] == HOSTNAME and all(
            selects(term["podAffinityTerm"]["labelSelector"]["matchLabels"], other)
            for other in ordered) for term in preferred), where
    # a volume of its own for every pod of every shard: PVC <claim>-<statefulset>-<ordinal>
    volumes = [f"{claim['metadata']['name']}-{statefulset['metadata']['name']}-{ordinal}"
               for statefulset in ordered for claim in statefulset["spec"]["volumeClaimTemplates"]
               for ordinal in range(statefulset["spec"]["replicas"])]
    assert len(set(volumes)) == len(volumes) == shards * int(config["TICKWHEEL_REPLICAS"]), where
    check_every_pod_derives_one_map(objects, ordered, template, where)


def check_every_pod_derives_one_map(objects: list[Manifest], ordered: list[Manifest],
                                    template: str, where: str) -> None:
    """Each pod of each shard, from what its StatefulSet and the ConfigMap tell it, derives
    the same shard map, in which shard k is the pods of StatefulSet k."""
    config = one(objects, "ConfigMap", "tickwheel-config")["data"]
    replicas, service = int(config["TICKWHEEL_REPLICAS"]), config["TICKWHEEL_PEER_SERVICE"]
    expected = tuple(tuple(f"{statefulset['metadata']['name']}-{ordinal}.{service}.ns.svc."
                           f"{config['TICKWHEEL_CLUSTER_DOMAIN']}:{GRPC_PORT}"
                           for ordinal in range(replicas)) for statefulset in ordered)
    for shard, statefulset in enumerate(ordered):
        for ordinal in range(replicas):
            found = addresses(StatefulSetPod(
                f"{statefulset['metadata']['name']}-{ordinal}", replicas=replicas,
                service=service, namespace="ns", domain=config["TICKWHEEL_CLUSTER_DOMAIN"],
                shard=shard, shards=len(ordered), shard_statefulset_template=template))
            own = [member.split("=")[1] for member in found.members]
            derived = shard_map(shard, found.shard_members, own, len(ordered),
                                version=int(config.get("TICKWHEEL_SHARD_MAP_VERSION", "1")),
                                grown_from=int(config.get("TICKWHEEL_GROWN_FROM", "0")))
            assert derived.members == expected, (where, shard, ordinal)


def test_each_shard_is_a_statefulset_of_its_own_told_its_shard_and_alike_but_for_it(
        rendered: dict[str, list[Manifest]]) -> None:
    for name, shards in SHARDED.items():
        check_shards(rendered[name], shards, name)
    for name in set(KUSTOMIZATIONS) - set(SHARDED):  # one shard: nothing of the kind
        config = one(rendered[name], "ConfigMap", "tickwheel-config")["data"]
        assert "TICKWHEEL_SHARDS" not in config, name
        [statefulset] = statefulsets(rendered[name])
        assert statefulset["metadata"]["name"] == "tickwheel", name
        assert "TICKWHEEL_SHARD" not in {variable["name"]
                                         for variable in node_container(statefulset)["env"]}


def test_the_readmes_recipe_adds_a_third_shard(tmp_path: Path) -> None:
    """deploy/README.md, "Adding a shard": a copy of the last shard's folder with the next
    number, the folder in resources and replicas, TICKWHEEL_SHARDS one more, and the map's
    version and the shards it grew from in the ConfigMap."""
    shards = K8S / "overlays" / "shards"
    overlay, new_shard = tmp_path / "shards", tmp_path / "shards" / "shard-2"
    new_shard.mkdir(parents=True)
    last = (shards / "shard-1" / "kustomization.yaml").read_text()
    copied = yaml.safe_load(re.sub(r"\b1\b", "2", last.replace("-s1", "-s2")))
    copied["resources"] = [os.path.relpath(K8S / "shard", new_shard)]
    (new_shard / "kustomization.yaml").write_text(yaml.safe_dump(copied))
    top = yaml.safe_load((shards / "kustomization.yaml").read_text())
    top["resources"] = [os.path.relpath(shards / resource, overlay)
                        for resource in top["resources"]] + ["shard-2"]
    top["replicas"].append({"name": "tickwheel-s2", "count": 3})
    grown = top["patches"][0]["patch"].replace('TICKWHEEL_SHARDS\n  value: "2"',
                                               'TICKWHEEL_SHARDS\n  value: "3"') + (
        '\n- op: add\n  path: /data/TICKWHEEL_SHARD_MAP_VERSION\n  value: "2"'
        '\n- op: add\n  path: /data/TICKWHEEL_GROWN_FROM\n  value: "2"')
    assert grown != top["patches"][0]["patch"]
    top["patches"][0]["patch"] = grown
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(top))
    objects = kustomize_lite.render(overlay)
    check_shards(objects, 3, "three shards")
    config = one(objects, "ConfigMap", "tickwheel-config")["data"]
    assert (config["TICKWHEEL_SHARD_MAP_VERSION"], config["TICKWHEEL_GROWN_FROM"]) == ("2", "2")
    for statefulset in statefulsets(objects):
        assert budget_of(objects, statefulset)["maxUnavailable"] == 1


# -- the image --------------------------------------------------------------------------------

@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [argument for word, argument in self.instructions if word == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def dockerfile_stages(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """The global ``ARG`` defaults and the stages, each a list of ``(KEYWORD, argument)``;
    comments dropped and continued lines joined."""
    text = re.sub(r"^\s*#.*\n", "", path.read_text(), flags=re.MULTILINE)
    lines = [line.strip() for line in text.replace("\\\n", " ").splitlines() if line.strip()]
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, argument = line.partition(" ")
        keyword, argument = keyword.upper(), " ".join(argument.split())
        if keyword == "FROM":
            base, _, name = argument.partition(" AS ")
            stages.append(Stage(base, name))
        elif stages:
            stages[-1].instructions.append((keyword, argument))
        elif keyword == "ARG":
            name, _, default = argument.partition("=")
            args[name] = default
    return args, stages


Image = tuple[dict[str, str], dict[str, Stage], Stage]


@pytest.fixture(scope="module")
def image() -> Image:
    """Global args, the stages by name, and the stage a plain ``docker build`` gives."""
    args, stages = dockerfile_stages(DEPLOY / "Dockerfile")
    return args, {stage.name: stage for stage in stages}, stages[-1]


def exec_form(argument: str | None) -> list[str]:
    assert argument is not None and argument.startswith("["), f"not exec form: {argument}"
    return json.loads(argument)


def test_the_image_builds_the_wheel_in_one_stage_and_runs_it_in_a_slim_one(image: Image) -> None:
    args, stages, default = image
    assert list(stages) == ["builder", "runtime", "audit", "node"]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?(@sha256:[0-9a-f]{64})?", args["PYTHON_IMAGE"])
    assert stages["builder"].base == stages["runtime"].base == "${PYTHON_IMAGE}"
    assert any("pip wheel" in run for run in stages["builder"].all("RUN"))
    assert any("from=builder" in run and "install" in run for run in stages["runtime"].all(
        "RUN"))
    assert default.base == "runtime" and not default.instructions


def test_the_node_runs_tickwheel_serve_as_the_pods_user_on_the_pods_volume(
        image: Image, rendered: dict[str, list[Manifest]]) -> None:
    _, stages, _ = image
    runtime = stages["runtime"]
    user, _, group = runtime.last("USER").partition(":")
    assert user.isdigit() and int(user) > 0 and group.isdigit()
    assert exec_form(runtime.last("ENTRYPOINT")) == ["tickwheel", "serve"]
    assert exec_form(runtime.last("VOLUME")) == [DATA_PATH]
    assert f"TICKWHEEL_DATA={DATA_PATH}" in " ".join(runtime.all("ENV"))
    for objects in rendered.values():
        for statefulset in statefulsets(objects):
            pod = statefulset["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsUser"] == int(user)
            assert pod["securityContext"]["runAsGroup"] == int(group)


def test_the_image_exposes_every_port_the_pods_declare(
        image: Image, rendered: dict[str, list[Manifest]]) -> None:
    _, stages, _ = image
    exposed = {int(port) for line in stages["runtime"].all("EXPOSE") for port in line.split()}
    for name, objects in rendered.items():
        for statefulset in statefulsets(objects):
            declared = {port["containerPort"] for port in node_container(statefulset)["ports"]}
            assert declared == exposed, name


def test_java_is_only_in_the_audit_image_and_the_audit_job_runs_spark_on_it(
        image: Image, audit_job: Manifest) -> None:
    args, stages, _ = image
    for name in ("builder", "runtime", "node"):
        text = repr(stages[name].instructions).lower()
        assert "jre" not in text and "java" not in text and "jdk" not in text, name
    audit = stages["audit"]
    assert audit.base == "runtime"
    assert any("openjdk-17-jre-headless" in run for run in audit.all("RUN"))
    assert audit.last("USER") == stages["runtime"].last("USER")
    python = re.match(r"python:(\d+\.\d+)", args["PYTHON_IMAGE"])[1]
    venv = re.search(r"python -m venv --without-pip (\S+)", " ".join(
        stages["runtime"].all("RUN")))[1]
    script = f"{venv}/lib/python{python}/site-packages/tickwheel/chaos/audit.py"
    package_dirs = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"][
        "setuptools"]["package-dir"]
    assert (PROJECT / package_dirs["tickwheel.chaos"] / "audit.py").is_file()
    assert exec_form(audit.last("CMD"))[0] == script
    pod = audit_job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    command = container["command"]
    assert command[:3] == ["spark-submit", "--master", "local[*]"]
    assert command[-3:] == [script, "/audit-data", "--json"]
    assert {"name": "audit-data", "mountPath": "/audit-data"} in container["volumeMounts"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert all(c["image"].startswith("tickwheel-audit:") for c in pod["initContainers"] + [
        container])


def test_the_build_context_holds_every_folder_the_wheel_is_built_from() -> None:
    patterns = [line.strip() for line in (PROJECT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"
    included = {pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")}
    package_dirs: dict[str, Any] = tomllib.loads((PROJECT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-dir"]
    generated = {path for path in package_dirs.values() if path.startswith("build/")}
    assert set(package_dirs.values()) - generated <= included
    assert {"pyproject.toml", "setup.py", "README.md", "proto"} <= included


def test_the_wheel_holds_every_package_of_the_code_folders() -> None:
    # setuptools puts in the wheel only the packages listed, not their subpackages: one left
    # out installs fine and fails at the first import (the editable install of .venv finds
    # every folder, so no other test sees it).
    setuptools = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in setuptools["package-dir"].items():
        if folder.startswith("build/"):
            continue  # generated at build time
        for init in sorted((PROJECT / folder).rglob("__init__.py")):
            parts = init.parent.relative_to(PROJECT / folder).parts
            name = ".".join((package, *parts))
            assert name in setuptools["packages"], (
                f"{name} ({init.parent.relative_to(PROJECT)}) is not in [tool.setuptools] "
                "packages: the image would lack it")


# -- the network policy -----------------------------------------------------------------------

RAFT_PORT = 7500
PEER_PORT = 7600
"""The members-only gRPC listener."""
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}
KUBE_SYSTEM = {"kubernetes.io/metadata.name": "kube-system"}
DNS_PORT = 53


def allowed_peers(rules: list[Manifest], port: int, protocol: str = "TCP") -> list[Any]:
    """The peers (``from`` or ``to`` entries) of the rules that let ``protocol`` to ``port``
    through; ``None`` stands for a rule without peers, which admits everyone."""
    found: list[Any] = []
    for rule in rules:
        ports = rule.get("ports") or [{}]  # no ports: every port
        for entry in ports:
            number = entry.get("port")
            assert number is None or isinstance(number, int), f"port {number!r} by name"
            if entry.get("protocol", "TCP") == protocol and (
                    number is None or number <= port <= entry.get("endPort", number)):
                found.extend(rule.get("from", rule.get("to")) or [None])
                break
    return found


def the_members(objects: list[Manifest]) -> dict[str, Any]:
    """The peer that stands for the pods of every StatefulSet (in the policy's namespace): the
    labels their selectors share (with several shards, all but the shard's)."""
    shared = set.intersection(*(set(statefulset["spec"]["selector"]["matchLabels"].items())
                                for statefulset in statefulsets(objects)))
    return {"podSelector": {"matchLabels": dict(shared)}}


def test_the_network_policy_is_in_what_every_cluster_has_and_so_in_every_overlay(
        rendered: dict[str, list[Manifest]]) -> None:
    common = yaml.safe_load((K8S / "common" / "kustomization.yaml").read_text())
    assert "networkpolicy.yaml" in common["resources"]
    for name, objects in rendered.items():
        assert len(by_kind(objects).get("NetworkPolicy", [])) == 1, name


def test_the_network_policy_selects_every_pod_of_the_statefulset_both_ways(
        rendered: dict[str, list[Manifest]]) -> None:
    for name, objects in rendered.items():
        policy = one(objects, "NetworkPolicy")["spec"]
        assert set(policy["podSelector"]) == {"matchLabels"}, name
        selector = policy["podSelector"]["matchLabels"]
        assert {"podSelector": {"matchLabels": selector}} == the_members(objects), name
        for statefulset in statefulsets(objects):
            assert selects(selector, statefulset), name
        assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"], name


def test_clients_reach_grpc_from_the_whole_cluster_and_only_members_reach_raft_and_peer(
        rendered: dict[str, list[Manifest]]) -> None:
    for name, objects in rendered.items():
        ingress = one(objects, "NetworkPolicy")["spec"]["ingress"]
        for port in (GRPC_PORT, ROCKETMQ_PORT):
            assert {"namespaceSelector": {}} in allowed_peers(ingress, port), (name, port)
        for port in (RAFT_PORT, PEER_PORT):
            assert allowed_peers(ingress, port) == [the_members(objects)], (name, port)
            assert allowed_peers(ingress, port, "UDP") == [], (name, port)


def test_metrics_are_open_to_the_monitoring_namespace_only(
        rendered: dict[str, list[Manifest]]) -> None:
    for name, objects in rendered.items():
        ingress = one(objects, "NetworkPolicy")["spec"]["ingress"]
        assert allowed_peers(ingress, METRICS_PORT) == [
            {"namespaceSelector": {"matchLabels": MONITORING}}], name


def test_every_port_the_pods_declare_is_let_in_but_the_plaintext_health_port(
        rendered: dict[str, list[Manifest]]) -> None:
    """The kubelet probes from the pod's own machine, which NetworkPolicy does not block: no
    pod needs the health port, so none is let in."""
    for name, objects in rendered.items():
        ingress = one(objects, "NetworkPolicy")["spec"]["ingress"]
        ports = [port for statefulset in statefulsets(objects)
                 for port in node_container(statefulset)["ports"]]
        assert HEALTH_PORT in {port["containerPort"] for port in ports}, name
        for port in ports:
            allowed = allowed_peers(ingress, port["containerPort"], port.get("protocol", "TCP"))
            if port["containerPort"] == HEALTH_PORT:
                assert allowed == [], f"{name}: the health port is open to {allowed}"
            else:
                assert allowed, (
                    f"{name}: the policy shuts port {port['name']} ({port['containerPort']})")


def test_pods_may_call_only_their_peers_and_dns(rendered: dict[str, list[Manifest]]) -> None:
    for name, objects in rendered.items():
        egress = one(objects, "NetworkPolicy")["spec"]["egress"]
        members = the_members(objects)
        for port in (RAFT_PORT, PEER_PORT):
            assert allowed_peers(egress, port) == [members], (name, port)
        # forwarding and snapshot files go to the peer port: nothing calls another's gRPC
        assert allowed_peers(egress, GRPC_PORT) == [], name
        dns = [{"namespaceSelector": {"matchLabels": KUBE_SYSTEM}}]
        assert allowed_peers(egress, DNS_PORT, "UDP") == dns, name
        assert allowed_peers(egress, DNS_PORT, "TCP") == dns, name
        for rule in egress:  # nothing else: every rule names its peers and its ports
            assert rule.get("to") in ([members], dns), f"{name}: egress to {rule.get('to')}"
            assert {entry["port"] for entry in rule["ports"]} <= {
                RAFT_PORT, PEER_PORT, DNS_PORT}, name
            assert all("endPort" not in entry for entry in rule["ports"]), name


@pytest.mark.cluster
def test_the_readmes_recipe_moves_metrics_to_another_namespace(tmp_path: Path) -> None:
    readme = (DEPLOY / "README.md").read_text()
    [recipe] = [block for block in re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL)
                if "kind: NetworkPolicy" in block]
    overlay = tmp_path / "observability"
    overlay.mkdir()
    kustomization = yaml.safe_load(recipe)
    kustomization["resources"] = [os.path.relpath(K8S / "overlays/prod", overlay)]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    objects = render(overlay)
    ingress = one(objects, "NetworkPolicy")["spec"]["ingress"]
    [peer] = allowed_peers(ingress, METRICS_PORT)
    assert peer != {"namespaceSelector": {"matchLabels": MONITORING}}
    assert set(peer) == {"namespaceSelector"}
    for port in (RAFT_PORT, PEER_PORT):
        assert allowed_peers(ingress, port) == [the_members(objects)]
