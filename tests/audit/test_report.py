"""The audit's Markdown report and terminal tables show every table of the summary, the
``principals`` one included (who scheduled, cancelled and rescheduled what, per topic and
hour), with the principal ``""`` and null told apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from tickwheel.audit.report import print_summary, write_report


def summary() -> dict[str, Any]:
    return {"verdict": "clean", "rows": 9, "window": {"horizon_ms": 1, "grace_ms": 5000},
            "shards": {}, "hourly": [],
            "principals": [
                {"principal": None, "topic": "orders", "hour": "2026-05-01T09Z",
                 "scheduled": 4, "cancelled": 0, "rescheduled": 0},
                {"principal": "", "topic": "orders", "hour": "2026-05-01T10Z",
                 "scheduled": 2, "cancelled": 0, "rescheduled": 1},
                {"principal": "billing-svc", "topic": "invoices", "hour": "2026-05-01T10Z",
                 "scheduled": 3, "cancelled": 1, "rescheduled": 0}]}


def test_the_markdown_report_says_who_asked(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    write_report(report, summary())
    text = report.read_text(encoding="utf-8")
    assert "## Who asked: per principal, topic and hour" in text
    assert "| billing-svc | invoices | 2026-05-01T10Z | 3 | 1 | 0 |" in text
    assert "| (nobody named) | orders | 2026-05-01T10Z | 2 | 0 | 1 |" in text
    assert "| (unknown) | orders | 2026-05-01T09Z | 4 | 0 | 0 |" in text


def test_the_terminal_shows_who_asked_too() -> None:
    console = Console(record=True, width=200)
    print_summary(summary(), console)
    text = console.export_text()
    assert "Who asked" in text
    assert "billing-svc" in text and "(nobody named)" in text and "(unknown)" in text
