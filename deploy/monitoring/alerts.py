"""The alert rules of a tickwheel cluster: the one source of the plain Prometheus rules file
and of the PrometheusRule (``generate`` writes both, so they cannot drift).

An alert is one or more *terms*, each a query and the comparison that makes it a problem,
joined by ``and``: ``query`` alone measures (the cluster test evaluates it and must find
series), ``query test`` decides. Thresholds and ``for:`` are for production: a failover
(a second or two without a leader, a few late messages) must not page anyone, a leader that
stays away for a minute must. `rule_groups` renders the rules, with every ``for:`` divided
by ``for_divisor`` for the cluster test (it must see an alert fire within seconds).
Called by ``generate`` and the tests in ``tests/deploy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .queries import JOB, on_leader, on_shard, quantile

GROUP_NAME = "tickwheel"
DEAD = "tickwheel_dead_lettered_messages_total"
"""Counted since the node started, a series from a topic's first dead letter on: the count
10 minutes ago is 0 where the series is newer (``increase`` would miss that first one)."""
RUNBOOK = "docs/monitoring.md"
"""Where each alert's meaning and what to do are written, in the repository (an anchor per
alert: its name in lower case)."""


@dataclass(frozen=True)
class Term:
    query: str
    """PromQL measuring one thing, a series per thing measured (shard, member, topic...)."""
    test: str
    """The comparison that makes a value a problem: ``> 0.5``, ``== 0``."""


@dataclass(frozen=True)
class Alert:
    name: str
    terms: tuple[Term, ...]
    for_s: int
    """How long the terms must hold before it fires."""
    severity: str
    """``critical``: someone acts now; ``warning``: within working hours."""
    summary: str
    description: str
    """With ``{{ $labels.x }}`` and ``{{ $value }}``: Prometheus fills them in."""

    @property
    def expr(self) -> str:
        return " and ".join(f"({term.query}) {term.test}" for term in self.terms)


ALERTS = (
    Alert("TickwheelShardWithoutLeader",
          (Term(f"max by (shard) ({on_shard('tickwheel_is_leader')})", "< 1"),),
          60, "critical", "Shard {{ $labels.shard }} has had no leader for a minute",
          "No running node of shard {{ $labels.shard }} leads: it takes no message and "
          "delivers none. A failover takes a second or two; a minute means no majority of "
          "its members can reach each other."),
    Alert("TickwheelNodeDown", (Term(f'up{{job="{JOB}"}}', "== 0"),), 300, "warning",
          "tickwheel node {{ $labels.instance }} is not answering scrapes",
          "Prometheus has not reached {{ $labels.instance }} for 5 minutes: the node is down "
          "or its metrics port is blocked. Its shard runs on while a majority is up."),
    Alert("TickwheelLatenessHigh",
          (Term(quantile(0.99, "tickwheel_delivery_lateness_seconds", "topic"), "> 1"),),
          600, "warning", "Topic {{ $labels.topic }}: p99 lateness above 1 s",
          "99% of the first deliveries of topic {{ $labels.topic }} over the last 5 minutes "
          "went out up to {{ $value | humanizeDuration }} after their due time, for 10 "
          "minutes."),
    Alert("TickwheelReplicaLagging",
          (Term("max by (member) (tickwheel_member_lag_entries)", "> 1000"),),
          300, "warning", "Member {{ $labels.member }} lags its leader",
          "{{ $labels.member }} has been more than 1,000 committed entries behind its "
          "leader for 5 minutes ({{ $value }} now): it is down, cut off, or slower than the "
          "others. Its shard has one failure less to spare."),
    Alert("TickwheelCursorBehind", (Term("max by (instance) (tickwheel_cursor_lag_seconds)",
                                         "> 30"),),
          300, "warning", "The leader on {{ $labels.instance }} hands messages out late",
          "The leader's cursor has been more than 30 s behind its clock for 5 minutes while "
          "messages are due ({{ $value | humanizeDuration }} now)."),
    Alert("TickwheelDiskLow",
          (Term("min by (member) (tickwheel_disk_free_bytes / tickwheel_disk_reserve_bytes)",
                "< 2"),),
          600, "warning", "Member {{ $labels.member }}: free disk under twice its reserve",
          "{{ $labels.member }} has less than twice its min_free_bytes free. Below the "
          "reserve every node refuses new messages (RESOURCE_EXHAUSTED)."),
    Alert("TickwheelSchedulingRefusedForDisk",
          (Term(f"max by (shard) ({on_shard('tickwheel_disk_low')})", "== 1"),),
          60, "critical", "New messages are refused: a member is out of disk",
          "A member's free space is below its min_free_bytes: Schedule and Reschedule "
          "answer RESOURCE_EXHAUSTED on every node of its shard."),
    Alert("TickwheelStorageDamageHeld",
          (Term("max by (instance) (tickwheel_storage_damage_held)", "== 1"),),
          60, "critical", "The leader on {{ $labels.instance }} waits at damaged storage",
          "The leader's dispatch is held at stored bytes that fail their checksum and that "
          "no peer could give a good copy of yet: no message past them is delivered."),
    Alert("TickwheelClockOffset",
          (Term("max by (member) (abs(tickwheel_member_clock_offset_seconds))", "> 0.1"),),
          300, "warning", "Member {{ $labels.member }}: clock off the leader's by > 100 ms",
          "The leader estimates {{ $labels.member }}'s clock {{ $value | humanizeDuration }} "
          "away from its own. One clock of three off changes nothing; a majority off moves "
          "due times. If every other member is flagged, the leader's clock is the odd one."),
    Alert("TickwheelDeadLetters",
          (Term(f"sum by (topic) ({DEAD} - ({DEAD} offset 10m or {DEAD} * 0))", "> 0"),),
          0, "warning", "Topic {{ $labels.topic }} is sending messages to its %DLQ% topic",
          "{{ $value }} messages of {{ $labels.topic }} were dead-lettered in the last 10 "
          "minutes: their consumers gave up on them after the last attempt."),
    Alert("TickwheelGroupBacklogGrowing",
          (Term("sum by (topic, group) "
                f"({on_leader('tickwheel_group_ready_messages')})", "> 1000"),
           Term("sum by (topic, group) "
                f"({on_leader('delta(tickwheel_group_ready_messages[15m])')})", "> 0")),
          900, "warning", "Group {{ $labels.group }} of {{ $labels.topic }} falls behind",
          "More than 1,000 due messages wait for consumers of group {{ $labels.group }} of "
          "topic {{ $labels.topic }}, more than 15 minutes before, for 15 minutes: its "
          "consumers are gone, too few or too slow."),
    Alert("TickwheelFrequentFailovers",
          (Term("max by (shard) "
                f"({on_shard('increase(tickwheel_leader_changes_total[1h])')})", "> 5"),),
          0, "warning", "Shard {{ $labels.shard }} changed leader more than 5 times in an hour",
          "Each change stops delivery for a second or two. Look for a node that restarts, a "
          "flapping network, or Raft steps near the election timeout "
          "(tickwheel_raft_step_longest_seconds)."),
    Alert("TickwheelAuditDirty",
          (Term('max by (namespace, job_name) '
                '(kube_job_status_failed{job_name=~"tickwheel-audit.*"})', "> 0"),),
          0, "critical", "The delivery audit {{ $labels.job_name }} found a dirty verdict",
          "The audit Job failed: its verdict is dirty (a message lost, or duplicated "
          "unflagged), or it could not finish. Its log holds the summary as JSON."),
)


def rule_groups(for_divisor: int = 1) -> dict[str, Any]:
    """The rules file's content, every ``for:`` divided by ``for_divisor``."""
    rules = [{"alert": alert.name, "expr": alert.expr,
              "for": f"{alert.for_s // for_divisor}s",
              "labels": {"severity": alert.severity},
              "annotations": {"summary": alert.summary, "description": alert.description,
                              "runbook": f"{RUNBOOK}#{alert.name.lower()}"}}
             for alert in ALERTS]
    return {"groups": [{"name": GROUP_NAME, "rules": rules}]}


def prometheus_rule() -> dict[str, Any]:
    """kube-prometheus' PrometheusRule of the same rules."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "tickwheel",
                         "labels": {"app.kubernetes.io/name": "tickwheel",
                                    "app.kubernetes.io/component": "monitoring"}},
            "spec": rule_groups()}
