"""The flush parts without Ray: the held SYNC_FLUSH sends (`Waiting`) and the front's flush
thread (`FlushThread`) over a real CommitLog and control block."""

from __future__ import annotations

import dataclasses
import time

import orjson
import pytest
import zmq
from helpers import message, open_store, put, small_settings

from actors import flush
from actors.flush import CommitLogFlusher, FlushFailed, FlushThread, Waiting
from shm.checkpoint import Checkpoint
from shm.control_block import ControlBlock


def _put_ok(opaque: int) -> bytes:
    return orjson.dumps({"code": 0, "status": "PUT_OK", "opaque": opaque})


def test_held_sends_are_answered_in_order_once_flushed_covers_them():
    waiting = Waiting(timeout_ms=5000)
    now = time.monotonic_ns()
    waiting.add([(b"c%d" % i, now, 100 * (i + 1), _put_ok(i), 0) for i in range(5)])
    assert waiting.settle(flushed=99) == []
    assert [client for client, _, _ in waiting.settle(flushed=300)] == [b"c0", b"c1", b"c2"]
    assert len(waiting) == 2 and waiting.answered == 3
    replies = waiting.settle(flushed=500)
    assert [orjson.loads(h)["status"] for _, _, h in replies] == ["PUT_OK", "PUT_OK"]
    assert waiting.statistics() == {"waiting": 0, "answered": 5, "flushDiskTimeouts": 0, "flushSlaveTimeouts": 0}


def test_a_send_held_past_the_sync_flush_timeout_gets_flush_disk_timeout():
    waiting = Waiting(timeout_ms=100)
    now = time.monotonic_ns()
    waiting.add([(b"old", now - 200_000_000, 100, _put_ok(1), 0), (b"new", now, 200, _put_ok(2), 0)])
    (client, _, header), = waiting.settle(flushed=0)
    assert client == b"old" and orjson.loads(header)["status"] == "FLUSH_DISK_TIMEOUT"
    assert len(waiting) == 1 and waiting.timeouts == 1
    (client, _, header), = waiting.settle(flushed=0, everyone=True)  # at stop, nobody is left
    assert client == b"new" and orjson.loads(header)["status"] == "FLUSH_DISK_TIMEOUT"
    assert len(waiting) == 0


def test_sync_master_sends_wait_for_the_slave_and_time_out_as_flush_slave_timeout():
    clock = MockClock()
    waiting = Waiting(timeout_ms=3000, clock_ns=clock.ns)
    # SYNC_MASTER with ASYNC_FLUSH: nothing to flush (0), offsets to replicate
    waiting.add([(b"c%d" % i, clock.ns(), 0, _put_ok(i), 100 * (i + 1)) for i in range(3)])
    assert waiting.settle(flushed=0, acked=150) and len(waiting) == 2  # the slave has the first
    # SYNC_MASTER with SYNC_FLUSH: both must cover it
    waiting.add([(b"both", clock.ns(), 400, _put_ok(9), 400)])
    assert [c for c, _, _ in waiting.settle(flushed=10_000, acked=300)] == [b"c1", b"c2"]
    assert waiting.settle(flushed=399, acked=400) == []
    clock.now += 3.1
    (client, _, header), = waiting.settle(flushed=0, acked=400)  # the disk was late: its status
    assert client == b"both" and orjson.loads(header)["status"] == "FLUSH_DISK_TIMEOUT"
    waiting.add([(b"slow", clock.ns(), 500, _put_ok(10), 500)])
    clock.now += 3.1
    (client, _, header), = waiting.settle(flushed=0, acked=0)  # both late: replication's status last
    assert orjson.loads(header)["status"] == "FLUSH_SLAVE_TIMEOUT"
    assert waiting.statistics()["flushSlaveTimeouts"] == 1 and waiting.statistics()["flushDiskTimeouts"] == 1


def test_past_the_limit_the_oldest_held_sends_time_out_at_once(monkeypatch):
    monkeypatch.setattr(flush, "MAX_WAITING", 3)
    waiting = Waiting(timeout_ms=5000)
    now = time.monotonic_ns()
    overflow = waiting.add([(b"c%d" % i, now, i + 1, _put_ok(i), 0) for i in range(5)])
    assert [client for client, _, _ in overflow] == [b"c0", b"c1"]
    assert len(waiting) == 3


@pytest.fixture
def store_and_control(tmp_path):
    settings = small_settings(tmp_path / "store", flushDiskType="SYNC_FLUSH")
    store = open_store(settings)
    control = ControlBlock(settings.root / "control", create=True)
    yield settings, store, control
    control.close()
    store.close()


@pytest.fixture
def flush_thread(store_and_control):
    """A FlushThread over the store, not yet started (tests patch it first); stopped after."""
    settings, store, control = store_and_control
    thread = FlushThread(settings, control, zmq.Context.instance())
    yield thread
    thread.stop(flush=False)
    thread.close()


def _written(store, control, records) -> int:
    result = put(store, records, dispatch=False)
    control.set("store_timestamp", 1795000000000)
    control.advance("written", result.offset_written)
    return result.offset_written


def test_the_flush_thread_flushes_what_was_written_when_woken_and_reports(store_and_control, flush_thread):
    settings, store, control = store_and_control
    flush_thread.start()
    end = _written(store, control, [message(i) for i in range(400)])  # spans segments of 64 KiB
    assert end > 2 * settings.mappedFileSizeCommitLog
    flush_thread.wake()
    assert flush_thread.flushed_in.poll(5000), "the thread reports each woken flush"
    flush_thread.take_reports()
    assert control.get("flushed") == end
    flush_thread.check()
    stats = flush_thread.statistics()
    assert stats["alive"] and stats["flushes"] >= 1 and stats["flushed"] == end
    end = _written(store, control, [message(1000)])
    flush_thread.stop()  # the last bytes are flushed at stop, woken or not
    assert control.get("flushed") == end and not flush_thread.thread.is_alive()
    checkpoint = Checkpoint(settings.root / "checkpoint", readonly=True)
    assert checkpoint.physic_timestamp == 1795000000000  # forced at stop
    checkpoint.map.close()


def test_the_flush_thread_reports_a_flush_it_made_on_its_timer(store_and_control, flush_thread):
    """A wake can land between a timed-out wait and the clear that follows, and be lost. The
    round after the clear flushes what the wake was for, so every advance of `flushed` is
    reported, woken or not; else the front's held sends would wait for its next timeout."""
    _, store, control = store_and_control
    flush_thread.start()
    end = _written(store, control, [message(i) for i in range(10)])  # published, no wake
    assert flush_thread.flushed_in.poll(5000), "an unwoken flush is reported too"
    assert control.get("flushed") == end


def test_a_flush_thread_that_fails_fails_its_front(flush_thread, monkeypatch):
    def broken() -> int:
        raise ValueError("a bug, not the disk")

    monkeypatch.setattr(flush_thread.flusher, "flush_to_written", broken)
    flush_thread.start()
    flush_thread.wake()
    flush_thread.thread.join(5)
    with pytest.raises(RuntimeError, match="flush thread died"):
        flush_thread.check()


def test_a_disk_error_stops_the_flush_thread_and_fails_its_front(store_and_control, flush_thread, monkeypatch):
    """fsyncgate: after a failed fdatasync the kernel may drop the dirty pages and the error, so
    the flush is never tried again and `flushed` never passes what failed."""
    _, store, control = store_and_control
    _written(store, control, [message(1)])
    calls = []

    def failing(fd: int) -> None:
        calls.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("actors.flush.os.fdatasync", failing)
    flush_thread.start()
    flush_thread.wake()
    flush_thread.thread.join(5)
    assert not flush_thread.thread.is_alive() and len(calls) == 1
    with pytest.raises(RuntimeError, match="flush thread died"):
        flush_thread.check()
    monkeypatch.setattr("actors.flush.os.fdatasync", lambda fd: calls.append(fd))  # the disk "recovers"
    with pytest.raises(FlushFailed):
        flush_thread.flusher.flush_to_written()
    with pytest.raises(FlushFailed):
        flush_thread.flush_here()
    assert len(calls) == 1 and control.get("flushed") == 0
    assert flush_thread.statistics()["diskErrors"] == 1


def test_the_front_flushes_itself_when_the_disk_was_quick(store_and_control, flush_thread):
    _, store, control = store_and_control
    end = _written(store, control, [message(i) for i in range(10)])
    assert flush_thread.flush_here()  # not started: this thread did it
    assert control.get("flushed") == end and flush_thread.statistics()["flushedByFront"] == 1


def test_the_front_leaves_the_flush_to_the_thread_after_a_slow_fdatasync(store_and_control, flush_thread):
    _, store, control = store_and_control
    _written(store, control, [message(1)])
    flush_thread.flusher.last_flush_ns = 3_000_000  # a disk this slow would stall the front
    assert not flush_thread.flush_here()
    assert control.get("flushed") == 0 and flush_thread.statistics()["flushedByFront"] == 0


def test_the_front_does_not_flush_beside_the_thread(store_and_control, flush_thread):
    _, store, control = store_and_control
    _written(store, control, [message(1)])
    with flush_thread.lock:  # the thread is in its fdatasync
        assert not flush_thread.flush_here()
    assert control.get("flushed") == 0


def test_a_disk_error_in_the_front_s_own_flush_stops_the_front(store_and_control, flush_thread, monkeypatch):
    _, store, control = store_and_control
    _written(store, control, [message(1)])

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("actors.flush.os.fdatasync", failing)
    with pytest.raises(OSError, match="Input/output error"):
        flush_thread.flush_here()
    assert control.get("flushed") == 0 and not flush_thread.lock.locked()
    with pytest.raises(FlushFailed):  # and the thread will not try again either
        flush_thread.flusher.flush_to_written()


class MockClock:
    """Seconds (or ns) that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def ns(self) -> int:
        return int(self.now * 1e9)


def test_held_sends_time_out_by_the_injected_clock_not_the_wall():
    clock = MockClock()
    waiting = Waiting(timeout_ms=5000, clock_ns=clock.ns)
    waiting.add([(b"c%d" % i, clock.ns(), 100 * (i + 1), _put_ok(i), 0) for i in range(3)])
    clock.now += 4.9
    assert waiting.settle(flushed=100) and len(waiting) == 2  # covered: PUT_OK; the rest still wait
    clock.now += 3600  # an hour of node time, no sleeping
    replies = waiting.settle(flushed=100)
    assert [orjson.loads(h)["status"] for _, _, h in replies] == ["FLUSH_DISK_TIMEOUT"] * 2


def test_async_flush_follows_its_intervals_on_the_injected_clock(store_and_control):
    settings, store, control = store_and_control
    settings = dataclasses.replace(settings, flushDiskType="ASYNC_FLUSH")
    clock = MockClock()
    flusher = CommitLogFlusher(settings, control, clock=clock)
    try:
        end = _written(store, control, [message(1)])  # less than flushCommitLogLeastPages
        flusher.async_turn()
        assert control.get("flushed") == 0  # not due yet
        clock.now += settings.flushIntervalCommitLog / 1000
        flusher.async_turn()
        assert control.get("flushed") == 0  # due, but fewer dirty pages than the least to flush
        clock.now += settings.flushCommitLogThoroughInterval / 1000
        flusher.async_turn()
        assert control.get("flushed") == end  # a thorough flush takes whatever is dirty
    finally:
        flusher.close()
