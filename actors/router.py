"""The router's core: which service a checked request goes to, and the answers the router gives
itself from its tables (consumer offsets, topic configs, routes). No socket, no clock: the front
(its shell) moves the frames.

`route` returns a `Route`: SEND (the topic checks are the shell's: they need the send path),
REPLY (a reply of request-reply: pushed to its requester by the shell, then a SEND),
READ (the read service), CLEAN (the clean service), SCHEDULE (the schedule service: send-backs),
TRANSACTION (the transaction service), RUNTIME (the front's own statistics), or
ANSWER with the reply frames. A request whose fields are wrong raises ProtocolError from the edge
checks (actors.edge), which the shell answers SYSTEM_ERROR; anything else raised is a bug.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import orjson

from node import protocol
from actors import admin, edge
from actors.broker_config import BrokerConfig
from actors.topics import PERM_WRITE, topic_error
from shm.codec import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

TRANSACTION_TOPICS = frozenset({TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC})

READ_GATED = frozenset({protocol.PULL_MESSAGE, protocol.POP_MESSAGE, protocol.PEEK_MESSAGE})  # by brokerPermission
ADMIN_CODES = frozenset({protocol.UPDATE_AND_CREATE_TOPIC, protocol.DELETE_TOPIC_IN_BROKER,
                         protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, protocol.DELETE_SUBSCRIPTIONGROUP,
                         protocol.GET_ALL_SUBSCRIPTIONGROUP_CONFIG})


class To(enum.Enum):
    SEND = "send"
    READ = "read"
    CLEAN = "clean"
    SCHEDULE = "schedule"
    GROUPS = "groups"  # consumer groups: the front answers from its member table (actors.consumers)
    RUNTIME = "runtime"
    HA = "ha"  # replication's status and role: the front answers, or the ha-client promotes
    POP = "pop"  # pop consumption: the pop service (actors.pop), the header completed here
    TRANSACTION = "transaction"  # END_TRANSACTION and the transaction state: the transaction service
    REPLY = "reply"  # SEND_REPLY_MESSAGE: the front pushes it to its requester, then stores it as a send
    ANSWER = "answer"


@dataclass(frozen=True)
class Route:
    to: To
    frames: list[bytes] = field(default_factory=list)  # ANSWER's reply


class Router:
    def __init__(self, settings, topics, offsets, groups, brokers=None, config: BrokerConfig | None = None):
        self.settings = settings
        self.config = config or BrokerConfig(settings)  # (brokerPermission: the control block's, in a node)
        self.brokers = brokers or (lambda: {str(settings.brokerId): settings.listen})  # brokerId -> client endpoint
        self.topics = topics
        self.offsets = offsets
        self.groups = groups

    def route(self, request: protocol.Request) -> Route:
        code = request.code
        if code in protocol.SEND_CODES:
            return Route(To.SEND)
        if code == protocol.SEND_REPLY_MESSAGE:  # (a send's checks: the shell's, as for SEND)
            return Route(To.REPLY)
        edge.check_request(request)  # ProtocolError: SYSTEM_ERROR with its remark
        if code in READ_GATED and (refusal := self.config.read_refusal(code)):
            return Route(To.ANSWER, protocol.error_reply(request.opaque, "NO_PERMISSION", refusal))
        if code == protocol.PULL_MESSAGE and "consumerGroup" in request.header:
            header = request.header
            refusal = admin.consume_refusal(self.groups, header["consumerGroup"])
            if refusal:
                return Route(To.ANSWER, protocol.error_reply(request.opaque, "NO_PERMISSION", refusal))
            if "commitOffset" in header:  # RocketMQ's FLAG_COMMIT_OFFSET: the pull commits as it goes
                self.groups.ensure(header["consumerGroup"])
                self.offsets.commit(header["consumerGroup"], header["topic"], header["queueId"], header["commitOffset"])
        if code in protocol.READ_CODES:
            return Route(To.READ)
        if code in protocol.POP_SERVICE_CODES:
            return self._pop(request)
        if code == protocol.DELETE_EXPIRED_COMMITLOG:
            return Route(To.CLEAN)
        if code in protocol.TRANSACTION_CODES:
            return Route(To.TRANSACTION)
        if code == protocol.CONSUMER_SEND_MSG_BACK:
            if "maxReconsumeTimes" not in request.header:  # (the shell forwards the header as changed here)
                request.header["maxReconsumeTimes"] = self.groups.retry_max_times(request.header["consumerGroup"])
            return Route(To.SCHEDULE)
        if code == protocol.GET_BROKER_RUNTIME_INFO:
            return Route(To.RUNTIME)
        if code in (protocol.GET_BROKER_CONFIG, protocol.UPDATE_BROKER_CONFIG):
            return Route(To.ANSWER, self.config.answer(request))
        if code in protocol.HA_CODES:
            return Route(To.HA)
        if code in protocol.GROUP_CODES:
            return Route(To.GROUPS)
        if code in protocol.OFFSET_CODES:
            return Route(To.ANSWER, self._offsets(request))
        if code == protocol.GET_ALL_TOPIC_CONFIG:
            table = {name: config.to_json() for name, config in sorted(self.topics.topics.items())}
            return Route(To.ANSWER, _ok(request, topicConfigTable=table))
        if code in ADMIN_CODES:
            return Route(To.ANSWER, self._admin(request))
        if code == protocol.GET_ALL_CONSUMER_OFFSET:
            table = {key: {str(q): o for q, o in sorted(queues.items())} for key, queues in sorted(self.offsets.table.items())}
            return Route(To.ANSWER, _ok(request, offsetTable=table))
        if code == protocol.GET_ROUTEINFO_BY_TOPIC:
            return Route(To.ANSWER, self._route_info(request))
        return Route(To.ANSWER, protocol.error_reply(request.opaque, "REQUEST_CODE_NOT_SUPPORTED",
                                                     f"request code {code} is not supported"))

    def _pop(self, request: protocol.Request) -> Route:
        """A pop or peek learns here what only the router knows: the topic's queues, the group's
        committed offsets (where a queue never popped starts) and its retryMaxTimes."""
        header, group = request.header, request.header["consumerGroup"]
        header["_retryMax"] = self.groups.retry_max_times(group)
        if request.code not in (protocol.POP_MESSAGE, protocol.PEEK_MESSAGE):
            return Route(To.POP)
        refusal = admin.consume_refusal(self.groups, group)
        if refusal:
            return Route(To.ANSWER, protocol.error_reply(request.opaque, "NO_PERMISSION", refusal))
        config = self.topics.get(header["topic"])
        if config is None:  # (a pop creates no topic: there would be nothing in it)
            return Route(To.ANSWER, protocol.error_reply(request.opaque, "TOPIC_NOT_EXIST",
                                                         f"topic {header['topic']} does not exist"))
        queue_id = header.get("queueId", -1)
        if queue_id >= config.readQueueNums:
            return Route(To.ANSWER, protocol.error_reply(
                request.opaque, "MESSAGE_ILLEGAL", f"queueId {queue_id} is not one of the topic's "
                                                   f"{config.readQueueNums} read queues"))
        queues = list(range(config.readQueueNums)) if queue_id < 0 else [queue_id]
        self.groups.ensure(group)
        header["_queues"] = queues
        header["_start"] = {str(q): o for q in queues if (o := self.offsets.query(group, header["topic"], q)) is not None}
        return Route(To.POP)

    def check_topics(self, request: protocol.Request) -> dict[str, tuple[str, str]]:
        """Per message index (as text, for JSON): (status, remark) for what the topic table
        refuses. Raises ProtocolError for a malformed request."""
        if request.code != protocol.SEND_MESSAGES:  # its header passed edge.send_refusal
            problem = self.check_one(request.header["topic"], request.header["queueId"])
            return {"0": problem} if problem else {}
        refusals = {}
        own = request.header.get("_reput") is True  # the schedule service's, built from stored records
        for i, message in enumerate(request.header["messages"]):
            if own and message["topic"] in TRANSACTION_TOPICS:
                continue  # the transaction service's system topics (one queue; no client sends to them)
            remark = None if own else edge.send_problem(message)
            problem = ("MESSAGE_ILLEGAL", remark) if remark else self.check_one(message["topic"], message["queueId"], own)
            if problem:
                refusals[str(i)] = problem
        return refusals

    def internal_topic(self, topic: str) -> None:
        """A send-back's `%RETRY%<group>` / `%DLQ%<group>` and the transaction service's system
        topics exist from their first use (one queue), auto-creation on or off, as RocketMQ
        creates them."""
        if (topic.startswith(("%RETRY%", "%DLQ%")) or topic in TRANSACTION_TOPICS) and self.topics.get(topic) is None:
            self.topics.create(topic, 1)

    def check_one(self, topic: str, queue_id: int, own: bool = False) -> tuple[str, str] | None:
        """`own`: a re-put of the node's own services (due delayed messages), which brokerPermission
        does not refuse (RocketMQ's schedule service puts into the store, not through a send)."""
        config, status, problem = self.topics.resolve(topic)
        if config is None:
            return status, problem
        if not config.perm & PERM_WRITE:
            return "SERVICE_NOT_AVAILABLE", f"the topic {topic} is not writable"
        refusal = None if own else self.config.send_refusal(config)
        if refusal:
            return "NO_PERMISSION", refusal
        if not 0 <= queue_id < config.writeQueueNums:
            return "MESSAGE_ILLEGAL", (f"queueId {queue_id!r} is not one of the topic's "
                                       f"{config.writeQueueNums} queues (0..{config.writeQueueNums - 1})")
        return None

    def _offsets(self, request: protocol.Request) -> list[bytes]:
        header = request.header
        group = header["consumerGroup"]
        if request.code == protocol.GET_CONSUME_STATS:
            return _ok(request, offsetTable={topic: {str(q): o for q, o in queues.items()}
                                             for topic, queues in self.offsets.of_group(group).items()})
        topic, queue_id = header["topic"], header["queueId"]
        if request.code == protocol.UPDATE_CONSUMER_OFFSET:
            self.groups.ensure(group)
            self.offsets.commit(group, topic, queue_id, header["commitOffset"])
            return _ok(request)
        offset = self.offsets.query(group, topic, queue_id)
        if offset is None:
            return protocol.error_reply(request.opaque, "QUERY_NOT_FOUND",
                                        f"no offset committed by {group} for {topic}/{queue_id}")
        return _ok(request, offset=offset)

    def _admin(self, request: protocol.Request) -> list[bytes]:
        header, code = request.header, request.code
        try:
            if code == protocol.UPDATE_AND_CREATE_TOPIC:
                return _ok(request, topicConfig=admin.update_topic(self.topics, header))
            if code == protocol.DELETE_TOPIC_IN_BROKER:
                admin.delete_topic(self.topics, self.offsets, header)
                return _ok(request)
            if code == protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:
                return _ok(request, subscriptionGroupConfig=admin.update_group(self.groups, header))
            if code == protocol.DELETE_SUBSCRIPTIONGROUP:
                admin.delete_group(self.groups, self.offsets, header)
                return _ok(request)
            return _ok(request, subscriptionGroupTable=dict(sorted(self.groups.groups.items())))
        except admin.AdminRefused as e:
            return protocol.error_reply(request.opaque, e.status, e.remark)

    def _route_info(self, request: protocol.Request) -> list[bytes]:
        """A topic's route; an unknown topic is created (as its first send would create it) unless
        the ask says `create: false`, a consumer's: a consumer's typo made a topic, which then
        showed in every listing and registered with the name services."""
        topic = request.header.get("topic")
        if request.header.get("create") is False and isinstance(topic, str) and self.topics.get(topic) is None \
                and not topic_error(topic):
            return protocol.error_reply(request.opaque, "TOPIC_NOT_EXIST", f"topic {topic} does not exist")
        config, status, problem = self.topics.resolve(topic)
        if config is None:
            return protocol.error_reply(request.opaque, status, problem)
        return _ok(request, topic=config.topicName, writeQueueNums=config.writeQueueNums,
                   readQueueNums=config.readQueueNums, perm=self.config.route_perm(config.perm),
                   brokerName=self.settings.brokerName,
                   brokerAddrs=self.brokers())


def _ok(request: protocol.Request, **fields) -> list[bytes]:
    return [orjson.dumps(protocol.reply_header(request.opaque, "OK", **fields))]
