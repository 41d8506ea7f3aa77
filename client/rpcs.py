"""The unary methods of the Tickwheel service the clients call, each typed by its request and
response, so that `Client` and `AsyncClient` dispatch every call through one retrying path and
mypy still knows what each call answers. The names are the service's own
(`proto/tickwheel/v1/tickwheel.proto`); the types are those of the generated stub's attribute
of that name (`TickwheelStub`), which each client reads by name in one place."""

from __future__ import annotations

from typing import Generic, TypeVar

from google.protobuf.message import Message

from tickwheel.v1 import tickwheel_pb2 as pb

RequestT = TypeVar("RequestT", bound=Message)
ResponseT = TypeVar("ResponseT", bound=Message)


class Unary(Generic[RequestT, ResponseT]):
    """A unary method by name; its type parameters are its request and response messages."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


SCHEDULE = Unary[pb.ScheduleRequest, pb.ScheduleResponse]("Schedule")
CANCEL = Unary[pb.CancelRequest, pb.CancelResponse]("Cancel")
RESCHEDULE = Unary[pb.RescheduleRequest, pb.RescheduleResponse]("Reschedule")
CLUSTER_INFO = Unary[pb.ClusterInfoRequest, pb.ClusterInfoResponse]("ClusterInfo")
RECEIVE_MESSAGES = Unary[pb.ReceiveMessagesRequest, pb.ReceiveResponse]("ReceiveMessages")
ACK_MESSAGES = Unary[pb.SettleRequest, pb.SettleResponse]("AckMessages")
CHANGE_INVISIBLE_DURATION = Unary[pb.SettleRequest, pb.SettleResponse]("ChangeInvisibleDuration")
CREATE_GROUP = Unary[pb.GroupRequest, pb.GroupResponse]("CreateGroup")
DELETE_GROUP = Unary[pb.GroupRequest, pb.GroupResponse]("DeleteGroup")
GROW_SHARDS = Unary[pb.GrowShardsRequest, pb.GrowShardsResponse]("GrowShards")
DUE_HISTOGRAM = Unary[pb.DueHistogramRequest, pb.DueHistogramResponse]("DueHistogram")
FINALIZE_UPGRADE = Unary[pb.FinalizeUpgradeRequest, pb.FinalizeUpgradeResponse]("FinalizeUpgrade")
