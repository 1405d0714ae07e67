"""The schedule service's levels on a mock clock: due entries are handed out in order and never
early, a level waits at its first entry not yet due, the clock-skew guard, offsets move to the
first entry not yet stored whatever order the answers come in, failures retry, and the send-back
rules (retry level 3 + reconsumeTimes, the DLQ after maxReconsumeTimes)."""

from __future__ import annotations

import pytest

from actors.reput import send_back_request
from actors.reput import FIRST_ANSWER_TIMEOUT_S, REPUT_TIMEOUT_S, ReputDeadline
from actors.schedule import ScheduleCore
from shm.codec import Record, decode, encode, encode_host

LEVELS = [1000, 5000]  # level 1: 1 s, level 2: 5 s


class Queue:
    """A level's ConsumeQueue: (phy, size, due time) per offset."""

    def __init__(self, due_times: list[int]):
        self.entries = [(1000 + i * 100, 100, due) for i, due in enumerate(due_times)]

    def __call__(self, level: int, offset: int, count: int):
        if level != 1:
            return []
        return [(o, *self.entries[o]) for o in range(offset, min(len(self.entries), offset + count))]


def test_due_entries_go_out_in_order_and_never_early():
    core, queue = ScheduleCore(LEVELS, {}), Queue([10_000, 10_000, 10_500, 11_400])
    assert core.due(0.0, 9_999, queue) == []  # nothing due a millisecond early
    assert [o for _, o, _, _ in core.due(1.0, 10_000, queue)] == [0, 1]
    assert core.due(1.05, 10_050, queue) == []  # the level waits at offset 2
    assert [o for _, o, _, _ in core.due(1.6, 10_600, queue)] == [2]
    assert core.levels[1].offset == 0  # nothing stored yet
    core.stored(1, 1, "PUT_OK", 2.0)
    assert core.levels[1].offset == 0  # offset 0 not yet stored
    core.stored(1, 0, "PUT_OK", 2.0)
    core.stored(1, 2, "PUT_OK", 2.0)
    assert core.levels[1].offset == 3 and core.offsets() == {1: 3}


def test_a_failed_reput_is_read_again_and_a_permanent_refusal_is_skipped():
    core, queue = ScheduleCore(LEVELS, {}), Queue([0, 0, 0])
    core.due(0.0, 5, queue)
    core.stored(1, 0, "PUT_OK", 0.0)
    core.stored(1, 1, "SERVICE_NOT_AVAILABLE", 0.0)  # the disk is full: try again
    assert core.levels[1].offset == 1 and core.due(0.05, 5, queue) == []  # after RETRY_S
    assert [o for _, o, _, _ in core.due(0.2, 5, queue)] == [1, 2]
    core.stored(1, 1, "TOPIC_NOT_EXIST", 0.2)  # never storable: dropped, counted
    core.stored(1, 2, "PUT_OK", 0.2)
    assert core.levels[1].offset == 3 and core.levels[1].dropped == 1 and core.levels[1].delivered == 2


def test_the_clock_skew_guard_delivers_what_is_due_further_ahead_than_its_level():
    core = ScheduleCore(LEVELS, {})
    far = Queue([10_000 + 3_600_000])  # due an hour ahead on a 1 s level: the clock stepped back
    assert [o for _, o, _, _ in core.due(0.0, 10_000, far)] == [0]


def test_offsets_resume_and_are_clamped_into_the_queue():
    core = ScheduleCore(LEVELS, {1: 7, 2: 99})
    core.clamp({1: (0, 10), 2: (0, 4)})
    assert core.offsets() == {1: 7, 2: 4}


def _record(reconsume: int) -> Record:
    raw = encode(topic="Orders", body=b"b", queue_id=2, born_timestamp=5, born_host=encode_host("10.0.0.1", 1),
                 store_host=encode_host("10.0.0.2", 10911), properties="UNIQ_KEY\x01U1\x02TAGS\x01t",
                 reconsume_times=reconsume, physical_offset=4096)
    return decode(raw)


def test_send_back_retries_at_level_three_plus_reconsume_times_then_dead_letters():
    first, _ = send_back_request(_record(0), {"consumerGroup": "g", "delayLevel": 0}, 1, 18)
    assert (first["topic"], first["reconsumeTimes"], first["_reput"]["delay"]) == ("%RETRY%g", 1, 3)
    props = dict(p.split("\x01") for p in first["_reput"]["properties"].split("\x02"))
    assert props["RETRY_TOPIC"] == "Orders" and props["ORIGIN_MESSAGE_ID"] == "U1" and props["DELAY"] == "3"
    later, _ = send_back_request(_record(5), {"consumerGroup": "g", "delayLevel": 0}, 1, 18)
    assert later["_reput"]["delay"] == 8
    dead, _ = send_back_request(_record(16), {"consumerGroup": "g", "delayLevel": 0}, 1, 18)
    assert (dead["topic"], dead["_reput"]["delay"]) == ("%DLQ%g", 0)
    asked, _ = send_back_request(_record(0), {"consumerGroup": "g", "delayLevel": -1}, 1, 18)
    assert asked["topic"] == "%DLQ%g"


def test_send_backs_and_deliveries_wait_for_the_disk_under_sync_flush(tmp_path):
    """The write path stores a re-put as given, and answers it once stored as the mode promises:
    a send-back (the consumer is told it is stored) and a delivery request (the schedule service
    counts, and persists, a delivery done on its answer) wait for the flush under SYNC_FLUSH."""
    from helpers import small_settings

    from actors.reput import delivery_request, reput_item
    from actors.sendcore import PendingSend, SendEncoder
    from shm.encoded_batch import EncodedBatch

    encoder = SendEncoder(small_settings(tmp_path, flushDiskType="SYNC_FLUSH"))
    record = _record(0)
    back, body = send_back_request(record, {"consumerGroup": "g"}, 1, 18)
    delivered = decode(encode(topic="SCHEDULE_TOPIC_XXXX", body=b"x", queue_id=0, born_timestamp=5,
                              born_host=encode_host("10.0.0.1", 1),
                              store_host=encode_host("127.0.0.1", 10911),
                              properties="REAL_TOPIC\x01Orders\x02REAL_QID\x012\x02DELAY\x011"))
    delivery, delivery_body = delivery_request([reput_item(delivered)], 2)
    for header, payload, topic in ((back, body, "SCHEDULE_TOPIC_XXXX"), (delivery, delivery_body, "Orders")):
        pending, batch = PendingSend(b"c", header["opaque"], header["code"], 0), EncodedBatch()
        encoder.add_request(pending, header, payload, encoder.born_host("10.0.0.1:1"), batch)
        assert (pending.wait, pending.topics, len(batch)) == (True, [topic], 1)


@pytest.mark.parametrize("topic, extra", [("SCHEDULE_TOPIC_XXXX", {"DELAY": "2"}),
                                          ("rmq_sys_wheel_timer", {"TIMER_OUT_MS": "1795000001000"})])
@pytest.mark.parametrize("born", [("10.1.2.3", 4567), ("::1", 9)])
def test_a_delivery_read_from_the_raw_record_is_the_one_read_through_decode(topic, extra, born):
    """The schedule service reads a due record without decoding it whole; what it re-puts is
    what `reput_item` makes of the decoded record (an IPv6 record is left to that path)."""
    from actors.reput import reput_item, reput_item_raw
    from shm.codec import properties_string

    props = {"TAGS": "t", "UNIQ_KEY": "U1", **extra, "REAL_TOPIC": "Real", "REAL_QID": "3", "CLUSTER": "c"}
    raw = encode(topic=topic, body=b"payload", queue_id=1, flag=5, sys_flag=0, born_timestamp=1795000000000,
                 born_host=encode_host(*born), store_host=encode_host("127.0.0.1", 10911),
                 properties=properties_string(props), reconsume_times=2)
    fast = reput_item_raw(raw)
    if ":" in born[0]:
        assert fast is False
        return
    assert fast == reput_item(decode(raw, check_crc=False))
    item, body = fast
    assert (item["topic"], item["queueId"], item["bornHost"], body) == ("Real", 3, "10.1.2.3:4567", b"payload")
    assert ("REAL_TOPIC" in item["_reput"]["properties"]) == (topic == "SCHEDULE_TOPIC_XXXX")


def test_a_reput_expires_only_once_the_front_answers_at_all():
    deadline = ReputDeadline()
    # a front not serving yet (a node starting on a loaded machine): the re-put waits, not goes twice
    assert not deadline.expired(100.0, 100.0 + REPUT_TIMEOUT_S + 1)
    assert deadline.expired(100.0, 100.0 + FIRST_ANSWER_TIMEOUT_S + 0.1)
    # the front's first answer came after the send: the timeout runs from that answer
    deadline.answered(112.0)
    deadline.answered(140.0)  # (not the first: later answers do not move it)
    assert not deadline.expired(100.0, 112.0 + REPUT_TIMEOUT_S)
    assert deadline.expired(100.0, 112.0 + REPUT_TIMEOUT_S + 0.1)
    # sent after the front answered: REPUT_TIMEOUT_S from its send (an answer lost to a restart)
    assert not deadline.expired(150.0, 150.0 + REPUT_TIMEOUT_S)
    assert deadline.expired(150.0, 150.0 + REPUT_TIMEOUT_S + 0.1)
