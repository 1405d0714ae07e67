"""The write core without a socket or a sleep: sends in, replies and flush waits out, the
store time from its wall clock, write-buffer commits by its monotonic clock (an hour of commits
in a few milliseconds of test time)."""

from __future__ import annotations

import time

import orjson
import pytest
from helpers import small_settings

from actors.wire import send_meta
from actors.writer import WriteCore
from node import protocol
from shm.codec import Record, decode
from shm.control_block import ROLE_CODES, ControlBlock
from shm.store import MessageStore


class Clocks:
    def __init__(self) -> None:
        self.monotonic, self.wall = 500.0, 1_700_000_000_000

    def __call__(self) -> float:
        return self.monotonic


def _core(tmp_path, **overrides):
    settings = small_settings(tmp_path / "store", runDir=str(tmp_path / "run"), ingressWorkers=0, **overrides)
    MessageStore(settings).close()
    control = ControlBlock(settings.root / "control", create=True)
    control.publish_recovered(written=0, flushed=0, dispatched=0, min_offset=0)
    clocks = Clocks()
    core = WriteCore(settings, control, clock=clocks, wall_ms=lambda: clocks.wall)
    return core, control, clocks, settings


def _send(i: int, **properties) -> list:
    header = {"code": protocol.SEND_MESSAGE, "opaque": i, "topic": "Core", "queueId": 0,
              "properties": {"UNIQ_KEY": f"K{i}", **properties}}
    # arrival: now (the batcher refuses a send older than waitTimeMillsInSendQueue as SYSTEM_BUSY)
    return [b"client", send_meta(time.monotonic_ns()), header, f"body-{i}".encode()]


@pytest.fixture
def async_core(tmp_path):
    core, control, clocks, settings = _core(tmp_path)
    yield core, control, clocks, settings
    core.close()
    control.close()


def test_an_append_is_published_then_answered_with_the_wall_clock_as_store_time(async_core):
    core, control, clocks, settings = async_core
    replies = core.append_requests([_send(1), _send(2)])
    assert [orjson.loads(header)["status"] for _, _, header in replies] == ["PUT_OK", "PUT_OK"]
    assert [orjson.loads(header)["queueOffset"] for _, _, header in replies] == [0, 1]
    assert control.get("written") > 0 and core.take_waits() == []
    record = decode(core.log.segments.files[0].map, limit=control.get("written"))
    assert isinstance(record, Record) and record.store_timestamp == clocks.wall and record.uniq_key == "K1"


def test_the_dispatcher_is_woken_once_per_move_unless_it_promised_to_look(async_core):
    core, control, _, _ = async_core
    assert core.take_wake(0) is False  # nothing written yet
    core.append_requests([_send(1)])
    assert core.take_wake(0) is True and core.take_wake(0) is False  # once per move
    control.set("reput_polling_until", 10**12)
    core.append_requests([_send(2)])
    assert core.take_wake(0) is False and core.wakes_skipped == 1  # it polls anyway
    core.wake_now = True  # a reader waits for it: woken whatever it promised
    assert core.take_wake(0) is True


def test_sync_flush_sends_wait_for_the_disk(tmp_path):
    core, control, _, _ = _core(tmp_path, flushDiskType="SYNC_FLUSH")
    try:
        assert core.append_requests([_send(1), _send(2, WAIT="false")]) != []  # WAIT=false: answered at once
        (client, arrival, flush_to, header, replicate_to), = core.take_waits()
        assert client == b"client" and arrival > 0 and flush_to <= control.get("written") and replicate_to == 0
        assert orjson.loads(header)["status"] == "PUT_OK"
    finally:
        core.close()
        control.close()


def test_sync_master_sends_wait_for_a_slave_that_follows_closely_enough(tmp_path):
    core, control, _, _ = _core(tmp_path, haSlaveFallbehindMax=200)
    control.set("role", ROLE_CODES["SYNC_MASTER"])
    try:
        (_, _, header), = core.append_requests([_send(1)])  # no slave follows: at once, stored anyway
        assert orjson.loads(header)["status"] == "SLAVE_NOT_AVAILABLE" and core.take_waits() == []
        control.set("ha_slaves", 1)
        control.set("slave_acked", control.get("written"))
        assert core.append_requests([_send(2)]) == []
        (_, _, flush_to, header, replicate_to), = core.take_waits()
        assert flush_to == 0 and replicate_to == control.get("written")  # ASYNC_FLUSH: only the slave
        assert orjson.loads(header)["status"] == "PUT_OK"  # until the wait is settled
        control.set("slave_acked", 0)  # the slave is ~270 bytes behind: more than haSlaveFallbehindMax
        assert control.get("written") > 200
        (_, _, header), = core.append_requests([_send(3)])
        assert orjson.loads(header)["status"] == "SLAVE_NOT_AVAILABLE"
        assert core.statistics()["slaveNotAvailable"] == 2
    finally:
        core.close()
        control.close()


def test_write_buffer_commits_by_the_clock(tmp_path):
    """transientStorePoolEnable: appended bytes become readable at each commit, which the
    core's clock times; an hour of intervals runs without a sleep."""
    core, control, clocks, settings = _core(tmp_path, transientStorePoolEnable=True, commitIntervalCommitLog=200,
                                            commitCommitLogLeastPages=4, commitCommitLogThoroughInterval=200_000)
    try:
        core.next_commit, core.next_thorough_commit = clocks.monotonic + 0.2, clocks.monotonic + 200  # as after a commit
        core.append_requests([_send(1)])
        assert control.get("written") == 0 and core.end > 0  # acknowledged, not yet readable
        clocks.monotonic += 0.1
        core.idle()
        assert control.get("written") == 0  # the interval has not passed
        clocks.monotonic += 0.2
        core.idle()
        assert control.get("written") == 0  # passed, but less than 4 pages wait and not thorough
        clocks.monotonic += 200
        core.idle()
        assert control.get("written") == core.end and core.commits == 1  # the thorough commit
        assert core.take_wake(0)  # readable now: the dispatcher is told
        for _ in range(18_000):  # an hour at 200 ms: nothing waits, nothing commits
            clocks.monotonic += 0.2
            core.idle()
        assert core.commits == 1
        core.append_requests([_send(2)])
        core.drain()  # stop: whatever waits becomes readable
        assert control.get("written") == core.end and core.commits == 2
    finally:
        core.close()
        control.close()
