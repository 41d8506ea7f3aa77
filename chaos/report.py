"""The audit's outputs: ``summary.json``, ``report.md``, two PNG plots, and the terminal table.

Everything here is drawn from the summary `tickwheel.chaos.audit` computes (its docstring defines
every figure) plus the ``(received_ms, lateness_ms)`` points of first receipts; nothing is
recomputed. Times in the report are seconds since the run started.

- ``lateness.png``: each first receipt's lateness (symmetric log scale, so early receipts show
  below zero) against when it arrived, a dashed line at each failover (when the runner saw the
  new leader) and the fault windows shaded.
- ``duplicates.png``: duplicate receipts per failover, stacked by class.
- ``report.md``: the verdict, the overall figures, the per-group table, the burst's figures
  (a run with one), the race, per-fault failover, failover and fault tables, the plots, and
  up to `MAX_EXAMPLES` ids for each problem class.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from rich.console import Console
from rich.table import Table

MAX_EXAMPLES = 20
"""Ids listed per problem class in the report."""
LATENESS_PNG = "lateness.png"
DUPLICATES_PNG = "duplicates.png"
CLASS_COLOURS = {"flagged": "tab:blue", "redelivery": "tab:orange", "unflagged": "tab:red"}
FAILOVER_HEADER = ["#", "old -> new", "term", "fault", "lost at (s)", "no leader (ms)",
                   "first delivery (ms)", "no delivery (ms)", "catch-up (ms)",
                   "duplicates f / r / u", "false alarms (unsent)"]
PER_FAULT_HEADER = ["fault", "failovers", "no leader p50 / p99 / max (ms)",
                    "no delivery p50 / p99 / max (ms)", "never delivered"]
GROUP_HEADER = ["topic/group", "owed", "received", "lost", "duplicates f / r / u",
                "false alarms", "lateness p99 (ms)"]
BURST_GROUP_HEADER = ["other topic/group, during the burst", "messages", "lateness p99 (ms)",
                      "max (ms)", "the leader's send alone: p99 (ms)"]
SHARD_HEADER = ["shard", "owed", "received", "lost", "unflagged", "early",
                "lateness p99 (ms)", "failovers", "no delivery p50 / p99 / max (ms)"]
def write_report(audit_dir: Path, summary: dict[str, Any],
                 points: list[tuple[int, int]]) -> list[Path]:
    """Write ``summary.json``, ``report.md`` and the plots into ``audit_dir``; return the paths."""
    audit_dir.mkdir(parents=True, exist_ok=True)
    paths = [audit_dir / "summary.json", audit_dir / "report.md",
             audit_dir / LATENESS_PNG, audit_dir / DUPLICATES_PNG]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(render_markdown(summary), encoding="utf-8")
    _save(plot_lateness(summary, points), paths[2])
    _save(plot_duplicates(summary), paths[3])
    return paths


def render_markdown(summary: dict[str, Any]) -> str:
    """The whole ``report.md``."""
    run = summary["run"]
    lines = [f"# Delivery audit: {summary['verdict'].upper()}", "",
             f"Seed {run['seed']}, {(run['ended_ms'] - run['started_ms']) / 1000:.1f} s run, "
             f"grace {run['grace_ms']:,} ms, allowed early {run['allowed_early_ms']:,} ms. "
             "Times are seconds since the run started.", "",
             _markdown_table(["figure", "value"], [list(row) for row in overall_rows(summary)]),
             "", "## Consumer groups", "", _markdown_table(GROUP_HEADER, group_rows(summary)),
             *(["", "## Shards", "", _markdown_table(SHARD_HEADER, shard_rows(summary))]
               if summary.get("shards") else []),
             *(["", "## The burst", "",
                _markdown_table(["figure", "value"], [list(row) for row in burst_rows(summary)]),
                "", _markdown_table(BURST_GROUP_HEADER, burst_group_rows(summary))]
               if summary.get("burst") else []),
             "", "## Cancels and reschedules just before due", "", _races_markdown(summary),
             "", "## Failovers", "",
             _markdown_table(PER_FAULT_HEADER, per_fault_rows(summary)) if summary["failovers"]
             else "None.", "",
             _markdown_table(FAILOVER_HEADER, failover_rows(summary)) if summary["failovers"]
             else "", "", "## Faults", "", _faults_markdown(summary), "",
             f"![lateness]({LATENESS_PNG})", "", f"![duplicates per failover]({DUPLICATES_PNG})",
             "", "## Problems", ""]
    for heading, count, ids in _problems(summary):
        shown = ", ".join(f"`{id_}`" for id_ in ids[:MAX_EXAMPLES]) if ids else "None."
        more = f" (the first {MAX_EXAMPLES} ids)" if len(ids) > MAX_EXAMPLES else ""
        lines += [f"### {heading}: {count:,}{more}", "", shown, ""]
    return "\n".join(lines)


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """The verdict, the overall figures, the shards, the burst, the failovers by fault and one
    by one, as terminal tables."""
    console = console or Console()
    tables: list[tuple[Sequence[str], str, Iterable[Sequence[str]]]] = [
        (("figure", "value"), f"delivery audit: {summary['verdict']}", overall_rows(summary)),
        (GROUP_HEADER, "consumer groups", group_rows(summary))]
    if summary.get("shards"):
        tables.append((SHARD_HEADER, "shards", shard_rows(summary)))
    if summary.get("burst"):
        tables += [(("figure", "value"), "the burst", burst_rows(summary)),
                   (BURST_GROUP_HEADER, "the other topics during the burst",
                    burst_group_rows(summary))]
    if summary["failovers"]:
        tables += [(PER_FAULT_HEADER, "failovers by fault", per_fault_rows(summary)),
                   (FAILOVER_HEADER, "failovers", failover_rows(summary))]
    for header, title, rows in tables:
        table = Table(*header, title=title)
        for row in rows:
            table.add_row(*row)
        console.print(table)


def overall_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``(figure, value)`` rows for the overall table."""
    messages, duplicates = summary["messages"], summary["duplicates"]
    lateness = summary["lateness_ms"]
    return [
        ("scheduled / acked", f"{messages['scheduled']:,} / {messages['acked']:,}"),
        ("cancelled", f"{messages['cancelled']:,}"),
        ("deliveries owed / received (unique) / receipts",
         f"{messages['owed']:,} / {messages['received_unique']:,} / {messages['receipts']:,}"),
        ("lost", f"{summary['lost']['count']:,}"),
        ("duplicates (flagged / redelivery / unflagged)",
         f"{duplicates['total']:,} ({_classes(duplicates)})"),
        ("duplicates after an ack", f"{duplicates['after_ack']:,}"),
        ("flagged first receipts (false alarms; never sent before)",
         f"{summary['false_alarms']:,}; {summary['false_alarms_unsent']:,}"),
        ("rescheduled", f"{messages['rescheduled']:,}"),
        ("cancelled but delivered", f"{summary['cancelled_but_delivered']:,}"),
        ("delivered contrary to a reschedule", f"{summary['contrary_to_reschedule']:,}"),
        ("receipts delivered early", f"{summary['delivered_early']:,}"),
        ("lateness p50 / p99 / max (ms)",
         " / ".join(_value(lateness[key]) for key in ("p50", "p99", "max"))),
        ("failovers", f"{len(summary['failovers']):,}"),
    ]


def failover_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per failover, under `FAILOVER_HEADER`."""
    started_ms = summary["run"]["started_ms"]
    return [[str(number), f"{failover['old_leader']} -> {failover['new_leader']}",
             _value(failover["term"]), _fault_name(failover["fault"]),
             _seconds(failover["lost_at_ms"], started_ms), _value(failover["no_leader_ms"]),
             _value(failover["first_delivery_ms"]), _value(failover["delivery_gap_ms"]),
             _value(failover["catch_up_ms"]),
             _classes(failover["duplicates"]),
             f"{failover['false_alarms']:,} ({failover['false_alarms_unsent']:,})"]
            for number, failover in enumerate(summary["failovers"], start=1)]


def per_fault_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per fault kind blamed for a failover, under `PER_FAULT_HEADER`."""
    return [[kind, _value(figures["failovers"]), _spread(figures["no_leader_ms"]),
             _spread(figures["delivery_gap_ms"]), _value(figures["undelivered"])]
            for kind, figures in summary["per_fault"].items()]


def shard_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per shard, under `SHARD_HEADER` (none in a cluster of one shard)."""
    return [[number, *(_value(shard[name]) for name in ("owed", "received", "lost", "unflagged",
                                                        "delivered_early", "p99", "failovers")),
             _spread(shard["delivery_gap_ms"])]
            for number, shard in summary.get("shards", {}).items()]


def group_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per consumer group, under `GROUP_HEADER`; then one per idle topic."""
    rows = [[name, _value(group["owed"]), _value(group["received"]), _value(group["lost"]),
             _classes(group), _value(group["false_alarms"]), _value(group["p99"])]
            for name, group in summary["groups"].items()]
    return rows + [[f"{topic} (idle: nobody reads it)", f"{idle['acked']:,} acked",
                    _value(idle["received"]), "-", "-", "-", "-"]
                   for topic, idle in summary["idle"].items()]


def burst_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``(figure, value)`` rows of the burst's figures (`tickwheel.chaos.burst_audit`)."""
    burst, started_ms = summary["burst"], summary["run"]["started_ms"]
    faults = ", ".join(f"{_fault_name(fault)} at {_seconds(fault['started_ms'], started_ms)}"
                       for fault in burst["faults"])
    return [
        ("topic", burst["topic"]),
        ("messages asked / accepted", f"{burst['messages']:,} / {burst['acked']:,}"),
        ("deliveries owed / received / lost",
         " / ".join(_value(burst[key]) for key in ("owed", "received", "lost"))),
        ("scheduling began / due (s)",
         f"{_seconds(burst['at_ms'], started_ms)} / {_seconds(burst['due_ms'], started_ms)}"),
        ("scheduled in (ms)", _value(burst["scheduling_ms"])),
        ("drained in (ms: from its due time to its last first receipt)",
         _value(burst["drained_ms"])),
        ("other topics' messages due meanwhile", _value(burst["others_messages"])),
        ("their lateness p50 / p99 / max (ms)",
         " / ".join(_value(burst[f"others_{key}_ms"]) for key in ("p50", "p99", "max"))),
        ("of it, the leader's send alone: p99 / max (ms)",
         " / ".join(_value(burst[f"others_sent_{key}_ms"]) for key in ("p99", "max"))),
        *((f"of them, due {label}: messages; lateness p50 / p99 / max (ms)",
           f"{_value(part['messages'])}; {_spread(part)}")
          for label, part in zip(("in its own second", "after it"),
                                 burst["others_seconds"].values(), strict=True)),
        ("faults from its scheduling to its last receipt (s)", faults or "none"),
        ("failovers then", _value(burst["failovers"])),
    ]


def burst_group_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per other consumer group, under `BURST_GROUP_HEADER`."""
    return [[name, *(_value(group[key]) for key in ("messages", "p99", "max", "sent_p99"))]
            for name, group in summary["burst"]["others_groups"].items()]


def plot_lateness(summary: dict[str, Any], points: list[tuple[int, int]]) -> Figure:
    """Lateness of first receipts over the run, with failovers and fault windows marked."""
    run = summary["run"]
    figure = Figure(figsize=(11, 5), layout="constrained")
    axes = figure.add_subplot()
    received_s = [_run_s(received_ms, run) for received_ms, _ in points]
    axes.scatter(received_s, [lateness_ms for _, lateness_ms in points], s=2, alpha=0.5,
                 label="first receipt")
    axes.set_yscale("symlog", linthresh=1)
    axes.set_xlim(0, max([_run_s(run["ended_ms"], run), *received_s]))
    for fault in summary["faults"]:
        axes.axvspan(_run_s(fault["started_ms"], run),
                     _run_s(fault["ended_ms"] or run["ended_ms"], run), color="tab:gray",
                     alpha=0.15)
        axes.text(_run_s(fault["started_ms"], run), 0.98, _fault_name(fault),
                  transform=axes.get_xaxis_transform(), rotation=90, va="top", fontsize=7)
    for number, failover in enumerate(summary["failovers"]):
        axes.axvline(_run_s(failover["at_ms"], run), color="tab:red", linestyle="--",
                     linewidth=1, label="failover" if number == 0 else None)
    axes.set_xlabel("received (s since the run started)")
    axes.set_ylabel("lateness (ms, symlog)")
    axes.set_title(f"lateness of {len(points):,} first receipts; faults shaded")
    figure.legend(loc="outside right upper")
    return figure


def plot_duplicates(summary: dict[str, Any]) -> Figure:
    """Duplicate receipts per failover, stacked by class."""
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title("duplicates per failover (received from leadership lost to the next loss)")
    failovers = summary["failovers"]
    if not failovers:
        axes.set_axis_off()
        axes.text(0.5, 0.5, "no failovers", transform=axes.transAxes, ha="center")
        return figure
    labels = [f"{number}: {failover['old_leader']}->{failover['new_leader']}"
              for number, failover in enumerate(failovers, start=1)]
    bottoms = [0] * len(failovers)
    for name, colour in CLASS_COLOURS.items():
        heights = [failover["duplicates"][name] for failover in failovers]
        axes.bar(labels, heights, bottom=bottoms, color=colour, label=name)
        bottoms = [bottom + height for bottom, height in zip(bottoms, heights, strict=True)]
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("duplicate receipts")
    axes.legend()
    return figure


def _save(figure: Figure, path: Path) -> None:
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=110)


def _problems(summary: dict[str, Any]) -> list[tuple[str, int, list[str]]]:
    """Each problem class: its heading, its count and its example ids."""
    examples = summary["examples"]
    return [("Lost", summary["lost"]["count"], summary["lost"]["ids"]),
            ("Unflagged duplicates", summary["duplicates"]["unflagged"],
             examples["unflagged_duplicates"]),
            ("Cancelled but delivered", summary["cancelled_but_delivered"],
             examples["cancelled_but_delivered"]),
            ("Delivered contrary to a reschedule", summary["contrary_to_reschedule"],
             examples["contrary_to_reschedule"]),
            ("Receipts delivered early", summary["delivered_early"],
             examples["delivered_early"])]


def _races_markdown(summary: dict[str, Any]) -> str:
    races = summary["races"]
    rows = [[kind, outcome, f"{count:,}"] for kind in ("cancels", "reschedules")
            for outcome, count in sorted(races[kind].items())]
    answer = races["answer_ms"]
    table = _markdown_table(["call", "outcome", "messages"], rows) if rows else "None."
    return (f"{table}\n\nAnswer times p50 / p99 / max (ms): "
            + " / ".join(_value(answer[key]) for key in ("p50", "p99", "max")) + ".")


def _faults_markdown(summary: dict[str, Any]) -> str:
    started_ms = summary["run"]["started_ms"]
    rows = [[_fault_name(fault), _seconds(fault["started_ms"], started_ms),
             _seconds(fault["ended_ms"], started_ms), fault["detail"] or ""]
            for fault in summary["faults"]]
    return _markdown_table(["fault", "from (s)", "to (s)", "detail"], rows) if rows else "None."


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |"
                     for line in lines)


def _classes(counts: dict[str, int]) -> str:
    return " / ".join(f"{counts[name]:,}" for name in CLASS_COLOURS)


def _fault_name(fault: dict[str, Any] | None) -> str:
    if fault is None:
        return "-"
    return fault["fault"] if fault["node"] is None else f"{fault['fault']} {fault['node']}"


def _run_s(at_ms: int, run: dict[str, Any]) -> float:
    """Seconds since the run started, for a plot's x axis."""
    started_ms: int = run["started_ms"]
    return (at_ms - started_ms) / 1000


def _seconds(at_ms: int | None, started_ms: int) -> str:
    return "-" if at_ms is None else f"{(at_ms - started_ms) / 1000:.3f}"


def _spread(figures: dict[str, int | None]) -> str:
    return " / ".join(_value(figures[key]) for key in ("p50", "p99", "max"))


def _value(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"
