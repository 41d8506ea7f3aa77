"""The node benchmark's capacity run, on a small load: it prints every figure it promises
(its values are not checked here, beyond being figures)."""

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
