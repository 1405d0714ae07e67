"""A bug in each service process (MQNODE_INJECT_BUG: an exception at a loop turn) stops that
process, Ray restarts it, it recovers from the files, and under SYNC_FLUSH nothing that was
acknowledged is lost. One split node: a process of every kind."""

from __future__ import annotations

import os
import time

import pytest
from nodes import in_process_node

from node.client import Producer, PullConsumer, SendError
from node.server.supervision import actor_states

LABELS = ("front", "writer", "flush", "dispatcher", "allocator", "ingress-0", "pull-0")
TURN = 200  # every process raises at its 200th loop turn (10 s of an idle 50 ms loop), then again after each restart


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    os.environ["MQNODE_INJECT_BUG"] = ",".join(f"{label}:turn={TURN}" for label in LABELS)
    try:
        yield from in_process_node(tmp_path_factory.mktemp("bugs"), topology="split", ingressWorkers=1,
                                   pullWorkers=1, flushDiskType="SYNC_FLUSH", actorRestartBackoffMaxMillis=200)
    finally:
        os.environ.pop("MQNODE_INJECT_BUG", None)


@pytest.mark.slow
def test_a_bug_in_each_service_restarts_it_and_loses_nothing_acknowledged(node):
    acknowledged: dict[int, bytes] = {}
    deadline = time.monotonic() + 120
    with Producer(node.settings.listen, timeout=3.0, retries=0) as producer:
        i = 0
        while time.monotonic() < deadline:
            states = actor_states(node.hosts)
            if all(states[label]["NumRestarts"] >= 1 for label in LABELS) and len(acknowledged) >= 200:
                break
            body = b"bug-%d" % i
            i += 1
            try:
                result = producer.send("Bugs", body, queue_id=0)
            except SendError:
                continue  # in flight when a process died: no PUT_OK, the client may retry
            acknowledged[result.queue_offset] = body
            time.sleep(0.002)  # let the idle loops turn too
    restarts = {label: info["NumRestarts"] for label, info in actor_states(node.hosts).items()}
    assert all(restarts[label] >= 1 for label in LABELS), restarts
    with PullConsumer(node.settings.listen) as consumer:
        stored: dict[int, bytes] = {}
        offset = 0
        for _ in range(10_000):
            try:
                result = consumer.pull("Bugs", 0, offset, max_count=32)
            except SendError:
                continue  # a process restarting under the pull
            if result.status != "FOUND":
                break
            stored.update((m.queue_offset, m.body) for m in result.messages)
            offset = result.next_begin_offset
    missing = {o: b for o, b in acknowledged.items() if stored.get(o) != b}
    assert not missing, f"{len(missing)} acknowledged messages not stored"
