"""Request-reply's node side (RocketMQ 4.6's ReplyMessageProcessor; docs/protocol.md "Request
and reply"). No socket, no clock: the front (its shell) pushes and sends.

A requester's message carries its clientID in REPLY_TO_CLIENT; a consumer answers it with a
SEND_REPLY_MESSAGE whose message keeps that property (node.client.replies.create_reply). The front
checks the reply as any send, pushes it at once to the connection that producer last sent
HEART_BEAT from (PUSH_REPLY_MESSAGE_TO_CLIENT, unasked, as CHECK_TRANSACTION_STATE goes), then,
with `storeReplyMessageEnable`, stores it as a SEND_MESSAGE to its topic. The replier's answer is
the store's when the push went out; SYSTEM_ERROR naming why when it did not (RocketMQ's answer; the
reply is stored all the same). A push is out when ZeroMQ takes it for a connected requester: the
node does not wait for the requester to read it, as RocketMQ's callClient does.
"""

from __future__ import annotations

from node import protocol
from shm.codec import parse_properties

UNANSWERED = b"\x00mqnode-unanswered"  # the pseudo-client of a reply stored after its replier was answered
# (no peer's id begins with 0)
# what the pushed reply carries of the replier's send header (RocketMQ's ReplyMessageRequestHeader)
PUSHED_FIELDS = ("producerGroup", "topic", "queueId", "sysFlag", "bornTimestamp", "flag", "reconsumeTimes")


def properties_of(header: dict) -> dict[str, str]:
    """A checked send header's properties (an object, or RocketMQ's properties string) as a dict."""
    value = header.get("properties")
    if isinstance(value, str):
        return parse_properties(value)
    return dict(value) if isinstance(value, dict) else {}


def requester(header: dict) -> tuple[str | None, str]:
    """(the requester's clientID, "") or (None, why there is none) from a reply's header."""
    client_id = properties_of(header).get(protocol.PROPERTY_REPLY_TO_CLIENT)
    if not isinstance(client_id, str) or not client_id:
        return None, f"reply message properties[{protocol.PROPERTY_REPLY_TO_CLIENT}] is null"
    return client_id, ""


def push_header(header: dict, store_host: str, now_ms: int) -> dict:
    """PUSH_REPLY_MESSAGE_TO_CLIENT's header for a checked reply (its body goes as the frame after):
    the message's fields, its properties with PUSH_REPLY_TIME, where and when the node took it."""
    pushed = {name: header[name] for name in PUSHED_FIELDS if name in header}
    pushed.update(code=protocol.PUSH_REPLY_MESSAGE_TO_CLIENT, storeHost=store_host, storeTimestamp=now_ms,
                  properties={**properties_of(header), protocol.PROPERTY_PUSH_REPLY_TIME: str(now_ms)})
    return pushed


def not_found(client_id: str) -> str:
    return f"push reply message fail, channel of <{client_id}> not found."


class ReplyStats:
    """What the front did with replies: `admin stats` (front.replies) and the metrics."""

    def __init__(self):
        self.pushed = self.unpushed = 0  # (unpushed: no requester named, none connected, or its queue full)

    def count(self, why: str) -> None:
        if why:
            self.unpushed += 1
        else:
            self.pushed += 1

    def statistics(self) -> dict:
        return {"pushed": self.pushed, "unpushed": self.unpushed}
