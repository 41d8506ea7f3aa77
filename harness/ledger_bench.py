"""``python -m tickwheel.harness.ledger_bench --json``: what the ledger costs the leader.

Runs `node_bench.lateness_at` (a producer scheduling ``--rate`` messages a second, each due
`LEAD_S` later, and ``--consumers`` processes receiving and acknowledging them: schedule,
consume and ack together, as in steady state) on a fresh 3-node cluster, alternately with
the ledger on and off (``--no-ledger``), ``--rounds`` times each: on, off, on, off... so
that whatever else the machine does falls on both alike. The nodes keep the ledger's
default settings (a segment every 60 s or 64 MiB).

Figures: ``runs`` (each run's mode, ``leader_cpu_us_per_msg``, ``cluster_cpu_us_per_msg``
and lateness p99), the median of each figure per mode, and ``leader_cpu_ratio`` (the
median with the ledger on over the median with it off); the ledger's promise is a ratio of
at most 1.10 at 5,000 msg/s (docs/benchmarks.md, "The ledger's cost"). Run it under
``flock /tmp/tickwheel-measure.lock``: two cores shared with another benchmark measure
nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.harness.node_bench import lateness_at

FIGURES = ("leader_cpu_us_per_msg", "cluster_cpu_us_per_msg", "p99")


def run_once(root: Path, ledger: bool, rate: int, seconds: float, consumers: int
             ) -> dict[str, Any]:
    """One run on a fresh cluster: the figures `FIGURES` names."""
    with LocalCluster(root, extra_args=() if ledger else ("--no-ledger",),
                      ledger_segment_age_ms=None) as cluster:
        cluster.leaders(30)
        figures = lateness_at(cluster, rate, seconds, consumers)
    return {"ledger": ledger, **{key: figures[key] for key in FIGURES}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rate", type=int, default=5_000, help="due messages a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="of scheduling, a run")
    parser.add_argument("--rounds", type=int, default=3, help="runs with the ledger on (and "
                                                              "as many with it off)")
    parser.add_argument("--consumers", type=int, default=2)
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tickwheel-ledger-bench-") as root:
        for round_ in range(args.rounds):
            for ledger in (True, False):
                runs.append(run_once(Path(root) / f"{round_}-{ledger}", ledger, args.rate,
                                     args.seconds, args.consumers))
    medians = {f"{key}_{mode}": statistics.median(run[key] for run in runs
                                                  if run["ledger"] is (mode == "on"))
               for key in FIGURES for mode in ("on", "off")}
    result = {"rate": args.rate, "seconds": args.seconds, "runs": runs, **medians,
              "leader_cpu_ratio": round(medians["leader_cpu_us_per_msg_on"]
                                        / medians["leader_cpu_us_per_msg_off"], 3)}
    print(json.dumps(result, indent=2) if args.json else result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
