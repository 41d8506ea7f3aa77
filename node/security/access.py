"""Who may do what: principals, how they prove who they are, and what they are granted.

A node with TLS reads its principals from an access file (TOML; in Kubernetes, a Secret's
mount). A principal proves itself with a bearer token (the file holds only its SHA-256) or a
client certificate (its common name, when the node asks for client certificates)::

    [[principal]]
    name = "orders-service"
    tokens = ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
    certificates = ["orders-service"]
    rocketmq_access_keys = ["orders-service"]

    [[principal.grant]]
    actions = ["schedule", "cancel"]
    topics = ["orders", "orders.*"]

    [[principal.grant]]
    actions = ["consume"]
    topics = ["orders", "%DLQ%orders"]
    groups = ["billing", "shipping"]

    [principal.quota]                  # optional; a field left out bounds nothing
    schedule_msgs_per_s = 500
    schedule_bytes_per_s = 1048576
    max_pending_msgs = 1000000
    max_consumer_streams = 16

Actions: ``schedule`` (Schedule, ScheduleStream), ``consume`` (Receive, ReceiveMessages,
AckMessages, ChangeInvisibleDuration, CreateGroup: of a topic's named groups), ``cancel``
(Cancel and Reschedule of a topic's messages) and ``admin`` (DeleteGroup, and everything the
other three allow). Topic and group patterns are shell-style (``*``, ``?``, ``[...]``);
a grant without ``groups`` covers every group. ``tickwheel token`` makes a token and its line.

A principal's `Quota` bounds what it may do whatever its grants (a tenant of a shared cluster):
`tickwheel.node.security.quotas` enforces it; docs/security.md, "Quotas", says what each field
counts. A principal without one is bounded by the node's limits alone, as before quotas.

RocketMQ clients sign with an AccessKey and a SecretKey (``MQv2-HMAC-SHA1``): the file names
the access keys; each one's secret key is derived from the cluster's Raft secret
(`tickwheel.node.rocketmq.signature`, ``tickwheel rocketmq-key``), so the file still holds no
secret.

The node rereads the file when it changes (a Secret updated in place): tokens are added and
revoked without a restart. A file that does not parse is refused at start, and kept out (the
previous one stays in force, logged) after.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import secrets
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

log = logging.getLogger("tickwheel.node.security.access")

TOKEN_PREFIX = "sha256:"
ACCESS_KEY_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
"""A RocketMQ AccessKey (`tickwheel.node.rocketmq.signature`)."""
MAX_DECISIONS = 4_096
"""Decisions a principal remembers (action, topic, group); past it they are forgotten."""


class Action(enum.StrEnum):
    SCHEDULE = "schedule"
    CONSUME = "consume"
    CANCEL = "cancel"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Grant:
    actions: frozenset[Action]
    topics: tuple[str, ...]
    groups: tuple[str, ...] = ("*",)

    def allows(self, action: Action, topic: str, group: str | None) -> bool:
        if action not in self.actions and Action.ADMIN not in self.actions:
            return False
        if not any(fnmatchcase(topic, pattern) for pattern in self.topics):
            return False
        return group is None or any(fnmatchcase(group, pattern) for pattern in self.groups)


@dataclass(frozen=True, slots=True)
class Quota:
    """What one principal may do at most, from its ``[principal.quota]``; None: no bound."""

    schedule_msgs_per_s: int | None = None
    """Messages scheduled a second (a token bucket on the leader)."""
    schedule_bytes_per_s: int | None = None
    """Bytes of schedule requests a second, as they arrived (their encoded size)."""
    schedule_burst_msgs: int | None = None
    """Messages the bucket holds when full: a second's worth (``schedule_msgs_per_s``) if
    not given."""
    schedule_burst_bytes: int | None = None
    """Bytes the bucket holds when full: ``schedule_bytes_per_s`` if not given."""
    max_pending_msgs: int | None = None
    """Messages pending at once in the topics its ``schedule`` grants match."""
    max_consumer_streams: int | None = None
    """Consumer streams (``Receive``) open at once on the node that serves them."""

    def bounds(self) -> bool:
        """Whether any field is set."""
        return self != NO_QUOTA


NO_QUOTA = Quota()
"""A principal without ``[principal.quota]``: bounded by the node's limits alone."""


@dataclass(eq=False, slots=True)
class Principal:
    """Someone the cluster knows, and what it may do."""

    name: str
    grants: tuple[Grant, ...]
    quota: Quota = NO_QUOTA
    _decisions: dict[tuple[Action, str, str | None], bool] = field(default_factory=dict,
                                                                   repr=False)

    def may(self, action: Action, topic: str, group: str | None = None) -> bool:
        """Whether some grant covers ``action`` on ``topic`` (and, for consuming, ``group``;
        ``None``: any group is not asked about)."""
        key = (action, topic, group)
        decision = self._decisions.get(key)
        if decision is None:
            decision = any(grant.allows(action, topic, group) for grant in self.grants)
            if len(self._decisions) >= MAX_DECISIONS:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def unlimited(self, action: Action) -> bool:
        """Whether a grant covers ``action`` on every topic and group."""
        return any((action in grant.actions or Action.ADMIN in grant.actions)
                   and "*" in grant.topics and "*" in grant.groups for grant in self.grants)

    def sees(self, topic: str) -> bool:
        """Whether any action on ``topic`` is granted: what `ClusterInfo` shows it."""
        return any(self.may(action, topic) for action in Action)


ANYONE = Principal("anyone", (Grant(frozenset(Action), ("*",)),))
"""Every caller when the node runs without TLS on purpose (``insecure_grpc``)."""


def token_digest(token: str) -> str:
    """What an access file holds for ``token``: ``sha256:`` and its hex digest. Tokens are
    random (`new_token`), so a fast hash is enough: there is nothing to guess from it."""
    return TOKEN_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A bearer token: 32 random bytes, URL-safe base64."""
    return secrets.token_urlsafe(32)


# -- the file ---------------------------------------------------------------------------------

class _GrantModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    actions: list[Action] = Field(min_length=1)
    topics: list[str] = Field(min_length=1)
    groups: list[str] = Field(default_factory=lambda: ["*"], min_length=1)


_Limit = Annotated[int | None, Field(default=None, strict=True, gt=0, le=(1 << 63) - 1)]
"""A quota's value: a positive whole number (a signed 64-bit one, as ``QuotaFailure``
reports it); TOML's 1.5, "10" and true are refused, not rounded or read."""


class _QuotaModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schedule_msgs_per_s: _Limit
    schedule_bytes_per_s: _Limit
    schedule_burst_msgs: _Limit
    schedule_burst_bytes: _Limit
    max_pending_msgs: _Limit
    max_consumer_streams: _Limit

    @model_validator(mode="after")
    def _bursts_of_rates(self) -> _QuotaModel:
        for burst, rate in (("schedule_burst_msgs", "schedule_msgs_per_s"),
                            ("schedule_burst_bytes", "schedule_bytes_per_s")):
            if getattr(self, burst) is not None and getattr(self, rate) is None:
                raise ValueError(f"{burst} is the burst of {rate}, which is not set")
        return self

    def quota(self) -> Quota:
        return Quota(**self.model_dump())


class _PrincipalModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@/-]+$")
    tokens: list[str] = Field(default_factory=list)
    certificates: list[str] = Field(default_factory=list)
    rocketmq_access_keys: list[Annotated[str, Field(pattern=ACCESS_KEY_PATTERN)]] = Field(
        default_factory=list)
    grant: list[_GrantModel] = Field(default_factory=list)
    quota: _QuotaModel | None = None

    @field_validator("tokens")
    @classmethod
    def _digests(cls, value: list[str]) -> list[str]:
        for token in value:
            digest = token.removeprefix(TOKEN_PREFIX)
            if not token.startswith(TOKEN_PREFIX) or len(digest) != 64 or any(
                    c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"{token[:16]!r}...: a token is given as 'sha256:' and the "
                                 "64 hex digits of its SHA-256 (tickwheel token makes one); "
                                 "never the token itself")
        return value


class _AccessModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    principal: list[_PrincipalModel] = Field(default_factory=list)


class Access:
    """The principals of one access file, found by token digest, certificate name or name."""

    def __init__(self, principals: Iterable[tuple[Principal, Sequence[str], Sequence[str],
                                                  Sequence[str]]]) -> None:
        """``(principal, token digests, certificate names, RocketMQ access keys)`` each."""
        self._by_token: dict[str, Principal] = {}
        self._by_certificate: dict[str, Principal] = {}
        self._by_name: dict[str, Principal] = {}
        self._by_access_key: dict[str, Principal] = {}
        for principal, digests, certificates, access_keys in principals:
            for index, (table, keys) in enumerate(((self._by_name, [principal.name]),
                                                   (self._by_token, digests),
                                                   (self._by_certificate, certificates),
                                                   (self._by_access_key, access_keys))):
                for key in keys:
                    if key in table:
                        kind = ("name", "token", "certificate", "RocketMQ access key")[index]
                        raise ValueError(f"principal {principal.name!r}: its {kind} "
                                         f"{key[:24]!r} is also another principal's")
                    table[key] = principal

    @classmethod
    def parse(cls, text: str) -> Access:
        """Raises ValueError saying what is wrong."""
        try:
            content = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(str(error)) from None
        try:
            model = _AccessModel.model_validate(content)
        except ValidationError as error:
            raise ValueError(_problems(error, content)) from None
        return cls((Principal(p.name, tuple(
            Grant(frozenset(g.actions), tuple(g.topics), tuple(g.groups)) for g in p.grant),
            p.quota.quota() if p.quota else NO_QUOTA),
            p.tokens, p.certificates, p.rocketmq_access_keys) for p in model.principal)

    def by_token(self, token: str) -> Principal | None:
        return self._by_token.get(token_digest(token))

    def by_certificate(self, common_name: str) -> Principal | None:
        return self._by_certificate.get(common_name)

    def by_access_key(self, access_key: str) -> Principal | None:
        return self._by_access_key.get(access_key)

    def by_name(self, name: str) -> Principal | None:
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self._by_name)


def _problems(error: ValidationError, content: dict[str, object]) -> str:
    """What is wrong, a line per problem, each naming the field as the file writes it, with
    the principal's name (``principal 'orders' quota.max_pending_msgs: ...``)."""
    principals = content.get("principal")
    lines = []
    for problem in error.errors():
        where = [str(part) for part in problem["loc"]]
        if len(where) >= 2 and where[0] == "principal" and isinstance(principals, list):
            index = int(where[1])
            name = principals[index].get("name") if isinstance(principals[index], dict) else None
            where[:2] = [f"principal {name!r}" if isinstance(name, str)
                         else f"principal[{index}]"]
        head, rest = where[0] if where else "file", ".".join(where[1:])
        lines.append(f"{head} {rest}: {problem['msg']}" if rest
                     else f"{head}: {problem['msg']}")
    return "; ".join(lines)


class AccessFile:
    """An access file, reread when it changes (`refresh`); ``current`` is in force."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = file_stamp(path)
        try:
            self.current = Access.parse(path.read_text())
        except ValueError as error:
            raise ValueError(f"access file {path}: {error}") from None

    def refresh(self) -> bool:
        """Reread the file if it changed since; whether a new one is in force. A file that
        does not parse is logged and kept out."""
        stamp = file_stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            self.current = Access.parse(self.path.read_text())
        except (OSError, ValueError) as error:
            log.error("event=access_file_refused path=%s error=%r (the previous one stays in "
                      "force)", self.path, str(error)[:500])
            return False
        log.info("event=access_file_loaded path=%s principals=%d", self.path,
                 len(self.current))
        return True



def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or rewritten (inode, modification time, size);
    None while it is missing. A Kubernetes Secret's mount swaps a symlink: ``stat`` follows
    it to the new file."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size
