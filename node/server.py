"""The gRPC face of a node: the `Tickwheel` service for clients, `Peer` for other nodes.

Errors map to status codes in one table (`_STATUS`). A follower answers writes with
``FAILED_PRECONDITION`` and the leader's Raft address in the ``tickwheel-leader`` trailer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
from tickwheel.replication.replica import Replica
from tickwheel.replication.state import Rejected, Scheduled
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc
from tickwheel.wheel import NewMessage
from tickwheel.wheel.errors import (
    ClientError,
    NotLeader,
    Overloaded,
    TickwheelError,
    Unavailable,
)

_STATUS: list[tuple[type[TickwheelError], grpc.StatusCode]] = [
    (ClientError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotLeader, grpc.StatusCode.FAILED_PRECONDITION),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (TickwheelError, grpc.StatusCode.INTERNAL),
]
WRITE_TIMEOUT_S = 10.0
CHUNK_BYTES = 1 << 20


def _abort(context: grpc.ServicerContext, error: TickwheelError) -> None:
    code = next(code for kind, code in _STATUS if isinstance(error, kind))
    if isinstance(error, NotLeader) and error.leader_hint:
        context.set_trailing_metadata((("tickwheel-leader", error.leader_hint),))
    context.abort(code, str(error))


def _committed(context: grpc.ServicerContext, write: Callable[[], futures.Future]) -> list:
    """Start a replicated write and wait for its results; abort the call on an error, a
    timeout, or any result the state machine rejected."""
    try:
        results = write().result(WRITE_TIMEOUT_S)
    except TickwheelError as error:
        _abort(context, error)
    except futures.TimeoutError:
        context.abort(grpc.StatusCode.UNAVAILABLE, "not committed in time; retry")
    for result in results:
        if isinstance(result, Rejected):
            _abort(context, result.error)
    return results


class TickwheelService(pb_grpc.TickwheelServicer):
    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def Schedule(self, request: pb.ScheduleRequest,
                 context: grpc.ServicerContext) -> pb.ScheduleResponse:
        messages = [NewMessage(m.id, m.topic, m.body, m.deliver_at_ms, dict(m.properties))
                    for m in request.messages]
        results = _committed(context, lambda: self._replica.schedule(messages))
        return pb.ScheduleResponse(results=[
            pb.ScheduleResult(id=m.id, handle=r.handle, deliver_at_ms=r.deliver_at_ms,
                              duplicate=r.duplicate)
            for m, r in zip(messages, results, strict=True) if isinstance(r, Scheduled)])

    def Cancel(self, request: pb.CancelRequest,
               context: grpc.ServicerContext) -> pb.CancelResponse:
        results = _committed(context, lambda: self._replica.cancel(list(request.handles)))
        return pb.CancelResponse(cancelled=results)

    def ClusterInfo(self, request: pb.ClusterInfoRequest,
                    context: grpc.ServicerContext) -> pb.ClusterInfoResponse:
        status = self._replica.status()
        return pb.ClusterInfoResponse(
            address=status.address, role=status.role, leader=status.leader or "",
            term=status.term, commit_index=status.commit_index,
            last_applied=status.last_applied, cursor_second=status.cursor.second,
            cursor_local_index=status.cursor.local_index, stamp_ms=status.stamp_ms,
            dispatching=status.dispatching)


class PeerService(pb_grpc.PeerServicer):
    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def ReadStateFile(self, request: pb.ReadStateFileRequest,
                      context: grpc.ServicerContext) -> Iterator[pb.FileChunk]:
        offset, end = request.offset, request.offset + request.size
        while offset < end:
            try:
                data = self._replica.read_state_file(request.path, offset,
                                                     min(CHUNK_BYTES, end - offset))
            except (OSError, ValueError) as error:
                context.abort(grpc.StatusCode.NOT_FOUND, str(error))
            if not data:
                return
            yield pb.FileChunk(data=data)
            offset += len(data)


def start_server(replica: Replica, address: str, workers: int = 16) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers,
                                                    thread_name_prefix="tickwheel-grpc"),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    pb_grpc.add_TickwheelServicer_to_server(TickwheelService(replica), server)
    pb_grpc.add_PeerServicer_to_server(PeerService(replica), server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot bind gRPC to {address}")
    server.start()
    return server
