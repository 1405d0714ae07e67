"""The pull consumer: `AsyncPullConsumer` (asyncio) and `PullConsumer` (blocking).

Pulls carry raw CommitLog records; they are decoded here with the shared codec (as RocketMQ's
clients decode them), and the tags checked exactly (the node filters by tag hash only).
`consume` walks every queue of a topic from a group's committed offsets, committing as it goes.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import zmq

from node import aio, protocol
from node.producer import AsyncProducer, SendError
from shm.codec import (
    FIXED_V4,
    FLAG_BORNHOST_V6,
    FLAG_STOREHOST_V6,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Record,
    decode,
    decode_host,
    parse_properties,
    split_keys,
)

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_FIXED_V4_UNPACK = FIXED_V4.unpack_from
_V6_FLAGS = FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6


class ReceivedMessage(NamedTuple):
    """A consumed message with RocketMQ's fields (decoded by the shared codec). Immutable; a
    NamedTuple builds in a quarter of a frozen dataclass's time (one per message pulled)."""

    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    offset_msg_id: str
    tags: str | None
    keys: list[str]
    properties: dict[str, str]
    body: bytes
    born_timestamp: int
    store_timestamp: int
    born_host: str
    store_host: str
    reconsume_times: int

    def to_json(self) -> dict:
        out = {"topic": self.topic, "queueId": self.queue_id, "queueOffset": self.queue_offset, "msgId": self.msg_id,
               "offsetMsgId": self.offset_msg_id, "tags": self.tags, "keys": self.keys,
               "properties": self.properties, "bornTimestamp": self.born_timestamp,
               "storeTimestamp": self.store_timestamp}
        try:
            out["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            import base64

            out["bodyBase64"] = base64.b64encode(self.body).decode("ascii")
        return out


def decode_messages(body: bytes | None) -> list[ReceivedMessage]:
    """The records of a pull reply. IPv4 records (what nodes write) take one unpack of the fixed
    part and no intermediate `Record`; anything else goes through the full codec. Same result
    either way (tests compare them)."""
    out: list[ReceivedMessage] = []
    body = bytes(body or b"")
    at, end = 0, len(body)
    while at + 4 <= end:
        size = _I32.unpack_from(body, at)[0]
        if size <= 0 or at + size > end:
            raise SendError("SYSTEM_ERROR", f"record at byte {at} of the pull body has size {size}")
        message = _decode_v4(body, at, size) if size > FIXED_V4.size else None
        out.append(message or _decode_full(body[at: at + size]))
        at += size
    return out


def _decode_v4(buf: bytes, at: int, size: int) -> ReceivedMessage | None:
    (_, magic, _, queue_id, _, queue_offset, physical, sys_flag, born_ts, born_host, store_ts, store_host,
     reconsume, _, body_len) = _FIXED_V4_UNPACK(buf, at)
    if sys_flag & _V6_FLAGS or (magic != MESSAGE_MAGIC and magic != MESSAGE_MAGIC_V2):
        return None
    p, end = at + FIXED_V4.size, at + size
    if body_len < 0 or p + body_len + 3 > end:
        return None
    body = buf[p: p + body_len]
    p += body_len
    if magic == MESSAGE_MAGIC:
        topic_len, p = buf[p], p + 1
        if topic_len >= 128:  # a negative signed byte in Java
            return None
    else:
        topic_len, p = _I16.unpack_from(buf, p)[0], p + 2
    if topic_len <= 0 or p + topic_len + 2 > end:
        return None  # let the full codec say what is wrong with it
    topic = _topic_text(buf[p: p + topic_len])
    p += topic_len
    props_len = _I16.unpack_from(buf, p)[0]
    if props_len < 0 or p + 2 + props_len != end:
        return None
    properties = parse_properties(buf[p + 2: end].decode("utf-8"))
    offset_id = (store_host + _I64.pack(physical)).hex().upper()
    keys = properties.get(PROPERTY_KEYS)
    return ReceivedMessage(topic, queue_id, queue_offset, properties.get(PROPERTY_UNIQ_KEY) or offset_id, offset_id,
                           properties.get(PROPERTY_TAGS), split_keys(keys) if keys else [], properties,
                           body, born_ts, store_ts, _host_text(born_host), _host_text(store_host), reconsume)


@lru_cache(maxsize=1024)
def _topic_text(raw: bytes) -> str:
    """A reply's records share a topic: its name is decoded once, not once a message."""
    return raw.decode("utf-8")


def _decode_full(raw: bytes) -> ReceivedMessage:
    record = decode(raw, check_crc=False)
    if not isinstance(record, Record):
        raise SendError("SYSTEM_ERROR", f"undecodable record in a reply: {record}")
    return ReceivedMessage(record.topic, record.queue_id, record.queue_offset, record.uniq_key or record.msg_id,
                           record.msg_id, record.tags, record.keys, dict(record.properties), record.body,
                           record.born_timestamp, record.store_timestamp, str(record.born_host),
                           str(record.store_host), record.reconsume_times)


@lru_cache(maxsize=1024)
def _host_text(raw: bytes) -> str:
    return str(decode_host(raw))


@dataclass(frozen=True, slots=True)
class PullResult:
    status: str  # FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[ReceivedMessage]


class AsyncPullConsumer:
    """Pulls from queues at offsets (with long polling), and a `consume` loop for a group."""

    def __init__(self, endpoint: str, *, timeout: float = 5.0, context: zmq.Context | None = None):
        self.client = AsyncProducer(endpoint, timeout=timeout, retries=0, context=context)

    async def start(self) -> AsyncPullConsumer:
        await self.client.start()
        return self

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> AsyncPullConsumer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _ask(self, header: dict, *, timeout: float | None = None) -> tuple[dict, bytes | None]:
        saved = self.client.timeout
        if timeout is not None:
            self.client.timeout = timeout
        try:
            return await self.client.request(header)
        finally:
            self.client.timeout = saved

    async def pull(self, topic: str, queue_id: int, offset: int, *, max_count: int = 32, subscription: str = "*",
                   suspend_ms: int = 0) -> PullResult:
        """One pull. With `suspend_ms` > 0 an empty pull waits at the node until a message
        arrives or the time is up (long polling)."""
        header = {"code": protocol.PULL_MESSAGE, "topic": topic, "queueId": queue_id, "queueOffset": offset,
                  "maxMsgNums": max_count, "subscription": subscription, "suspend": suspend_ms > 0,
                  "suspendTimeoutMillis": suspend_ms}
        reply, body = await self._ask(header, timeout=self.client.timeout + suspend_ms / 1000)
        status = reply.get("status")
        if status not in ("FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL"):
            raise SendError(status or "SYSTEM_ERROR", reply.get("remark", ""))
        messages = decode_messages(body)
        tags = protocol.parse_subscription(subscription)
        if tags is not None:  # the node filters by tag hash; the client checks the tags exactly
            messages = [m for m in messages if m.tags in tags]
        return PullResult(status, reply["nextBeginOffset"], reply["minOffset"], reply["maxOffset"], messages)

    async def _offset_request(self, code: int, **fields) -> dict:
        reply, _ = await self._ask({"code": code, **fields})
        if reply.get("status") not in ("OK", "QUERY_NOT_FOUND"):
            raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))
        return reply

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return (await self._offset_request(protocol.GET_MAX_OFFSET, topic=topic, queueId=queue_id))["offset"]

    async def min_offset(self, topic: str, queue_id: int) -> int:
        return (await self._offset_request(protocol.GET_MIN_OFFSET, topic=topic, queueId=queue_id))["offset"]

    async def committed(self, group: str, topic: str, queue_id: int) -> int | None:
        reply = await self._offset_request(protocol.QUERY_CONSUMER_OFFSET, consumerGroup=group, topic=topic,
                                           queueId=queue_id)
        return reply.get("offset")

    async def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
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

    async def consume(self, topic: str, group: str, *, start: str = "committed", subscription: str = "*",
                      idle_timeout: float = 5.0, suspend_ms: int = 1000, limit: int | None = None):
        """Yield messages from every queue of `topic`, from the group's committed offsets
        (`start="committed"`, falling back to the first), or `"first"` / `"last"`; commits after
        each pull. Stops after `limit` messages or `idle_timeout` seconds without one."""
        queues = await self.client.queue_count(topic)
        offsets = {}
        for q in range(queues):
            committed = await self.committed(group, topic, q) if start == "committed" else None
            if committed is not None:
                offsets[q] = committed
            elif start == "last":
                offsets[q] = await self.max_offset(topic, q)
            else:
                offsets[q] = await self.min_offset(topic, q)
        delivered, last_message = 0, time.monotonic()
        while limit is None or delivered < limit:
            if time.monotonic() - last_message > idle_timeout:
                return
            wait = min(suspend_ms, max(1, int((idle_timeout - (time.monotonic() - last_message)) * 1000)))
            results = await asyncio.gather(*[self.pull(topic, q, offsets[q], subscription=subscription,
                                                       suspend_ms=wait) for q in range(queues)])
            for q, result in enumerate(results):
                if result.status == "OFFSET_ILLEGAL":
                    offsets[q] = min(max(offsets[q], result.min_offset), result.max_offset)
                    continue
                for message in result.messages:
                    if limit is not None and delivered >= limit:
                        break
                    yield message
                    delivered += 1
                    offsets[q] = message.queue_offset + 1
                    last_message = time.monotonic()
                else:
                    offsets[q] = result.next_begin_offset
                await self.commit(group, topic, q, offsets[q])


class PullConsumer:
    """The blocking pull consumer: an AsyncPullConsumer on a private event-loop thread."""

    def __init__(self, endpoint: str, **options):
        self.loop = aio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mqnode-consumer", daemon=True)
        self.thread.start()
        self.context = zmq.Context()
        self.inner = AsyncPullConsumer(endpoint, context=self.context, **options)
        self._call(self.inner.start())

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def pull(self, topic: str, queue_id: int, offset: int, **kwargs) -> PullResult:
        return self._call(self.inner.pull(topic, queue_id, offset, **kwargs))

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._call(self.inner.max_offset(topic, queue_id))

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._call(self.inner.min_offset(topic, queue_id))

    def committed(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._call(self.inner.committed(group, topic, queue_id))

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._call(self.inner.commit(group, topic, queue_id, offset))

    def query(self, topic: str, key: str, **kwargs) -> list[ReceivedMessage]:
        return self._call(self.inner.query(topic, key, **kwargs))

    def consume(self, topic: str, group: str, **kwargs):
        """The blocking form of AsyncPullConsumer.consume: an iterator of messages."""
        generator = self.inner.consume(topic, group, **kwargs)
        while True:
            try:
                yield self._call(generator.__anext__())
            except StopAsyncIteration:
                return

    def close(self) -> None:
        if self.loop.is_running():
            self._call(self.inner.close())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.context.term()

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
