"""A message's properties as RocketMQ stores them (name\x01value pairs joined by \x02), the names
the broker gives meaning to, keys, tags codes and the index's key hash. Pure functions."""

from __future__ import annotations

from shm.javacompat import hashmap_order, jhash, jhash_cached


NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_CLUSTER = "CLUSTER"

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# RocketMQ 5's timer (arbitrary delays): what the client sets, and what the broker adds
TIMER_TOPIC = "rmq_sys_wheel_timer"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"  # a recall: the UNIQ_KEY of the timer message it cancels
TIMER_PROPERTIES = (PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS)  # first found wins
# transactional messages (RocketMQ 4.9's TransactionalMessageUtil): a send with TRAN_MSG=true is a
# half, stored in TRANS_HALF_TOPIC queue 0 with REAL_TOPIC/REAL_QID; outcomes go to the op topic
PROPERTY_TRANSACTION = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_INNER_NUM = "INNER_NUM"  # RocketMQ 5's: the messages a record's batch body holds (a one-half batch)
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"


def split_keys(keys: str) -> list[str]:
    """KEYS are separated by single spaces; empty pieces are skipped (as buildIndex does)."""
    return [k for k in keys.split(" ") if k]


def parse_properties(text: str) -> dict[str, str]:
    """Java MessageDecoder.string2messageProperties: keep `k\\x01v` pairs with both non-empty."""
    result: dict[str, str] = {}
    if not text:
        return result
    for pair in text.split(PROPERTY_SEPARATOR):
        name, separator, value = pair.partition(NAME_VALUE_SEPARATOR)
        if separator and name and value:
            result[name] = value
    return result


def properties_string(properties: dict[str, str | None], capacity: int | None = None) -> str:
    """Serialise like Java messageProperties2String over a HashMap filled in dict order.

    Pairs come out in Java HashMap iteration order, so the bytes match what RocketMQ writes for
    the same map; `None` values are skipped; no trailing separator.
    """
    names = hashmap_order([k for k, v in properties.items() if v is not None], capacity)
    return PROPERTY_SEPARATOR.join([f"{k}{NAME_VALUE_SEPARATOR}{properties[k]}" for k in names])


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tag slot for a normal topic: jhash(TAGS) sign-extended, 0 for no tag."""
    return jhash_cached(tags) if tags else 0


def index_key_hash(key: str) -> int:
    """IndexFile keyHash: abs(jhash(key)), where Java's abs(MIN_VALUE) case maps to 0."""
    h = jhash(key)
    return 0 if h == -2147483648 else abs(h)
