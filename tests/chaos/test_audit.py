"""The delivery audit on hand-made logs in which every figure is known.

The dirty run (times in ms after ``T0_MS``; the run lasts 100 s, grace 5 s, so messages due by
95,000 must have arrived; 5 ms early is allowed):

- ``ok-0`` .. ``ok-9`` arrive once, 10 .. 100 ms late.
- lost: ``lost-0`` .. ``lost-2``, ``boundary-0`` (due exactly at the cutoff) and
  ``not-pending-0`` (its cancel found nothing pending). Not lost: ``after-cutoff-0`` (due 1 ms
  after the cutoff), ``unknown-0`` (its schedule call failed), ``cancelled-0``,
  ``cancel-retried-0`` (its cancel was retried across a leader change and read
  ``already_cancelled``) and ``cancel-unknown-0`` (cancelled, or maybe).
- duplicates: ``dup-before-0`` (a redelivery after an ack, before any failover),
  ``dup-flagged-0`` (flagged, after an ack), ``dup-redelivery-0`` (attempt 2, never acked),
  ``dup-unflagged-0`` (the bug: received again, unflagged, at exactly the second failover's
  lost_at_ms), ``dup-triple-0`` (a redelivery then a flagged one, never acked in between).
- ``cbd-0`` arrives after its cancel returned; ``cbd-race-0`` just before; ``cbd-unknown-0``'s
  cancel outcome is unknown.
- ``early-0`` arrives 6 ms early; ``edge-0`` exactly 5 ms early (allowed).
- ``past-due-0`` was scheduled already due: judged from its ack (30 ms late);
  ``unacked-received-0`` from when it was sent (40 ms).
- failover 1: node0 -> node1 (term 2), node0 last seen at 20,000, last delivered at 29,990,
  no leader from 30,500 (node0 killed at 30,000), node1 seen at 32,000, first delivers at
  32,300. Failover 2: node1 -> node2 (term 4), node1 last seen at 60,000, last delivered at
  60,900, paused at 61,000, node2 seen at 63,000, first delivers at 63,500. node2's trail of an
  older generation holds a stale term 3, which must not count.

The groups run (``run.json`` names the groups: ``orders`` -> ``a``, ``b``; ``reminders`` -> the
default group; ``idle`` is read by nobody; one failover at 15,000):

- ``g-0`` .. ``g-3`` arrive in both groups; ``g-lost`` only in ``a`` (lost: ``b/g-lost``);
  ``g-false``'s only receipt in ``b`` is flagged (a false alarm, after the failover; only its
  own send is written down: unsent before); ``g-sent``'s too, but node0's trail shows it sent to
  ``b`` before (a false alarm, not unsent); ``r-0``'s
  receipt names no group (the default group's); ``idle-0`` is owed to nobody.
- Reschedules: ``mv-ok`` moved from 30,000 to 35,000 and arrives then; ``mv-early`` moved too but
  ``a`` got it at the old time (contrary to the answer); ``mv-lost`` moved to 50,000, never
  arrives (lost in both groups); ``mv-unknown``'s move to 96,000 has no answer (owed then: after
  the cutoff); ``mv-handed``'s answer was ``handed_out`` and it arrives at its old time.
- Raced cancels: ``race-cancel`` answered ``cancelled`` 10 ms before due and ``b`` received it
  after; ``race-handed``'s answered ``handed_out`` and both groups received it;
  ``race-handed-a``'s answered ``handed_out`` and only ``a`` ever received it (``b`` never
  will: not lost).

The lines of every file are written in reverse, so nothing may rely on file order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from sparktests import QUICK_JVM, spark_session

from tickwheel.chaos.audit import audit, lateness_points, verdict
from tickwheel.chaos.failovers import (
    Failover,
    Fault,
    LeaderChange,
    Leadership,
    find_failovers,
    first_delivery_ms,
    gaps_in_turn,
    per_fault,
    percentiles,
)
from tickwheel.chaos.run_logs import load_logs, read_run
from tickwheel.node.ledger.schema import SCHEMA, segment_name

T0_MS = 1_700_000_000_000
SENT_MS = 1_000
ACKED_MS = 1_010
pytestmark = pytest.mark.timeout(600)
"""The JVMs run in the background (`in_background`): beside other workers' nodes they wait
for the CPU, and the first test's setup starts four of them."""
TORN = b"PAR1 a segment its node was killed while writing"
"""An open segment's bytes (``.parquet.open``): never read."""


def t(ms: int) -> int:
    """``ms`` after the run started."""
    return T0_MS + ms


def scheduled(id_: str, due_ms: int, *, acked: bool = True, sent_ms: int = SENT_MS,
              acked_ms: int = ACKED_MS, topic: str = "orders") -> dict[str, Any]:
    return {"id": id_, "topic": topic, "deliver_at_ms": t(due_ms), "sent_ms": t(sent_ms),
            "acked": acked, "acked_ms": t(acked_ms) if acked else None,
            "handle": 1 if acked else None, "kind": "due"}


def receipt(id_: str, due_ms: int, received_ms: int, *, attempt: int = 1,
            possible_duplicate: bool = False, acked: bool = True, node: str = "node0",
            topic: str = "orders", group: str | None = None) -> dict[str, Any]:
    """A receipt; without ``group`` it has no such field, as the runner wrote before groups."""
    return {"id": id_, "topic": topic, "deliver_at_ms": t(due_ms),
            "delivered_at_ms": t(received_ms - 1), "received_ms": t(received_ms),
            "attempt": attempt, "possible_duplicate": possible_duplicate, "node": node,
            "consumer": "c0", "acked": acked} | ({} if group is None else {"group": group})


def cancel(id_: str, done_ms: int, outcome: str, **raced: Any) -> dict[str, Any]:
    return {"id": id_, "handle": 1, "sent_ms": t(done_ms - 5), "done_ms": t(done_ms),
            "outcome": outcome} | raced


def reschedule(id_: str, old_ms: int, new_ms: int, done_ms: int, outcome: str) -> dict[str, Any]:
    return {"id": id_, "handle": 1, "sent_ms": t(done_ms - 10), "done_ms": t(done_ms),
            "outcome": outcome, "deliver_at_ms": t(new_ms), "old_deliver_at_ms": t(old_ms),
            "batch": 1, "size": 1}


def ledger_sent(raft: str, term: int, due_ms: int, delivered_ms: int, id_: str = "x",
                **group: str) -> dict[str, Any]:
    return {"event": "sent", "node": raft, "node_ms": t(delivered_ms),
            "time_ms": t(delivered_ms), "term": term, "epoch": term, "id": id_,
            "topic": "orders", "handle": 1, "group": "", **group, "consumer": "c0", "lease": 1,
            "deliver_at_ms": t(due_ms), "slot_second": 0, "local_index": 0,
            "possible_duplicate": False, "attempt": 1}


def ledger_started(raft: str, term: int, takeover_ms: int) -> dict[str, Any]:
    return {"event": "dispatch_started", "node": raft, "node_ms": t(takeover_ms),
            "time_ms": t(takeover_ms), "term": term, "epoch": term, "slot_second": 0,
            "local_index": 0}


def ledger_committed(raft: str, event: str, at_ms: int, id_: str = "x") -> dict[str, Any]:
    """A row of the committed lifecycle (no term: every replica's, not a leader's own)."""
    return {"event": event, "node": raft, "node_ms": t(at_ms), "time_ms": t(at_ms), "id": id_,
            "topic": "orders", "handle": 1, "deliver_at_ms": t(at_ms)}


def write_segment(folder: Path, raft: str, sequence: int, rows: list[dict[str, Any]]) -> None:
    """A closed ledger segment of ``rows``, as node ``raft`` writes it (its schema, zstd)."""
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA),
                   folder / segment_name(raft, sequence), compression="zstd")


def raft_of(name: str) -> str:
    """The Raft address of node ``nodeK``."""
    return f"127.0.0.1:{41000 + int(name.removeprefix('node'))}"


def write_ledgers(out_dir: Path, ledgers: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Per ``ledger__node0_0`` keyword, node0's generation 0: a segment of its rows (bytes: an
    open segment beside it), laid out as the runner leaves them: the node's newest generation
    as ``ledger fetch`` writes it (``ledgers/shard-0/127.0.0.1_41000/``), an older one as the
    runner copies it before a wipe (``.../127.0.0.1_41000.generation-0/``). Returns
    ``run.json``'s ``nodes``."""
    generations: dict[str, list[int]] = {}
    for key in sorted(ledgers):
        name, generation = key.removeprefix("ledger__").split("_")
        generations.setdefault(name, []).append(int(generation))
    nodes = []
    for name, numbers in generations.items():
        raft = raft_of(name)
        fetched = "shard-0/" + raft.replace(":", "_")
        folders = [f"{fetched}.generation-{number}" for number in numbers[:-1]] + [fetched]
        for number, folder in zip(numbers, folders, strict=True):
            rows = ledgers[f"ledger__{name}_{number}"]
            write_segment(out_dir / "ledgers" / folder, raft, 1,
                          [row for row in rows if isinstance(row, dict)])
            for torn in (row for row in rows if isinstance(row, bytes)):
                (out_dir / "ledgers" / folder / (segment_name(raft, 2) + ".open")
                 ).write_bytes(torn)
        nodes.append({"name": name, "raft": raft, "grpc": "", "shard": 0, "ledgers": folders})
    return nodes


def write_run(out_dir: Path, ended_ms: int, *, drained_due_ms: int | None = None,
              groups: dict[str, Any] | None = None, **lines: list[Any]) -> Path:
    """A run directory: ``run.json`` (with ``groups``' items when given) and, per keyword, a
    ``.jsonl`` file with its lines reversed (strings are written verbatim), or for
    ``ledger__node0_0`` a node's ledger (`write_ledgers`)."""
    out_dir.mkdir(parents=True)
    drained = {} if drained_due_ms is None else {"drained_due_ms": t(drained_due_ms)}
    nodes = write_ledgers(out_dir, {name: rows for name, rows in lines.items()
                                    if name.startswith("ledger__")})
    (out_dir / "run.json").write_text(json.dumps({
        "started_ms": T0_MS, "ended_ms": t(ended_ms), "seed": 7, "nodes": nodes,
        "faults": ["kill", "pause"], "grace_ms": 5_000, "max_skew_ms": 0,
        "allowed_early_ms": 5} | drained | (groups or {})))
    for name, rows in lines.items():
        if name.startswith("ledger__"):
            continue
        path = out_dir / (name.replace("__", "/").replace("_", ".") + ".jsonl")
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n"
                                for row in reversed(rows)))
    return out_dir


def dirty_run(out_dir: Path) -> Path:
    plan = [scheduled(f"ok-{i}", 10_000 + 1_000 * i) for i in range(10)]
    plan += [scheduled("lost-0", 50_000, acked=False), *(
        scheduled(id_, 50_000) for id_ in ("lost-0", "lost-1", "lost-2", "cancelled-0",
                                           "cancel-retried-0", "cancel-unknown-0",
                                           "not-pending-0"))]
    plan += [scheduled("boundary-0", 95_000), scheduled("after-cutoff-0", 95_001),
             scheduled("unknown-0", 50_000, acked=False)]
    dues = {"dup-before-0": 12_000, "dup-flagged-0": 29_000, "dup-redelivery-0": 29_500,
            "dup-unflagged-0": 58_000, "dup-triple-0": 60_000, "cbd-0": 25_000,
            "cbd-race-0": 19_000, "cbd-unknown-0": 25_000, "early-0": 30_000, "edge-0": 30_100}
    plan += [scheduled(id_, due_ms) for id_, due_ms in dues.items()]
    plan += [scheduled("past-due-0", 5_000, sent_ms=8_000, acked_ms=8_050),
             scheduled("unacked-received-0", 8_000, acked=False, sent_ms=9_000)]
    got = [receipt(f"ok-{i}", 10_000 + 1_000 * i, 10_000 + 1_000 * i + 10 * (i + 1))
           for i in range(10)]
    got += [
        receipt("dup-before-0", 12_000, 12_020),
        receipt("dup-before-0", 12_000, 15_000, attempt=2),
        receipt("dup-flagged-0", 29_000, 29_030),
        receipt("dup-flagged-0", 29_000, 32_500, possible_duplicate=True, node="node1"),
        receipt("dup-redelivery-0", 29_500, 29_540, acked=False),
        receipt("dup-redelivery-0", 29_500, 40_000, attempt=2, node="node1"),
        receipt("dup-unflagged-0", 58_000, 58_050, node="node1"),
        receipt("dup-unflagged-0", 58_000, 61_000, node="node2"),
        receipt("dup-triple-0", 60_000, 60_060, acked=False, node="node1"),
        receipt("dup-triple-0", 60_000, 64_000, attempt=2, acked=False, node="node2"),
        receipt("dup-triple-0", 60_000, 65_000, attempt=3, possible_duplicate=True,
                node="node2"),
        receipt("cbd-0", 25_000, 25_025), receipt("cbd-race-0", 19_000, 19_990),
        receipt("cbd-unknown-0", 25_000, 25_070),
        receipt("early-0", 30_000, 29_994), receipt("edge-0", 30_100, 30_095),
        receipt("past-due-0", 5_000, 8_080), receipt("unacked-received-0", 8_000, 9_040)]
    cancels = [cancel("cancelled-0", 5_000, "cancelled"),
               cancel("cancel-retried-0", 5_000, "already_cancelled"),
               cancel("cancel-unknown-0", 5_000, "unknown"),
               cancel("not-pending-0", 5_000, "not_pending"),
               cancel("cbd-0", 20_000, "cancelled"), cancel("cbd-race-0", 20_000, "cancelled"),
               cancel("cbd-unknown-0", 20_000, "unknown")]
    leaders = [{"at_ms": t(at_ms), "leader": leader, "term": term} for at_ms, leader, term in (
        (0, "node0", 1), (20_000, "node0", 1), (30_500, None, 1), (32_000, "node1", 2),
        (60_000, "node1", 2), (63_000, "node2", 4), (70_000, None, 4), (71_000, "node2", 4))]
    faults = [{"fault": fault, "node": node, "started_ms": t(start_ms), "ended_ms": t(end_ms),
               "detail": ""} for fault, node, start_ms, end_ms in (
        ("kill", "node0", 30_000, 40_000), ("pause", "node1", 61_000, 66_000),
        ("partition", "node2", 80_000, 85_000))]
    node0, node1, node2 = "127.0.0.1:41001", "127.0.0.1:41002", "127.0.0.1:41003"
    return write_run(
        out_dir, 100_000, scheduled=plan, received=got, cancels=cancels, leaders=leaders,
        faults=[*faults, '{"fault": "ki'],
        ledger__node0_0=[ledger_committed(node0, "scheduled", 50),
                         ledger_started(node0, 1, 100),
                         ledger_sent(node0, 1, 10_000, 10_005),
                         ledger_sent(node0, 1, 29_990, 29_990)],
        ledger__node1_0=[ledger_started(node1, 2, 32_100),
                         ledger_sent(node1, 2, 29_000, 32_300),
                         ledger_sent(node1, 2, 32_000, 32_350),
                         ledger_sent(node1, 2, 32_350, 32_400),
                         ledger_sent(node1, 2, 60_900, 60_900)],
        ledger__node2_0=[ledger_started(node2, 3, 45_000),
                         ledger_sent(node2, 3, 45_000, 45_010)],
        ledger__node2_1=[TORN, ledger_started(node2, 4, 63_200),
                         ledger_sent(node2, 4, 62_000, 63_500),
                         ledger_sent(node2, 4, 63_600, 63_700)])


def clean_run(out_dir: Path) -> Path:
    """100 messages 1 .. 100 ms late, one failover (no fault, no trails), a flagged
    duplicate, a redelivery, a flagged copy that overtook its plain original, an unacked
    message never received; no cancels file, and an
    empty faults file."""
    plan = [scheduled(f"m-{i}", 1_000 * (i + 1)) for i in range(100)]
    got = [receipt(f"m-{i}", 1_000 * (i + 1), 1_000 * (i + 1) + i + 1) for i in range(100)]
    got += [receipt("m-60", 61_000, 70_000, possible_duplicate=True),
            receipt("m-70", 71_000, 75_000, attempt=2),
            # Overtaken: the flagged re-send is handled before the plain first copy, which
            # sat in a slow consumer's buffer. Still one plain receipt: no bug.
            receipt("m-80", 81_000, 81_060, possible_duplicate=True)]
    leaders = [{"at_ms": t(0), "leader": "node0", "term": 1},
               {"at_ms": t(50_000), "leader": "node1", "term": 2}]
    return write_run(out_dir, 200_000, scheduled=[*plan, scheduled("gone", 9_000, acked=False)],
                     received=got, leaders=leaders, faults=[])


def groups_run(out_dir: Path) -> Path:
    plan = [scheduled(f"g-{i}", 10_000 + 1_000 * i) for i in range(4)]
    plan += [scheduled(id_, due_ms) for id_, due_ms in (
        ("g-lost", 20_000), ("g-false", 21_000), ("g-sent", 21_500), ("mv-ok", 30_000),
        ("mv-early", 30_000),
        ("mv-lost", 30_000), ("mv-unknown", 30_000), ("mv-handed", 30_000),
        ("race-cancel", 40_000), ("race-handed", 40_000), ("race-handed-a", 40_000))]
    plan += [scheduled("r-0", 22_000, topic="reminders"), scheduled("idle-0", 23_000, topic="idle")]
    both = [("g-0", 10_000), ("g-1", 11_000), ("g-2", 12_000), ("g-3", 13_000),
            ("mv-handed", 30_000), ("race-handed", 40_000)]
    got = [receipt(id_, due_ms, due_ms + lateness, group=group)
           for id_, due_ms in both for group, lateness in (("a", 10), ("b", 20))]
    got += [receipt("g-lost", 20_000, 20_010, group="a"),
            receipt("g-false", 21_000, 21_010, group="a"),
            receipt("g-false", 21_000, 21_030, group="b", possible_duplicate=True),
            receipt("g-sent", 21_500, 21_510, group="a"),
            receipt("g-sent", 21_500, 21_540, group="b", possible_duplicate=True),
            receipt("r-0", 22_000, 22_015, topic="reminders"),
            receipt("mv-ok", 35_000, 35_010, group="a"),
            receipt("mv-ok", 35_000, 35_020, group="b"),
            receipt("mv-early", 30_000, 30_005, group="a"),
            receipt("mv-early", 35_000, 35_005, group="b"),
            receipt("race-cancel", 40_000, 40_005, group="b"),
            receipt("race-handed-a", 40_000, 40_010, group="a")]
    reschedules = [reschedule("mv-ok", 30_000, 35_000, 29_990, "rescheduled"),
                   reschedule("mv-early", 30_000, 35_000, 29_990, "rescheduled"),
                   reschedule("mv-lost", 30_000, 50_000, 29_990, "rescheduled"),
                   reschedule("mv-unknown", 30_000, 96_000, 29_990, "unknown"),
                   reschedule("mv-handed", 30_000, 35_000, 29_990, "handed_out")]
    cancels = [cancel("race-cancel", 39_990, "cancelled", deliver_at_ms=t(40_000), raced=True),
               cancel("race-handed", 39_990, "handed_out", deliver_at_ms=t(40_000), raced=True),
               cancel("race-handed-a", 39_990, "handed_out", deliver_at_ms=t(40_000),
                      raced=True)]
    leaders = [{"at_ms": t(0), "leader": "node0", "term": 1},
               {"at_ms": t(15_000), "leader": "node1", "term": 2}]
    return write_run(out_dir, 100_000, groups={
        "groups": {"orders": ["a", "b"], "reminders": [""]}, "idle_topics": ["idle"]},
        scheduled=plan, received=got, cancels=cancels, reschedules=reschedules,
        leaders=leaders, faults=[],
        ledger__node0_0=[ledger_sent("n0", 1, 21_500, 21_500, "g-sent", group="b")],
        ledger__node1_0=[ledger_sent("n1", 2, 21_500, 21_530, "g-sent", group="b"),
                         ledger_sent("n1", 2, 21_000, 21_025, "g-false", group="b")])


@pytest.fixture(scope="module")
def spark(in_background: Callable[..., Any]) -> Iterator[SparkSession]:
    yield from spark_session(in_background)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audit")
    return {"dirty": dirty_run(root / "dirty"), "clean": clean_run(root / "clean"),
            "groups": groups_run(root / "groups")}


@pytest.fixture(scope="module")
def commands(dirs: dict[str, Path], in_background: Callable[..., Any]
             ) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """The command on every run, started at once so that their JVMs start while the in-process
    tests run; in the background, as the in-process JVM."""
    env = {**os.environ, QUICK_JVM[0]: QUICK_JVM[1]}
    runs = {name: in_background(
        subprocess.Popen, [sys.executable, "-m", "tickwheel.chaos.audit", str(path), "--json"],
        env=env, cwd=path.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, path in dirs.items()}
    yield runs
    for run in runs.values():
        run.kill()
        run.communicate()


@pytest.fixture(scope="module")
def finished(commands: dict[str, subprocess.Popen[str]]) -> dict[str, tuple[int, str, str]]:
    """Each command's exit code, stdout and stderr."""
    outputs = {name: run.communicate(timeout=180) for name, run in commands.items()}
    return {name: (commands[name].returncode, *outputs[name]) for name in commands}


@pytest.fixture(scope="module")
def dirty(commands: object, spark: SparkSession, dirs: dict[str, Path]) -> dict[str, Any]:
    return audit(spark, dirs["dirty"])


@pytest.mark.cluster
def test_message_counts_and_losses(dirty: dict[str, Any]) -> None:
    assert dirty["verdict"] == "dirty"
    assert dirty["messages"] == {"scheduled": 32, "acked": 30, "cancelled": 4, "rescheduled": 0,
                                 "owed": 30, "received_unique": 22, "receipts": 28}
    assert dirty["lost"] == {"count": 5, "ids": ["boundary-0", "lost-0", "lost-1", "lost-2",
                                                 "not-pending-0"]}


@pytest.mark.cluster
def test_duplicates_cancels_and_early_receipts(dirty: dict[str, Any]) -> None:
    assert dirty["duplicates"] == {"total": 6, "flagged": 2, "redelivery": 3, "unflagged": 1,
                                   "after_ack": 3}
    assert (dirty["cancelled_but_delivered"], dirty["delivered_early"]) == (1, 1)
    assert dirty["examples"] == {"unflagged_duplicates": ["dup-unflagged-0"],
                                 "cancelled_but_delivered": ["cbd-0"],
                                 "contrary_to_reschedule": [], "delivered_early": ["early-0"]}
    assert dirty["false_alarms"] == 0


@pytest.mark.cluster
def test_lateness_is_judged_from_acceptance(spark: SparkSession, dirs: dict[str, Path],
                                            dirty: dict[str, Any]) -> None:
    # First receipts, sorted: -6 -5 10 20 20 25 30 30 30 40 40 40 50 50 60 60 70 70 80 90 100 990.
    assert dirty["lateness_ms"] == {"p50": 40, "p99": 990, "max": 990}
    points = lateness_points(load_logs(spark, dirs["dirty"], read_run(dirs["dirty"])))
    assert len(points) == 22
    assert (t(8_080), 30) in points  # past-due-0, from its ack at 8,050
    assert (t(9_040), 40) in points  # unacked-received-0, from when it was sent
    assert points == sorted(points)


@pytest.mark.cluster
def test_failover_figures(dirty: dict[str, Any]) -> None:
    first, second = dirty["failovers"]
    assert first == {
        "shard": 0, "old_leader": "node0", "new_leader": "node1", "term": 2, "at_ms": t(32_000),
        "lost_at_ms": t(30_500), "no_leader_ms": 1_500, "first_delivery_ms": 1_800,
        "delivery_gap_ms": 2_310, "catch_up_ms": 300, "fault": {"fault": "kill", "node": "node0"},
        "duplicates": {"total": 2, "flagged": 1, "redelivery": 1, "unflagged": 0},
        "false_alarms": 0, "false_alarms_unsent": 0}
    assert second == {
        "shard": 0, "old_leader": "node1", "new_leader": "node2", "term": 4, "at_ms": t(63_000),
        "lost_at_ms": t(61_000), "no_leader_ms": 2_000, "first_delivery_ms": 2_500,
        "delivery_gap_ms": 2_600, "catch_up_ms": 500, "fault": {"fault": "pause", "node": "node1"},
        "duplicates": {"total": 3, "flagged": 1, "redelivery": 1, "unflagged": 1},
        "false_alarms": 0, "false_alarms_unsent": 0}
    assert [fault["fault"] for fault in dirty["faults"]] == ["kill", "pause", "partition"]
    assert dirty["shards"] == {}  # a run of one shard reports none
    assert dirty["per_fault"] == {
        "kill": {"failovers": 1, "undelivered": 0,
                 "no_leader_ms": {"p50": 1_500, "p99": 1_500, "max": 1_500},
                 "delivery_gap_ms": {"p50": 2_310, "p99": 2_310, "max": 2_310}},
        "pause": {"failovers": 1, "undelivered": 0,
                  "no_leader_ms": {"p50": 2_000, "p99": 2_000, "max": 2_000},
                  "delivery_gap_ms": {"p50": 2_600, "p99": 2_600, "max": 2_600}}}


@pytest.mark.cluster
def test_overrides_of_grace_and_allowed_earliness(spark: SparkSession,
                                                  dirs: dict[str, Path]) -> None:
    summary = audit(spark, dirs["dirty"], grace_ms=0, allowed_early_ms=6)
    assert summary["run"]["grace_ms"] == 0
    assert summary["lost"]["count"] == 6  # after-cutoff-0 is due before the end
    assert summary["delivered_early"] == 0


@pytest.mark.cluster
def test_only_what_the_drain_waited_for_can_be_lost(spark: SparkSession,
                                                   tmp_path: Path) -> None:
    # The runner drains until every message due by the end of production (here 90 s) has
    # arrived; a long drain ends the run late (100 s), and a message due between the two may
    # still sit, delivered, in a slow consumer's queue. A 10-minute run flagged 25 such.
    out = write_run(tmp_path / "drained", 100_000, drained_due_ms=90_000,
                    scheduled=[scheduled("waited-0", 90_000), scheduled("in-flight-0", 90_001)])
    assert audit(spark, out)["lost"] == {"count": 1, "ids": ["waited-0"]}


@pytest.mark.cluster
def test_the_command_exits_by_verdict_and_writes_the_report(
        finished: dict[str, tuple[int, str, str]], dirs: dict[str, Path]) -> None:
    for name, expected_code in (("dirty", 1), ("clean", 0)):
        code, stdout, stderr = finished[name]
        assert code == expected_code, stderr
        assert json.loads(stdout)["verdict"] == name
        for file in ("summary.json", "report.md", "lateness.png", "duplicates.png"):
            assert (dirs[name] / "audit" / file).stat().st_size > 0, file
    report = (dirs["dirty"] / "audit" / "report.md").read_text()
    assert "# Delivery audit: DIRTY" in report
    assert "| pause | 1 | 2,000 / 2,000 / 2,000 | 2,600 / 2,600 / 2,600 | 0 |" in report
    assert "`not-pending-0`" in report
    assert "`dup-unflagged-0`" in report


@pytest.mark.cluster
def test_a_clean_run(finished: dict[str, tuple[int, str, str]]) -> None:
    summary = json.loads(finished["clean"][1])
    assert summary["lateness_ms"] == {"p50": 50, "p99": 99, "max": 100}
    assert summary["messages"] == {"scheduled": 101, "acked": 100, "cancelled": 0,
                                   "rescheduled": 0, "owed": 100, "received_unique": 100,
                                   "receipts": 103}
    assert summary["groups"] == {"orders/": {
        "owed": 100, "received": 100, "lost": 0, "flagged": 2, "redelivery": 1, "unflagged": 0,
        "false_alarms": 0, "p99": 99}}
    assert (summary["idle"], summary["races"]["cancels"]) == ({}, {})
    (failover,) = summary["failovers"]
    assert (failover["lost_at_ms"], failover["no_leader_ms"]) == (t(50_000), 0)
    assert (failover["first_delivery_ms"], failover["delivery_gap_ms"],
            failover["catch_up_ms"], failover["fault"]) == (None, None, None, None)
    assert summary["per_fault"] == {"none": {
        "failovers": 1, "undelivered": 1,
        "no_leader_ms": {"p50": 0, "p99": 0, "max": 0},
        "delivery_gap_ms": {"p50": None, "p99": None, "max": None}}}
    assert failover["duplicates"] == {"total": 3, "flagged": 2, "redelivery": 1, "unflagged": 0}


@pytest.mark.cluster
def test_groups_reschedules_and_races(finished: dict[str, tuple[int, str, str]]) -> None:
    code, stdout, stderr = finished["groups"]
    summary = json.loads(stdout)
    assert (code, summary["verdict"]) == (1, "dirty"), stderr
    # 15 orders messages in two groups, one reminder in the default group; idle-0 owed to none.
    assert summary["messages"] == {"scheduled": 17, "acked": 17, "cancelled": 1,
                                   "rescheduled": 3, "owed": 31, "received_unique": 24,
                                   "receipts": 24}
    assert summary["lost"] == {"count": 3, "ids": ["a/mv-lost", "b/g-lost", "b/mv-lost"]}
    assert summary["groups"] == {
        "orders/a": {"owed": 15, "received": 12, "lost": 1, "flagged": 0, "redelivery": 0,
                     "unflagged": 0, "false_alarms": 0, "p99": 10},
        "orders/b": {"owed": 15, "received": 11, "lost": 2, "flagged": 0, "redelivery": 0,
                     "unflagged": 0, "false_alarms": 2, "p99": 40},
        "reminders/": {"owed": 1, "received": 1, "lost": 0, "flagged": 0, "redelivery": 0,
                       "unflagged": 0, "false_alarms": 0, "p99": 15}}
    assert summary["idle"] == {"idle": {"acked": 1, "received": 0}}
    assert summary["duplicates"]["total"] == 0
    assert (summary["false_alarms"], summary["false_alarms_unsent"]) == (2, 1)
    (failover,) = summary["failovers"]
    assert (failover["false_alarms"], failover["false_alarms_unsent"]) == (2, 1)
    assert (summary["cancelled_but_delivered"], summary["contrary_to_reschedule"]) == (1, 1)
    assert summary["examples"]["cancelled_but_delivered"] == ["race-cancel"]
    assert summary["examples"]["contrary_to_reschedule"] == ["mv-early"]
    assert summary["delivered_early"] == 0
    assert summary["races"] == {
        "cancels": {"cancelled": 1, "handed_out": 2},
        "reschedules": {"rescheduled": 3, "unknown": 1, "handed_out": 1},
        "answer_ms": {"p50": 10, "p99": 10, "max": 10}}


@pytest.mark.parametrize("broken", ["lost", "unflagged", "delivered_early",
                                    "cancelled_but_delivered", "contrary_to_reschedule"])
def test_every_broken_promise_makes_the_verdict_dirty(broken: str) -> None:
    def summary(**counts: int) -> dict[str, Any]:
        figures = dict.fromkeys(("lost", "unflagged", "delivered_early",
                                 "cancelled_but_delivered", "contrary_to_reschedule"), 0)
        figures |= counts
        return {"lost": {"count": figures["lost"], "ids": []},
                "duplicates": {"unflagged": figures["unflagged"], "flagged": 9},
                "false_alarms": 9, **{key: figures[key] for key in (
                    "delivered_early", "cancelled_but_delivered", "contrary_to_reschedule")}}

    assert verdict(summary()) == "clean"
    assert verdict(summary(**{broken: 1})) == "dirty"


def test_failovers_follow_the_named_leader() -> None:
    def change(at_ms: int, leader: str | None, term: int) -> LeaderChange:
        return LeaderChange(at_ms, leader, term)

    changes = [change(0, None, 0), change(100, "a", 1), change(200, "a", 2),
               change(300, "b", 3), change(400, None, 0), change(450, "b", 3),
               change(500, None, 0), change(550, "b", 5), change(600, "a", 6)]
    late = Fault("skew", None, 650, None, "+200 ms")
    failovers = find_failovers(changes, [late])
    # a -> a is no failover, nor b -> none -> b in the same term (the runner lost sight of
    # it); b -> none -> b in a later term is (every node restarted, b won again). No fault
    # before 300 -> at_ms; after a none, the none.
    assert [(f.old_leader, f.new_leader, f.old_term, f.term, f.lost_at_ms, f.fault)
            for f in failovers] == [("a", "b", 1, 3, 300, None), ("b", "b", 3, 5, 500, None),
                                    ("b", "a", 5, 6, 600, None)]


def test_each_shards_failovers_follow_its_own_leader_and_faults() -> None:
    """Two shards' leaders, interleaved in one log: a failover is a change of one shard's
    leader, blamed on a fault of that shard (the other shard's leader is no successor)."""
    changes = [LeaderChange(100, "a", 1, 0), LeaderChange(150, "c", 1, 1),
               LeaderChange(500, "b", 2, 0), LeaderChange(520, None, 0, 1),
               LeaderChange(600, "d", 2, 1)]
    kill_a, kill_c = Fault("kill", "a", 450, 460, "", 0), Fault("kill", "c", 510, 515, "", 1)
    failovers = find_failovers(changes, [kill_c, kill_a])
    assert [(f.shard, f.old_leader, f.new_leader, f.lost_at_ms, f.fault)
            for f in failovers] == [(0, "a", "b", 450, kill_a), (1, "c", "d", 520, kill_c)]


def test_the_gap_runs_from_the_old_leaders_last_delivery_in_the_ended_leadership() -> None:
    def led(node: str, term: int, first_ms: int | None, last_ms: int | None) -> Leadership:
        return Leadership(node, term, first_ms, first_ms, first_ms, last_ms)

    # a led in terms 1 and 3 (b between), then c from term 5; a was restarted in term 2.
    to_c = Failover("a", "c", 5, 10_000, 9_000, None, old_term=3)
    terms = [led("a", 1, 100, 4_000), led("b", 2, 4_500, 6_000), led("a", 3, 6_500, 8_800),
             led("c", 5, 10_200, 12_000), led("a", 7, 13_000, 14_000)]
    assert (first_delivery_ms(to_c, terms), gaps_in_turn([to_c], terms)[0][0]) == (1_200, 1_400)
    # a delivered nothing in its leadership: from the loss, as first_delivery_ms.
    quiet = [terms[0], terms[1], led("a", 3, None, None), terms[3]]
    assert gaps_in_turn([to_c], quiet)[0][0] == 1_200
    # the new leader never delivered
    assert gaps_in_turn([to_c], terms[:3])[0][0] is None


def test_a_leader_deposed_before_it_delivered_hands_its_gap_to_the_next_leader() -> None:
    """A chaos run: a paused a; b won term 2, read a damaged record and was deposed 2 s
    later having delivered nothing; c won term 3 and delivered. The audit counted b's first
    delivery in a later leadership of its own (12.9 s) as the end of the first gap, and c's
    gap from b's loss (8 ms): consumers had nothing from a's last delivery to c's first."""
    def led(node: str, term: int, first_ms: int | None, last_ms: int | None) -> Leadership:
        return Leadership(node, term, first_ms, first_ms, first_ms, last_ms)

    to_b = Failover("a", "b", 2, 10_300, 10_000, None, old_term=1)
    to_c = Failover("b", "c", 3, 12_300, 12_290, None, old_term=2)
    to_b_again = Failover("c", "b", 4, 22_000, 21_500, None, old_term=3)
    terms = [led("a", 1, 100, 9_900), led("b", 2, None, None), led("c", 3, 12_300, 21_400),
             led("b", 4, 22_100, 30_000)]
    assert gaps_in_turn([to_b, to_c, to_b_again], terms) == [
        (None, 3), (12_300 - 9_900, 4), (22_100 - 21_400, None)]
    assert first_delivery_ms(to_b, terms, until_term=3) is None


def test_failovers_are_summed_up_by_fault() -> None:
    def figures(fault: str | None, no_leader_ms: int, gap_ms: int | None) -> dict[str, Any]:
        return {"fault": None if fault is None else {"fault": fault, "node": "n"},
                "no_leader_ms": no_leader_ms, "delivery_gap_ms": gap_ms}

    kills = [figures("kill", 400 + i, 500 + 10 * i) for i in range(100)]
    summary = per_fault([*kills, figures("pause", 900, 2_200), figures("pause", 800, None),
                         figures(None, 0, 300)])
    assert list(summary) == ["kill", "none", "pause"]
    assert summary["kill"] == {"failovers": 100, "undelivered": 0,
                               "no_leader_ms": {"p50": 449, "p99": 498, "max": 499},
                               "delivery_gap_ms": {"p50": 990, "p99": 1_480, "max": 1_490}}
    assert summary["pause"] == {"failovers": 2, "undelivered": 1,
                                "no_leader_ms": {"p50": 800, "p99": 900, "max": 900},
                                "delivery_gap_ms": {"p50": 2_200, "p99": 2_200, "max": 2_200}}
    assert summary["none"]["delivery_gap_ms"] == {"p50": 300, "p99": 300, "max": 300}
    assert per_fault([]) == {}
    assert percentiles([]) == {"p50": None, "p99": None, "max": None}
