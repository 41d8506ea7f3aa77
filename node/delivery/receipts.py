"""Which leases a consumer's receipts may settle, and the count of those refused.

A receipt of a message sent to this very consumer names its lease without decoding. Any other
receipt is decoded; one of another group, or one that does not decode, is refused here (and
counted, and logged now and then), and one never granted is refused when the ack is applied.
Either way it changes nothing.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

from tickwheel.common.errors import TickwheelError
from tickwheel.node.delivery.sessions import Session
from tickwheel.node.ops.metrics import Metrics
from tickwheel.replication import Groups, LeaseRef, decode_receipt

log = logging.getLogger("tickwheel.delivery")


class Receipts:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self.refused = 0
        """Receipts refused since the node started."""

    def own_leases(self, consumer: Session, receipts: list[str], groups: Groups,
                   shard: int) -> list[LeaseRef]:
        """The leases of these receipts, less those of another group (refused here). A
        receipt of a group that is gone goes on: its lease ended with the group, and the
        replica answers it as it answers any stale receipt."""
        leases = []
        for index, receipt in enumerate(receipts):
            sent = consumer.unacked.pop(receipt, None)
            if sent is not None:  # sent to this very consumer: its lease, no decoding
                leases.append(sent.delivery.lease)
                continue
            try:
                lease = decode_receipt(receipt, f"ack.receipts[{index}]", shard)
            except TickwheelError:
                lease = None
            group = groups.by_id(lease.group_id) if lease is not None else None
            if lease is None or (group is not None
                                 and (group.topic, group.name) != (consumer.topic,
                                                                   consumer.group)):
                self._refused(consumer, receipt, "not a receipt of this group")
                continue
            leases.append(lease)
        return leases

    def _refused(self, consumer: Session, receipt: str, why: str) -> None:
        self.refused += 1
        self._metrics.refused_receipts.inc()
        if self.refused <= 10 or self.refused % 1000 == 0:
            log.warning("event=receipt_refused topic=%s group=%r consumer=%r receipt=%r "
                        "reason=%r refused=%d", consumer.topic, consumer.group, consumer.name,
                        receipt[:64], why, self.refused)

    def acked(self, topic: str, done: Future[list[bool]]) -> None:
        """The replica's answer to an ack: which receipts named a current lease."""
        if done.exception() is not None:
            return  # leadership ended: the next leader has the leases
        results = done.result()
        taken = sum(results)
        if taken:
            self._metrics.acked.labels(self._metrics.topic(topic)).inc(taken)
        refused = len(results) - taken
        if refused:
            self.refused += refused
            self._metrics.refused_receipts.inc(refused)
