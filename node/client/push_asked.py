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

And what the node tells it: RESET_CONSUMER_CLIENT_OFFSET (`mqnode admin reset-offset` while the
group runs): each queue of the topic it holds starts again from the offset the admin committed.

A mixin of AsyncPushConsumer: `self.pull`, `self.pool`, `self.listener`, `self.orderly`,
`self.group`, `self.queues`, `self.tasks` are the consumer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from node import protocol
from node.client import aio
from node.client.producer import SendError
from node.client.push_state import BROADCASTING, CONSUME_SUCCESS, RETRY_PREFIX, SUCCESS, as_subscribed
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
        if header.get("code") == protocol.RESET_CONSUMER_CLIENT_OFFSET and self.running:
            aio.detach(self._reset_offsets(header))
        if not isinstance(header.get("askId"), str):
            return
        if header.get("code") == protocol.GET_CONSUMER_RUNNING_INFO:
            aio.detach(self._answer(header, runningInfo=running_info(self, stacks=header.get("jstackEnable") is True)))
        elif header.get("code") == protocol.CONSUME_MESSAGE_DIRECTLY and self.running:
            aio.detach(self._consume_directly(header, body or b""))

    async def _reset_offsets(self, header: dict) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET (`mqnode admin reset-offset` while the group runs): each
        queue of the topic this member holds starts again from the offset the admin committed;
        without it the member would go on from its own position and commit over the reset."""
        table = header.get("offsetTable")
        if header.get("consumerGroup") != self.group or not isinstance(table, dict):
            return
        for queue in [q for q in self.queues if q[0] == header.get("topic")]:
            offset = table.get(str(queue[1]))
            if type(offset) is int and offset >= 0:
                await self._reset_queue(queue, offset)
        self.resets += 1

    async def _reset_queue(self, queue: tuple[str, int], offset: int) -> None:
        """The queue starts again from `offset` (the group's offsets were reset: push_asked), as
        RocketMQ's client resets one: what it pulled and has not finished is let go uncommitted."""
        old = self.queues.get(queue)
        if old is None:
            return
        old.reset = True
        await self._let_go(queue, old)
        if self.queues.get(queue) is not old:
            return  # (given up meanwhile)
        if self.options.message_model == BROADCASTING:
            self.local_offsets[f"{queue[0]}@{queue[1]}"] = offset
        self._run(queue, offset, old.locked_at)

    async def _consume_directly(self, header: dict, body: bytes) -> None:
        try:
            message = decode_messages(body)[0]
        except (SendError, IndexError):
            return await self._answer(header, "SYSTEM_ERROR", "the node sent no message this client can read")
        if message.topic == RETRY_PREFIX + self.group:  # (a dead letter keeps %DLQ%, as in RocketMQ)
            as_subscribed(message, message.topic)
        if not self.running:  # (its pool takes no more work)
            return await self._answer(header, "SYSTEM_ERROR", "the consumer is shutting down")
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
