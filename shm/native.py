"""The store's C twins (`shm/_dispatch.c`): the dispatcher's scan, index linking, ConsumeQueue runs.

Built at install wherever gcc and the Python headers are. Each module that uses one keeps the
Python code it mirrors as the reference its tests compare against and as the fallback, and
reads NATIVE into a module name of its own, so a test can switch one path at a time.
MQNODE_NATIVE=0 turns them all off.
"""

from __future__ import annotations

import os

try:
    from shm import _dispatch
except ImportError:  # pragma: no cover - built wherever gcc and the Python headers are
    _dispatch = None

NATIVE = _dispatch is not None and os.environ.get("MQNODE_NATIVE", "1") != "0"
