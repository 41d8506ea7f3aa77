"""PromQL fragments the dashboards and the alert rules share.

Every node exports ``target_info{shard="K"}``; a series is put on its shard by joining on the
target (``instance`` and ``job``). The replicated figures (pending, ready, unacked, a group's
backlog) are the same on every member of a shard, so they are read from the shard's leader
alone and then summed over the shards; a node's own figures (disk, steps, terms) are read
from every node. Called by ``alerts`` and ``dashboards``.
"""

from __future__ import annotations

JOB = "tickwheel"
"""The scrape job of the nodes: the PodMonitor's ``jobLabel`` gives the pods' label
``app.kubernetes.io/name``, and a plain Prometheus names its job so."""


def on_shard(expression: str) -> str:
    """``expression`` with the ``shard`` label of the node each of its series comes from."""
    return f"({expression}) * on (instance, job) group_left (shard) target_info"


def on_leader(expression: str) -> str:
    """``expression``'s series from the nodes that lead their shard now."""
    return f"({expression}) and on (instance, job) (tickwheel_is_leader == 1)"


def rate(counter: str, by: str, window: str = "5m") -> str:
    """The per-second rate of ``counter`` (a prometheus-client counter: its samples are
    ``<name>_total``), summed by ``by``."""
    return f"sum by ({by}) (rate({counter}_total[{window}]))"


def quantile(q: float, histogram: str, by: str, window: str = "5m") -> str:
    """The ``q`` quantile of ``histogram`` over ``window``, from every node's buckets."""
    return (f"histogram_quantile({q}, sum by ({by}, le) "
            f"(rate({histogram}_bucket[{window}])))")
