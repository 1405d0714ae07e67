"""node.tools.pacing: every send started once, in order, none before its time, all awaited."""

from __future__ import annotations

import asyncio
import os
import struct
import time

import pytest

from node.tools import pacing


async def _run(pace, rate: int, seconds: float) -> tuple[list[int], list[float], float, int]:
    started, stamps, finished = [], [], []
    began = time.perf_counter()

    async def send(i: int) -> None:
        started.append(i)
        stamps.append(time.perf_counter() - began)
        await asyncio.sleep(0.002)  # in flight past the last start: paced must wait for it
        finished.append(i)

    await pace(rate, seconds, send)
    return started, stamps, time.perf_counter() - began, len(finished)


@pytest.mark.parametrize("pace", [pacing.paced, pacing.paced_by_loop_timers])
def test_each_send_starts_once_in_order_never_ahead_of_its_time_and_is_awaited(pace):
    started, stamps, elapsed, finished = asyncio.run(_run(pace, 2000, 0.1))
    assert started == list(range(200)) and finished == 200
    # send i is due at i/rate: it may start late (a busy machine), never early
    assert all(stamp >= i / 2000 - 0.0005 for i, stamp in enumerate(stamps))
    assert elapsed >= 199 / 2000


def test_without_a_timerfd_the_loop_timers_pace(monkeypatch):
    monkeypatch.setattr(pacing, "_timerfd", lambda interval_ns: None)
    started, _, _, finished = asyncio.run(_run(pacing.paced, 1000, 0.05))
    assert started == list(range(50)) and finished == 50


def test_a_timerfd_ticks_at_the_asked_interval():
    fd = pacing._timerfd(1_000_000)
    assert fd is not None  # Linux: the benchmarks' even pacing is there
    try:
        time.sleep(0.02)
        assert struct.unpack("=Q", os.read(fd, 8))[0] >= 10  # ~20 expirations of 1 ms
    finally:
        os.close(fd)


def test_nothing_to_send_returns_at_once():
    assert asyncio.run(_run(pacing.paced, 1000, 0.0))[0] == []
