"""proxy: RocketMQ 5's gRPC protocol (`apache.rocketmq.v2.MessagingService`) for the node, so the
official RocketMQ 5 clients in every language can send and consume (docs/protocol.md "gRPC").

A process actor like the others, whose loop is asyncio's: grpc.aio serves `grpcServerPort` at the
host of `listen` (TLS with grpcTlsCertFile/grpcTlsKeyFile), and a housekeeping task beats the
heartbeat, pushes statistics and forgets silent clients. A stalled loop stops the beat, and the
supervisor kills and restarts the process as any hung service.

Its consumers are members of their groups at the node, as RocketMQ 5's proxy makes them: each
one's Heartbeat is a HEART_BEAT under the client's id over the proxy's own connection, and what
the node asks of a member comes to that connection and goes down the client's Telemetry stream
(actors.proxy.members; `_on_ask`).

It reaches the node as any client does, through the front: one connection with the node's own
identity for what only the node may ask (a group's settings), and one per ACL account for what
clients do (with aclEnable, each gRPC call is verified against plain_acl.yml here, then carried
signed as that account, so the front's ACL decides as it does for every client: actors.proxy.auth).
The RPCs are actors.proxy.service's, the meaning of each request the core's (actors.proxy.core),
what lasts between calls actors.proxy.sessions'; this shell runs them and owns the connections,
and renews what push consumers hold (`_renew`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from grpc import aio

from actors import guard
from actors.base import POLL_MS, Actor
from actors.proxy import auth, core, delivery, members, sessions
from actors.proxy.apis import service_pb2_grpc
from actors.proxy.core import Code, Refused
from actors.proxy.service import Service
from actors.proxy.sessions import wall_ms
from actors.registrar import grpc_address
from node import protocol
from node.client.consumer import AsyncPullConsumer
from node.client.producer import AsyncProducer, SendError, shard_queue
from node.client.received import decode_messages, retopic
from node.client.routes import NameServers, Routes
from shm.codec import PROPERTY_REAL_TOPIC
from node.security import Credentials

log = logging.getLogger("mqnode")
GROUP_TTL_S = 5.0  # a group's settings (retries, FIFO) are asked for again after this
TOPICS_TTL_S = 1.0  # a topic found missing is looked for again after this (ensure_topic)
MAX_STREAMS = 10_000  # concurrent streams the server takes (grpc.max_concurrent_streams per connection: 1,000)
EXPIRE_PERIOD_S = 10.0
RENEW_BATCH = 256  # renewals in flight at once
STOP_GRACE_S = 1.0
GIVE_BACK_MS = 1_000  # a message popped for a client that left is visible again after this (RocketMQ 5's NACK_INVISIBLE_TIME)
PRODUCER_BEAT_S = 30.0  # the proxy's heartbeat as a producer of its clients' topics (as RocketMQ's producers)
MAX_PRODUCER_GROUPS = 10_000


class Proxy(Actor):
    name = "proxy"

    def __init__(self, settings):
        super().__init__(settings)
        self.clients = sessions.Clients()
        self.links: dict[tuple, AsyncPullConsumer] = {}  # (access key, secret, front endpoint) -> link (None: the node's own account)
        self.groups: dict[str, tuple[float, dict | None]] = {}
        self.turns: dict[str, int] = {}  # topic -> the queue its last request's messages went to
        self.topics_seen: set[str] = set()  # the node's topics, as last read (ensure_topic)
        self.topics_missing: dict[str, float] = {}  # topic -> when it was last found missing
        self.calls: dict[str, int] = {}
        self.refused = 0
        self.sent = self.received = self.acked = self.pulled = self.recalled = 0
        self.port = 0
        self.verifier: auth.Verifier | None = None
        self.renewals = sessions.Renewals(settings.renewAheadTimeMillis, settings.renewMaxTimeMillis)
        self.renewing: asyncio.Task | None = None
        self.streams: dict[str, list[asyncio.Queue]] = {}  # client id -> its open Telemetry streams' commands
        self.producer_groups: set[str] = set()  # topics transactional clients publish: the node's checks come here
        self.check_turn = 0
        self.beating: asyncio.Task | None = None
        self.ended = self.checks_forwarded = self.checks_dropped = 0
        self.routes: Routes | None = None  # a cluster's routes (namesrvAddr), made in the loop
        self.asks = members.Asks()  # what the node asked of gRPC consumers, until they answer
        self.members_refused = 0
        self.telling: set[asyncio.Task] = set()  # answers, unregistrations and give-backs on their way to the node
        self.given_back = self.receives_left = 0  # (receives_left: cancelled by their clients while they waited)

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        self.start()
        try:
            asyncio.run(self._serve())
        finally:
            self.close()

    async def _serve(self) -> None:
        s = self.settings
        self.verifier = auth.Verifier(s) if s.aclEnable else None
        server = aio.server(options=[("grpc.max_receive_message_length", s.maxMessageSize * 2 + (1 << 20)),
                                     ("grpc.max_send_message_length", 64 << 20),
                                     ("grpc.max_concurrent_streams", 1000),
                                     ("grpc.so_reuseport", 0)],  # (on by default: a second node would share the port)
                            maximum_concurrent_rpcs=MAX_STREAMS)
        service_pb2_grpc.add_MessagingServiceServicer_to_server(Service(self), server)
        if s.namesrvAddr:
            self.routes = Routes(NameServers(s.namesrvAddr, lambda address: AsyncProducer(address, retries=0,
                                                                                          timeout=3.0)))
            self.routes.start()
        address = protocol.host_port(s.grpc_host, s.grpc_port)
        if s.grpcTlsCertFile:
            self.port = server.add_secure_port(address, grpc.ssl_server_credentials([guard.grpc_tls_pair(s)]))
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        log.info("proxy: gRPC (apache.rocketmq.v2) on %s%s", address, " with TLS" if s.grpcTlsCertFile else "")
        self.ready.set()
        expire_due = time.monotonic() + EXPIRE_PERIOD_S
        beat_due = time.monotonic() + PRODUCER_BEAT_S
        try:
            while not self.stopping.is_set():
                await asyncio.sleep(POLL_MS / 1000)
                self.loops += 1
                self._housekeeping()
                if self.renewing is None or self.renewing.done():
                    self.renewing = asyncio.create_task(self._renew())
                if time.monotonic() >= expire_due:
                    expire_due = time.monotonic() + EXPIRE_PERIOD_S
                    self.asks.expire()
                    for client in self.clients.expire():
                        self._tell(members.unregister(client), client.account)
                if time.monotonic() >= beat_due and self.producer_groups:
                    beat_due = time.monotonic() + PRODUCER_BEAT_S
                    self.beating = asyncio.create_task(self._beat_producers())
        finally:
            await server.stop(STOP_GRACE_S)
            for link in self.links.values():
                await link.close()
            if self.routes is not None:
                await self.routes.close()

    async def _renew(self) -> None:
        """Push consumers' messages (auto_renew) kept invisible while their listeners work:
        each due one gets renewSliceTimeMillis more, RENEW_BATCH at a time."""
        due = self.renewals.due(wall_ms(), alive=self.clients.by_id.__contains__)  # (the expired: let go)
        for at in range(0, len(due), RENEW_BATCH):
            chunk = due[at: at + RENEW_BATCH]
            self.renewals.in_flight.update(original for original, _ in chunk)
            try:
                results = await asyncio.gather(*(self._renew_one(original, renewal) for original, renewal in chunk),
                                               return_exceptions=True)
                for (original, _), result in zip(chunk, results):
                    if isinstance(result, tuple):
                        self.renewals.renewed(original, *result)
                    else:  # (the handle no longer holds, the node is away: it comes back when its time runs out)
                        self.renewals.forget(original)
            finally:
                self.renewals.in_flight.difference_update(original for original, _ in chunk)

    async def _renew_one(self, original: str, renewal) -> tuple[str, int]:
        slice_ms = self.settings.renewSliceTimeMillis
        link = await self.link(renewal.account)
        reply, _ = await link.client.request({"code": protocol.CHANGE_MESSAGE_INVISIBLETIME,
                                              "consumerGroup": renewal.group, "extraInfo": renewal.handle,
                                              "invisibleTime": slice_ms})
        if reply.get("status") != "OK":
            raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))
        return reply["extraInfo"], wall_ms() + slice_ms

    # -- transactions --------------------------------------------------------------------------

    async def publishing(self, topics: set[str]) -> None:
        """A producer publishes `topics`: the proxy is a producer of each one's group (the topic)
        at the node, so the checks of their halves come to it (`_on_check`)."""
        if not topics <= self.producer_groups and len(self.producer_groups) < MAX_PRODUCER_GROUPS:
            self.producer_groups |= topics
            await self._beat_producers()

    async def _beat_producers(self) -> None:
        link = await self.link(None)
        groups = sorted(self.producer_groups)
        try:
            for at in range(0, len(groups), 64):  # (a heartbeat names 64 groups at most)
                await link.client.request({"code": protocol.HEART_BEAT, "clientID": f"mqnode-proxy@{self.settings.grpc_port}",
                                           "producerDataSet": [{"groupName": g} for g in groups[at: at + 64]]})
        except SendError as e:
            log.warning("proxy: producer heartbeat: %s", e)

    # -- gRPC consumers as members -------------------------------------------------------------

    async def member_beat(self, client: sessions.Client, account: str | None) -> None:
        """A consumer's Heartbeat: it is (still) a member of its group at the node, over its
        account's connection (the node's ACL wants SUB on the group, as for any member)."""
        client.account = account
        await self._to_node(members.heartbeat(client), account)

    async def member_gone(self, client: sessions.Client) -> None:
        await self._to_node(members.unregister(client), client.account)

    async def _to_node(self, header: dict | None, account: str | None) -> None:
        if header is None:
            return
        try:
            reply = await self.ask(account, header)
        except SendError as e:
            reply = {"status": e.status, "remark": e.remark}
        if reply.get("status") != "OK":  # (a member the node would not take: the admin does not see it)
            self.members_refused += 1
            log.warning("proxy: request %s for the member %s: %s %s", header["code"], header["clientID"],
                        reply.get("status"), reply.get("remark", ""))

    def _tell(self, header: dict | None, account: str | None) -> None:
        """`header` to the node over `account`'s connection, from a callback."""
        if header is not None:
            self._hold(self._tell_now(header, account))

    def _hold(self, telling) -> None:
        """Run `telling` (a coroutine on its way to the node) as a task held until it is done: one
        nobody holds may vanish."""
        task = asyncio.get_running_loop().create_task(telling)
        self.telling.add(task)
        task.add_done_callback(self.telling.discard)

    async def _tell_now(self, header: dict, account: str | None) -> None:
        if header["code"] != protocol.CLIENT_ANSWER:
            return await self._to_node(header, account)
        # (an answer counts only from the connection asked: the member's, its account's)
        with contextlib.suppress(SendError):  # (the node went: its admin is answered by its timeout)
            await (await self.link(account)).client.tell(header)

    def give_back(self, link: AsyncPullConsumer, group: str, messages: list) -> None:
        """Messages popped for a client that left before it had them (it cancelled a waiting
        receive, or its stream broke): visible to the group again in GIVE_BACK_MS, not after the
        whole invisible time it asked for, and no longer renewed."""
        for message in messages:
            handle = self.renewals.current(message.receipt_handle)
            self.renewals.forget(message.receipt_handle)
            self._hold(self._give_back(link, group, handle))
        self.given_back += len(messages)

    @staticmethod
    async def _give_back(link: AsyncPullConsumer, group: str, handle: str) -> None:
        with contextlib.suppress(SendError):  # (acked meanwhile, or the node went: the invisible time decides)
            await link.change_invisible(handle, GIVE_BACK_MS, group)

    def _on_node_request(self, header: dict, body: bytes | None, account: str | None) -> None:
        """What the node sends one of the proxy's connections unasked: a transaction's check (to
        its own), or an admin's ask of a member (to the member's account's)."""
        if header.get("code") == protocol.CHECK_TRANSACTION_STATE:
            self._on_check(header, body)
        elif header.get("code") in protocol.ANSWER_FIELDS and isinstance(header.get("askId"), str):
            self._on_ask(header, body, account)

    def _on_ask(self, header: dict, body: bytes | None, account: str | None) -> None:
        """GET_CONSUMER_RUNNING_INFO or CONSUME_MESSAGE_DIRECTLY of a gRPC member: answered now, or
        its command down the client's Telemetry stream (`client_answered` takes the answer)."""
        client = self.clients.by_id.get(header.get("clientId"))
        if client is None:
            return self._tell(self.asks.refuse(header, "CONSUMER_NOT_ONLINE",
                                               f"The Consumer <{header.get('clientId')}> not online"), account)
        message = None
        if header["code"] == protocol.CONSUME_MESSAGE_DIRECTLY:
            message = delivery.verify_message(body, header.get("consumerGroup", ""))
        streams = self.streams.get(client.client_id)
        if streams and streams[0].full():
            return self._tell(self.asks.refuse(header, "SYSTEM_BUSY", f"the client {client.client_id}'s stream is full"),
                              account)
        command, answer = self.asks.ask(header, message, client, bool(streams))
        if command is not None:
            streams[0].put_nowait(command)  # (not full: checked above, in this same turn of the loop)
        self._tell(answer, account)

    def client_answered(self, client: sessions.Client, command) -> None:
        """A client's ThreadStackTrace or VerifyMessageResult: to the node, for the admin that asked."""
        self._tell(self.asks.answer(client.client_id, command), client.account)

    def _on_check(self, header: dict, body: bytes | None) -> None:
        """CHECK_TRANSACTION_STATE from the node: to a client with an open stream that publishes
        the topic, in turn; none: dropped (the node asks again at its next check)."""
        group = header.get("producerGroup")
        candidates = [cid for cid, client in self.clients.by_id.items() if group in client.topics and cid in self.streams]
        try:
            halves = decode_messages(body)
        except SendError:
            halves = []
        if not candidates or not halves:
            self.checks_dropped += 1
            return
        half = halves[0]
        real = half.properties.get(PROPERTY_REAL_TOPIC)
        if real:
            retopic(half, real)
        self.check_turn += 1
        queue = self.streams[candidates[self.check_turn % len(candidates)]][0]
        try:
            queue.put_nowait(delivery.recover_command(half, header))
            self.checks_forwarded += 1
        except asyncio.QueueFull:
            self.checks_dropped += 1

    def statistics(self) -> dict:
        return super().statistics() | self.clients.statistics() | self.renewals.statistics() | {
            "grpcPort": self.port, "calls": dict(sorted(self.calls.items())), "refused": self.refused,
            "messagesSent": self.sent, "messagesReceived": self.received, "messagesAcked": self.acked,
            "messagesPulled": self.pulled, "messagesRecalled": self.recalled,
            "transactionsEnded": self.ended, "checksForwarded": self.checks_forwarded,
            "checksDropped": self.checks_dropped, "routeLookups": self.routes.lookups if self.routes else 0,
            "membersRefused": self.members_refused, "messagesGivenBack": self.given_back,
            "receivesLeft": self.receives_left} | self.asks.statistics()

    # -- the node --------------------------------------------------------------------------------

    async def link(self, account: str | None, endpoint: str | None = None) -> AsyncPullConsumer:
        """The connection to the front that carries `account`'s requests (None: the node's own),
        one per account and secret: a secret changed in aclFile gets a connection of its own.
        `endpoint`: another node's front (a cluster's group the call is forwarded to)."""
        secret = None if account is None else self.verifier.secret_of(account)
        endpoint = endpoint or self.settings.local_endpoint
        link = self.links.get((account, secret, endpoint))
        if link is None:
            own = guard.node_credentials(self.settings)
            credentials = own if account is None else Credentials(account, secret, own.server_key,
                                                                 curve_pair=own.curve_pair)
            link = self.links[(account, secret, endpoint)] = await AsyncPullConsumer(endpoint, timeout=3.0,
                                                                                     credentials=credentials).start()
            # (the node's checks come to the proxy's own connection, its asks of a member to its account's)
            link.client.on_request = lambda header, body: self._on_node_request(header, body, account)
        return link

    async def master_of(self, topic: str, broker: str) -> str | None:
        """The front of `broker`'s master, as the name services' route of `topic` names it; None
        outside a cluster, or when the route names no such master."""
        if self.routes is None:
            return None
        try:
            return (await self.routes.of(topic)).master(broker)
        except SendError:
            return None

    async def ask(self, account: str | None, header: dict, timeout: float | None = None) -> dict:
        reply, _ = await (await self.link(account)).client.request(header, timeout=timeout)
        return reply

    async def topic_info(self, account: str | None, topic: str) -> dict:
        reply = await self.ask(account, {"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": topic})
        if reply.get("status") != "OK":
            raise Refused(core.status_of(reply.get("status"), reply.get("remark", "")).code,
                          reply.get("remark") or f"topic {topic}: {reply.get('status')}")
        return reply

    async def placements(self, account: str | None, topic: str, here) -> list[tuple[object, dict]]:
        """Where `topic`'s queues are (core.placements): in a cluster (`namesrvAddr`), every broker
        group of the name services' route whose master serves gRPC, so RocketMQ 5 clients reach
        each group's proxy; else, or while the name services do not know the topic, this node's."""
        if self.routes is not None:
            try:
                placed = core.placements((await self.routes.of(topic)).data, self.settings.brokerName,
                                         grpc_address(self.settings), here)
            except SendError:
                placed = None  # (no name service answers, or none knows the topic yet)
            if placed:
                return placed
        return [(here, await self.topic_info(account, topic))]

    async def ensure_topic(self, topic: str) -> None:
        """TOPIC_NOT_FOUND (Refused) unless the node has `topic`, without creating it (a route
        would, under autoCreateTopicEnable): the node's pull answers "no new message" for a topic
        it lacks, RocketMQ's pull TOPIC_NOT_EXIST. The node's topics are read again when one not
        seen is asked for, at most once every TOPICS_TTL_S for the same missing topic."""
        if topic in self.topics_seen:
            return
        now = time.monotonic()
        if now - self.topics_missing.get(topic, float("-inf")) >= TOPICS_TTL_S:
            reply = await self.ask(None, {"code": protocol.GET_ALL_TOPIC_CONFIG})
            if reply.get("status") != "OK":
                raise Refused(core.status_of(reply.get("status"), reply.get("remark", "")).code,
                              reply.get("remark") or f"the node's topics: {reply.get('status')}")
            self.topics_seen = set(reply.get("topicConfigTable") or ())
            if topic in self.topics_seen:
                self.topics_missing.pop(topic, None)
                return
            if len(self.topics_missing) > 10_000:
                self.topics_missing.clear()
            self.topics_missing[topic] = now
        raise Refused(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")

    async def group(self, group: str) -> dict | None:
        """The group's subscriptionGroup.json entry (None: not created yet), cached GROUP_TTL_S."""
        cached = self.groups.get(group)
        if cached is not None and time.monotonic() - cached[0] < GROUP_TTL_S:
            return cached[1]
        reply = await self.ask(None, {"code": protocol.GET_ALL_SUBSCRIPTIONGROUP_CONFIG})
        table = reply.get("subscriptionGroupTable") or {}
        now = time.monotonic()
        if len(self.groups) > 10_000:
            self.groups.clear()
        for name, config in table.items():
            self.groups[name] = (now, config)
        self.groups.setdefault(group, (now, None))
        return self.groups[group][1]

    def picker(self, topic: str, count: int):
        """A request's queue choice on `topic`: a FIFO message's group hashes to its queue, the
        rest take the topic's next queue in turn (one per request)."""
        turn = self.turns[topic] = (self.turns.get(topic, -1) + 1) % count
        if len(self.turns) > 100_000:
            self.turns.clear()

        def queue_of(plan) -> int:
            return shard_queue(plan.shard_key, count) if plan.shard_key is not None else turn
        return queue_of

    async def fifo(self, group: str) -> bool:
        return bool((await self.group(group) or {}).get("consumeMessageOrderly", False))
