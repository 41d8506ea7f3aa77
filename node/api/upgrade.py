"""``FinalizeUpgrade``: an admin has the cluster write this release's formats from now on
(`tickwheel.common.versions` has the rule, `tickwheel.replication.upgrade` the check).

Called on the leader through `tickwheel.node.api.calls.LeaderCalls` (a follower forwards
it); the answer comes once the ``finalize`` command is applied, or at once when the cluster
is at this version already.
"""

from __future__ import annotations

from tickwheel.common.errors import PermissionDenied
from tickwheel.node.api.commits import applied
from tickwheel.node.api.context import NodeContext
from tickwheel.node.security.access import Action, Principal
from tickwheel.v1 import tickwheel_pb2 as pb


async def finalize_upgrade(node: NodeContext, request: pb.FinalizeUpgradeRequest,
                           principal: Principal) -> pb.FinalizeUpgradeResponse:
    """Propose this build's cluster version (refused while a member is older)."""
    if not principal.unlimited(Action.ADMIN):
        raise PermissionDenied("cluster_version", f"principal {principal.name!r} may not "
                               "finalize an upgrade: that takes an admin grant on every topic")
    version = await applied(node.replica.upgrade.finalize())
    return pb.FinalizeUpgradeResponse(cluster_version=version)
