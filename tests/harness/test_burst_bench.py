"""The burst benchmark on a small burst: every message of it delivered once, none early, and
every figure it promises reported."""

import json

import pytest

from tickwheel.harness import burst_bench

pytestmark = pytest.mark.cluster


def test_a_small_burst_is_delivered_once_and_on_time(capsys: pytest.CaptureFixture) -> None:
    assert burst_bench.main(["--json", "--messages", "4000", "--steady-rate", "50"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["burst_delivered"] == 4000
    assert figures["burst_unflagged_repeats"] == 0 and figures["burst_early"] == 0
    assert figures["burst_last_after_due_s"] >= 0 and figures["leader_peak_rss_mb"] > 0
    assert figures["steady_messages_during_burst"] >= 0
