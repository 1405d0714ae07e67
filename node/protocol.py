"""The wire protocol's core: codes, statuses and frame codecs, with no sockets (h11 style).

A request or reply is one ZeroMQ message of one or two frames: frame 0 a header (a UTF-8 JSON
object), frame 1 an optional binary body. `docs/protocol.md` is the specification for clients in
other languages; this module is its reference implementation, shared by the node and the Python
client, so both sides parse the same way.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from node.sql92 import Selector, SelectorError, compile_selector
from shm.codec import (BATCH_MESSAGE_HEAD, BATCH_PROPS_LENGTH, MAX_MESSAGES_PER_BATCH, MAX_PROPERTIES_BYTES, record_properties,
                       tags_code)

# -- request codes: RocketMQ's RequestCode numbers where RocketMQ has the request -----------------
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_MESSAGE = 12
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
UPDATE_BROKER_CONFIG = 25  # a setting changed while the node runs (only brokerPermission): properties text in frame 1
GET_BROKER_CONFIG = 26  # every setting, as properties text in frame 1
GET_BROKER_RUNTIME_INFO = 28
SEARCH_OFFSET_BY_TIMESTAMP = 29
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
VIEW_MESSAGE_BY_ID = 33
GET_ROUTEINFO_BY_TOPIC = 105
# the name service's (RocketMQ's NameServer requests; node.server.namesrv)
REGISTER_BROKER = 103
UNREGISTER_BROKER = 104
GET_BROKER_CLUSTER_INFO = 106
GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
NAMESRV_CODES = frozenset({REGISTER_BROKER, UNREGISTER_BROKER, GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO,
                           GET_ALL_TOPIC_LIST_FROM_NAMESERVER})
SEND_BATCH_MESSAGE = 320
SEND_MESSAGES = 9010  # mqnode: many independent sends in one frame (a client's coalesced sends)

GET_ALL_TOPIC_CONFIG = 21
GET_CONSUME_STATS = 208
GET_ALL_CONSUMER_OFFSET = 43
# administration (RocketMQ's codes): `mqnode admin topic|group ...`
UPDATE_AND_CREATE_TOPIC = 17
DELETE_TOPIC_IN_BROKER = 215
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
DELETE_SUBSCRIPTIONGROUP = 207  # RocketMQ's: every group's committed offsets, as config/consumerOffset.json holds them
# consumer groups (RocketMQ's codes): actors.consumers, node.client.push
HEART_BEAT = 34
UNREGISTER_CLIENT = 35
GET_CONSUMER_LIST_BY_GROUP = 38
NOTIFY_CONSUMER_IDS_CHANGED = 40  # node -> member, unasked: the group's members or queues changed
LOCK_BATCH_MQ = 41
UNLOCK_BATCH_MQ = 42
GET_CONSUMER_CONNECTION_LIST = 203
GET_PRODUCER_CONNECTION_LIST = 204  # a producer group's connected producers (those a transaction's check may reach)
GET_CONSUMER_RUNNING_INFO = 307  # a member's own view (queues, what it holds, rates, stacks): the node asks it
CONSUME_MESSAGE_DIRECTLY = 309  # a stored message to a member's listener, now: the node reads it, then asks the member
CLIENT_ANSWER = 9050  # mqnode: a client's answer to what the node asked it (`askId`); the node replies nothing
# a group's offsets were reset (`admin reset-offset`): admin -> node, which tells each member, as RocketMQ's broker does
RESET_CONSUMER_CLIENT_OFFSET = 220
GROUP_CODES = frozenset({HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, LOCK_BATCH_MQ, UNLOCK_BATCH_MQ,
                         GET_CONSUMER_CONNECTION_LIST, GET_PRODUCER_CONNECTION_LIST, GET_CONSUMER_RUNNING_INFO,
                         CONSUME_MESSAGE_DIRECTLY, CLIENT_ANSWER, RESET_CONSUMER_CLIENT_OFFSET})
ANSWER_FIELDS = {GET_CONSUMER_RUNNING_INFO: "runningInfo", CONSUME_MESSAGE_DIRECTLY: "consumeResult"}
CONSUMER_SEND_MSG_BACK = 36  # a consumer hands a message back: %RETRY%<group> with a delay, or %DLQ%<group>
DELETE_EXPIRED_COMMITLOG = 329  # RocketMQ 5's code: executeDeleteFilesManually (`mqnode admin clean`)
# replication (docs/protocol.md "Replication"): `mqnode admin ha|role`
GET_BROKER_HA_STATUS = 907  # RocketMQ 5's code: the role, epoch, slaves or master, offsets and lag
HA_ROLE = 9020  # mqnode: promote a slave (it stops following and takes sends), or switch a master's sync mode
HA_CODES = frozenset({GET_BROKER_HA_STATUS, HA_ROLE})

# pop consumption (RocketMQ 5's codes), served by the pop service (actors.pop)
POP_MESSAGE = 200050
ACK_MESSAGE = 200051
PEEK_MESSAGE = 200052
CHANGE_MESSAGE_INVISIBLETIME = 200053
BATCH_ACK_MESSAGE = 200151
POP_CODES = frozenset({POP_MESSAGE, ACK_MESSAGE, PEEK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, BATCH_ACK_MESSAGE})
GET_POP_STATE = 9030  # mqnode: a group's pop state per queue (`mqnode admin group`)
RESET_POP_OFFSET = 9031  # mqnode: a pop group's queues of a topic start again at `admin reset-offset`'s offsets
POP_SERVICE_CODES = POP_CODES | {GET_POP_STATE, RESET_POP_OFFSET}

# transactional messages (RocketMQ's codes), served by the transaction service (actors.transaction)
END_TRANSACTION = 37  # commit or roll back a half message (or leave it to the check: commitOrRollback 0)
CHECK_TRANSACTION_STATE = 39  # node -> a producer of the half's group, unasked: what became of it?
GET_TRANSACTION_STATE = 9040  # mqnode: the halves pending, checked, committed, ... (`mqnode admin transactions`)
END_TRANSACTIONS = 9041  # mqnode: many END_TRANSACTIONs of one producer group in one request (a result each)
TRANSACTION_CODES = frozenset({END_TRANSACTION, GET_TRANSACTION_STATE, END_TRANSACTIONS})
MAX_ENDS_PER_REQUEST = 1024

SEND_CODES = frozenset({SEND_MESSAGE, SEND_BATCH_MESSAGE, SEND_MESSAGES})
# request-reply (RocketMQ 4.6's RPC over messages; docs/protocol.md "Request and reply"): a requester's
# message carries CORRELATION_ID, REPLY_TO_CLIENT (its clientID) and TTL; the reply, made from it
# (node.client.replies.create_reply), goes to `<brokerClusterName>_REPLY_TOPIC` as a SEND_REPLY_MESSAGE,
# which the node pushes to the requester's connection (PUSH_REPLY_MESSAGE_TO_CLIENT) and stores
SEND_REPLY_MESSAGE = 324
PUSH_REPLY_MESSAGE_TO_CLIENT = 326  # node -> the requester, unasked: its reply
PROPERTY_CORRELATION_ID = "CORRELATION_ID"
PROPERTY_REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
PROPERTY_MESSAGE_TTL = "TTL"
PROPERTY_MESSAGE_TYPE = "MSG_TYPE"
PROPERTY_PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
PROPERTY_REPLY_ARRIVE_TIME = "ARRIVE_TIME"
REPLY_MESSAGE_FLAG = "reply"  # MSG_TYPE of a reply
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"


def reply_topic(cluster: str) -> str:
    """The topic replies of a cluster's requests go to (RocketMQ's MixAll.getReplyTopic)."""
    return f"{cluster}_{REPLY_TOPIC_POSTFIX}"


# served by the pull workers, from read-only mappings
READ_CODES = frozenset({PULL_MESSAGE, QUERY_MESSAGE, SEARCH_OFFSET_BY_TIMESTAMP, GET_MAX_OFFSET, GET_MIN_OFFSET,
                        VIEW_MESSAGE_BY_ID})
# served by the front, the single writer of config/consumerOffset.json
OFFSET_CODES = frozenset({QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET, GET_CONSUME_STATS})

# -- response codes: RocketMQ's ResponseCode numbers ------------------------------------------------
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
FLUSH_DISK_TIMEOUT = 10
SLAVE_NOT_AVAILABLE = 11
FLUSH_SLAVE_TIMEOUT = 12
MESSAGE_ILLEGAL = 13
SERVICE_NOT_AVAILABLE = 14
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22
SUBSCRIPTION_PARSE_FAILED = 23
NO_PERMISSION = 16
SUBSCRIPTION_GROUP_NOT_EXIST = 26
CONSUMER_NOT_ONLINE = 206
INVALID_PARAMETER = 29
NO_MESSAGE = 208
POLLING_FULL = 209

# PutMessageStatus (spec §11) and the node's own refusals -> response code
STATUS_CODES = {
    "PUT_OK": SUCCESS,
    "FLUSH_DISK_TIMEOUT": FLUSH_DISK_TIMEOUT,
    "FLUSH_SLAVE_TIMEOUT": FLUSH_SLAVE_TIMEOUT,
    "SLAVE_NOT_AVAILABLE": SLAVE_NOT_AVAILABLE,
    "SERVICE_NOT_AVAILABLE": SERVICE_NOT_AVAILABLE,
    "CREATE_MAPEDFILE_FAILED": SYSTEM_ERROR,
    "MESSAGE_ILLEGAL": MESSAGE_ILLEGAL,
    "PROPERTIES_SIZE_EXCEEDED": MESSAGE_ILLEGAL,
    "OS_PAGECACHE_BUSY": SYSTEM_BUSY,
    "UNKNOWN_ERROR": SYSTEM_ERROR,
    "SYSTEM_BUSY": SYSTEM_BUSY,
    "TOPIC_NOT_EXIST": TOPIC_NOT_EXIST,
    "REQUEST_CODE_NOT_SUPPORTED": REQUEST_CODE_NOT_SUPPORTED,
    "SYSTEM_ERROR": SYSTEM_ERROR,
    "OK": SUCCESS,
    # pulls (the client's PullStatus)
    "FOUND": SUCCESS,
    "NO_NEW_MSG": PULL_NOT_FOUND,
    "NO_MATCHED_MSG": PULL_RETRY_IMMEDIATELY,
    "OFFSET_ILLEGAL": PULL_OFFSET_MOVED,
    "QUERY_NOT_FOUND": QUERY_NOT_FOUND,
    "SUBSCRIPTION_PARSE_FAILED": SUBSCRIPTION_PARSE_FAILED,
    "NO_PERMISSION": NO_PERMISSION,
    "SUBSCRIPTION_GROUP_NOT_EXIST": SUBSCRIPTION_GROUP_NOT_EXIST,
    "CONSUMER_NOT_ONLINE": CONSUMER_NOT_ONLINE,
    # pops and acks
    "POLLING_FULL": POLLING_FULL,
    "INVALID_RECEIPT_HANDLE": INVALID_PARAMETER,
    "RECEIPT_HANDLE_EXPIRED": NO_MESSAGE,
}
# Stored, so the send is not to be retried: isOk() in RocketMQ
STORED_STATUSES = frozenset({"PUT_OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"})
RETRIABLE_STATUSES = frozenset({"SYSTEM_BUSY", "OS_PAGECACHE_BUSY"})

MAX_HEADER_BYTES = 4 * 1024 * 1024  # a header beyond this is malformed, whatever it says
MAX_MESSAGES_PER_REQUEST = MAX_MESSAGES_PER_BATCH


class ProtocolError(ValueError):
    """A frame that cannot be a request: answered with SYSTEM_ERROR and the reason."""


@dataclass(frozen=True, slots=True)
class Request:
    header: dict
    body: bytes

    @property
    def code(self) -> int:
        return self.header["code"]

    @property
    def opaque(self):
        return self.header.get("opaque")


def encode_request(header: dict, body: bytes | None = None) -> list[bytes]:
    frames = [orjson.dumps(header)]
    if body is not None:
        frames.append(body)
    return frames


def decode_request(frames: list[bytes]) -> Request:
    """Frames after the ROUTER's identity frame. Raises ProtocolError naming the fault."""
    if not frames or len(frames) > 2:
        raise ProtocolError(f"a request is 1 or 2 frames, got {len(frames)}")
    raw = frames[0]
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ProtocolError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header must be a JSON object")
    code = header.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        raise ProtocolError("header needs an integer `code`")
    return Request(header, bytes(frames[1]) if len(frames) == 2 else b"")


def namesrv_endpoints(addresses) -> list[str]:
    """Name services' ZeroMQ endpoints from RocketMQ's `namesrvAddr` (`host:port;host:port`),
    `tcp://host:port` (or `ipc://...`) accepted too, or from a list of either."""
    items = addresses.split(";") if isinstance(addresses, str) else list(addresses)
    out = []
    for item in (str(i).strip() for i in items):
        if item:
            out.append(item if "://" in item else f"tcp://{item}")
    return out


def host_port(host: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets (`[::1]:10912`)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tcp_endpoint(host: str, port: int) -> str:
    """A ZeroMQ tcp endpoint: an IPv6 address in brackets."""
    return f"tcp://{host_port(host, port)}"


def ipv6_ready(sock, endpoint: str) -> None:
    """Before `sock` binds or connects to `endpoint`: ZeroMQ takes an IPv6 address only on a
    socket told it may (ZMQ_IPV6; without it bind and connect fail with "No such device"). Only
    there: a socket that may use IPv6 resolves a name to its IPv6 address first (localhost: ::1),
    which a node on 127.0.0.1 does not answer."""
    if endpoint.startswith("tcp://["):
        import zmq

        sock.setsockopt(zmq.IPV6, 1)


def broker_endpoint(address: str) -> str:
    """A broker's client endpoint from a route's brokerAddrs (`host:port`, or an endpoint as is)."""
    return address if "://" in address else f"tcp://{address}"


def reply_header(opaque, status: str, remark: str = "", **fields) -> dict:
    header = {"code": STATUS_CODES.get(status, SYSTEM_ERROR), "opaque": opaque, "status": status}
    if remark:
        header["remark"] = remark
    header.update(fields)
    return header


def error_reply(opaque, status: str, remark: str) -> list[bytes]:
    return [orjson.dumps(reply_header(opaque, status, remark))]


# -- subscriptions -------------------------------------------------------------------------------


def parse_subscription(expression) -> list[str] | None:
    """`*` (or empty) -> None (everything); `TagA || TagB` -> the tags. ProtocolError otherwise."""
    if expression is None or (isinstance(expression, str) and expression.strip() in ("", "*")):
        return None
    if not isinstance(expression, str):
        raise ProtocolError("the subscription expression must be a string")
    tags = [t.strip() for t in expression.split("||")]
    if any(not t or t == "*" for t in tags):
        raise ProtocolError(f"subscription {expression!r}: expected * or TagA || TagB")
    return tags


EXPRESSION_TAG, EXPRESSION_SQL92 = "TAG", "SQL92"  # RocketMQ's ExpressionType
SQL92_OFF = "The broker does not support consumer to filter message by SQL92"  # (RocketMQ's words, with SYSTEM_ERROR)


class FilterRefused(ProtocolError):
    """A subscription the node will not serve: `status` says why (SUBSCRIPTION_PARSE_FAILED, or
    SYSTEM_ERROR for SQL92 with enablePropertyFilter off, as RocketMQ answers)."""

    def __init__(self, status: str, remark: str):
        super().__init__(remark)
        self.status = status


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """What a pull or pop selects: `tags` (exact; None: every tag) with their ConsumeQueue hash
    `codes`, or a SQL92 `selector` over each message's properties."""
    tags: list[str] | None = None
    codes: frozenset[int] | None = None
    selector: Selector | None = None
    record_test: Callable[[bytes], bool] | None = None  # the selector as a test of a stored record, for the reader


def message_filter(expression_type, expression, *, sql92: bool) -> MessageFilter:
    """A request's filter from its expression type (absent, "" or TAG: tags; SQL92: a selector,
    served only when `sql92`, the node's enablePropertyFilter). FilterRefused otherwise."""
    if expression_type in (None, "", EXPRESSION_TAG):
        try:
            tags = parse_subscription(expression)
        except ProtocolError as e:
            raise FilterRefused("SUBSCRIPTION_PARSE_FAILED", str(e)) from None
        return MessageFilter(tags, frozenset(map(tags_code, tags))) if tags else MessageFilter()
    if expression_type != EXPRESSION_SQL92:
        raise FilterRefused("SUBSCRIPTION_PARSE_FAILED", f"expression type {expression_type!r}: TAG or SQL92")
    if not sql92:
        raise FilterRefused("SYSTEM_ERROR", SQL92_OFF)
    try:
        selector = compile_selector(expression)
    except SelectorError as e:
        raise FilterRefused("SUBSCRIPTION_PARSE_FAILED", f"SQL92 {expression!r}: {e}") from None
    return MessageFilter(selector=selector, record_test=lambda raw: selector.matches(record_properties(raw)))


GROUP_MAX_LENGTH = 255  # RocketMQ's Validators.CHARACTER_MAX_LENGTH
SUSPEND_MS_MAX = 600_000  # a held pull or pop waits at most 10 minutes
POP_MAX_COUNT = 1024  # messages a pop (RocketMQ 5's proxy allows 32 a receive; more helps a batch consumer)
INVISIBLE_MS_MAX = 12 * 3600 * 1000  # RocketMQ 5's maxInvisibleTime (12 h)
NAME = re.compile(r"[%|a-zA-Z0-9_-]+")  # a topic's or group's characters (RocketMQ's Validators.PATTERN)


def check_group(group, kind: str = "consumer group") -> None:
    """A client's check of its consumer (or producer) group, as RocketMQ's clients make it at their
    start (Validators.checkGroup): ValueError for one every node refuses. Before, a PushConsumer of
    such a group started and consumed nothing in silence (its heartbeats refused)."""
    if not isinstance(group, str) or not group:
        raise ValueError(f"a {kind} must be a name, not {group!r}")
    if len(group) > GROUP_MAX_LENGTH:
        raise ValueError(f"the {kind} is {len(group)} characters; at most {GROUP_MAX_LENGTH} are allowed")
    if not NAME.fullmatch(group):
        raise ValueError(f"the {kind} {group!r} may only contain characters from [%|a-zA-Z0-9_-]")


def check_expression(expression, expression_type: str = EXPRESSION_TAG) -> None:
    """A client's check of a subscription before it is used: FilterRefused (a ValueError) for
    one no node would parse (whether the node serves SQL92 only the node can say)."""
    message_filter(expression_type, expression, sql92=True)


# -- recalling a timer message (RocketMQ 5.3's RecallMessage) ------------------------------------

RECALL_TAG = "_RECALL_TAG_"  # the tag of the record a recall stores (RocketMQ's)


def recall_handle(topic: str, broker_name: str, timestamp_ms: int, message_id: str) -> str:
    """RocketMQ 5's recall handle of a timer message (RecallMessageHandle.HandleV1): base64url of
    `v1 <topic> <brokerName> <delivery ms> <message id>`, opaque to its holder."""
    raw = " ".join(("v1", topic, broker_name, str(timestamp_ms), message_id))
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii")


def parse_recall_handle(handle) -> tuple[str, str, int, str]:
    """(topic, brokerName, delivery ms, message id) of a `recall_handle`; ProtocolError for
    anything else."""
    try:
        parts = base64.urlsafe_b64decode(handle.encode("ascii")).decode("utf-8").split(" ")
    except (AttributeError, ValueError, UnicodeError):
        raise ProtocolError(f"{str(handle)[:80]!r} is not a recall handle") from None
    if len(parts) != 5 or parts[0] != "v1" or not parts[3].isdigit() or not parts[1] or not parts[4]:
        raise ProtocolError(f"{str(handle)[:80]!r} is not a recall handle (v1)")
    return parts[1], parts[2], int(parts[3]), parts[4]


# -- RocketMQ's client batch body (MessageDecoder.encodeMessages), spec §2.10 -----------------------
# A batch body's message: head, body, properties length, properties; the layout is the codec's
# (shm.codec, whose one-pass encoder turns a batch body into records).


class PropertiesTooLarge(ValueError):
    """A batch's message whose properties its 2-byte length cannot carry (32767 bytes, the node's
    limit of a stored message's too): the client's PROPERTIES_SIZE_EXCEEDED, not struct's error."""


def encode_batch_body(messages: list[tuple[bytes, int, str]]) -> bytes:
    """(body, flag, properties string) per message -> the batch body a SEND_BATCH_MESSAGE carries."""
    parts = []
    for index, (body, flag, properties) in enumerate(messages):
        props = properties.encode("utf-8")
        if len(props) > MAX_PROPERTIES_BYTES:
            raise PropertiesTooLarge(f"message {index} of the batch: properties of {len(props)} bytes exceed "
                                     f"{MAX_PROPERTIES_BYTES}")
        size = BATCH_MESSAGE_HEAD.size + len(body) + 2 + len(props)
        parts += [BATCH_MESSAGE_HEAD.pack(size, 0, 0, flag, len(body)), body, BATCH_PROPS_LENGTH.pack(len(props)), props]
    return b"".join(parts)


def decode_batch_body(data: bytes, limit: int = MAX_MESSAGES_PER_REQUEST) -> list[tuple[bytes, int, str]]:
    """The inverse of `encode_batch_body`; ProtocolError for a body that does not parse exactly."""
    messages, at = [], 0
    while at < len(data):
        if len(messages) >= limit:
            raise ProtocolError(f"a batch holds at most {limit} messages")
        if len(data) - at < BATCH_MESSAGE_HEAD.size + 2:
            raise ProtocolError(f"batch message at byte {at} is truncated")
        size, magic, _, flag, body_len = BATCH_MESSAGE_HEAD.unpack_from(data, at)
        if magic != 0:
            raise ProtocolError(f"batch message at byte {at}: magic {magic}, expected 0")
        props_at = at + BATCH_MESSAGE_HEAD.size + body_len
        if body_len < 0 or size < BATCH_MESSAGE_HEAD.size + 2 or props_at + 2 > len(data):
            raise ProtocolError(f"batch message at byte {at}: body length {body_len} does not fit")
        props_len, = BATCH_PROPS_LENGTH.unpack_from(data, props_at)
        if props_len < 0 or size != BATCH_MESSAGE_HEAD.size + body_len + 2 + props_len or at + size > len(data):
            raise ProtocolError(f"batch message at byte {at}: size {size} does not match its fields")
        try:
            props = data[props_at + 2: props_at + 2 + props_len].decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"batch message at byte {at}: properties are not UTF-8") from None
        messages.append((data[at + BATCH_MESSAGE_HEAD.size: props_at], flag, props))
        at += size
    if not messages:
        raise ProtocolError("a batch holds at least one message")
    return messages


def opaque_of(frames: list[bytes]):
    """The opaque of a request whose header is broken, when it can still be read."""
    try:
        header = orjson.loads(frames[0])
        return header.get("opaque") if isinstance(header, dict) else None
    except (orjson.JSONDecodeError, IndexError):
        return None
