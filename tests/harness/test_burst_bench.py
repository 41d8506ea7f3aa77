"""The burst benchmark on a small burst: every message of it delivered once, none early, and
every figure it promises reported."""

import json
from array import array

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
    assert figures["leader_rss_anon_at_due_mb"] > 0
    assert {"leader_peak_rss_anon_mb", "leader_peak_rss_file_mb"} <= figures.keys()
    assert figures["raft_step_max_ms"] > 0 and figures["elections_during_burst"] >= 0


def test_the_ledger_can_be_left_off_or_given_another_segment_age(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the ledger costs a burst is measured alternately with ``--no-ledger``."""
    asked: list[tuple[tuple[str, ...], int | None]] = []

    class Started(Exception):
        pass

    def cluster(root: object, *, extra_args: tuple[str, ...], metrics: bool,
                ledger_segment_age_ms: int | None) -> None:
        asked.append((extra_args, ledger_segment_age_ms))
        raise Started

    monkeypatch.setattr(burst_bench, "LocalCluster", cluster)
    for argv in (["--no-ledger"], ["--ledger-segment-age-ms", "0"], []):
        with pytest.raises(Started):
            burst_bench.main(argv)
    assert asked == [(("--no-ledger",), 250), ((), None), ((), 250)]


def test_receipts_are_judged_in_the_order_they_arrived_whichever_consumer_had_them() -> None:
    """A message delivered to one consumer, then (flagged) to the other after a failover: the
    flagged one is the repeat, though it comes first in the list of the consumer that read
    it."""
    def receipts(*rows: tuple[int, float, int]) -> burst_bench.Receipts:
        return (array("q", [r[0] for r in rows]).tobytes(),
                array("d", [r[1] for r in rows]).tobytes(),
                array("b", [r[2] for r in rows]).tobytes())
    flagged, retry = burst_bench.POSSIBLE_DUPLICATE, burst_bench.RETRY
    tally = burst_bench._tally([receipts((7, 1_020.0, flagged), (8, 1_030.0, retry)),
                                receipts((7, 1_010.0, 0), (8, 1_005.0, 0), (9, 999.0, 0))],
                               due_ms=1_000)
    assert tally == {"burst_delivered": 3, "burst_repeated": 2, "burst_retried": 1,
                     "burst_unflagged_repeats": 0, "burst_flagged": 1, "burst_early": 0,
                     "last_ms": 1_010.0}
