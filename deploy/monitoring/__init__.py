"""tickwheel's dashboards and alert rules as code: what an operator of a cluster watches.

``queries`` holds the PromQL both use (how a series is put on a shard, on the leader);
``alerts`` is the one source of the alert rules, rendered to a plain Prometheus rules file
and to kube-prometheus' PrometheusRule; ``dashboards`` builds the Grafana dashboards with
grafanalib; ``generate`` writes every file they make (``make monitoring``) and, with
``--check``, fails if a committed file differs. Nothing here is imported by the node: this
folder is read by ``make monitoring`` and by ``tests/deploy``, with ``deploy`` on the path.
"""
