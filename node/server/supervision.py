"""Supervision: restarts rate-limited with a back-off, and a node that exits when a service is gone.

Ray restarts a dead actor process by running its constructor again (`max_restarts`, by default
unbounded: `actorMaxRestarts = -1`). Two things Ray does not do are done here:

- **Back-off.** A service that dies again and again (a bug a request triggers, a disk that
  fails every start) would be restarted as fast as Ray can. `RestartBackoff` keeps the start
  times of each service in the run directory; past `BURST` starts within `BURST_WINDOW_S`, each
  start first waits, doubling from `BACKOFF_FIRST_S` up to `actorRestartBackoffMaxMillis`, and a
  service that stayed up `CALM_S` starts afresh. It is a pure policy over a list of times (a
  mock clock drives the tests); the actor host applies its delay before it builds the service.
- **Hung processes.** Every service's loop writes a heartbeat (monotonic ms) into the control
  block each turn, and its actor host writes one before Ray sees it ALIVE. `Watch.hung` names
  the ALIVE services whose heartbeat is older than `processHangTimeoutMillis`: a deadlock,
  SIGSTOP, a disk that never returns. The node kills such a process with SIGKILL; Ray restarts it.
- **Never alive and deaf.** `watch` looks at every service's actor once a second (Ray's GCS
  actor table, through `actor_states`): one DEAD for good (a failed constructor, the restart
  budget of a positive `actorMaxRestarts` spent) or not back within `RESTART_DEADLINE_S` ends the
  whole node with the reason and a non-zero exit, so the process supervisor above it (systemd,
  a container runtime) restarts the node. Restarts are logged as they are seen.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from shm.control_block import INSTANCED, heartbeat_slot, monotonic_ms
from shm.disk import write_whole

BURST = 3
BURST_WINDOW_S = 10.0
BACKOFF_FIRST_S = 0.5
CALM_S = 60.0
HISTORY = 32  # start times kept per service
RESTART_DEADLINE_S = 120.0
PID_CLOCK_SLACK_S = 0.5  # a process's start time (clock ticks) against its pid file's mtime

log = logging.getLogger("mqnode")

__all__ = ["INSTANCED", "heartbeat_slot", "monotonic_ms"]  # the control block's, named here too

@dataclass(frozen=True)
class RestartBackoff:
    """How long a service's next start waits, from the times of its earlier starts."""

    max_s: float

    def delay(self, starts: list[float], now: float) -> float:
        recent = [t for t in starts if now - t < CALM_S]
        if not recent:
            return 0.0
        in_burst = sum(1 for t in recent if now - t < BURST_WINDOW_S)
        if in_burst < BURST:
            return 0.0
        return min(self.max_s, BACKOFF_FIRST_S * 2 ** (len(recent) - BURST))


def record_start(run_dir: Path, label: str, policy: RestartBackoff, clock=time.time) -> float:
    """Append this start to the service's history and return the delay to wait before it. On a
    disk with no room the history stays as it was (replaced whole or not at all): the service
    still starts, its back-off counting the starts written."""
    path = Path(run_dir) / f"{label}.starts"
    try:
        starts = [float(line) for line in path.read_text().split()][-HISTORY:]
    except (OSError, ValueError):
        starts = []
    now = clock()
    delay = policy.delay(starts, now)
    history = "".join(f"{t:.3f}\n" for t in (starts + [now + delay])[-HISTORY:])
    write_whole(path, history.encode(), temporary=path.with_name(f".{path.name}.{os.getpid()}.tmp"), sync=False)
    return delay


def pid_of(pid_file: Path) -> int | None:
    """The pid a service's pid file names, if that process wrote it: a process begun after the
    file was written is not its writer (the writer is gone and the pid reused), and a file left
    by a predecessor names nobody (a service that hung before writing its own)."""
    try:
        pid = int(pid_file.read_text())
        written = pid_file.stat().st_mtime
        return pid if psutil.Process(pid).create_time() <= written + PID_CLOCK_SLACK_S else None
    except (OSError, ValueError, psutil.Error):
        return None


def actor_states(hosts: dict) -> dict[str, dict]:
    """label -> Ray's record of its actor: State (ALIVE, RESTARTING, DEAD, ...), NumRestarts,
    DeathCause. Ray's GCS actor table, which answers without a dashboard."""
    from ray._private import state

    out = {}
    for label, handle in hosts.items():
        out[label] = state.actors(handle._actor_id.hex()) or {}
    return out


class Rendezvous:
    """Where the node's processes find each other: the run directory (ipc sockets, FIFOs) and
    the ring directory (the rings the launcher made), as they stood once the node was ready.
    Removed under a running node (a logout removes $XDG_RUNTIME_DIR), they are not made again:
    the processes still connected go on, but a service restarted from then on could not find the
    others and would serve nothing, silently. `lost` names a directory removed or replaced, or a
    ring gone, and the node exits so that it is restarted whole (fail-stop). (Sockets and FIFOs
    are not looked at one by one: a service that stops unbinds its sockets, and binds them, or
    makes its FIFO, again when it is restarted, after its back-off.)"""

    def __init__(self, directories):
        self.directories = {d: _identity(d) for d in dict.fromkeys(Path(d) for d in directories)}  # (may be one)
        self.rings = [path for directory in self.directories for path in directory.glob("*.ring")]

    def lost(self) -> str | None:
        for directory, identity in self.directories.items():
            try:
                same = _identity(directory) == identity
            except FileNotFoundError:
                same = False
            if not same:
                return _lost(directory)
        gone = [path for path in self.rings if not path.exists()]
        return _lost(gone[0]) if gone else None


def _lost(path: Path) -> str:
    return (f"{path} was removed under the running node: a service restarted now could not find the others "
            f"(keep runDir where nothing cleans it)")


def _identity(path: Path) -> tuple[int, int]:
    info = path.lstat()
    return info.st_dev, info.st_ino


class Watch:
    """What the node's main thread concludes from the actor states, once a second."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.restarts: dict[str, int] = {}
        self.hangs: dict[str, int] = {}
        self.down_since: dict[str, float] = {}

    def hung(self, states: dict[str, dict], heartbeat_ms: dict[str, int], now_ms: int, timeout_ms: int) -> list[str]:
        """The services that are ALIVE to Ray but whose loop has not turned for `timeout_ms`
        (monotonic ms; the actor host beats once before Ray sees it ALIVE); counted in `hangs`."""
        found = []
        for label, info in states.items():
            last = heartbeat_ms.get(label, 0)
            if info.get("State") == "ALIVE" and last and now_ms - last > timeout_ms:
                self.hangs[label] = self.hangs.get(label, 0) + 1
                found.append(label)
        return found

    def statistics(self) -> dict[str, dict]:
        return {label: {"restarts": restarts, "hangs": self.hangs.get(label, 0)}
                for label, restarts in sorted(self.restarts.items())}

    def check(self, states: dict[str, dict]) -> str | None:
        """None while the node can serve; else why it must exit."""
        now = self.clock()
        for label, info in states.items():
            state, restarts = info.get("State", "UNKNOWN"), int(info.get("NumRestarts") or 0)
            if restarts > self.restarts.get(label, 0):
                log.warning("mqnode: service %s restarted (%d restarts so far)", label, restarts)
            self.restarts[label] = restarts
            if state == "DEAD":
                return f"service {label} is dead and cannot be restarted: {_cause(info)}"
            if state == "ALIVE":
                self.down_since.pop(label, None)
                continue
            since = self.down_since.setdefault(label, now)
            if now - since > RESTART_DEADLINE_S:
                return f"service {label} has not come back within {RESTART_DEADLINE_S:.0f} s (state {state})"
        return None


def _cause(info: dict) -> str:
    """The last line of the exception that killed it, where Ray kept one."""
    cause = info.get("DeathCause")
    for path in (("creation_task_failure_context", "formatted_exception_string"),
                 ("actor_died_error_context", "error_message")):
        found = cause
        for attribute in path:
            found = getattr(found, attribute, None)
        if found:
            return str(found).strip().splitlines()[-1][:500]
    return " ".join(str(cause or "no cause recorded").split())[:500]
