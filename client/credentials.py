"""How a client proves who it is, and whom it trusts: TLS, a bearer token, a client
certificate.

A tickwheel node serves TLS to authenticated callers; a client is a principal of the node's
access file by its token or its certificate. `Credentials.from_env` is what `Client` and
`AsyncClient` use when given none::

    TICKWHEEL_CA_FILE      the CA that signed the nodes' certificates (default: system roots)
    TICKWHEEL_TOKEN_FILE   a file holding the bearer token (or TICKWHEEL_TOKEN, the token)
    TICKWHEEL_CERT_FILE    a client certificate, and its key in TICKWHEEL_KEY_FILE (mTLS)
    TICKWHEEL_INSECURE     "1": plaintext and no credentials, for a node run --insecure-grpc
"""

from __future__ import annotations

import os
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

AUTHORIZATION_KEY = "authorization"
BEARER = "Bearer "
_TRUE = ("1", "true", "yes")


@dataclass(frozen=True)
class Credentials:
    """``ca`` None trusts the system's roots; ``token`` and ``certificate`` (a PEM chain and
    its key) say who the caller is; ``insecure`` dials plaintext with none of them."""

    ca: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    certificate: tuple[bytes, bytes] | None = field(default=None, repr=False)
    insecure: bool = False

    def __post_init__(self) -> None:
        if self.insecure and (self.ca or self.token or self.certificate):
            raise ValueError("insecure credentials carry no CA, token or certificate")
        if self.token is not None and (not self.token or any(c.isspace()
                                                             for c in self.token)):
            raise ValueError("the token is empty or has white space in it")

    @classmethod
    def load(cls, *, ca_file: Path | str | None = None, token: str | None = None,
             token_file: Path | str | None = None, cert_file: Path | str | None = None,
             key_file: Path | str | None = None, insecure: bool = False) -> Credentials:
        """Credentials from files (read now); raises ValueError naming a file it cannot
        read."""
        if token is not None and token_file is not None:
            raise ValueError("give a token or a token file, not both")
        if (cert_file is None) != (key_file is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        if token_file is not None:
            token = _read(token_file, "token file").decode().strip()
        certificate = None if cert_file is None or key_file is None else (
            _read(cert_file, "certificate file"), _read(key_file, "key file"))
        return cls(None if ca_file is None else _read(ca_file, "CA file"), token,
                   certificate, insecure)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Credentials:
        """Credentials from ``TICKWHEEL_*`` variables (above)."""
        return cls.load(ca_file=environ.get("TICKWHEEL_CA_FILE") or None,
                        token=environ.get("TICKWHEEL_TOKEN") or None,
                        token_file=environ.get("TICKWHEEL_TOKEN_FILE") or None,
                        cert_file=environ.get("TICKWHEEL_CERT_FILE") or None,
                        key_file=environ.get("TICKWHEEL_KEY_FILE") or None,
                        insecure=environ.get("TICKWHEEL_INSECURE", "").lower() in _TRUE)

    def tls_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS alone (with the client certificate, if any); None: dial plaintext."""
        if self.insecure:
            return None
        key, chain = (None, None) if self.certificate is None else (
            self.certificate[1], self.certificate[0])
        return grpc.ssl_channel_credentials(self.ca, key, chain)

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call carries: the bearer token, if any (only ever over TLS: a token and
        ``insecure`` exclude each other). `open_channel` adds it; on a channel of
        `open_aio_channel` the caller passes it with each call."""
        return () if self.token is None else ((AUTHORIZATION_KEY, BEARER + self.token),)


def _read(path: Path | str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"{what} {path}: {error.strerror}") from None


def open_channel(address: str, credentials: Credentials,
                 options: tuple[tuple[str, object], ...]) -> grpc.Channel:
    """A channel to ``address``: TLS with ``credentials``, or plaintext if they are insecure.
    A token goes on every call as metadata (`_Bearer`)."""
    tls = credentials.tls_credentials()
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    channel = grpc.secure_channel(address, tls, options=options)
    metadata = credentials.call_metadata()
    return grpc.intercept_channel(channel, _Bearer(metadata)) if metadata else channel


def open_aio_channel(address: str, credentials: Credentials,
                     options: tuple[tuple[str, object], ...]) -> grpc.aio.Channel:
    """`open_channel` for asyncio, without the token: each call passes
    ``metadata=credentials.call_metadata()``. gRPC's call credentials would start a thread
    per call (`_Bearer`), and an asyncio interceptor wraps each call in a task of its own."""
    tls = credentials.tls_credentials()
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls, options=options)


# gRPC's own call credentials (``access_token_call_credentials``) run their metadata plugin on
# a thread started for every call (grpcio 1.85): a thread start and two hand-overs of the GIL
# per call, about a third of a sync unary call's CPU in the client. `_Bearer` puts the same
# ``authorization`` metadata on each call in the calling thread.

class _Details(namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                       "wait_for_ready", "compression")),
               grpc.ClientCallDetails):
    """A call's details with the token added."""


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: grpc.ClientCallDetails) -> _Details:
        return _Details(details.method, details.timeout,
                        (*(details.metadata or ()), *self._metadata), details.credentials,
                        details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation: Callable[..., Any],
                              client_call_details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any],
                               client_call_details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any],
                               client_call_details: grpc.ClientCallDetails,
                               request_iterator: Iterator[Any]) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Callable[..., Any],
                                client_call_details: grpc.ClientCallDetails,
                                request_iterator: Iterator[Any]) -> Any:
        return continuation(self._details(client_call_details), request_iterator)
