"""What a receive or a pull asks of the node, and each message as a RocketMQ 5 client reads it.

No I/O, as actors.proxy.core beside it: `receive_plan` (ReceiveMessage as the node's pop) and
`message_of` (a popped message in its stream); `pull_plan` (PullMessage as the node's
PULL_MESSAGE) and `pulled` (the pull's stream); `recover_command` (a half to check, down a
Telemetry stream) and `verify_message` (a stored message an admin sends a consumer's listener).
Every message a client gets is filled by `_fill` (and, read back from the store, `_fill_stored`),
so a message reads the same whichever RPC handed it out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from actors import edge_clients
from actors.edge_fields import MAX_PULL_COUNT
from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.apis import service_pb2 as rpc
from actors.proxy.core import (
    MAX_RECEIVE_BATCH,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TRANSACTION,
    SYSTEM_PROPERTIES,
    Code,
    Refused,
    duration_ms,
    group_name,
    queue_of,
    status,
    topic_name,
    transaction_id,
)
from node.client.producer import SendError
from node.client.push_state import RETRY_PREFIX, as_subscribed
from node.client.received import decode_messages
from node.protocol import EXPRESSION_SQL92, EXPRESSION_TAG
from node.sql92 import SelectorError, compile_selector
from shm.codec import (
    FLAG_COMPRESSED,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELIVER_MS,
)

DEFAULT_INVISIBLE_MS = 60_000  # a receive that names no invisible duration (RocketMQ 5's defaultInvisibleTimeMills)
MIN_INVISIBLE_MS = 1_000
MAX_POLLING_MS = 60_000  # longer waits are refused ILLEGAL_POLLING_TIME
POLL_MARGIN_MS = 1_000  # a held receive or pull answers this long before the client's deadline


@dataclass(frozen=True)
class ReceivePlan:
    """A ReceiveMessageRequest as the node's pop."""

    topic: str
    group: str
    queue_id: int
    max_count: int
    invisible_ms: int
    wait_ms: int
    expression: str  # a tag expression, or SQL92's
    expression_type: str
    orderly: bool


def receive_plan(request: rpc.ReceiveMessageRequest, remaining_ms: int | None, fifo: bool,
                 default_invisible_ms: int = DEFAULT_INVISIBLE_MS, sql92: bool = False) -> ReceivePlan:
    """What to pop for `request`; `remaining_ms` is what is left of the client's deadline (None:
    none), `fifo` whether the group consumes in order. An auto_renew receive (a push consumer's)
    or one that names no invisible duration gets `default_invisible_ms`. `sql92`: the node
    serves SQL92 filters (enablePropertyFilter)."""
    group = group_name(request.group)
    topic = topic_name(request.message_queue.topic)
    if not 0 < request.batch_size <= MAX_RECEIVE_BATCH:
        raise Refused(Code.BAD_REQUEST, f"batch_size must be 1..{MAX_RECEIVE_BATCH}, not {request.batch_size}")
    invisible = (duration_ms(request.invisible_duration)
                 if request.HasField("invisible_duration") and not request.auto_renew else default_invisible_ms)
    if not MIN_INVISIBLE_MS <= invisible <= edge_clients.INVISIBLE_MS_MAX:
        raise Refused(Code.ILLEGAL_INVISIBLE_TIME, f"invisible_duration must be {MIN_INVISIBLE_MS} ms to "
                                                   f"{edge_clients.INVISIBLE_MS_MAX} ms, not {invisible} ms")
    wait = _polling_ms(request, remaining_ms)
    # any queue of the broker (RocketMQ 5's ReceiveMessageQueueSelector); a FIFO group's queue its
    # assignment names, which keeps one member on a queue at a time
    queue_id = request.message_queue.id if fifo and request.message_queue.id >= 0 else -1
    return ReceivePlan(topic, group, queue_id, request.batch_size, invisible, wait,
                       *filter_of(request.filter_expression, sql92), fifo)


def _polling_ms(request, remaining_ms: int | None) -> int:
    """How long a receive or a pull may wait for messages: its long_polling_timeout (0..60 s),
    ending before the client gives up on the call."""
    wait = duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
    if not 0 <= wait <= MAX_POLLING_MS:
        raise Refused(Code.ILLEGAL_POLLING_TIME, f"long_polling_timeout must be 0 to {MAX_POLLING_MS} ms, not {wait} ms")
    if remaining_ms is not None:  # answer (empty) before the client gives up on the call
        wait = max(0, min(wait, remaining_ms - POLL_MARGIN_MS))
    return wait


def filter_of(expression: pb.FilterExpression, sql92: bool) -> tuple[str, str]:
    """(expression, its type as the node's requests name it): a tag expression, or with
    `sql92` a SQL92 selector, checked here as RocketMQ 5's proxy checks it (FilterAPI.build)."""
    if expression.type == pb.SQL:
        if not sql92:
            raise Refused(Code.UNSUPPORTED, "SQL92 filters are off on this node (enablePropertyFilter): filter by tag")
        try:
            compile_selector(expression.expression)
        except SelectorError as e:
            raise Refused(Code.ILLEGAL_FILTER_EXPRESSION, f"SQL92 {expression.expression!r}: {e}") from None
        return expression.expression, EXPRESSION_SQL92
    text = expression.expression.strip() or "*"
    if any(not part.strip() for part in text.split("||")) or not text.isprintable():
        raise Refused(Code.ILLEGAL_FILTER_EXPRESSION, f"{text!r} is not a tag expression (tag || tag, or *)")
    return text, EXPRESSION_TAG


@dataclass(frozen=True)
class PullPlan:
    """A PullMessageRequest as the node's PULL_MESSAGE: one queue from an offset, the offset not
    committed (the client commits with UpdateOffset, as RocketMQ 5's proxy pulls)."""

    topic: str
    group: str
    queue_id: int
    offset: int
    max_count: int
    wait_ms: int
    expression: str
    expression_type: str


def pull_plan(request: rpc.PullMessageRequest, remaining_ms: int | None, sql92: bool = False) -> PullPlan:
    """What to pull for `request`; `remaining_ms` and `sql92` as for `receive_plan`."""
    group = group_name(request.group)
    topic = topic_name(request.message_queue.topic)
    queue_id = queue_of(request.message_queue)
    if request.offset < 0:
        raise Refused(Code.ILLEGAL_OFFSET, f"an offset is 0 or more, not {request.offset}")
    if not 0 < request.batch_size <= MAX_PULL_COUNT:
        raise Refused(Code.BAD_REQUEST, f"batch_size must be 1..{MAX_PULL_COUNT}, not {request.batch_size}")
    return PullPlan(topic, group, queue_id, request.offset, request.batch_size,
                    _polling_ms(request, remaining_ms), *filter_of(request.filter_expression, sql92))


def pulled(result) -> list[rpc.PullMessageResponse]:
    """A pull's answer (node.client.consumer.PullResult) as its stream, as RocketMQ 5's proxy
    writes it (PullMessageResponseStreamWriter): a status (`OK` when messages came,
    `ILLEGAL_OFFSET`, else `MESSAGE_NOT_FOUND`), each message, then the offset to pull from next."""
    if result.messages:
        answer = status(Code.OK, "OK")
    elif result.status == "OFFSET_ILLEGAL":
        answer = status(Code.ILLEGAL_OFFSET, "ILLEGAL_OFFSET")
    else:  # (NO_NEW_MSG, NO_MATCHED_MSG, or FOUND with none left by the exact tag check)
        answer = status(Code.MESSAGE_NOT_FOUND, "no new message")
    out = [rpc.PullMessageResponse(status=answer)]
    for message in result.messages:
        response = rpc.PullMessageResponse()
        _fill_stored(response.message, message)
        out.append(response)
    out.append(rpc.PullMessageResponse(next_offset=result.next_begin_offset))
    return out


def message_of(popped, invisible_ms: int) -> rpc.ReceiveMessageResponse:
    """A popped message (node.client.received.PoppedMessage) as RocketMQ 5 clients receive it,
    in its stream's response. Filled in place: a message given to a constructor is copied."""
    response = rpc.ReceiveMessageResponse()
    system = _fill_stored(response.message, popped)
    system.receipt_handle = popped.receipt_handle
    system.invisible_duration.seconds, system.invisible_duration.nanos = invisible_ms // 1000, invisible_ms % 1000 * 1_000_000
    return response


def _fill_stored(out: pb.Message, stored) -> pb.SystemProperties:
    """`_fill`, and what a stored message read back carries besides: where it is stored, when,
    its type, its delivery attempt, its message group and delivery time."""
    system, properties = _fill(out, stored)
    system.store_host = stored.store_host
    system.queue_id, system.queue_offset = stored.queue_id, stored.queue_offset
    system.delivery_attempt = stored.reconsume_times + 1
    system.message_type = _type_of(properties)
    # (FromMilliseconds is Python; two C assignments each are what it comes to)
    when = stored.store_timestamp
    system.store_timestamp.seconds, system.store_timestamp.nanos = when // 1000, when % 1000 * 1_000_000
    if PROPERTY_SHARDING_KEY in properties:
        system.message_group = properties[PROPERTY_SHARDING_KEY]
    if PROPERTY_TIMER_DELIVER_MS in properties and properties[PROPERTY_TIMER_DELIVER_MS].isdigit():
        system.delivery_timestamp.FromMilliseconds(int(properties[PROPERTY_TIMER_DELIVER_MS]))
    return system


def _fill(out: pb.Message, received) -> tuple[pb.SystemProperties, dict[str, str]]:
    """What every message the proxy hands a client carries (a received one, a half to check):
    topic, body and its MD5 digest, id, born time and host, tag, keys, user properties. MD5 in
    upper-case hex is what RocketMQ 5's proxy sends (GrpcConverter), the one digest the official
    clients check alike (the Node.js client writes a CRC32 in decimal, the Python one in hex), and
    a client whose check fails discards the message as corrupted."""
    properties = received.properties
    out.topic.name = received.topic
    out.body = body = received.body
    system = out.system_properties
    system.message_id = received.msg_id
    system.born_host = received.born_host
    # a body RocketMQ's own clients compressed (zlib; a store or a master of theirs): GZIP, as RocketMQ
    # 5's proxy says it, which the official clients inflate
    system.body_encoding = pb.GZIP if received.sys_flag & FLAG_COMPRESSED else pb.IDENTITY
    system.body_digest.type = pb.MD5
    system.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
    born = received.born_timestamp
    system.born_timestamp.seconds, system.born_timestamp.nanos = born // 1000, born % 1000 * 1_000_000
    tag = properties.get(PROPERTY_TAGS)
    if tag:
        system.tag = tag
    if PROPERTY_KEYS in properties:
        system.keys.extend(received.keys)
    user = {k: v for k, v in properties.items() if k not in SYSTEM_PROPERTIES}
    if user:
        out.user_properties.update(user)
    return system, properties


def recover_command(half, header: dict) -> rpc.TelemetryCommand:
    """A CHECK_TRANSACTION_STATE as RecoverOrphanedTransactionCommand: the half (a ReceivedMessage,
    shown under its real topic) and its transaction_id."""
    command = rpc.TelemetryCommand()
    out = command.recover_orphaned_transaction_command
    system, _ = _fill(out.message, half)
    system.message_type = pb.TRANSACTION
    out.transaction_id = transaction_id(header.get("offsetMsgId", ""), header["tranStateTableOffset"])
    return command


def verify_message(body: bytes | None, group: str) -> pb.Message | None:
    """CONSUME_MESSAGE_DIRECTLY's message (the node read it) as the consumer would have received
    it: one of the group's %RETRY% topic under its own topic, as a receive shows it. None for a
    body that holds no message."""
    try:
        stored = decode_messages(body or b"")[0]
    except (SendError, IndexError):
        return None
    if stored.topic == RETRY_PREFIX + group:
        as_subscribed(stored, stored.topic)
    message = pb.Message()
    _fill_stored(message, stored)
    return message


def _type_of(properties: dict[str, str]) -> int:
    if PROPERTY_SHARDING_KEY in properties:
        return pb.FIFO
    if properties.get(PROPERTY_TRANSACTION) == "true":
        return pb.TRANSACTION
    if PROPERTY_TIMER_DELIVER_MS in properties or PROPERTY_TIMER_DELAY_MS in properties or PROPERTY_DELAY in properties:
        return pb.DELAY
    return pb.NORMAL
