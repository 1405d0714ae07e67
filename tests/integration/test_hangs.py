"""A hung process of each kind (SIGSTOP: alive to Ray, its loop frozen) is found by the node's
watch through its heartbeat, killed with SIGKILL and restarted by Ray; nothing acknowledged is
lost. One node with a process of every kind."""

from __future__ import annotations

import os
import signal
import time

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
    endpoint, run_dir = split_node.settings.listen, split_node.settings.run_dir
    acknowledged = []
    labels = sorted(split_node.hosts)
    assert {"front", "writer", "flush", "dispatcher", "allocator", "ingress-0", "pull-0"} <= set(labels)
    for label in labels:
        with Producer(endpoint, timeout=5.0) as producer:
            acknowledged.append(producer.send("Hangs", f"before {label}", queue_id=0).queue_offset)
        pid = int((run_dir / f"{label}.pid").read_text())
        os.kill(pid, signal.SIGSTOP)  # alive to Ray, its loop frozen
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                if int((run_dir / f"{label}.pid").read_text()) != pid and _ask(
                        endpoint, {"code": protocol.GET_MAX_OFFSET, "topic": "Hangs", "queueId": 0}, timeout_ms=1000):
                    break
            except (FileNotFoundError, ValueError):
                pass
        else:
            raise AssertionError(f"{label} was not killed and restarted within 30 s")
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

