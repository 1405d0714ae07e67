"""Where a send with a delay is stored (docs/protocol.md "Delays"), as the broker moves it: a
delay level (RocketMQ 4) to SCHEDULE_TOPIC_XXXX, a timer (RocketMQ 5) to the timer topic, each
with the names the broker adds. No I/O; the clock is given (a timer's TIMER_DELAY_* counts from
it). Used by the write path's encoder (actors.sendcore), for the general path message by
message and, ahead of the one-pass encoders, for a request's messages at once.
"""

from __future__ import annotations

import time

from shm.codec import (
    PROPERTY_DELAY,
    PROPERTY_INNER_NUM,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    SCHEDULE_TOPIC,
    TIMER_PROPERTIES,
    TIMER_TOPIC,
    TRANS_HALF_TOPIC,
    MessageIllegal,
)

# names that make a send delayed (or a transaction's half), and the names the write path then adds
# (a client's own go the general path)
SCHEDULING = frozenset((PROPERTY_DELAY, *TIMER_PROPERTIES, PROPERTY_TRANSACTION, PROPERTY_TIMER_DEL_UNIQKEY))
ADDED = frozenset((PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, PROPERTY_TIMER_OUT_MS))
SPECIAL = SCHEDULING | ADDED
TIMERS = frozenset(TIMER_PROPERTIES)


class Delays:
    def __init__(self, settings, clock=time.time):
        self.clock = clock  # epoch seconds
        self.delay_levels = len(settings.delay_levels_ms())
        # "1".."N" -> its schedule queue: a level `scheduled` moves without rewriting DELAY
        self._plain_levels = {str(n): n - 1 for n in range(1, self.delay_levels + 1)}
        self.precision_ms = settings.timerPrecisionMs
        self.max_delay_s = settings.timerMaxDelaySec
        self.enabled = settings.timerWheelEnable

    def scheduled(self, properties: dict, topic: str, queue_id: int) -> tuple[str, int]:
        """Where a send with a delay is stored (docs/protocol.md "Delays"), `properties` changed
        as the broker changes them; (topic, queue_id) unchanged for a send without one.

        A delay level n > 0 (RocketMQ 4's): SCHEDULE_TOPIC_XXXX queue n-1, a level above the
        last clamped to it (DELAY rewritten, as setDelayTimeLevel does), REAL_TOPIC and REAL_QID
        added; timer properties beside it are dropped (RocketMQ 5: the level wins). A timer
        (TIMER_DELAY_SEC, TIMER_DELAY_MS or TIMER_DELIVER_MS, first found wins): due in the
        future, it goes to the timer topic with TIMER_OUT_MS (the due time rounded up to
        `timerPrecisionMs`, so never early), REAL_TOPIC and REAL_QID; due now or before, it is
        stored as a plain message. Raises MessageIllegal for a value that is not an integer or a
        timer beyond `timerMaxDelaySec`.

        A transaction's half (TRAN_MSG=true, RocketMQ 4.9's parseHalfMessageInner): queue 0 of
        RMQ_SYS_TRANS_HALF_TOPIC with REAL_TOPIC and REAL_QID, invisible until its commit; a
        delay on it is dropped (RocketMQ's producer clears it: the commit delivers at once).
        It must name its producer group (PGROUP): that is who is asked when it is left open.

        A recall (TIMER_DEL_UNIQKEY, RocketMQ 5.3's): a timer like any, due when the message it
        cancels is; refused when that time is not ahead (the message is due or delivered)."""
        if properties.get(PROPERTY_TRANSACTION) == "true":
            return self._half(properties, topic, queue_id)
        if PROPERTY_TIMER_DEL_UNIQKEY in properties:
            return self._recall(properties, topic, queue_id)
        level_text = properties.get(PROPERTY_DELAY)
        level = 0
        if level_text is not None:
            try:
                level = int(level_text)
            except ValueError:
                raise MessageIllegal("MESSAGE_ILLEGAL", f"DELAY must be an integer level, not {level_text!r}") from None
        if level > 0:
            for name in TIMER_PROPERTIES:
                properties.pop(name, None)
            if level > self.delay_levels:
                level = self.delay_levels
                properties[PROPERTY_DELAY] = str(level)
            properties[PROPERTY_REAL_TOPIC] = topic
            properties[PROPERTY_REAL_QID] = str(queue_id)
            return SCHEDULE_TOPIC, level - 1
        due_ms = self._timer_due(properties)
        if due_ms is None:
            return topic, queue_id
        return self._timer(properties, due_ms, topic, queue_id)

    def _recall(self, properties: dict, topic: str, queue_id: int) -> tuple[str, int]:
        due_ms = self._timer_due(properties)
        if due_ms is None or properties.get(PROPERTY_DELAY, "0") != "0":
            raise MessageIllegal("MESSAGE_ILLEGAL", "recall failed, timestamp invalid: a recall names its message's "
                                                   "delivery time, still ahead (that message is due or delivered)")
        return self._timer(properties, due_ms, topic, queue_id)

    def _timer(self, properties: dict, due_ms: int, topic: str, queue_id: int) -> tuple[str, int]:
        precision = self.precision_ms
        properties[PROPERTY_TIMER_OUT_MS] = str(-(-due_ms // precision) * precision)
        properties[PROPERTY_REAL_TOPIC] = topic
        properties[PROPERTY_REAL_QID] = str(queue_id)
        return TIMER_TOPIC, 0

    def half_batch(self, properties: dict, topic, queue_id) -> tuple[str, int]:
        """A SEND_BATCH_MESSAGE of halves (its header's TRAN_MSG, mqnode's): where its messages
        are stored, `properties` (the batch's, each message's suffix) changed as `scheduled` does."""
        if not isinstance(topic, str) or type(queue_id) is not int:
            raise MessageIllegal("MESSAGE_ILLEGAL", "a batch of halves needs its topic and queueId")
        return self._half(properties, topic, queue_id)

    @staticmethod
    def _half(properties: dict, topic: str, queue_id: int) -> tuple[str, int]:
        group = properties.get(PROPERTY_PRODUCER_GROUP)
        if not group:
            raise MessageIllegal("MESSAGE_ILLEGAL", "a transactional message (TRAN_MSG=true) needs its producer "
                                                   "group in PGROUP")
        for name in SCHEDULING:
            if name != PROPERTY_TRANSACTION:
                properties.pop(name, None)
        properties.pop(PROPERTY_INNER_NUM, None)  # (the write path's own: a one-half batch's message count)
        properties[PROPERTY_REAL_TOPIC] = topic
        properties[PROPERTY_REAL_QID] = str(queue_id)
        return TRANS_HALF_TOPIC, 0

    def _timer_due(self, properties: dict) -> int | None:
        """A timer's due time (epoch ms) if it is one and still ahead, else None."""
        for name in TIMER_PROPERTIES:
            text = properties.get(name)
            if text is not None:
                break
        else:
            return None
        try:
            value = int(text)
        except ValueError:
            raise MessageIllegal("MESSAGE_ILLEGAL", f"{name} must be an integer, not {text!r}") from None
        now_ms = int(self.clock() * 1000)
        due_ms = value if name == PROPERTY_TIMER_DELIVER_MS else now_ms + value * (1000 if name == PROPERTY_TIMER_DELAY_SEC else 1)
        if due_ms <= now_ms:
            return None
        if not self.enabled:
            raise MessageIllegal("MESSAGE_ILLEGAL", "timer messages are off on this node (timerWheelEnable = false)")
        if due_ms - now_ms > self.max_delay_s * 1000:
            raise MessageIllegal("MESSAGE_ILLEGAL", f"{name}={text} is {due_ms - now_ms} ms ahead, beyond "
                                                   f"timerMaxDelaySec ({self.max_delay_s} s)")
        return due_ms

    def scheduled_items(self, messages: list[dict]) -> list[dict] | None:
        """SEND_MESSAGES' messages with each delayed or timer send moved where `scheduled` says
        (copies; the client's dicts stay as sent), for the one-pass encoders; None when one
        needs the general path to name what is wrong (or holds a name the write path adds)."""
        out = []
        for item in messages:
            props = item.get("properties")
            if type(props) is not dict or SPECIAL.isdisjoint(props):
                out.append(item)
                continue
            topic, queue_id = item.get("topic"), item.get("queueId")
            if (not ADDED.isdisjoint(props) or type(topic) is not str or type(queue_id) is not int
                    or not all(type(v) is str for v in props.values())):
                return None
            level = props.get(PROPERTY_DELAY)
            if (level in self._plain_levels and TIMERS.isdisjoint(props) and PROPERTY_TRANSACTION not in props
                    and PROPERTY_TIMER_DEL_UNIQKEY not in props):  # the common delayed send, in short
                props = props.copy()
                props[PROPERTY_REAL_TOPIC], props[PROPERTY_REAL_QID] = topic, str(queue_id)
                topic, queue_id = SCHEDULE_TOPIC, self._plain_levels[level]
            else:
                props = dict(props)
                try:
                    topic, queue_id = self.scheduled(props, topic, queue_id)
                except MessageIllegal:
                    return None
            item = item.copy()
            item["topic"], item["queueId"], item["properties"] = topic, queue_id, props
            out.append(item)
        return out
