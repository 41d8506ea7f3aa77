"""The node certificate of each deploy recipe names every address a pod is dialled at.

Members dial each other's peer listener by their headless-Service names and check the
certificate against them; clients dial the client Service; operators port-forward to
localhost. A name the certificate lacks fails every such handshake, and in a running cluster
that means no forwarding to the leader and no snapshot install. Each recipe (the README's
``tickwheel certs`` command and ``k8s/cert-manager.yaml``) is turned into a certificate and
every name is checked by a real TLS handshake (OpenSSL's hostname check), in memory.
"""

from __future__ import annotations

import shlex
import ssl
from pathlib import Path

import pytest
import yaml

from tickwheel.node.cli import commands as cli
from tickwheel.node.security import dev_credentials
from tickwheel.node.security.dev_credentials import DevCredentials
from tickwheel.node.settings.statefulset import StatefulSetPod, addresses

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = "tickwheel"
"""The namespace the README's commands use."""
REPLICAS = 5
SHARDS = 3


def dialled_names(namespace: str) -> list[str]:
    """Every host a client, a member or an operator dials a node by: with one shard (the
    base) and with several (overlays/shards, whose clients dial every shard's pods)."""
    pod = StatefulSetPod("tickwheel-0", replicas=REPLICAS, service="tickwheel-peers",
                         namespace=namespace)
    peers = [member.split("=")[2].rsplit(":", 1)[0] for member in addresses(pod).members]
    sharded = addresses(StatefulSetPod("tickwheel-s0-0", replicas=REPLICAS,
                                       service="tickwheel-peers", namespace=namespace,
                                       shard=0, shards=SHARDS))
    peers += [member.split("=")[2].rsplit(":", 1)[0] for member in sharded.members]
    peers += [entry.split("=")[1].rsplit(":", 1)[0] for entry in sharded.shard_members]
    assert len(set(peers)) == REPLICAS * (SHARDS + 1)
    service = ["tickwheel", f"tickwheel.{namespace}", f"tickwheel.{namespace}.svc",
               f"tickwheel.{namespace}.svc.cluster.local"]
    return [*peers, *service, "localhost", "127.0.0.1"]


def handshake(security: DevCredentials, hostname: str) -> None:
    """A TLS handshake with the node certificate, the client checking it is for
    ``hostname``; ssl.SSLCertVerificationError if not."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(security.cert_file, security.key_file)
    client_context = ssl.create_default_context(cafile=str(security.ca_file))
    pipes = [(ssl.MemoryBIO(), ssl.MemoryBIO()) for _ in range(2)]
    client = client_context.wrap_bio(pipes[0][0], pipes[0][1], server_hostname=hostname)
    server = server_context.wrap_bio(pipes[1][0], pipes[1][1], server_side=True)
    done = {id(client): False, id(server): False}
    for _ in range(10):
        for side, (_, outgoing), (incoming, _) in ((client, pipes[0], pipes[1]),
                                                   (server, pipes[1], pipes[0])):
            if not done[id(side)]:
                try:
                    side.do_handshake()
                    done[id(side)] = True
                except ssl.SSLWantReadError:
                    pass
            incoming.write(outgoing.read())
        if all(done.values()):
            return
    raise AssertionError(f"the handshake for {hostname} did not finish")


def readme_certs_command() -> list[str]:
    """The README's ``tickwheel certs`` command for a cluster (the one naming the peers)."""
    lines = (DEPLOY / "README.md").read_text().replace("\\\n", " ").splitlines()
    [command] = [line for line in lines
                 if line.startswith("tickwheel certs ") and "tickwheel-peers" in line]
    return shlex.split(command)[1:]


def cert_manager_hosts(namespace: str) -> tuple[str, list[str]]:
    """The Secret the node Certificate goes to, and its names and addresses."""
    text = (DEPLOY / "k8s" / "cert-manager.yaml").read_text().replace("NAMESPACE", namespace)
    documents = [doc for doc in yaml.safe_load_all(text) if doc]
    issuers = {doc["metadata"]["name"]: doc["spec"] for doc in documents
               if doc["kind"] == "Issuer"}
    [node] = [doc["spec"] for doc in documents
              if doc["kind"] == "Certificate" and not doc["spec"].get("isCA")]
    assert "ca" in issuers[node["issuerRef"]["name"]], "signed by a CA Issuer (ca.crt)"
    assert "server auth" in node["usages"]
    return node["secretName"], [*node["dnsNames"], *node.get("ipAddresses", [])]


def test_the_readmes_development_certificate_names_every_dialled_address(
        tmp_path: Path) -> None:
    argv = readme_certs_command()
    assert argv[0] == "certs"
    assert argv[1] == "./tw"  # the folder the README's Secrets are made from
    target = tmp_path / "tw"
    assert cli.main([argv[0], str(target), *argv[2:]]) == 0
    security = DevCredentials(target)
    for name in dialled_names(NAMESPACE):
        handshake(security, name)


def test_the_cert_manager_certificate_names_every_dialled_address(tmp_path: Path) -> None:
    secret, hosts = cert_manager_hosts(NAMESPACE)
    statefulset = yaml.safe_load((DEPLOY / "k8s/shard/statefulset.yaml").read_text())
    volumes = statefulset["spec"]["template"]["spec"]["volumes"]
    assert secret in {volume.get("secret", {}).get("secretName") for volume in volumes}
    security = dev_credentials.make(tmp_path / "issued", hosts)
    for name in dialled_names(NAMESPACE):
        handshake(security, name)


def test_a_name_the_certificate_lacks_fails_the_handshake(tmp_path: Path) -> None:
    """What the checks above would see if a recipe forgot the peers' wildcard."""
    security = dev_credentials.make(tmp_path / "narrow", ["tickwheel", "localhost"])
    handshake(security, "localhost")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(security, dialled_names(NAMESPACE)[0])
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(security, f"tickwheel-0.other.{NAMESPACE}.svc.cluster.local")
