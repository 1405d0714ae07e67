"""The push consumer's concurrent half (node.client.push): each pulled batch on a pool thread, the
listener over `consume_message_batch_max_size` messages at a time; what it fails handed back to the
node (then %RETRY%, later %DLQ%), as RocketMQ's ConsumeMessageConcurrentlyService does. A mixin of
AsyncPushConsumer: it uses the consumer's `pull`, `group`, `queues`, `pool`, `listener`,
`statuses`, `options`, `running`, `stopping` and counters."""

from __future__ import annotations

import asyncio
import time

from node.client import aio
from node.client.producer import SendError
from node.client.push_state import BROADCASTING, LOCAL_RETRY_S, RECONSUME_LATER, ProcessQueue
from node.client.received import ReceivedMessage


class Concurrently:
    def _consume_concurrently(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        """`messages` to the pool; `_concurrent_done` settles them on the loop."""
        size = self.options.consume_message_batch_max_size
        future = asyncio.get_running_loop().run_in_executor(self.pool, self._call_concurrently, messages, size)
        future.add_done_callback(lambda f: self._concurrent_done(pq, messages, f))

    def _call_concurrently(self, messages: list[ReceivedMessage], size: int) -> tuple[list, list, int, float]:
        """On a pool thread: the listener over `messages`, `size` at a time, until the consumer is
        `stopping` (the rest are the next member's); those it consumed, those to hand back, the
        calls made and the seconds they took."""
        consumed, failed, calls, started = [], [], 0, time.monotonic()
        for start in range(0, len(messages), size):
            if self.stopping:
                break
            chunk = messages[start:start + size]
            calls += 1
            try:
                status = self.listener(chunk)
            except Exception:  # the listener's bug: RocketMQ counts it as RECONSUME_LATER
                status = RECONSUME_LATER
            (consumed if self.statuses.succeeded(status) else failed).extend(chunk)
        return consumed, failed, calls, time.monotonic() - started

    def _concurrent_done(self, pq: ProcessQueue, messages: list[ReceivedMessage], future) -> None:
        if future.cancelled():
            return
        consumed, failed, calls, seconds = future.result()  # (the listener's exceptions are caught: one here is our bug)
        self.consumed += len(consumed)
        self.failed += len(failed)
        pq.last_consume_ms = int(time.time() * 1000)
        self.topic_stats(pq.topic).consumed(len(consumed), len(failed), calls, seconds * 1000)
        pq.done(m.queue_offset for m in consumed)
        if failed and self.options.message_model == BROADCASTING:
            pq.done(m.queue_offset for m in failed)  # broadcasting has no retry, as in RocketMQ: dropped, counted
        elif failed and not self.stopping:
            aio.detach(self._hand_back(pq, failed))
        # (failed or not offered while shutting down: not handed back, not committed; the next member's)

    async def _hand_back(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        """RECONSUME_LATER: back to the node (then %RETRY%, later %DLQ%); if the node refuses,
        consumed here again after LOCAL_RETRY_S, never lost."""
        again = []
        for message in messages:
            try:
                await self.pull.send_back(message, self.group, max_reconsume_times=self.options.max_reconsume_times)
                self.sent_back += 1
                pq.done([message.queue_offset])
            except SendError:
                again.append(message)
        if again and not pq.dropped:
            self.local_retries += len(again)
            await asyncio.sleep(LOCAL_RETRY_S)
            if not pq.dropped and self.running:
                self._consume_concurrently(pq, again)

    async def _clean_expired(self) -> None:
        """A message with the listener for longer than `consume_timeout` minutes is handed back
        and counted done (RocketMQ's cleanExpireMsg), so one stuck call cannot hold the offset."""
        if self.orderly:
            return
        oldest = time.monotonic() - self.options.consume_timeout * 60
        for pq in list(self.queues.values()):
            stale = [message for message, _, given in list(pq.pending.values()) if given < oldest]
            if stale:
                await self._hand_back(pq, stale[:16])
