"""The machine's floors, measured beside a benchmark's figures so the figures can be read.

Each floor is what this machine gives before mqnode does any work of its own:
- transport: the p50 round trip of a 1 KiB frame between two processes over ZeroMQ
  DEALER/ROUTER on 127.0.0.1, one request at a time, paced at 5k/s like the ack-latency figure;
  the far side only echoes. Where this process may make the PM QoS request a serving node's
  front makes (`cpuIdleLatencyUs`, actors.host_tuning), it is measured twice: with idle CPUs
  halting, as before a node serves, and with them polling, as while it serves (on the project's virtual machines the
  second is about half the first).
- disk: the p50 of one fdatasync after writing 64 KiB through a mapping into a preallocated
  file beside the store, about what a SYNC_FLUSH group commit of 64 senders writes.
- cpu: how long a fixed pure-Python loop takes, the speed every actor's per-message work scales
  with.

Why print them at all: on the Firecracker VM mqnode is developed on, the transport floor moved
between ~115 µs and over 2 ms within an hour, and the loop's time by half (docs/performance.md).
A figure means little without the floor measured in the same minutes. A floor that cannot be
measured (no fallocate, a dead echo process) is reported as such; the benchmark goes on.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import time
from pathlib import Path

import zmq

from actors.host_tuning import CpuLatencyRequest, limit_in_force
from node.tools.local_node import free_port

ROUND_TRIPS = 2000
PACE_S = 1 / 5000
SYNC_BYTES = 64 * 1024
SYNCS = 200
LOOP_ITERATIONS = 1_000_000


def _echo(endpoint: str) -> None:
    """The far side of the transport floor: a ROUTER that returns every frame, until b"stop"."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    while True:
        frames = router.recv_multipart()
        router.send_multipart(frames)
        if frames[-1] == b"stop":
            break
    router.close()
    context.term()


def transport_us(trips: int = ROUND_TRIPS) -> float:
    """p50 round trip in µs to an echoing process, paced at `PACE_S` like the latency figure."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    echo = multiprocessing.get_context("spawn").Process(target=_echo, args=(endpoint,), daemon=True)
    echo.start()
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 30_000)  # a dead echo process fails the measurement, not hangs it
    dealer.connect(endpoint)
    try:
        dealer.send(b"hello")
        dealer.recv()  # connected, and the echo process is running
        frame = bytes(1024)
        samples = []
        due = time.perf_counter()
        for _ in range(trips):
            began = time.perf_counter()
            dealer.send(frame)
            dealer.recv()
            samples.append(time.perf_counter() - began)
            due = max(due + PACE_S, time.perf_counter())
            time.sleep(max(0.0, due - time.perf_counter()))
        dealer.send(b"stop")
        dealer.recv()
    finally:
        dealer.close()
        context.term()
        echo.join(timeout=10)
        if echo.is_alive():
            echo.kill()
            echo.join()
    if echo.exitcode != 0:  # killed above, or died: its round trips are not the machine's floor
        raise RuntimeError(f"the echo process ended with exit code {echo.exitcode}, not on its stop")
    return _p50(samples)


def disk_us(directory: Path, syncs: int = SYNCS) -> float:
    """p50 in µs of fdatasync after each `SYNC_BYTES` written through a mapping of a preallocated
    file in `directory` (removed after)."""
    path = directory / "floor-fdatasync.tmp"
    size = SYNC_BYTES * syncs
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        with mmap.mmap(fd, size) as mapped:
            chunk = bytes(range(256)) * (SYNC_BYTES // 256)
            samples = []
            for i in range(syncs):
                mapped[i * SYNC_BYTES: (i + 1) * SYNC_BYTES] = chunk
                began = time.perf_counter()
                os.fdatasync(fd)  # mapped pages are the file's page cache: this writes them
                samples.append(time.perf_counter() - began)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return _p50(samples)


def cpu_ms(iterations: int = LOOP_ITERATIONS) -> float:
    """The fastest of three runs of a pure-Python loop of `iterations` additions, in ms."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        total = 0
        for i in range(iterations):
            total += i
        best = min(best, time.perf_counter() - began)
    assert total == iterations * (iterations - 1) // 2
    return best * 1e3


def report(directory: Path) -> str:
    """One line: the three floors, measured now."""
    return (f"machine floors: ZeroMQ round trip p50 {_measure(transport_us, 'µs')} (5k/s, echo only"
            f"{_polling_transport()}), "
            f"fdatasync of 64 KiB p50 {_measure(lambda: disk_us(directory), 'µs')}, "
            f"Python loop of {LOOP_ITERATIONS:,} additions {_measure(cpu_ms, 'ms')}")


def _polling_transport() -> str:
    """The transport floor again with idle CPUs polling (a 0 µs wake-up limit held), where this
    process may ask for that and nobody already does; else nothing."""
    if limit_in_force() in (None, 0):
        return ""
    request = CpuLatencyRequest(0)
    request.acquire(0.0)
    try:
        if request.unavailable is not None:
            return ""
        return f"; {_measure(transport_us, 'µs')} with idle CPUs polling, as while a node serves"
    finally:
        request.release(0.0)


def _measure(floor, unit: str) -> str:
    try:
        return f"{floor():,.0f} {unit}"
    except (OSError, zmq.ZMQError, RuntimeError) as e:  # zmq.Again: the echo process never answered
        return f"not measured ({type(e).__name__}: {e})"


def _p50(samples: list[float]) -> float:
    assert samples
    return sorted(samples)[len(samples) // 2] * 1e6
