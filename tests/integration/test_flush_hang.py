"""A hung fdatasync is found in either topology: in compact the group commit is a thread of the
front, whose own loop goes on turning, so the thread's own heartbeat is what gives it away."""

from __future__ import annotations

import os
import time

import pytest
from nodes import in_process_node
from test_supervision import _ask

from node import protocol
from node.client import Producer, SendError


@pytest.fixture(params=["compact", "split"])
def hanging_flush_node(tmp_path_factory, request):
    """ASYNC_FLUSH, flushing every 10 ms whatever is dirty; every flusher's 5th fdatasync never
    returns. In compact the flusher is a thread of the front, whose own loop goes on turning."""
    os.environ["MQNODE_INJECT_FLUSH_HANG"] = "5"  # inherited by the Ray workers this test's Ray starts
    try:
        yield from in_process_node(tmp_path_factory.mktemp("flushhang"), topology=request.param,
                                   flushIntervalCommitLog=10, flushCommitLogLeastPages=0,
                                   processHangTimeoutMillis=2000, actorRestartBackoffMaxMillis=100)
    finally:
        os.environ.pop("MQNODE_INJECT_FLUSH_HANG", None)


@pytest.mark.slow
def test_a_hung_fdatasync_is_found_in_either_topology(hanging_flush_node):
    node = hanging_flush_node
    endpoint, run_dir = node.settings.listen, node.settings.run_dir
    label = "front" if node.settings.topology == "compact" else "flush"
    first = _pid(run_dir / f"{label}.pid")
    deadline = time.monotonic() + 30
    with Producer(endpoint, timeout=5.0, retries=5) as producer:
        while _pid(run_dir / f"{label}.pid") in (first, None):  # sends go on; the flusher hangs at its 5th
            assert time.monotonic() < deadline, f"the {label} process with a hung fdatasync was not replaced"
            try:
                producer.send("FlushHang", b"x" * 5000)
            except SendError:
                pass  # the front restarting (compact): it is back within seconds
            time.sleep(0.05)
    deadline = time.monotonic() + 10
    while True:
        counted = _ask(endpoint, {"code": protocol.GET_BROKER_RUNTIME_INFO}, timeout_ms=2000) or {}
        if counted.get("supervision", {}).get(label, {}).get("hangs", 0) >= 1:
            break
        assert time.monotonic() < deadline, counted
        time.sleep(0.5)


def _pid(path) -> int | None:
    """The pid a pid file names; None while a restarted process is writing it."""
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
