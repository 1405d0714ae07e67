"""The client's event-loop helpers."""

from __future__ import annotations

import asyncio
import gc

import pytest

from node.client import aio


def test_a_detached_task_is_held_until_it_ends_and_then_let_go():
    async def main() -> list:
        gate, seen = asyncio.Event(), []

        async def job() -> None:
            await gate.wait()
            seen.append("done")

        task = aio.detach(job())
        del task
        gc.collect()  # the loop's own reference is weak: only the helper's set keeps the task
        await asyncio.sleep(0)
        assert len(aio._DETACHED) == 1
        gate.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert not aio._DETACHED
        return seen

    assert aio.run(main()) == ["done"]


EXIT_SCRIPT = """
import atexit, os, threading

def last():  # registered before the clients' module: runs after its exit handler
    alive = sorted(t.name for t in threading.enumerate() if t.name.startswith("mqnode-") and t.is_alive())
    print("alive", alive, flush=True)

atexit.register(last)
from node.client import Producer, PullConsumer, PushConsumer
left_open = [Producer("tcp://127.0.0.1:1"), PullConsumer("tcp://127.0.0.1:1"),
             PushConsumer("tcp://127.0.0.1:1", "left-open")]
Producer("tcp://127.0.0.1:1").close()
"""


def test_the_loops_of_clients_left_open_are_stopped_before_the_interpreter_ends():
    """A program that never closes its clients: their loops' daemon threads stopped at exit, their
    tasks cancelled, nothing said about them. Left running, one woke in the process's last moments
    for a timer (uvloop takes the GIL for it, with no interpreter left): SIGSEGV, once in ~60 runs."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["alive []"] and done.stderr == ""


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # (Python 3.12+: the point)
def test_a_client_used_in_a_process_forked_after_it_was_made_says_so_at_once():
    """(a Producer made at import and used by multiprocessing's forked workers: their sends waited
    forever on a loop thread that stayed in the parent)"""
    import os
    import time

    from node.client import ForkedClient, Producer

    producer = Producer("tcp://127.0.0.1:1", timeout=1.0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a word on the pipe, then out without the parent's exit handlers
        began, word = time.monotonic(), b"no error"
        try:
            producer.send("T", b"from the child")
        except ForkedClient as e:
            word = b"forked" if "make the client in the process that uses it" in str(e) else str(e).encode()
        producer.close()  # (the parent's to close: nothing here)
        os.write(write, word if time.monotonic() - began < 1 else b"slow")
        os._exit(0)
    os.close(write)
    assert os.read(read, 200) == b"forked"
    assert os.waitpid(pid, 0)[1] == 0
    os.close(read)
    producer.close()  # (the parent's own: still its to close)
    assert not producer.thread.is_alive()


def test_an_endpoint_is_taken_as_host_port_too_and_a_bad_one_is_named_and_leaves_nothing_running():
    import threading

    import zmq

    from node.client import Producer, PullConsumer
    from node.client.errors import BadEndpoint

    with Producer("127.0.0.1:1") as producer:  # (RocketMQ's form, as a route names a broker)
        assert producer.inner.connection.socket.get_string(zmq.LAST_ENDPOINT) == "tcp://127.0.0.1:1"
    before = set(threading.enumerate())  # (other tests of this process may leave theirs)
    for make in (Producer, PullConsumer):
        with pytest.raises(BadEndpoint, match="'nonsense' is no endpoint of a node"):
            make("nonsense")
    assert not [t.name for t in set(threading.enumerate()) - before if t.name.startswith("mqnode-")]


def test_a_blocking_client_used_after_close_says_so_and_leaves_no_coroutine_behind():
    """(It raised "Event loop is closed" and warned of a coroutine never awaited.)"""
    import gc
    import warnings

    from node.client import Producer, PullConsumer, SendError

    producer, consumer = Producer("tcp://127.0.0.1:1"), PullConsumer("tcp://127.0.0.1:1")
    producer.close()
    consumer.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in (lambda: producer.send("T", b"x"), lambda: consumer.pull("T", 0, 0)):
            with pytest.raises(SendError, match="CLOSED: .*the client was closed"):
                call()
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    producer.close()  # (twice: nothing happens)
