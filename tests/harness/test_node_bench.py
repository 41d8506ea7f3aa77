"""The node benchmark's capacity and schedule runs, on a small load: they print every figure
they promise (their values are not checked here, beyond being figures)."""

import json

import pytest

from tickwheel.harness import node_bench

pytestmark = pytest.mark.cluster


def test_the_capacity_run_reports_what_was_delivered_and_the_cpu_of_every_party(
        capsys: pytest.CaptureFixture) -> None:
    assert node_bench.main(["--json", "--quick", "--only", "capacity",
                            "--capacity-rate", "2000"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["capacity_offered_per_s"] == 2000
    assert figures["capacity_delivered_per_s"] > 0
    assert figures["producer_behind_s_at_capacity"] >= 0
    for party in ("leader", "follower", "clients"):
        assert figures[f"{party}_cpu_us_per_msg_at_capacity"] > 0, party
    assert (figures["follower_cpu_us_per_msg_at_capacity"]
            < figures["cluster_cpu_us_per_msg_at_capacity"])
    assert not any("lateness" in key for key in figures)  # --only: that phase alone


def test_the_schedule_run_reports_calls_a_second_and_their_cpu_threaded_and_asyncio(
        capsys: pytest.CaptureFixture) -> None:
    assert node_bench.main(["--json", "--quick", "--only", "schedule",
                            "--single-threads", "4"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["grpc_schedule_msgs_per_s"] > 0
    for suffix in ("", "_async"):
        assert figures[f"grpc_schedule_single{suffix}_per_s"] > 0, suffix
        for party in ("cluster", "clients"):
            assert figures[f"{party}_cpu_us_per_msg_single{suffix}"] > 0, (party, suffix)
    assert not any("lateness" in key or "capacity" in key for key in figures)
