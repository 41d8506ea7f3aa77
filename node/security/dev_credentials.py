"""TLS certificates, tokens and an access file made on the fly, for clusters on one machine.

`LocalCluster` (and so ``make demo``, ``tickwheel cluster up``, the chaos runner, the
benchmarks and the tests) runs every node with TLS and authenticated callers, using what this
module makes under a folder: a CA, a node certificate for the given hosts, and per principal a
bearer token (and, if asked, a client certificate and a RocketMQ access key, its name: its
secret key derives from the cluster's Raft secret). The secure path is the tested path.
``tickwheel certs DIR`` makes the same set for a node started by hand.

Not for production: the CA's key lies next to what it signed, and nothing expires it early.
In production, certificates come from your CA (cert-manager in Kubernetes) and tokens from
``tickwheel token`` into a Secret (docs/security.md).

Layout (kept if it exists: a cluster restarted on the same folder keeps its credentials)::

    ca.pem ca.key node.pem node.key access.toml
    tokens/<principal>.token      clients/<principal>.pem clients/<principal>.key
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Grants = Sequence[Mapping[str, Sequence[str]]]
"""A principal's grants as the access file writes them: ``{"actions": [...], "topics":
[...], "groups": [...]}`` each (groups optional)."""
ADMIN: dict[str, Grants] = {"admin": [{"actions": ["admin"], "topics": ["*"]}]}
VALID_FOR = datetime.timedelta(days=365)


@dataclass(frozen=True)
class DevCredentials:
    root: Path

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    @property
    def cert_file(self) -> Path:
        return self.root / "node.pem"

    @property
    def key_file(self) -> Path:
        return self.root / "node.key"

    @property
    def access_file(self) -> Path:
        return self.root / "access.toml"

    def token_file(self, principal: str) -> Path:
        return self.root / "tokens" / f"{principal}.token"

    def client_certificate(self, principal: str) -> tuple[Path, Path]:
        """The certificate and key of ``principal`` (made with ``client_certificates``)."""
        return (self.root / "clients" / f"{principal}.pem",
                self.root / "clients" / f"{principal}.key")

    def node_flags(self, client_certificates: bool = False) -> tuple[str, ...]:
        """What ``tickwheel serve`` is given to use them."""
        return ("--tls-cert-file", str(self.cert_file), "--tls-key-file", str(self.key_file),
                "--tls-ca-file", str(self.ca_file), "--access-file", str(self.access_file),
                *(("--tls-client-certs",) if client_certificates else ()))

    def node_environment(self) -> dict[str, str]:
        """The same as ``TICKWHEEL_*`` variables."""
        return {"TICKWHEEL_TLS_CERT_FILE": str(self.cert_file),
                "TICKWHEEL_TLS_KEY_FILE": str(self.key_file),
                "TICKWHEEL_TLS_CA_FILE": str(self.ca_file),
                "TICKWHEEL_ACCESS_FILE": str(self.access_file)}

    def environment(self, principal: str = "admin") -> dict[str, str]:
        """The ``TICKWHEEL_*`` variables a client or the CLI reads, as ``principal``."""
        return {"TICKWHEEL_CA_FILE": str(self.ca_file),
                "TICKWHEEL_TOKEN_FILE": str(self.token_file(principal))}


def make(root: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"),
         principals: Mapping[str, Grants] | None = None,
         client_certificates: bool = False, rocketmq: bool = False) -> DevCredentials:
    """Credentials under ``root``, made unless there already. ``principals`` (default: one
    ``admin`` with every permission) each get a token, with ``client_certificates`` a
    certificate with their name as its common name, and with ``rocketmq`` a RocketMQ access
    key, their name (only then: a node of an earlier build refuses an access file naming
    access keys)."""
    made = DevCredentials(root)
    principals = ADMIN if principals is None else principals
    if made.access_file.exists():
        return made
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokens").mkdir(exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tickwheel development CA")])
    ca = (_builder(ca_name, ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(_key_usage(signs=True), critical=True)
          .sign(ca_key, hashes.SHA256()))
    _write(made.ca_file, ca.public_bytes(serialization.Encoding.PEM))
    _write(root / "ca.key", _pem_key(ca_key), private=True)
    node_key = ec.generate_private_key(ec.SECP256R1())
    node = (_builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tickwheel node")]),
                     ca_name, node_key.public_key())
            .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(_key_usage(signs=False), critical=True)
            .sign(ca_key, hashes.SHA256()))
    _write(made.cert_file, node.public_bytes(serialization.Encoding.PEM))
    _write(made.key_file, _pem_key(node_key), private=True)
    lines = []
    for name, grants in principals.items():
        token = secrets.token_urlsafe(32)
        _write(made.token_file(name), (token + "\n").encode(), private=True)
        lines += ["[[principal]]", f"name = {json.dumps(name)}",
                  f'tokens = ["sha256:{hashlib.sha256(token.encode()).hexdigest()}"]']
        if rocketmq:
            lines.append(f"rocketmq_access_keys = [{json.dumps(name)}]")
        if client_certificates:
            lines.append(f"certificates = [{json.dumps(name)}]")
            _client_certificate(made, name, ca_key, ca_name)
        lines.append("")
        for grant in grants:
            lines.append("[[principal.grant]]")
            lines += [f"{key} = {json.dumps(list(values))}" for key, values in grant.items()]
            lines.append("")
    # Written last: its presence says the set is complete.
    _write(made.access_file, "\n".join(lines).encode(), private=True)
    return made


def _client_certificate(made: DevCredentials, name: str, ca_key: ec.EllipticCurvePrivateKey,
                        ca_name: x509.Name) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (_builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]),
                            ca_name, key.public_key())
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                                  critical=False)
                   .add_extension(_key_usage(signs=False), critical=True)
                   .sign(ca_key, hashes.SHA256()))
    cert_file, key_file = made.client_certificate(name)
    cert_file.parent.mkdir(exist_ok=True)
    _write(cert_file, certificate.public_bytes(serialization.Encoding.PEM))
    _write(key_file, _pem_key(key), private=True)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
             ) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID_FOR))


def _key_usage(signs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=not signs, content_commitment=False,
                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                         key_cert_sign=signs, crl_sign=signs, encipher_only=False,
                         decipher_only=False)


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o600 if private else 0o644)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
