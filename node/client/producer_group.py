"""A producer group's membership at one node: how the node reaches a producer unasked.

RocketMQ's producers heartbeat their group to every broker; the broker keeps the connection each
clientID last heartbeated from (ProducerManager) and asks through it: a transaction's check
(node.client.transaction), a request's reply (node.client.replies). `ProducerMembership` sends
HEART_BEAT with the group at start (so the node knows the producer before its first message) and
every `HEARTBEAT_S`, and UNREGISTER_CLIENT at stop. When its connection drops (the node's front
died and was restarted: the new one knows no producer) it heartbeats again as soon as the node
answers, not at the next period, so checks and replies reach it within a second or two.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from node import protocol
from node.client.errors import SendError

log = logging.getLogger(__name__)
HEARTBEAT_S = 30.0  # as RocketMQ's heartbeatBrokerInterval
AGAIN_TRIES = 20  # heartbeats tried after a drop, backing off 0.1 s to 2 s (~30 s: then the period's takes over)


def client_id_of(owner: object) -> str:
    """A producer's clientID (RocketMQ's ip@instance): unique to `owner` in this process."""
    return f"{socket.gethostname()}@{os.getpid()}@{id(owner):x}"


class ProducerMembership:
    def __init__(self, producer, group: str, client_id: str):
        self.producer, self.group, self.client_id = producer, group, client_id  # (an AsyncProducer of one node)
        self.first: asyncio.Future | None = None  # the first HEART_BEAT, which callers of `start` await together
        self.task: asyncio.Task | None = None  # then one every HEARTBEAT_S
        self.again: asyncio.Task | None = None  # heartbeats after the connection dropped, until one is heard
        producer.lost_listeners.append(self._lost)

    @property
    def started(self) -> bool:
        return self.task is not None

    async def start(self) -> None:
        """Once the node has taken the first heartbeat (concurrent callers share it; one that
        failed is sent again by the next call)."""
        if self.task is not None:
            return
        if self.first is None:
            self.first = asyncio.ensure_future(self.beat())
        try:
            await asyncio.shield(self.first)
        except BaseException:
            self.first = None
            raise
        if self.task is None:
            self.task = asyncio.create_task(self._beats())

    async def stop(self) -> None:
        if self.task is None:
            return
        self.task.cancel()
        self.task = None
        if self.again is not None:
            self.again.cancel()
        try:
            await self.producer.request({"code": protocol.UNREGISTER_CLIENT, "clientID": self.client_id,
                                         "producerGroup": self.group}, timeout=1.0)
        except SendError:
            pass  # (the node forgets it anyway, when the connection is gone)

    async def beat(self) -> None:
        reply, _ = await self.producer.request({"code": protocol.HEART_BEAT, "clientID": self.client_id,
                                                "producerDataSet": [{"groupName": self.group}]})
        if reply.get("status") != "OK":
            raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))

    async def _beats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.beat()
            except SendError as e:
                log.warning("heartbeat of producer group %s: %s", self.group, e)

    def _lost(self) -> None:
        if self.task is not None and (self.again is None or self.again.done()):
            self.again = asyncio.ensure_future(self._beat_until_heard())

    async def _beat_until_heard(self) -> None:
        for attempt in range(AGAIN_TRIES):
            try:
                await self.beat()
                return
            except SendError:
                await asyncio.sleep(min(0.1 * 2 ** attempt, 2.0))
