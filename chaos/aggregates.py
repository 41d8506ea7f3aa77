"""Spark aggregates the audit's figures share: the one row of an aggregate over a whole frame,
and exact nearest-rank percentiles of a column.

The rule they keep: a percentile is exact while a frame holds fewer rows than
`PERCENTILE_ACCURACY` (``percentile_approx`` at that accuracy is exact below it), and means
what `tickwheel.chaos.failovers.percentiles` means on a list: the smallest value that at
least that share of the rows does not exceed. Used by `tickwheel.chaos.audit` and
`tickwheel.chaos.burst_audit`.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

PERCENTILE_ACCURACY = 10_000_000
"""``percentile_approx`` is exact while there are fewer rows than this."""


def only_row(aggregate: DataFrame) -> Row:
    """The row of an aggregate over the whole frame: Spark gives one even without input."""
    row = aggregate.first()
    if row is None:
        raise RuntimeError("an aggregate over a whole frame came back without a row")
    return row


def percentile(column: str, share: float) -> Column:
    """The exact nearest-rank ``share`` percentile of ``column``, as an aggregate."""
    return F.percentile_approx(column, share, PERCENTILE_ACCURACY)


def spread(rows: DataFrame, column: str = "lateness_ms") -> dict[str, int | None]:
    """Exact nearest-rank p50 and p99 of ``column``, and its maximum (all None without rows)."""
    row = only_row(rows.agg(F.percentile_approx(column, [0.5, 0.99], PERCENTILE_ACCURACY)
                            .alias("percentiles"), F.max(column).alias("max")))
    p50, p99 = row.percentiles or (None, None)
    return {"p50": p50, "p99": p99, "max": row.max}
