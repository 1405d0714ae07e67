"""A half as the transaction service (actors.transaction) keeps it, read from its record's bytes:
its fixed fields and properties, never a whole decoded record (every half is read once, as it is
stored); and why an END names no half of its group (RocketMQ 4.9's remarks)."""

from __future__ import annotations

from actors.reput import Stored, half_target, stored_of
from actors.transaction_core import NO_HALF, WRONG_GROUP, Half
from shm.codec import (
    FIXED_STORE_TS,
    PROPERTY_CHECK_IMMUNITY,
    PROPERTY_INNER_NUM,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    TRANS_HALF_TOPIC,
    parse_properties,
    walk_v4,
)

_HALF_TOPIC = TRANS_HALF_TOPIC.encode()


def half_of(offset: int, phy: int, size: int, raw: bytes | None) -> Half | None:
    """The `Half` at queue offset `offset` from its record's bytes (None: gone, or not a half a
    commit could deliver), reading only what the service keeps of it: its fixed fields and
    properties, not a whole decoded record (every half is read once, as it is stored)."""
    walked = walk_v4(raw, 0, len(raw)) if raw else None
    if walked is None:  # (an IPv6 host, or no record: the general reading)
        record = stored_of(raw)
        if record is None or record.topic != TRANS_HALF_TOPIC:
            return None
        return _half(offset, phy, size, record.store_timestamp, record.properties)
    fixed, _, topic_at, props_at = walked
    if raw[topic_at: props_at - 2] != _HALF_TOPIC:
        return None
    return _half(offset, phy, size, fixed[FIXED_STORE_TS], parse_properties(raw[props_at:].decode()))


def _half(offset: int, phy: int, size: int, stored_ms: int, props: dict[str, str]) -> Half | None:
    """A half's `Half` from its properties (None without a real topic and queue to commit to)."""
    topic, queue, immunity = props.get(PROPERTY_REAL_TOPIC), props.get(PROPERTY_REAL_QID), props.get(
        PROPERTY_CHECK_IMMUNITY, "")
    if not topic or queue is None or not queue.isdigit():
        return None
    return Half(offset, phy, size, stored_ms, props.get(PROPERTY_PRODUCER_GROUP, ""),
                int(immunity) * 1000 if immunity.isdigit() else 0, topic, int(queue), inner=inner_count(props))


def inner_count(props: dict[str, str]) -> int:
    """A one-half batch's message count (INNER_NUM, which only the write path sets); 0: one message."""
    inner = props.get(PROPERTY_INNER_NUM, "")
    return int(inner) if inner.isdigit() else 0


def not_the_half(stored: Stored | None, end: dict, group: str) -> str | None:
    """Why the end names no half of `group` (4.9's remarks), or None."""
    if stored is None or half_target(stored) is None or stored.queue_offset != end["tranStateTableOffset"]:
        return (f"{NO_HALF}: no half message at commitLogOffset "
                f"{end['commitLogOffset']} with tranStateTableOffset {end['tranStateTableOffset']}")
    if stored.properties.get(PROPERTY_PRODUCER_GROUP) != group:
        return f"{WRONG_GROUP}: the half belongs to {stored.properties.get(PROPERTY_PRODUCER_GROUP)}"
    return None
