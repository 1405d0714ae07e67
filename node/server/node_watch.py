"""A running node's watch: two threads of the launcher, each looking once a second.

- `_watch`: every service's actor in Ray's table (restarts logged, a service gone for good),
  the run and ring directories still there (supervision.Rendezvous), a slave's log waiting
  for a fencing (node.server.fencing.pending), and every process's heartbeat: a hung one is
  killed, so Ray restarts it. What it counted goes to the front's `admin stats`.
- `_watch_head`: the embedded Ray's GCS and raylet still there.

Either calls `fail(reason)` (the launcher's `Node.fail`) when the node must end; the launcher then
stops it and exits 1, so that whatever supervises it restarts it whole (docs/operations.md).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import orjson

from node.server import fencing, ray_setup, supervision, topology
from node.server.supervision import heartbeat_slot, monotonic_ms
from shm.disk import write_whole


def stalest(beats) -> int:
    """The oldest of a process's heartbeats (monotonic ms), 0 while none was written."""
    written = [beat for beat in beats if beat]
    return min(written) if written else 0


class NodeWatch:
    """The watch threads of one node's launcher (see the module's docstring)."""

    def __init__(self, settings, hosts: dict, control, ring_dir: Path | None, fail):
        self.settings, self.hosts, self.control, self.ring_dir, self.fail = settings, hosts, control, ring_dir, fail
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, *, head: bool) -> None:
        """The watch; with `head`, the embedded Ray's own processes too (this node started them)."""
        targets = [(self._watch, "mqnode-watch")] + [(self._watch_head, "mqnode-watch-head")] * head
        self.threads = [threading.Thread(target=target, name=name, daemon=True) for target, name in targets]
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(10)

    def _watch(self) -> None:
        """Once a second: restarts logged, hung services killed, a service gone for good ends
        the node (`fail`); what it counted goes to the front's admin stats."""
        watch = supervision.Watch()
        try:
            rendezvous = supervision.Rendezvous([self.settings.run_dir, self.ring_dir])
            while not self.stopping.wait(1.0):
                states = supervision.actor_states(self.hosts)
                failure = watch.check(states) or rendezvous.lost() or fencing.pending(self.settings, self.control)
                if failure is not None:
                    self.fail(failure)
                    return
                self._kill_hung(watch, states)
                self._publish(watch)
        except Exception as e:  # (a node nobody supervises must not go on: fail-stop)
            logging.getLogger("mqnode").exception("mqnode: the supervision thread failed")
            self.fail(f"the supervision thread failed: {e!r}")

    def _watch_head(self) -> None:
        """Once a second: the embedded Ray's GCS and raylet still there, or the node ends. A
        thread of its own: `_watch` asks the GCS about the actors, and a GCS killed during one of
        those calls held it for Ray's 60 s of reconnecting, the node serving unsupervised."""
        while not self.stopping.wait(1.0):
            failure = ray_setup.head_lost()
            if failure:
                self.fail(failure)
                return

    def _kill_hung(self, watch: supervision.Watch, states: dict[str, dict]) -> None:
        """SIGKILL every service whose loop stopped turning (Ray then restarts it). One whose pid
        file is not its own (it hung before writing it: a worker Ray could not start on a full
        disk, say) is killed through Ray, never by a pid that may be another process's now."""
        import ray

        beats = {process.label: process.beats for process in topology.processes(self.settings)}
        heartbeats = {label: stalest(self.control.heartbeat_of(heartbeat_slot(beat)) for beat in beats.get(label, (label,)))
                      for label in states}
        for label in watch.hung(states, heartbeats, monotonic_ms(), self.settings.processHangTimeoutMillis):
            pid = supervision.pid_of(self.settings.run_dir / f"{label}.pid")
            logging.getLogger("mqnode").warning("mqnode: service %s (pid %s) is hung: killing it", label,
                                                pid or "unknown: through Ray")
            try:
                if pid:
                    os.kill(pid, signal.SIGKILL)
                else:
                    ray.kill(self.hosts[label], no_restart=False)
            except (OSError, ValueError):
                pass  # gone already: Ray restarts it either way

    def _publish(self, watch: supervision.Watch) -> None:
        """What the watch counted, for the front's admin stats (a small file in the run directory)."""
        # (a full disk: the figures stay a second old until there is room)
        write_whole(self.settings.run_dir / "supervision.json", orjson.dumps(watch.statistics()), sync=False)
