"""``tickwheel certs``, ``tickwheel token`` and ``tickwheel rocketmq-key``: what a node and its
clients prove themselves with (`tickwheel.node.cli.commands` adds them to the command)."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from tickwheel.node.cli.terminal import console
from tickwheel.node.rocketmq.signature import secret_key
from tickwheel.node.security import dev_credentials
from tickwheel.node.security.access import ACCESS_KEY_PATTERN, new_token, token_digest


def _certs(args: argparse.Namespace) -> int:
    hosts = args.host or ["127.0.0.1", "localhost"]
    made = dev_credentials.make(args.dir.resolve(), hosts)
    console.print(f"made in {made.root} (an existing set is kept; not for production):\n"
                  f"  tickwheel serve {' '.join(made.node_flags())}\n"
                  f"  export {' '.join(f'{k}={v}' for k, v in made.environment().items())}",
                  highlight=False, soft_wrap=True)
    return 0


def _token(args: argparse.Namespace) -> int:
    token = new_token()
    console.print(f"token (give it to the client; it is not stored anywhere):\n  {token}\n"
                  f"for the node's access file:\n"
                  f"  [[principal]]\n  name = {json.dumps(args.name)}\n"
                  f"  tokens = [\"{token_digest(token)}\"]", highlight=False, soft_wrap=True,
                  markup=False)
    return 0


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``certs``, ``token`` and ``rocketmq-key``: what a node and its clients prove
    themselves with."""
    certs = commands.add_parser(
        "certs", help="make a CA, a node certificate, an admin token and an access file "
                      "to try a node with (not for production)")
    certs.add_argument("dir", type=Path)
    certs.add_argument("--host", action="append", default=[],
                       help="a name or IP the node certificate covers (repeatable; default "
                            "127.0.0.1 and localhost)")
    certs.set_defaults(handler=_certs)
    token = commands.add_parser("token", help="make a bearer token and its access file lines")
    token.add_argument("--name", default="my-service", help="the principal's name")
    token.set_defaults(handler=_token)
    _rocketmq_key_parser(commands.add_parser(
        "rocketmq-key", help="the SecretKey of a RocketMQ AccessKey, and its access file line"))


def _rocketmq_key_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("access_key", help="the AccessKey, as the client will send it")
    parser.add_argument("--raft-secret-file", type=Path,
                        default=os.environ.get("TICKWHEEL_RAFT_SECRET_FILE"),
                        help="the cluster's Raft secret (default: TICKWHEEL_RAFT_SECRET_FILE, "
                             "or TICKWHEEL_RAFT_SECRET)")
    parser.set_defaults(handler=_rocketmq_key)


def _rocketmq_key(args: argparse.Namespace) -> int:
    if not re.fullmatch(ACCESS_KEY_PATTERN, args.access_key):
        console.print(f"[red]error[/red] {args.access_key!r} is not 1-128 of [A-Za-z0-9_.-]")
        return 2
    try:
        text = (args.raft_secret_file.read_text() if args.raft_secret_file
                else os.environ.get("TICKWHEEL_RAFT_SECRET", ""))
    except OSError as error:
        console.print(f"[red]error[/red] {args.raft_secret_file}: {error.strerror}")
        return 2
    raft_secrets = text.split()
    if not raft_secrets:
        console.print("[red]error[/red] no Raft secret: give --raft-secret-file (or "
                      "TICKWHEEL_RAFT_SECRET)")
        return 2
    key = secret_key(raft_secrets[0].encode(), args.access_key)
    console.print(f"SecretKey of AccessKey {args.access_key} (give it to the client; the "
                  f"nodes derive it, nothing stores it):\n  {key}\n"
                  f"in the principal's entry of the access file:\n"
                  f"  rocketmq_access_keys = [{json.dumps(args.access_key)}]",
                  highlight=False, soft_wrap=True)
    return 0
