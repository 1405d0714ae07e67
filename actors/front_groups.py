"""The front's clients as members of groups: consumer groups (actors.consumers: heartbeats,
rebalancing's member lists and queue locks), producer groups (actors.producers: whom a
transaction's check or a request's reply reaches), and what the node sends them unasked or asks
them: a group's change (NOTIFY_CONSUMER_IDS_CHANGED), its offsets reset by an admin
(RESET_CONSUMER_CLIENT_OFFSET), a transaction's check, a pushed reply, and
GET_CONSUMER_RUNNING_INFO and CONSUME_MESSAGE_DIRECTLY (actors.client_asks), whose answers it
hands to the admin that asked. A direct consumption's message is read first, by the read service
as a VIEW_MESSAGE_BY_ID whose reply comes back to a pseudo-client of the ask (`ASK_CLIENT`).

A client whose connection closes leaves its groups then, as a RocketMQ broker drops a client
whose channel closes: a consumer killed -9 gives its queues up at once, not after
`clientChannelExpiredTimeout`. ZeroMQ hides connections, so this is done with two facts it does
give: each received message's SRCFD (the fd of the connection it came on: a heartbeat's is the
member's) and the ROUTER's monitor events (ACCEPTED, DISCONNECTED: an fd). The events are read
before any heartbeat is taken (an fd is closed only after its DISCONNECTED is queued, so a new
connection on a reused fd is never mistaken for the old), and a heartbeat still queued from a
connection that has closed since is not taken for a member.

Part of the front's shell: it sends on the front's client ROUTER, which the front owns and gives
it with the ROUTER's monitor, and is called from the front's loop only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import orjson
import zmq
from zmq.utils.monitor import parse_monitor_message

from actors import consumers, replies
from actors.base import incoming, socket
from actors.client_asks import DEFAULT_TIMEOUT_MS, ClientAsks
from actors.consumers import ConsumerGroups
from actors.producers import ProducerGroups
from node import protocol
from node.frames import NOBLOCK, connection_of, send_frames
from shm.control_block import monotonic_ms

MAX_CHECKS_TAKEN = 4096  # the transaction service's checks sent in one turn
MAX_EVENTS_TAKEN = 4096  # connection events read in one look
MAX_CLOSED = 65_536  # closed connections remembered until their fd is reused (fds are fewer: a bound)
ASK_CLIENT = b"\x00mqnode-ask-"  # + an ask's id: where its message's read is answered (no peer's id is this long)


def watch_connections(context: zmq.Context, clients: zmq.Socket) -> zmq.Socket:
    """A PAIR that receives the `clients` ROUTER's connections' opening and closing (its monitor:
    a member's closing drops it from its groups). Unbounded: ZeroMQ's I/O
    thread sends monitor events blocking, so a bounded queue the front had not yet read would
    stall every connection of the process while a storm of clients came or went."""
    address = f"inproc://front-connections-{clients.underlying:x}"
    clients.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    events = socket(context, zmq.PAIR, hwm=0)
    events.connect(address)
    return events


class FrontGroups:
    def __init__(self, settings, clients: zmq.Socket, connection_events: zmq.Socket | None, store_host: str,
                 read: Callable[[bytes, dict], None]):
        self.clients = clients
        self.connection_events = connection_events  # the ROUTER's monitor (None: not watched)
        self.closed: set[int] = set()  # fds whose connection closed and that no new one has taken since
        self.stale_heartbeats = 0
        self.read = read  # the front's: a read request to the read service, its reply to the pseudo-client given
        self.consumers = ConsumerGroups(settings.clientChannelExpiredTimeout, settings.rebalanceLockMaxLiveTime)
        self.producers = ProducerGroups(settings.clientChannelExpiredTimeout)
        self.asks = ClientAsks()
        self.reply_stats = replies.ReplyStats()
        self.store_host = store_host  # (a pushed reply's storeHost)
        self.checks_sent = self.checks_unsent = self.unsent = 0
        self.next_look = time.monotonic() + 1.0

    def serve(self, client: bytes, header: dict, source: zmq.Frame | None = None) -> None:
        """A group request (its fields checked at the edge), answered to `client`; `source`, its
        first frame (the connection a heartbeat came on)."""
        code = header["code"]
        if code == protocol.CLIENT_ANSWER:
            return self._answered(client, header)
        if code in protocol.ANSWER_FIELDS:
            return self._ask_member(client, header)
        if code == protocol.RESET_CONSUMER_CLIENT_OFFSET:
            return self._reset(client, header)
        now = monotonic_ms()
        if code == protocol.GET_PRODUCER_CONNECTION_LIST:
            connections = self.producers.connections(header["producerGroup"], now)  # ([]: none connected now)
            return self._send(client, protocol.reply_header(header.get("opaque"), "OK", connectionSet=connections))
        connection = -1
        if code == protocol.HEART_BEAT:
            self.follow_connections()  # (first: the fd may be a new connection's, its old one closed)
            connection = connection_of(source)
            if connection in self.closed:  # (sent before its connection closed: no member is there)
                self.stale_heartbeats += 1
                return
        reply, changed = consumers.answer(self.consumers, header, client, now, connection)
        if reply.get("status") == "OK" and code == protocol.HEART_BEAT and header.get("producerDataSet"):
            self.producers.heartbeat(header["clientID"], client, header["producerDataSet"], now, connection)
        if code == protocol.UNREGISTER_CLIENT and isinstance(header.get("producerGroup"), str):
            self.producers.unregister(header["clientID"], header["producerGroup"])
        self._send(client, reply)
        self.notify(changed)

    def follow_connections(self) -> None:
        """The client connections opened and closed since the last look: the consumers and
        producers that heartbeated on a closed one leave their groups (the groups are told)."""
        if self.connection_events is None:
            return
        for frames in incoming(self.connection_events, MAX_EVENTS_TAKEN):
            event = parse_monitor_message(frames)
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.closed.discard(fd)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                if len(self.closed) < MAX_CLOSED:
                    self.closed.add(fd)
                self.notify(self.consumers.disconnected(fd))
                self.producers.disconnected(fd)

    def topic_changed(self, topic: str) -> None:
        """A topic's queues changed (`admin topic update|delete`): its subscribers rebalance."""
        self.notify(self.consumers.subscribers(topic))

    def notify(self, groups: set[str]) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED to each member of `groups`; a member whose queue is full
        misses it and rebalances at its next interval anyway."""
        if groups:
            self._tell_members(groups, consumers.notice)

    def _tell_members(self, groups: set[str], frame_of: Callable[[str], bytes]) -> int:
        """`frame_of(group)` to each member of `groups` over its own DEALER (once a connection):
        how many connections took it."""
        told = 0
        for group, routing_id in self.consumers.routing_ids(groups):
            with contextlib.suppress(zmq.ZMQError):  # (its queue full, or its connection gone)
                send_frames(self.clients, [routing_id, frame_of(group)], NOBLOCK)
                told += 1
        return told

    def look(self, now: float) -> None:
        """Every turn: asks no member answered in time are answered SYSTEM_ERROR. Once a second:
        members silent past clientChannelExpiredTimeout leave their groups."""
        for ask in self.asks.expire(monotonic_ms()) if self.asks.waiting else ():
            self._send(ask.asker, protocol.reply_header(
                ask.opaque, "SYSTEM_ERROR", f"the consumer {ask.client_id} did not answer in time (invoke timeout)"))
        if now < self.next_look:
            return
        self.next_look = now + 1.0
        self.notify(self.consumers.expire(monotonic_ms()))
        self.producers.expire(monotonic_ms())

    # -- asking a member -----------------------------------------------------------------------------

    def _ask_member(self, client: bytes, header: dict) -> None:
        """GET_CONSUMER_RUNNING_INFO or CONSUME_MESSAGE_DIRECTLY: asked of the member over its own
        connection (a direct consumption once its message is read); the member's answer, or the
        node's SYSTEM_ERROR when none comes in time, goes to `client`."""
        code, group, client_id, opaque = header["code"], header["consumerGroup"], header["clientId"], header.get("opaque")
        member = self.consumers.member(group, client_id)
        if member is None:  # (RocketMQ's remark)
            return self._send(client, protocol.reply_header(opaque, "CONSUMER_NOT_ONLINE",
                                                            f"The Consumer <{client_id}> not online"))
        asked = {"code": code, "consumerGroup": group, "clientId": client_id}
        if code == protocol.GET_CONSUMER_RUNNING_INFO:
            asked["jstackEnable"] = header.get("jstackEnable") is True
        else:
            asked["msgId"] = header["msgId"]
        ask = self.asks.ask(client, opaque, member.routing_id, client_id, monotonic_ms(),
                            header.get("timeoutMillis", DEFAULT_TIMEOUT_MS), protocol.ANSWER_FIELDS[code], asked)
        if ask is None:
            return self._send(client, protocol.reply_header(opaque, "SYSTEM_BUSY",
                                                            f"{self.asks.limit} asks of consumers wait already"))
        ask_id = ask.header["askId"]
        if code == protocol.CONSUME_MESSAGE_DIRECTLY:  # its message first (`viewed`)
            return self.read(ASK_CLIENT + ask_id.encode(),
                             {"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": header["msgId"], "opaque": ask_id})
        self._ask(ask_id, member.routing_id, [orjson.dumps(ask.header)])

    def viewed(self, pseudo_client: bytes, frames: list[bytes]) -> None:
        """The read of a direct consumption's message: on to the member with the message, or
        the read's refusal (QUERY_NOT_FOUND, SYSTEM_BUSY, ...) to the admin."""
        ask_id = pseudo_client[len(ASK_CLIENT):].decode()
        ask = self.asks.get(ask_id)
        if ask is None:
            return  # (it ran out meanwhile: its admin was answered)
        reply = orjson.loads(frames[0])  # (the read service's own reply: one that does not parse is a bug)
        if reply.get("status") != "OK" or len(frames) < 2:
            self.asks.drop(ask_id)
            return self._send(ask.asker, protocol.reply_header(ask.opaque, reply.get("status", "SYSTEM_ERROR"),
                                                               reply.get("remark", "")))
        self._ask(ask_id, ask.member, [orjson.dumps(ask.header), frames[1]])

    def _ask(self, ask_id: str, routing_id: bytes, frames: list[bytes]) -> None:
        try:
            send_frames(self.clients, [routing_id, *frames], NOBLOCK)
        except zmq.ZMQError as e:
            ask = self.asks.drop(ask_id)  # (answered here)
            self._send(ask.asker, protocol.reply_header(ask.opaque, "SYSTEM_ERROR",
                                                        f"the consumer {ask.client_id} cannot be reached: {e.strerror}"))

    def _answered(self, member: bytes, header: dict) -> None:
        """CLIENT_ANSWER: the member's answer, to the admin that asked (no reply to the member)."""
        ask = self.asks.answer(header.get("askId"), member)
        if ask is None:
            return
        status, field = header["status"], ask.answer_field
        if status == "OK" and field not in header:
            return self._send(ask.asker, protocol.reply_header(
                ask.opaque, "SYSTEM_ERROR", f"the consumer {ask.client_id} answered without {field}"))
        fields = {field: header[field]} if status == "OK" else {}
        self._send(ask.asker, protocol.reply_header(ask.opaque, status, header.get("remark"), **fields))

    def _reset(self, client: bytes, header: dict) -> None:
        """An admin reset the group's offsets of a topic (and committed them): each member is
        told over its own connection, as RocketMQ's broker tells its clients, and starts its
        queues of the topic again from there. Reply OK with `notified`, how many were told."""
        notice = orjson.dumps({"code": protocol.RESET_CONSUMER_CLIENT_OFFSET, "consumerGroup": header["consumerGroup"],
                               "topic": header["topic"], "offsetTable": header["offsetTable"]})
        told = self._tell_members({header["consumerGroup"]}, lambda group: notice)
        self._send(client, protocol.reply_header(header.get("opaque"), "OK", notified=told))

    # -- what the node sends unasked -----------------------------------------------------------------

    def send_checks(self, checks_in: zmq.Socket) -> None:
        """The transaction service's checks, each to one producer of its group that is still
        connected (ROUTER_MANDATORY says which are not); none connected: it is not sent, and the
        half is asked about again at the next check (and discarded after transactionCheckMax)."""
        for group_raw, header, body in incoming(checks_in, MAX_CHECKS_TAKEN):
            group = group_raw.decode()
            for client_id, routing_id in self.producers.routes(group):
                try:
                    send_frames(self.clients, [routing_id, header, body], NOBLOCK)
                except zmq.ZMQError as e:
                    if e.errno == zmq.EHOSTUNREACH:
                        self.producers.gone(client_id, group)
                    continue  # (its queue full: the next producer)
                self.checks_sent += 1
                break
            else:
                self.checks_unsent += 1

    def push_reply(self, header: dict, body: bytes) -> str:
        """A SEND_REPLY_MESSAGE's reply to its requester's connection: "" once ZeroMQ took it,
        else why not (counted either way)."""
        why = self._push_reply(header, body)
        self.reply_stats.count(why)
        return why

    def _push_reply(self, header: dict, body: bytes) -> str:
        client_id, why = replies.requester(header)
        if client_id is None:
            return why
        routing_id = self.producers.find(client_id)
        if routing_id is None:
            return replies.not_found(client_id)
        push = replies.push_header(header, self.store_host, int(time.time() * 1000))
        try:
            send_frames(self.clients, [routing_id, orjson.dumps(push), body], NOBLOCK)
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                self.producers.forget(client_id)
            return f"push reply message to {client_id} fail: {e.strerror}"
        return ""

    def _send(self, client: bytes, header: dict) -> None:
        try:
            send_frames(self.clients, [client, orjson.dumps(header)], NOBLOCK)
        except zmq.ZMQError:
            self.unsent += 1  # the client is gone or not reading: its reply is dropped

    def statistics(self) -> dict:
        return {"consumerGroups": self.consumers.statistics() | {"staleHeartbeats": self.stale_heartbeats},
                "producerGroups": self.producers.statistics() | {"checksSent": self.checks_sent,
                                                                 "checksUnsent": self.checks_unsent},
                "replies": self.reply_stats.statistics(), "consumerAsks": self.asks.statistics()}
