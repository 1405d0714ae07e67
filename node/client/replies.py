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

With `namesrv=` (a cluster) each request goes to a queue of any broker group, as a send does; the
requester becomes a member of a group's node before its first request there (the reply comes
back through that node), and the replier's cluster producer answers through the group whose
master stored the request (`AsyncProducer.send_reply`).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from node import protocol
from node.client import aio
from node.client.message import Message, body_bytes
from node.client.producer import AsyncProducer, SendError
from node.client.producer_group import ProducerMembership, client_id_of
from node.client.received import ReceivedMessage, pushed_reply


class RequestTimeout(SendError):
    """The request was sent, and no reply came in time."""


class AsyncRequester:
    """A requester of one node (`endpoint=`) or of a cluster (`namesrv=`): a node pushes a reply
    to the connection the requester heartbeated from, so it is a member at each node it asks."""

    def __init__(self, endpoint: str | None = None, group: str | None = None, *, namesrv=None, **options):
        if not group:
            raise ValueError("a requester takes its producer group (group=)")
        protocol.check_group(group, "producer group")
        self.producer = AsyncProducer(endpoint, namesrv=namesrv, **options)  # (endpoint= or namesrv=)
        self.group, self.client_id = group, client_id_of(self)
        self.memberships: dict[int, ProducerMembership] = {}  # id(a node's producer) -> the requester's membership
        self.waiting: dict[str, asyncio.Future] = {}  # CORRELATION_ID -> the request's future
        self.replied = self.unmatched = self.timed_out = 0
        # one node's requester: its membership there (a cluster's: one a group's master, as it first asks there)
        self.membership = self._member(self.producer) if self.producer.cluster is None else None

    def _member(self, producer: AsyncProducer) -> ProducerMembership:
        membership = self.memberships.get(id(producer))
        if membership is None:
            for key, old in list(self.memberships.items()):  # (a group's client closed: its master moved)
                if old.producer.connection is None:
                    if old.task is not None:
                        old.task.cancel()
                    del self.memberships[key]
            producer.on_request = self._on_request
            membership = self.memberships[id(producer)] = ProducerMembership(producer, self.group, self.client_id)
        return membership

    async def start(self) -> AsyncRequester:
        if self.producer.cluster is not None:
            await self.producer.start()  # (a member at each group's node as it first asks there)
        elif not self.membership.started:
            await self.producer.start()
            try:
                await self.membership.start()  # known to the node before its first request's reply
            except BaseException:
                await self.producer.close()  # (its tasks, else destroyed pending with the loop)
                raise
        return self

    async def close(self) -> None:
        for membership in list(self.memberships.values()):
            await membership.stop()
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
        SendError when the send itself failed; ValueError for a timeout that is no number of
        seconds above 0 (nothing is sent: no reply could come in time)."""
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds above 0, not {timeout!r}")
        await self.start()
        began = time.monotonic()
        correlation = str(uuid.uuid4())
        props = dict(properties or {})
        props.update({protocol.PROPERTY_CORRELATION_ID: correlation, protocol.PROPERTY_REPLY_TO_CLIENT: self.client_id,
                      protocol.PROPERTY_MESSAGE_TTL: str(int(timeout * 1000))})
        future = self.waiting[correlation] = asyncio.get_running_loop().create_future()
        message = self.producer._keyed(Message(topic, body_bytes(body), tags, keys, props))  # (one msgId on any group)
        try:
            if self.producer.cluster is None:
                await self.producer.send_message(message, queue_id=queue_id)
            else:
                await self.producer._routed(topic, lambda node, queue: self._ask(node, message, queue), queue_id, None,
                                            None)
            return await asyncio.wait_for(future, max(0.0, timeout - (time.monotonic() - began)))
        except asyncio.TimeoutError:
            self.timed_out += 1
            raise RequestTimeout("REQUEST_TIMEOUT", f"send request message to <{topic}> OK, but wait reply message "
                                                    f"timeout, {int(timeout * 1000)} ms.") from None
        finally:
            self.waiting.pop(correlation, None)

    async def _ask(self, node: AsyncProducer, message: Message, queue_id: int):
        """A request to a group's node, the requester a member there first."""
        await self._member(node).start()
        return await node.send_message(message, queue_id=queue_id)

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

    def __init__(self, endpoint: str | None = None, group: str | None = None, **options):
        self._start_loop("mqnode-requester")
        self.inner = self._made(self._make(endpoint, group, options))

    async def _make(self, endpoint: str | None, group: str | None, options: dict) -> AsyncRequester:
        import zmq
        return await AsyncRequester(endpoint, group, context=zmq.Context(), **options).start()

    def request(self, topic: str, body: bytes | str, timeout: float = 3.0, **kwargs) -> ReceivedMessage:
        return self._call(self.inner.request(topic, body, timeout, **kwargs))

    def statistics(self) -> dict:
        return self.inner.statistics()
