"""The benchmark script runs end to end on a small load (its figures are not checked here)."""

import json
from pathlib import Path

import pytest

from tickwheel.harness import wheel_bench as bench


def test_the_benchmark_prints_every_figure_it_promises(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    assert bench.main(["--json", "--messages", "3000", "--days", "2", "--dir",
                       str(tmp_path)]) == 0
    figures = json.loads(capsys.readouterr().out)
    for key in ("insert_msgs_per_s", "due_msgs_per_s", "reopen_s",
                "index_bytes_per_msg", "insert_vs_heapq_ratio", "due_vs_heapq_ratio"):
        assert figures[key] > 0, key
    # the growth of the current RSS across the inserts, after collecting earlier garbage
    assert figures["rss_growth_mb"] >= 0
    assert figures["messages"] == 3000
    assert figures["index_bytes_per_msg"] == 40.0
    assert figures["rss_mb_1m_pending"] is None  # only measured, never extrapolated
    assert list(tmp_path.iterdir()) == []  # it cleans up after itself
