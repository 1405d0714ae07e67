"""The read core's time, on a mock clock: a pull held ten minutes and a read that waits for a
stalled dispatcher end when the clock says so, in a millisecond of test time."""

from __future__ import annotations

import orjson
import pytest
from helpers import small_settings

from actors.pull_core import DEFER_MAX_S, ReadCore
from node import protocol
from shm.control_block import ControlBlock
from shm.store import MessageStore


class MockClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def read_core(tmp_path):
    settings = small_settings(tmp_path / "store", runDir=str(tmp_path / "run"))
    MessageStore(settings).close()  # the directories a node's store has
    control = ControlBlock(settings.root / "control", create=True)
    control.publish_recovered(written=0, flushed=0, dispatched=0, min_offset=0)
    pull = ReadCore(settings, control, watcher=1, clock=MockClock())
    yield pull, control
    pull.close()
    control.close()


def _pull(offset: int, **fields) -> dict:
    return {"code": protocol.PULL_MESSAGE, "opaque": 7, "topic": "Clock", "queueId": 0, "queueOffset": offset, **fields}


def test_a_pull_held_ten_minutes_ends_by_the_clock(read_core):
    pull, _ = read_core
    out: list = []
    pull.serve_request(_pull(0, suspend=True, suspendTimeoutMillis=600_000), b"client", 1, out)
    assert out == [] and pull.held_count == 1
    pull.clock.now += 599.9
    pull.after_turn(out)
    assert out == [] and pull.held_count == 1  # not yet
    pull.clock.now += 0.2
    pull.after_turn(out)
    (client, _, header), = out
    assert client == b"client" and orjson.loads(header)["status"] == "NO_NEW_MSG" and pull.expired == 1


def test_a_read_waiting_for_a_stalled_dispatcher_gives_up_by_the_clock(read_core):
    pull, control = read_core
    control.advance("written", 4096)  # acknowledged sends the dispatcher has not indexed
    control.advance("committed", 4096)
    out: list = []
    pull.serve_request({"code": protocol.GET_MAX_OFFSET, "opaque": 1, "topic": "Clock", "queueId": 0}, b"c", 1, out)
    assert out == [] and len(pull.deferred) == 1 and pull.timeout_ms() == 1
    pull.clock.now += DEFER_MAX_S - 0.1
    pull.after_turn(out)
    assert out == []
    pull.clock.now += 0.2
    pull.after_turn(out)
    (_, _, header), = out
    assert orjson.loads(header)["status"] == "SYSTEM_BUSY" and not pull.deferred


def test_a_min_offset_waits_for_the_dispatcher_as_a_max_does(read_core):
    """(Asked before the dispatcher made a queue's file, a deleted topic's made again whose
    numbering goes on at 3, the min was 0.)"""
    pull, control = read_core
    control.advance("written", 4096)
    control.advance("committed", 4096)
    out: list = []
    for code in (protocol.GET_MIN_OFFSET, protocol.GET_MAX_OFFSET):
        pull.serve_request({"code": code, "opaque": 1, "topic": "Clock", "queueId": 0}, b"c", 1, out)
    assert out == [] and len(pull.deferred) == 2
