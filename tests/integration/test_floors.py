"""node.tools.floors, the machine floors the benchmarks print beside their figures: each measures
something real and leaves nothing behind (no echo process, no scratch file). No speed is asserted."""

from __future__ import annotations

import math
import multiprocessing
import os

from actors import host_tuning as cpu_latency
from node.tools import floors


def test_transport_floor_round_trips_to_an_echo_process_and_stops_it():
    p50 = floors.transport_us(trips=50)
    assert math.isfinite(p50) and p50 > 0
    # transport_us raises unless the echo process exited 0 on its stop; and none is left over
    assert not multiprocessing.active_children()


def test_disk_floor_syncs_a_scratch_file_and_removes_it(tmp_path):
    p50 = floors.disk_us(tmp_path, syncs=4)
    assert math.isfinite(p50) and p50 > 0
    assert list(tmp_path.iterdir()) == []


def test_report_names_the_three_floors(tmp_path):
    line = floors.report(tmp_path)
    assert line.startswith("machine floors: ZeroMQ round trip p50 ")
    assert "fdatasync of 64 KiB p50 " in line and "Python loop of 1,000,000 additions " in line
    assert "not measured" not in line  # all three measured here
    if os.access(cpu_latency.DEVICE, os.W_OK) and cpu_latency.limit_in_force() not in (None, 0):
        assert "µs with idle CPUs polling, as while a node serves)" in line
        assert cpu_latency.limit_in_force() != 0  # the request is dropped afterwards
    assert list(tmp_path.iterdir()) == []


def test_a_floor_that_cannot_be_measured_is_reported_not_raised(tmp_path):
    missing = tmp_path / "gone"  # no such directory: the disk floor cannot open its scratch file
    line = floors.report(missing)
    assert "fdatasync of 64 KiB p50 not measured (FileNotFoundError" in line
    assert "ZeroMQ round trip p50 not measured" not in line
