"""The event loop mqnode's own clients, benchmarks and load generators run on.

uvloop when it is installed (a dependency): the asyncio producer spends ~15-20% less CPU per
send on it than on the stock loop (docs/performance.md), since every send resolves a future and
wakes a task. Users' own code may run the async clients on any loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Coroutine

from node.client.errors import SendError

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency; the stock loop works the same
    uvloop = None


def new_event_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def run(coroutine: Coroutine):
    """`asyncio.run` on the fastest loop available."""
    return uvloop.run(coroutine) if uvloop is not None else asyncio.run(coroutine)


def close_stopped(loop: asyncio.AbstractEventLoop) -> None:
    """Close a blocking client's private loop once its thread has stopped it: a stopped loop keeps
    its descriptors (its epoll and wake-up fds, five a client), and an application that made a
    client per task ran out of open files after ~200 of them."""
    if not loop.is_running() and not loop.is_closed():
        loop.close()


EXIT_JOIN_S = 1.0  # how long the exit waits for each loop left running to stop
_RUNNING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a blocking client's thread -> its loop


_pid = os.getpid()  # this process's, kept by a fork hook: a blocking call asks it without a syscall


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class ForkedClient(RuntimeError):
    """A blocking client used in a process forked after it was made (os.fork, multiprocessing's
    fork start method): its loop thread and its ZeroMQ context's threads stayed in the parent, as
    every thread does, and the call would wait forever. Make the client in the child."""


class LoopThread(threading.Thread):
    """A blocking client's loop thread, knowing the process it runs in (`made_in`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str):
        super().__init__(target=loop.run_forever, name=name, daemon=True)
        self.loop, self.made_in = loop, _pid

    def forked(self) -> bool:
        """Whether this is a process forked from the one the thread runs in."""
        return _pid != self.made_in

    def submit(self, coroutine) -> concurrent.futures.Future:
        """`coroutine` run on the loop; ForkedClient in a forked process."""
        if self.forked():
            coroutine.close()
            raise ForkedClient(f"{self.name}: a client made in process {self.made_in} was used in {_pid}, "
                               "forked from it after it was made: make the client in the process that uses it")
        if self.loop.is_closed():  # ("Event loop is closed", and a warning of a coroutine never awaited)
            coroutine.close()
            raise SendError("CLOSED", f"{self.name}: the client was closed (or shut down): make a new one")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)


def start_loop_thread(loop: asyncio.AbstractEventLoop, name: str) -> LoopThread:
    """`loop` run on a daemon thread of its own (a blocking client's), stopped at the latest when
    the interpreter exits (`_stop_loops_at_exit`)."""
    thread = LoopThread(loop, name)
    thread.start()
    _RUNNING[thread] = loop
    return thread


@atexit.register
def _stop_loops_at_exit() -> None:
    """Stop the loops of the clients a program left open, before the interpreter finalizes. A
    daemon thread's loop left running sleeps through the finalization, and a timer that fired in
    the process's last moments (uvloop takes the GIL for it, with no interpreter left) ended the
    program with SIGSEGV: once in ~60 runs of a script that never closed its clients. Handlers a
    program registers after importing the clients run before this one: they may still close them."""
    running = [(thread, loop) for thread, loop in list(_RUNNING.items()) if thread.is_alive() and loop.is_running()]
    for thread, loop in running:
        try:  # (its tasks cancelled first: each ends as it would at a close, and none is left pending)
            asyncio.run_coroutine_threadsafe(_cancel_tasks(), loop).result(EXIT_JOIN_S)
        except Exception:  # (concurrent.futures' CancelledError and TimeoutError among them)
            pass  # (stuck, or stopping meanwhile: stopped all the same)
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:
            pass  # (closed meanwhile)
        thread.join(EXIT_JOIN_S)
        if not thread.is_alive():
            close_stopped(loop)


async def _cancel_tasks() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


_DETACHED: set[asyncio.Task] = set()


def detach(coroutine: Coroutine) -> asyncio.Task:
    """Run `coroutine` on its own, answered by nobody: the loop keeps only a weak reference to a
    task, so one nobody holds may be collected mid-way (asyncio's documentation); this set holds
    it until it ends."""
    task = asyncio.ensure_future(coroutine)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)
    return task


class Blocking:
    """The blocking form of an asyncio client: `inner`, made and run on a private event-loop
    thread; each call waits for its result there. Thread-safe. A subclass starts the thread
    (`_start_loop`), makes `inner` with `_call`, and names the ZeroMQ context it made (`_context`),
    which `close` ends after `inner.close()`."""

    inner = None

    def _start_loop(self, name: str) -> None:
        self.loop = new_event_loop()
        self.thread = start_loop_thread(self.loop, name)

    def _call(self, coroutine, timeout: float | None = None):
        return self.thread.submit(coroutine).result(timeout)

    def _made(self, coroutine):
        """`coroutine`'s result: the client made or started on its loop. When that fails (a bad
        endpoint) the loop's thread goes, and a ZeroMQ context the client holds as `context`, rather
        than staying until the exit (a program that retries would gather them)."""
        try:
            return self._call(coroutine)
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            close_stopped(self.loop)
            if getattr(self, "context", None) is not None:
                self.context.term()
            raise

    def _context(self):
        return self.inner.producer.context

    def close(self) -> None:
        if self.thread.forked():  # (the parent's to close: its threads and sockets are not here)
            return
        if self.loop.is_running():
            self._call(self.inner.close())
            context = self._context()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            context.term()
        close_stopped(self.loop)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
