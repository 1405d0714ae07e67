"""Pop consumption for the pull consumer (RocketMQ 5's pop; docs/protocol.md "Pop").

`pop` asks the node for up to `max_count` messages of a group from any queue of a topic (or one);
each comes with a receipt handle and stays invisible to the group for `invisible_ms`. `ack`
retires it; `change_invisible` moves its deadline (and gives a new handle: the old one no longer
holds); a message not acked in time is handed out again, `reconsume_times` one higher, and after
the group's retryMaxTimes goes to `%DLQ%<group>`. `PopMethods` is mixed into
`node.client.consumer.AsyncPullConsumer`; `node.client.pop_consumer.PopConsumer` is the
listener-driven form.
"""

from __future__ import annotations

import time

from node import protocol
from node.client.producer import SendError
from node.client.received import PoppedMessage, decode_messages, popped

ACKED, EXPIRED, INVALID = "OK", "RECEIPT_HANDLE_EXPIRED", "INVALID_RECEIPT_HANDLE"


def expression(tags) -> str:
    """A tag expression from None ("*"), "a || b", or tags in a list."""
    if tags is None:
        return "*"
    if isinstance(tags, str):
        return tags
    return "||".join(tags)


class PopMethods:
    """The pop requests, over the consumer's `_ask`; `client.timeout` bounds each wait."""

    last_pop_group: str | None = None

    async def pop(self, topic: str, group: str, *, max_count: int = 32, invisible_ms: int = 60_000,
                  wait_ms: int = 0, tags=None, queue_id: int = -1, orderly: bool = False,
                  from_max: bool = False, expression_type: str = protocol.EXPRESSION_TAG) -> list[PoppedMessage]:
        """Up to `max_count` messages (none: []), each invisible to `group` for `invisible_ms`.
        With `wait_ms` the node holds an empty pop until a message comes or the time is up.
        `orderly`: a queue's messages in order, the next only after the one before is acked. A
        queue never popped by the group starts at its committed offset, else at its first
        message (`from_max`: its end). `tags` is a tag expression, or with
        `expression_type="SQL92"` a SQL92 selector over the messages' properties."""
        exp = expression(tags)
        self.last_pop_group = group  # (a bare receipt handle's group, unless told)
        header = {"code": protocol.POP_MESSAGE, "consumerGroup": group, "topic": topic, "queueId": queue_id,
                  "maxMsgNums": max_count, "invisibleTime": invisible_ms, "pollTime": wait_ms,
                  "bornTime": int(time.time() * 1000), "initMode": 1 if from_max else 0,
                  "expType": expression_type, "exp": exp, "order": orderly}
        reply, body = await self._ask(header, timeout=self.client.timeout + wait_ms / 1000)
        status = reply.get("status")
        if status == "NO_NEW_MSG":
            return []
        if status != "FOUND":
            raise SendError(status or "SYSTEM_ERROR", reply.get("remark", ""))
        messages = popped(body, reply.get("receiptHandles") or [], reply.get("reconsumeTimes") or [], group)
        wanted = protocol.parse_subscription(exp) if expression_type == protocol.EXPRESSION_TAG else None
        if wanted is None:
            return messages
        # the node filters by tag hash: a message whose tag only shares the hash is not ours, and is acked away
        stray = [m for m in messages if m.tags not in wanted]
        if stray:
            await self.ack_batch(stray)
        return [m for m in messages if m.tags in wanted]

    async def peek(self, topic: str, group: str, *, max_count: int = 32, tags=None, queue_id: int = -1,
                   expression_type: str = protocol.EXPRESSION_TAG):
        """What a pop would hand out next, without handing it out (no receipt handles)."""
        header = {"code": protocol.PEEK_MESSAGE, "consumerGroup": group, "topic": topic, "queueId": queue_id,
                  "maxMsgNums": max_count, "expType": expression_type, "exp": expression(tags)}
        reply, body = await self._ask(header)
        if reply.get("status") == "NO_NEW_MSG":
            return []
        if reply.get("status") != "FOUND":
            raise SendError(reply.get("status") or "SYSTEM_ERROR", reply.get("remark", ""))
        return decode_messages(body)

    async def ack(self, message_or_handle, group: str | None = None) -> bool:
        """Retire a popped message: True; False when its handle no longer holds it (its invisible
        time passed, or it was acked or changed: it is or will be handed out again). A handle
        the node never gave raises SendError(INVALID_RECEIPT_HANDLE)."""
        handle, group = _handle_and_group(message_or_handle, group or self.last_pop_group)
        reply, _ = await self._ask({"code": protocol.ACK_MESSAGE, "consumerGroup": group, "extraInfo": handle})
        return _acked(reply.get("status"), reply.get("remark", ""))

    async def ack_batch(self, messages_or_handles, group: str | None = None) -> list[bool]:
        """`ack` of many in one request (one group): each one's answer, in order."""
        items = list(messages_or_handles)
        if not items:
            return []
        pairs = [_handle_and_group(item, group or self.last_pop_group) for item in items]
        groups = {g for _, g in pairs}
        if len(groups) != 1:
            raise ValueError(f"ack_batch takes the messages of one group, not {sorted(groups)}")
        reply, _ = await self._ask({"code": protocol.BATCH_ACK_MESSAGE, "consumerGroup": groups.pop(),
                                    "extraInfos": [h for h, _ in pairs]})
        if reply.get("status") != "OK":
            raise SendError(reply.get("status") or "SYSTEM_ERROR", reply.get("remark", ""))
        return [_acked(status, "") for status in reply.get("results", [])]

    async def change_invisible(self, message_or_handle, invisible_ms: int, group: str | None = None) -> str:
        """The message becomes visible again `invisible_ms` from now (0 < ms); returns its new
        receipt handle (a message given is updated too). Raises SendError when the handle no
        longer holds (RECEIPT_HANDLE_EXPIRED) or never did."""
        handle, group = _handle_and_group(message_or_handle, group or self.last_pop_group)
        reply, _ = await self._ask({"code": protocol.CHANGE_MESSAGE_INVISIBLETIME, "consumerGroup": group,
                                    "extraInfo": handle, "invisibleTime": invisible_ms})
        if reply.get("status") != "OK":
            raise SendError(reply.get("status") or "SYSTEM_ERROR", reply.get("remark", ""))
        if isinstance(message_or_handle, PoppedMessage):
            message_or_handle.receipt_handle = reply["extraInfo"]
        return reply["extraInfo"]

    async def pop_state(self, group: str) -> dict:
        """topic -> queue -> the group's pop state there (inFlight, ready, dying, low, next)."""
        reply, _ = await self._ask({"code": protocol.GET_POP_STATE, "consumerGroup": group})
        if reply.get("status") != "OK":
            raise SendError(reply.get("status") or "SYSTEM_ERROR", reply.get("remark", ""))
        return reply.get("topics", {})


def _handle_and_group(item, group: str | None) -> tuple[str, str]:
    if isinstance(item, PoppedMessage):
        return item.receipt_handle, group or item.consumer_group
    if not isinstance(item, str):
        raise TypeError(f"a popped message or its receipt handle, not {type(item).__name__}")
    if not group:
        raise ValueError("a bare receipt handle needs its group (or a pop by this consumer before)")
    return item, group


def _acked(status: str | None, remark: str) -> bool:
    if status == ACKED:
        return True
    if status == EXPIRED:
        return False
    raise SendError(status or "SYSTEM_ERROR", remark)
