"""`mqnode stop`: stop the node that runs on a store and wait until it has stopped (RocketMQ's
`mqshutdown broker`). The node is found by its store: the process holding the store's lock
(`shm.store_files.StoreLock.holder`), which must be a `mqnode start`; it gets SIGTERM, which
stops it as at a terminal (sends in flight answered, everything flushed, a normal recovery
next: docs/operations.md), and this command waits until its launcher has exited.

Prints `mqnode stopped pid=N store=DIR` and exits 0; exits 1, saying why on stderr, when no node
runs on the store, when what holds the lock is not a `mqnode start` (a node of `mqnode cluster`
is stopped by `cluster down`, and any other holder is left alone), or when the node has not
stopped within --timeout seconds."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import psutil

from node.tools import cli_values as values

WAIT_STEP_S = 0.1


def add_parser(commands, add_store_options, settings_from) -> None:
    """`settings_from(args)`: the command's settings (--store, --conf, --<setting>), as `start` reads them."""
    stop = commands.add_parser("stop", help="stop the node running on a store (SIGTERM to its launcher) and wait "
                                            "until it has stopped")
    add_store_options(stop)
    stop.add_argument("--timeout", type=values.SECONDS, default=60.0,
                      help="seconds to wait for the node to stop (default 60); exit 1 after them")
    stop.set_defaults(handler=lambda args: stop_node(settings_from(args).root, args.timeout))


def stop_node(store: Path, timeout: float) -> int:
    from shm.store_files import StoreLock

    pid = StoreLock(store).holder()
    if pid is None:
        return _fail(f"no node runs on {store} (nothing holds its lock)")
    if pid == 0:
        return _fail(f"{store} is held by a process in another PID namespace: stop it there")
    try:
        process = psutil.Process(pid)
        why = _not_a_node(process.cmdline())
        if why:
            return _fail(f"{store} is held by pid {pid}, {why}: not stopped")
        process.send_signal(signal.SIGTERM)
        if not _ended(process, timeout):
            return _fail(f"the node on {store} (pid {pid}) has not stopped after {timeout:g} s; it is still "
                         "stopping, or hung (its log says which)")
    except psutil.NoSuchProcess:
        pass  # (it ended between the look and the signal: stopped either way)
    except psutil.AccessDenied:
        return _fail(f"{store} is held by pid {pid}, which this user may not signal")
    print(f"mqnode stopped pid={pid} store={store}", flush=True)
    return 0


def _ended(process: psutil.Process, timeout: float) -> bool:
    """Whether `process` ended within `timeout` seconds: gone, or a zombie its parent has not
    reaped yet (psutil's wait takes a zombie for alive)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(WAIT_STEP_S)
    return False


def _not_a_node(argv: list[str]) -> str:
    """Why the process of command line `argv` is not a node's launcher ('' when it is one)."""
    if argv and argv[0].startswith("ray::"):
        return f"a Ray actor ({argv[0]}): a node of `mqnode cluster`, stopped by `mqnode cluster down`"
    for i, part in enumerate(argv[:-1]):  # (`python -m node.tools.cli start`: scripts/mqnode; or the installed `mqnode start`)
        if (part == "node.tools.cli" or Path(part).name == "mqnode") and argv[i + 1] == "start":
            return ""
    return f"which is not a `mqnode start` ({' '.join(argv)[:200]})"


def _fail(text: str) -> int:
    print(f"mqnode stop: {text}", file=sys.stderr)
    return 1
