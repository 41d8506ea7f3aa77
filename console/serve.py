"""Running the console: its settings (`ConsoleSettings`, from ``tickwheel console``'s flags or
the ``TICKWHEEL_*`` variables the other commands read), and uvicorn serving the app over TLS.

The rule it keeps: the console serves HTTPS only (its session cookie is ``Secure``), with the
certificate and key given (``tickwheel cluster up --console`` gives the node certificate
it made, which names 127.0.0.1 and localhost), and calls the cluster over TLS, trusting the CA
given. Called by `tickwheel.cli` (``tickwheel console``, ``cluster up --console``) and
``python -m tickwheel.console``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from tickwheel.client import Client, Credentials, LedgerClient
from tickwheel.console.app import build_app
from tickwheel.console.context import Console
from tickwheel.console.sessions import Sessions

DEFAULT_LISTEN = "127.0.0.1:7800"
CALL_TIMEOUT_S = 5.0
"""How long a page waits for the cluster (through the client's retries)."""
ATTEMPT_TIMEOUT_S = 1.0
"""How long one call to one member may take: a member that is down shows within it."""
SHUTDOWN_S = 3
"""How long SIGTERM waits for answers in progress: the live pages' event streams never end
by themselves."""


@dataclass(frozen=True)
class ConsoleSettings:
    nodes: tuple[str, ...]
    """gRPC addresses of members to ask first; the others are learnt from their answers."""
    ca_file: Path
    """The CA the nodes' certificates are signed by."""
    cert_file: Path
    key_file: Path
    """The console's own certificate and key (HTTPS)."""
    host: str = "127.0.0.1"
    port: int = 7800
    idle_s: float = 3_600.0
    """A session unused this long ends."""

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}/"


def console_for(settings: ConsoleSettings) -> Console:
    ca = settings.ca_file.read_bytes()

    def client_for(token: str) -> Client:
        return Client(list(settings.nodes), timeout_s=CALL_TIMEOUT_S,
                      attempt_timeout_s=ATTEMPT_TIMEOUT_S,
                      credentials=Credentials(ca=ca, token=token))

    def ledger_for(token: str) -> LedgerClient:
        return LedgerClient(list(settings.nodes), credentials=Credentials(ca=ca, token=token),
                            timeout_s=CALL_TIMEOUT_S)
    return Console(Sessions(idle_s=settings.idle_s), client_for, ledger_for, settings.nodes)


def run(settings: ConsoleSettings) -> None:
    """Serve until SIGINT or SIGTERM."""
    config = uvicorn.Config(build_app(console_for(settings)), host=settings.host,
                            port=settings.port, ssl_certfile=str(settings.cert_file),
                            ssl_keyfile=str(settings.key_file), log_level="warning",
                            proxy_headers=False, server_header=False,
                            timeout_graceful_shutdown=SHUTDOWN_S)
    print(f"tickwheel console at {settings.url}", flush=True)
    uvicorn.Server(config).run()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--nodes", default=env("TICKWHEEL_TARGET", "127.0.0.1:7400"),
                        help="gRPC addresses of members, comma-separated (default "
                             "$TICKWHEEL_TARGET or 127.0.0.1:7400)")
    parser.add_argument("--ca-file", type=Path, default=env("TICKWHEEL_CA_FILE"),
                        required=env("TICKWHEEL_CA_FILE") is None,
                        help="the CA of the nodes' certificates ($TICKWHEEL_CA_FILE)")
    parser.add_argument("--cert-file", type=Path, required=True,
                        help="the console's HTTPS certificate (PEM)")
    parser.add_argument("--key-file", type=Path, required=True, help="its private key (PEM)")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help="HOST:PORT to serve HTTPS on")


def settings_from(args: argparse.Namespace) -> ConsoleSettings:
    host, _, port = args.listen.rpartition(":")
    return ConsoleSettings(tuple(a.strip() for a in args.nodes.split(",") if a.strip()),
                           args.ca_file, args.cert_file, args.key_file, host, int(port))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tickwheel console",
                                     description="the web console (docs/console.md)")
    add_arguments(parser)
    run(settings_from(parser.parse_args(argv)))
    return 0
