"""The event loop mqnode's own clients, benchmarks and load generators run on.

uvloop when it is installed (a dependency): the asyncio producer spends ~15-20% less CPU per
send on it than on the stock loop (docs/performance.md), since every send resolves a future and
wakes a task. Users' own code may run the async clients on any loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine

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
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def _call(self, coroutine, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def _context(self):
        return self.inner.producer.context

    def close(self) -> None:
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
