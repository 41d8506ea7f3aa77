"""RocketMQ's request signature, ``MQv2-HMAC-SHA1``, checked against tickwheel's principals.

A RocketMQ 5 client signs every call with an AccessKey and a SecretKey::

    authorization: MQv2-HMAC-SHA1 Credential=<AccessKey>, SignedHeaders=x-mq-date-time,
                   Signature=<hex HMAC-SHA1(SecretKey, x-mq-date-time)>

The access file names a principal's access keys (``rocketmq_access_keys``); the secret key of
an access key is *derived* from the cluster's Raft secret (`secret_key`), never stored: the
file stays free of secrets, as it is for bearer tokens, and every member can check a signature.
``tickwheel rocketmq-key ACCESS_KEY`` prints one. Revoking an access key is taking it out of the
file; rotating the Raft secret rotates every secret key (during a rotation, signatures under
either secret are accepted).

The signature covers the date header only, so it proves the key, not the request: the
listener is served over TLS, as the client listener is, which keeps a header from being
replayed by anyone who could read it. The date is not checked against the clock: the Python
client writes local time with a literal "Z".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence

from tickwheel.common.errors import Unauthenticated
from tickwheel.node.security.access import ANYONE, AccessFile, Principal

SCHEME = "MQv2-HMAC-SHA1"
DATE_KEY = "x-mq-date-time"
_LABEL = b"tickwheel rocketmq secret key v1\x00"


def secret_key(raft_secret: bytes, access_key: str) -> str:
    """The SecretKey of ``access_key`` in a cluster with ``raft_secret``: 43 URL-safe
    characters (256 bits)."""
    mac = hmac.new(raft_secret, _LABEL + access_key.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def signature(secret: str, date_time: str) -> str:
    """What a client with SecretKey ``secret`` sends for ``date_time``."""
    return hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def parse_authorization(value: str) -> tuple[str, str]:
    """``(access key, signature)`` of an ``authorization`` header; `Unauthenticated` saying
    what is wrong with it."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME:
        raise Unauthenticated(f"the authorization header is not {SCHEME}")
    fields = {}
    for part in rest.split(","):
        name, sep, field = part.strip().partition("=")
        if sep:
            fields[name] = field.strip()
    access_key, signed = fields.get("Credential", ""), fields.get("Signature", "")
    if not access_key or not signed:
        raise Unauthenticated(f"the {SCHEME} header needs Credential and Signature")
    if DATE_KEY not in fields.get("SignedHeaders", "").split(";"):
        raise Unauthenticated(f"the {SCHEME} header must sign {DATE_KEY}")
    return access_key, signed


class Signatures:
    """Who signed a call. ``access`` None: tickwheel's auth is off (``insecure_grpc``), and so
    is this check: every caller is `ANYONE`."""

    def __init__(self, access: AccessFile | None, raft_secrets: Sequence[bytes]) -> None:
        self._access = access
        self._secrets = tuple(raft_secrets)

    def principal(self, metadata: dict[str, str]) -> Principal:
        """The principal whose access key signed ``metadata`` (the call's headers)."""
        if self._access is None:
            return ANYONE
        authorization = metadata.get("authorization")
        if authorization is None:
            raise Unauthenticated(f"no credentials: sign calls ({SCHEME}) with an AccessKey "
                                  "this cluster knows and its SecretKey")
        access_key, signed = parse_authorization(authorization)
        principal = self._access.current.by_access_key(access_key)
        date_time = metadata.get(DATE_KEY, "")
        if principal is not None and any(
                hmac.compare_digest(signed.lower(),
                                    signature(secret_key(secret, access_key), date_time))
                for secret in self._secrets):
            return principal
        raise Unauthenticated(f"AccessKey {access_key[:128]!r} is not one this cluster knows, "
                              "or its signature does not match its SecretKey")
