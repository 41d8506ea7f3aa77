"""``python -m tickwheel.chaos run``: break a real cluster on purpose and log what it cost.

::

    python -m tickwheel.chaos run --out chaos-out --duration 120 --rate 200 --seed 7 \\
        --faults kill,pause,partition [--nodes 5] [--shards 2] [--burst 200000 [--burst-at 60]]
    python -m tickwheel.chaos.audit chaos-out          # the verdict, from the logs alone
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from tickwheel.chaos.burst import BurstConfig, default_lead_s
from tickwheel.chaos.nemesis import FAULTS, NemesisConfig
from tickwheel.chaos.runner import RunConfig, run
from tickwheel.chaos.workload import Mix
from tickwheel.client.shards import MAX_SHARDS


def _faults(text: str) -> tuple[str, ...]:
    """``all`` is every fault, but ``disk-full`` only for root (it mounts a tmpfs per node).
    With ``power-cut`` among them, the nodes run with ``--fsync``."""
    if text == "all":
        faults = tuple(f for f in FAULTS if f != "disk-full" or os.geteuid() == 0)
    else:
        faults = tuple(f.strip() for f in text.split(","))
    try:
        NemesisConfig(faults=faults)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return faults


def _burst(parser: argparse.ArgumentParser, args: argparse.Namespace) -> BurstConfig | None:
    """The burst asked for, if any: it must come due while production runs, so that the
    drain waits for it and the audit owes every message of it."""
    if args.burst <= 0:
        return None
    at_s = args.duration / 2 if args.burst_at is None else args.burst_at
    lead_s = default_lead_s(args.burst) if args.burst_lead is None else args.burst_lead
    if at_s < 0 or lead_s <= 0:
        parser.error("--burst-at must be 0 or more, --burst-lead above 0")
    if at_s + lead_s >= args.duration:
        parser.error(f"the burst would come due at {at_s + lead_s:g} s, after the run's "
                     f"{args.duration:g} s: give a longer --duration or an earlier --burst-at")
    return BurstConfig(messages=args.burst, at_s=at_s, lead_s=lead_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tickwheel.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="one scenario")
    run_parser.add_argument("--out", type=Path, required=True, help="where the logs go")
    run_parser.add_argument("--nodes", type=int, default=3, help="nodes of each shard")
    run_parser.add_argument("--shards", type=int, default=1,
                            help="Raft groups; each fault hits one shard, or all at once")
    run_parser.add_argument("--duration", type=float, default=120.0, help="seconds producing")
    run_parser.add_argument("--rate", type=float, default=200.0, help="messages per second")
    run_parser.add_argument("--seed", type=int, default=1)
    run_parser.add_argument("--faults", type=_faults, default=("kill", "pause", "partition"),
                            help=f"comma-separated, of {', '.join(FAULTS)}; or 'all' "
                                 "(power-cut runs the nodes with --fsync)")
    run_parser.add_argument("--warmup", type=float, default=8.0, help="seconds before faults")
    run_parser.add_argument("--interval", type=float, default=10.0,
                            help="recovery seconds after each fault")
    run_parser.add_argument("--max-skew-ms", type=int, default=5_000)
    run_parser.add_argument("--near-max-ms", type=int, default=60_000,
                            help="longest delay of the ordinary messages")
    run_parser.add_argument("--grace-ms", type=int, default=5_000)
    run_parser.add_argument("--keep-data", action="store_true")
    run_parser.add_argument("--snapshot-min-entries", type=int,
                            help="the nodes' setting (snapshots sooner: more for the storage "
                                 "faults to damage and mend)")
    run_parser.add_argument("--burst", type=int, default=0, metavar="N",
                            help="N messages on a topic of their own (burst), all due at once, "
                                 "scheduled in the middle of the run")
    run_parser.add_argument("--burst-at", type=float, metavar="S",
                            help="seconds into production the burst's scheduling begins "
                                 "(default: half the duration)")
    run_parser.add_argument("--burst-lead", type=float, metavar="S",
                            help="seconds from then to its due time (default: 5 + N / 8,000)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for noisy in ("tickwheel.client",):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.nodes < 3:
        parser.error("--nodes must be at least 3: the faults need a majority to survive")
    if not 1 <= args.shards <= MAX_SHARDS:
        parser.error(f"--shards must be 1 to {MAX_SHARDS}")
    burst = _burst(parser, args)
    config = RunConfig(
        out=args.out, nodes=args.nodes, shards=args.shards, duration_s=args.duration,
        rate=args.rate,
        seed=args.seed, grace_ms=args.grace_ms, keep_data=args.keep_data,
        snapshot_min_entries=args.snapshot_min_entries,
        mix=Mix(near_max_ms=args.near_max_ms),
        nemesis=NemesisConfig(faults=args.faults, warmup_s=args.warmup,
                              interval_s=args.interval, max_skew_ms=args.max_skew_ms),
        burst=burst)
    record = run(config)
    summary = record["summary"]
    print(f"faults inflicted: {', '.join(summary['inflicted']) or 'none'}; leader changes seen: "
          f"{summary['leader_changes']}; lines: {summary['lines']}")
    if (burst_record := record["burst"]) is not None:
        print(f"burst: {burst_record['acked']:,} of {burst_record['messages']:,} accepted on "
              f"{burst_record['topic']}, due {burst_record['due_ms'] - record['started_ms']:,} "
              "ms into the run")
    print(f"next: python -m tickwheel.chaos.audit {args.out}")
    missing = set(args.faults) - set(summary["inflicted"])
    if missing:
        print(f"not inflicted (run too short): {', '.join(sorted(missing))}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
