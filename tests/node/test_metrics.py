"""What a node's ``/metrics`` says, read back through prometheus-client's own parser: the
lateness histogram by topic, the consumer groups' figures and the followers' lag."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tickwheel.node.ops.metrics import DEFAULT_GROUP_LABEL, OTHER_TOPICS, Metrics
from tickwheel.replication import GroupSummary


def samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called ``name``, by its labels."""
    text = generate_latest(metrics.registry).decode()
    return {tuple(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name}


def test_lateness_is_a_histogram_per_topic_label() -> None:
    metrics = Metrics(max_topic_labels=2)
    metrics.observe_delivered("orders", 3, [0, 40, 3_000])
    metrics.observe_delivered("mails", 1, [7])
    metrics.observe_delivered("late-comer", 2, [1, 1])
    metrics.observe_delivered("orders", 1, [])
    counts = samples(metrics, "tickwheel_delivery_lateness_seconds_count")
    assert counts == {(("topic", "orders"),): 3, (("topic", "mails"),): 1,
                      (("topic", OTHER_TOPICS),): 2}
    buckets = samples(metrics, "tickwheel_delivery_lateness_seconds_bucket")
    assert buckets[(("le", "0.05"), ("topic", "orders"))] == 2
    assert buckets[(("le", "2.5"), ("topic", "orders"))] == 2
    assert buckets[(("le", "5.0"), ("topic", "orders"))] == 3
    assert buckets[(("le", "+Inf"), ("topic", "mails"))] == 1
    assert samples(metrics, "tickwheel_delivery_lateness_seconds_sum")[
        (("topic", "orders"),)] == 3.04
    assert samples(metrics, "tickwheel_delivered_messages_total")[(("topic", "orders"),)] == 4


def test_each_group_has_its_ready_and_unacked_and_the_default_group_a_label() -> None:
    metrics = Metrics(max_topic_labels=1)
    metrics.set_groups([GroupSummary("orders", "", 5, 1, 0),
                        GroupSummary("orders", "billing", 2, 3, 4),
                        GroupSummary("spam", "a", 10, 0, 1),
                        GroupSummary("junk", "b", 20, 2, 0)])
    ready = samples(metrics, "tickwheel_group_ready_messages")
    assert ready == {(("group", DEFAULT_GROUP_LABEL), ("topic", "orders")): 5,
                     (("group", "billing"), ("topic", "orders")): 2,
                     (("group", OTHER_TOPICS), ("topic", OTHER_TOPICS)): 30}
    unacked = samples(metrics, "tickwheel_group_unacked_messages")
    assert unacked[(("group", "billing"), ("topic", "orders"))] == 3
    assert unacked[(("group", OTHER_TOPICS), ("topic", OTHER_TOPICS))] == 2
    assert samples(metrics, "tickwheel_group_dropped_messages") == {
        (("topic", "orders"),): 4, (("topic", OTHER_TOPICS),): 1}
    metrics.set_groups([GroupSummary("orders", "billing", 0, 0, 4)])
    assert samples(metrics, "tickwheel_group_ready_messages") == {
        (("group", "billing"), ("topic", "orders")): 0}


def test_the_leader_publishes_each_members_lag_and_a_follower_none() -> None:
    metrics = Metrics()
    metrics.set_member_lag(120, {"a:7500": 120, "b:7500": 20, "c:7500": 130})
    assert samples(metrics, "tickwheel_member_lag_entries") == {
        (("member", "a:7500"),): 0, (("member", "b:7500"),): 100,
        (("member", "c:7500"),): 0}
    metrics.set_member_lag(125, {})
    assert samples(metrics, "tickwheel_member_lag_entries") == {}
