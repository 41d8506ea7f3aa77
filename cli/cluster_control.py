"""How ``tickwheel cluster grow`` asks the running ``tickwheel cluster up`` to grow its cluster:
one JSON request a connection over a Unix socket, answered by JSON lines.

The rule it keeps: the process that started a node is the one that stops it. ``cluster up``
owns its nodes (it stops them by PID when it stops), so it starts the new shards' nodes
itself, on request, and they stop with it; ``cluster grow`` only asks and reports. The socket
is its owner's alone (mode 0600, like the Raft secret beside it): whoever may connect could
read the folder's secrets anyway. `tickwheel.cli.cluster` serves it (``cluster up``, between
its checks of the nodes) and asks it (``cluster grow``).

::

    -> {"grow_to": 4}
    <- {"progress": "starting shards 2-3: 2 nodes"}            (any number of these)
    <- {"ok": true, "map_version": 2, "shards": 4, "nodes": [...]}   (the last line), or
       {"ok": false, "error": "...", "refused": true}   (refused: nothing was changed)
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REQUEST_TIMEOUT_S = 5.0
"""How long ``cluster up`` waits for a connection's request before it drops it (it serves one
connection at a time, between its checks of the nodes)."""
ANSWER_TIMEOUT_S = 300.0
"""How long ``cluster grow`` waits for each line of the answer: a growth starts nodes and
waits for their elections (60 s each at most), then each old shard takes the map."""
MAX_REQUEST_BYTES = 4096
_SUN_PATH_BYTES = 107
"""The longest path a Unix socket binds to (``sun_path`` less its terminating zero)."""

Reply = Callable[[dict[str, Any]], None]
"""Sends one line of the answer."""


class ControlServer:
    """``cluster up``'s end: a listening Unix socket at `path`, polled between other work."""

    def __init__(self, wanted: Path) -> None:
        self._private = (None if len(os.fsencode(wanted)) <= _SUN_PATH_BYTES
                         else Path(tempfile.mkdtemp(prefix="tickwheel-control-")))
        self.path = wanted if self._private is None else self._private / wanted.name
        self.path.unlink(missing_ok=True)  # left by a cluster up that was killed
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mask = os.umask(0o177)
        try:
            self._socket.bind(str(self.path))
        finally:
            os.umask(mask)
        self._socket.listen(4)

    def serve(self, timeout_s: float, handle: Callable[[dict[str, Any], Reply], None]) -> None:
        """Wait up to ``timeout_s`` for a connection; if one comes, read its request and pass
        it to ``handle`` with a way to answer. A caller that hangs up is no error here."""
        ready, _, _ = select.select([self._socket], [], [], timeout_s)
        if not ready:
            return
        connection, _ = self._socket.accept()
        with connection:
            connection.settimeout(REQUEST_TIMEOUT_S)

            def reply(line: dict[str, Any]) -> None:
                with contextlib.suppress(OSError):
                    connection.sendall(json.dumps(line).encode() + b"\n")
            try:
                request = json.loads(_read_line(connection))
            except (OSError, ValueError) as error:
                reply({"ok": False, "error": f"could not read the request: {error}"})
                return
            if not isinstance(request, dict):
                reply({"ok": False, "error": "the request is not a JSON object"})
                return
            handle(request, reply)

    def close(self) -> None:
        self._socket.close()
        self.path.unlink(missing_ok=True)
        if self._private is not None:
            self._private.rmdir()


def answering(path: Path) -> bool:
    """Whether a ``cluster up`` listens at ``path`` now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(REQUEST_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


def _read_line(connection: socket.socket) -> bytes:
    received = b""
    while b"\n" not in received:
        chunk = connection.recv(MAX_REQUEST_BYTES)
        if not chunk:
            break
        received += chunk
        if len(received) > MAX_REQUEST_BYTES:
            raise ValueError(f"longer than {MAX_REQUEST_BYTES} bytes")
    return received.split(b"\n", 1)[0]


def ask(path: Path, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``cluster grow``'s end: send ``request`` to the ``cluster up`` listening at ``path``
    and yield each line of its answer. `ConnectionRefusedError` or `FileNotFoundError` if
    none listens there; `ConnectionError` if it hangs up before its last line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(ANSWER_TIMEOUT_S)
        connection.connect(str(path))
        connection.sendall(json.dumps(request).encode() + b"\n")
        with connection.makefile("rb") as answers:
            for line in answers:
                answer = json.loads(line)
                yield answer
                if "ok" in answer:
                    return
    raise ConnectionError("cluster up hung up before it answered (did it stop?)")
