"""Request-reply: RocketMQ 4.6's `DefaultMQProducer.request` (docs/protocol.md "Request and reply").

`AsyncRequester(endpoint, group).request(topic, body, timeout)` sends a message and returns its
reply. The message carries CORRELATION_ID (fresh for each request), REPLY_TO_CLIENT (this
requester's clientID, which it heartbeats to the node with its producer group: node.client.
producer_group) and TTL (the timeout, ms). A consumer answers with `producer.send_reply(message,
body)` (node.client.message.create_reply, sent as SEND_REPLY_MESSAGE); the node pushes the reply to
this requester's connection (PUSH_REPLY_MESSAGE_TO_CLIENT) and stores it in
`<brokerClusterName>_REPLY_TOPIC`. `request` raises RequestTimeout when no reply came within the
timeout, which counts from the send (as RocketMQ's). A reply that matches no waiting request (it
came too late) is counted (`statistics`) and dropped. `Requester` is the blocking form.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from node import protocol
from node.client import aio
from node.client.message import Message
from node.client.producer import AsyncProducer, SendError, _bytes
from node.client.producer_group import ProducerMembership
from node.client.received import ReceivedMessage, pushed_reply


class RequestTimeout(SendError):
    """The request was sent, and no reply came in time."""


class AsyncRequester:
    """One node's requester (`endpoint=`): the node pushes a reply to the connection its request
    came from, so a requester talks to one node."""

    def __init__(self, endpoint: str, group: str, **options):
        self.producer = AsyncProducer(endpoint, **options)
        self.producer.on_request = self._on_request
        self.membership = ProducerMembership(self.producer, group, self)
        self.waiting: dict[str, asyncio.Future] = {}  # CORRELATION_ID -> the request's future
        self.replied = self.unmatched = self.timed_out = 0

    @property
    def client_id(self) -> str:
        return self.membership.client_id

    async def start(self) -> AsyncRequester:
        if not self.membership.started:
            await self.producer.start()
            await self.membership.start()  # known to the node before its first request's reply
        return self

    async def close(self) -> None:
        await self.membership.stop()
        await self.producer.close()
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(SendError("CLOSED", "the requester was closed"))

    async def __aenter__(self) -> AsyncRequester:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def request(self, topic: str, body: bytes | str, timeout: float = 3.0, *, tags: str | None = None,
                      keys=None, properties: dict[str, str] | None = None,
                      queue_id: int | None = None) -> ReceivedMessage:
        """Send a message and return its reply (a ReceivedMessage: the replier's body and
        properties). RequestTimeout when none came within `timeout` seconds of the send's start;
        SendError when the send itself failed."""
        await self.start()
        began = time.monotonic()
        correlation = str(uuid.uuid4())
        props = dict(properties or {})
        props.update({protocol.PROPERTY_CORRELATION_ID: correlation, protocol.PROPERTY_REPLY_TO_CLIENT: self.client_id,
                      protocol.PROPERTY_MESSAGE_TTL: str(int(timeout * 1000))})
        future = self.waiting[correlation] = asyncio.get_running_loop().create_future()
        try:
            await self.producer.send_message(Message(topic, _bytes(body), tags, keys, props), queue_id=queue_id)
            return await asyncio.wait_for(future, max(0.0, timeout - (time.monotonic() - began)))
        except asyncio.TimeoutError:
            self.timed_out += 1
            raise RequestTimeout("REQUEST_TIMEOUT", f"send request message to <{topic}> OK, but wait reply message "
                                                    f"timeout, {int(timeout * 1000)} ms.") from None
        finally:
            self.waiting.pop(correlation, None)

    def _on_request(self, header: dict, body: bytes | None) -> None:
        """What the node pushed: a reply, to the request its CORRELATION_ID names."""
        if header.get("code") != protocol.PUSH_REPLY_MESSAGE_TO_CLIENT:
            return
        reply = pushed_reply(header, body or b"")
        future = self.waiting.get(reply.properties.get(protocol.PROPERTY_CORRELATION_ID))
        if future is None or future.done():
            self.unmatched += 1  # (its request timed out, or it is no reply of ours)
            return
        self.replied += 1
        future.set_result(reply)

    def statistics(self) -> dict:
        return {"waiting": len(self.waiting), "replied": self.replied, "unmatched": self.unmatched,
                "timedOut": self.timed_out}


class Requester(aio.Blocking):
    """The blocking requester: an AsyncRequester on a private event-loop thread. Thread-safe."""

    def __init__(self, endpoint: str, group: str, **options):
        self._start_loop("mqnode-requester")
        self.inner = self._call(self._make(endpoint, group, options))

    async def _make(self, endpoint: str, group: str, options: dict) -> AsyncRequester:
        import zmq
        return await AsyncRequester(endpoint, group, context=zmq.Context(), **options).start()

    def request(self, topic: str, body: bytes | str, timeout: float = 3.0, **kwargs) -> ReceivedMessage:
        return self._call(self.inner.request(topic, body, timeout, **kwargs))

    def statistics(self) -> dict:
        return self.inner.statistics()
