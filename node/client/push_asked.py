"""What the node asks a push consumer on an admin's behalf (docs/protocol.md "Consumer groups"),
answered with CLIENT_ANSWER over the member's own connection:

- GET_CONSUMER_RUNNING_INFO (`mqnode admin consumer-status`): its own view
  (node.client.running_info);
- CONSUME_MESSAGE_DIRECTLY (`mqnode query --msg-id ID --group G --client-id C`, RocketMQ's
  consumeMessageDirectly): the stored message the node read and sent along goes to the listener
  now, on the consumer's pool, and the answer says how the listener took it, as RocketMQ's
  ConsumeMessageDirectlyResult: `consumeResult` CR_SUCCESS, CR_LATER, CR_RETURN_NULL (it
  returned no status) or CR_THROW_EXCEPTION (the remark names the exception), `order`,
  `autoCommit`, `spentTimeMills`. Nothing else follows from it: no offset is committed and
  nothing is handed back to the node, whatever the listener says (a message of the group's
  %RETRY% topic is shown under its own topic, as the listener sees it in a pull; one of %DLQ%
  under %DLQ%, as RocketMQ does).

A mixin of AsyncPushConsumer: `self.pull`, `self.pool`, `self.listener`, `self.orderly`,
`self.group` are the consumer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from node import protocol
from node.client import aio
from node.client.producer import SendError
from node.client.push_state import CONSUME_SUCCESS, RETRY_PREFIX, SUCCESS, as_subscribed
from node.client.received import decode_messages
from node.client.running_info import ConsumeStats, running_info

RESULTS = {CONSUME_SUCCESS: "CR_SUCCESS", SUCCESS: "CR_SUCCESS", None: "CR_RETURN_NULL"}  # else CR_LATER


class Asked:
    def topic_stats(self, topic: str) -> ConsumeStats:
        """One topic's pulls and consumption (running info's statusTable)."""
        stats = self.consume_stats.get(topic)
        if stats is None:
            stats = self.consume_stats[topic] = ConsumeStats()
        return stats

    def _on_node_request(self, header: dict, body: bytes | None) -> None:
        if not isinstance(header.get("askId"), str):
            return
        if header.get("code") == protocol.GET_CONSUMER_RUNNING_INFO:
            aio.detach(self._answer(header, runningInfo=running_info(self, stacks=header.get("jstackEnable") is True)))
        elif header.get("code") == protocol.CONSUME_MESSAGE_DIRECTLY and self.running:
            aio.detach(self._consume_directly(header, body or b""))

    async def _consume_directly(self, header: dict, body: bytes) -> None:
        try:
            message = decode_messages(body)[0]
        except (SendError, IndexError):
            return await self._answer(header, "SYSTEM_ERROR", "the node sent no message this client can read")
        if message.topic == RETRY_PREFIX + self.group:  # (a dead letter keeps %DLQ%, as in RocketMQ)
            as_subscribed(message, message.topic)
        started = time.monotonic()
        result, remark = await asyncio.get_running_loop().run_in_executor(self.pool, self._call_directly, message)
        await self._answer(header, consumeResult={
            "order": self.orderly, "autoCommit": True, "consumeResult": result, "remark": remark,
            "spentTimeMills": int((time.monotonic() - started) * 1000)})

    def _call_directly(self, message) -> tuple[str, str]:
        """On a pool thread: the listener over the one message."""
        try:
            status = self.listener([message])
        except Exception as e:  # the listener's, reported as RocketMQ reports it
            return "CR_THROW_EXCEPTION", f"{type(e).__name__}: {e}"
        return RESULTS.get(status, "CR_LATER"), "" if status is None else str(status)

    async def _answer(self, header: dict, status: str = "OK", remark: str = "", **answered) -> None:
        """CLIENT_ANSWER to the ask `header`: OK with its one object (runningInfo or consumeResult),
        or a status and remark."""
        answer = {"code": protocol.CLIENT_ANSWER, "askId": header["askId"], "status": status, "remark": remark,
                  **answered}
        with contextlib.suppress(SendError):  # (the node is gone: the admin is answered by its timeout)
            await self.pull.client.tell(answer)
