"""node.server.signals: a SIGTERM landing while the main thread holds an Event's lock (as it does
for a few bytecodes of every Event.wait) is still taken: the handler takes no lock."""

from __future__ import annotations

import subprocess
import sys

from nodes import ROOT

# the window Event.wait() holds its lock in, made wide: a handler calling event.set() would
# block on that lock forever (the main thread holds it), so the child would never print
CHILD = """
import os, signal, threading
from node.server.signals import StopSignals
stops, event = StopSignals(), threading.Event()
with event._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    taken = stops.received
print(taken == signal.SIGTERM, stops.wait(5))
"""


def test_a_signal_that_lands_while_the_main_thread_holds_a_lock_is_taken():
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stderr
