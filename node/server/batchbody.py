"""A client's SEND_BATCH_MESSAGE body (`protocol.encode_batch_body`) as CommitLog records, in one
pass, and the UNIQ_KEY of a properties string without parsing all of it. No I/O.

The one-pass path of `node.server.sendcore` for client batches: the 4.9 broker stores each inner
message's own properties bytes, then the batch's (header properties plus CLUSTER) after a 0x02,
so nothing is re-ordered and no per-message dict or record object is built.
"""

from __future__ import annotations

from node import protocol
from shm.codec import (
    FIXED_V4,
    MAX_PROPERTIES_BYTES,
    MAX_RECORD_OVERHEAD,
    MAX_TOPIC_BYTES,
    MESSAGE_MAGIC,
    PROPERTY_UNIQ_KEY,
    body_crc,
    parse_properties,
)


def encode_batch_v4(data: bytes, topic_raw: bytes, queue_id: int, born_timestamp: int, born_host: bytes,
                    store_host: bytes, suffix: bytes, max_message_size: int,
                    limit: int = protocol.MAX_MESSAGES_PER_REQUEST) -> tuple[bytearray, list[int], list[str | None]] | None:
    """A client batch body (`protocol.encode_batch_body`) -> its CommitLog records back to back,
    their sizes and each message's UNIQ_KEY; the same bytes `encode_v4` gives one
    message at a time, without a tuple, str or record object per message. None for anything
    unusual (a malformed body, non-ASCII properties, a limit exceeded): the caller then takes
    the general path, which refuses with the exact reason."""
    if not 0 < len(topic_raw) <= MAX_TOPIC_BYTES or not -(2**31) <= queue_id < 2**31:
        return None
    view, end, at = memoryview(data), len(data), 0
    topic_part = bytes((len(topic_raw),)) + topic_raw
    record_base = 91 + len(topic_raw)
    largest = max_message_size + MAX_RECORD_OVERHEAD
    parts, sizes, uniq_keys = [], [], []
    head, i16, fixed = protocol.BATCH_MESSAGE_HEAD.unpack_from, protocol.BATCH_PROPS_LENGTH, FIXED_V4.pack
    head_size = protocol.BATCH_MESSAGE_HEAD.size
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
        if not own.isascii() or b"DELAY\x01" in own:  # (a batch with DELAY: the general path refuses it)
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
