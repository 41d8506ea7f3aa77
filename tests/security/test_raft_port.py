"""The Raft port, attacked from the network: real 3-node clusters of ``tickwheel serve``
processes started as users start them (`LocalCluster`, which gives them a random secret).

Each attack is the one measured against the first release (issue 17): a pickled payload made a
node run a shell command, ``status`` answered anyone, two spoofed PreVote frames stopped a
node, and a 2 GiB frame announcement grew the leader by hundreds of MB. The frames below are
in the first release's wire format (pysyncobj's: a native-endian length, zlib'd pickle).
"""

from __future__ import annotations

import hmac
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from hashlib import sha256
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tickwheel.harness.acking_consumer import AckingConsumer
from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.harness.ports import free_ports
from tickwheel.node.security import dev_credentials
from tickwheel.replication.raft import link_protocol as protocol
from tickwheel.v1 import tickwheel_pb2 as pb

pytestmark = pytest.mark.cluster

RAFT_TIMEOUT_S = 20.0


def pysyncobj_frame(message: object) -> bytes:
    data = zlib.compress(pickle.dumps(message, protocol=2), 3)
    return struct.pack("i", len(data)) + data


class RunsAShellCommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def closed_without_an_answer(sock: socket.socket) -> bool:
    """True once the node closes the connection; False if it sent anything first."""
    sock.settimeout(RAFT_TIMEOUT_S)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("raft-port")) as started:
        started.leader(timeout_s=30)
        yield started


def test_a_pickled_payload_runs_nothing(cluster: LocalCluster, tmp_path: Path) -> None:
    target = cluster.leader()
    marker = tmp_path / "ran"
    with socket.create_connection(host_port(target.raft)) as sock:
        sock.sendall(pysyncobj_frame(RunsAShellCommand(marker)))
        assert closed_without_an_answer(sock)
    assert not marker.exists()
    assert target.alive()


def test_status_tells_a_stranger_nothing(cluster: LocalCluster) -> None:
    target = cluster.leader()
    with socket.create_connection(host_port(target.raft)) as sock:
        sock.sendall(pysyncobj_frame(["status"]))
        assert closed_without_an_answer(sock)
    assert target.alive()


def test_spoofed_pre_vote_frames_neither_stop_a_node_nor_move_the_leader(
        cluster: LocalCluster) -> None:
    leader = cluster.leader()
    term = leader.info().term
    target = next(node for node in cluster.nodes if node is not leader)
    with socket.create_connection(host_port(target.raft)) as sock:
        sock.sendall(pysyncobj_frame(leader.raft)
                     + pysyncobj_frame({"type": "tickwheel_pre_vote"})
                     + pysyncobj_frame({"type": "tickwheel_pre_vote_reply"}))
        assert closed_without_an_answer(sock)
    assert target.alive()
    assert cluster.leader() is leader
    assert leader.info().term == term


def test_a_member_s_malformed_pre_vote_is_dropped_not_fatal(cluster: LocalCluster) -> None:
    """Even with the secret, a malformed PreVote (the crash of the first release) is dropped
    and logged; the node keeps running."""
    leader = cluster.leader()
    target, claimed = (node for node in cluster.nodes if node is not leader)
    secret = (cluster.root / "raft.secret").read_bytes().strip()
    with authenticated_link(target.raft, secret) as link:
        link.send(claimed.raft)
        link.send({"type": "tickwheel_pre_vote"})
        link.send({"type": "tickwheel_pre_vote", "round": "1", "term": 10**6,
                   "last_log_index": None, "last_log_term": 0})
        link.send({"type": "tickwheel_pre_vote_reply", "round": 1})
        wait_for(lambda: target.log_path.read_text().count("event=raft_message_malformed") >= 3,
                 RAFT_TIMEOUT_S, "three malformed-message log lines")
    assert target.alive()
    assert cluster.leader(timeout_s=RAFT_TIMEOUT_S).alive()


def test_a_2_gib_frame_announcement_costs_under_10_mb_and_is_dropped(
        cluster: LocalCluster) -> None:
    leader = cluster.leader()
    before = rss_bytes(leader.pid)
    sent = 0
    with socket.create_connection(host_port(leader.raft)) as sock:
        sock.sendall(struct.pack("i", 2**31 - 1))
        chunk = b"\0" * (1 << 20)
        try:
            for _ in range(64):
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_without_an_answer(sock)
    grown = rss_bytes(leader.pid) - before
    assert grown < 10 << 20, f"RSS grew by {grown / 2**20:.1f} MB after {sent} bytes"
    assert sent < 64 << 20, "the node read 64 MiB of an unauthenticated frame"
    assert leader.alive()


def test_raft_listens_on_exactly_the_configured_address(cluster: LocalCluster) -> None:
    _, port = host_port(cluster.nodes[0].raft)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()


def test_the_secret_is_in_a_private_file_never_on_a_command_line(cluster: LocalCluster) -> None:
    secret_file = cluster.root / "raft.secret"
    assert secret_file.stat().st_mode & 0o077 == 0
    secret = secret_file.read_bytes().strip()
    assert len(secret) >= 32
    for node in cluster.nodes:
        assert secret not in Path(f"/proc/{node.pid}/cmdline").read_bytes()


def test_a_node_with_another_secret_cannot_join(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    first, second, stranger = cluster.nodes
    try:
        cluster.start(first)
        cluster.start(second)
        members = cluster.raft_args
        other = tmp_path / "other.secret"
        other.write_text("a-completely-different-secret-0123456789")
        cluster.raft_args = ("--raft-secret-file", str(other))
        cluster.start(stranger)
        leader = cluster.leader(timeout_s=30, among=[first, second])
        wait_for(lambda: any("event=raft_link_refused" in node.log_path.read_text()
                             for node in cluster.nodes), RAFT_TIMEOUT_S, "a refused link")
        info = stranger.info()
        assert info is not None and info.leader_grpc == ""
        scheduled = leader.stub.Schedule(pb.ScheduleRequest(messages=[pb.Message(
            id="m", topic="t", body=b"x", deliver_at_ms=int(time.time() * 1000))]), timeout=10)
        assert len(scheduled.results) == 1
        cluster.stop(stranger)
        cluster.raft_args = members
        cluster.start(stranger)
        wait_for(lambda: (stranger.info() or pb.ClusterInfoResponse()).leader_grpc
                 == leader.grpc_address, RAFT_TIMEOUT_S, "the node to join with the secret")
    finally:
        cluster.stop_all()


def test_the_secret_rotates_node_by_node_while_messages_flow_and_none_is_lost(
        tmp_path: Path) -> None:
    """docs/security.md's three rolling steps: OLD NEW, then NEW OLD, then NEW."""
    received: set[str] = set()
    scheduled: list[str] = []
    with (LocalCluster(tmp_path) as cluster,
          AckingConsumer(cluster, "rotation", on_message=lambda m: received.add(m.id))):
        old = (cluster.root / "raft.secret").read_text().strip()
        new = "the-new-secret-" + os.urandom(16).hex()
        for step, secrets in enumerate((f"{old} {new}", f"{new} {old}", new)):
            secret_file = tmp_path / f"step{step}.secret"
            secret_file.write_text(secrets)
            cluster.raft_args = ("--raft-secret-file", str(secret_file))
            for node in cluster.nodes:
                ids = [f"step{step}-{node.grpc_address}-{i}" for i in range(20)]
                now_ms = int(time.time() * 1000)
                cluster.schedule([pb.Message(id=i, topic="rotation", body=b"x",
                                             deliver_at_ms=now_ms + 500) for i in ids])
                scheduled.extend(ids)
                cluster.stop(node)
                cluster.start(node)
                cluster.leader(timeout_s=30)  # every running node follows one leader
                wait_for(lambda node=node: (node.info() or pb.ClusterInfoResponse())
                         .last_applied >= cluster.leader().info().commit_index,
                         RAFT_TIMEOUT_S, f"{node.raft} to catch up")
        wait_for(lambda: received >= set(scheduled), 60, "every message of the rotation")
        assert "--insecure-raft" not in cluster.raft_args


def serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None
          ) -> subprocess.Popen[str]:
    raft, grpc_port, peer, other_raft, other_grpc, other_peer = free_ports(6)
    members = [f"127.0.0.1:{raft}=127.0.0.1:{grpc_port}=127.0.0.1:{peer}",
               f"127.0.0.1:{other_raft}=127.0.0.1:{other_grpc}=127.0.0.1:{other_peer}"]
    command = [sys.executable, "-m", "tickwheel.node", "serve", "--raft-address",
               f"127.0.0.1:{raft}", "--member", members[0], "--member", members[1],
               "--data", str(tmp_path / "data"), "--metrics-listen", "",
               *dev_credentials.make(tmp_path / "security").node_flags(), *args]
    clean = {key: value for key, value in os.environ.items()
             if not key.startswith("TICKWHEEL_")}
    return subprocess.Popen(command, env={**clean, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_a_cluster_without_a_secret_refuses_to_start_and_says_how_to_fix_it(
        tmp_path: Path) -> None:
    run = serve(tmp_path)
    output, _ = run.communicate(timeout=60)
    assert run.returncode == 2
    assert "needs a Raft secret" in output
    assert "--raft-secret-file" in output and "--insecure-raft" in output


def test_a_short_secret_and_a_password_flag_are_refused(tmp_path: Path) -> None:
    short = serve(tmp_path, env={"TICKWHEEL_RAFT_SECRET": "hunter2"})
    output, _ = short.communicate(timeout=60)
    assert short.returncode == 2 and "fewer than 16" in output
    flag = serve(tmp_path, "--password", "a-secret-on-the-command-line")
    output, _ = flag.communicate(timeout=60)
    assert flag.returncode == 2 and "unrecognized arguments: --password" in output


def test_insecure_raft_runs_only_when_asked_and_says_so_loudly(tmp_path: Path) -> None:
    run = serve(tmp_path, "--insecure-raft")
    try:
        warning = None
        for line in run.stdout:  # the warning comes before the node says it started
            if "event=raft_insecure" in line:
                warning = line
            if "event=node_started" in line:
                break
        assert warning is not None and "WARNING" in warning
        assert "anyone who can reach" in warning
    finally:
        run.terminate()
        run.wait(30)


class authenticated_link:
    """The dialler's side of the link protocol, written out with blocking sockets from the
    description in `tickwheel.replication.wire` (a second implementation that must agree)."""

    def __init__(self, address: str, secret: bytes) -> None:
        self._sock = socket.create_connection(host_port(address), timeout=RAFT_TIMEOUT_S)
        master = protocol.master_key(secret)
        mine = os.urandom(protocol.NONCE_BYTES)
        self._sock.sendall(protocol.MAGIC + bytes([protocol.VERSION]) + protocol.key_id(master)
                           + mine)
        welcome = self._read(protocol.WELCOME.size)
        theirs, proof = welcome[5:5 + protocol.NONCE_BYTES], welcome[5 + protocol.NONCE_BYTES:]
        assert hmac.compare_digest(proof, hmac.new(master, b"S" + mine + theirs,
                                                   sha256).digest())
        self._sock.sendall(hmac.new(master, b"C" + mine + theirs, sha256).digest())
        self._aead = AESGCM(protocol._hkdf(master, mine + theirs, b"dialler->acceptor"))
        self._count = 0

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self._sock.recv(size - len(data))
            assert chunk, "the node closed the link during the handshake"
            data += chunk
        return data

    def send(self, message: object) -> None:
        frame = self._aead.encrypt(self._count.to_bytes(12, "big"),
                                   pickle.dumps(message, protocol=5), None)
        self._count += 1
        self._sock.sendall(struct.pack("!I", len(frame)) + frame)

    def __enter__(self) -> authenticated_link:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


def test_nodes_started_for_users_run_with_a_secret(cluster: LocalCluster) -> None:
    for node in cluster.nodes:
        assert "--raft-secret-file" in Path(f"/proc/{node.pid}/cmdline").read_text()
        assert "event=raft_insecure" not in node.log_path.read_text()
