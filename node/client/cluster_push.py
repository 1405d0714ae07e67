"""A cluster's push consumer: `PushConsumer(group=..., namesrv=...)`.

A member of a consumer group across broker groups: one push consumer of the group per broker
group (node.client.push, for the group's master as the route names it), all with the same
subscriptions, listener and client id. Each heartbeats its broker group, so every broker group
knows every member, and each rebalances that group's queues among them: every queue of every
group has exactly one member, as with RocketMQ's allocation over the whole route (RocketMQ
balances over all queues at once; per group, a member may hold one queue more of each).

The routes of the subscribed topics are asked for again every `routes.ROUTE_REFRESH_S`, and a
second after a member's pull failed: a group
that appears gets a consumer; a group whose master changed (a slave promoted) gets a new one
for the new master, the old one shut down (its offsets were committed at its last persist).
A retried message goes back to the group it came from, as RocketMQ's send-back does.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import fields

from node import protocol
from node.client import aio, routes
from node.client.producer import AsyncProducer, SendError
from node.client.push import AsyncPushConsumer, PushOptions

SHUTDOWN_S = 10.0  # a group's consumer left behind (its master gone) is given this long to stop


class AsyncClusterPushConsumer:
    def __init__(self, namesrv, group: str, **options):
        self.group, self.options = group, options
        unknown = set(options) - {f.name for f in fields(PushOptions)}
        if unknown:
            raise TypeError(f"unknown PushConsumer options: {', '.join(sorted(unknown))}")
        PushOptions(**options).check()
        self.routes = routes.Routes(routes.NameServers(namesrv, lambda address: AsyncProducer(
            address, retries=0, timeout=options.get("timeout", 5.0), credentials=options.get("credentials"))))
        self.subscriptions: dict[str, tuple[str, str]] = {}  # topic -> (expression, its type)
        self.listener = None
        self.orderly = False
        self.members: dict[str, tuple[str, AsyncPushConsumer]] = {}  # brokerName -> (endpoint, its consumer)
        self.watcher: asyncio.Task | None = None
        self.failed: asyncio.Event | None = None  # a member's pull failed: its group's route may have moved
        self.running = self.stopping = False

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = protocol.EXPRESSION_TAG) -> None:
        protocol.check_expression(expression, expression_type)
        self.subscriptions[topic] = (expression, expression_type)
        if self.running:  # (after start: each group's member, and the groups the topic's route adds)
            for _, member in self.members.values():
                member.subscribe(topic, expression, expression_type)
            self.failed.set()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        for _, member in self.members.values():
            member.unsubscribe(topic)

    def register_listener(self, listener, *, orderly: bool = False) -> None:
        self.listener, self.orderly = listener, orderly

    async def start(self) -> AsyncClusterPushConsumer:
        if self.listener is None or not self.subscriptions:
            raise ValueError("subscribe() and register_listener() before start()")
        self.running, self.stopping = True, False
        self.failed = asyncio.Event()
        await self._follow_routes()
        if not self.members:
            raise SendError("TOPIC_NOT_EXIST", f"no broker group holds {', '.join(sorted(self.subscriptions))}")
        self.watcher = asyncio.ensure_future(self._watch())
        return self

    async def _watch(self) -> None:
        while self.running:
            with contextlib.suppress(TimeoutError):  # (asyncio.timeout: 3.11's wait_for may drop shutdown's cancel)
                async with asyncio.timeout(routes.ROUTE_REFRESH_S):
                    await self.failed.wait()
            await asyncio.sleep(routes.REFRESH_AFTER_FAILURE_S)  # (failures in a burst: one look)
            self.failed.clear()
            with contextlib.suppress(SendError):
                await self._follow_routes()

    async def _follow_routes(self) -> None:
        """A consumer for each broker group's master the subscribed topics' routes name."""
        masters: dict[str, str] = {}
        for topic in sorted(self.subscriptions):
            try:
                route = await self.routes.fetch(topic)
            except SendError as e:
                if e.status == "TOPIC_NOT_EXIST":
                    continue
                raise
            for broker in route.brokers:
                endpoint = route.master(broker)
                if endpoint:
                    masters[broker] = endpoint
        for broker, endpoint in sorted(masters.items()):
            held = self.members.get(broker)
            if held is not None and held[0] == endpoint:
                continue
            if held is not None:  # the group's master moved (a slave promoted): follow it there
                aio.detach(_quietly_shut(held[1]))
            self.members[broker] = (endpoint, await self._member(endpoint))

    async def _member(self, endpoint: str) -> AsyncPushConsumer:
        consumer = AsyncPushConsumer(endpoint, self.group, **self.options)
        for topic, (expression, expression_type) in self.subscriptions.items():
            consumer.subscribe(topic, expression, expression_type)
        consumer.register_listener(self.listener, orderly=self.orderly)
        consumer.on_pull_failure = self.failed.set
        return await consumer.start()

    async def shutdown(self) -> None:
        self.running, self.stopping = False, True
        for _, consumer in self.members.values():  # (at once: what a listener fails from now on is left, node.client.push)
            consumer.stopping = True
        if self.watcher is not None:
            self.watcher.cancel()
            await asyncio.gather(self.watcher, return_exceptions=True)
        await asyncio.gather(*(_quietly_shut(consumer) for _, consumer in self.members.values()))
        self.members.clear()
        await self.routes.close()

    def statistics(self) -> dict:
        per = {broker: consumer.statistics() for broker, (_, consumer) in sorted(self.members.items())}
        total = {key: sum(stats[key] for stats in per.values())
                 for key in ("consumed", "failed", "sentBack", "localRetries", "rebalances")}
        queues = [[broker, *queue] for broker, stats in per.items() for queue in stats["queues"]]
        return {"group": self.group, "queues": queues, **total, "brokers": per}


async def _quietly_shut(consumer: AsyncPushConsumer) -> None:
    try:
        await asyncio.wait_for(consumer.shutdown(), SHUTDOWN_S)
    except (asyncio.TimeoutError, SendError):
        pass  # its group is gone: its members are dropped there after clientChannelExpiredTimeout
