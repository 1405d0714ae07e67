"""Clients of a cluster: routes from the name services, and which broker group gets a send.

A client made with `namesrv=` (RocketMQ's `namesrvAddr`: `host:port;host:port`, `tcp://` too)
asks a name service for each topic's route (GET_ROUTEINFO_BY_TOPIC: the queues each broker group
holds, and each group's addresses by brokerId), keeps it, asks again every `ROUTE_REFRESH_S`
and soon after a request to a group fails. While no name service answers, the routes it has
stay in use: a name service's restart costs clients nothing.

A send picks a queue round-robin over every group's writable queues, passing over the groups
that `FaultTolerance` holds out: one that failed (no answer, a dropped connection, a busy or
unavailable answer) for `isolation_s`, one that was slow for as long as RocketMQ's latency
table says (sendLatencyFaultEnable). A send that failed is sent again to another group
(RocketMQ's retryTimesWhenSendFailed), so a group's loss costs its sends in flight one retry.

`Groups` keeps one client per group, made for the group's master (brokerId 0) as the route
names it now: a slave promoted by `admin role` registers as its group's master, and the next
route brings the client to it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from node import protocol
from node.client import aio
from node.client.errors import SendError

ROUTE_REFRESH_S = 30.0
REFRESH_AFTER_FAILURE_S = 1.0  # a topic's route is asked again at most this often after failures
ISOLATION_S = 30.0
# RocketMQ's MQFaultStrategy: a send that took at least latencyMax[i] ms keeps its group out for notAvailableDuration[i]
LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
PERM_READ, PERM_WRITE = 4, 2
# a group's failure, not the message's: the send goes to another group
GROUP_FAILURES = frozenset({"TIMEOUT", "CLOSED", "SYSTEM_BUSY", "OS_PAGECACHE_BUSY", "SERVICE_NOT_AVAILABLE",
                            "SYSTEM_ERROR", "SLAVE_NOT_AVAILABLE"})


def shard_queue(shard_key: str, count: int) -> int:
    """Ordered sends: one key, one queue (the gRPC proxy places a FIFO message group by it too)."""
    return zlib.crc32(shard_key.encode()) % count


class MessageQueue(NamedTuple):
    broker: str  # the broker group's name (brokerName)
    topic: str
    queue_id: int


class TopicRoute:
    """A topic's route as a name service gave it (RocketMQ's TopicRouteData)."""

    def __init__(self, topic: str, data: dict):
        self.topic = topic
        self.data = data
        self.addresses: dict[str, dict[int, str]] = {}
        for broker in data.get("brokerDatas") or []:
            self.addresses[broker["brokerName"]] = {int(k): v for k, v in (broker.get("brokerAddrs") or {}).items()}
        self.write: list[MessageQueue] = []
        self.read: list[MessageQueue] = []
        for queue in sorted(data.get("queueDatas") or [], key=lambda q: q["brokerName"]):
            name = queue["brokerName"]
            if name not in self.addresses:
                continue
            if queue.get("perm", 6) & PERM_WRITE and MASTER in self.addresses[name]:
                self.write += [MessageQueue(name, topic, q) for q in range(queue.get("writeQueueNums", 0))]
            if queue.get("perm", 6) & PERM_READ:
                self.read += [MessageQueue(name, topic, q) for q in range(queue.get("readQueueNums", 0))]

    @property
    def brokers(self) -> list[str]:
        return sorted(self.addresses)

    def master(self, broker: str) -> str | None:
        """The endpoint of `broker`'s master, as the route names it (None: it has none now)."""
        address = self.addresses.get(broker, {}).get(MASTER)
        return protocol.broker_endpoint(address) if address else None

    def reader(self, broker: str) -> str | None:
        """Where `broker`'s queues are read: its master, or while it has none (lost, its slave not
        promoted yet) the slave of the lowest id, as RocketMQ's clients read (None: no address)."""
        addresses = self.addresses.get(broker) or {}
        return protocol.broker_endpoint(addresses[min(addresses)]) if addresses else None


MASTER = 0
DEFAULT_TOPIC = "TBW102"  # RocketMQ's: registered by the groups that create a topic on its first send


class NameServers:
    """Requests to the name services, one after another until one answers. `make(endpoint)` makes
    an (async) requester with `request(header)`; the last one that answered is asked first."""

    def __init__(self, addresses, make: Callable[[str], object]):
        self.endpoints = protocol.namesrv_endpoints(addresses)
        if not self.endpoints:
            raise ValueError(f"namesrv: no name service address in {addresses!r}")
        self.clients = [make(endpoint) for endpoint in self.endpoints]
        self.current = 0
        self.failures = 0

    async def ask(self, header: dict) -> dict:
        error: Exception | None = None
        for i in range(len(self.clients)):
            at = (self.current + i) % len(self.clients)
            try:
                reply, _ = await self.clients[at].request(header)
            except SendError as e:
                self.failures += 1
                error = e
                continue
            self.current = at
            return reply
        raise error

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


class Routes:
    """Topic routes, kept and refreshed (see the module's docstring)."""

    def __init__(self, names: NameServers, *, clock=time.monotonic):
        self.names = names
        self.clock = clock
        self.table: dict[str, TopicRoute] = {}
        self.fetched: dict[str, float] = {}
        self.lookups = self.lookup_failures = 0
        self.refresher: asyncio.Task | None = None
        self.provisional: set[str] = set()  # topics sent to through the default topic's route (`for_send`)

    def start(self) -> None:
        """The refresher, on the running loop: again when the loop it ran on has closed (a client
        used by one asyncio.run after another)."""
        if self.refresher is None or self.refresher.get_loop().is_closed():
            self.refresher = asyncio.ensure_future(self._refresh_all())

    async def close(self) -> None:
        if self.refresher is not None:
            self.refresher.cancel()
            await asyncio.gather(self.refresher, return_exceptions=True)
            self.refresher = None
        await self.names.close()

    async def of(self, topic: str) -> TopicRoute:
        """`topic`'s route: the one kept, or asked for now. SendError when the topic has none
        (TOPIC_NOT_EXIST) or no name service answers and none is kept."""
        route = self.table.get(topic)
        if route is None:
            route = await self.fetch(topic)
        return route

    async def for_send(self, topic: str) -> TopicRoute:
        """`of(topic)`, or for a topic no group holds yet the route of the groups that create
        topics on a first send (RocketMQ's TBW102, which such groups register), asked for again
        each second until the topic's own route exists."""
        route = self.table.get(topic)
        if route is not None and (topic not in self.provisional
                                  or self.clock() - self.fetched[topic] < REFRESH_AFTER_FAILURE_S):
            return route
        try:
            route = await self.fetch(topic)
            self.provisional.discard(topic)
            return route
        except SendError as e:
            if e.status != "TOPIC_NOT_EXIST":
                raise
        default = await self.fetch(DEFAULT_TOPIC)
        route = self.table[topic] = TopicRoute(topic, default.data)
        self.provisional.add(topic)
        self.fetched[topic] = self.clock()
        return route

    async def fetch(self, topic: str) -> TopicRoute:
        self.lookups += 1
        try:
            reply = await self.names.ask({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": topic})
        except SendError:
            self.lookup_failures += 1
            if topic in self.table:
                return self.table[topic]  # the name services are away: the route kept still serves
            raise
        if reply.get("status") != "OK":
            raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))
        route = self.table[topic] = TopicRoute(topic, reply)
        self.fetched[topic] = self.clock()
        return route

    def failed(self, topic: str) -> None:
        """A request for `topic` failed: its route is asked for again soon (in the background)."""
        if self.clock() - self.fetched.get(topic, 0.0) >= REFRESH_AFTER_FAILURE_S:
            self.fetched[topic] = self.clock()
            aio.detach(self._quietly(topic))

    async def _quietly(self, topic: str) -> None:
        try:
            await self.fetch(topic)
        except SendError:
            pass  # kept as it was; the next failure or period asks again

    async def _refresh_all(self) -> None:
        while True:
            await asyncio.sleep(ROUTE_REFRESH_S)
            for topic in list(self.table):
                await self._quietly(topic)


class FaultTolerance:
    """Which broker groups sends pass over for now (RocketMQ's LatencyFaultToleranceImpl)."""

    def __init__(self, *, isolation_s: float = ISOLATION_S, clock=time.monotonic):
        self.isolation_s = isolation_s
        self.clock = clock
        self.until: dict[str, float] = {}

    def update(self, broker: str, latency_ms: float, failed: bool) -> None:
        if not failed and latency_ms < LATENCY_MAX_MS[2] and broker not in self.until:
            return  # (most sends: fast, and the group held out by nothing)
        if failed:
            self.until[broker] = self.clock() + self.isolation_s
            return
        duration = next((NOT_AVAILABLE_MS[i] for i in reversed(range(len(LATENCY_MAX_MS)))
                         if latency_ms >= LATENCY_MAX_MS[i]), 0)
        if duration:
            self.until[broker] = self.clock() + duration / 1000
        elif broker in self.until and self.until[broker] <= self.clock():
            del self.until[broker]

    def available(self, broker: str) -> bool:
        return self.until.get(broker, 0.0) <= self.clock()


class QueueSelector:
    """Round-robin over a topic's writable queues, passing over held-out groups (and the group a
    retry is leaving); when every group is held out, round-robin over all."""

    def __init__(self, faults: FaultTolerance):
        self.faults = faults
        self.counters: dict[str, itertools.count] = {}

    def select(self, route: TopicRoute, avoid: str | None = None) -> MessageQueue:
        queues = route.write
        if not queues:
            raise SendError("TOPIC_NOT_EXIST", f"no broker group has a writable queue of topic {route.topic}")
        counter = self.counters.setdefault(route.topic, itertools.count())
        start = next(counter)
        for i in range(len(queues)):
            queue = queues[(start + i) % len(queues)]
            if queue.broker != avoid and self.faults.available(queue.broker):
                return queue
        for i in range(len(queues)):  # every group held out: the one not just failed, else any
            queue = queues[(start + i) % len(queues)]
            if queue.broker != avoid:
                return queue
        return queues[start % len(queues)]


class Groups:
    """One client per broker group, for the address the route names now (a producer's: the
    master; a consumer's: the master, else a slave)."""

    def __init__(self, routes: Routes, make: Callable[[str, str], object]):
        self.routes = routes
        self.make = make
        self.clients: dict[str, tuple[str, object]] = {}  # brokerName -> (endpoint, client)

    async def reader(self, topic: str, broker: str):
        """The client that reads `broker`'s queues of `topic` (TopicRoute.reader). SendError when
        the route names no address of the group."""
        endpoint = (await self.routes.of(topic)).reader(broker)
        if endpoint is None:
            raise SendError("SERVICE_NOT_AVAILABLE", f"broker group {broker} has no address in topic {topic}'s route")
        return self.of(broker, endpoint)

    def of(self, broker: str, endpoint: str):
        held = self.clients.get(broker)
        if held is not None and held[0] == endpoint:
            return held[1]
        if held is not None:  # the group's master moved: what waits on the old one fails now (CLOSED), and is sent again
            aio.detach(held[1].close())
        client = self.make(broker, endpoint)
        self.clients[broker] = (endpoint, client)
        return client

    async def close(self) -> None:
        for _, client in self.clients.values():
            await client.close()
        self.clients.clear()


class Cluster:
    """What a client with `namesrv=` shares: the name services, routes, fault tolerance, queue
    selection and a client per group. `make(broker, endpoint)` makes a group's client; the name
    services' requesters are made by `make_names(endpoint)`."""

    def __init__(self, addresses, make: Callable[[str, str], object], make_names: Callable[[str], object], *,
                 isolation_s: float = ISOLATION_S):
        self.routes = Routes(NameServers(addresses, make_names))
        self.faults = FaultTolerance(isolation_s=isolation_s)
        self.selector = QueueSelector(self.faults)
        self.groups = Groups(self.routes, make)
        self.failovers = 0

    def start(self) -> None:
        self.routes.start()

    async def close(self) -> None:
        await self.groups.close()
        await self.routes.close()

    async def send(self, topic: str, call: Callable[[object, int], Awaitable], *, retries: int,
                   queue_id: int | None = None, broker: str | None = None, shard_key: str | None = None):
        """`call(group's client, queue id)` for a queue of `topic` chosen as the module's docstring
        says: its result. A queue named (`queue_id`, with `broker` when several groups
        hold the topic) or a shard key's (one key, one queue: ordered) is not left for another."""
        self.routes.start()  # (a client never started, `async with` or `start()`, kept its routes for good)
        route = self.routes.table.get(topic)
        if route is None or topic in self.routes.provisional:
            route = await self.routes.for_send(topic)
        avoid = None
        for attempt in range(retries + 1):
            if queue_id is not None:
                queue = self._named(route, broker, queue_id)
            elif shard_key is not None and route.write:
                queue = route.write[shard_queue(shard_key, len(route.write))]
            else:
                queue = self.selector.select(route, avoid)
            client = self.groups.of(queue.broker, route.master(queue.broker))
            started = time.monotonic()
            try:
                result = await call(client, queue.queue_id)
            except SendError as e:
                failed = e.status in GROUP_FAILURES
                self.faults.update(queue.broker, (time.monotonic() - started) * 1000, failed)
                if not failed:
                    raise
                self.routes.failed(topic)
                if attempt == retries or queue_id is not None or shard_key is not None:
                    raise
                self.failovers += 1
                avoid = queue.broker
                route = await self.routes.for_send(topic)
                continue
            self.faults.update(queue.broker, (time.monotonic() - started) * 1000, False)
            return result
        raise AssertionError("unreachable")

    @staticmethod
    def _named(route: TopicRoute, broker: str | None, queue_id: int) -> MessageQueue:
        brokers = [broker] if broker else sorted({q.broker for q in route.write})
        if len(brokers) != 1:
            raise SendError("MESSAGE_ILLEGAL", f"queue_id {queue_id} of topic {route.topic}: name its broker group "
                                               f"(broker=, one of {', '.join(brokers)})")
        queue = MessageQueue(brokers[0], route.topic, queue_id)
        if queue not in route.write:
            raise SendError("MESSAGE_ILLEGAL", f"broker group {brokers[0]} has no writable queue {queue_id} of "
                                               f"topic {route.topic}")
        return queue

    def statistics(self) -> dict:
        now = self.faults.clock()
        return {"routes": sorted(self.routes.table), "routeLookups": self.routes.lookups,
                "routeLookupFailures": self.routes.lookup_failures, "failovers": self.failovers,
                "heldOut": {b: round(t - now, 1) for b, t in self.faults.until.items() if t > now},
                "groups": {b: e for b, (e, _) in self.groups.clients.items()}}
