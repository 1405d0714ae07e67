"""The flush parts without Ray: the held SYNC_FLUSH sends (`Waiting`), and the group commit's
shell (`Flush`) on a thread of a host (actors.host, as the compact front's process runs it),
over a real CommitLog and control block, its links local."""

from __future__ import annotations

import dataclasses
import time

import orjson
import pytest
from helpers import message, open_store, put, small_settings

from actors import flush
from actors.base import Actor
from actors.flush import CommitLogFlusher, Flush, FlushFailed, Waiting
from actors.host import Host
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


class Shell(Actor):
    """A stand-in for the router (`front`: collects what comes back) or the write shell (`writer`)."""

    def __init__(self, settings, name: str):
        super().__init__(settings)
        self.name = name
        self.inbox = None
        self.replies: list = []

    def open(self) -> None:
        self.inbox = self.local_links.into(self.name)

    def poll_items(self) -> list:
        return [item for link in self.inbox for item in link.poll_items()]

    def timeout_ms(self) -> int:
        return min([link.wait_ms(20) for link in self.inbox] or [20])

    def step(self, events: set) -> None:
        for link in self.inbox:
            for replies in link.take():
                self.replies += replies


@pytest.fixture
def host(store_and_control):
    """A host of a stand-in router and writer in its loop, the group commit on its thread."""
    settings, _, _ = store_and_control
    running = Host(settings, "front", [Shell(settings, "front"), Shell(settings, "writer")], [Flush(settings)])
    yield running
    running.stop()
    running.close()


def _written(store, control, records) -> int:
    result = put(store, records, dispatch=False)
    control.set("store_timestamp", 1795000000000)
    control.advance("written", result.offset_written)
    return result.offset_written


def _hold(host: Host, end: int, opaque: int = 1) -> None:
    """The write shell's part: a send appended up to `end` waits for the disk."""
    host.links.get("writer-to-flush").send([(b"client", time.monotonic_ns(), end, _put_ok(opaque), 0)])


def _turn_until(host: Host, done, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        host.turn()


def test_the_group_commit_thread_flushes_held_sends_and_answers_them_through_its_link(store_and_control, host):
    settings, store, control = store_and_control
    host.start()
    end = _written(store, control, [message(i) for i in range(400)])  # spans segments of 64 KiB
    assert end > 2 * settings.mappedFileSizeCommitLog
    _hold(host, end)
    router = host.members[0]
    _turn_until(host, lambda: router.replies)
    [(client, _, header)] = router.replies
    assert client == b"client" and orjson.loads(header)["status"] == "PUT_OK"
    assert control.get("flushed") == end
    stats = host.threads[0].statistics()
    assert stats["flushes"] >= 1 and stats["flushed"] == end and stats["answered"] == 1
    end = _written(store, control, [message(1000)])
    host.stop()
    host.drain()  # the last bytes are flushed at stop, held or not
    assert control.get("flushed") == end and not host.runners[0].is_alive()
    checkpoint = Checkpoint(settings.root / "checkpoint", readonly=True)
    assert checkpoint.physic_timestamp == 1795000000000  # forced at stop
    checkpoint.map.close()


def test_the_group_commit_flushes_what_was_written_unasked(store_and_control, host):
    """SYNC_FLUSH: every GROUP_COMMIT_WAKE_MS the thread flushes what was published, held or not."""
    _, store, control = store_and_control
    host.start()
    end = _written(store, control, [message(i) for i in range(10)])  # published, nothing held
    deadline = time.monotonic() + 5
    while control.get("flushed") < end and time.monotonic() < deadline:
        time.sleep(0.01)
    assert control.get("flushed") == end


def test_a_group_commit_thread_that_fails_fails_its_process(store_and_control, host, monkeypatch):
    _, store, control = store_and_control

    def broken(self) -> int:
        raise ValueError("a bug, not the disk")

    monkeypatch.setattr(CommitLogFlusher, "flush_to_written", broken)
    host.start()
    _hold(host, _written(store, control, [message(1)]))
    with pytest.raises(RuntimeError, match="its flush thread died"):
        _turn_until(host, lambda: False)


def test_a_disk_error_stops_the_group_commit_and_its_process_and_is_never_retried(store_and_control, host,
                                                                                  monkeypatch):
    """fsyncgate: after a failed fdatasync the kernel may drop the dirty pages and the error, so
    the flush is never tried again and `flushed` never passes what failed."""
    _, store, control = store_and_control
    end = _written(store, control, [message(1)])
    calls = []

    def failing(fd: int) -> None:
        calls.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("actors.flush.os.fdatasync", failing)
    host.start()
    _hold(host, end)
    with pytest.raises(RuntimeError, match="its flush thread died"):
        _turn_until(host, lambda: False)
    assert len(calls) == 1 and control.get("flushed") == 0 and host.members[0].replies == []
    flusher = host.threads[0].flusher
    monkeypatch.setattr("actors.flush.os.fdatasync", lambda fd: calls.append(fd))  # the disk "recovers"
    with pytest.raises(FlushFailed):
        flusher.flush_to_written()
    assert len(calls) == 1 and control.get("flushed") == 0


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


def test_a_flush_keeps_no_descriptor_of_a_segment_it_will_never_flush_again(store_and_control):
    """A slave's catch-up (or a burst) flushes several segments at once, then maybe nothing more
    (a full disk): a descriptor kept on a flushed segment would keep its blocks once the clean
    service deletes it, and the disk would stay full."""
    settings, store, control = store_and_control
    flusher = CommitLogFlusher(settings, control)
    try:
        end = _written(store, control, [message(i, size=4000) for i in range(60)])  # ~4 segments of 64 KiB
        size = settings.mappedFileSizeCommitLog
        assert end > 3 * size
        assert flusher.flush_to_written() == end
        assert list(flusher.fds) == [end - end % size]  # written's segment only
    finally:
        flusher.close()


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
