"""The Ray actor each of a node's processes is: it builds the process's shells
(node.server.topology) and runs the plain actor's loop in a thread, and exits the process when
that loop dies, so Ray restarts it (`actorMaxRestarts`), after a back-off when it dies again and
again (node.server.supervision). node.server.launcher starts one per process.

Its own module, apart from the launcher's: Ray loads the module of an actor's class in every
fresh worker, at each of a node's starts and at every restart; the launcher's recovery and store
(and numpy with them) are not a service's to load (~0.2 CPU-s a process where the service does
not read queues: tests/unit/test_topology.py)."""

from __future__ import annotations

import logging
import os
import threading
import time

from actors.base import injected_start_hang
from node.server import logs, ray_setup, supervision, topology
from shm import settings as settings_module
from shm.control_block import ControlBlock, heartbeat_slot, monotonic_ms


class Held:
    """A service's constructor argument past Ray's inline limit, kept in a file of the node's run
    directory (private to the node's user) and read by the actor at each of its starts. In Ray's
    object store, the argument was freed once the actor had started if Ray stored it (every
    restart then failed), and when the launcher held it instead Ray's core worker logged an error
    at each start that a restart "will fail" (ray-project/ray#53727), nested in another object
    or not."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def resolved(value):
        """`value`, or what a Held's file holds."""
        if not isinstance(value, Held):
            return value
        import pickle

        with open(value.path, "rb") as file:
            return pickle.load(file)  # (the node's own file, in its 0700 run directory)


class ActorHost:
    """A plain actor inside a Ray actor process."""

    def __init__(self, process: topology.Process, settings_values: dict, kwargs: dict[str, dict],
                 recovered: dict | None = None):
        """`recovered`: recovery's state for the write service (its queue offsets), for the process
        that runs it; the launcher passes it as an object it holds (resolved here at each start)."""
        process, settings_values, kwargs, recovered = map(Held.resolved, (process, settings_values, kwargs,
                                                                                    recovered))
        ray_setup.normal_priority()
        ray_setup.more_open_files()
        ray_setup.steady_heap()
        settings = settings_module.load(None, settings_values)
        logs.configure(settings, process.label, relay=True)  # (to the launcher's stderr: node.server.logs)
        policy = supervision.RestartBackoff(settings.actorRestartBackoffMaxMillis / 1000)
        delay = supervision.record_start(settings.run_dir, process.label, policy)
        if delay:  # it keeps dying: give whatever kills it time to pass
            logging.getLogger("mqnode").warning("service %s restarts in %.1f s", process.label, delay)
            time.sleep(delay)
        if injected_start_hang(process.label):  # (tests only: MQNODE_INJECT_BUG)
            time.sleep(3600)
        self.actor = topology.build(process, settings, kwargs if recovered is None else kwargs | {"writer": recovered})
        for beat in process.beats:  # alive from Ray's view on: a predecessor's stale beats are not ours
            _beat(settings, beat)
        self.thread = threading.Thread(target=self._run, name=f"mqnode-{process.label}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.actor.run()
        except BaseException as e:
            # out of descriptors or mappings: a limit of the host's, which every restart meets again
            limited = isinstance(e, OSError) and e.errno in ray_setup.LIMIT_ERRORS
            advice = f": {ray_setup.host_limits()}" if limited else ""
            logging.getLogger("mqnode").exception("actor %s died%s", self.actor.label, advice)
            os._exit(1)  # let Ray restart the process: a fresh start resumes from the files

    def wait_ready(self, timeout: float) -> bool:
        return self.actor.ready.wait(timeout)

    def statistics(self) -> dict:
        return self.actor.statistics()

    def call(self, method: str):
        return getattr(self.actor.main, method)()

    def stop(self, timeout: float) -> bool:
        self.actor.stop()
        self.thread.join(timeout)
        return not self.thread.is_alive()


def _beat(settings, label: str) -> None:
    control = ControlBlock(settings.root / "control")
    try:
        control.heartbeat(heartbeat_slot(label), monotonic_ms())
    finally:
        control.close()
