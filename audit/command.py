"""``tickwheel audit DIR`` (also ``python -m tickwheel.audit DIR`` and ``spark-submit
.../tickwheel/audit/command.py DIR``): the production audit of fetched ledgers, printed as a
table or as JSON, its report written, exit 1 when the verdict is dirty (2: the arguments).

`add_arguments` declares the flags once for both entry points (`tickwheel.cli.audit` adds
the subcommand); `run` starts Spark (local mode unless ``--master``), audits, writes the
report (`tickwheel.audit.report`) and stops Spark. Spark's JVM inherits this process's
stdout and writes to it (HotSpot's warnings, a full code cache among them), so while a
command runs `jvm_output_to_stderr` points file descriptor 1 at stderr and what the command
prints goes to the stdout it saved: ``--json`` output is the JSON alone. Times given to
``--since`` and ``--until`` are Unix milliseconds, ISO 8601 (``2024-05-01T10:00:00Z``) or an
age back from now (``2h``, ``90m``, ``30s``, ``1d``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from pyspark.sql import SparkSession

from tickwheel.audit.report import print_summary, write_report
from tickwheel.audit.summary import AuditOptions, audit_ledgers

DEFAULTS = AuditOptions()
SHUFFLE_PARTITIONS = 8
"""Spark's default of 200 partitions only adds overhead on one machine's ledgers; a cluster
run can raise it with ``--conf spark.sql.shuffle.partitions=...`` (spark-submit)."""
PARTITIONS_KEY = "spark.sql.shuffle.partitions"
_AGE = re.compile(r"^(\d+)([smhd])$")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def build_session(master: str | None = None, app: str = "tickwheel-audit",
                  config: dict[str, str] | None = None) -> SparkSession:
    """A quiet Spark session, with ``config`` besides (over the defaults here). Without
    ``master``, spark-submit's applies, else ``local[*]``. The shuffle's partitions are
    `SHUFFLE_PARTITIONS` unless ``config`` or spark-submit's ``--conf`` says otherwise (a
    builder's setting would override ``--conf``, so it is set on the session after)."""
    builder = (SparkSession.builder.appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "WARN"))
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    if master is not None:
        builder = builder.master(master)
    session = builder.getOrCreate()
    if not session.sparkContext.getConf().contains(PARTITIONS_KEY):
        session.conf.set(PARTITIONS_KEY, str(SHUFFLE_PARTITIONS))
    return session


@contextmanager
def jvm_output_to_stderr() -> Iterator[None]:
    """Meanwhile, processes started from here (Spark's JVM) write their stdout to stderr, and
    ``sys.stdout`` still reaches this process's stdout; both restored after."""
    sys.stdout.flush()
    ours = os.dup(1)
    os.dup2(2, 1)
    previous = sys.stdout
    sys.stdout = open(ours, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = previous
        os.dup2(ours, 1)
        os.close(ours)


def parse_time_ms(text: str, now_ms: int | None = None) -> int:
    """``--since``/``--until``: Unix ms, ISO 8601, or an age (``2h``) before ``now_ms``."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    aged = _AGE.match(text)
    if aged:
        return now_ms - int(aged[1]) * _UNIT_MS[aged[2]]
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither Unix ms, ISO 8601 nor an age like 2h") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, metavar="DIR",
                        help="fetched ledgers: DIR/shard-<s>/<node>/ledger-*.parquet")
    parser.add_argument("--receipts", type=Path, metavar="DIR",
                        help="consumers' receipts (*.jsonl), to add what they saw")
    parser.add_argument("--since", type=parse_time_ms, help="only rows from then")
    parser.add_argument("--until", type=parse_time_ms,
                        help="only rows until then; the horizon (default: the last row)")
    parser.add_argument("--grace-ms", type=int, default=DEFAULTS.grace_ms,
                        help="overdue this long after due (default %(default)s)")
    parser.add_argument("--allowed-early-ms", type=int, default=DEFAULTS.allowed_early_ms,
                        help="a send this much before due is not early (default %(default)s)")
    parser.add_argument("--max-ids", type=int, default=DEFAULTS.max_ids,
                        help="ids listed per problem and shard (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--report", type=Path, metavar="FILE",
                        help="write the Markdown report there (plots and summary.json beside)")
    parser.add_argument("--master", help="Spark master URL (default: local[*])")


def run(args: argparse.Namespace) -> int:
    """Audit as ``args`` say; 0 when clean, 1 when dirty."""
    with jvm_output_to_stderr():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    options = AuditOptions(grace_ms=args.grace_ms, allowed_early_ms=args.allowed_early_ms,
                           since_ms=args.since, until_ms=args.until, max_ids=args.max_ids,
                           receipts=args.receipts)
    spark = build_session(args.master or "local[*]")
    try:
        summary = audit_ledgers(spark, args.folder, options)
    finally:
        spark.stop()
    if args.report is not None:
        write_report(args.report, summary)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return 0 if summary["verdict"] == "clean" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tickwheel audit",
        description="Audit fetched ledgers (docs/audit.md); exit 1 unless the verdict is clean.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
