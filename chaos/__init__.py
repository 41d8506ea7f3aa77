"""The failover harness and the PySpark delivery audit (issue 5)."""
