"""Dispatch: turn one CommitLog record into its ConsumeQueue entry and IndexFile keys.

Shared by start-up recovery and the reput dispatcher, so both build the derived structures the
same way. Idempotent: dispatching a record twice changes nothing (ConsumeQueue.put and
IndexService.build_index skip what they already hold).
"""

from __future__ import annotations

from shm.codec import (
    PROPERTY_DELAY,
    SCHEDULE_TOPIC,
    TRANSACTION_COMMIT,
    TRANSACTION_MASK,
    TRANSACTION_NOT,
    Record,
    tags_code,
)


def delivery_time(store_timestamp: int, level_text: str, delay_levels_ms: list[int]) -> int | None:
    """The SCHEDULE_TOPIC_XXXX tag slot: store time + the level's delay, the level clamped to the
    highest configured one (as RocketMQ clamps it); None for a level that is not a positive int."""
    try:
        level = min(int(level_text), len(delay_levels_ms))
    except ValueError:
        return None
    return store_timestamp + delay_levels_ms[level - 1] if level > 0 else None


def tags_code_of(record: Record, delay_levels_ms: list[int]) -> int:
    properties = record.properties
    if record.topic == SCHEDULE_TOPIC and PROPERTY_DELAY in properties:
        due = delivery_time(record.store_timestamp, properties[PROPERTY_DELAY], delay_levels_ms)
        if due is not None:
            return due
    return tags_code(record.tags)


def is_queued(record: Record) -> bool:
    """PREPARED and ROLLBACK records never reach a ConsumeQueue."""
    return record.sys_flag & TRANSACTION_MASK in (TRANSACTION_NOT, TRANSACTION_COMMIT)


def dispatch(store, record: Record) -> None:
    """Write `record`'s ConsumeQueue entry and index keys into `store` (a MessageStore)."""
    if is_queued(record):
        queue = store.consume_queue(record.topic, record.queue_id)
        queue.put(record.queue_offset, record.physical_offset, record.total_size,
                  tags_code_of(record, store.delay_levels_ms))
        store.checkpoint.logics_timestamp = record.store_timestamp
    if store.settings.messageIndexEnable:
        store.index.build_index(record.topic, record.physical_offset, record.store_timestamp,
                                record.sys_flag, record.uniq_key, record.keys)


def reput(store, begin: int, end: int | None = None) -> tuple[int, int]:
    """Dispatch every record in [begin, end) of the CommitLog; returns (next offset, records).

    The core of the reput dispatcher and of recovery's catch-up. Stops early at damage (a
    record that does not decode), returning where it stopped so the caller can report it.
    """
    from shm.codec import Corruption

    end = store.commitlog.offset_written if end is None else end
    count = 0
    for item in store.commitlog.iterate(begin, limit=end, read_body=False):
        if isinstance(item, Corruption):
            return item.position, count
        dispatch(store, item)
        count += 1
    return max(begin, end), count
