"""The dashboards, the alert rules and the PodMonitor, checked offline (``make check``).

The generated files must be what ``deploy/monitoring`` makes; every metric a query reads must
be one a node exports (read from a node's own registry, every family filled in), every label
it groups or matches by one that exists; every alert must have a promtool case in which it
fires and one in which it does not; the PrometheusRule must hold the plain rules file's rules;
the dashboards must be laid out without overlaps, each query on the dashboards' data source;
the PodMonitor must select every shard's pods on a port they declare. What promtool and a
real Prometheus say is in test_alert_rules.py and test_monitoring_cluster.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitoring import generate
from monitoring.alerts import ALERTS, prometheus_rule, rule_groups
from monitoring.dashboards import DASHBOARDS
from monitoring.queries import JOB
from tickwheel.node.ops.disk import Space
from tickwheel.node.ops.metrics import Metrics
from tickwheel.replication import GroupSummary, MemberOffset, StepSummary
from tickwheel.wheel import MendCounts

from . import kustomize_lite
from .kustomize_lite import Manifest
from .test_manifests import K8S, KUSTOMIZATIONS, METRICS_PORT, SCHEMA_VERSION, statefulsets

DEPLOY = K8S.parent
MONITORING = K8S / "monitoring"
RULES_FILE = DEPLOY / "prometheus" / "tickwheel-rules.yaml"
RULES_TESTS = DEPLOY / "prometheus" / "tickwheel-rules.test.yaml"
FROM_ELSEWHERE = {"up": "Prometheus' own, per target",
                  "kube_job_status_failed": "kube-state-metrics': the audit Job"}
"""Metrics the queries read that no tickwheel node exports, and whose they are."""
TARGET_LABELS = {"instance", "job", "le"}
"""Labels Prometheus gives every series of a target, and the buckets' bound."""
JOB_LABELS = {"namespace", "job_name"}
"""kube-state-metrics' labels of ``kube_job_status_failed``."""
NAME = re.compile(r"\b([a-zA-Z_]\w*)\b(?!\s*\()")
"""A name not followed by a parenthesis: a metric, once label lists, matchers, ranges and
strings are taken out, or a keyword."""
LABEL_LISTS = re.compile(r"\b(?:by|on|group_left|without)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")
KEYWORDS = {"and", "or", "unless", "offset"}


def exported() -> dict[str, set[str]]:
    """Every sample name a node exports, with its labels, from a registry with every family
    filled in."""
    metrics = Metrics(shard=0)
    metrics.observe_delivered("orders", 1, [5])
    metrics.set_topics([("orders", 1, 1, 1)])
    metrics.set_groups([GroupSummary("orders", "", 1, 1, 0)])
    metrics.set_member_lag(3, {"b:7500": 1})
    metrics.set_pending({"orders": 1}, 0)
    metrics.set_storage(MendCounts(0, 0, 0), None)
    metrics.set_clocks({"b:7500": MemberOffset(1, 2)})
    metrics.set_disks([Space("a:7500", 10, 1)])
    metrics.raft_steps.summary = StepSummary((1.0,), [1, 0], 1, 1)
    for counter in (metrics.redelivered, metrics.retried, metrics.dead_lettered, metrics.acked):
        counter.labels("orders").inc()
    metrics.rejected.labels("INVALID_ARGUMENT").inc()
    metrics.quota_refusals.labels("p", "schedule_msgs_per_s").inc()
    names: dict[str, set[str]] = {}
    text = generate_latest(metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def metric_names(expr: str) -> set[str]:
    bare = re.sub(r'"[^"]*"', '""', expr)
    for pattern in (LABEL_LISTS, MATCHERS, re.compile(r"\[[^\]]*\]")):
        bare = pattern.sub(" ", bare)
    return set(NAME.findall(bare)) - KEYWORDS


def queries() -> dict[str, str]:
    """Every PromQL expression of the alerts and the dashboards, by where it is."""
    found = {f"alert {alert.name}": alert.expr for alert in ALERTS}
    for uid, build in DASHBOARDS.items():
        for panel in build().to_json_data()["panels"]:
            for target in getattr(panel, "targets", []):
                found[f"{uid}: {panel.title} {target.refId}"] = target.expr
    return found


def test_the_generated_files_are_what_the_code_makes() -> None:
    assert generate.stale() == [], "run make monitoring"


def test_every_metric_a_query_reads_is_exported_by_a_node_with_the_labels_it_uses() -> None:
    names = exported()
    labels = set().union(*names.values()) | TARGET_LABELS | JOB_LABELS
    read: set[str] = set()
    for where, expr in queries().items():
        stripped = re.sub(r'"[^"]*"', '""', expr)
        for metric in metric_names(expr):
            read.add(metric)
            if metric in FROM_ELSEWHERE:
                continue
            assert metric in names, f"{where}: {metric} is not exported ({expr})"
        for listed in LABEL_LISTS.findall(stripped):
            for label in filter(None, (part.strip() for part in listed.split(","))):
                assert label in labels, f"{where}: no metric has the label {label}"
        for matchers in MATCHERS.findall(stripped):
            for label in re.findall(r"(\w+)\s*=~?", matchers):
                assert label in labels, f"{where}: no metric has the label {label}"
    assert {"target_info", "tickwheel_is_leader", "up"} <= read


def test_every_alert_has_a_promtool_case_where_it_fires_and_one_where_it_does_not() -> None:
    tests = yaml.safe_load(RULES_TESTS.read_text())
    assert tests["rule_files"] == [RULES_FILE.name]
    cases = [case for group in tests["tests"] for case in group["alert_rule_test"]]
    for alert in ALERTS:
        mine = [case for case in cases if case["alertname"] == alert.name]
        assert any(case["exp_alerts"] for case in mine), f"{alert.name} never fires"
        assert any(not case["exp_alerts"] for case in mine), f"{alert.name} always fires"
    assert {case["alertname"] for case in cases} == {alert.name for alert in ALERTS}


def test_the_rules_file_and_the_prometheus_rule_hold_the_same_rules() -> None:
    plain = yaml.safe_load(RULES_FILE.read_text())
    crd = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text())
    assert crd["spec"] == plain == rule_groups()
    assert crd == prometheus_rule()
    assert [rule["alert"] for rule in plain["groups"][0]["rules"]] == [a.name for a in ALERTS]


def test_short_for_renders_the_same_rules_with_every_for_divided() -> None:
    fast = rule_groups(for_divisor=60)["groups"][0]["rules"]
    slow = rule_groups()["groups"][0]["rules"]
    for quick, rule in zip(fast, slow, strict=True):
        assert {**quick, "for": rule["for"]} == rule
        assert int(quick["for"].rstrip("s")) * 60 <= int(rule["for"].rstrip("s")) < int(
            quick["for"].rstrip("s")) * 60 + 60


def panels_of(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = dashboard["panels"]
    return panels


def test_each_dashboard_is_laid_out_without_overlaps_and_reads_its_data_source() -> None:
    for uid in DASHBOARDS:
        dashboard = json.loads((DEPLOY / "grafana" / f"{uid}.json").read_text())
        assert dashboard["uid"] == uid
        assert next(v["name"] for v in dashboard["templating"]["list"]) == "datasource"
        ids = [panel["id"] for panel in panels_of(dashboard)]
        assert len(ids) == len(set(ids)), uid
        cells: set[tuple[int, int]] = set()
        for panel in panels_of(dashboard):
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (uid, panel["title"])
            taken = {(grid["x"] + dx, grid["y"] + dy)
                     for dx in range(grid["w"]) for dy in range(grid["h"])}
            assert not taken & cells, (uid, panel["title"])
            cells |= taken
            if panel["type"] == "row":
                continue
            assert panel["targets"], (uid, panel["title"])
            assert panel["datasource"] == "${datasource}", (uid, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"] == "${datasource}", (uid, panel["title"])
                assert target["expr"] and target["legendFormat"], (uid, panel["title"])


def monitoring_objects() -> list[Manifest]:
    return kustomize_lite.render(MONITORING)


def test_the_dashboards_configmap_is_valid_and_small_enough_to_apply() -> None:
    [configmap] = [obj for obj in monitoring_objects() if obj["kind"] == "ConfigMap"]
    kubernetes_validate.validate(configmap, SCHEMA_VERSION, strict=True)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert set(configmap["data"]) == {f"{uid}.json" for uid in DASHBOARDS}
    for name, text in configmap["data"].items():
        assert text == (DEPLOY / "grafana" / name).read_text()
    # kubectl apply keeps the whole object in an annotation, at most 256 KiB.
    assert len(json.dumps(configmap)) < 200 * 1024


def test_the_pod_monitor_scrapes_the_metrics_port_of_every_shards_pods() -> None:
    [monitor] = [obj for obj in monitoring_objects() if obj["kind"] == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "http" and endpoint["path"] == "/metrics"
    for name in KUSTOMIZATIONS:
        objects = kustomize_lite.render(K8S / name)
        [config] = [obj for obj in objects if obj["kind"] == "ConfigMap"]
        assert config["data"]["TICKWHEEL_METRICS_LISTEN"].endswith(f":{METRICS_PORT}"), name
        for statefulset in statefulsets(objects):
            template = statefulset["spec"]["template"]
            assert selector.items() <= template["metadata"]["labels"].items(), name
            assert template["metadata"]["labels"][monitor["spec"]["jobLabel"]] == JOB, name
            [container] = template["spec"]["containers"]
            assert {"name": endpoint["port"], "containerPort": METRICS_PORT} in container[
                "ports"], name


def test_the_prometheus_rule_names_the_kube_prometheus_kind() -> None:
    [rule] = [obj for obj in monitoring_objects() if obj["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert [obj["kind"] for obj in monitoring_objects()] == [
        "PodMonitor", "PrometheusRule", "ConfigMap"]
