"""The front's CPU wake-up latency request (actors.host_tuning): the hold policy on a mock
clock, the request's file I/O against a stand-in file, and the kernel's device where this
process may write it."""

from __future__ import annotations

import os
import struct

import pytest

from actors.host_tuning import (
    DEVICE,
    HOLD_S,
    CpuLatencyRequest,
    LatencyHold,
    limit_in_force,
)


def test_the_request_is_wanted_from_a_served_turn_until_the_hold_runs_out():
    hold = LatencyHold(2.0)
    assert not hold.wanted(100.0, served=False)  # an idle node asks for nothing
    assert hold.wanted(100.0, served=True)
    assert hold.wanted(101.9, served=False)
    assert hold.wanted(102.0, served=False)
    assert not hold.wanted(102.1, served=False)
    assert hold.wanted(103.0, served=True)  # the next request takes it again
    assert hold.wanted(104.5, served=True) and hold.wanted(106.5, served=False)  # each serve extends it
    assert not hold.wanted(106.6, served=False)


def _open_fds_on(path) -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}") == str(path))


def test_held_while_serving_closed_after_the_hold_and_at_release(tmp_path):
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    request = CpuLatencyRequest(7, device=str(device), hold_s=1.0)
    request.check(10.0, served=False)
    assert _open_fds_on(device) == 0 and request.statistics(10.0)["held"] is False
    request.check(10.0, served=True)
    assert device.read_bytes() == struct.pack("=i", 7)  # the limit, a native s32, as the kernel reads it
    assert _open_fds_on(device) == 1
    request.check(10.5, served=True)
    request.check(11.5, served=False)
    assert _open_fds_on(device) == 1  # one open file, however many turns
    request.check(11.6, served=False)
    assert _open_fds_on(device) == 0
    assert request.statistics(12.0) == {"limitUs": 7, "held": False, "holds": 1, "heldSeconds": 1.6,
                                        "unavailable": None}
    request.check(20.0, served=True)
    request.release(20.5)
    request.release(20.6)  # twice is harmless
    assert _open_fds_on(device) == 0
    assert request.statistics(21.0)["holds"] == 2 and request.statistics(21.0)["heldSeconds"] == 2.1


def test_a_device_that_cannot_be_opened_is_reported_and_not_tried_again(tmp_path):
    request = CpuLatencyRequest(0, device=str(tmp_path / "missing"))
    request.check(1.0, served=True)
    stats = request.statistics(1.0)
    assert stats["held"] is False and "No such file" in stats["unavailable"]
    (tmp_path / "missing").write_bytes(b"")
    request.check(5.0, served=True)  # one attempt: a turn must not retry a syscall that failed
    assert request.statistics(5.0)["holds"] == 0 and _open_fds_on(tmp_path / "missing") == 0


def test_a_write_the_device_refuses_closes_the_file_and_is_reported(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    request = CpuLatencyRequest(0, device="/dev/full")  # every write fails with ENOSPC
    request.check(1.0, served=True)
    assert request.fd is None and "space" in request.statistics(1.0)["unavailable"]


def test_the_kernel_applies_the_request_while_it_is_held():
    """On a machine where this process may write the device (root): the limit in force is the
    request's while held, and what it was before once released."""
    if not os.access(DEVICE, os.W_OK) or limit_in_force() is None:
        pytest.skip(f"{DEVICE} not writable here")
    before = limit_in_force()
    if before == 0:
        pytest.skip("another process already asks for 0 µs")
    request = CpuLatencyRequest(0)
    request.check(0.0, served=True)
    try:
        assert request.statistics(0.0)["held"] and limit_in_force() == 0
    finally:
        request.release(HOLD_S)
    assert limit_in_force() == before
