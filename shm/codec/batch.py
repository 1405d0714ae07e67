"""The send path's one-pass encoders: many messages -> their records back to back, no record
object in between (a client's SEND_BATCH_MESSAGE body, a coalesced SEND_MESSAGES), with their C
accelerators (shm/_encode.c) behind the functions the callers use."""

from __future__ import annotations

import os
import struct
from functools import lru_cache


from shm.invariant import invariant
from shm.javacompat import hashmap_capacity, hashmap_order

try:  # ISA-L computes the same CRC-32 as zlib, ~4x faster per 1 KiB body on this machine
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives identical values
    from zlib import crc32
try:
    from shm import _encode
except ImportError:  # pragma: no cover - built wherever gcc and the Python headers are
    _encode = None


# ----------------------------------------------------------------------------------------------
# The C accelerators (shm/_encode.c), behind the functions the callers use. Built at install
# wherever gcc and the Python headers are; MQNODE_NATIVE=0 chooses the Python twins anywhere.
# tests/unit/test_native_encode.py holds the two to identical bytes for any input, with
# hypothesis. (The dispatcher's scan has its own C twin, shm/_dispatch.c, fused with the
# ConsumeQueue and index work; it stops in front of every record it does not take, and the
# Python scan over `dispatch_fields` takes it.)


from shm.codec.properties import PROPERTY_CLUSTER, PROPERTY_DELAY, PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, PROPERTY_TIMER_OUT_MS, PROPERTY_UNIQ_KEY, PROPERTY_WAIT, parse_properties
from shm.codec.record import MAX_PROPERTIES_BYTES, MAX_RECORD_OVERHEAD, MAX_TOPIC_BYTES, MESSAGE_MAGIC, _FIXED_V4, _I16, _I32, body_crc
from shm.codec.view import offset_ids_py


# ----------------------------------------------------------------------------------------------
# The send path's one-pass encoders: many messages -> their records back to back, no record
# object or dict a message. Each writes exactly what `encode_v4` writes message by message; each
# returns None for anything unusual, and the caller's general path then refuses with the reason.

# A client's SEND_BATCH_MESSAGE body (RocketMQ's MessageDecoder.encodeMessages): per message
# TOTALSIZE, MAGIC (0), BODYCRC (0), FLAG, BODYLENGTH, BODY, PROPERTIESLENGTH (i16), PROPERTIES.
BATCH_MESSAGE_HEAD = struct.Struct(">iiiii")
BATCH_PROPS_LENGTH = _I16
MAX_MESSAGES_PER_BATCH = 4096


@lru_cache(maxsize=1024)
def topic_bytes(topic: str) -> bytes:
    return topic.encode("utf-8")


@lru_cache(maxsize=1024)
def _topic_part(topic_raw: bytes) -> bytes:
    """TOPICLENGTH (one byte) and the topic, as a V1 record holds them."""
    return bytes((len(topic_raw),)) + topic_raw


def _stored_names(names: tuple[str, ...], cluster: str) -> list[str] | None:
    """The names a coalesced send's properties are stored under, in Java HashMap order: WAIT
    dropped, CLUSTER added (its value is this node's), as the 4.9 broker stores them (§2.7).
    A delayed or timer send arrives with the names the write path added last (`SCHEDULED_TAILS`:
    REAL_TOPIC, REAL_QID, and TIMER_OUT_MS before them), put after CLUSTER as the broker puts
    them. None for names the one-pass encoders leave to the general path (empty, holding a
    separator)."""
    if any(not name or "\x01" in name or "\x02" in name for name in names):
        return None
    tail: tuple[str, ...] = ()
    if PROPERTY_DELAY in names or PROPERTY_TIMER_OUT_MS in names:
        for candidate in SCHEDULED_TAILS:
            if names[-len(candidate):] == candidate:
                names, tail = names[:-len(candidate)], candidate
                break
    stored = [name for name in names if name != PROPERTY_WAIT]
    if PROPERTY_CLUSTER not in stored:
        stored.append(PROPERTY_CLUSTER)
    # a map grows with each put and never shrinks: its most keys at once decide the buckets
    count = max(len(names) + (PROPERTY_CLUSTER not in names), len(stored) + len(tail))
    return hashmap_order(stored + list(tail), 16 if count <= 12 else hashmap_capacity(count))


SCHEDULED_TAILS = ((PROPERTY_TIMER_OUT_MS, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID), (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID))


@lru_cache(maxsize=1024)
def _properties_plan(names: tuple[str, ...], cluster: str) -> tuple[str, tuple[str, ...]] | None:
    """How the Python encoder stores a coalesced send's properties, worked out once per set of
    names (in the message's order): a `str.format` template of the stored text and the names
    whose values fill it, in order. The per-message work is then one format call (~0.7 us a
    message less than ordering and joining each message's pairs)."""
    order = _stored_names(names, cluster)
    if order is None:
        return None
    pieces, filled_by = [], []
    for name in order:
        if name == PROPERTY_CLUSTER:
            pieces.append(_literal(f"{name}\x01{cluster}"))
        else:
            pieces.append(_literal(f"{name}\x01") + "{}")
            filled_by.append(name)
    return "\x02".join(pieces), tuple(filled_by)


@lru_cache(maxsize=1024)
def properties_layout(names: tuple[str, ...], cluster: str) -> tuple | None:
    """`_properties_plan` for the C encoder: the stored text as UTF-8 literals and the names
    whose values go between them, alternating, a literal first and last."""
    order = _stored_names(names, cluster)
    if order is None:
        return None
    layout, literal = [], ""
    for i, name in enumerate(order):
        literal += ("\x02" if i else "") + f"{name}\x01"
        if name == PROPERTY_CLUSTER:
            literal += cluster
        else:
            layout += (literal.encode(), name)
            literal = ""
    layout.append(literal.encode())
    return tuple(layout)


def _literal(text: str) -> str:
    """`text` as literal text of a format template."""
    return text.replace("{", "{{").replace("}", "}}")


def encode_messages_v4_py(messages: list[dict], body: bytes, born: bytes, store_host: bytes, max_body: int,
                          cluster: str) -> tuple | None:
    """A SEND_MESSAGES request's messages (coalesced single sends) as records, for the common
    case: IPv4 hosts, nothing refused by the front, properties an object of non-empty
    strings without separators, every limit kept. Returns (records, sizes, queue keys, topics,
    queue ids, uniq keys, whether any send waits for the flush), or None for the general path.

    The messages' `bodySize`s are checked by the caller to add up to `body`."""
    if len(born) != 8 or len(store_host) != 8:
        return None
    view, at = memoryview(body), 0
    fixed, i16 = _FIXED_V4.pack, _I16.pack
    parts, sizes, queue_keys, topics, queue_ids, uniq_keys = [], [], [], [], [], []
    waits = False  # the request waits for the flush if any of its sends does
    try:
        for item in messages:
            topic, queue_id, size = item["topic"], item["queueId"], item["bodySize"]
            props = item.get("properties")
            props = {} if props is None else props
            flag, reconsume, born_ts = item.get("flag", 0), item.get("reconsumeTimes", 0), item.get("bornTimestamp", 0)
            if (type(props) is not dict or type(queue_id) is not int or type(flag) is not int or type(size) is not int
                    or type(reconsume) is not int or type(born_ts) is not int or "_refused" in item
                    or size > max_body):
                return None
            plan = _properties_plan(tuple(props), cluster)
            if plan is None or "\x02" in "".join(props.values()) or "" in props.values():  # TypeError: not a str
                return None
            topic_raw = topic_bytes(topic)  # TypeError: not a str (unhashable) ...
            if type(topic) is not str or not 0 < len(topic_raw) <= MAX_TOPIC_BYTES:
                return None
            if not waits and props.get(PROPERTY_WAIT) != "false":
                waits = True
            template, filled_by = plan
            props_raw = template.format(*[props[name] for name in filled_by]).encode()
            if len(props_raw) > MAX_PROPERTIES_BYTES:  # (so the record stays within maxMessageSize + 64 KiB)
                return None
            record_size = 91 + size + len(topic_raw) + len(props_raw)
            piece = view[at: at + size]
            parts += (fixed(record_size, MESSAGE_MAGIC, body_crc(piece), queue_id, flag, 0, 0, 0, born_ts, born,
                            0, store_host, reconsume, 0, size),
                      piece, _topic_part(topic_raw), i16(len(props_raw)), props_raw)
            at += size
            sizes.append(record_size)
            queue_keys.append(f"{topic}-{queue_id}")
            topics.append(topic)
            queue_ids.append(queue_id)
            uniq_keys.append(props.get(PROPERTY_UNIQ_KEY))
    except (KeyError, TypeError, AttributeError, struct.error, UnicodeEncodeError):  # struct.error: an int beyond its field
        return None
    return bytearray().join(parts), sizes, queue_keys, topics, queue_ids, uniq_keys, waits


def encode_batch_v4_py(data: bytes, topic_raw: bytes, queue_id: int, born_timestamp: int, born_host: bytes,
                       store_host: bytes, suffix: bytes, max_message_size: int,
                       limit: int = MAX_MESSAGES_PER_BATCH) -> tuple[bytearray, list[int], list[str | None]] | None:
    """A client batch body (`BATCH_MESSAGE_HEAD` per message) -> its records back to back, their
    sizes and each message's UNIQ_KEY. The 4.9 broker stores each inner message's own
    properties bytes, then the batch's (`suffix`: header properties plus CLUSTER) after a 0x02.
    None for anything unusual (a malformed body, non-ASCII properties, a limit exceeded)."""
    if not 0 < len(topic_raw) <= MAX_TOPIC_BYTES or not -(2**31) <= queue_id < 2**31:
        return None
    view, end, at = memoryview(data), len(data), 0
    topic_part = bytes((len(topic_raw),)) + topic_raw
    record_base = 91 + len(topic_raw)
    largest = max_message_size + MAX_RECORD_OVERHEAD
    parts, sizes, uniq_keys = [], [], []
    head, i16, fixed = BATCH_MESSAGE_HEAD.unpack_from, BATCH_PROPS_LENGTH, _FIXED_V4.pack
    head_size = BATCH_MESSAGE_HEAD.size
    while at < end:
        if len(sizes) >= limit or end - at < head_size + 2:
            return None
        size, magic, _, flag, body_len = head(data, at)
        props_at = at + head_size + body_len
        if body_len < 0 or props_at + 2 > end or body_len > max_message_size or magic != 0:
            return None
        props_len, = i16.unpack_from(data, props_at)
        if props_len < 0 or size != head_size + body_len + 2 + props_len or at + size > end:
            return None
        own = data[props_at + 2: props_at + 2 + props_len]
        if not own.isascii() or b"DELAY\x01" in own or b"TIMER_" in own:  # (the general path refuses a delay)
            return None
        props = own if not suffix else own + suffix if not own or own.endswith(b"\x02") else own + b"\x02" + suffix
        record_size = record_base + body_len + len(props)
        if len(props) > MAX_PROPERTIES_BYTES or record_size > largest:
            return None
        body = view[at + head_size: props_at]
        parts += (fixed(record_size, MESSAGE_MAGIC, body_crc(body), queue_id, flag, 0,
                        0, 0, born_timestamp, born_host, 0, store_host, 0, 0, body_len),
                  body, topic_part, i16.pack(len(props)), props)
        sizes.append(record_size)
        uniq_keys.append(find_uniq_key_ascii(own))
        at += size
    if not sizes:
        return None
    return bytearray().join(parts), sizes, uniq_keys


def find_uniq_key(properties: str) -> str | None:
    """UNIQ_KEY of a properties string without parsing all of it (the last one wins, as in Java)."""
    at = properties.rfind(PROPERTY_UNIQ_KEY + "\x01")
    if at < 0:
        return None
    if at > 0 and properties[at - 1] != "\x02":  # inside another pair: parse properly
        return parse_properties(properties).get(PROPERTY_UNIQ_KEY)
    end = properties.find("\x02", at)
    value = properties[at + len(PROPERTY_UNIQ_KEY) + 1: end if end >= 0 else None]
    return value or parse_properties(properties).get(PROPERTY_UNIQ_KEY)  # Java skips empty values


def find_uniq_key_ascii(properties: bytes) -> str | None:
    """`find_uniq_key` of ASCII properties bytes, without decoding them when UNIQ_KEY leads the
    string or follows a separator (what clients send)."""
    at = properties.rfind(b"UNIQ_KEY\x01")
    if at < 0:
        return None
    if at == 0 or properties[at - 1] == 2:
        end = properties.find(b"\x02", at)
        value = properties[at + 9: end if end >= 0 else None]
        if value:
            return value.decode("ascii")
    return find_uniq_key(properties.decode("ascii"))  # Java skips an empty value: the full rules

NATIVE = _encode is not None and os.environ.get("MQNODE_NATIVE", "1") != "0"


def encode_messages_v4_c(messages: list, body: bytes, born: bytes, store_host: bytes, max_body: int,
                         cluster: str) -> tuple | None:
    return _encode.encode_messages_v4(messages, body, born, store_host, max_body, cluster, properties_layout, crc32)


def encode_batch_v4_c(data: bytes, topic_raw: bytes, queue_id: int, born_timestamp: int, born_host: bytes,
                      store_host: bytes, suffix: bytes, max_message_size: int,
                      limit: int = MAX_MESSAGES_PER_BATCH) -> tuple | None:
    return _encode.encode_batch_v4(data, topic_raw, queue_id, born_timestamp, born_host, store_host, suffix,
                                   max_message_size, limit, crc32, find_uniq_key_ascii)


def offset_ids_c(store_host: bytes, physical: list[int], indices: list[int]) -> list[str]:
    """`offset_ids_py` for an 8-byte (IPv4) store host; ValueError for an index out of range."""
    return _encode.offset_ids(store_host, physical, indices)


def offset_ids(store_host: bytes, physical: list[int], indices: list[int]) -> list[str]:
    if NATIVE and len(store_host) == 8:
        return _encode.offset_ids(store_host, physical, indices)
    return offset_ids_py(store_host, physical, indices)


encode_messages_v4 = encode_messages_v4_c if NATIVE else encode_messages_v4_py
encode_batch_v4 = encode_batch_v4_c if NATIVE else encode_batch_v4_py


def batch_body_after(body: bytes, count: int) -> bytes:
    """A batch body (`BATCH_MESSAGE_HEAD` per message, as a client sends it and a one-half batch
    keeps it) less its first `count` messages. The body was checked whole when it was stored."""
    at = 0
    for _ in range(count):
        size, = _I32.unpack_from(body, at)
        invariant(size >= BATCH_MESSAGE_HEAD.size + 2 and at + size <= len(body),
                  "a stored batch body's messages must add up to it", at, size, len(body))
        at += size
    return body[at:]
