"""SIGINT and SIGTERM, asking a foreground process's main loop to stop, with no lock taken in
the handler.

CPython runs a signal handler in the main thread, between two of its bytecodes. A handler that
calls `threading.Event.set()` takes that Event's lock, which the main thread itself holds for a
few bytecodes of every `Event.wait()`: a signal landing there deadlocks the process, and the
SIGTERM is never answered (an `mqnode consume --push` that did not stop in 30 s under a loaded
test run). `StopSignals` only records the signal; the main loop looks between short sleeps.
"""

from __future__ import annotations

import signal
import time


class StopSignals:
    """Installs itself for `numbers`; `wait(seconds)` sleeps at most that long: whether one came."""

    def __init__(self, numbers=(signal.SIGINT, signal.SIGTERM)):
        self.received: int | None = None
        for number in numbers:
            signal.signal(number, self._record)

    def after(self, earlier: StopSignals) -> StopSignals:
        """This one, installed since, holding what `earlier` received: a library that installs a
        handler of its own (Ray's driver, at `ray.init` joining a cluster, one that dumps a stack
        and ends the process with status 15) is overruled once the caller is done with it."""
        self.received = self.received or earlier.received
        return self

    def _record(self, number: int, _frame) -> None:
        self.received = number  # (nothing more: see the module's docstring)

    def wait(self, seconds: float) -> bool:
        if self.received is None:
            time.sleep(seconds)  # (a signal ends no sleep early, PEP 475: `seconds` bounds the delay)
        return self.received is not None
