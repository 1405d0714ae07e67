"""A cluster's pull consumer: `AsyncPullConsumer(namesrv=...)` (and `PullConsumer(namesrv=...)`).

The same methods as one node's consumer, over every broker group of a topic's route
(node.client.routes): a queue is (broker group, queue id), so the methods that name a queue take
`broker=` (needed only while several groups hold the topic); `read_queues` lists every group's;
`consume` walks them all. Each group is read through a consumer of its own for the group's master
as the route names it now, or a slave while the group has no master (a pull redirected to a slave
follows `suggestWhichBrokerId` there).

Pops go to the groups in turn: one that has messages answers, and only when none has any does a
pop wait (`wait_ms`) at the next one. A popped message's receipt handle names its group,
`<brokerName>@<the node's handle>`, so `ack` and `change_invisible` find it again.
"""

from __future__ import annotations

import itertools

from node.client import routes
from node.client.consumer import AsyncPullConsumer, PullResult
from node.client.producer import AsyncProducer, SendError
from node.client.received import PoppedMessage, ReceivedMessage

HANDLE_SEPARATOR = "@"


class AsyncClusterConsumer(AsyncPullConsumer):
    def __init__(self, endpoint: str | None = None, *, namesrv=None, timeout: float = 5.0, context=None,
                 credentials=None):
        if endpoint is not None:
            raise ValueError("a consumer takes endpoint= (one node) or namesrv= (a cluster's name services), not both")
        self.options = {"timeout": timeout, "context": context, "credentials": credentials}
        self.cluster = routes.Cluster(
            namesrv, lambda broker, address: AsyncPullConsumer(address, **self.options).opened(),
            lambda address: AsyncProducer(address, retries=0, **self.options))
        self.client = self.cluster.routes.names.clients[0]  # (its timeout bounds a pop's wait, as one node's)
        self.turns = itertools.count()
        self.redirects = 0

    def opened(self) -> AsyncClusterConsumer:
        self.cluster.start()
        return self

    async def close(self) -> None:
        await self.cluster.close()

    # -- queues --------------------------------------------------------------------------------------

    async def read_queues(self, topic: str) -> list[tuple[str, int]]:
        route = await self.cluster.routes.of(topic)
        return [(q.broker, q.queue_id) for q in route.read]

    async def _group(self, topic: str, broker: str | None) -> AsyncPullConsumer:
        if broker is None:
            route = await self.cluster.routes.of(topic)
            names = sorted({q.broker for q in route.read})
            if len(names) != 1:
                raise SendError("MESSAGE_ILLEGAL", f"topic {topic} is held by the broker groups {', '.join(names)}: "
                                                   f"name one (broker=)")
            broker = names[0]
        return await self.cluster.groups.reader(topic, broker)

    async def _in(self, topic: str, broker: str | None, call):
        """`call(the group's consumer)`; a failure asks for the topic's route again soon."""
        try:
            return await call(await self._group(topic, broker))
        except SendError as e:
            if e.status in routes.GROUP_FAILURES:
                self.cluster.routes.failed(topic)
            raise

    async def pull(self, topic: str, queue_id: int, offset: int, *, broker: str | None = None, **options) -> PullResult:
        return await self._in(topic, broker, lambda group: group.pull(topic, queue_id, offset, **options))

    async def pull_raw(self, topic: str, queue_id: int, offset: int, *, broker: str | None = None, **options):
        return await self._in(topic, broker, lambda group: group.pull_raw(topic, queue_id, offset, **options))

    async def max_offset(self, topic: str, queue_id: int, *, broker: str | None = None) -> int:
        return await self._in(topic, broker, lambda group: group.max_offset(topic, queue_id))

    async def min_offset(self, topic: str, queue_id: int, *, broker: str | None = None) -> int:
        return await self._in(topic, broker, lambda group: group.min_offset(topic, queue_id))

    async def offset_at_time(self, topic: str, queue_id: int, timestamp: int, *, broker: str | None = None) -> int:
        return await self._in(topic, broker, lambda group: group.offset_at_time(topic, queue_id, timestamp))

    async def committed(self, group: str, topic: str, queue_id: int, *, broker: str | None = None) -> int | None:
        return await self._in(topic, broker, lambda g: g.committed(group, topic, queue_id))

    async def commit(self, group: str, topic: str, queue_id: int, offset: int, *, broker: str | None = None) -> None:
        await self._in(topic, broker, lambda g: g.commit(group, topic, queue_id, offset))

    async def query(self, topic: str, key: str, **options) -> list[ReceivedMessage]:
        """Every group's matches."""
        route = await self.cluster.routes.of(topic)
        out = []
        for broker in route.brokers:
            out += await self._in(topic, broker, lambda group: group.query(topic, key, **options))
        return out

    async def view(self, msg_id: str, topic: str | None = None) -> ReceivedMessage | None:
        """Asks each group of the topic's route (only the node that stored an offsetMsgId answers
        it; a msgId is looked up in every group's index). A group that cannot be asked is skipped,
        and its failure raised when no other group has the message."""
        if topic is None:
            raise ValueError("a cluster's view names the topic: its route says which broker groups to ask")
        failure = None
        for broker in (await self.cluster.routes.of(topic)).brokers:
            try:
                found = await self._in(topic, broker, lambda group: group.view(msg_id, topic))
            except SendError as e:
                if e.status not in routes.GROUP_FAILURES:
                    raise
                failure = e
                continue
            if found is not None:
                return found
        if failure is not None:
            raise failure
        return None

    async def send_back(self, message, group: str, *, broker: str | None = None, **options) -> None:
        await self._in(message.topic, broker, lambda g: g.send_back(message, group, **options))

    # -- pop -------------------------------------------------------------------------------------------

    async def pop(self, topic: str, group: str, *, wait_ms: int = 0, **options) -> list[PoppedMessage]:
        route = await self.cluster.routes.of(topic)
        brokers = sorted({q.broker for q in route.read})
        start = next(self.turns)
        self.last_pop_group = group
        order = [brokers[(start + i) % len(brokers)] for i in range(len(brokers))]
        for i, broker in enumerate(order):
            last = i == len(order) - 1
            try:
                messages = await self._in(topic, broker, lambda g: g.pop(topic, group, wait_ms=wait_ms if last else 0,
                                                                          **options))
            except SendError as e:
                if e.status not in routes.GROUP_FAILURES or last:
                    raise
                continue  # that group is away: the others still serve
            if messages:
                for message in messages:
                    message.receipt_handle = f"{broker}{HANDLE_SEPARATOR}{message.receipt_handle}"
                return messages
        return []

    async def peek(self, topic: str, group: str, **options):
        route = await self.cluster.routes.of(topic)
        out = []
        for broker in route.brokers:
            out += await self._in(topic, broker, lambda g: g.peek(topic, group, **options))
        return out

    def _split(self, item, group: str | None) -> tuple[str, str, str]:
        """(broker, the node's handle, group) of a popped message or a handle of this consumer's."""
        handle = item.receipt_handle if isinstance(item, PoppedMessage) else item
        if not isinstance(handle, str) or HANDLE_SEPARATOR not in handle:
            raise SendError("INVALID_RECEIPT_HANDLE", f"not a receipt handle of a cluster's pop: {handle!r}")
        broker, _, inner = handle.partition(HANDLE_SEPARATOR)
        group = group or (item.consumer_group if isinstance(item, PoppedMessage) else None) or self.last_pop_group
        if not group:
            raise ValueError("a bare receipt handle needs its group (or a pop by this consumer before)")
        return broker, inner, group

    async def ack(self, message_or_handle, group: str | None = None) -> bool:
        broker, handle, group = self._split(message_or_handle, group)
        return await (await self._master(broker)).ack(handle, group)

    async def ack_batch(self, messages_or_handles, group: str | None = None) -> list[bool]:
        items = [self._split(item, group) for item in messages_or_handles]
        results: dict[int, bool] = {}
        for broker in sorted({b for b, _, _ in items}):
            mine = [(i, h, g) for i, (b, h, g) in enumerate(items) if b == broker]
            answers = await (await self._master(broker)).ack_batch([h for _, h, _ in mine], mine[0][2])
            results.update(zip([i for i, _, _ in mine], answers))
        return [results[i] for i in range(len(items))]

    async def change_invisible(self, message_or_handle, invisible_ms: int, group: str | None = None) -> str:
        broker, handle, group = self._split(message_or_handle, group)
        fresh = f"{broker}{HANDLE_SEPARATOR}" + await (await self._master(broker)).change_invisible(handle, invisible_ms, group)
        if isinstance(message_or_handle, PoppedMessage):
            message_or_handle.receipt_handle = fresh
        return fresh

    async def pop_state(self, group: str) -> dict:
        """brokerName -> that group's pop state (topic -> queue -> ...), for the groups this consumer reads."""
        return {broker: await client.pop_state(group) for broker, (_, client) in sorted(self.cluster.groups.clients.items())}

    async def _master(self, broker: str) -> AsyncPullConsumer:
        """The group's consumer, for a handle: the one in use, else from any route that names the group."""
        held = self.cluster.groups.clients.get(broker)
        if held is not None:
            return held[1]
        for route in self.cluster.routes.table.values():
            endpoint = route.master(broker)
            if endpoint:
                return self.cluster.groups.of(broker, endpoint)
        raise SendError("INVALID_RECEIPT_HANDLE", f"no route names the broker group {broker}")

    def statistics(self) -> dict:
        return self.cluster.statistics()
