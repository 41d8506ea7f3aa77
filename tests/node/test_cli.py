"""The ``tickwheel`` command and the demo, run as a user runs them: separate processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.node.cli.commands import duration_ms
from tickwheel.node.security.access import Access
from tickwheel.node.security.dev_credentials import DevCredentials
from tickwheel.node.settings.config import NodeSettings, load

TICKWHEEL = [sys.executable, "-m", "tickwheel.node"]


def tickwheel(*args: str, timeout_s: float = 60, env: dict | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items()
             if not name.startswith("TICKWHEEL_")}
    return subprocess.run([*TICKWHEEL, *args], check=False, capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd,
                          env={**clean, "COLUMNS": "200", **(env or {})})


@pytest.mark.cluster
def test_schedule_consume_reschedule_cancel_and_status_against_a_cluster(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster") as cluster:
        target = ",".join(n.grpc_address for n in cluster.nodes)
        cluster.leader()
        anonymous = tickwheel("schedule", "--target", target, "--topic", "cli", "--in", "1d",
                              "--ca-file", str(cluster.security.ca_file))
        assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stdout

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return tickwheel(*args, env=cluster.security.environment())
        later = cli("schedule", "--target", target, "--topic", "cli", "--in", "1d",
                    "--body", "later", "--property", "k=v")
        assert later.returncode == 0, later.stdout + later.stderr
        handle = re.search(r"handle=(\d+)", later.stdout).group(1)
        lines = tmp_path / "bulk.jsonl"
        lines.write_text('{"id": "bulk-1", "body": "one"}\nplain two\n')
        bulk = cli("schedule", "--target", target, "--topic", "cli", "--in", "0s",
                   "--file", str(lines))
        assert "scheduled 2 messages" in bulk.stdout, bulk.stdout + bulk.stderr
        consumed = cli("consume", "--target", target, "--topic", "cli", "--count", "2")
        assert consumed.returncode == 0
        assert "id=bulk-1 attempt=1" in consumed.stdout and "b'plain two'" in consumed.stdout
        moved = cli("reschedule", "--target", target, "--in", "2d", handle)
        assert re.search(fr"{handle}: rescheduled deliver_at=\S+", moved.stdout), (
            moved.stdout + moved.stderr)
        cancelled = cli("cancel", "--target", target, handle, handle)
        assert f"{handle}: cancelled\n{handle}: already cancelled" in cancelled.stdout
        status = cli("status", "--target", target)
        assert status.returncode == 0
        assert status.stdout.count("follower") == 2 and "leader" in status.stdout
        bad = cli("schedule", "--target", target, "--topic", "no spaces", "--in", "1s")
        assert bad.returncode == 1 and "messages[0].topic" in bad.stdout


@pytest.mark.cluster
def test_serve_without_tls_refuses_and_says_how_then_certs_make_a_single_node_work(
        tmp_path: Path) -> None:
    """What a new user types: ``tickwheel serve`` alone is refused (plaintext to anyone is
    not a default) with the way out; ``tickwheel certs`` makes what it needs, and the node
    then runs as a single-node cluster in ./data, with the CLI talking TLS and a token."""
    bare = tickwheel("serve", cwd=tmp_path)
    assert bare.returncode == 2
    said = " ".join(bare.stdout.split())
    assert "--tls-cert-file" in said and "tickwheel certs DIR" in said
    assert "--insecure-grpc" in said
    made = tickwheel("certs", "security", cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    security = DevCredentials(tmp_path / "security")
    node = subprocess.Popen([*TICKWHEEL, "serve", *security.node_flags()], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def answered() -> bool:
            run = tickwheel("schedule", "--topic", "solo", "--in", "0s", "--body", "hi",
                            cwd=tmp_path, env=security.environment())
            return run.returncode == 0
        wait_for(answered, 30, "the default node to take a schedule", poll_s=0.5)
        consumed = tickwheel("consume", "--topic", "solo", "--count", "1", cwd=tmp_path,
                             env=security.environment())
        assert "body=b'hi'" in consumed.stdout
    finally:
        node.send_signal(signal.SIGTERM)
        output, _ = node.communicate(timeout=30)
    assert node.returncode == 0, output
    assert list((tmp_path / "data" / "ledger").glob("ledger-*.parquet"))
    assert "event=node_stopping" in output


def test_flags_override_the_environment_which_overrides_the_toml_file(
        tmp_path: Path, tls_env: pytest.MonkeyPatch) -> None:
    monkeypatch = tls_env
    config = tmp_path / "node.toml"
    secret = tmp_path / "raft.secret"
    secret.write_text("a-secret-for-settings-tests-only\n")
    config.write_text('raft_address = "10.0.0.1:7500"\n'
                      'members = ["10.0.0.1:7500=10.0.0.1:7400=10.0.0.1:7600",'
                      ' "10.0.0.2:7500=10.0.0.2:7400=10.0.0.2:7600"]\n'
                      f'raft_secret_file = "{secret}"\n'
                      'max_body_bytes = 1000\nvisibility_timeout_ms = 5000\n')
    monkeypatch.setenv("TICKWHEEL_MAX_BODY_BYTES", "2000")
    monkeypatch.setenv("TICKWHEEL_DATA", "/srv/tw")
    settings = load(config, {"visibility_timeout_ms": 7000})
    assert settings.max_body_bytes == 2000
    assert settings.visibility_timeout_ms == 7000
    assert str(settings.data) == "/srv/tw"
    assert settings.member_map()["10.0.0.2:7500"] == "10.0.0.2:7400"
    assert settings.listen() == "10.0.0.1:7400"
    assert settings.raft_secrets() == (b"a-secret-for-settings-tests-only",)
    monkeypatch.setenv("TICKWHEEL_MEMBERS", "10.0.0.9:7500=10.0.0.9:7400=10.0.0.9:7600")
    with pytest.raises(ValidationError, match="not among members"):
        load(config, {})


@pytest.mark.cluster
def test_bad_configuration_names_the_setting(tmp_path: Path) -> None:
    run = tickwheel("serve", "--max-body-bytes", "0", "--data", str(tmp_path))
    assert run.returncode == 2 and "max_body_bytes" in run.stdout
    run = tickwheel("serve", "--schedule-linger-ms", "-1", "--data", str(tmp_path))
    assert run.returncode == 2 and "schedule_linger_ms" in run.stdout


def test_durations() -> None:
    assert duration_ms("10s") == 10_000
    assert duration_ms("1h30m") == 5_400_000
    assert duration_ms("250ms") == 250
    with pytest.raises(Exception, match="not a duration"):
        duration_ms("10 parsecs")


@pytest.mark.cluster
def test_the_demo_kills_the_leader_and_every_message_still_arrives(tmp_path: Path) -> None:
    demo = subprocess.run([sys.executable, "-m", "tickwheel.harness.demo", "--messages", "30",
                           "--span-s", "3", "--data", str(tmp_path / "demo")],
                          check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "SIGKILL leader" in demo.stdout
    assert "every one of the 30 messages arrived" in demo.stdout
    assert "shard 1 leader:" in demo.stdout and "shard 1  from" in demo.stdout
    assert len(re.findall(r"demo-\d+ +late", demo.stdout)) >= 30


def test_a_request_limit_that_cannot_hold_one_message_is_refused(
        tls_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="max_request_bytes"):
        NodeSettings(max_request_bytes=1 << 20)  # below the 4 MiB body limit
    settings = NodeSettings(max_request_bytes=16 << 20, max_concurrent_rpcs=64,
                            max_principal_rpcs=16, max_principal_request_memory_bytes=32 << 20)
    admission = settings.admission_limits()
    assert (settings.limits().max_request_bytes, admission.max_request_bytes,
            admission.max_concurrent_rpcs, admission.max_principal_rpcs) == (
        16 << 20, 16 << 20, 64, 16)


def test_request_memory_that_cannot_hold_one_request_or_a_share_above_the_whole_is_refused(
        tls_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="max_principal_request_memory_bytes"):
        NodeSettings(max_principal_request_memory_bytes=4 << 20)  # below one 8 MiB request
    with pytest.raises(ValidationError, match="max_principal_request_memory_bytes"):
        NodeSettings(max_request_memory_bytes=32 << 20)  # below a principal's 64 MiB
    with pytest.raises(ValidationError, match="max_principal_rpcs"):
        NodeSettings(max_concurrent_rpcs=100, max_principal_rpcs=200)


@pytest.mark.cluster
def test_token_prints_access_file_lines_that_load(tmp_path: Path) -> None:
    """What ``tickwheel token`` tells the user to paste is a valid principal of that token."""
    made = tickwheel("token", "--name", "orders-service")
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    token = lines[lines.index("token (give it to the client; it is not stored anywhere):") + 1]
    pasted = "\n".join(line.strip() for line in
                       lines[lines.index("for the node's access file:") + 1:])
    access = Access.parse(pasted + '\n[[principal.grant]]\nactions = ["schedule"]\n'
                          'topics = ["orders"]\n')
    principal = access.by_token(token.strip())
    assert principal is not None and principal.name == "orders-service"


def test_a_body_limit_whose_message_would_not_fit_a_response_is_refused(
        tls_env: pytest.MonkeyPatch) -> None:
    """A message a node accepts must be deliverable: one response to a consumer holds it."""
    with pytest.raises(ValidationError, match="would not fit a response"):
        NodeSettings(max_body_bytes=63 << 20, max_request_bytes=64 << 20)
    assert NodeSettings(max_body_bytes=62 << 20, max_request_bytes=63 << 20).max_body_bytes == (
        62 << 20)


def test_a_sync_ledger_without_fsync_is_refused(tls_env: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """The ledger notes what fsync made durable: without fsync it would note nothing, and a
    simulated power cut would leave the node empty."""
    with pytest.raises(ValidationError, match=r"sync_ledger .* needs fsync"):
        NodeSettings(sync_ledger=tmp_path / "synced")
    settings = NodeSettings(sync_ledger=tmp_path / "synced", fsync=True)
    assert settings.replica_config().raft.sync_ledger == tmp_path / "synced"


def test_a_clock_skew_without_fault_injection_is_refused(tls_env: pytest.MonkeyPatch) -> None:
    """A node whose clock runs off on purpose is a test's: a production flag left in a
    manifest must not make a node deliver late (or its stamps wrong) unnoticed."""
    with pytest.raises(ValidationError, match=r"clock_skew_ms .* fault_injection"):
        NodeSettings(clock_skew_ms=2_000)
    assert NodeSettings(clock_skew_ms=2_000, fault_injection=True).clock_skew_ms == 2_000
