"""The push consumer: RocketMQ's DefaultMQPushConsumer over mqnode's protocol.

A member of a consumer group. It tells the node it is there (HEART_BEAT every
`heartbeat_interval` s), learns the group's members (GET_CONSUMER_LIST_BY_GROUP) and computes its
own share of each subscribed topic's queues (`node.client.allocate`), again whenever the node
says the group changed (NOTIFY_CONSUMER_IDS_CHANGED) and every `rebalance_interval` s anyway.
For each queue it holds, a pull loop long-polls the node and buffers what comes in a
`ProcessQueue`, which also keeps the offset to commit: the lowest offset whose message is not
done (so a crash redelivers from there, never skips). Flow control: a queue whose buffer holds
more than `pull_threshold_for_queue` messages or `pull_threshold_size_for_queue` MiB is not pulled
until it drains.

Concurrently (`register_listener(fn)`): each pulled batch goes to a thread pool of
`consume_thread_max` threads, which calls `fn` with up to `consume_message_batch_max_size`
messages at a time; CONSUME_SUCCESS completes them, RECONSUME_LATER (or an exception) hands them
back to the node (CONSUMER_SEND_MSG_BACK: they return through `%RETRY%<group>`, which a
clustering member subscribes by itself, and go to `%DLQ%<group>` after `max_reconsume_times`); a
hand-back the node refuses is consumed again here 5 s later rather than lost.

Orderly (`register_listener(fn, orderly=True)`): a queue is consumed only while this member
holds its lock on the node (LOCK_BATCH_MQ, renewed every 20 s; it lapses on the node after
`rebalanceLockMaxLiveTime`), one batch at a time, in queue order. SUCCESS commits;
SUSPEND_CURRENT_QUEUE_A_MOMENT waits `suspend_current_queue_time_millis` and offers the same
messages again, up to `max_reconsume_times` (then they go to the DLQ). A member that can no
longer renew its lock stops before its next message.

Shutdown: the listener's calls under way finish; what is buffered besides, and what a listener
fails once the consumer is `stopping`, is neither handed back nor committed: the group's next
member consumes it (RocketMQ's shutdown leaves its buffered messages the same way).

Offsets: CLUSTERING commits to the node (every `persist_interval` s, when a queue is given up,
and at `shutdown`); BROADCASTING (every member gets every message) keeps them in a local file
per client, `<offset_store_dir>/<client id>/<group>/offsets.json`, as RocketMQ does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path

from node import protocol
from node.client import aio
from node.client.allocate import allocate
from node.client.consumer import AsyncPullConsumer
from node.client.producer import SendError
from node.client.push_concurrent import Concurrently
from node.client.push_membership import OUT_OF_REACH, Membership
from node.client.push_orderly import Orderly
from node.client.push_asked import Asked
from node.client.running_info import ConsumeStats
from node.client.push_state import (  # (the listener's statuses and the models, for users of this module)
    BROADCASTING,
    CLUSTERING,
    CONSUME_SUCCESS,
    FLOW_CONTROL_S,
    LOCK_RENEW_S,
    PULL_ERROR_S,
    PULL_SUSPEND_MS,
    RECONSUME_LATER,
    RETRY_PREFIX,
    SUCCESS,
    SUSPEND_CURRENT_QUEUE_A_MOMENT,
    ListenerStatuses,
    ProcessQueue,
    PushOptions,
    as_subscribed,
    load_offsets,
    save_offsets,
)
from node.client.received import ReceivedMessage
from node.client.uniq_keys import local_ip

__all__ = ["AsyncPushConsumer", "PushConsumer", "PushOptions", "ProcessQueue", "CONSUME_SUCCESS", "RECONSUME_LATER",
           "SUCCESS", "SUSPEND_CURRENT_QUEUE_A_MOMENT", "CLUSTERING", "BROADCASTING"]

log = logging.getLogger("mqnode.push")


class AsyncPushConsumer(Membership, Orderly, Concurrently, Asked):
    def __init__(self, endpoint: str, group: str, **options):
        known = {f.name for f in fields(PushOptions)}
        unknown = set(options) - known
        if unknown:
            raise TypeError(f"unknown PushConsumer options: {', '.join(sorted(unknown))}")
        self.options = PushOptions(**options)
        self.options.check()
        protocol.check_group(group)
        self.endpoint, self.group = endpoint, group
        instance = self.options.instance_name or str(os.getpid())
        self.client_id = f"{local_ip()}@{instance}"
        self.subscriptions: dict[str, str] = {}
        self.expression_types: dict[str, str] = {}  # topic -> TAG or SQL92 (TAG when absent)
        self.errors_told: set[tuple[str, str, str]] = set()  # (what, status, remark) said once (`_tell`)
        self.listener: Callable | None = None
        self.statuses = ListenerStatuses(CONSUME_SUCCESS, RECONSUME_LATER, log)
        self.orderly = False
        self.queues: dict[tuple[str, int], ProcessQueue] = {}
        self.tasks: dict[tuple[str, int], asyncio.Task] = {}
        self.pull: AsyncPullConsumer | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.background: list[asyncio.Task] = []
        self.rejoining: asyncio.Task | None = None  # heartbeats after the connection dropped (`_on_lost`)
        self.rebalance_wanted: asyncio.Event | None = None  # (made on the consumer's loop, in start)
        self.running = False
        self.stopping = False  # (from shutdown's first step: a listener may watch it, node.tools.cli_groups)
        self.consumed = self.failed = self.sent_back = self.local_retries = self.rebalances = self.resets = 0
        self.local_offsets: dict[str, int] = {}
        # what the node says about its timeouts (HEART_BEAT's and LOCK_BATCH_MQ's replies) narrows these
        self.heartbeat_s = self.options.heartbeat_interval
        self.lock_renew_s, self.lock_valid_s = LOCK_RENEW_S, 1.5 * LOCK_RENEW_S
        self.on_pull_failure: Callable[[], None] | None = None  # (a cluster's member: its routes asked again)
        self.consume_stats: dict[str, ConsumeStats] = {}  # topic -> its pulls and consumption (running info)
        self.started_ms = 0

    # -- set-up ---------------------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = protocol.EXPRESSION_TAG) -> None:
        """Consume `topic`'s messages that `expression` selects: a tag expression ("*",
        "TagA || TagB"), or with `expression_type="SQL92"` a SQL92 selector over their
        properties (RocketMQ's MessageSelector.bySql; the node needs enablePropertyFilter)."""
        protocol.check_expression(expression, expression_type)  # ValueError for a malformed one
        self.subscriptions[topic] = expression
        self.expression_types[topic] = expression_type
        if self.running:  # (after start: on the consumer's loop)
            self._in_background(self._subscribed())

    def unsubscribe(self, topic: str) -> None:
        """Consume `topic` no more (RocketMQ's unsubscribe): after start its queues are given up
        (their offsets committed) and the group is told at once."""
        if topic.startswith(RETRY_PREFIX) and self.options.message_model == CLUSTERING:
            raise ValueError(f"{topic} is the group's own retry topic: it is consumed while the consumer runs")
        self.subscriptions.pop(topic, None)
        self.expression_types.pop(topic, None)
        if self.running:
            self._in_background(self._subscribed())

    def register_listener(self, listener: Callable[[list[ReceivedMessage]], str], *, orderly: bool = False) -> None:
        self.listener, self.orderly = listener, orderly
        self.statuses = (ListenerStatuses(SUCCESS, SUSPEND_CURRENT_QUEUE_A_MOMENT, log) if orderly
                         else ListenerStatuses(CONSUME_SUCCESS, RECONSUME_LATER, log))

    async def start(self) -> AsyncPushConsumer:
        if self.listener is None or not self.subscriptions:
            raise ValueError("subscribe() and register_listener() before start()")
        if self.options.message_model == CLUSTERING:
            self.subscriptions.setdefault(RETRY_PREFIX + self.group, "*")
        else:
            self.local_offsets = load_offsets(self._offsets_file())
        self.pull = AsyncPullConsumer(self.endpoint, timeout=self.options.timeout, credentials=self.options.credentials)
        await self.pull.start()
        self.pull.client.on_notice = self._on_notice
        self.pull.client.on_request = self._on_node_request  # (node.client.push_asked)
        self.pull.client.lost_listeners.append(self._on_lost)
        self.pool = ThreadPoolExecutor(self.options.consume_thread_max, thread_name_prefix=f"mqnode-consume-{self.group}")
        self.rebalance_wanted = asyncio.Event()
        self.running, self.stopping = True, False
        self.started_ms = int(time.time() * 1000)
        await self._heartbeat()
        await self._rebalance()
        self.background = [asyncio.create_task(coroutine) for coroutine in (
            self._every(lambda: self.heartbeat_s, self._heartbeat), self._rebalancer(),
            self._every(lambda: self.options.persist_interval, self._persist),
            self._every(lambda: 60.0, self._clean_expired))]
        if self.orderly:
            self.background.append(asyncio.create_task(self._every(lambda: self.lock_renew_s, self._lock_all)))
        return self

    async def shutdown(self) -> None:
        """Stop pulling, let the listeners finish what they hold, commit, leave the group (unlocking).
        What is buffered but not yet with a listener is left, uncommitted, to the group's next member;
        so is what a listener fails from now on (`stopping`): it is not handed back."""
        if not self.running:
            return
        self.running, self.stopping = False, True
        # Batches not yet with the listener are not consumed (as RocketMQ's shutdown leaves them): their
        # offsets are not committed, so the group's next member gets them. Draining them made a shutdown
        # with a backlog take the listener's time for each buffered message. (Nothing is handed to the
        # pool from here: each hand-off is made only while `running`.)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for task in self.background:
            task.cancel()
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.background, *self.tasks.values(), return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.pool.shutdown, True)  # (the calls under way)
        await asyncio.sleep(0)  # (the last listeners' completions run)
        await self._persist()
        try:
            if self.orderly:
                await self._unlock(list(self.queues))
            await self._ask({"code": protocol.UNREGISTER_CLIENT, "clientID": self.client_id,
                             "consumerGroup": self.group})
        except SendError:
            pass  # the node is gone: it drops us after clientChannelExpiredTimeout
        await self.pull.close()

    # -- membership and rebalancing ------------------------------------------------------------------

    def _pull_failed(self, pq: ProcessQueue, error: SendError) -> None:
        """A pull refused: tried again after PULL_ERROR_S; said once per status and remark (a
        subscription the node refuses, a SQL92 one on a node without enablePropertyFilter, would
        otherwise fail in silence)."""
        self._tell("pulls", error, f"pulls of {pq.topic} queue {pq.queue_id} for group {self.group} fail: {error}")

    async def _rebalancer(self) -> None:
        while self.running:
            try:  # (asyncio.timeout: Python 3.11's wait_for loses a cancel that meets the event being set)
                async with asyncio.timeout(self.options.rebalance_interval):
                    await self.rebalance_wanted.wait()
            except TimeoutError:
                pass
            if not self.running:
                return
            self.rebalance_wanted.clear()
            await self._rebalance()

    async def _rebalance(self) -> None:
        self.rebalances += 1
        await self._persist()  # a queue given up now is taken over from an offset as fresh as can be
        wanted: set[tuple[str, int]] = set()
        try:
            members = [] if self.options.message_model == BROADCASTING else (await self._ask(
                {"code": protocol.GET_CONSUMER_LIST_BY_GROUP, "consumerGroup": self.group})).get("consumerIdList", [])
            for topic in sorted(self.subscriptions):
                count = await self._queue_count(topic)
                queues = [(topic, q) for q in range(count)]
                if self.options.message_model == BROADCASTING:
                    wanted.update(queues)
                elif members:  # (an empty list: the node restarted and has not heard from us yet)
                    wanted.update(allocate(self.options.allocate_strategy, self.client_id, queues, members))
                else:
                    wanted.update(q for q in self.queues if q[0] == topic)
        except SendError as e:  # keep what we have, try again later
            if e.status not in OUT_OF_REACH:
                self._tell("rebalances", e, f"group {self.group} cannot rebalance: {e}")
            return
        dropped = [q for q in self.queues if q not in wanted]
        for queue in dropped:
            await self._drop(queue)
        gained = sorted(wanted - set(self.queues))
        if self.orderly and gained:
            gained = await self._lock(gained)
        for queue in gained:
            await self._take(queue)
        if gained or dropped:
            await self._heartbeat()  # (so `admin group` shows the new share)

    async def _queue_count(self, topic: str) -> int:
        if topic.startswith(RETRY_PREFIX):
            return 1  # a group's retry topic has one queue (the node makes it on the first send-back)
        # (the route makes the topic, as it always did: a member started before the first send then
        # holds its queues from offset 0; one that found no topic would start them at the offset
        # they had when a send made it, after the first messages, which CONSUME_FROM_LAST_OFFSET skips)
        reply, _ = await self.pull.client.request({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": topic})
        if reply.get("status") == "TOPIC_NOT_EXIST":
            return 0
        if reply.get("status") != "OK":
            raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))
        return reply.get("readQueueNums", reply.get("writeQueueNums", 0))

    async def _take(self, queue: tuple[str, int]) -> None:
        offset = await self._start_offset(*queue)
        self._run(queue, offset, time.monotonic() if self.orderly else 0.0)

    def _run(self, queue: tuple[str, int], offset: int, locked_at: float) -> None:
        """The queue consumed from `offset` on: its process queue and its pull loop."""
        pq = self.queues[queue] = ProcessQueue(queue[0], queue[1], offset, committed=offset, locked_at=locked_at)
        self.tasks[queue] = asyncio.create_task(self._pull_loop(pq))

    async def _drop(self, queue: tuple[str, int]) -> None:
        pq = self.queues.pop(queue)
        await self._let_go(queue, pq)  # (an orderly batch ends before another member may lock the queue)
        await self._commit(pq)
        if self.orderly and not pq.in_listener:  # (still in it: the lock lapses on the node instead)
            await self._unlock([queue])

    async def _let_go(self, queue: tuple[str, int], pq: ProcessQueue) -> None:
        """No more pulls or listener calls for `pq`; orderly, its batch with the listener finishes
        first (one batch of a queue at a time, here or on the next member), for at most two lock
        renewals."""
        pq.dropped = True
        task = self.tasks.pop(queue, None)
        if task is not None:
            task.cancel()
        if self.orderly:
            deadline = time.monotonic() + 2 * self.lock_renew_s
            while pq.in_listener and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

    async def _start_offset(self, topic: str, queue_id: int) -> int:
        if self.options.message_model == BROADCASTING:
            stored = self.local_offsets.get(f"{topic}@{queue_id}")
        else:
            stored = await self.pull.committed(self.group, topic, queue_id)
        if stored is not None and stored >= 0:
            return stored
        where = self.options.consume_from_where.removeprefix("CONSUME_FROM_")
        if topic.startswith(RETRY_PREFIX) or where == "FIRST_OFFSET":
            return await self.pull.min_offset(topic, queue_id)
        if where == "TIMESTAMP":  # the first message stored at or after it (RocketMQ 4.9 took the nearest, maybe earlier)
            at = self.options.consume_timestamp or int(time.time() * 1000) - 30 * 60 * 1000
            return await self.pull.offset_from(topic, queue_id, at)
        return await self.pull.max_offset(topic, queue_id)

    # -- pulling -------------------------------------------------------------------------------------

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        options = self.options
        threshold_size = options.pull_threshold_size_for_queue * 1024 * 1024
        expression = self.subscriptions.get(pq.topic, "*")
        expression_type = self.expression_types.get(pq.topic, protocol.EXPRESSION_TAG)
        while not pq.dropped:
            if len(pq.pending) > options.pull_threshold_for_queue or pq.size > threshold_size:
                await asyncio.sleep(FLOW_CONTROL_S)  # flow control: let the listeners catch up
                continue
            commit = None
            if options.message_model == CLUSTERING and pq.commit_offset() != pq.committed:
                commit = pq.commit_offset()  # each pull commits what is done (RocketMQ's FLAG_COMMIT_OFFSET)
            started = time.monotonic()
            try:
                result = await self.pull.pull(pq.topic, pq.queue_id, pq.next_offset, max_count=options.pull_batch_size,
                                              subscription=expression, suspend_ms=PULL_SUSPEND_MS, group=self.group,
                                              commit_offset=commit, expression_type=expression_type)
                if commit is not None:
                    pq.committed = commit
            except SendError as e:
                self._pull_failed(pq, e)
                if self.on_pull_failure is not None:
                    self.on_pull_failure()
                await asyncio.sleep(PULL_ERROR_S)
                continue
            if pq.dropped:
                return
            if result.status == "OFFSET_ILLEGAL":  # cleaned below us, or past the end: go on from the node's word
                pq.next_offset = min(max(pq.next_offset, result.min_offset), result.max_offset)
                continue
            messages = result.messages
            pq.next_offset = result.next_begin_offset
            pq.last_pull_ms = int(time.time() * 1000)
            self.topic_stats(pq.topic).pulled(len(messages), (time.monotonic() - started) * 1000)
            if messages:
                self._deliver(pq, messages)

    def _deliver(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        if not self.running:  # (a pull answered while shutting down: its messages are not done, the next member's)
            return
        for message in messages:
            as_subscribed(message, pq.topic)  # the listener sees the topic it subscribed
        pq.add(messages)
        if self.orderly:
            pq.buffer.extend(messages)
            if not pq.consuming:
                pq.consuming = True
                aio.detach(self._consume_orderly(pq))
            return
        self._consume_concurrently(pq, messages)

    # -- offsets -------------------------------------------------------------------------------------

    async def _every(self, seconds, action) -> None:
        while True:
            await asyncio.sleep(seconds())
            await action()

    async def _persist(self) -> None:
        for pq in list(self.queues.values()):
            await self._commit(pq)
        if self.options.message_model == BROADCASTING:
            save_offsets(self._offsets_file(), self.local_offsets)

    async def _commit(self, pq: ProcessQueue) -> None:
        offset = pq.commit_offset()
        if offset == pq.committed or pq.reset:
            return
        if self.options.message_model == BROADCASTING:
            self.local_offsets[f"{pq.topic}@{pq.queue_id}"] = offset
            pq.committed = offset
            return
        try:
            await self.pull.commit(self.group, pq.topic, pq.queue_id, offset)
            pq.committed = offset
        except SendError:
            pass  # committed at the next persist

    def _offsets_file(self) -> Path:
        return Path(os.path.expanduser(self.options.offset_store_dir)) / self.client_id / self.group / "offsets.json"


    def statistics(self) -> dict:
        return {"clientId": self.client_id, "group": self.group, "queues": sorted(self.queues),
                "consumed": self.consumed, "failed": self.failed, "sentBack": self.sent_back,
                "localRetries": self.local_retries, "rebalances": self.rebalances, "resets": self.resets,
                "cached": {f"{t}@{q}": len(pq.pending) for (t, q), pq in sorted(self.queues.items())}}


class PushConsumer:
    """The blocking push consumer: an AsyncPushConsumer on a private event-loop thread; the
    listener runs on its pool's threads."""

    def __init__(self, endpoint: str | None = None, group: str | None = None, *, namesrv=None, **options):
        if (endpoint is None) == (namesrv is None) or not group:
            raise ValueError("a push consumer takes a group and endpoint= (one node) or namesrv= (a cluster)")
        protocol.check_group(group)  # (before its loop thread starts)
        self.loop = aio.new_event_loop()
        self.thread = aio.start_loop_thread(self.loop, f"mqnode-push-{group}")
        self.inner = self._call(self._make(endpoint, namesrv, group, options))

    @staticmethod
    async def _make(endpoint: str | None, namesrv, group: str, options: dict):
        if namesrv is not None:  # a member across a cluster's broker groups
            from node.client.cluster_push import AsyncClusterPushConsumer

            return AsyncClusterPushConsumer(namesrv, group, **options)
        return AsyncPushConsumer(endpoint, group, **options)

    def _call(self, coroutine):
        return self.thread.submit(coroutine).result()

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = protocol.EXPRESSION_TAG) -> None:
        async def on_loop() -> None:  # (after start the subscription is the loop's to change)
            self.inner.subscribe(topic, expression, expression_type)

        self._call(on_loop())

    def unsubscribe(self, topic: str) -> None:
        async def on_loop() -> None:
            self.inner.unsubscribe(topic)

        self._call(on_loop())

    def register_listener(self, listener, *, orderly: bool = False) -> None:
        self.inner.register_listener(listener, orderly=orderly)

    def start(self) -> PushConsumer:
        self._call(self.inner.start())
        return self

    @property
    def stopping(self) -> bool:
        """True from the first step of `shutdown`: a listener that fails a message from then on
        leaves it to the group's next member (it is neither handed back nor committed)."""
        return self.inner.stopping

    def shutdown(self) -> None:
        if self.loop.is_running():
            self._call(self.inner.shutdown())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        aio.close_stopped(self.loop)

    def statistics(self) -> dict:
        return self._call(_stats(self.inner))

    def __enter__(self) -> PushConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


async def _stats(consumer: AsyncPushConsumer) -> dict:
    return consumer.statistics()
