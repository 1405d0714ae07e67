"""SIGINT, SIGTERM and SIGHUP, asking a foreground process's main loop to stop, with no lock
taken in the handler. (SIGHUP: the terminal or the session it runs in is gone; its default action
ended the process at once, and a node's store then recovered as after a crash.)

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

    def __init__(self, numbers=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
        self.numbers = numbers
        self.received: int | None = None
        self.install()

    def install(self) -> None:
        """(Again) the handler for `numbers`: a library that installed one of its own since (Ray's
        driver, at `ray.init` joining a cluster: it dumps a stack and ends the process with status
        15) is overruled once the caller is done with it; a signal received meanwhile is kept."""
        for number in self.numbers:
            signal.signal(number, self._record)

    def _record(self, number: int, _frame) -> None:
        self.received = number  # (nothing more: see the module's docstring)

    def wait(self, seconds: float) -> bool:
        if self.received is None:
            time.sleep(seconds)  # (a signal ends no sleep early, PEP 475: `seconds` bounds the delay)
        return self.received is not None
