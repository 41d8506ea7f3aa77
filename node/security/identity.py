"""Who is calling: the principal behind a gRPC call, on each of a node's two listeners.

- The **client listener** (``grpc_listen``) serves `Tickwheel` to applications over TLS. A
  caller is the principal of its bearer token (``authorization: Bearer ...``) or of its
  client certificate's common name (`tickwheel.node.security.access`); anyone else is refused
  ``UNAUTHENTICATED``. With ``insecure_grpc`` every caller is `ANYONE`.
- The **peer listener** (``peer_listen``) serves `Peer` (state files for a snapshot install)
  and the calls followers forward to their leader, to members only. A member proves itself
  with the peer token, an HMAC of the Raft secret (whoever holds the secret is a member: the
  Raft port trusts the same); a forwarded call names the principal the follower authenticated,
  and the leader authorizes it as that principal.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tickwheel.client.credentials import AUTHORIZATION_KEY, BEARER
from tickwheel.common.errors import Unauthenticated
from tickwheel.node.security.access import ANYONE, AccessFile, Principal, file_stamp

PEER_KEY = "tickwheel-peer"
"""A member's peer token, on calls to the peer listener."""
PRINCIPAL_KEY = "tickwheel-principal"
"""On a forwarded call: the principal the forwarding member authenticated."""
_PEER_TOKEN_LABEL = b"tickwheel peer listener v1"

log = logging.getLogger("tickwheel.node.identity")


def peer_token(secret: bytes) -> str:
    """What a member shows the peer listener: an HMAC of the Raft secret, never the secret."""
    return hmac.new(secret, _PEER_TOKEN_LABEL, hashlib.sha256).hexdigest()


class CallMetadata(Protocol):
    """What telling who calls needs of a call's context: any `grpc.aio.ServicerContext`,
    whatever its request and response types."""

    def invocation_metadata(self) -> grpc.aio.Metadata | None: ...

    def auth_context(self) -> Mapping[str, Iterable[bytes]]: ...


def metadata_value(context: CallMetadata, key: str) -> str | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return None


class ClientCallers:
    """Callers of the client listener. ``access`` None: TLS is off on purpose, anyone may do
    anything."""

    def __init__(self, access: AccessFile | None) -> None:
        self._access = access

    def principal(self, context: CallMetadata) -> Principal:
        if self._access is None:
            return ANYONE
        access = self._access.current
        authorization = metadata_value(context, AUTHORIZATION_KEY)
        if authorization is not None:
            principal = (access.by_token(authorization[len(BEARER):])
                         if authorization.startswith(BEARER) else None)
            if principal is None:
                raise Unauthenticated("the bearer token is not one this cluster knows")
            return principal
        for name in context.auth_context().get("x509_common_name", ()):
            principal = access.by_certificate(name.decode(errors="replace"))
            if principal is not None:
                return principal
        raise Unauthenticated("no credentials: call with a bearer token (TICKWHEEL_TOKEN_FILE) "
                              "or a client certificate this cluster knows")


class PeerCallers:
    """Callers of the peer listener: members, with the peer token of one of ``secrets`` (none:
    the Raft links run without a secret on purpose, and so does this listener)."""

    def __init__(self, secrets: Sequence[bytes], access: AccessFile | None) -> None:
        self._tokens = tuple(peer_token(secret) for secret in secrets)
        self._access = access

    def member(self, context: CallMetadata) -> None:
        """Raise `Unauthenticated` unless a member calls."""
        if not self._tokens:
            return
        shown = (metadata_value(context, PEER_KEY) or "").encode()
        if not any(hmac.compare_digest(shown, token.encode()) for token in self._tokens):
            raise Unauthenticated("the peer listener serves members of this cluster only")

    def principal(self, context: CallMetadata) -> Principal:
        """The principal a member forwards a call for."""
        self.member(context)
        if self._access is None:
            return ANYONE
        name = metadata_value(context, PRINCIPAL_KEY) or ""
        principal = self._access.current.by_name(name)
        if principal is None:
            raise Unauthenticated(f"a member forwarded a call of principal {name[:128]!r}, "
                                  "which this node's access file does not name")
        return principal

    def metadata(self, principal: Principal | None = None) -> tuple[tuple[str, str], ...]:
        """What a call to a member's peer listener carries: the peer token, and the principal
        of a forwarded call."""
        token = ((PEER_KEY, self._tokens[0]),) if self._tokens else ()
        return token if principal is None else (*token, (PRINCIPAL_KEY, principal.name))


# -- TLS ----------------------------------------------------------------------------------------

class ServerCertificates:
    """A listener's TLS: this node's certificate and key and, for mutual TLS, the CA client
    certificates must be signed by; reread when one of the files changes, so a renewed
    certificate (cert-manager rewrites its Secret's mount in place) serves every connection
    made after it, without a restart. gRPC asks before each handshake; a pair that does not
    load, or whose key does not match the certificate (files replaced one at a time), is
    logged and the last good pair kept."""

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None) -> None:
        self._files = (cert_file, key_file, *((client_ca_file,) if client_ca_file else ()))
        self._mutual = client_ca_file is not None
        self._stamp = self._stat()
        self._initial = self._load()

    def credentials(self) -> grpc.ServerCredentials:
        # gRPC keeps the current pair when the fetcher returns None (its documented contract);
        # types-grpcio's signature forbids None.
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self._fetch,  # type: ignore[arg-type]
            require_client_authentication=self._mutual)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = self._stat()
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            configuration = self._load()
        except (OSError, ValueError) as error:
            log.error("event=tls_certificate_refused cert=%s error=%r (the previous one stays "
                      "in force)", self._files[0], str(error)[:500])
            return None
        log.info("event=tls_certificate_loaded cert=%s", self._files[0])
        return configuration

    def _stat(self) -> tuple[tuple[int, int, int] | None, ...]:
        return tuple(map(file_stamp, self._files))

    def _load(self) -> grpc.ServerCertificateConfiguration:
        cert_pem, key_pem = check_certificate_pair(*self._files[:2])
        client_ca = self._files[2].read_bytes() if self._mutual else None
        return grpc.ssl_server_certificate_configuration([(key_pem, cert_pem)],
                                                         root_certificates=client_ca)


def check_certificate_pair(cert_file: Path, key_file: Path) -> tuple[bytes, bytes]:
    """The PEM of a certificate and its private key; ValueError naming the file if one does
    not parse or the key is not the certificate's."""
    cert_pem, key_pem = cert_file.read_bytes(), key_file.read_bytes()
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as error:
        raise ValueError(f"{cert_file}: not a PEM certificate ({error})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{key_file}: not an unencrypted PEM private key ({error})") from None
    if certificate.public_key() != key.public_key():
        raise ValueError(f"{key_file} is not the key of {cert_file}")
    return cert_pem, key_pem
