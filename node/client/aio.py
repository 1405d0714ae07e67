"""The event loop mqnode's own clients, benchmarks and load generators run on.

uvloop when it is installed (a dependency): the asyncio producer spends ~15-20% less CPU per
send on it than on the stock loop (docs/performance.md), since every send resolves a future and
wakes a task. Users' own code may run the async clients on any loop.
"""

from __future__ import annotations

import asyncio
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


_DETACHED: set[asyncio.Task] = set()


def detach(coroutine: Coroutine) -> asyncio.Task:
    """Run `coroutine` on its own, answered by nobody: the loop keeps only a weak reference to a
    task, so one nobody holds may be collected mid-way (asyncio's documentation); this set holds
    it until it ends."""
    task = asyncio.ensure_future(coroutine)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)
    return task
