"""The Grafana dashboards of a tickwheel cluster, built with grafanalib.

Two dashboards: *delivery* (what the topics and their consumer groups see: rates, lateness,
queues, refusals) and *cluster* (what the members do: leaders, terms, failovers, commit and
cursor lag, Raft steps, disks, damaged storage, clocks). Every panel reads metrics a node
exports (docs/node.md, "Metrics"); ``tests/deploy`` checks each name against a node's
registry and the cluster test evaluates every query against a real cluster. Queries use the
variables ``$datasource``, ``$topic`` (a regular expression, ``.*`` for all) and Grafana's
``$__rate_interval``. Called by ``generate``.
"""

from __future__ import annotations

from typing import Any

from grafanalib.core import (
    BYTES_FORMAT,
    OPS_FORMAT,
    SECONDS_FORMAT,
    SHORT_FORMAT,
    Dashboard,
    GridPos,
    RowPanel,
    Target,
    Template,
    Templating,
    TimeSeries,
)

from .queries import JOB, on_leader, on_shard

DATASOURCE = "${datasource}"
TOPIC = 'topic=~"$topic"'
RATE = "$__rate_interval"
PANEL_WIDTH, PANEL_HEIGHT, ROW_HEIGHT, GRID_WIDTH = 12, 8, 1, 24


def panel(title: str, unit: str, description: str,
          *queries: tuple[str, str]) -> TimeSeries:
    """A time series panel of ``(query, legend)`` pairs."""
    return TimeSeries(
        title=title, unit=unit, description=description, dataSource=DATASOURCE,
        targets=[Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + index),
                        datasource=DATASOURCE)
                 for index, (expr, legend) in enumerate(queries)])


def laid_out(rows: list[tuple[str, list[TimeSeries]]]) -> list[Any]:
    """Each row's title, then its panels two abreast, top to bottom."""
    placed: list[Any] = []
    y = 0
    for title, panels in rows:
        placed.append(RowPanel(title=title, gridPos=GridPos(h=ROW_HEIGHT, w=GRID_WIDTH, x=0,
                                                            y=y)))
        y += ROW_HEIGHT
        for index, one in enumerate(panels):
            column, line = index % 2, index // 2
            one.gridPos = GridPos(h=PANEL_HEIGHT, w=PANEL_WIDTH, x=column * PANEL_WIDTH,
                                  y=y + line * PANEL_HEIGHT)
            placed.append(one)
        y += (len(panels) + 1) // 2 * PANEL_HEIGHT
    return placed


def templating(topics: bool) -> Templating:
    variables = [Template(name="datasource", label="Data source", type="datasource",
                          query="prometheus", default="Prometheus")]
    if topics:
        variables.append(Template(
            name="topic", label="Topic", dataSource=DATASOURCE, type="query",
            query="label_values(tickwheel_delivered_messages_total, topic)",
            includeAll=True, multi=True, allValue=".*", default="$__all", refresh=2,
            sort=1))
    return Templating(list=variables)


def dashboard(uid: str, title: str, description: str, topics: bool,
              rows: list[tuple[str, list[TimeSeries]]]) -> Dashboard:
    return Dashboard(uid=uid, title=title, description=description, tags=["tickwheel"],
                     timezone="utc", refresh="30s", templating=templating(topics),
                     panels=laid_out(rows)).auto_panel_ids()


def lateness(q: float) -> str:
    return (f"histogram_quantile({q}, sum by (topic, le) "
            f"(rate(tickwheel_delivery_lateness_seconds_bucket{{{TOPIC}}}[{RATE}])))")


def per_topic_rate(counter: str) -> str:
    return f"sum by (topic) (rate({counter}_total{{{TOPIC}}}[{RATE}]))"


def on_leaders(gauge: str, by: str) -> str:
    """A replicated gauge, from each shard's leader, summed over the shards."""
    return f"sum by ({by}) ({on_leader(gauge)})"


def delivery() -> Dashboard:
    messages = [
        panel("Scheduled, cancelled, rescheduled", OPS_FORMAT,
              "Messages a second, every shard.",
              (f"sum(rate(tickwheel_scheduled_messages_total[{RATE}]))", "scheduled"),
              (f"sum(rate(tickwheel_cancelled_messages_total[{RATE}]))", "cancelled"),
              (f"sum(rate(tickwheel_rescheduled_messages_total[{RATE}]))", "rescheduled")),
        panel("Deliveries per topic", OPS_FORMAT,
              "Every attempt sent to a consumer, a second.",
              (per_topic_rate("tickwheel_delivered_messages"), "{{topic}}")),
        panel("Lateness per topic (p50, p99)", SECONDS_FORMAT,
              "First delivery time minus due time, first attempts only.",
              (lateness(0.5), "p50 {{topic}}"), (lateness(0.99), "p99 {{topic}}")),
        panel("Acked, retried, redelivered, dead-lettered per topic", OPS_FORMAT,
              "A second. Retried: copies filed after a nack or a visibility timeout; "
              "redelivered: released by a closing stream; dead-lettered: sent to %DLQ%.",
              (per_topic_rate("tickwheel_acked_messages"), "acked {{topic}}"),
              (per_topic_rate("tickwheel_retried_messages"), "retried {{topic}}"),
              (per_topic_rate("tickwheel_redelivered_messages"), "redelivered {{topic}}"),
              (per_topic_rate("tickwheel_dead_lettered_messages"), "dead {{topic}}")),
    ]
    queues = [
        panel("Pending per topic", SHORT_FORMAT,
              "Scheduled and not yet cancelled nor done (replicated: from each leader).",
              (on_leaders(f"tickwheel_pending_messages{{{TOPIC}}}", "topic"), "{{topic}}"),
              (on_leaders("tickwheel_pending_untracked_messages", ""), "untracked topics")),
        panel("Ready per topic and group", SHORT_FORMAT,
              "Due messages waiting for a consumer of the group.",
              (on_leaders(f"tickwheel_group_ready_messages{{{TOPIC}}}", "topic, group"),
               "{{topic}} / {{group}}")),
        panel("Unacked per topic and group", SHORT_FORMAT,
              "Delivered messages waiting for an acknowledgement.",
              (on_leaders(f"tickwheel_group_unacked_messages{{{TOPIC}}}", "topic, group"),
               "{{topic}} / {{group}}")),
        panel("Consumers and dropped per topic", SHORT_FORMAT,
              "Open consumer streams (on the leaders); ready messages a group dropped past "
              "max_ready_msgs.",
              (f"sum by (topic) (tickwheel_consumers{{{TOPIC}}})", "consumers {{topic}}"),
              (on_leaders(f"tickwheel_group_dropped_messages{{{TOPIC}}}", "topic"),
               "dropped {{topic}}")),
    ]
    refusals = [
        panel("Refused requests by code", OPS_FORMAT, "Requests refused, a second, by gRPC "
              "status code.",
              (f"sum by (code) (rate(tickwheel_rejected_requests_total[{RATE}]))", "{{code}}"),
              (f"sum(rate(tickwheel_refused_receipts_total[{RATE}]))", "acks refused")),
        panel("Quota refusals", OPS_FORMAT, "Calls refused over a principal's quota "
              "(docs/security.md, Quotas), a second.",
              (f"sum by (principal, quota) (rate(tickwheel_quota_refusals_total[{RATE}]))",
               "{{principal}} {{quota}}")),
    ]
    return dashboard("tickwheel-delivery", "tickwheel / delivery",
                     "Topics and consumer groups: rates, lateness, queues, refusals.", True,
                     [("Messages", messages), ("Queues", queues), ("Refusals", refusals)])


def step_quantile(q: float) -> str:
    return (f"histogram_quantile({q}, sum by (instance, le) "
            f"(rate(tickwheel_raft_step_seconds_bucket[{RATE}])))")


def cluster() -> Dashboard:
    raft = [
        panel("Nodes up and leaders", SHORT_FORMAT,
              "1 while Prometheus reaches the node; 1 on the node leading its shard.",
              (f'up{{job="{JOB}"}}', "up {{instance}}"),
              (on_shard("tickwheel_is_leader"), "leader s{{shard}} {{instance}}")),
        panel("Term and failovers per shard", SHORT_FORMAT,
              "The Raft term; leader changes a node saw over the last hour.",
              (f"max by (shard) ({on_shard('tickwheel_raft_term')})", "term s{{shard}}"),
              (f"max by (shard) ({on_shard('increase(tickwheel_leader_changes_total[1h])')})",
               "changes/h s{{shard}}")),
        panel("Commit index", SHORT_FORMAT, "Each node's Raft commit index.",
              (on_shard("tickwheel_raft_commit_index"), "s{{shard}} {{instance}}")),
        panel("Members' lag behind the leader", SHORT_FORMAT,
              "On the leader: committed entries each other member does not hold yet.",
              ("max by (member) (tickwheel_member_lag_entries)", "{{member}}")),
        panel("Cursor lag", SECONDS_FORMAT,
              "On the leader: now minus the cursor's second, while messages are due.",
              (on_leader("tickwheel_cursor_lag_seconds"), "{{instance}}")),
        panel("Raft steps (p50, p99, longest)", SECONDS_FORMAT,
              "How long the Raft thread worked between two waits, answering nothing "
              "meanwhile (the election timeout is 0.5 s).",
              (step_quantile(0.5), "p50 {{instance}}"), (step_quantile(0.99), "p99 {{instance}}"),
              ("tickwheel_raft_step_longest_seconds", "longest {{instance}}")),
        panel("Shard map version", SHORT_FORMAT, "1, plus 1 per growth.",
              (on_shard("tickwheel_shard_map_version"), "s{{shard}} {{instance}}")),
    ]
    storage = [
        panel("Free disk and reserve per member", BYTES_FORMAT,
              "Free space under each member's data folder; below its reserve "
              "(min_free_bytes) new messages are refused.",
              ("min by (member) (tickwheel_disk_free_bytes)", "free {{member}}"),
              ("max by (member) (tickwheel_disk_reserve_bytes)", "reserve {{member}}")),
        panel("Scheduling refused for disk", SHORT_FORMAT,
              "1 while a member of the shard is below its reserve.",
              (f"max by (shard) ({on_shard('tickwheel_disk_low')})", "s{{shard}}")),
        panel("Storage mended and damage held", SHORT_FORMAT,
              "Damaged units and records rewritten from a peer's copy since the node started, "
              "attempts no copy could mend; 1 while the leader's dispatch waits at damage.",
              ("max by (instance, kind) (tickwheel_storage_mended)", "{{kind}} {{instance}}"),
              ("tickwheel_storage_damage_held", "held {{instance}}")),
        panel("Clock offsets", SECONDS_FORMAT,
              "On the leader: each member's clock minus the leader's (at least), and how much "
              "more it may be (the round trip).",
              ("max by (member) (tickwheel_member_clock_offset_seconds)", "offset {{member}}"),
              ("max by (member) (tickwheel_member_clock_error_seconds)", "error {{member}}")),
    ]
    return dashboard("tickwheel-cluster", "tickwheel / cluster",
                     "The members: leaders, terms, failovers, lag, Raft steps, disks, "
                     "storage, clocks.", False, [("Raft", raft), ("Storage and clocks", storage)])


DASHBOARDS = {"tickwheel-delivery": delivery, "tickwheel-cluster": cluster}
"""Each dashboard's uid (its file's name) and what builds it."""
