"""The gRPC proxy's core: RocketMQ 5's `apache.rocketmq.v2` in the node's own terms, and back.

No I/O: the shell (actors.proxy.shell) owns the gRPC server and the link to the front, and asks
this module what a request means for the node (`outgoing`, `end_transaction`, `receipt_handle`)
and what the node's answer means for the client (`status_of`, `route`, `assignments`,
`settings_for`). What a receive or a pull asks, and each message as a client reads it, is
actors.proxy.delivery; what lasts between calls (the clients, the renewals) actors.proxy.sessions.

Choices that differ from Apache RocketMQ's proxy are documented in docs/protocol.md "gRPC":
- A topic accepts NORMAL, FIFO, DELAY and TRANSACTION messages (mqnode keeps no message type per
  topic). A half's producer group is its topic, as RocketMQ 5's proxy sets it, and its
  transaction_id names the half itself (`transaction_id`), so EndTransaction needs no table.
- A route lists queue i as readable if i < readQueueNums and writable if i < writeQueueNums (the
  ids the store uses), not RocketMQ's read-only-first renumbering.
- A receipt handle is the node's own (docs/protocol.md "Pop"), passed through unchanged.
- `auto_renew` receives (push consumers) are renewed by the proxy (`sessions.Renewals`), as RocketMQ 5's
  proxy does, with its settings' names: defaultInvisibleTimeMills at first, then
  renewSliceTimeMillis at a time from renewAheadTimeMillis before the end, for at most
  renewMaxTimeMillis; the client's ack or change names the handle it received, and the proxy
  carries the latest.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from actors import edge_clients, edge_fields
from actors.pop_core import handle_parts
from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.apis import service_pb2 as rpc
from actors.topics import topic_error
from node import protocol
from node.client.message import Message
from shm.codec import (
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_CHECK_IMMUNITY,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_UNIQ_KEY,
    decode_msg_id,
)

Code = pb.Code
RECEIVE_BATCH = 32  # a consumer's receive_batch_size
MAX_RECEIVE_BATCH = edge_clients.POP_MAX_COUNT
FORWARD_HOLD_MS = 30_000  # a message being forwarded to the DLQ stays invisible this long meanwhile
MAX_SEND_MESSAGES = 1024  # messages in one SendMessageRequest
MAX_TRANSACTION_RECOVERY_S = 3600  # orphaned_transaction_recovery_duration (RocketMQ 5's maxTransactionRecoverySecond)
MESSAGE_GROUP_MAX = 64  # RocketMQ 5's maxMessageGroupSize
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"  # RocketMQ 5's message group, stored as a property
PROPERTY_TRANSACTION = "TRAN_MSG"
ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)  # what a topic's queues accept
# properties the node or RocketMQ set: never a user property, and refused as one (MessageConst's)
SYSTEM_PROPERTIES = frozenset({
    PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_DELAY, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_MS,
    "TIMER_DELAY_SEC", "TIMER_OUT_MS", "WAIT", "REAL_TOPIC", "REAL_QID", "CLUSTER", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID",
    "MIN_OFFSET", "MAX_OFFSET", "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "TRAN_MSG",
    "TRAN_PREPARED_QUEUE_OFFSET", "PGROUP", "MSG_REGION", "TRACE_ON", "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT",
    "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "BUYER_ID", "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "SHARDING_KEY", PROPERTY_SHARDING_KEY, "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "DLQ_ORIGIN_TOPIC",
    "DLQ_ORIGIN_MESSAGE_ID", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_DEL_UNIQKEY",
    "TRACE_CONTEXT", "BORN_HOST",
})

# the node's statuses (node.protocol.STATUS_CODES' names) -> apache.rocketmq.v2.Code, as RocketMQ 5's proxy maps
# its broker's answers (ResponseBuilder, SendMessageActivity)
NODE_STATUS = {
    "PUT_OK": Code.OK, "OK": Code.OK, "FOUND": Code.OK,
    "FLUSH_DISK_TIMEOUT": Code.MASTER_PERSISTENCE_TIMEOUT,
    "FLUSH_SLAVE_TIMEOUT": Code.SLAVE_PERSISTENCE_TIMEOUT,
    "SLAVE_NOT_AVAILABLE": Code.HA_NOT_AVAILABLE,
    "SYSTEM_BUSY": Code.TOO_MANY_REQUESTS, "OS_PAGECACHE_BUSY": Code.TOO_MANY_REQUESTS,
    "POLLING_FULL": Code.TOO_MANY_REQUESTS,
    "TOPIC_NOT_EXIST": Code.TOPIC_NOT_FOUND,
    "SUBSCRIPTION_GROUP_NOT_EXIST": Code.CONSUMER_GROUP_NOT_FOUND,
    "NO_PERMISSION": Code.FORBIDDEN,
    "NO_NEW_MSG": Code.MESSAGE_NOT_FOUND,
    "MESSAGE_ILLEGAL": Code.BAD_REQUEST,
    "PROPERTIES_SIZE_EXCEEDED": Code.MESSAGE_PROPERTIES_TOO_LARGE,
    "SUBSCRIPTION_PARSE_FAILED": Code.ILLEGAL_FILTER_EXPRESSION,
    "INVALID_RECEIPT_HANDLE": Code.INVALID_RECEIPT_HANDLE,
    "RECEIPT_HANDLE_EXPIRED": Code.INVALID_RECEIPT_HANDLE,  # (RocketMQ 5's proxy: "receipt handle is expired")
    "REQUEST_CODE_NOT_SUPPORTED": Code.NOT_IMPLEMENTED,
    "TIMEOUT": Code.PROXY_TIMEOUT,
    "SERVICE_NOT_AVAILABLE": Code.INTERNAL_SERVER_ERROR,
    "ACCESS_DENIED": Code.FORBIDDEN,
}


class Refused(Exception):
    """A request (or one message of it) the proxy answers with `code` without asking the node."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def name_of(enum, value: int) -> str:
    """An enum value's name; proto3 enums are open, and a client may send a value we never heard of."""
    return enum.Name(value) if value in enum.values() else str(value)


def status(code: int, message: str = "") -> pb.Status:
    return pb.Status(code=code, message=message or name_of(Code, code))


_PLAIN = {name: status(code, name) for name, code in NODE_STATUS.items() if code != Code.BAD_REQUEST}


def status_of(node_status: str | None, remark: str = "") -> pb.Status:
    """The client's status for the node's answer (a shared message when there is no remark:
    protobuf copies it wherever it is set)."""
    if not remark and node_status in _PLAIN:
        return _PLAIN[node_status]
    code = NODE_STATUS.get(node_status or "SYSTEM_ERROR", Code.INTERNAL_SERVER_ERROR)
    if code == Code.BAD_REQUEST:
        code = _illegal_code(remark)
    return status(code, f"{node_status}: {remark}" if remark else node_status or "")


def _illegal_code(remark: str) -> int:
    """MESSAGE_ILLEGAL's finer code, from what the node said was wrong."""
    text = remark.lower()
    for words, code in (("body", Code.MESSAGE_BODY_TOO_LARGE), ("propert", Code.MESSAGE_PROPERTIES_TOO_LARGE),
                        ("topic", Code.ILLEGAL_TOPIC), ("timer", Code.ILLEGAL_DELIVERY_TIME),
                        ("deliver", Code.ILLEGAL_DELIVERY_TIME), ("invisible", Code.ILLEGAL_INVISIBLE_TIME),
                        ("consumergroup", Code.ILLEGAL_CONSUMER_GROUP), ("group", Code.ILLEGAL_CONSUMER_GROUP)):
        if words in text:
            return code
    return Code.BAD_REQUEST


def millis(timestamp) -> int:
    return timestamp.seconds * 1000 + timestamp.nanos // 1_000_000


def duration_ms(duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


# -- names -----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _topic_problem(name: str, to_send: bool) -> str | None:
    return topic_error(name) if to_send else edge_fields.read_topic_problem(name)


def topic_name(resource: pb.Resource, *, to_send: bool = False) -> str:
    problem = _topic_problem(resource.name, to_send)
    if problem:
        raise Refused(Code.ILLEGAL_TOPIC, problem)
    return resource.name


def group_name(resource: pb.Resource) -> str:
    problem = edge_fields.group_problem(resource.name)
    if problem:
        raise Refused(Code.ILLEGAL_CONSUMER_GROUP, problem)
    return resource.name


# -- sending ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outgoing:
    """One message of a SendMessageRequest, as the node's producer sends it."""

    message: Message
    shard_key: str | None  # a FIFO message's group: one group, one queue
    message_id: str
    transactional: bool = False  # a half: sent alone, its send result names the transaction


def outgoing(message: pb.Message, max_body: int, max_delay_ms: int, now_ms: int) -> Outgoing:
    """What the node is to store for `message`; raises Refused with the protocol's code for what
    RocketMQ 5's proxy refuses (SendMessageActivity's checks). Each field is read once: upb
    makes a new object at every read of a string or bytes field."""
    topic = topic_name(message.topic, to_send=True)
    system, body = message.system_properties, message.body
    if not body:
        raise Refused(Code.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(body) > max_body:
        raise Refused(Code.MESSAGE_BODY_TOO_LARGE, f"the body of {len(body)} bytes exceeds {max_body} (maxMessageSize)")
    message_id = system.message_id
    if not message_id or len(message_id) > 128 or not message_id.isprintable():
        raise Refused(Code.ILLEGAL_MESSAGE_ID, "a message needs a printable message_id of at most 128 characters")
    if system.body_encoding == pb.GZIP:
        raise Refused(Code.UNSUPPORTED, "gzip-encoded bodies are not supported: send IDENTITY")
    tag = system.tag if system.HasField("tag") else None
    if tag is not None and (not tag.strip() or "|" in tag or not tag.isprintable()):
        raise Refused(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} is blank, has '|' or is not printable")
    keys = list(system.keys)
    for key in keys:
        if not key.strip() or not key.isprintable():
            raise Refused(Code.ILLEGAL_MESSAGE_KEY, f"key {key!r} is blank or not printable")
    given = message.user_properties
    properties = _user_properties(given) if given else {}
    properties[PROPERTY_UNIQ_KEY] = message_id
    group, deliver_at = _typed(system, max_delay_ms, now_ms)
    if group is not None:
        properties[PROPERTY_SHARDING_KEY] = group
    transactional = system.message_type == pb.TRANSACTION
    if transactional:  # RocketMQ 5's proxy: the topic is the producer group its checks go to
        properties[PROPERTY_TRANSACTION], properties[PROPERTY_PRODUCER_GROUP] = "true", topic
        if system.HasField("orphaned_transaction_recovery_duration"):
            seconds = system.orphaned_transaction_recovery_duration.seconds
            if not 0 <= seconds <= MAX_TRANSACTION_RECOVERY_S:
                raise Refused(Code.BAD_REQUEST, f"orphaned_transaction_recovery_duration must be 0 to "
                                                f"{MAX_TRANSACTION_RECOVERY_S} s, not {seconds} s")
            properties[PROPERTY_CHECK_IMMUNITY] = str(seconds)
    if len(properties) > 1 or keys or group is not None:  # (a plain message's cannot come near the limit)
        size = sum(len(k) + len(v) + 2 for k, v in properties.items()) + len(tag or "") + sum(map(len, keys)) + 16
        if size > edge_fields.MAX_PROPERTIES_CHARS:
            raise Refused(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"the properties come to about {size} characters; "
                                                            f"at most {edge_fields.MAX_PROPERTIES_CHARS} are allowed")
    node_message = Message(topic, body, tag, " ".join(keys) if keys else None, properties, deliver_at_ms=deliver_at)
    return Outgoing(node_message, group, message_id, transactional)


def _user_properties(given) -> dict[str, str]:
    out = {}
    for key, value in given.items():
        if (not key or key in SYSTEM_PROPERTIES or not key.isprintable() or not value.isprintable()
                or "\x01" in key or "\x02" in key or "\x02" in value):
            raise Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                          f"property {key!r} is empty, reserved or holds characters a property may not")
        if value:  # (an empty value is dropped, as the node's parser drops it: the official clients send none)
            out[key] = value
    return out


def _typed(system: pb.SystemProperties, max_delay_ms: int, now_ms: int) -> tuple[str | None, int | None]:
    """The message group and delivery time its type calls for; Refused where type and fields
    disagree (MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, as RocketMQ 5's proxy)."""
    kind = system.message_type
    if kind == pb.NORMAL and not system.HasField("message_group") and not system.HasField("delivery_timestamp"):
        return None, None  # (most messages)
    group = system.message_group if system.HasField("message_group") else None
    deliver_at = millis(system.delivery_timestamp) if system.HasField("delivery_timestamp") else None
    if kind == pb.TRANSACTION and (group is not None or deliver_at is not None):
        raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a TRANSACTION message has neither a message_group "
                                                                "nor a delivery_timestamp")
    if kind == pb.TRANSACTION:
        return None, None
    if kind not in (pb.MESSAGE_TYPE_UNSPECIFIED, pb.NORMAL, pb.FIFO, pb.DELAY):
        raise Refused(Code.UNSUPPORTED, f"message type {name_of(pb.MessageType, kind)} is not supported")
    if (kind == pb.FIFO) != (group is not None) and kind != pb.MESSAGE_TYPE_UNSPECIFIED:
        raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a FIFO message, and only it, has a message_group")
    if (kind == pb.DELAY) != (deliver_at is not None) and kind != pb.MESSAGE_TYPE_UNSPECIFIED:
        raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a DELAY message, and only it, has a delivery_timestamp")
    if group is not None and (not group.strip() or len(group) > MESSAGE_GROUP_MAX or not group.isprintable()):
        raise Refused(Code.ILLEGAL_MESSAGE_GROUP, f"message group {group!r} is blank, longer than "
                                                  f"{MESSAGE_GROUP_MAX} or not printable")
    if deliver_at is not None and deliver_at - now_ms > max_delay_ms:
        raise Refused(Code.ILLEGAL_DELIVERY_TIME, f"delivery is {deliver_at - now_ms} ms away, beyond the "
                                                  f"longest timer ({max_delay_ms} ms, timerMaxDelaySec)")
    return group, deliver_at


BATCH_MESSAGES, BATCH_BYTES = 256, 4 << 20  # a SEND_BATCH_MESSAGE's share of a SendMessageRequest


def batches(plans: list, queue_of) -> tuple[list[tuple[str, int, list[int]]], list[int]]:
    """How a request's messages go to the node: (topic, queue, indices of `plans`) for each
    SEND_BATCH_MESSAGE, the cheapest send (one topic, one queue, no timer, at most BATCH_MESSAGES
    and about BATCH_BYTES), and the indices of the timed and transactional ones, sent one by one (a
    batch carries neither a timer nor a half). `queue_of(plan)` is a message's queue; Refused plans are left out."""
    grouped: dict[tuple[str, int], list[int]] = {}
    single = []
    for index, plan in enumerate(plans):
        if isinstance(plan, Refused):
            continue
        if plan.message.deliver_at_ms is not None or plan.transactional:
            single.append(index)
            continue
        grouped.setdefault((plan.message.topic, queue_of(plan)), []).append(index)
    out = []
    for (topic, queue), indices in grouped.items():
        chunk, size = [], 0
        for index in indices:
            body = len(plans[index].message.body)
            if chunk and (len(chunk) == BATCH_MESSAGES or size + body > BATCH_BYTES):
                out.append((topic, queue, chunk))
                chunk, size = [], 0
            chunk.append(index)
            size += body
        out.append((topic, queue, chunk))
    return out, single


def send_response(entries: list[rpc.SendResultEntry]) -> rpc.SendMessageResponse:
    """One status for the whole: the entries' own when they agree, else MULTIPLE_RESULTS."""
    codes = {entry.status.code for entry in entries}
    top = entries[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS, "the messages' results differ")
    return rpc.SendMessageResponse(status=top, entries=entries)


def transaction_id(offset_msg_id: str, queue_offset: int) -> str:
    """What a RocketMQ 5 client gets as a half's transaction_id and hands back in EndTransaction:
    the half's offset msgId (its CommitLog offset) and its queue offset, so no table is kept."""
    return f"{offset_msg_id}-{queue_offset}"


def half_of(transaction: str) -> tuple[int, int]:
    """(commitLogOffset, tranStateTableOffset) of a `transaction_id`; INVALID_TRANSACTION_ID if
    it is not one this node gave."""
    offset_id, _, queue_offset = transaction.partition("-")
    try:
        return decode_msg_id(offset_id)[1], int(queue_offset)
    except (ValueError, TypeError):
        raise Refused(Code.INVALID_TRANSACTION_ID, f"transaction_id {transaction[:80]!r} is not one this node "
                                                   f"gave") from None


RESOLUTIONS = {pb.COMMIT: 8, pb.ROLLBACK: 12}  # TransactionResolution -> END_TRANSACTION's commitOrRollback


def end_transaction(request: rpc.EndTransactionRequest) -> dict:
    """EndTransaction as END_TRANSACTION: the producer group is the topic (as the proxy's sends set it)."""
    topic = topic_name(request.topic, to_send=True)
    if request.resolution not in RESOLUTIONS:
        raise Refused(Code.BAD_REQUEST, f"resolution must be COMMIT or ROLLBACK, not "
                                        f"{name_of(pb.TransactionResolution, request.resolution)}")
    phy, queue_offset = half_of(request.transaction_id)
    return {"code": protocol.END_TRANSACTION, "producerGroup": topic, "tranStateTableOffset": queue_offset,
            "commitLogOffset": phy, "commitOrRollback": RESOLUTIONS[request.resolution],
            "msgId": request.message_id, "transactionId": request.transaction_id,
            "fromTransactionCheck": request.source == pb.SOURCE_SERVER_CHECK}


def queue_of(queue: pb.MessageQueue) -> int:
    """A queue named for the offset RPCs: one queue, id 0 or more (the node says whether the topic has it)."""
    if not 0 <= queue.id < 2**31:
        raise Refused(Code.BAD_REQUEST, f"message_queue.id must be a queue of the topic (0 or more), not {queue.id}")
    return queue.id


def handle_position(handle: str) -> tuple[str, int, int]:
    """(topic, queue id, queue offset) of a node's receipt handle ("<ck> <topic> <queueId>
    <offset>", docs/protocol.md "Pop"); INVALID_RECEIPT_HANDLE if it is not one."""
    parts = handle_parts(handle)
    if parts is None:
        raise Refused(Code.INVALID_RECEIPT_HANDLE, "not a receipt handle this node gave")
    return parts[1], parts[2], parts[3]


def receipt_handle(handle: str) -> str:
    """A receipt handle as the node takes it: printable, of a sane length (the node says whether it holds)."""
    if not handle or len(handle) > 1024 or not handle.isprintable():
        raise Refused(Code.INVALID_RECEIPT_HANDLE, "the receipt handle is empty, too long or not printable")
    return handle


# -- routes and assignments ------------------------------------------------------------------------


def broker(settings, endpoints: pb.Endpoints) -> pb.Broker:
    """This node as a RocketMQ 5 broker, reached where the client reached it (the request's
    `endpoints`, as RocketMQ 5's proxy answers), else at the proxy's own address."""
    if not endpoints.addresses:
        endpoints = endpoints_of(protocol.host_port(settings.advertised(settings.grpc_host), settings.grpc_port))
    return pb.Broker(name=settings.brokerName, id=0, endpoints=endpoints)


def permission(readable: bool, writable: bool) -> int:
    return pb.READ_WRITE if readable and writable else pb.READ if readable else pb.WRITE if writable else pb.NONE


def placements(route: dict, own_name: str, own_address: str, here: pb.Broker) -> list[tuple[pb.Broker, dict]]:
    """Where a topic's queues are in a cluster, from a name service's route (RocketMQ's
    TopicRouteData, with mqnode's `grpcAddrs`): each broker group whose master serves gRPC, as a
    RocketMQ 5 broker at its master's proxy, with its queue data. This node's group is `here`
    (where the client reached it) while this node, at `own_address`, is its master, or the
    route names no master for it; a slave sends its clients to its master's proxy."""
    masters = {data["brokerName"]: (data.get("grpcAddrs") or {}).get("0") for data in route.get("brokerDatas") or []}
    out = []
    for queues in route.get("queueDatas") or []:
        name, master = queues["brokerName"], masters.get(queues["brokerName"])
        if name == own_name and master in (None, own_address):
            out.append((here, queues))
        elif master:
            out.append((pb.Broker(name=name, id=0, endpoints=endpoints_of(master)), queues))
    return out


def endpoints_of(address: str) -> pb.Endpoints:
    """`host:port` (an IPv6 host in brackets) as RocketMQ 5's Endpoints."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        scheme = pb.IPv6 if ipaddress.ip_address(host).version == 6 else pb.IPv4
    except ValueError:
        scheme = pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=int(port))])


def route(topic: pb.Resource, placed: list[tuple[pb.Broker, dict]]) -> rpc.QueryRouteResponse:
    """The topic's queues on each broker of `placed` (its queue data: perm, readQueueNums,
    writeQueueNums, as GET_ROUTEINFO_BY_TOPIC and the name services give them)."""
    queues = []
    for node, info in placed:
        readable, writable = bool(info["perm"] & 4), bool(info["perm"] & 2)
        reads, writes = info["readQueueNums"], info["writeQueueNums"]
        queues += [pb.MessageQueue(topic=topic, id=i, broker=node, accept_message_types=ACCEPTED_TYPES,
                                   permission=permission(readable and i < reads, writable and i < writes))
                   for i in range(max(reads, writes))]
    return rpc.QueryRouteResponse(status=status(Code.OK), message_queues=queues)


def assignments(topic: pb.Resource, placed: list[tuple[pb.Broker, dict]], fifo: bool) -> rpc.QueryAssignmentResponse:
    """A push consumer's queues on each broker of `placed`: one that pops from every queue of
    the broker, or each queue on its own for a FIFO group (as RocketMQ 5's proxy assigns)."""
    out = []
    for node, info in placed:
        if not info["perm"] & 4 or info["readQueueNums"] < 1:
            continue
        ids = range(info["readQueueNums"]) if fifo else [-1]
        perm = permission(True, bool(info["perm"] & 2))
        out += [pb.Assignment(message_queue=pb.MessageQueue(topic=topic, id=i, permission=perm, broker=node))
                for i in ids]
    if not out:
        return rpc.QueryAssignmentResponse(status=status(Code.FORBIDDEN, "no readable queue"))
    return rpc.QueryAssignmentResponse(status=status(Code.OK), assignments=out)


# -- settings --------------------------------------------------------------------


def _backoff(policy: dict, settings) -> pb.RetryPolicy:
    """A group's groupRetryPolicy as the client's backoff (RocketMQ 5's GrpcClientSettingsManager):
    EXPONENTIAL as exponential_backoff; CUSTOMIZED as its `next` delays, or by default the delay
    levels from 10 s (RocketMQ's retry schedule). (Some official clients, Node.js's among them,
    back off only exponentially: with CUSTOMIZED they retry at once, and a FIFO one not at all.)"""
    if policy.get("type") == "EXPONENTIAL":
        exponential = policy["exponentialRetryPolicy"]
        backoff = pb.ExponentialBackoff(multiplier=float(exponential["multiplier"]))
        backoff.initial.FromMilliseconds(exponential["initial"])
        backoff.max.FromMilliseconds(exponential["max"])
        return pb.RetryPolicy(exponential_backoff=backoff)
    steps = (policy.get("customizedRetryPolicy") or {}).get("next") or settings.delay_levels_ms()[2:]
    backoff = pb.CustomizedBackoff()
    for delay in steps:
        backoff.next.add().FromMilliseconds(delay)
    return pb.RetryPolicy(customized_backoff=backoff)


def settings_for(given: pb.Settings, settings, group: dict | None) -> pb.Settings:
    """The settings the node answers a client's Telemetry settings with: the client's own, with
    what the node decides filled in (RocketMQ 5's GrpcClientSettingsManager): the largest body,
    and for a consumer its group's retries (max_attempts = retryMaxTimes + 1, backing off as its
    groupRetryPolicy says: `_backoff`), whether it is FIFO, the batch and the long-polling wait."""
    out = pb.Settings()
    out.CopyFrom(given)
    if not given.HasField("request_timeout"):
        out.request_timeout.FromMilliseconds(3000)
    if given.client_type == pb.PRODUCER or given.HasField("publishing"):
        out.publishing.max_body_size = settings.maxMessageSize
        out.publishing.validate_message_type = False  # topics accept NORMAL, FIFO, DELAY and TRANSACTION alike
        out.backoff_policy.CopyFrom(pb.RetryPolicy(max_attempts=3, exponential_backoff=pb.ExponentialBackoff(
            multiplier=2.0)))
        out.backoff_policy.exponential_backoff.initial.FromMilliseconds(10)
        out.backoff_policy.exponential_backoff.max.FromMilliseconds(1000)
        return out
    group = group or {}
    retries = int(group.get("retryMaxTimes", 16))
    out.backoff_policy.CopyFrom(_backoff(group.get("groupRetryPolicy") or {}, settings))
    out.backoff_policy.max_attempts = retries + 1
    out.subscription.fifo = bool(group.get("consumeMessageOrderly", False))
    out.subscription.receive_batch_size = RECEIVE_BATCH
    out.subscription.long_polling_timeout.FromMilliseconds(settings.grpcClientConsumerMaxLongPollingTimeoutMillis)
    return out
