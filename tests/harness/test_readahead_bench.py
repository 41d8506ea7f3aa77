"""readahead_bench runs and tells a second read ahead from one left alone."""

from __future__ import annotations

import json

import pytest

from tickwheel.harness import readahead_bench


def test_a_far_second_is_read_only_without_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert readahead_bench.main(["--json", "--messages", "10000", "--turns", "5"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["now_ms"]["while_filing"]["units"] == figures["now_ms"]["after"]["units"] == 0
    assert figures["unbounded"]["while_filing"]["units"] >= 10_000
