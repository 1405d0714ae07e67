"""The requests the schedule service makes of the write path, built from stored records. No I/O.

A delivery (a due delayed or timer message for its real topic and queue) is one message of a
SEND_MESSAGES request marked `_reput`, REPUT_BATCH to a request (`delivery_request`); a
consumer's send-back is a SEND_MESSAGE `_reput` into `%RETRY%<group>` or `%DLQ%<group>`
(`send_back_request`). The transaction service's are messages of such requests too: a half's
committed message (`commit_item`), a half checked too often (`discard_item`), and the op records
that write down each outcome (`op_item`). The front takes them only from the node's own links: the
schedule service's private socket, the pop and transaction services' rings (actors.wire.SERVICE_SEND).
"""

from __future__ import annotations

from typing import NamedTuple

from node import protocol
from shm.codec import (
    TRANSACTION_COMMIT,
    TRANSACTION_MASK,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    FIXED_BODY_LEN,
    FIXED_BORN_HOST,
    FIXED_BORN_TS,
    FIXED_QUEUE_OFFSET,
    FIXED_RECONSUME,
    FIXED_STORE_HOST,
    FIXED_STORE_TS,
    PROPERTY_DELAY,
    PROPERTY_INNER_NUM,
    PROPERTY_TAGS,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_OUT_MS,
    TIMER_TOPIC,
    Record,
    batch_body_after,
    decode,
    decode_host,
    encode_host,
    parse_properties,
    properties_string,
    walk_v4,
)
from shm.javacompat import hashmap_capacity

RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"
MAX_RECONSUME_TIMES = 16
PROPERTY_RETRY_TOPIC, PROPERTY_ORIGIN_MESSAGE_ID = "RETRY_TOPIC", "ORIGIN_MESSAGE_ID"
PROPERTY_TRANSACTION_OP = "TRAN_OP"  # an op record's outcome (actors.transaction_core)
OP_TAG = "d"  # RocketMQ's TransactionalMessageUtil.REMOVETAG

REPUT_TIMEOUT_S = 5.0  # a re-put not answered by then counts as not stored, once the front answers at all
FIRST_ANSWER_TIMEOUT_S = 60.0  # ... and while no answer has come since the service's process opened

_born_hosts: dict[bytes, str] = {}  # a record's 8 born-host bytes -> "ip:port" (few hosts, many records)


class ReputDeadline:
    """When a re-put this process sent and the front has not answered counts as not stored:
    REPUT_TIMEOUT_S after the later of its send and the front's first answer to this process;
    FIRST_ANSWER_TIMEOUT_S after its send while the front has not answered at all. (A node
    starting on a loaded machine, 18 s seen, can open a service many seconds before its front
    serves: its re-puts in that gap would expire and go twice.) One per service that re-puts:
    schedule, pop, transaction."""

    __slots__ = ("first_answer_at",)

    def __init__(self):
        self.first_answer_at: float | None = None  # monotonic s, since this process opened

    def answered(self, now: float) -> None:
        if self.first_answer_at is None:
            self.first_answer_at = now

    def expired(self, sent_at: float, now: float) -> bool:
        """Whether a re-put sent at `sent_at` (monotonic s) and unanswered at `now` counts as not stored."""
        if self.first_answer_at is None:
            return now - sent_at > FIRST_ANSWER_TIMEOUT_S
        return now - max(sent_at, self.first_answer_at) > REPUT_TIMEOUT_S


def reput_item_raw(raw: bytes) -> tuple[dict, bytes] | None | bool:
    """`reput_item` of a stored record's bytes, read without decoding the whole record (the
    common IPv4 record); False for one `reput_item` must read through `decode`."""
    walked = walk_v4(raw, 0, len(raw))
    if walked is None:
        return False
    fixed, body_at, topic_at, props_at = walked
    topic = raw[topic_at: props_at - 2].decode()
    text = raw[props_at:].decode()
    properties = parse_properties(text)
    real_topic, queue = properties.get(PROPERTY_REAL_TOPIC), properties.get(PROPERTY_REAL_QID)
    if not real_topic or queue is None or not queue.isdigit() or real_topic == TRANS_HALF_TOPIC:
        return None
    if topic == TIMER_TOPIC:
        text = properties_string({k: v for k, v in properties.items() if k not in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID)},
                                 hashmap_capacity(len(properties)))  # a HashMap keeps its buckets when keys go
    born = _born_host(fixed[FIXED_BORN_HOST])
    body = raw[body_at: body_at + fixed[FIXED_BODY_LEN]]
    item = {"topic": real_topic, "queueId": int(queue), "flag": fixed[4], "bornTimestamp": fixed[FIXED_BORN_TS],
            "bornHost": born, "reconsumeTimes": fixed[FIXED_RECONSUME], "bodySize": len(body),
            "_reput": {"sysFlag": fixed[7], "properties": text}}
    return item, body


def _born_host(host: bytes) -> str:
    born = _born_hosts.get(host)
    if born is None:
        born = str(decode_host(host))
        if len(_born_hosts) < 4096:
            _born_hosts[host] = born
    return born


def reput_item(record: Record) -> tuple[dict, bytes] | None:
    """One message of a delivery request: a due delayed or timer record for its real topic and
    queue, fields copied as RocketMQ's messageTimeup copies them (a level's record keeps its
    properties string; a timer's loses REAL_TOPIC and REAL_QID, as RocketMQ 5's does); None for
    a record not to deliver."""
    properties = record.properties
    topic, queue = properties.get(PROPERTY_REAL_TOPIC), properties.get(PROPERTY_REAL_QID)
    if not topic or queue is None or not queue.isdigit() or topic == TRANS_HALF_TOPIC:
        return None
    stored = record.properties_string
    if record.topic == TIMER_TOPIC:
        capacity = hashmap_capacity(len(properties))  # a HashMap keeps its buckets when keys go
        stored = properties_string({k: v for k, v in properties.items()
                                    if k not in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID)}, capacity)
    item = {"topic": topic, "queueId": int(queue), "flag": record.flag, "bornTimestamp": record.born_timestamp,
            "bornHost": str(record.born_host), "reconsumeTimes": record.reconsume_times, "bodySize": len(record.body),
            "_reput": {"sysFlag": record.sys_flag, "properties": stored}}
    return item, record.body


def delivery_request(items: list[tuple[dict, bytes]], opaque: int) -> tuple[dict, bytes]:
    """Up to REPUT_BATCH deliveries as one SEND_MESSAGES the write path stores as given."""
    header = {"code": protocol.SEND_MESSAGES, "opaque": opaque, "compact": True, "_reput": True,
              "messages": [item for item, _ in items]}
    return header, b"".join([body for _, body in items])


def delivered_statuses(header: dict, count: int) -> list[str]:
    """Each delivery's status from the answer to a `delivery_request` (compact when all stored)."""
    results = header.get("results")
    if results is not None and len(results) == count:
        return [r.get("status", "SYSTEM_ERROR") for r in results]
    # (compact, or refused whole by the front: a result per message it was sent, and a one-half
    # batch's commit is one message there and many records here)
    return [header.get("status", "SYSTEM_ERROR")] * count


def timer_entry(raw: bytes | None) -> tuple[int, dict] | None:
    """A stored timer message's TIMER_OUT_MS and properties, None for anything else (a record
    gone, a value the write path would never have stored)."""
    record = decode(raw, check_crc=False, read_body=False) if raw else None
    if not isinstance(record, Record) or record.topic != TIMER_TOPIC:
        return None
    text = record.properties.get(PROPERTY_TIMER_OUT_MS, "")
    return (int(text), record.properties) if text.isdigit() else None


def send_back_request(record: Record, header: dict, opaque: int, max_level: int) -> tuple[dict, bytes]:
    """CONSUMER_SEND_MSG_BACK's re-put (spec §10.3): into `%RETRY%<group>` with a delay, or into
    `%DLQ%<group>` once the retries are used up (or the client asks with a negative level)."""
    group = header["consumerGroup"]
    reconsume = record.reconsume_times
    max_times = header.get("maxReconsumeTimes", MAX_RECONSUME_TIMES)
    level = header.get("delayLevel", 0)
    properties = dict(record.properties)
    properties.setdefault(PROPERTY_RETRY_TOPIC, header.get("originTopic") or record.topic)
    properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, header.get("originMsgId") or record.uniq_key or record.msg_id)
    for name in (PROPERTY_DELAY, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID):
        properties.pop(name, None)
    if reconsume >= max_times or level < 0:
        topic, delay = DLQ_PREFIX + group, 0
    else:
        topic, delay = RETRY_PREFIX + group, min(level if level > 0 else 3 + reconsume, max_level)
    if delay:
        properties[PROPERTY_DELAY] = str(delay)
    out = {"code": protocol.SEND_MESSAGE, "opaque": opaque, "topic": topic, "queueId": 0, "flag": record.flag,
           "bornTimestamp": record.born_timestamp, "bornHost": str(record.born_host),
           "reconsumeTimes": reconsume + 1,
           # answered once stored as its mode promises (flushed under SYNC_FLUSH), as a client's send is
           "_reput": {"sysFlag": record.sys_flag, "properties": properties_string(properties), "delay": delay,
                      "wait": True}}
    return out, record.body


class Stored(NamedTuple):
    """What the transaction service needs of a stored record, read without decoding the whole
    record where it can (`stored_of`)."""

    topic: str
    queue_offset: int
    store_timestamp: int
    sys_flag: int
    flag: int
    born_timestamp: int
    born_host: str
    store_host: bytes  # as stored (8 bytes for IPv4): the offset msgId's
    reconsume_times: int
    body: bytes
    properties_string: str
    properties: dict[str, str]


def stored_of(raw: bytes | None, *, parse: bool = True) -> Stored | None:
    """A stored record's `Stored` (None: no record there, or not a well-formed one); without
    `parse`, its `properties` are left empty (the text is there) for a caller that knows them."""
    if not raw:
        return None
    walked = walk_v4(raw, 0, len(raw))
    if walked is None:
        record = decode(raw, check_crc=False)
        if not isinstance(record, Record):
            return None
        return Stored(record.topic, record.queue_offset, record.store_timestamp, record.sys_flag, record.flag,
                      record.born_timestamp, str(record.born_host), encode_host(record.store_host.ip,
                                                                               record.store_host.port),
                      record.reconsume_times, record.body, record.properties_string, record.properties)
    fixed, body_at, topic_at, props_at = walked
    text = raw[props_at:].decode()
    return Stored(raw[topic_at: props_at - 2].decode(), fixed[FIXED_QUEUE_OFFSET], fixed[FIXED_STORE_TS], fixed[7],
                  fixed[4], fixed[FIXED_BORN_TS], _born_host(fixed[FIXED_BORN_HOST]), fixed[FIXED_STORE_HOST],
                  fixed[FIXED_RECONSUME], raw[body_at: body_at + fixed[FIXED_BODY_LEN]], text,
                  parse_properties(text) if parse else {})


def _copy(record: Stored, topic: str, queue_id: int, sys_flag: int, prepared: int = 0) -> tuple[dict, bytes]:
    """A stored record's fields, properties string as stored, for `topic` and `queue_id`."""
    item = {"topic": topic, "queueId": queue_id, "flag": record.flag, "bornTimestamp": record.born_timestamp,
            "bornHost": record.born_host, "reconsumeTimes": record.reconsume_times, "bodySize": len(record.body),
            "_reput": {"sysFlag": sys_flag, "properties": record.properties_string, "prepared": prepared}}
    return item, record.body


def half_target(record: Stored) -> tuple[str, int] | None:
    """A half's real topic and queue (None: not a half a commit could deliver)."""
    topic, queue = record.properties.get(PROPERTY_REAL_TOPIC), record.properties.get(PROPERTY_REAL_QID)
    if record.topic != TRANS_HALF_TOPIC or not topic or queue is None or not queue.isdigit():
        return None
    return topic, int(queue)


def commit_item(record: Stored, phy: int, target: tuple[str, int] | None = None) -> tuple[dict, bytes]:
    """A half's committed message (4.9's EndTransactionProcessor.endMessageTransaction): its real
    topic and queue (`target`, when the caller read them already), the half's fields and stored
    properties (REAL_TOPIC, REAL_QID and TRAN_MSG stay, as 4.9 stores them), sysFlag COMMIT,
    PREPAREDTRANSACTIONOFFSET the half's offset."""
    topic, queue_id = target or half_target(record)
    return _copy(record, topic, queue_id, (record.sys_flag & ~TRANSACTION_MASK) | TRANSACTION_COMMIT, phy)


def commit_batch_item(record: Stored, phy: int, target: tuple[str, int], *, skip: int = 0) -> tuple[dict, bytes]:
    """A one-half batch's commit (actors.sendcore `_add_half_batch`): its batch body for the real
    topic and queue, each message of it stored by the write path with its own properties and then
    the half's, less INNER_NUM (as a batch of halves' commits are stored), sysFlag COMMIT,
    PREPAREDTRANSACTIONOFFSET the half's offset. `_reput.inner` says how many records it makes.
    `skip`: its first messages are stored already (a torn commit: actors.transaction_core.TornCommits)."""
    suffix, _, last = record.properties_string.rpartition("\x02")  # (the write path put INNER_NUM last)
    name, _, count = last.partition("\x01")
    if name != PROPERTY_INNER_NUM or not count.isdigit():  # (not as this node stores them: taken apart)
        properties = parse_properties(record.properties_string)
        count = properties.pop(PROPERTY_INNER_NUM)
        suffix = properties_string(properties)
    item, body = _copy(record, *target, (record.sys_flag & ~TRANSACTION_MASK) | TRANSACTION_COMMIT, phy)
    if skip:
        body = batch_body_after(body, skip)
        item["bodySize"] = len(body)
    item["_reput"] |= {"properties": suffix, "inner": int(count) - skip}
    return item, body


def discard_item(record: Stored) -> tuple[dict, bytes]:
    """A half checked transactionCheckMax times: kept in TRANS_CHECK_MAX_TIME_TOPIC (4.9's
    resolveDiscardMsg), never delivered."""
    return _copy(record, TRANS_CHECK_MAX_TIME_TOPIC, 0, record.sys_flag & ~TRANSACTION_MASK)


def op_item(kind: str, items: list[str], now_ms: int) -> tuple[dict, bytes]:
    """An op record: what became of the halves `items` names (actors.transaction_core)."""
    body = ",".join(items).encode()
    properties = properties_string({PROPERTY_TAGS: OP_TAG, PROPERTY_TRANSACTION_OP: kind})
    item = {"topic": TRANS_OP_HALF_TOPIC, "queueId": 0, "flag": 0, "bornTimestamp": now_ms, "bornHost": "127.0.0.1:0",
            "reconsumeTimes": 0, "bodySize": len(body), "_reput": {"sysFlag": 0, "properties": properties}}
    return item, body
