"""front: the node's client-facing ZeroMQ ROUTER.

Sockets:
- `clients` ROUTER, bound to `listen`: requests in, replies out (routed by the client's id).
- links, not sockets (actors.links): a turn's send requests, together, to the first ingress
  worker that keeps up (`actors.links.first_keeping_up`) or, with `ingressWorkers = 0`, to the
  write service; their replies back from the write service, the group commit and the ingress
  workers; read requests to the read service when this process hosts it (compact). Where the
  other end is another process, a link is a ring in shared memory; where this process hosts it
  (actors.host), a local link. The router never asks which: it is the same code either way.
- `replies` PULL, bound: joined replies from the other services (and the rare read reply too
  large for a ring message).
- `stats` PULL, bound: every actor's statistics, once a second.
- links to the read side: reads to the pull workers, when they are processes of their own
  (split: rings, each read to the first worker that keeps up, actors.links.SpreadOutbox); pops,
  acks and peeks to the pop service (ring `front-to-pop`), transactions' ends and states to the
  transaction service (`front-to-transaction`); their replies back on rings. A request no ring
  can take yet (its service far behind) waits at the front (actors.links.WaitingOutbox). The
  pop and transaction services' own sends (dead letters; commits and op records) come on those
  rings too, as replies to their pseudo-clients (POP_CLIENT, TRANSACTION_CLIENT): the front
  serves them as the schedule service's re-puts, and answers them on the service's ring; and
  the pop service's progress (each popped queue's low), which it commits as consumer offsets.
- `reput-in` PULL, `reput-out` PUSH: the schedule service's re-puts, and their answers.

Through `clients` it also sends what clients get unasked: a group's changes to its members, a
transaction's check to a producer of its group, and a request's reply to its requester
(SEND_REPLY_MESSAGE: pushed, then stored as a send; actors.replies); and it asks a member for
what only the member knows (GET_CONSUMER_RUNNING_INFO). The groups' part of this is
actors.front_groups.

It also keeps the consumer offsets (`config/consumerOffset.json`, persisted every
`flushConsumerOffsetInterval` ms and at stop). With `frontPinBelowCpu` set, while its load is
light it keeps all its threads on one CPU (actors.host_tuning): the wake-ups between its loop and
its ZeroMQ I/O thread then stay local, which shortens a lone send's round trip. While it
serves, it holds a PM QoS request that keeps idle CPUs from halting (`cpuIdleLatencyUs`,
actors.host_tuning), so every thread a request wakes wakes quickly.

It validates what needs the topic table (it is the table's single writer): topic names,
auto-creation, queue ids; answers route and runtime-info requests itself; refuses with
SYSTEM_BUSY when `sendQueueCapacity` requests are already waiting (fast-fail, with the age
check `waitTimeMillsInSendQueue` made where requests are taken off the queue); refuses with
SERVICE_NOT_AVAILABLE once draining for shutdown. A malformed frame or unknown code gets an
error reply; nothing a client sends can stop this loop.
"""

from __future__ import annotations

import logging
import time

import orjson
import zmq

from actors.base import Actor, InjectedBug, incoming, injected_bug_code, socket
from actors.broker_config import BrokerConfig
from actors.front_ha import FrontReplication
from actors.links import SpreadOutbox, WaitingOutbox, first_keeping_up, inbox, outbox
from actors.router import Router, To
from actors.pop import FORGET_CLIENT, POP_CLIENT
from actors.schedule import REPUT_CLIENT
from actors.transaction import TRANSACTION_CLIENT
from actors.wire import SERVICE_SEND, join_frames, read_meta, read_size, read_to_wire, send_meta, unpack_replies
from actors import edge, guard, replies
from actors.front_groups import ASK_CLIENT, FrontGroups, watch_connections
from actors.host_tuning import NO_REQUEST, CpuLatencyRequest, ProcessPinner
from actors.offsets import ConsumerOffsets, SubscriptionGroups
from actors.runtime_info import NodeStatistics
from actors.topics import TopicTable
from node import protocol
from node.frames import NOBLOCK, peer_address, send_frames
from shm.control_block import heartbeat_slot, monotonic_ms

log = logging.getLogger("mqnode")
MAX_TAKE = 512  # messages taken from one socket per turn, so no socket starves the others
SEND_WAIT_MS = 20
# reads no pull worker can take yet (one restarting, or reconnecting to a restarted front) wait this
# long, and this many, before SYSTEM_BUSY: under the client's own 3 s timeout
READ_PATIENCE_S = 2.0
READS_WAITING = 10000
WORKER_SILENT_MS = 1000  # a pull worker whose heartbeat is older is not sent reads while another beats
SHIP_BYTES = 1 << 20  # a turn's sends go out in ring messages of about this size at most
FRAMES_OVERHEAD = 16  # join_frames' length prefixes of a send's four frames


class Front(Actor):
    name = "front"

    def __init__(self, settings, *, hosts: dict[str, list[str]] | None = None):
        super().__init__(settings)
        self.hosts = hosts or {}  # service -> labels of the processes hosting it (node.server.topology)
        # opened by `open`, in the actor's thread (None: not opened)
        self.topics: TopicTable | None = None
        self.members: FrontGroups | None = None  # consumer and producer groups (actors.front_groups)
        self.acl = self.acl_file = self.curve = None
        self.sends_out: list = []
        self.reads_out = self.pops_out = self.transactions_out = None
        self.service_outs: dict = {}  # pseudo-client -> the ring its service's re-puts are answered on
        self.waiting_outs: tuple = ()  # (each of those three, what its refusal past patience says)
        self.inbox = None
        self.pinner: ProcessPinner | None = None
        self.node_stats: NodeStatistics | None = None  # what `admin stats` answers
        self.cpu_latency: CpuLatencyRequest | None = None
        self.accepting = True
        self.in_flight = self.requests = self.refused = self.malformed = 0

    def open(self) -> None:
        s = self.settings
        self.topics = TopicTable(s.root / "config", auto_create=s.autoCreateTopicEnable,
                                 default_queues=s.defaultTopicQueueNums)
        self.clients = socket(self.context, zmq.ROUTER, hwm=100000)
        self.clients.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting client takes its id back
        # a frame for a client whose connection is gone raises (EHOSTUNREACH) instead of vanishing:
        # a transaction's check then goes to the group's next producer
        self.clients.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.connection_events = watch_connections(self.context, self.clients)  # (before it binds: every one)
        self.curve = guard.secure_clients(self.clients, s, self.context)  # (before it binds)
        protocol.ipv6_ready(self.clients, s.listen)
        self.clients.bind(s.listen)
        self.acl, self.acl_file = guard.open_acl(s) or (None, None)
        self.next_acl_look = time.monotonic() + 1.0
        # sends go out through links (actors.links), a turn's together, to the write service or to
        # each ingress worker in turn; their replies come back the same way
        self.sends_out = ([outbox(self, f"front-to-ingress-{i}", join_frames) for i in range(s.ingressWorkers)]
                          or [outbox(self, "front-to-writer", join_frames)])
        self.outgoing: list[tuple] = []  # this turn's sends: (parts, client, request, oneway)
        self.outgoing_bytes = 0
        self.inbox = inbox(self, unpack_replies)
        self.reads_out = WaitingOutbox(self._reads_out(), limit=READS_WAITING, patience_s=READ_PATIENCE_S)
        self.cleans = socket(self.context, zmq.PUSH, hwm=100)  # `admin clean` to the clean service
        self.cleans.setsockopt(zmq.SNDTIMEO, SEND_WAIT_MS)
        self.cleans.bind(self.endpoints["clean"])
        self.schedules = socket(self.context, zmq.PUSH, hwm=10000)  # send-backs to the schedule service
        self.schedules.setsockopt(zmq.SNDTIMEO, SEND_WAIT_MS)
        self.schedules.bind(self.endpoints["schedule"])
        self.pops_out = WaitingOutbox(outbox(self, "front-to-pop", read_to_wire),  # pops, acks and peeks
                                      limit=READS_WAITING, patience_s=READ_PATIENCE_S)
        self.ha_admin = socket(self.context, zmq.PUSH, hwm=100)  # `admin role` to a slave's ha-client
        self.ha_admin.setsockopt(zmq.SNDTIMEO, SEND_WAIT_MS)
        self.ha_admin.bind(self.endpoints["ha-admin"])
        self.transactions_out = WaitingOutbox(outbox(self, "front-to-transaction", read_to_wire),  # its ends
                                              limit=READS_WAITING, patience_s=READ_PATIENCE_S)
        self.waiting_outs = ((self.reads_out, "no pull worker took the read"),
                             (self.pops_out, "the pop service took no request"),
                             (self.transactions_out, "the transaction service took no request"))
        # the services whose own sends come as replies to their pseudo-client: answered on their ring
        self.service_outs = {POP_CLIENT: self.pops_out, TRANSACTION_CLIENT: self.transactions_out}
        self.checks_in = socket(self.context, zmq.PULL, hwm=1_000_000)  # its checks, to a producer of the group
        self.checks_in.bind(self.endpoints["transaction-checks"])
        self.members = FrontGroups(s, self.clients, self.connection_events, "%s:%d" % s.store_address,
                                   read=self._read_for_ask)
        # a topic a send creates: its subscribers (consumers do not create topics) rebalance at once
        self.topics.on_auto_create = self.members.topic_changed
        self.reply_topic = protocol.reply_topic(s.brokerClusterName)
        # the schedule service's re-puts in, their answers out: private (the run directory is 0700)
        self.reput_in = socket(self.context, zmq.PULL, hwm=100000)
        self.reput_in.bind(self.endpoints["reput-in"])
        self.reput_out = socket(self.context, zmq.PUSH, hwm=100000)
        self.reput_out.connect(self.endpoints["reput-out"])
        self.offsets = ConsumerOffsets(s.root / "config")
        self.groups = SubscriptionGroups(s.root / "config")
        self.replication = FrontReplication(s, self.control, self.topics, self.groups, self.offsets)
        self.topics.on_persist = self.groups.on_persist = self.replication.config_persisted
        self.topics.log_span = lambda: (self.control.get("min_offset"), self.control.get("written"))
        self.router = Router(s, self.topics, self.offsets, self.groups,
                             brokers=lambda: self.replication.brokers(self.node_stats.actors),
                             config=BrokerConfig(s, self.control))
        self.next_offsets_persist = time.monotonic() + s.flushConsumerOffsetInterval / 1000
        self.replies = socket(self.context, zmq.PULL, hwm=100000)
        self.replies.bind(self.endpoints["replies"])
        self.stats_in = socket(self.context, zmq.PULL, hwm=1000)
        self.stats_in.bind(self.endpoints["stats"])
        self.items = [(sock, zmq.POLLIN) for sock in (self.clients, self.replies, self.stats_in, self.reput_in,
                                                      self.checks_in, self.connection_events)]
        self.items += self.inbox.poll_items()
        self.pinner = ProcessPinner(s.frontPinBelowCpu) if s.frontPinBelowCpu > 0 else None
        self.cpu_latency = CpuLatencyRequest(s.cpuIdleLatencyUs) if s.cpuIdleLatencyUs != NO_REQUEST else None
        self.bug_code = injected_bug_code(self.name)
        self.node_stats = NodeStatistics(s, self.hosts, int(time.time() * 1000))

    def drain_mode(self) -> None:
        """Shutdown: refuse new sends from now on; those in flight still get their replies."""
        self.accepting = False

    def _reads_out(self):
        """Where read requests go: the read service of this process (a local link), else the pull
        workers' rings, each read to the first that keeps up."""
        local = self.local_links.get("front-to-pull-0") if self.local_links is not None else None
        if local is not None:
            return local
        return SpreadOutbox([outbox(self, f"front-to-pull-{i}", read_to_wire)
                             for i in range(self.settings.pull_processes)], alive=self._beating)

    def _beating(self, label: str) -> bool:
        """Whether the process `label` turned its loop lately (its heartbeat, shm.control_block):
        a pull worker's idle loop turns at least every 100 ms."""
        return monotonic_ms() - self.control.heartbeat_of(heartbeat_slot(label)) < WORKER_SILENT_MS

    def poll_items(self) -> list:
        return self.items

    def timeout_ms(self) -> int:
        # (replies waiting on a link already: no sleep; reads waiting for a pull worker: a short one)
        return self.inbox.wait_ms(10 if self._waiting() else 50)

    def step(self, events: set) -> None:
        if self.replies in events:
            self._forward_replies()
        for answers in self.inbox.take():  # (every turn: a ring's message may predate its doorbell's listener)
            self._answer_replies(answers)
        if self.clients in events:
            self._serve_clients()
        if self._waiting():
            self._retry_waiting()
        if self.reput_in in events:
            self._serve_reputs()
        if self.checks_in in events:
            self.members.send_checks(self.checks_in)
        if self.connection_events in events:
            self.members.follow_connections()
        if self.outgoing:
            self._ship_sends()
        if self.stats_in in events:
            self._take_stats()
        if self.pinner is not None:
            self.pinner.check()
        now = time.monotonic()
        if self.cpu_latency is not None:
            self.cpu_latency.check(now, self.clients in events)
        slave = self.replication.is_slave()
        if now >= self.next_offsets_persist and not slave:  # (a slave's are its master's)
            self.next_offsets_persist = now + self.settings.flushConsumerOffsetInterval / 1000
            self.offsets.persist()
            self.topics.persist_unwritten()  # (a disk that was full)
            self.groups.persist_unwritten()
        self.members.look(now)
        self.replication.follow(now, slave)
        if now >= self.next_acl_look:
            self.next_acl_look = now + 1.0
            self._follow_acl()

    def _follow_acl(self) -> None:
        """The ACL file changed: its new rules. A slave with none yet: its master's, once the
        ha-client has it (actors.guard.acl_path)."""
        if self.acl is not None:
            guard.reload_acl(self.acl, self.acl_file)
        elif self.settings.is_slave:
            self.acl, self.acl_file = guard.open_masters_acl(self.settings) or (None, None)

    def drain(self) -> None:
        """Last in its process (actors.host): the replies its neighbours' drains sent are answered."""
        if self.pinner is not None:
            self.pinner.release()
        self._release_cpu_latency()
        for answers in self.inbox.take():
            self._answer_replies(answers)
        if not self.replication.is_slave():
            self.offsets.persist()

    # -- clients -----------------------------------------------------------------------------------

    def _serve_clients(self) -> None:
        acl = self.acl
        peers = acl is not None and acl.uses_addresses  # (reading the address costs ~0.3 µs a request)
        for frames, source in incoming(self.clients, MAX_TAKE, sourced=True):
            self.requests += 1
            client, rest = frames[0], frames[1:]
            try:
                request = protocol.decode_request(rest)
                # the ACL (actors.acl) before anything else looks at the request
                remark = None if acl is None else acl.check(request.header, request.body,
                                                            peer_address(source) if peers else None)
                if remark is None:
                    self._route(client, request, rest, source)
                else:
                    self._refuse(client, request, request.header.get("oneway") is True, "NO_PERMISSION", remark)
            except protocol.ProtocolError as e:
                self.malformed += 1
                self._reply(client, protocol.error_reply(protocol.opaque_of(rest), "SYSTEM_ERROR", str(e)))

    def _route(self, client: bytes, request: protocol.Request, frames: list[bytes],
               source: zmq.Frame | None = None) -> None:
        """The router core (actors.router) says where the request goes, its fields checked at the
        edge: from here on an exception is the node's bug, and stops this process. `source`: the
        request's first frame (which connection it came on, for a heartbeat)."""
        if request.code == self.bug_code:
            raise InjectedBug(f"request code {request.code} (MQNODE_INJECT_BUG)")
        route = self.router.route(request)
        if route.to is To.SEND:
            self._send(client, request, frames)
        elif route.to is To.READ:
            self._read(self.reads_out, client, request, frames[0], "a pull worker")
        elif route.to is To.SCHEDULE:  # (its header as the router completed it)
            self._forward(self.schedules, client, request, [orjson.dumps(request.header)],
                          "the schedule service is not running; try again")
        elif route.to is To.POP:  # (its header as the router completed it)
            self._read(self.pops_out, client, request, orjson.dumps(request.header), "the pop service")
        elif route.to is To.TRANSACTION:
            self._read(self.transactions_out, client, request, frames[0], "the transaction service")
        elif route.to is To.CLEAN:
            self._forward(self.cleans, client, request, frames, "the clean service is not running; try again")
        elif route.to is To.GROUPS:
            self.members.serve(client, request.header, source)
        elif route.to is To.REPLY:
            self._send_reply(client, request, frames)
        elif route.to is To.HA:
            self._ha(client, request)
        elif route.to is To.RUNTIME:
            self._reply(client, [orjson.dumps(protocol.reply_header(request.opaque, "OK", **self._runtime_info()))])
        else:
            self._reply(client, route.frames)
            if request.code in (protocol.UPDATE_AND_CREATE_TOPIC, protocol.DELETE_TOPIC_IN_BROKER):
                self.members.topic_changed(request.header["topic"])
            if request.code in (protocol.DELETE_SUBSCRIPTIONGROUP, protocol.DELETE_TOPIC_IN_BROKER):
                self._forget_pops(request.header)

    def _read(self, out: WaitingOutbox, client: bytes, request: protocol.Request, header_raw: bytes,
              who: str) -> None:
        """A read, pop or transaction request to its service; refused when no ring message can
        hold it (a header of megabytes) or when READS_WAITING already wait."""
        size, largest = read_size(client, header_raw), out.max_message
        if size > largest:
            return self._reply(client, protocol.error_reply(
                request.opaque, "SYSTEM_ERROR", f"a read request of {size} bytes; this node takes at most {largest}"))
        if not out.send((request.header, client, time.monotonic_ns(), header_raw), time.monotonic()):
            self._reply(client, protocol.error_reply(request.opaque, "SYSTEM_BUSY",
                                                     f"{READS_WAITING} requests wait for {who}"))

    def _forget_pops(self, header: dict) -> None:
        """A group or topic gone (its offsets too): the pop service forgets its pop state, so a
        group of the name starts anew, as its committed offsets do."""
        group, topic = header.get("groupName"), header.get("topic")
        if group in self.groups.groups or (topic is not None and self.topics.get(topic) is not None):
            return  # (the delete was refused)
        word = {"consumerGroup": group} if group is not None else {"topic": topic}
        if not self.pops_out.send((word, FORGET_CLIENT, 0, orjson.dumps(word)), time.monotonic()):
            log.warning("the pop service's ring is full: the pop state of deleted %s stays", word)

    def _read_for_ask(self, pseudo_client: bytes, header: dict) -> None:
        """A direct consumption's message, read by the read service; its reply comes back to the
        ask's pseudo-client (`_reply`: actors.front_groups.FrontGroups.viewed)."""
        self._read(self.reads_out, pseudo_client, protocol.Request(header, b""), orjson.dumps(header), "a pull worker")

    def _send_reply(self, client: bytes, request: protocol.Request, frames: list[bytes]) -> None:
        """SEND_REPLY_MESSAGE (actors.replies): checked as a send, pushed to its requester, then
        stored as a SEND_MESSAGE (storeReplyMessageEnable). Answered as the store answers when
        the push went out, SYSTEM_ERROR saying why when it did not (stored all the same)."""
        header, body = request.header, frames[1] if len(frames) == 2 else b""
        header["code"] = protocol.SEND_MESSAGE  # (checked, stored and answered as a send from here)
        oneway = header.get("oneway") is True
        if not self.accepting or self.replication.is_slave():
            return self._send(client, request, frames)  # (refused there, as a send)
        remark = edge.send_refusal(header)  # ProtocolError for a broken structure
        if remark:
            return self._refuse(client, request, oneway, "MESSAGE_ILLEGAL", remark)
        if header["topic"] == self.reply_topic and self.topics.get(self.reply_topic) is None:
            self.topics.create(self.reply_topic, 1)  # (at the first reply; RocketMQ's broker makes it at start)
        refused = self.router.check_topics(request).get("0")
        if refused:
            return self._refuse(client, request, oneway, *refused)
        why = self.members.push_reply(header, body)
        as_send = [orjson.dumps(header), body]
        if why:
            self._refuse(client, request, oneway, "SYSTEM_ERROR", why)
            if self.settings.storeReplyMessageEnable:
                self._send(replies.UNANSWERED, request, as_send)
        elif self.settings.storeReplyMessageEnable:
            self._send(client, request, as_send)
        elif not oneway:  # (pushed, not stored: RocketMQ's answer names no stored message)
            self._reply(client, [orjson.dumps(protocol.reply_header(
                request.opaque, "PUT_OK", msgId="0", offsetMsgId="0", queueId=header["queueId"], queueOffset=0))])

    def _waiting(self) -> bool:
        """Whether requests wait at the front for a service's ring (actors.links.WaitingOutbox)."""
        return any(out.waiting for out, _ in self.waiting_outs)

    def _retry_waiting(self) -> None:
        """Requests that found their service's ring full: out now if it takes them, refused past
        their patience."""
        now = time.monotonic()
        for out, who in self.waiting_outs:
            for header, client, _, _ in out.retry(now) if out.waiting else ():
                if client in self.service_outs:  # an answer to a service's re-put: it counts it unanswered
                    continue
                self._reply(client, protocol.error_reply(header.get("opaque"), "SYSTEM_BUSY",
                                                         f"{who} in {READ_PATIENCE_S:g} s; try again"))

    def _forward(self, sock: zmq.Socket, client: bytes, request: protocol.Request, frames: list[bytes],
                 busy: str) -> None:
        try:
            send_frames(sock, [client, read_meta(time.monotonic_ns()), frames[0], b""])
        except zmq.Again:
            self._reply(client, protocol.error_reply(request.opaque, "SYSTEM_BUSY", busy))

    def _runtime_info(self) -> dict:
        live = {"front": self.statistics()}
        for neighbour in self.neighbours:  # the services of this process: live, not a second old
            live[neighbour.label] = neighbour.statistics()
        return self.node_stats.answer(live, self.control.snapshot(), int(time.time() * 1000))

    def _ha(self, client: bytes, request: protocol.Request) -> None:
        frames = self.replication.answer(request, self.node_stats.actors)
        if frames is None:  # a slave's promotion: its ha-client does it, and answers
            return self._forward(self.ha_admin, client, request, [orjson.dumps(request.header)],
                                 "the ha-client is not running; try again")
        self._reply(client, frames)

    def _serve_reputs(self) -> None:
        """The schedule service's re-puts: sends the write path stores as given (`_reput`), from
        the node's private socket only; their answers go back over `reput_out` (`_reply`)."""
        for client, _, header_raw, body in incoming(self.reput_in, MAX_TAKE):
            self._serve_reput(client, header_raw, body)

    def _serve_reput(self, client: bytes, header_raw: bytes, body: bytes) -> None:
        """A service's own send (a re-put), built from stored records: stored as given. Or the
        pop service's progress: each queue's low, committed as its group's offset."""
        header = orjson.loads(header_raw)  # our own frames: one that does not parse is a bug
        if "_commits" in header:
            if not self.replication.is_slave():  # (a slave's offsets are its master's)
                for group, topic, queue_id, offset in header["_commits"]:
                    if group in self.groups.groups and self.topics.get(topic) is not None:  # (not deleted since)
                        self.offsets.commit(group, topic, queue_id, offset)
            return
        reput = header.pop("_reput")
        self._send(client, protocol.Request(header, body), [header_raw, body], reput=reput)

    def _send(self, client: bytes, request: protocol.Request, frames: list[bytes], reput: dict | None = None) -> None:
        oneway = request.header.get("oneway") is True  # (a oneway that is not a bool is refused, with a reply)
        if not self.accepting:
            return self._refuse(client, request, oneway, "SERVICE_NOT_AVAILABLE", "the node is shutting down")
        if self.replication.is_slave():
            return self._refuse(client, request, oneway, "SERVICE_NOT_AVAILABLE",
                                f"this node is a slave of {self.settings.haMasterAddress}: send to its master")
        if reput is None and self.replication.old_master:  # (the node's own re-puts: a fencing cuts them)
            return self._refuse(client, request, oneway, "SERVICE_NOT_AVAILABLE", self.replication.superseded())
        if self.in_flight >= self.settings.sendQueueCapacity:
            return self._refuse(client, request, oneway, "SYSTEM_BUSY",
                                f"[REJECTREQUEST]system busy: {self.in_flight} sends waiting")
        if reput is None:
            remark = edge.send_refusal(request.header)  # ProtocolError for a broken structure
            if remark:
                return self._refuse(client, request, oneway, "MESSAGE_ILLEGAL", remark)
        else:  # the node's own request, built from stored records: marked as such, topics made
            messages = request.header.get("messages")  # ([]: a service's barrier, actors.transaction)
            for message in [request.header] if messages is None else messages:
                self.router.internal_topic(message["topic"])
            request.header["_reput"] = reput
            frames = [orjson.dumps(request.header), frames[1]]
        refusals = self.router.check_topics(request)
        if refusals and request.code != protocol.SEND_MESSAGES:
            status, remark = refusals["0"]
            return self._refuse(client, request, oneway, status, remark)
        meta = send_meta(time.monotonic_ns(), refusals)
        body = frames[1] if len(frames) == 2 else b""
        first = self.sends_out[0]
        if first.local:  # the write service of this process takes the parsed header as it is
            self.outgoing.append(([client, meta, request.header, body], client, request, oneway))
        else:
            parts = [client, orjson.dumps(meta), frames[0], body]
            size = sum(len(part) for part in parts) + FRAMES_OVERHEAD
            largest = first.max_message
            if size > largest:  # a request no ring message can hold: the client's, so refused
                return self._refuse(client, request, oneway, "MESSAGE_ILLEGAL",
                                    f"a send request of {size} bytes; this node takes at most {largest}")
            if self.outgoing and self.outgoing_bytes + size > largest:  # the turn so far, first
                self._ship_sends()
            self.outgoing.append((parts, client, request, oneway))
            self.outgoing_bytes += size
        if not oneway:  # (before a ship: a full ring's refusal counts it out again)
            self.in_flight += 1
        if self.outgoing_bytes >= SHIP_BYTES:
            self._ship_sends()

    def _ship_sends(self) -> None:
        """This turn's sends, as one message, to the write service or to the next ingress worker;
        SYSTEM_BUSY to each when that link is full (its consumer is behind)."""
        outgoing, self.outgoing, self.outgoing_bytes = self.outgoing, [], 0
        # a service's re-puts (and barriers) always take the first link: in order among themselves
        services = len(self.sends_out) > 1 and any(self._is_service(client) for _, client, *_ in outgoing)
        out = self.sends_out[0] if services else first_keeping_up(self.sends_out, SHIP_BYTES)
        if out.send([parts for parts, *_ in outgoing]):
            return
        for _, client, request, oneway in outgoing:
            if not oneway:
                self.in_flight -= 1
            self._refuse(client, request, oneway, "SYSTEM_BUSY", "[TIMEOUT_CLEAN_QUEUE]send queue is full")

    def _is_service(self, client: bytes) -> bool:
        return client == REPUT_CLIENT or client in self.service_outs

    def _refuse(self, client: bytes, request: protocol.Request, oneway: bool, status: str, remark: str) -> None:
        self.refused += 1
        if oneway:
            return
        if request.code == protocol.SEND_MESSAGES:
            count = len(request.header.get("messages") or [])
            header = protocol.reply_header(request.opaque, status, remark,
                                           results=[{"status": status, "remark": remark}] * count)
            self._reply(client, [orjson.dumps(header)])
        else:
            self._reply(client, protocol.error_reply(request.opaque, status, remark))

    def _reply(self, client: bytes, frames: list[bytes]) -> None:
        if client == replies.UNANSWERED:  # a reply stored though its push failed: answered already
            return
        if client == REPUT_CLIENT:  # the schedule service's re-put
            send_frames(self.reput_out, [client, *frames])
            return
        if client.startswith(ASK_CLIENT):  # the read of a direct consumption's message
            return self.members.viewed(client, frames)
        service = self.service_outs.get(client)
        if service is not None:  # the pop or transaction service's re-put (refused at once, or none
            service.send(({}, client, 0, frames[0]), time.monotonic())  # waits: it counts it unanswered)
            return
        try:
            send_frames(self.clients, [client, *frames], NOBLOCK)
        except zmq.ZMQError:
            self.errors += 1  # the client is gone or not reading: its reply is dropped

    # -- replies and statistics --------------------------------------------------------------------

    def _forward_replies(self) -> None:
        for joined in incoming(self.replies, MAX_TAKE, multipart=False):
            self._answer_replies(unpack_replies(joined))

    def _answer_replies(self, replies) -> None:
        """Replies, each (client, arrival ns, header[, body]), from a link or the `replies` socket;
        a read's arrival is negative."""
        now = time.monotonic_ns()
        for reply in replies:
            if reply[1] == SERVICE_SEND:  # not a reply: a service's own send (a re-put), from its pseudo-client
                self._serve_reput(reply[0], reply[2], reply[3])
                continue
            frames = [reply[2], reply[3]] if len(reply) > 3 and reply[3] else [reply[2]]
            self._answer_send(reply[0], reply[1], frames, now)

    def _answer_send(self, client: bytes, arrival_ns: int, frames: list[bytes], now: int) -> None:
        if arrival_ns >= 0:  # a send's reply (reads are marked with a negative arrival)
            self.in_flight = max(0, self.in_flight - 1)
            self.node_stats.store.record_latency((now - arrival_ns) / 1e6)
        self._reply(client, frames)

    def _take_stats(self) -> None:
        for raw in incoming(self.stats_in, MAX_TAKE, multipart=False):
            self.node_stats.take(raw, int(time.time() * 1000))

    def statistics(self) -> dict:
        stats = super().statistics() | {"requests": self.requests, "inFlight": self.in_flight,
                                        "refused": self.refused, "malformed": self.malformed,
                                        "accepting": self.accepting,
                                        "topics": len(self.topics.topics) if self.topics is not None else 0}
        if self.reads_out is not None:
            stats["readsWaiting"] = self.reads_out.statistics()
            stats["popsWaiting"] = self.pops_out.statistics()
            stats["transactionsWaiting"] = self.transactions_out.statistics()
        if self.pinner is not None:
            stats["cpuPinning"] = self.pinner.statistics()
        if self.cpu_latency is not None:
            stats["cpuLatency"] = self.cpu_latency.statistics(time.monotonic())
        if self.members is not None:
            stats |= self.members.statistics()
            stats["brokerConfig"] = self.router.config.statistics()
        for key, part in (("acl", self.acl), ("curve", self.curve)):
            if part is not None:  # (each part of the router, once opened)
                stats[key] = part.statistics()
        return stats

    def _release_cpu_latency(self) -> None:
        if self.cpu_latency is not None:
            self.cpu_latency.release(time.monotonic())

    def close(self) -> None:
        self._release_cpu_latency()  # (released in drain, unless the front failed)
        for end in (*self.sends_out, self.reads_out, self.pops_out, self.transactions_out):
            if end is not None and not end.local:  # (local links: the host's, closed by it)
                end.close()
        if self.inbox is not None:
            self.inbox.close()
        if self.curve is not None:
            self.curve.stop()
        super().close()
