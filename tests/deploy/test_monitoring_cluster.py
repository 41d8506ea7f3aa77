"""Every dashboard query and every alert expression, evaluated by a real Prometheus scraping
a real 3-node cluster; then the leader is killed and the alert rules fire what they should.

The cluster puts a little of everything through (messages scheduled, received by a named
group and acked, some left ready, one nacked into its dead-letter topic, a request refused as
calls refused over a principal's quota). Prometheus 2.42 (Debian's, ``make test``
installs it) scrapes the nodes' plain-HTTP ``/metrics`` every 250 ms on 127.0.0.1, with the
alert rules rendered with every ``for:`` divided by 60 (5 minutes become 5 s), so that an
alert can fire within the test; thresholds and ranges are production's. Each query, with
its comparison stripped (an alert's terms one by one) and the dashboards' variables filled
in, must return series: every name and label exists on a running cluster. After SIGKILL of
the leader, a new one is elected, the killed node's TickwheelNodeDown fires, and nothing
fires but it, the shard's brief TickwheelShardWithoutLeader, and the dead letter's alert.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring.alerts import ALERTS, rule_groups
from monitoring.queries import JOB
from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.harness.ports import free_ports

from .test_alert_rules import pytestmark as promtool_marks
from .test_monitoring import queries

pytestmark = promtool_marks
NO_SERIES_HERE = {
    "alert TickwheelAuditDirty": "kube-state-metrics' kube_job_status_failed: the audit is a "
                                 "Kubernetes Job, and no kube-state-metrics runs here",
}
"""Queries that cannot return series on a local cluster, and why."""
ALLOWED_AFTER_KILL = {"TickwheelNodeDown", "TickwheelShardWithoutLeader", "TickwheelDeadLetters"}
VARIABLES = {"$__rate_interval": "1m", "$topic": ".*"}
"""What Grafana puts in place of the dashboards' variables."""
FOR_DIVISOR = 60


class Prometheus:
    """A prometheus server on 127.0.0.1 with its own data folder, stopped by PID."""

    def __init__(self, root: Path, targets: list[str]) -> None:
        root.mkdir()
        (root / "rules.yaml").write_text(yaml.safe_dump(rule_groups(FOR_DIVISOR)))
        (root / "prometheus.yaml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "250ms", "scrape_timeout": "200ms",
                       "evaluation_interval": "250ms"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}]}))
        [port] = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        self.log = root / "prometheus.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={root / 'prometheus.yaml'}",
                 f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT, cwd=root)

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as answer:
            return json.loads(answer.read())

    def ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def series(self, expr: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def firing(self) -> set[str]:
        alerts = self.get("/api/v1/alerts")["data"]["alerts"]
        return {alert["labels"]["alertname"] for alert in alerts if alert["state"] == "firing"}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = LocalCluster(tmp_path_factory.mktemp("monitored"), metrics=True,
                           extra_args=("--max-attempts", "2", "--retry-start-level", "1"),
                           principals={"paced": [{"actions": ["schedule"],
                                                  "topics": ["paced"]}]})
    assert started.security is not None
    access = started.security.access_file  # "paced" is the file's last principal
    access.write_text(f"{access.read_text()}\n[principal.quota]\nschedule_msgs_per_s = 1\n")
    with started:
        started.leader(timeout_s=30)
        yield started


@pytest.fixture(scope="module")
def prometheus(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path_factory.mktemp("prometheus") / "server",
                        [node.metrics_address or "" for node in cluster.nodes])
    try:
        wait_for(server.ready, 30, "prometheus to be ready", poll_s=0.1)
        yield server
    finally:
        server.stop()


def put_traffic_through(cluster: LocalCluster) -> None:
    """Scheduled, received by a named group and acked; released by a closing stream; left
    ready; retried and dead-lettered; refused over a quota (a refused request too)."""
    now_ms = int(time.time() * 1000)
    with cluster.client(timeout_s=30) as client:
        for topic, count in (("orders", 20), ("waiting", 3), ("doomed", 1)):
            for index in range(count):
                client.schedule(topic, f"{topic}-{index}", deliver_at_ms=now_ms + 500)
        with client.consume("orders", group="billing") as consumer:
            for acked, received in enumerate(consumer, start=1):
                received.ack()
                if acked == 20:
                    break
        with client.consume("waiting", prefetch=1) as consumer:
            next(consumer)  # closed unacked: released, ready again at once (redelivered)
        for _attempt in (1, 2):  # a nack: a retry copy 1 s later, then %DLQ%doomed
            doomed = wait_for(lambda: client.receive("doomed", consumer="c1", wait_ms=1_000),
                              20, "the doomed message", poll_s=0)
            doomed[0].nack()
    with cluster.client("paced", timeout_s=30) as paced:
        for index in range(3):  # 1 a second: the library waits when told to
            paced.schedule("paced", str(index), delay_ms=60_000)


def evaluated(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def measured_queries() -> dict[str, str]:
    """Every dashboard query, and each term of each alert without its comparison."""
    found = {where: expr for where, expr in queries().items() if not where.startswith("alert")}
    for alert in ALERTS:
        for index, term in enumerate(alert.terms):
            found[f"alert {alert.name}" + (f" term {index}" if index else "")] = term.query
    return found


def test_every_query_returns_series_and_a_killed_leader_fires_only_what_it_should(
        cluster: LocalCluster, prometheus: Prometheus) -> None:
    put_traffic_through(cluster)
    expected = measured_queries()
    missing = dict(expected)

    def all_answered() -> bool:
        for where, expr in list(missing.items()):
            if where not in NO_SERIES_HERE and prometheus.series(evaluated(expr)):
                del missing[where]
        return set(missing) <= set(NO_SERIES_HERE)
    try:
        wait_for(all_answered, 20, "every query to return series", poll_s=0.5)
    except TimeoutError:
        pytest.fail(f"no series for: {json.dumps(missing, indent=1)}")
    for where in NO_SERIES_HERE:
        assert where in expected and not prometheus.series(evaluated(expected[where]))
    wait_for(lambda: "TickwheelDeadLetters" in prometheus.firing(), 10,
             "the dead letter's alert", poll_s=0.25)
    assert prometheus.firing() == {"TickwheelDeadLetters"}

    leader = cluster.leader()
    cluster.signal(leader, signal.SIGKILL)
    cluster.leader(timeout_s=30, among=[node for node in cluster.nodes if node is not leader])
    down = f'up{{job="{JOB}",instance="{leader.metrics_address}"}}'
    seen: set[str] = set()

    def node_down_fired() -> bool:
        seen.update(prometheus.firing())
        return "TickwheelNodeDown" in seen
    wait_for(node_down_fired, 30, "TickwheelNodeDown", poll_s=0.25)
    assert prometheus.series(down)[0]["value"][1] == "0"
    assert seen <= ALLOWED_AFTER_KILL, seen
    alerts = prometheus.get("/api/v1/alerts")["data"]["alerts"]
    assert [alert["labels"]["instance"] for alert in alerts
            if alert["labels"]["alertname"] == "TickwheelNodeDown"] == [leader.metrics_address]
