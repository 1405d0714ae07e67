"""The producer: `AsyncProducer` (asyncio) and `Producer` (blocking, thread-safe).

One DEALER connection per producer (`node.client.connection`), with a stable routing id, so replies
find it again after the node's front restarts. Concurrent single sends are coalesced (up to
`max_coalesce` of them) into one SEND_MESSAGES frame that comes back as one reply with a result
each, so the one-message API reaches batch throughput: the sends made in one turn of the event
loop leave together at its end, and while an earlier coalesced request is still in flight they
wait up to `linger_ms` for more company (Nagle's rule: never linger in front of an idle
connection). Every send
carries a client-made UNIQ_KEY (RocketMQ's MessageClientIDSetter layout), which is the msgId
the caller gets back. SYSTEM_BUSY and timeouts are retried `retries` times; a send is
at-least-once, as in RocketMQ.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import time

import orjson
import zmq

from node import protocol
from node.client import aio, routes
from node.client.coalesce import NOT_TAKEN, Coalescing, Queued, backoff  # (backoff: for the clients that import it here)
from node.client.connection import Connection
from node.client.errors import SendError
from node.client.message import Message, body_bytes, create_reply
from node.client.results import SendResult
from node.client.routes import shard_queue
from node.client.uniq_keys import UniqKeys
from node.security import Credentials
from shm.codec import (
    PROPERTY_DELAY,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
)

# what the node asks a client (its header has no opaque): to `on_request`, with the body
NODE_REQUESTS = frozenset({protocol.CHECK_TRANSACTION_STATE, protocol.PUSH_REPLY_MESSAGE_TO_CLIENT,
                           protocol.GET_CONSUMER_RUNNING_INFO, protocol.CONSUME_MESSAGE_DIRECTLY,
                           protocol.RESET_CONSUMER_CLIENT_OFFSET})


class AsyncProducer(Coalescing):
    """One node's producer (`endpoint=`), or a cluster's (`namesrv=`: the sends go over every
    broker group's queues, node.client.routes)."""

    def __init__(self, endpoint: str | None = None, *, namesrv=None, linger_ms: float = 1.0, max_coalesce: int = 256,
                 timeout: float = 3.0, retries: int = 2, context: zmq.Context | None = None,
                 credentials: Credentials | None = None, isolation_s: float = routes.ISOLATION_S, broker: str = ""):
        if (endpoint is None) == (namesrv is None):
            raise ValueError("a producer takes endpoint= (one node) or namesrv= (a cluster's name services)")
        _check_options(linger_ms=linger_ms, max_coalesce=max_coalesce, timeout=timeout, retries=retries)
        self.endpoint = endpoint
        self.broker = broker  # the broker group this producer sends to, for its results (a cluster's: node.client.routes)
        # the ACL's account and CURVE's keys (node.security); by default from MQNODE_* variables
        self.credentials = credentials if credentials is not None else Credentials.from_env()
        self.signs = self.credentials.signs
        self.linger = linger_ms / 1000
        self.max_coalesce = max_coalesce
        self.timeout = timeout
        self.retries = retries
        self.context = context or zmq.Context.instance()
        self.connection: Connection | None = None
        self.keys = UniqKeys()
        self.opaque = itertools.count(1)
        # opaque -> (what waits for the reply, deadline): a request's future, or the sends a
        # SEND_MESSAGES request coalesced, answered straight from the reply (`_finish`)
        self.waiting: dict[int, tuple[asyncio.Future | list[Queued], float]] = {}
        self.queued: list[Queued] = []
        self.flush_handle: asyncio.Handle | None = None
        self.coalesced_in_flight = 0  # SEND_MESSAGES requests awaiting their reply
        self.routes: dict[str, int] = {}
        self.broker_name = ""  # the node's, as its routes name it (a timer's recall handle carries it)
        self.round_robin: dict[str, itertools.count] = {}
        self.reaper: asyncio.Task | None = None
        self.on_notice = None  # called with what the node sends unasked (NOTIFY_CONSUMER_IDS_CHANGED)
        self.on_request = None  # called with (header, body) of a request the node makes (NODE_REQUESTS)
        self.lost_listeners: list = []  # called when the connection drops (node.client.producer_group)
        self.cluster: routes.Cluster | None = None
        if namesrv is not None:
            group = dict(linger_ms=linger_ms, max_coalesce=max_coalesce, timeout=timeout, retries=0,
                         context=self.context, credentials=self.credentials)
            self.cluster = routes.Cluster(namesrv, lambda broker, endpoint: AsyncProducer(endpoint, broker=broker, **group).opened(),
                                          lambda endpoint: AsyncProducer(endpoint, timeout=timeout, retries=0, context=self.context,
                                                                         credentials=self.credentials),
                                          isolation_s=isolation_s)

    async def start(self) -> AsyncProducer:
        if self.cluster is not None:
            self.cluster.start()
            return self
        return self.opened()

    def opened(self) -> AsyncProducer:
        """Connect now (on the running loop), without a coroutine: `start` for a plain caller."""
        if self.connection is not None and self.connection.loop is not asyncio.get_running_loop():
            self._moved()
        if self.connection is None:
            self.connection = Connection(self.context, self.endpoint, self._on_reply, secure=self.credentials.secure,
                                         on_lost=self._on_lost)
            self.reaper = asyncio.create_task(self._reap())
        return self

    def _moved(self) -> None:
        """Used under another loop than its connection's (a second `asyncio.run`): its replies were
        read and its deadlines kept by that loop, and a send waited forever. A closed loop's
        connection is dropped (what waited there is gone with it) for one on this loop; a loop
        still running keeps it: the client is that loop's."""
        if not self.connection.loop.is_closed():
            raise RuntimeError("this client runs on another event loop, which is still open: an asyncio client "
                               "serves one loop (make one for each)")
        self.connection.close()
        self.connection, self.reaper, self.flush_handle = None, None, None
        self.waiting, self.queued, self.coalesced_in_flight = {}, [], 0

    async def close(self) -> None:
        if self.cluster is not None:
            await self.cluster.close()
        if self.reaper is not None:
            self.reaper.cancel()
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        waiters, self.waiting = list(self.waiting.values()), {}
        for waiter, _ in waiters:
            self._finish(waiter, None, SendError("CLOSED", "the producer was closed"))

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- requests -------------------------------------------------------------------------------

    async def request(self, header: dict, body: bytes | None = None, *,
                      timeout: float | None = None) -> tuple[dict, bytes | None]:
        """One request, one reply (any code); raises SendError("TIMEOUT") after `timeout`
        seconds (the producer's own by default)."""
        if self.cluster is not None:
            raise TypeError("a cluster's producer (namesrv=) sends; a request goes to one node: endpoint=")
        await self.start()
        opaque = next(self.opaque)
        header = dict(header, opaque=opaque)
        future = asyncio.get_running_loop().create_future()
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self.waiting[opaque] = (future, deadline)
        try:
            await self._send(self._encode(header, body), deadline)
        except SendError:
            self.waiting.pop(opaque, None)  # never sent: nothing to reap, no reply to wait for
            raise
        return await future

    async def tell(self, header: dict, body: bytes | None = None) -> None:
        """A request the node replies nothing to (CLIENT_ANSWER: an answer to what it asked)."""
        await self.start()
        await self._send(self._encode(header, body), time.monotonic() + self.timeout)

    def _encode(self, header: dict, body: bytes | None) -> list[bytes]:
        if self.signs:
            self.credentials.sign(header, body or b"")
        return protocol.encode_request(header, body)

    async def _send(self, frames: list[bytes], deadline: float) -> None:
        if not self.connection.send(frames) and not await self.connection.send_by(frames, deadline):
            raise SendError("SYSTEM_BUSY", NOT_TAKEN + " until the deadline")

    async def queue_count(self, topic: str, *, create: bool = True) -> int:
        """The topic's queues. `create` false (a consumer's ask): an unknown topic is
        SendError("TOPIC_NOT_EXIST"), not made (with autoCreateTopicEnable a send makes it)."""
        count = self.routes.get(topic)
        if count is None:
            ask = {"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": topic} | ({} if create else {"create": False})
            reply, _ = await self.request(ask)
            if reply.get("status") != "OK":
                raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))
            count = self.routes[topic] = reply["writeQueueNums"]
            self.broker_name = reply.get("brokerName") or self.broker_name
        return count

    async def _node_name(self, topic: str) -> str:
        """The node's brokerName (a recall handle names it), from a route it gave: asked once, of a
        topic just sent to (so the ask creates nothing), when no route was needed before."""
        if not self.broker_name:
            try:
                reply, _ = await self.request({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": topic})
            except SendError:
                return ""  # (the message is stored: its handle goes without the name, which the node takes)
            self.broker_name = reply.get("brokerName") or ""
        return self.broker_name

    async def _choose_queue(self, topic: str, queue_id: int | None, shard_key: str | None) -> int:
        count = None if queue_id is not None else self.routes.get(topic) or await self.queue_count(topic)
        return self._pick_queue(topic, queue_id, shard_key, count)

    def _pick_queue(self, topic: str, queue_id: int | None, shard_key: str | None, count: int | None) -> int:
        if queue_id is not None:
            return queue_id
        if shard_key is not None:
            return shard_queue(shard_key, count)
        counter = self.round_robin.setdefault(topic, itertools.count())
        return next(counter) % count

    async def send(self, topic: str, body: bytes | str, *, tags: str | None = None, keys=None,
                   properties: dict[str, str] | None = None, delay_level: int = 0, queue_id: int | None = None,
                   shard_key: str | None = None, wait: bool = True, deliver_at_ms: int | None = None,
                   delay_ms: int | None = None, broker: str | None = None) -> SendResult:
        """Send one message; returns when the node has stored it (and flushed it, under SYNC_FLUSH).
        `delay_level` (RocketMQ 4's levels) or a timer, `deliver_at_ms` (epoch ms) or `delay_ms`,
        holds it back until due (docs/protocol.md "Delays"); its result's `recall_handle` cancels
        it until then (`recall`)."""
        if tags or keys or properties or not wait or deliver_at_ms is not None or delay_ms is not None:
            message = Message(topic, body_bytes(body), tags, keys, dict(properties or {}), delay_level, wait=wait,
                              deliver_at_ms=deliver_at_ms, delay_ms=delay_ms)
            return await self.send_message(message, queue_id=queue_id, shard_key=shard_key, broker=broker)
        # A plain message (most sends): no Message to build, its only properties the uniq key and a delay.
        body = body_bytes(body)
        if self.cluster is not None:  # (the group's producer's future itself: no coroutine frame of its own)
            uniq = self.keys.next()  # one id whichever group takes it: a send retried elsewhere keeps its msgId
            return await self._routed(topic, lambda client, queue: client._plain(topic, body, queue, delay_level,
                                                                                 deliver_at_ms, delay_ms, uniq),
                                      queue_id, shard_key, broker)
        queue = self._known_queue(topic, queue_id, shard_key)
        if queue is None:
            queue = await self._choose_queue(topic, queue_id, shard_key)
        if self.connection is None:
            await self.start()
        return await self._plain(topic, body, queue, delay_level, deliver_at_ms, delay_ms)

    def _plain(self, topic: str, body: bytes, queue: int, delay_level: int, deliver_at_ms: int | None,
               delay_ms: int | None, uniq: str | None = None) -> asyncio.Future:
        """A plain message's send, queued for the next SEND_MESSAGES frame: its future."""
        now_ms = int(time.time() * 1000)
        props = {PROPERTY_UNIQ_KEY: uniq or self.keys.next(now_ms)}
        if delay_level:
            props[PROPERTY_DELAY] = str(delay_level)
        if deliver_at_ms is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_at_ms)
        if delay_ms is not None:
            props[PROPERTY_TIMER_DELAY_MS] = str(delay_ms)
        entry = {"topic": topic, "queueId": queue, "flag": 0, "bodySize": len(body), "bornTimestamp": now_ms,
                 "properties": props}
        if self.connection is None:
            raise SendError("CLOSED", "the producer is not started or was closed")
        return self._coalesce(entry, body)

    async def _routed(self, topic: str, call, queue_id: int | None, shard_key: str | None, broker: str | None):
        """A send of a cluster's producer (node.client.routes.Cluster.send), its result naming its group."""
        return await self.cluster.send(topic, call, retries=self.retries, queue_id=queue_id, broker=broker,
                                       shard_key=shard_key)

    def _keyed(self, message: Message, uniq: str | None = None) -> Message:
        """`message` with its UNIQ_KEY fixed before a cluster's producer picks a group (a copy:
        the caller's is left as it was), so a retry on another group sends the same msgId."""
        if message.properties.get(PROPERTY_UNIQ_KEY):
            return message
        return dataclasses.replace(message, properties={**message.properties,
                                                        PROPERTY_UNIQ_KEY: uniq or self.keys.next()})

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a timer message before it is due (RocketMQ 5.3's recall; `recall_handle` from
        its send's result, or a RocketMQ 5 client's): stores a recall for it, which the node's
        schedule service honours up to the message's delivery. Returns the message's id.
        ValueError for a handle that is not one or names another topic; SendError
        MESSAGE_ILLEGAL when the message's time has come."""
        handle_topic, broker, due_ms, message_id = protocol.parse_recall_handle(recall_handle)
        if handle_topic != topic:
            raise ValueError(f"recall failed: the handle is of topic {handle_topic!r}, not {topic!r}")
        await self.send(topic, b"0", tags=protocol.RECALL_TAG, properties={PROPERTY_TIMER_DEL_UNIQKEY: message_id},
                        deliver_at_ms=due_ms, broker=broker or None)
        return message_id

    async def send_reply(self, request, body: bytes | str, *, properties: dict[str, str] | None = None) -> SendResult:
        """Answer a request of request-reply (node.client.replies): `create_reply(request, body)` as
        a SEND_REPLY_MESSAGE, which the node pushes to the requester's connection and stores in
        the reply topic. SendError SYSTEM_ERROR when no requester of its REPLY_TO_CLIENT is
        connected to this node (the remark says so; the reply is stored all the same). A
        cluster's producer answers through the group whose master stored the request (its
        `store_host`): the node the requester asked through."""
        if self.cluster is not None:
            broker, node = await self._storing_group(request)
            return (await node.send_reply(request, body, properties=properties))._replace(broker=broker)
        message = create_reply(request, body, properties=properties)
        await self.start()
        header = {"code": protocol.SEND_REPLY_MESSAGE, "topic": message.topic, "queueId": 0, "flag": 0,  # (its one queue)
                  "bornTimestamp": int(time.time() * 1000), "properties": message.wire_properties(self.keys.next())}
        reply, _ = await self.request(header, message.body)
        status = reply.get("status")
        if status not in protocol.STORED_STATUSES:
            raise SendError(status or "SYSTEM_ERROR", reply.get("remark", ""))
        return SendResult(status, reply["msgId"], reply["offsetMsgId"], reply["queueId"], reply["queueOffset"],
                          message.topic, self.broker)

    async def _storing_group(self, request) -> tuple[str, AsyncProducer]:
        """(broker name, its client) of the group whose master stored `request`."""
        route = await self.cluster.routes.of(request.topic)
        for broker in sorted(route.addresses):
            endpoint = route.master(broker)
            if endpoint is not None and endpoint.removeprefix("tcp://") == request.store_host:
                return broker, self.cluster.groups.of(broker, endpoint)
        raise SendError("SERVICE_NOT_AVAILABLE", f"no broker group of topic {request.topic} has its master at "
                                                 f"{request.store_host}, which stored the request")

    async def send_message(self, message: Message, *, queue_id: int | None = None,
                           shard_key: str | None = None, broker: str | None = None) -> SendResult:
        if self.cluster is not None:
            keyed = self._keyed(message)
            return await self._routed(message.topic, lambda client, queue: client.send_message(keyed, queue_id=queue),
                                      queue_id, shard_key, broker)
        queue = self._known_queue(message.topic, queue_id, shard_key)
        if queue is None:
            queue = await self._choose_queue(message.topic, queue_id, shard_key)
        now_ms = int(time.time() * 1000)
        uniq = message.properties.get(PROPERTY_UNIQ_KEY) or self.keys.next(now_ms)
        entry = {"topic": message.topic, "queueId": queue, "flag": message.flag, "bodySize": len(message.body),
                 "bornTimestamp": now_ms, "properties": message.wire_properties(uniq)}
        if self.connection is None:
            await self.start()
        result = await self._coalesce(entry, message.body)
        if message.deliver_at_ms is None and message.delay_ms is None:
            return result
        # a timer: its result holds the handle to recall it (`recall`)
        due = message.deliver_at_ms if message.deliver_at_ms is not None else now_ms + message.delay_ms
        return result._replace(deliver_at_ms=due, topic=result.topic or message.topic,
                               broker=result.broker or await self._node_name(message.topic))

    def _known_queue(self, topic: str, queue_id: int | None, shard_key: str | None) -> int | None:
        """The queue, when no route needs looking up (None: await `_choose_queue`). Plain, not a
        coroutine: a send makes and awaits no coroutine for what it already knows."""
        count = self.routes.get(topic)
        return self._pick_queue(topic, queue_id, shard_key, count) if queue_id is not None or count else None

    async def send_oneway(self, topic: str, body: bytes | str, *, queue_id: int | None = None, **kwargs) -> None:
        """Fire and forget: no reply is sent or awaited."""
        if self.cluster is not None:
            shard_key, broker = kwargs.pop("shard_key", None), kwargs.pop("broker", None)
            kwargs["properties"] = {PROPERTY_UNIQ_KEY: self.keys.next(), **(kwargs.get("properties") or {})}
            await self._routed(topic, lambda client, queue: client.send_oneway(topic, body, queue_id=queue, **kwargs),
                               queue_id, shard_key, broker)
            return
        message = Message(topic, body_bytes(body), kwargs.get("tags"), kwargs.get("keys"),
                          dict(kwargs.get("properties") or {}), kwargs.get("delay_level", 0),
                          deliver_at_ms=kwargs.get("deliver_at_ms"), delay_ms=kwargs.get("delay_ms"))
        queue = await self._choose_queue(topic, queue_id, kwargs.get("shard_key"))
        header = {"code": protocol.SEND_MESSAGE, "oneway": True, "topic": topic, "queueId": queue,
                  "bornTimestamp": int(time.time() * 1000), "properties": message.wire_properties(self.keys.next())}
        await self.start()
        await self._send(self._encode(header, message.body), time.monotonic() + self.timeout)

    async def send_batch(self, topic: str, messages: list[Message | bytes | str], *, queue_id: int | None = None,
                         shard_key: str | None = None, properties: dict[str, str] | None = None,
                         broker: str | None = None, one_half: bool = False) -> list[SendResult]:
        """RocketMQ's batch send: one topic, one queue, stored together; a result per message.
        `properties`: the batch's own, stored after each message's (TRAN_MSG and PGROUP make it
        a batch of halves: node.pipeline.transactions). With `one_half` (and those properties),
        the batch is stored as one half, which one end commits or rolls back whole: one result,
        naming the half (its `msg_id` the messages' ids, comma-joined)."""
        if self.cluster is not None:
            fresh = iter(self.keys.next_many(len(messages)))  # (each message's id fixed before a group is picked)
            keyed = [self._keyed(m, next(fresh)) if isinstance(m, Message)
                     else Message(topic, body_bytes(m), properties={PROPERTY_UNIQ_KEY: next(fresh)}) for m in messages]
            whole = {"one_half": True} if one_half else {}
            return await self._routed(topic, lambda client, queue: client.send_batch(
                topic, keyed, queue_id=queue, properties=properties, **whole), queue_id, shard_key, broker)
        items = [m if isinstance(m, Message) else Message(topic, body_bytes(m)) for m in messages]
        queue = await self._choose_queue(topic, queue_id, shard_key)
        fresh = iter(self.keys.next_many(sum(1 for m in items if not m.properties.get(PROPERTY_UNIQ_KEY))))
        uniq = [m.properties.get(PROPERTY_UNIQ_KEY) or next(fresh) for m in items]
        try:
            body = protocol.encode_batch_body([(m.body, m.flag, m.wire_properties_string(u)) for m, u in zip(items, uniq)])
        except protocol.PropertiesTooLarge as e:  # (the status a single send of it is answered)
            raise SendError("PROPERTIES_SIZE_EXCEEDED", str(e)) from None
        header = {"code": protocol.SEND_BATCH_MESSAGE, "topic": topic, "queueId": queue,
                  "bornTimestamp": int(time.time() * 1000)}
        if properties:
            header["properties"] = properties
        if one_half:
            header["oneHalf"] = True
        for attempt in range(self.retries + 1):
            try:
                reply, _ = await self.request(header, body)
            except SendError as e:
                if e.status != "TIMEOUT" or attempt == self.retries:
                    raise
                continue
            status = reply.get("status")
            if status in protocol.STORED_STATUSES and one_half:
                return [SendResult(status, reply["msgId"], reply["offsetMsgId"], reply["queueId"], reply["queueOffset"],
                                   topic, self.broker)]
            if status in protocol.STORED_STATUSES:
                ids, offsets = reply["msgId"].split(","), reply["offsetMsgId"].split(",")
                return [SendResult(status, ids[i], offsets[i], reply["queueId"], reply["queueOffset"] + i, topic,
                                   self.broker)
                        for i in range(len(items))]
            if status not in protocol.RETRIABLE_STATUSES or attempt == self.retries:
                raise SendError(status, reply.get("remark", ""))
            await asyncio.sleep(backoff(attempt))
        raise AssertionError("unreachable")

    # -- replies ----------------------------------------------------------------------------------

    def _on_reply(self, frames: list[bytes]) -> None:
        try:
            header = orjson.loads(frames[0])
        except orjson.JSONDecodeError:
            return
        if not isinstance(header, dict):
            return
        waiter = self.waiting.pop(header.get("opaque"), None)
        if waiter is not None:
            self._finish(waiter[0], (header, frames[1] if len(frames) > 1 else None), None)
        elif "opaque" not in header:
            if header.get("code") in NODE_REQUESTS:
                if self.on_request is not None:
                    self.on_request(header, frames[1] if len(frames) > 1 else None)
            elif self.on_notice is not None:
                self.on_notice(header)

    def _on_lost(self) -> None:
        """The connection dropped (the node's front died or restarted): no reply will come to
        what was sent before, so those requests time out now, retried as a timeout is (a send
        may then be stored twice: at-least-once, as after any timeout)."""
        waiters, self.waiting = list(self.waiting.values()), {}
        for waiter, _ in waiters:
            self._finish(waiter, None, SendError("TIMEOUT", "the connection to the node dropped before the reply"))
        for listener in self.lost_listeners:
            listener()

    async def _reap(self) -> None:
        """Time out requests whose reply never came (a node restart, a lost actor)."""
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            for opaque in [o for o, (_, deadline) in self.waiting.items() if deadline < now]:
                waiter, _ = self.waiting.pop(opaque)
                self._finish(waiter, None, SendError("TIMEOUT", f"no reply within {self.timeout} s"))


def _check_options(*, linger_ms, max_coalesce, timeout, retries) -> None:
    """ValueError naming an option no producer can work with (retries=-1 sent nothing and ended in
    an AssertionError of ours)."""
    if type(retries) is not int or retries < 0:
        raise ValueError(f"retries must be an integer of 0 or more, not {retries!r}")
    if type(max_coalesce) is not int or max_coalesce < 1:
        raise ValueError(f"max_coalesce must be an integer of 1 or more, not {max_coalesce!r}")
    if not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds above 0, not {timeout!r}")
    if not isinstance(linger_ms, int | float) or not linger_ms >= 0:
        raise ValueError(f"linger_ms must be a number of milliseconds of 0 or more, not {linger_ms!r}")


class Producer(aio.Blocking):
    """The blocking producer: an AsyncProducer on a private event-loop thread. Thread-safe."""

    def __init__(self, endpoint: str | None = None, **options):
        self._start_loop("mqnode-producer")
        self.inner = self._made(self._make(endpoint, options))

    def statistics(self) -> dict:
        return self.inner.cluster.statistics() if self.inner.cluster is not None else {}

    async def _make(self, endpoint: str | None, options: dict) -> AsyncProducer:
        return await AsyncProducer(endpoint, context=zmq.Context(), **options).start()

    def _context(self):
        return self.inner.context

    def send(self, topic: str, body: bytes | str, **kwargs) -> SendResult:
        return self._call(self.inner.send(topic, body, **kwargs))

    def send_async(self, topic: str, body: bytes | str, **kwargs) -> concurrent.futures.Future:
        return self._call_async(self.inner.send(topic, body, **kwargs))

    def _call_async(self, coroutine) -> concurrent.futures.Future:
        return self.thread.submit(coroutine)

    def send_oneway(self, topic: str, body: bytes | str, **kwargs) -> None:
        self._call(self.inner.send_oneway(topic, body, **kwargs))

    def send_batch(self, topic: str, messages: list, **kwargs) -> list[SendResult]:
        return self._call(self.inner.send_batch(topic, messages, **kwargs))

    def recall(self, topic: str, recall_handle: str) -> str:
        return self._call(self.inner.recall(topic, recall_handle))

    def send_reply(self, request, body: bytes | str, **kwargs) -> SendResult:
        return self._call(self.inner.send_reply(request, body, **kwargs))

    def request(self, header: dict, body: bytes | None = None, *,
                timeout: float | None = None) -> tuple[dict, bytes | None]:
        return self._call(self.inner.request(header, body, timeout=timeout))
