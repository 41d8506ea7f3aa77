"""The figures `make demo` prints, without a cluster."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tickwheel.harness.demo import lateness_percentiles


def test_p99_is_never_above_the_max_the_demo_printed_683_over_644() -> None:
    """The first release extrapolated past the largest sample: with 60 arrivals, 58 on time
    and two late by 544 and 644 ms, it printed p99 683 ms and max 644 ms."""
    assert lateness_percentiles([3] * 58 + [544, 644]) == (3, 644, 644)


@given(st.lists(st.integers(min_value=0, max_value=100_000), min_size=1, max_size=300))
def test_p50_and_p99_are_nearest_rank_samples_in_order(lateness_ms: list[int]) -> None:
    p50, p99, most = lateness_percentiles(lateness_ms)
    assert p50 <= p99 <= most == max(lateness_ms)
    for share, value in ((50, p50), (99, p99)):
        assert value in lateness_ms
        # the smallest sample that at least ``share`` percent of the samples do not exceed
        assert 100 * sum(x <= value for x in lateness_ms) >= share * len(lateness_ms)
        assert 100 * sum(x < value for x in lateness_ms) < share * len(lateness_ms)
