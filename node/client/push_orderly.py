"""The push consumer's orderly half (node.client.push): queue locks on the node, and each locked
queue consumed one batch at a time, in order, suspending and retrying locally as RocketMQ's
ConsumeMessageOrderlyService does. A mixin of AsyncPushConsumer: it uses the consumer's
`pull`, `group`, `client_id`, `queues`, `pool`, `listener`, `options` and counters."""

from __future__ import annotations

import asyncio
import time

from node import protocol
from node.client import aio
from node.client.producer import SendError
from node.client.push_state import LOCK_RENEW_S, SUSPEND_CURRENT_QUEUE_A_MOMENT, ProcessQueue
from node.client.received import ReceivedMessage


class Orderly:
    # -- orderly locks -------------------------------------------------------------------------------

    async def _lock(self, queues: list[tuple[str, int]]) -> list[tuple[str, int]]:
        try:
            reply = await self._ask({"code": protocol.LOCK_BATCH_MQ, "consumerGroup": self.group,
                                     "clientID": self.client_id,
                                     "mqSet": [{"topic": t, "queueId": q} for t, q in queues]})
        except SendError:
            return []
        live_ms = reply.get("lockMaxLiveTime")
        if live_ms:  # renew three times within the node's limit; trust a lock for half of it
            self.lock_renew_s, self.lock_valid_s = min(LOCK_RENEW_S, live_ms / 3000), min(1.5 * LOCK_RENEW_S, live_ms / 2000)
        return [(m["topic"], m["queueId"]) for m in reply.get("lockOKMQSet", [])]

    async def _lock_all(self) -> None:
        held = set(await self._lock(sorted(self.queues)))
        now = time.monotonic()
        for queue, pq in self.queues.items():
            if queue in held:
                pq.locked_at = now

    async def _unlock(self, queues: list[tuple[str, int]]) -> None:
        try:
            await self._ask({"code": protocol.UNLOCK_BATCH_MQ, "consumerGroup": self.group, "clientID": self.client_id,
                             "mqSet": [{"topic": t, "queueId": q} for t, q in queues]})
        except SendError:
            pass  # it lapses on the node after rebalanceLockMaxLiveTime

    # -- orderly consumption -------------------------------------------------------------------------

    async def _consume_orderly(self, pq: ProcessQueue) -> None:
        loop, options = asyncio.get_running_loop(), self.options
        try:
            while pq.buffer and not pq.dropped and self.running:
                if not pq.lock_valid(self.lock_valid_s):
                    await asyncio.sleep(0.1)  # not ours (any longer): wait for the lock's renewal or a rebalance
                    continue
                batch = [pq.buffer[i] for i in range(min(options.consume_message_batch_max_size, len(pq.buffer)))]
                pq.in_listener = True
                started = time.monotonic()
                try:
                    status = await loop.run_in_executor(self.pool, self._call_orderly, batch)
                finally:
                    pq.in_listener = False
                pq.last_consume_ms = int(time.time() * 1000)
                ok = self.statuses.succeeded(status)
                self.topic_stats(pq.topic).consumed(len(batch) if ok else 0, 0 if ok else len(batch), 1,
                                                    (time.monotonic() - started) * 1000)
                if pq.dropped or (self.stopping and not ok):  # (a suspension while shutting down: the next member's)
                    return
                if ok or await self._suspended_too_often(pq, batch):
                    for _ in batch:
                        pq.buffer.popleft()
                    pq.done(m.queue_offset for m in batch)
                    self.consumed += len(batch)
                else:
                    self.failed += len(batch)
                    await asyncio.sleep(options.suspend_current_queue_time_millis / 1000)
        finally:
            pq.consuming = False
            if pq.buffer and not pq.dropped and self.running:  # (arrived while we were leaving)
                pq.consuming = True
                aio.detach(self._consume_orderly(pq))

    def _call_orderly(self, batch: list[ReceivedMessage]) -> str:
        try:
            return self.listener(batch)
        except Exception:
            return SUSPEND_CURRENT_QUEUE_A_MOMENT

    async def _suspended_too_often(self, pq: ProcessQueue, batch: list[ReceivedMessage]) -> bool:
        """Count a suspension; past max_reconsume_times the batch goes to the DLQ (and is done)."""
        tries = pq.tries
        key = batch[0].queue_offset
        tries[key] = tries.get(key, 0) + 1
        if self.options.max_reconsume_times < 0 or tries[key] <= self.options.max_reconsume_times:
            return False
        for message in batch:
            try:
                await self.pull.send_back(message, self.group, delay_level=-1)  # straight to %DLQ%
                self.sent_back += 1
            except SendError:
                return False  # offered again, later
        tries.pop(key, None)
        return True
