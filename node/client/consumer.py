"""The pull consumer: `AsyncPullConsumer` (asyncio) and `PullConsumer` (blocking).

Pulls carry raw CommitLog records; `node.client.received` decodes them (as RocketMQ's clients do, but
each field on first use), and the tags are checked here exactly (the node filters by tag hash only).
`consume` walks every queue of a topic from a group's committed offsets, committing as it goes,
and rides through a restart of the node's front or of the whole node: pulls, offset lookups and
commits are idempotent, so one that fails for a dropped connection, a timeout or a busy node is
sent again after the producer's backoff, for up to `idle_timeout` from its first failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass

import zmq

from node import protocol
from node.client import aio
from node.client.pop import PopMethods
from node.client.producer import AsyncProducer, SendError, backoff
from node.client.received import ReceivedMessage, decode_messages
from node.security import Credentials

OFFSET_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}")  # an IPv4 or IPv6 store host, then the offset
SEND_BACK_TRIES = 6  # 3.4 s of backoff in all: longer than a killed schedule service takes to come back
# what `consume` sends again: a dropped connection or no answer in time (TIMEOUT: the front restarting), a node
# not serving yet or busy
RIDE_THROUGH = frozenset({"TIMEOUT", "SERVICE_NOT_AVAILABLE", *protocol.RETRIABLE_STATUSES})
MAX_BACKOFF_ATTEMPT = 3  # (backoff: 10, 40, 160, then 640 ms between tries)


@dataclass(frozen=True, slots=True)
class PullResult:
    status: str  # FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[ReceivedMessage]


class AsyncPullConsumer(PopMethods):
    """Pulls from queues at offsets (with long polling), and a `consume` loop for a group; pops,
    acks and changes of invisible time (node.client.pop)."""

    def __new__(cls, endpoint: str | None = None, *, namesrv=None, **options):
        if namesrv is not None and cls is AsyncPullConsumer:  # a cluster's: node.client.cluster_consumer
            from node.client.cluster_consumer import AsyncClusterConsumer

            return super().__new__(AsyncClusterConsumer)
        return super().__new__(cls)

    def __init__(self, endpoint: str | None = None, *, namesrv=None, timeout: float = 5.0,
                 context: zmq.Context | None = None, credentials: Credentials | None = None):
        if endpoint is None or namesrv is not None:
            raise ValueError("a consumer takes endpoint= (one node) or namesrv= (a cluster's name services)")
        self.client = AsyncProducer(endpoint, timeout=timeout, retries=0, context=context, credentials=credentials)
        self.options = {"timeout": timeout, "context": context, "credentials": credentials}
        # read redirect (spec §10.1): the broker each queue is pulled from, as the last reply
        # suggested (0: the master this consumer was given), and a client per other broker
        self.pull_from: dict[tuple[str, int], int] = {}
        self.brokers: dict[int, AsyncProducer] = {}
        self.redirects = 0

    async def start(self) -> AsyncPullConsumer:
        return self.opened()

    def opened(self) -> AsyncPullConsumer:
        """Connect now (on the running loop), without a coroutine."""
        self.client.opened()
        return self

    async def close(self) -> None:
        for broker in self.brokers.values():
            await broker.close()
        self.brokers.clear()
        await self.client.close()

    async def __aenter__(self) -> AsyncPullConsumer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _ask(self, header: dict, *, timeout: float | None = None) -> tuple[dict, bytes | None]:
        return await self.client.request(header, timeout=timeout)

    async def pull(self, topic: str, queue_id: int, offset: int, *, max_count: int = 32, subscription: str = "*",
                   suspend_ms: int = 0, group: str | None = None, commit_offset: int | None = None,
                   broker: str | None = None, expression_type: str = protocol.EXPRESSION_TAG) -> PullResult:
        """One pull. With `suspend_ms` > 0 an empty pull waits at the node until a message
        arrives or the time is up (long polling). `group` names the consumer group the pull is
        for (the node counts pulls by group); with `commit_offset` the pull also commits the
        group's offset of this queue (RocketMQ's FLAG_COMMIT_OFFSET). `subscription` is a tag
        expression, or with `expression_type="SQL92"` a SQL92 selector over the messages'
        properties (a node with enablePropertyFilter; node.sql92 has the grammar)."""
        header = {"code": protocol.PULL_MESSAGE, "topic": topic, "queueId": queue_id, "queueOffset": offset,
                  "maxMsgNums": max_count, "subscription": subscription, "suspend": suspend_ms > 0,
                  "suspendTimeoutMillis": suspend_ms}
        if expression_type != protocol.EXPRESSION_TAG:
            header["expressionType"] = expression_type
        if group is not None:
            header["consumerGroup"] = group
        if commit_offset is not None:  # the group's offset of this queue, committed by the pull itself
            header["commitOffset"] = commit_offset
        reply, body = await self._pull_where_suggested(topic, queue_id, header, self.client.timeout + suspend_ms / 1000)
        status = reply.get("status")
        if status not in ("FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL"):
            raise SendError(status or "SYSTEM_ERROR", reply.get("remark", ""))
        messages = decode_messages(body)
        tags = protocol.parse_subscription(subscription) if expression_type == protocol.EXPRESSION_TAG else None
        if tags is not None:  # the node filters by tag hash; the client checks the tags exactly
            messages = [m for m in messages if m.tags in tags]
        return PullResult(status, reply["nextBeginOffset"], reply["minOffset"], reply["maxOffset"], messages)

    async def _pull_where_suggested(self, topic: str, queue_id: int, header: dict, timeout: float):
        """A pull from the broker the last reply for this queue suggested (suggestWhichBrokerId:
        a master sends consumers of data no longer in memory to a slave, the slave sends them back
        once they read hot data). A slave that does not answer, or is not known in the topic's
        brokerAddrs, sends the queue back to the master. Offsets are committed to the master."""
        key = (topic, queue_id)
        broker = self.pull_from.get(key, 0)
        client = await self._broker(topic, broker) if broker else self.client
        if client is not self.client:
            commit = header.pop("commitOffset", None)
            if commit is not None:
                await self.commit(header["consumerGroup"], topic, queue_id, commit)
            try:
                reply, body = await client.request(header, timeout=timeout)
            except SendError:
                reply, body = {"status": "SYSTEM_ERROR"}, None
            if reply.get("status") in ("SYSTEM_ERROR", "SYSTEM_BUSY", "SERVICE_NOT_AVAILABLE"):
                self.pull_from[key] = 0  # the slave is gone or cannot serve: back to the master
                return await self._pull_where_suggested(topic, queue_id, header, timeout)
        else:
            reply, body = await self._ask(header, timeout=timeout)
        suggested = reply.get("suggestWhichBrokerId", 0)
        if isinstance(suggested, int) and suggested != broker:
            self.redirects += 1
            self.pull_from[key] = suggested if suggested == 0 or await self._broker(topic, suggested) else 0
        return reply, body

    async def _broker(self, topic: str, broker_id: int) -> AsyncProducer | None:
        """The client of `broker_id` from the topic's route (brokerAddrs), or None if unknown."""
        client = self.brokers.get(broker_id)
        if client is None:
            reply, _ = await self._ask({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": topic})
            endpoint = (reply.get("brokerAddrs") or {}).get(str(broker_id))
            if not endpoint:
                return None
            client = self.brokers[broker_id] = AsyncProducer(endpoint, retries=0, **self.options)
        return client

    async def pull_raw(self, topic: str, queue_id: int, offset: int, *, max_count: int = 32,
                       subscription: str = "*", broker: str | None = None,
                       expression_type: str = protocol.EXPRESSION_TAG) -> tuple[str, int, int, int, bytes]:
        """One pull, its records left as the node sent them (back to back, `shm.codec`'s layout):
        (status, nextBeginOffset, minOffset, maxOffset, records). For readers that decode in bulk
        (the Spark connector); the tags are not re-checked exactly, as `pull` does."""
        header = {"code": protocol.PULL_MESSAGE, "topic": topic, "queueId": queue_id, "queueOffset": offset,
                  "maxMsgNums": max_count, "subscription": subscription, "suspend": False, "suspendTimeoutMillis": 0}
        if expression_type != protocol.EXPRESSION_TAG:
            header["expressionType"] = expression_type
        reply, body = await self._ask(header)
        status = reply.get("status")
        if status not in ("FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL"):
            raise SendError(status or "SYSTEM_ERROR", reply.get("remark", ""))
        return status, reply["nextBeginOffset"], reply["minOffset"], reply["maxOffset"], body or b""

    async def send_back(self, message, group: str, *, delay_level: int = 0,
                        max_reconsume_times: int | None = None) -> None:
        """Hand a message back for another try (RocketMQ's consumerSendMsgBack): the node re-puts
        it into `%RETRY%<group>` after delay level `delay_level` (0: 3 + its reconsumeTimes), or
        into `%DLQ%<group>` once it was handed back `max_reconsume_times` times (None: the
        group's retryMaxTimes, 16 unless `admin group update` set it), or with a level below 0.
        A busy answer (the schedule service restarting) is retried after 10, 40, ... 2560 ms: a
        refused hand-back stored nothing. Raises SendError when the node refuses."""
        header = {"code": protocol.CONSUMER_SEND_MSG_BACK, "consumerGroup": group, "offsetMsgId": message.offset_msg_id,
                  "delayLevel": delay_level, "originTopic": message.topic, "originMsgId": message.msg_id}
        if max_reconsume_times is not None:
            header["maxReconsumeTimes"] = max_reconsume_times
        for attempt in range(SEND_BACK_TRIES):
            reply, _ = await self._ask(header)
            status = reply.get("status", "SYSTEM_ERROR")
            if status == "OK":
                return
            if status not in protocol.RETRIABLE_STATUSES or attempt == SEND_BACK_TRIES - 1:
                raise SendError(status, reply.get("remark", ""))
            await asyncio.sleep(backoff(attempt))

    async def _offset_request(self, code: int, **fields) -> dict:
        reply, _ = await self._ask({"code": code, **fields})
        if reply.get("status") not in ("OK", "QUERY_NOT_FOUND"):
            raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))
        return reply

    async def read_queues(self, topic: str) -> list[tuple[str | None, int]]:
        """(broker group, queue id) of every queue of `topic` to read; one node's: (None, q)."""
        count = await self.client.queue_count(topic, create=False)  # (a consumer's typo makes no topic)
        return [(None, q) for q in range(count)]

    async def max_offset(self, topic: str, queue_id: int, *, broker: str | None = None) -> int:
        return (await self._offset_request(protocol.GET_MAX_OFFSET, topic=topic, queueId=queue_id))["offset"]

    async def min_offset(self, topic: str, queue_id: int, *, broker: str | None = None) -> int:
        return (await self._offset_request(protocol.GET_MIN_OFFSET, topic=topic, queueId=queue_id))["offset"]

    async def offset_at_time(self, topic: str, queue_id: int, timestamp: int, *, broker: str | None = None) -> int:
        """The node's SEARCH_OFFSET_BY_TIMESTAMP: the offset of the message stored nearest `timestamp` (ms)."""
        return (await self._offset_request(protocol.SEARCH_OFFSET_BY_TIMESTAMP, topic=topic, queueId=queue_id,
                                           timestamp=timestamp))["offset"]

    async def committed(self, group: str, topic: str, queue_id: int, *, broker: str | None = None) -> int | None:
        reply = await self._offset_request(protocol.QUERY_CONSUMER_OFFSET, consumerGroup=group, topic=topic,
                                           queueId=queue_id)
        return reply.get("offset")

    async def commit(self, group: str, topic: str, queue_id: int, offset: int, *, broker: str | None = None) -> None:
        await self._offset_request(protocol.UPDATE_CONSUMER_OFFSET, consumerGroup=group, topic=topic,
                                   queueId=queue_id, commitOffset=offset)

    async def query(self, topic: str, key: str, *, begin: int = 0, end: int = 2**62, max_count: int = 32):
        reply, body = await self._ask({"code": protocol.QUERY_MESSAGE, "topic": topic, "key": key,
                                       "beginTimestamp": begin, "endTimestamp": end, "maxNum": max_count})
        if reply.get("status") == "QUERY_NOT_FOUND":
            return []
        if reply.get("status") != "OK":
            raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))
        return decode_messages(body)

    async def view(self, msg_id: str, topic: str | None = None) -> ReceivedMessage | None:
        """One message by its id, as RocketMQ's viewMessage and `mqadmin queryMsgById` find it: an
        offsetMsgId (a send's `offset_msg_id`: its store host and CommitLog offset) is read
        straight from the CommitLog; with `topic`, an id that is no offsetMsgId of this node is
        looked up as a msgId (UNIQ_KEY) through the index. None when no message has that id."""
        if OFFSET_MSG_ID.fullmatch(msg_id):
            reply, body = await self._ask({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": msg_id})
            if reply.get("status") not in ("OK", "QUERY_NOT_FOUND"):
                raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))
            found = decode_messages(body) if reply["status"] == "OK" else []
            if found and topic in (None, found[0].topic):
                return found[0]
        elif topic is None:
            raise ValueError(f"{msg_id!r} is no offsetMsgId (32 or 56 hex digits): name the topic to find it as a msgId")
        if topic is None:
            return None
        return next((m for m in await self.query(topic, msg_id) if m.msg_id.upper() == msg_id.upper()), None)

    async def _start_offsets(self, topic: str, group: str, queues, start: str | int, again) -> dict:
        """Where `consume` begins each queue: the group's committed offset (`start="committed"`,
        the first where it has none), the queue's first or last, or for a time (`start` epoch ms)
        its first message stored at or after it."""
        offsets = {}
        for b, q in queues:
            committed = await again(lambda: self.committed(group, topic, q, broker=b), "start") \
                if start == "committed" else None
            if committed is not None:
                offsets[b, q] = committed
            elif isinstance(start, int):
                offsets[b, q] = await again(lambda: self.offset_from(topic, q, start, broker=b), "start")
            elif start == "last":
                offsets[b, q] = await again(lambda: self.max_offset(topic, q, broker=b), "start")
            else:
                offsets[b, q] = await again(lambda: self.min_offset(topic, q, broker=b), "start")
        return offsets

    async def offset_from(self, topic: str, queue_id: int, timestamp: int, *, broker: str | None = None) -> int:
        """The offset of the queue's first message stored at or after `timestamp` (ms), its end if
        none is: SEARCH_OFFSET_BY_TIMESTAMP gives the nearest (RocketMQ's rule), one step on when
        that one is earlier."""
        offset = await self.offset_at_time(topic, queue_id, timestamp, broker=broker)
        pulled = await self.pull(topic, queue_id, offset, max_count=1, broker=broker)
        early = pulled.messages and pulled.messages[0].queue_offset == offset and \
            pulled.messages[0].store_timestamp < timestamp
        return offset + 1 if early else offset

    async def consume(self, topic: str, group: str, *, start: str | int = "committed", subscription: str = "*",
                      idle_timeout: float = 5.0, suspend_ms: int = 1000, limit: int | None = None,
                      expression_type: str = protocol.EXPRESSION_TAG):
        """Yield messages from every queue of `topic`, from the group's committed offsets
        (`start="committed"`, falling back to the first), `"first"` / `"last"`, or a time (epoch
        ms: each queue's first message stored at or after it, CONSUME_FROM_TIMESTAMP); commits after
        each pull, and when left early (a break, an exception in the caller's loop: `aclose`) what
        its queue held before the message in hand, not that message. Each queue is pulled on its
        own (a long poll of an idle queue holds back no other), its next pull sent once the last
        one's messages were taken. Stops after `limit`
        messages or `idle_timeout` seconds without one (not counting a request being sent again:
        see the module's docstring); a request that keeps failing past `idle_timeout` is raised."""
        retrying: set = set()  # who is sending a request again: the node is restarting, not idle

        def again(call, who):
            return self._riding_through(call, idle_timeout, retrying, who)

        queues = await again(lambda: self.read_queues(topic), "start")  # (broker group, queue id)
        offsets = await self._start_offsets(topic, group, queues, start, again)
        ready: asyncio.Queue = asyncio.Queue()  # (queue, a pull's result or the error that ended its follower)
        turns = {queue: asyncio.Event() for queue in queues}

        async def follow(queue: tuple[str | None, int]) -> None:
            """One queue's pulls, one at a time, each after the last was consumed: a queue with
            nothing new waits at the node without holding the others back."""
            b, q = queue
            while True:
                try:
                    result = await again(lambda: self.pull(topic, q, offsets[queue], subscription=subscription,
                                                           suspend_ms=suspend_ms, group=group, broker=b,
                                                           expression_type=expression_type), queue)
                except Exception as e:  # (SendError, a closed client) ends the consume, raised there
                    await ready.put((queue, e))
                    return
                turns[queue].clear()
                await ready.put((queue, result))
                await turns[queue].wait()

        followers = [asyncio.ensure_future(follow(queue)) for queue in queues]
        delivered, last_message = 0, time.monotonic()
        try:
            while limit is None or delivered < limit:
                idle = idle_timeout - (time.monotonic() - last_message)
                try:  # (asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancel that meets a result)
                    async with asyncio.timeout(max(idle, 0.1) if retrying else idle):
                        q, result = await ready.get()
                except TimeoutError:
                    if retrying:
                        continue  # (its own budget ends it with the error)
                    return
                if isinstance(result, Exception):
                    raise result
                if result.status == "OFFSET_ILLEGAL":
                    offsets[q] = min(max(offsets[q], result.min_offset), result.max_offset)
                    turns[q].set()
                    continue
                for message in result.messages:
                    if limit is not None and delivered >= limit:
                        break
                    try:
                        yield message
                    except GeneratorExit:  # left mid-batch (a break, an exception in the caller's loop)
                        await self._commit_taken(group, topic, q, message.queue_offset)
                        raise
                    delivered += 1
                    offsets[q] = message.queue_offset + 1
                    last_message = time.monotonic()
                else:
                    offsets[q] = result.next_begin_offset
                await again(lambda: self.commit(group, topic, q[1], offsets[q], broker=q[0]), "commit")
                turns[q].set()
        finally:
            for follower in followers:
                follower.cancel()
            await asyncio.gather(*followers, return_exceptions=True)

    async def _commit_taken(self, group: str, topic: str, queue: tuple[str | None, int], in_hand: int) -> None:
        """`consume` left at the message `in_hand`: what its queue held before it is committed (taken,
        or filtered out), not it (it may not have been handled). Left uncommitted, a break after a
        batch's first messages had them all again next time."""
        with contextlib.suppress(SendError):  # (then they come again: at least once)
            await self.commit(group, topic, queue[1], in_hand, broker=queue[0])

    @staticmethod
    async def _riding_through(call, budget_s: float, retrying: set, who):
        """`call()`, sent again after a backoff while it fails with a RIDE_THROUGH status, for up
        to `budget_s` from its first failure; `who` is in `retrying` meanwhile."""
        first_failure, attempt = None, 0
        while True:
            try:
                result = await call()
            except SendError as e:
                now = time.monotonic()
                first_failure = first_failure or now
                if e.status not in RIDE_THROUGH or now - first_failure > budget_s:
                    retrying.discard(who)
                    raise
                retrying.add(who)
                await asyncio.sleep(backoff(min(attempt, MAX_BACKOFF_ATTEMPT)))
                attempt += 1
                continue
            retrying.discard(who)
            return result


class PullConsumer(aio.Blocking):
    """The blocking pull consumer: an AsyncPullConsumer on a private event-loop thread."""

    def __init__(self, endpoint: str | None = None, **options):
        self._start_loop("mqnode-consumer")
        self.context = zmq.Context()
        self.inner = AsyncPullConsumer(endpoint, context=self.context, **options)
        self._made(self.inner.start())

    def _context(self):
        return self.context

    def pull(self, topic: str, queue_id: int, offset: int, **kwargs) -> PullResult:
        return self._call(self.inner.pull(topic, queue_id, offset, **kwargs))

    def max_offset(self, topic: str, queue_id: int, **kwargs) -> int:
        return self._call(self.inner.max_offset(topic, queue_id, **kwargs))

    def offset_at_time(self, topic: str, queue_id: int, timestamp: int, **kwargs) -> int:
        return self._call(self.inner.offset_at_time(topic, queue_id, timestamp, **kwargs))

    def offset_from(self, topic: str, queue_id: int, timestamp: int, **kwargs) -> int:
        return self._call(self.inner.offset_from(topic, queue_id, timestamp, **kwargs))

    def read_queues(self, topic: str) -> list[tuple[str | None, int]]:
        return self._call(self.inner.read_queues(topic))

    def send_back(self, message, group: str, **options) -> None:
        return self._call(self.inner.send_back(message, group, **options))

    def min_offset(self, topic: str, queue_id: int, **kwargs) -> int:
        return self._call(self.inner.min_offset(topic, queue_id, **kwargs))

    def committed(self, group: str, topic: str, queue_id: int, **kwargs) -> int | None:
        return self._call(self.inner.committed(group, topic, queue_id, **kwargs))

    def commit(self, group: str, topic: str, queue_id: int, offset: int, **kwargs) -> None:
        self._call(self.inner.commit(group, topic, queue_id, offset, **kwargs))

    def query(self, topic: str, key: str, **kwargs) -> list[ReceivedMessage]:
        return self._call(self.inner.query(topic, key, **kwargs))

    def view(self, msg_id: str, topic: str | None = None) -> ReceivedMessage | None:
        return self._call(self.inner.view(msg_id, topic))

    def pop(self, topic: str, group: str, **kwargs) -> list:
        return self._call(self.inner.pop(topic, group, **kwargs))

    def peek(self, topic: str, group: str, **kwargs) -> list:
        return self._call(self.inner.peek(topic, group, **kwargs))

    def ack(self, message_or_handle, group: str | None = None) -> bool:
        return self._call(self.inner.ack(message_or_handle, group))

    def ack_batch(self, messages_or_handles, group: str | None = None) -> list[bool]:
        return self._call(self.inner.ack_batch(messages_or_handles, group))

    def change_invisible(self, message_or_handle, invisible_ms: int, group: str | None = None) -> str:
        return self._call(self.inner.change_invisible(message_or_handle, invisible_ms, group))

    def pop_state(self, group: str) -> dict:
        return self._call(self.inner.pop_state(group))

    def consume(self, topic: str, group: str, **kwargs):
        """The blocking form of AsyncPullConsumer.consume: an iterator of messages. Left early (a
        break; Ctrl-C while it waits) it ends the async one on its loop, the step in flight
        cancelled first: left to Python's finalizer, that said "async generator ignored
        GeneratorExit" on stderr (its pulls' cancellation awaits)."""
        generator = self.inner.consume(topic, group, **kwargs)
        steps: list[asyncio.Task] = []

        async def step():
            steps[:] = [asyncio.current_task()]
            return await generator.__anext__()

        try:
            while True:
                try:
                    message = self._call(step())
                except StopAsyncIteration:
                    return
                yield message
        finally:
            if not self.thread.forked() and self.loop.is_running():
                self._call(_ended(generator, steps), timeout=10)  # (steps read there: after the last began)


async def _ended(generator, steps: list[asyncio.Task]) -> None:
    """`generator` closed once its last step (`steps`) is over, cancelled if still running. Read
    on the loop, after the step submitted last has begun (the loop runs them in order)."""
    if steps and not steps[0].done():
        steps[0].cancel()
        await asyncio.gather(steps[0], return_exceptions=True)
    await generator.aclose()
