"""What a send returns: `SendResult` (node.client.producer re-exports it)."""

from __future__ import annotations

from typing import NamedTuple

from node import protocol


class SendResult(NamedTuple):
    """Immutable, as a frozen dataclass would be, at a third of its construction cost (a batch
    makes one per message)."""

    status: str
    msg_id: str
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    topic: str = ""
    broker: str = ""  # the broker group that stored it (a client with namesrv=: node.client.routes)
    deliver_at_ms: int | None = None  # a timer's time (send's deliver_at_ms, or delay_ms from the send)

    @property
    def recall_handle(self) -> str | None:
        """A timer message's handle for `recall` (RocketMQ 5's format); None for the others."""
        if self.deliver_at_ms is None:
            return None
        return protocol.recall_handle(self.topic, self.broker, self.deliver_at_ms, self.msg_id)

    def to_json(self) -> dict:
        out = {"status": self.status, "msgId": self.msg_id, "offsetMsgId": self.offset_msg_id,
               "queueId": self.queue_id, "queueOffset": self.queue_offset}
        if self.broker:
            out["brokerName"] = self.broker
        if self.deliver_at_ms is not None:
            out["recallHandle"] = self.recall_handle
        return out
