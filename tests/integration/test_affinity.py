"""The front's CPU pinning at light load (actors.host_tuning): the policy fed scripted readings
with a mock clock, and the pinner's masks on a real process's threads."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from actors.host_tuning import (
    HOLD_OFF_S,
    MAX_LOOP_BUSY,
    MAX_LOOP_WAIT,
    UNPIN_ABOVE,
    PinPolicy,
    ProcessPinner,
    Reading,
)


def _reading(now: float, process_cpu: float, *, wait: float = 0.0, cpu: int = 1) -> Reading:
    return Reading(now=now, process_cpu=process_cpu, loop_busy=process_cpu / 2 + wait, loop_wait=wait, cpu=cpu)


def test_light_load_pins_to_the_loops_cpu_and_a_full_cpu_unpins():
    policy = PinPolicy(0.7)
    assert policy.decide(_reading(1, 0.75)) is None  # above pin_below: not pinned
    assert policy.decide(_reading(2, 0.6, cpu=0)) == 0  # light: pinned where the loop runs
    assert policy.decide(_reading(3, 0.8, wait=0.35, cpu=1)) == 0  # busier, still room: stays
    assert policy.decide(_reading(4, UNPIN_ABOVE + 0.01)) is None  # the one CPU nearly full
    assert policy.decide(_reading(5, 0.1)) is None  # held off: no moving back and forth
    assert policy.decide(_reading(4 + HOLD_OFF_S - 0.1, 0.1)) is None
    assert policy.decide(_reading(4 + HOLD_OFF_S, 0.75)) is None  # due again, but not light
    assert policy.decide(_reading(5 + HOLD_OFF_S, 0.1, cpu=1)) == 1
    assert (policy.pins, policy.unpins) == (2, 1)


def test_a_contended_cpu_unpins_and_is_not_taken_again_for_a_while():
    policy = PinPolicy(0.7)
    assert policy.decide(_reading(0, 0.2, cpu=1)) == 1
    assert policy.decide(_reading(1, 0.2, wait=MAX_LOOP_WAIT + 0.01)) is None  # waiting for it
    assert policy.decide(_reading(2, 0.1)) is None
    assert policy.decide(_reading(1 + HOLD_OFF_S, 0.1, cpu=0)) == 0
    assert (policy.pins, policy.unpins) == (2, 1)


def test_a_loop_runnable_all_the_time_unpins_though_another_process_takes_half_the_cpu():
    """Shared half and half with a busy neighbour: the process gets 0.5 of the CPU and waits
    0.45, under both limits, but its loop thread wanted to run the whole time."""
    policy = PinPolicy(0.7)
    assert policy.decide(_reading(0, 0.2, cpu=1)) == 1
    serving = Reading(now=1, process_cpu=0.5, loop_busy=0.85, loop_wait=0.48, cpu=1)  # 5k sends/s, seen
    assert policy.decide(serving) == 1
    shared = Reading(now=2, process_cpu=0.5, loop_busy=MAX_LOOP_BUSY + 0.01, loop_wait=0.45, cpu=1)
    assert policy.decide(shared) is None and policy.unpins == 1


def test_the_thresholds_must_leave_room_between_them():
    for bad in (0, -0.1, UNPIN_ABOVE, 1.5):
        with pytest.raises(AssertionError):
            PinPolicy(bad)


def _masks() -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}


def _pin_and_release(cpu: int, results) -> None:
    """In a child process: pin through the pinner's policy, start a thread, release."""
    pinner = ProcessPinner(0.7)
    stop = threading.Event()
    early = threading.Thread(target=stop.wait)
    early.start()
    pinner.policy.pinned = cpu
    pinner._apply({cpu})
    late = threading.Thread(target=stop.wait)  # started pinned: inherits the mask
    late.start()
    results.put(("pinned", sorted(map(sorted, _masks()))))
    pinner.release()
    results.put(("released", sorted(map(sorted, _masks())), sorted(pinner.allowed)))
    stop.set()
    early.join()
    late.join()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs sched_setaffinity and two CPUs")
def test_the_pinner_moves_every_thread_and_gives_them_back_all_cpus():
    cpu = max(os.sched_getaffinity(0))
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_pin_and_release, args=(cpu, results))
    child.start()
    pinned = results.get(timeout=30)
    released = results.get(timeout=30)
    child.join(30)
    assert pinned == ("pinned", [[cpu]])  # every thread, the late one too
    assert released[0] == "released" and released[1] == [released[2]] and len(released[2]) >= 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_pinner_pins_after_a_light_second_and_unpins_after_a_busy_one():
    """This (test) process: idle through a reading, so pinned; then this thread spins through
    the next, and it is unpinned, every thread back on every CPU."""
    pinner = ProcessPinner(0.7)
    assert pinner.enabled and pinner.statistics()["pinnedCpu"] is None
    try:
        pinner.check()
        assert pinner.statistics()["pins"] == 0  # no reading has ended yet
        pinner.next_check = time.monotonic()  # as a second later: this thread idled meanwhile
        pinner.began = (pinner.began[0] - 1.0, *pinner.began[1:])
        pinner.check()
        stats = pinner.statistics()
        assert stats["pins"] == 1 and stats["pinnedCpu"] in os.sched_getaffinity(0)
        assert 0 <= stats["processCpu"] < 0.7 and 0 <= stats["loopWait"] < 0.7
        assert _masks() == {frozenset({stats["pinnedCpu"]})}
        began = time.monotonic()
        while pinner.statistics()["pinnedCpu"] is not None and time.monotonic() - began < 5:
            pinner.check()  # this thread busy between checks: runnable all of the reading
        stats = pinner.statistics()
        # The CPU it got depends on who else runs there (another test worker, say); the time it
        # was runnable does not: it spun through the whole reading.
        assert stats["unpins"] == 1 and stats["loopBusy"] > MAX_LOOP_BUSY
    finally:
        pinner.release()
    assert all(len(mask) >= 2 for mask in _masks())
