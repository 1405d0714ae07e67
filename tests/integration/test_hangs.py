"""A hung process of each kind (SIGSTOP: alive to Ray, its loop frozen) is found by the node's
watch through its heartbeat, killed with SIGKILL and restarted by Ray; nothing acknowledged is
lost. One node with a process of every kind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest
from nodes import free_port, in_process_node
from test_supervision import _ask, _send_until_stored

from node import protocol
from node.client import Producer, PullConsumer


@pytest.fixture(scope="module")
def split_node(tmp_path_factory):
    """A process of every kind: front, writer, flush, dispatcher, allocator, ingress, pull, proxy."""
    yield from in_process_node(tmp_path_factory.mktemp("hangs"), topology="split", ingressWorkers=1, pullWorkers=1,
                               grpcServerPort=free_port(), processHangTimeoutMillis=1000, actorRestartBackoffMaxMillis=100)


@pytest.mark.slow
def test_a_hung_process_of_each_kind_is_killed_and_restarted(split_node):
    """Every process hung at once (a frozen host's pause, say): each is found, killed and
    restarted, and the node serves again with everything it acknowledged before."""
    endpoint, run_dir = split_node.settings.listen, split_node.settings.run_dir
    labels = sorted(split_node.hosts)
    assert {"front", "writer", "flush", "dispatcher", "allocator", "ingress-0", "pull-0"} <= set(labels)
    with Producer(endpoint, timeout=5.0) as producer:
        acknowledged = [producer.send("Hangs", f"before {label}", queue_id=0).queue_offset for label in labels]
    hung = {label: int((run_dir / f"{label}.pid").read_text()) for label in labels}
    for pid in hung.values():
        os.kill(pid, signal.SIGSTOP)  # alive to Ray, its loop frozen

    def restarted() -> list[str]:
        left = []
        for label, pid in hung.items():
            try:
                if int((run_dir / f"{label}.pid").read_text()) == pid:
                    left.append(label)
            except (FileNotFoundError, ValueError):
                left.append(label)
        return left

    deadline = time.monotonic() + 60
    while (left := restarted()) or not _ask(endpoint, {"code": protocol.GET_MAX_OFFSET, "topic": "Hangs", "queueId": 0},
                                            timeout_ms=1000):
        assert time.monotonic() < deadline, f"not killed and restarted within 60 s: {left}"
        time.sleep(0.2)
    _send_until_stored(endpoint, 30)
    deadline = time.monotonic() + 10  # (the watch publishes its counts once a second)
    while True:
        counted = _ask(endpoint, {"code": protocol.GET_BROKER_RUNTIME_INFO})["supervision"]
        if all(counted.get(label, {}).get("hangs", 0) >= 1 and counted[label]["restarts"] >= 1 for label in labels):
            break
        assert time.monotonic() < deadline, counted
        time.sleep(0.5)
    with PullConsumer(endpoint) as consumer:
        stored = {m.queue_offset for m in consumer.pull("Hangs", 0, 0, max_count=64).messages}
    assert set(acknowledged) <= stored



@pytest.mark.slow
def test_a_hung_service_whose_pid_file_is_not_its_own_is_killed_through_ray(split_node):
    """A service that hung before writing its pid file (a worker Ray could not start properly on
    a full disk) leaves its predecessor's, whose pid may be another process's by now: the watch
    kills it through Ray, never by that pid."""
    pid_file = split_node.settings.run_dir / "allocator.pid"
    pid = int(pid_file.read_text())
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        pid_file.write_text(f"{bystander.pid}\n")  # a predecessor's file, its pid taken since...
        os.utime(pid_file, (1, 1))  # ...by a process begun after the file was written
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while int(pid_file.read_text() or 0) in (pid, bystander.pid):
            assert time.monotonic() < deadline, "the hung allocator was not killed and restarted within 30 s"
            time.sleep(0.2)
        assert bystander.poll() is None, "the watch killed a process by a pid file that was not its own"
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        bystander.kill()
        bystander.wait()
