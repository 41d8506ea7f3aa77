"""The ``Ledger`` service (`proto/tickwheel/v1/ledger.proto`): a node's own ledger, read over
the client listener by the cluster's admins.

The rules it keeps: every call is refused ``PERMISSION_DENIED`` unless the caller has an
admin grant on every topic and group (`Principal.unlimited`), since the ledger holds every
topic's ids, groups and consumers; a node answers for its own ledger alone and never forwards
(every replica holds the committed lifecycle, and each its own sends); a segment is named by
its sequence number alone, the path built here from this node's ledger folder and its own
name (`tickwheel.node.ledger.schema.segment_name`), so no caller reaches another file; and
everything is bounded: 1,000 segments a listing, chunks of 1 MiB, 10,000 rows a trace. A
trace names its message by id or by a handle of this node's shard (decoded with the shard's
handle key; the id is the one the ledger's rows naming it carry). A listing or a trace
asked to (``close_open``) first closes the open segment, so that the node's last rows are in
closed segments.
Reading files runs on threads (`asyncio.to_thread`), never on the event loop.

Registered on the client listener by `tickwheel.node.listeners`; called by the client
library's `tickwheel.client.ledger` (``tickwheel ledger fetch``, ``tickwheel trace``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO, Final, Never

import grpc

from tickwheel.node.api.admission import CALLER, CallContext
from tickwheel.node.api.context import NodeContext
from tickwheel.node.ledger import Manifest, segments
from tickwheel.node.ledger.by_handle import id_of_handle
from tickwheel.node.ledger.schema import segment_name, sequence_of
from tickwheel.node.ledger.trace import Trace, trace
from tickwheel.node.security.access import Action
from tickwheel.v1 import ledger_pb2 as pb
from tickwheel.v1 import ledger_pb2_grpc as pb_grpc

MAX_LISTED: Final = 1_000
"""Segments one ``ListLedgerSegments`` answer names at most."""
CHUNK_BYTES: Final = 1 << 20
"""The most one ``ReadLedgerSegment`` message carries."""
MAX_ID_BYTES: Final = 1_024
"""The longest id a trace asks for (an id is at most ``max_id_bytes``, 256 by default)."""
SERVICE_NAME: Final = pb.DESCRIPTOR.services_by_name["Ledger"].full_name
_OPTIONAL: Final = tuple(field.name for field in pb.TraceRow.DESCRIPTOR.fields
                         if field.has_presence)


class LedgerService(pb_grpc.LedgerServicer):
    """This node's ledger, to admins of every topic (module docstring)."""

    def __init__(self, node: NodeContext) -> None:
        self._node = node

    async def ListLedgerSegments(self, request: pb.ListLedgerSegmentsRequest,
                                 context: grpc.aio.ServicerContext[Any, Any]
                                 ) -> pb.ListLedgerSegmentsResponse:
        folder = await self._admitted(context)
        if request.close_open:
            await self._close_open()
        listed, more = await asyncio.to_thread(
            _listing, folder, request.since_ms, request.until_ms or None,
            request.after_sequence)
        return pb.ListLedgerSegmentsResponse(
            node=self._node.replica.address, shard=self._node.shards.shard,
            segments=listed, more=more)

    async def ReadLedgerSegment(self, request: pb.ReadLedgerSegmentRequest,
                                context: grpc.aio.ServicerContext[Any, Any]
                                ) -> AsyncIterator[pb.LedgerChunk]:
        folder = await self._admitted(context)
        path = folder / segment_name(self._node.replica.address, request.sequence)
        try:
            file: BinaryIO = await asyncio.to_thread(open, path, "rb")
        except FileNotFoundError:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"this node has no closed ledger "
                         f"segment {request.sequence} (retention may have deleted it)")
        try:
            offset = 0
            while data := await asyncio.to_thread(file.read, CHUNK_BYTES):
                yield pb.LedgerChunk(data=data, offset=offset)
                offset += len(data)
        finally:
            file.close()

    async def TraceMessage(self, request: pb.TraceMessageRequest,
                           context: grpc.aio.ServicerContext[Any, Any]
                           ) -> pb.TraceMessageResponse:
        folder = await self._admitted(context)
        wheel_handle = None
        if request.HasField("handle"):
            wheel_handle = self._node.replica.handle_cipher().decode([request.handle])[0]
            if wheel_handle is None:
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"handle: "
                             f"{request.handle} is no handle of shard {self._node.shards.shard}")
        elif not request.id or len(request.id.encode()) > MAX_ID_BYTES:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"id: must be 1 to {MAX_ID_BYTES} bytes")
        if request.close_open:
            await self._close_open()
        message_id = request.id if wheel_handle is None else await asyncio.to_thread(
            id_of_handle, folder, wheel_handle)
        found = await asyncio.to_thread(trace, folder, message_id) if message_id else Trace(
            [], 0, False)
        return pb.TraceMessageResponse(
            node=self._node.replica.address, shard=self._node.shards.shard,
            rows=[_row(row) for row in found.rows], segments=found.segments,
            truncated=found.truncated)

    async def _close_open(self) -> None:
        """Write what the ledger buffers and close its open segment (a listing or a trace
        asked for the node's last rows)."""
        rotate = self._node.rotate_ledger
        if rotate is not None:
            await asyncio.to_thread(rotate)

    async def _admitted(self, context: CallContext) -> Path:
        """This node's ledger folder, if the caller may read it; else the call is refused."""
        principal = CALLER.get(None)
        if principal is None or not principal.unlimited(Action.ADMIN):
            name = "?" if principal is None else principal.name
            await _abort(context, grpc.StatusCode.PERMISSION_DENIED,
                         f"principal {name!r} may not read the ledger: that takes an admin "
                         "grant on every topic and group")
        folder = self._node.ledger_folder
        if folder is None:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                         "this node keeps no ledger (it runs with --no-ledger)")
        return folder


def _listing(folder: Path, since_ms: int, until_ms: int | None, after: int
             ) -> tuple[list[pb.LedgerSegment], bool]:
    """The closed segments numbered above ``after`` that overlap the range, at most
    `MAX_LISTED`, and whether more do."""
    listed: list[pb.LedgerSegment] = []
    for path in segments(folder):
        if (sequence_of(path) or 0) <= after:
            continue
        try:
            text = path.with_suffix(".json").read_text(encoding="utf-8")
        except FileNotFoundError:  # deleted by retention since it was listed
            continue
        manifest = Manifest.from_json(text)
        if manifest.last_ms < since_ms or (until_ms is not None and manifest.first_ms > until_ms):
            continue
        if len(listed) == MAX_LISTED:
            return listed, True
        listed.append(pb.LedgerSegment(
            sequence=manifest.sequence, name=path.name, manifest_json=text,
            bytes=manifest.bytes, sha256=manifest.sha256, first_ms=manifest.first_ms,
            last_ms=manifest.last_ms, rows=manifest.rows))
    return listed, False


def _row(row: dict[str, Any]) -> pb.TraceRow:
    message = pb.TraceRow(event=row["event"], node=row["node"], node_ms=row["node_ms"],
                          time_ms=row["time_ms"])
    for name in _OPTIONAL:
        if row.get(name) is not None:
            setattr(message, name, row[name])
    return message


async def _abort(context: CallContext, code: grpc.StatusCode, details: str) -> Never:
    await context.abort(code, details)
