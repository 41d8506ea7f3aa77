"""The production audit's outputs: the Markdown report (``--report FILE``) with its plots and
the summary beside it, and the table printed to the terminal.

Everything is drawn from the summary (`tickwheel.audit.summary`); nothing is recomputed.
``--report FILE`` writes ``FILE`` (Markdown), and beside it ``summary.json`` and two PNG
plots, ``<stem>-traffic.png`` (sent per hour, a line per topic/group) and
``<stem>-lateness.png`` (first sends' lateness p99 per hour, a line per topic/group).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

SHARD_HEADER = ["shard", "nodes", "scheduled", "deliveries", "overdue (never sent)",
                "unknown", "early", "after cancel", "contrary", "repeats f / u", "failovers",
                "gaps"]
FAILOVER_HEADER = ["shard", "old -> new", "term", "no sends (ms)", "repeats f / u"]
HOURLY_HEADER = ["topic/group", "hour", "scheduled", "sent", "acked", "retried",
                 "dead-lettered", "lateness p50 / p99 / max (ms)"]
PRINCIPAL_HEADER = ["principal", "topic", "hour", "scheduled", "cancelled", "rescheduled"]
NOBODY: Final = "(nobody named)"
"""How the tables show the principal ``""`` (a node without authentication, or a cluster still
at version 1); null (a segment written before the column) shows as ``(unknown)``."""


def write_report(path: Path, summary: dict[str, Any]) -> list[Path]:
    """Write the report to ``path``, ``summary.json`` and the plots beside it; return the
    paths written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    traffic = path.with_name(f"{path.stem}-traffic.png")
    lateness = path.with_name(f"{path.stem}-lateness.png")
    summary_path = path.with_name("summary.json")
    summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _plot(summary["hourly"], lambda row: row["sent"], "sent per hour", traffic)
    _plot(summary["hourly"], lambda row: row["lateness_ms"]["p99"],
          "first sends' lateness p99 (ms)", lateness)
    path.write_text(render_markdown(summary, traffic.name, lateness.name), encoding="utf-8")
    return [path, summary_path, traffic, lateness]


def tables(summary: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """``(title, header, rows)`` of every table, for Markdown and the terminal alike."""
    shards = [[number, ", ".join(f["nodes"]), str(f["messages"]["scheduled"]),
               str(f["messages"]["deliveries"]),
               f"{f['overdue']['count']} ({f['overdue']['never_sent']})",
               str(f["unknown"]["count"]), str(f["early"]["count"]),
               str(f["after_cancel"]["count"]), str(f["contrary_to_reschedule"]["count"]),
               f"{f['repeated']['flagged']} / {f['repeated']['unflagged']}",
               str(len(f["failovers"])), str(len(f["gaps"]))]
              for number, f in summary["shards"].items()]
    failovers = [[number, f"{f['old_leader']} -> {f['new_leader']}", str(f["term"]),
                  _text(f["gap_ms"]),
                  f"{f['repeated']['flagged']} / {f['repeated']['unflagged']}"]
                 for number, figures in summary["shards"].items()
                 for f in figures["failovers"]]
    hourly = [[f"{row['topic']}/{row['group']}", row["hour"], *(str(row[name]) for name in (
               "scheduled", "sent", "acked", "retried", "dead_lettered")),
               " / ".join(_text(row["lateness_ms"][key]) for key in ("p50", "p99", "max"))]
              for row in summary["hourly"]]
    principals = [[_principal(row["principal"]), row["topic"], row["hour"],
                   *(str(row[name]) for name in ("scheduled", "cancelled", "rescheduled"))]
                  for row in summary["principals"]]
    return [("Shards", SHARD_HEADER, shards), ("Failovers", FAILOVER_HEADER, failovers),
            ("Per topic and group, per hour", HOURLY_HEADER, hourly),
            ("Who asked: per principal, topic and hour", PRINCIPAL_HEADER, principals)]


def render_markdown(summary: dict[str, Any], traffic_png: str, lateness_png: str) -> str:
    """The whole report."""
    lines = [f"# tickwheel audit: {summary['verdict']}", "",
             f"Rows read: {summary['rows']}; horizon {summary['window']['horizon_ms']} ms, "
             f"grace {summary['window']['grace_ms']} ms.", ""]
    for title, header, rows in tables(summary):
        lines += [f"## {title}", "", "| " + " | ".join(header) + " |",
                  "|" + "---|" * len(header), *("| " + " | ".join(row) + " |" for row in rows),
                  ""]
    lines += ["## Problems", ""]
    for number, figures in summary["shards"].items():
        for name in ("overdue", "unknown", "early", "after_cancel", "contrary_to_reschedule"):
            if figures[name]["ids"]:
                lines.append(f"- shard {number}, {name}: {', '.join(figures[name]['ids'])}")
        if figures["repeated"]["unflagged_ids"]:
            lines.append(f"- shard {number}, unflagged repeats: "
                         + ", ".join(figures["repeated"]["unflagged_ids"]))
        lines += [f"- shard {number}, ledger gap: {gap['node']} {gap['reason']} "
                  f"{gap['from_ms']}..{gap['to_ms']} segments {gap['sequences']}"
                  for gap in figures["gaps"]]
    receipts = summary.get("receipts")
    if receipts is not None:
        lines += ["", "## What consumers saw", "",
                  f"Received {receipts['received']} deliveries in {receipts['receipts']} "
                  f"receipts; lost at the consumer {receipts['lost_at_consumer']['count']}; "
                  f"duplicates flagged {receipts['duplicates']['flagged']}, unflagged "
                  f"{receipts['duplicates']['unflagged']}."]
    lines += ["", "## Plots", "", f"![sent per hour]({traffic_png})", "",
              f"![lateness p99 per hour]({lateness_png})", ""]
    return "\n".join(lines)


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """The verdict and the tables, on the terminal."""
    console = console or Console()
    for title, header, rows in tables(summary):
        table = Table(*header, title=title)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    console.print(f"verdict: {summary['verdict']}")


def _plot(rows: list[dict[str, Any]], value: Any, title: str, path: Path) -> None:
    figure = Figure(figsize=(8, 4))
    axes = figure.add_subplot()
    lines: dict[str, list[tuple[str, Any]]] = {}
    for row in rows:
        lines.setdefault(f"{row['topic']}/{row['group']}", []).append((row["hour"], value(row)))
    for name, points in sorted(lines.items()):
        kept = [(hour, figure_) for hour, figure_ in points if figure_ is not None]
        axes.plot([hour for hour, _ in kept], [figure_ for _, figure_ in kept], marker="o",
                  label=name)
    axes.set_title(title)
    if lines:
        axes.legend(fontsize="small")
    figure.autofmt_xdate()
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=110)


def _principal(name: str | None) -> str:
    if name is None:
        return "(unknown)"
    return name or NOBODY


def _text(value: Any) -> str:
    return "-" if value is None else str(value)
