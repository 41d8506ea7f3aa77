"""The production audit (ledgers alone) against the chaos audit (the runner's client logs) of
one real run with leader kills: they agree on what is lost, unflagged, early and delivered
after a cancel, and the repeats the ledgers show in the failovers' new leaderships cover every
duplicate the consumers received. The runner gathered the ledgers with ``tickwheel ledger
fetch`` (``OUT/ledgers``, its ``fetch.json``), and ``tickwheel audit`` is run on that folder as
users run it, with the runner's receipts (``received.jsonl``: the fields the client library's
receipts have)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sparktests import QUICK_JVM

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1_500)]


def test_the_ledgers_and_the_client_logs_tell_the_same_run(
        tmp_path: Path, in_background: Callable[..., Any]) -> None:
    out = tmp_path / "chaos"
    env = {**os.environ, QUICK_JVM[0]: QUICK_JVM[1]}
    run = subprocess.run(
        [sys.executable, "-m", "tickwheel.chaos", "run", "--out", str(out), "--nodes", "3",
         "--duration", "40", "--rate", "100", "--seed", "23", "--faults", "kill",
         "--interval", "8"], capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3_000:]
    fetch = json.loads((out / "ledgers" / "fetch.json").read_text())
    assert fetch["close_open"] is True and fetch["missed"] == [], fetch
    assert {node["shard"] for node in fetch["nodes"]} == {0} and len(fetch["nodes"]) == 3
    assert json.loads((out / "run.json").read_text())["ledger_fetch"] == 0
    chaos = in_background(subprocess.run, [sys.executable, "-m", "tickwheel.chaos.audit",
                                           str(out), "--json"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert chaos.returncode in (0, 1), chaos.stderr[-3_000:]
    summary = json.loads(chaos.stdout)
    ledgers = summary["ledgers"]
    assert ledgers["fetch"] == fetch
    totals = ledgers["totals"]
    assert summary["messages"]["acked"] > 1_000
    assert totals["failovers"] >= 2, ledgers["shards"]["0"]["leaders"]
    assert (summary["lost"]["count"], summary["duplicates"]["unflagged"],
            summary["delivered_early"], summary["cancelled_but_delivered"]) == (
        totals["overdue"], totals["unflagged_repeats"], totals["early"],
        totals["after_cancel"])
    assert summary["verdict"] == ledgers["verdict"] == "clean", (summary, ledgers)
    repeated = sum(failover["repeated"]["total"]
                   for failover in ledgers["shards"]["0"]["failovers"])
    assert repeated >= summary["duplicates"]["total"]

    receipts = tmp_path / "receipts"
    receipts.mkdir()
    shutil.copy(out / "received.jsonl", receipts / "received.jsonl")
    until = str(summary["run"]["ended_ms"] - summary["run"]["grace_ms"])
    command = in_background(subprocess.run, [
        sys.executable, "-m", "tickwheel.cli", "audit", str(out / "ledgers"),
        "--receipts", str(receipts), "--json", "--until", until,
        "--grace-ms", str(summary["run"]["grace_ms"]),
        "--allowed-early-ms", str(summary["run"]["allowed_early_ms"]),
        "--report", str(tmp_path / "report" / "audit.md")],
        capture_output=True, text=True, timeout=600, env=env)
    assert command.returncode == 0, command.stderr[-3_000:]
    production = json.loads(command.stdout)
    seen = production["receipts"]
    assert seen["duplicates"]["total"] == summary["duplicates"]["total"]
    assert seen["duplicates"]["unflagged"] == summary["duplicates"]["unflagged"] == 0
    assert seen["lost_at_consumer"]["count"] == 0
    assert production["totals"]["failovers"] == totals["failovers"]
    for name in ("audit.md", "summary.json", "audit-traffic.png", "audit-lateness.png"):
        assert (tmp_path / "report" / name).stat().st_size > 0
