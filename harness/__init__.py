"""The process harness, above the node: what starts real node processes and drives them as a
user would. `local_cluster` (a cluster of `tickwheel serve` processes on 127.0.0.1, for tests,
``tickwheel cluster up``, benchmarks and chaos; the command itself is `tickwheel.cli`, above),
`demo` (``make demo``) and the benchmarks `wheel_bench`, `replication_bench` and `node_bench`
(``make bench``)."""
