"""The requests the schedule service makes of the write path, built from stored records. No I/O.

A delivery (a due delayed or timer message for its real topic and queue) is one message of a
SEND_MESSAGES request marked `_reput`, REPUT_BATCH to a request (`delivery_request`); a
consumer's send-back is a SEND_MESSAGE `_reput` into `%RETRY%<group>` or `%DLQ%<group>`
(`send_back_request`). The front takes them only from the node's private socket.
"""

from __future__ import annotations

from node import protocol
from shm.codec import (
    FIXED_BODY_LEN,
    FIXED_BORN_HOST,
    FIXED_BORN_TS,
    FIXED_RECONSUME,
    PROPERTY_DELAY,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_OUT_MS,
    TIMER_TOPIC,
    Record,
    decode,
    decode_host,
    parse_properties,
    properties_string,
    walk_v4,
)
from shm.javacompat import hashmap_capacity

TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"
MAX_RECONSUME_TIMES = 16
PROPERTY_RETRY_TOPIC, PROPERTY_ORIGIN_MESSAGE_ID = "RETRY_TOPIC", "ORIGIN_MESSAGE_ID"

_born_hosts: dict[bytes, str] = {}  # a record's 8 born-host bytes -> "ip:port" (few hosts, many records)


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
    host = fixed[FIXED_BORN_HOST]
    born = _born_hosts.get(host)
    if born is None:
        born = str(decode_host(host))
        if len(_born_hosts) < 4096:
            _born_hosts[host] = born
    body = raw[body_at: body_at + fixed[FIXED_BODY_LEN]]
    item = {"topic": real_topic, "queueId": int(queue), "flag": fixed[4], "bornTimestamp": fixed[FIXED_BORN_TS],
            "bornHost": born, "reconsumeTimes": fixed[FIXED_RECONSUME], "bodySize": len(body),
            "_reput": {"sysFlag": fixed[7], "properties": text}}
    return item, body


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
    if results is not None:
        return [r.get("status", "SYSTEM_ERROR") for r in results]
    return [header.get("status", "SYSTEM_ERROR")] * count


def timer_due(raw: bytes | None) -> int | None:
    """A stored timer message's TIMER_OUT_MS, None for anything else (a record gone, a value
    the write path would never have stored)."""
    record = decode(raw, check_crc=False) if raw else None
    if not isinstance(record, Record) or record.topic != TIMER_TOPIC:
        return None
    text = record.properties.get(PROPERTY_TIMER_OUT_MS, "")
    return int(text) if text.isdigit() else None


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
