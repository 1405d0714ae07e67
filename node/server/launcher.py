"""Starting and stopping a node: lock, recover, publish, launch the actors under Ray, and back.

Start-up (before any actor runs): take the store lock (held by this process until the end),
run recovery (normal after a clean stop, abnormal when the abort file says the last run
crashed), leave the abort file in place while running, publish the recovered positions in the
control block, then launch the actors through Ray and print one `ready` line.

Stop (SIGINT/SIGTERM/SIGHUP): the front refuses new sends, the sends in flight are answered (up to
DRAIN_S), the actors stop in data order (ingress, writer, dispatcher catching up to the end,
flush with a final flush, allocator, front), then the physic checkpoint is forced, a
preallocated segment past the end is removed, the abort file goes, the lock is released and an
embedded Ray is shut down.

Ray is the supervisor only: each actor runs in an `ActorHost` (a Ray actor,
node.server.actor_host) that runs the plain actor's loop in a thread and exits the process if
the loop dies, so Ray restarts it (`actorMaxRestarts`, -1: no limit), after a back-off when it
dies again and again; while it serves, its watch (node.server.node_watch) looks at every actor
and exits non-zero when one is gone for good (node.server.supervision) or the node must restart
to be fenced (node.server.fencing). Actors ask Ray for no CPU: on a 2-core machine, CPU
reservations would only keep them from starting.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from actors.topics import deleted_topics
from node import protocol
from node.server import fencing, logs, preflight, ray_setup, topology
from node.server.actor_host import ActorHost, Held
from node.server.node_watch import NodeWatch
from node.server.signals import StopSignals
from shm import ring
from shm import settings as settings_module
from shm.disk import write_whole
from shm.control_block import (
    FLAG_SHUTTING_DOWN,
    FLAG_WRITABLE,
    ROLE_CODES,
    ControlBlock,
)
from shm.epochs import EpochFile
from shm.recovery import recover
from shm.settings import Settings
from shm.store import MessageStore
from shm.store_files import StoreLock, mark_clean_exit, mark_running

DRAIN_S = 3.0
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0
ANSWER_S = 3.0  # how long a stop waits for every process to answer at all (a built one answers in ms)


class StartInterrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP came while the node started: it is stopped, as after its start."""


class StartFailed(RuntimeError):
    """The node's services did not all start (or reach each other) in time: it is stopped."""


class Node:
    def __init__(self, settings: Settings, *, ray_address: str | None = None, out=print,
                 stops: StopSignals | None = None):
        """`stops`: SIGINT and SIGTERM as `mqnode start` takes them (`run`); one received while the
        node starts ends its start at the next look (StartInterrupted), the node stopped."""
        self.settings = settings
        self.ray_address = ray_address
        self.out = out
        self.stops = stops
        self.lock: StoreLock | None = None
        self.control: ControlBlock | None = None
        self.hosts: dict[str, object] = {}
        self.held_arguments = 0  # the services' constructor arguments in files of the run directory (_held)
        self.started_ray = False
        self.recovery_report = None
        self.fenced_bytes = 0
        self.failure: str | None = None  # why the node must end (`fail`: its watch's word, or its cluster host's)
        self.failed = threading.Event()
        self.watch: NodeWatch | None = None  # while it serves
        self.temporary_run_dir: Path | None = None
        self.run_lock: StoreLock | None = None  # the run directory's (preflight.prepare_run_dir)
        self.ring_dir: Path | None = None  # the rings between its processes (shm.ring), in memory
        self.metrics = None  # node.server.metrics.MetricsServer, with metricsPort set
        self.log_sink: logs.LogSink | None = None  # the services' log lines, to this process's stderr

    # -- start ---------------------------------------------------------------------------------------

    def start(self) -> None:
        from actors import guard

        s = self.settings = settings_module.absolute_paths(self.settings)
        guard.check_settings(s)  # SecurityError: a key or ACL file that cannot be used
        preflight.check_grpc_port(s)
        preflight.check_run_room(s)
        preflight.check_store_disk(s)
        s.root.mkdir(parents=True, exist_ok=True)
        self.lock = StoreLock(s.root)
        self.lock.acquire()
        try:
            queue_offsets, recovered = self._recover()
            self._launch(queue_offsets, recovered)
        except BaseException:
            self.stop()
            raise
        self.out(f"mqnode ready endpoint={s.listen} store={s.root} pid={os.getpid()} "
                 f"recovery={self.recovery_report.mode} offset={recovered} role={s.brokerRole} "
                 f"ha={protocol.host_port(s.ha_host, s.ha_port)}"
                 + (f" grpc={protocol.host_port(s.grpc_host, s.grpc_port)}" if s.grpc_port else ""),
                 flush=True)

    def _recover(self) -> tuple[dict[str, int], int]:
        s = self.settings
        store = MessageStore(s, lock=False)
        try:
            self.recovery_report = recover(store)
            logging.getLogger("mqnode").log(logging.INFO if self.recovery_report.mode == "normal" else logging.WARNING,
                                            "%s", self.recovery_report.summary())
            if s.is_slave:  # before anything reads the log: cut what the master never had
                self.fenced_bytes = fencing.fence(s, store, self.out)
            self._drop_deleted_topics(store)
            blocked = self.recovery_report.dispatch_blocked  # (a full disk: the dispatcher goes on from there)
            store.rebuild_queue_offsets(blocked)
            store.flush_all()
            written = store.commitlog.offset_written
            queue_offsets = dict(store.commitlog.queue_offsets)
            min_offset = store.commitlog.offset_min if store.commitlog.segments.files else written
        finally:
            store.close()
        mark_running(s.root)
        self.control = ControlBlock(s.root / "control", create=True)
        self.control.set("flags", 0)
        dispatched = written if blocked is None else min(blocked, written)
        self.control.publish_recovered(written=written, flushed=written, dispatched=dispatched,
                                       min_offset=min(min_offset, written), broker_permission=s.brokerPermission)
        self.control.set_flag(FLAG_WRITABLE, True)
        self.control.set("role", ROLE_CODES[s.brokerRole])
        if not s.is_slave:  # a master's history begins with its first start (shm.epochs)
            EpochFile(s.root).genesis(min(min_offset, written))
        return queue_offsets, written

    def _drop_deleted_topics(self, store) -> None:
        """The queues of deleted topics whose messages cleaning took or their deletion hid
        (MessageStore.drop_queues_of)."""
        deleted = deleted_topics(self.settings.root / "config")
        dropped = store.drop_queues_of(deleted) if deleted is not None else []
        if dropped:
            logging.getLogger("mqnode").info("dropped %d ConsumeQueues of deleted topics, every message of them cleaned or deleted: %s",
                                             len(dropped), ", ".join(dropped[:10]) + (" ..." if len(dropped) > 10 else ""))

    def _launch(self, queue_offsets: dict[str, int], recovered: int) -> None:
        ray_setup.prepare_embedded(self.ray_address)  # (before Ray is imported)
        import ray

        from actors import guard

        run_dir, self.run_lock = preflight.prepare_run_dir(self.settings)
        if run_dir != self.settings.run_dir:  # a temporary one: removed at stop
            self.temporary_run_dir = run_dir
        s = self.settings = dataclasses.replace(self.settings, runDir=str(run_dir))
        self.log_sink = logs.LogSink(s)  # (before any service logs)
        guard.write_identity(s)  # the account and key pair of the node's own requests (actors.guard)
        self.ring_dir = ring.make_rings(s)  # the hand-offs between processes, before any service opens one
        self.started_ray = ray_setup.init(self.ray_address, ray_setup.session_dir(s), s.rayObjectStoreMemory,
                                          home=run_dir)  # (its session files removed at a clean stop)
        if self.stops is not None:
            self.stops.install()  # (Ray's driver installs a SIGTERM handler of its own that ends the process)
        remote = ray.remote(ActorHost)
        placement = ray_setup.placement(s) if self.ray_address else {}
        kwargs = {"front": {"hosts": topology.hosts(s)}}  # where each service lives, for `admin stats`
        values = self._held(dataclasses.asdict(s))
        recovered_state = self._held({"queue_offsets": queue_offsets, "recovered_offset": recovered})
        for process in topology.processes(s):
            own = {process.kind: {"instance": process.instance}} if process.kind in ("ingress", "pull") else {}
            writes = "writer" in (process.kind, *process.hosted, *process.threads)  # (recovery's state is its)
            self.hosts[process.label] = remote.options(
                num_cpus=0, max_restarts=s.actorMaxRestarts, max_task_retries=0, max_concurrency=4, **placement,
            ).remote(self._held(process), values, self._held(kwargs | own), recovered_state if writes else None)
        late = self._wait_ready()
        if late:
            raise StartFailed(f"services not started within {READY_TIMEOUT_S:g} s: {', '.join(late)} (the log says "
                              "what each did; a service placed on a Ray node without room never starts)")
        self._wait_for_connections()
        ray_setup.private_token_file()
        if self.started_ray:  # (joined to a cluster, or a caller's Ray: its own settings apply)
            ray_setup.check_listeners(self.settings, self.settings.run_dir.glob("*.pid"), os.getpid())
        self.watch = NodeWatch(self.settings, self.hosts, self.control, self.ring_dir, self.fail)
        self.watch.start(head=self.started_ray)
        if self.settings.metricsPort:
            self._serve_metrics()

    def _check_stop_asked(self) -> None:
        if self.stops is not None and self.stops.received is not None:
            raise StartInterrupted(f"{signal.Signals(self.stops.received).name} while starting")

    def _held(self, value):
        """`value` as an actor's constructor argument that lasts while the node runs: Ray fetches
        an actor's arguments again at each of its restarts. One under Ray's inline limit travels
        in the actor's creation task, which Ray keeps; a bigger one (recovery's queue offsets on a
        node of ~5,000 queues) in a file of the run directory that the actor reads
        (`actor_host.Held`: Ray's object store freed it, or logged an error)."""
        import pickle

        data = pickle.dumps(value)
        if len(data) < ray_setup.inline_limit() // 2:  # (cloudpickle's size may differ a little)
            return value
        self.held_arguments += 1
        path = self.settings.run_dir / f"argument-{self.held_arguments}.pickle"
        if not write_whole(path, data, sync=False, mode=0o600):  # (a crash restarts the node whole: no fsync)
            raise StartFailed(f"no room in the run directory for {path.name} ({len(data)} bytes): a service's start "
                              "arguments")
        return Held(str(path))

    def _wait_ready(self) -> list[str]:
        """The labels of the processes not ready within READY_TIMEOUT_S. One ask at a time is
        outstanding for each, so one still in its constructor (or not placed by Ray) holds
        back no look at the others, nor at a stop signal (every half second). One that died
        while it opened (a file the clean service deleted under it, say) is being restarted by
        Ray: it is asked again, as the supervisor would."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        deadline, pending, asked = time.monotonic() + READY_TIMEOUT_S, set(self.hosts), {}
        while pending and time.monotonic() < deadline:
            self._check_stop_asked()
            for label in pending - set(asked.values()):
                asked[self.hosts[label].wait_ready.remote(0.5)] = label
            answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=0.5)
            for reference in answered:
                label = asked.pop(reference)
                try:
                    if ray.get(reference):
                        pending.discard(label)
                except (ActorUnavailableError, RayActorError):
                    time.sleep(0.1)  # restarting: asked again
        return sorted(pending)

    def _serve_metrics(self) -> None:
        """/metrics (node.server.metrics); a queue's max offset from the launcher's own read-only
        view of the ConsumeQueues, following the clean service's deletions."""
        from node.server.metrics import MetricsServer
        from shm.reader import StoreReader

        reader, lock, seen = StoreReader(self.settings), threading.Lock(), [0]

        def max_offset(topic: str, queue_id: int, dispatched: int) -> int:
            with lock:
                if self.control.get("deletions") != seen[0]:
                    seen[0] = self.control.get("deletions")
                    reader.follow_min_offset(self.control.get("min_offset"))
                return reader.queue(topic, queue_id, dispatched).max_offset

        self.metrics_reader = reader
        self.metrics = MetricsServer(self.settings, max_offset)

    def _wait_for_connections(self) -> None:
        """Actors connect to each other asynchronously (one that connected before the front bound
        retries 100 ms later): `ready` is printed only once a read makes the round trip front ->
        pull worker -> front, a send-back of no message the one front -> schedule -> front, a
        look at a group's pop state the one front -> pop -> front, and one at the transactions
        front -> transaction -> front."""
        from actors import guard
        from node.server.asker import NodeAsker

        # (`indexed`: answered at once, not after the dispatcher catches up: on a full disk it may not yet)
        probes = [({"code": protocol.GET_MAX_OFFSET, "topic": "SELF_TEST_TOPIC", "queueId": 0, "indexed": True}, {"OK"})]
        if "schedule" in topology.hosts(self.settings):  # answered "no message at offset ..."
            probes.append(({"code": protocol.CONSUMER_SEND_MSG_BACK, "consumerGroup": "SELF_TEST_GROUP",
                            "offset": 2**63 - 1}, {"SYSTEM_ERROR"}))
        if "pop" in topology.hosts(self.settings):  # front -> pop -> front
            probes.append(({"code": protocol.GET_POP_STATE, "consumerGroup": "SELF_TEST_GROUP"}, {"OK"}))
        probes.append(({"code": protocol.GET_TRANSACTION_STATE, "limit": 0}, {"OK"}))  # front -> transaction -> front
        asker = NodeAsker(self.settings.local_endpoint, guard.node_credentials(self.settings), timeout_ms=1000)
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            for header, answers in probes:
                while not _answered(asker, header, answers):
                    self._check_stop_asked()
                    if time.monotonic() > deadline:
                        raise StartFailed("the node's services did not connect to each other within "
                                          f"{READY_TIMEOUT_S:g} s")
                    time.sleep(0.05)
        finally:
            asker.close()

    # -- running ---------------------------------------------------------------------------------------

    def statistics(self) -> dict[str, dict]:
        import ray

        labels = list(self.hosts)
        values = ray.get([self.hosts[label].statistics.remote() for label in labels], timeout=10)
        return dict(zip(labels, values))

    def fail(self, failure: str) -> None:
        """The node must end (its watch's word, or its cluster host's): the first reason is the one said."""
        self.failure = self.failure or failure
        self.failed.set()

    def serve_forever(self) -> int:
        """Block until SIGINT, SIGTERM or SIGHUP, then stop: 0. Or until a service is gone for good
        (node.server.supervision): say why, stop, 1."""
        stops = self.stops or StopSignals()
        stops.install()
        while not stops.wait(0.2) and not self.failed.is_set():
            pass
        if self.failure is not None:
            self.out(f"mqnode failed: {self.failure}; exiting so the node is restarted whole", file=sys.stderr, flush=True)
        self.out("mqnode stopping", flush=True)
        self.stop()
        self.out("mqnode stopped", flush=True)
        return 0 if self.failure is None else 1

    # -- stop ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        import ray

        if self.metrics is not None:
            self.metrics.stop()
            self.metrics_reader.close()
            self.metrics = None
        if self.watch is not None:  # first: it must not kill or judge what is being stopped
            self.watch.stop()
            self.watch = None
        if self.hosts:
            answering = self._answering()
            self._drain(answering)
            for stage in self._stop_stages():
                for label in [label for label in stage if label not in answering]:
                    logging.getLogger("mqnode").warning(
                        "service %s did not answer (still starting, restarting or never placed): killed, not stopped", label)
                asked = [self.hosts[label].stop.remote(STOP_TIMEOUT_S) for label in stage if label in answering]
                if asked:  # (a dead or stuck actor's stop fails or times out: killed below with the rest)
                    ray.wait(asked, num_returns=len(asked), timeout=STOP_TIMEOUT_S + 2)
            for host in self.hosts.values():
                ray.kill(host, no_restart=True)
            self.hosts.clear()
        if self.control is not None:
            self._finish_store()
        if self.started_ray:
            ray_setup.shutdown()
            self.started_ray = False
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.run_lock is not None:
            self.run_lock.release()
            self.run_lock = None
        if self.temporary_run_dir is not None:
            shutil.rmtree(self.temporary_run_dir, ignore_errors=True)
            self.temporary_run_dir = None
        if self.ring_dir is not None:  # memory, not disk: given back at stop
            shutil.rmtree(self.ring_dir, ignore_errors=True)
            self.ring_dir = None
        if self.log_sink is not None:  # last: the services' last lines
            self.log_sink.stop()
            self.log_sink = None

    def _answering(self) -> set[str]:
        """The labels of the processes whose actor answers within ANSWER_S. One that does not is
        still in its constructor (opening, or sleeping out a restart's back-off), being
        restarted, or not placed by Ray at all: it has served nothing, and a graceful stop would
        only wait STOP_TIMEOUT_S for it, one after another (a node none of whose services
        started took ~80 s to stop). Ray kills it with the rest, as a kill -9 it recovers from."""
        import ray

        asked = {host.wait_ready.remote(0): label for label, host in self.hosts.items()}
        answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=ANSWER_S)
        return {asked[reference] for reference in answered}

    def _drain(self, answering: set[str]) -> None:
        import ray

        front = self.hosts.get("front")
        if front is not None and "front" in answering:
            try:
                ray.get(front.call.remote("drain_mode"), timeout=5)
                deadline = time.monotonic() + DRAIN_S
                while time.monotonic() < deadline:
                    if ray.get(front.statistics.remote(), timeout=5)["inFlight"] == 0:
                        break
                    time.sleep(0.02)
            except Exception:
                pass  # the front is gone: nothing more can be answered anyway
        self.control.set_flag(FLAG_SHUTTING_DOWN, True)

    def _stop_stages(self) -> list[list[str]]:
        """Every process, in stages stopped one after another, the processes of a stage together.
        First those that feed the write path from inside the node (the schedule service's
        deliveries, the transaction service's ends, the pop service's retries, the gRPC proxy's
        sends; the clean service and any other with them), after the front's drain: what they
        had in flight is answered, and what they send now is refused (SERVICE_NOT_AVAILABLE),
        not stored, so they send it again after the restart, once. Their drains keep what was
        answered (delay offsets and the timer checkpoint, the pop log's snapshot, the checks'
        position), which a kill would lose (a clean stop's next start then delivered the last
        seconds' delayed messages again).
        Then whoever appends (a writer's drain commits a write buffer's tail), then the
        dispatcher and the flush actor, which catch up with it. The front goes last, unless it
        is the writer: then right after the pull workers, whose held pulls it still answers."""
        ingress = [label for label in self.hosts if label.startswith("ingress")]
        pulls = [label for label in self.hosts if label.startswith("pull")]
        front = ["front"] * ("front" in self.hosts)
        rest = [label for label in ("ha-client", "writer", "dispatcher", "flush", "allocator", "ha-server")
                if label in self.hosts]
        if topology.hosts(self.settings)["write"] == ["front"]:  # the front's process writes
            order = ingress + pulls + front + rest
        else:
            order = ingress + rest + pulls + front
        return [[label for label in self.hosts if label not in order]] + [[label] for label in order]

    def _finish_store(self) -> None:
        """After the actors: everything written is durable, the end is exact, the exit is clean."""
        from shm.checkpoint import Checkpoint
        from shm.commitlog import CommitLog

        s = self.settings
        written = self.control.get("written")
        log = CommitLog(s.commitlog_dir, s.mappedFileSizeCommitLog)
        log.segments.load()
        for segment in log.segments.files:
            if segment.offset_start >= written and segment.offset_start > 0:
                segment.destroy()  # preallocated, never written
            elif segment.offset_start <= written:
                os.fdatasync(segment.fd)
        log.segments.files = [f for f in log.segments.files if f.fd >= 0]
        log.close()
        checkpoint = Checkpoint(s.root / "checkpoint")
        stamp = self.control.get("store_timestamp")
        if stamp > 0:
            checkpoint.flush_physic(stamp)
        checkpoint.close()
        self.control.advance("flushed", max(written, self.control.get("flushed")))
        self.control.close()
        self.control = None
        if s.root.exists():
            mark_clean_exit(s.root)


def _answered(asker, header: dict, answers: set[str]) -> bool:
    """One probe of `_wait_for_connections`: whether its answer (within 1 s) is one expected."""
    try:
        return asker.ask(header).get("status") in answers
    except TimeoutError:
        return False


# A path the node cannot use as it is: not its user's to write, a read-only file system, a file
# where a directory must be (or the other way round).
PATH_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR)


def run(settings: Settings, ray_address: str | None = None) -> int:
    """`mqnode start`: this process is the node's. Its own lines go to stdout; anything else
    printed there (Ray's driver) goes to the log on stderr (logs.ForeignLines)."""
    settings = settings_module.absolute_paths(settings)  # (logDir's files among them)
    out = logs.OwnLines(logs.configure(settings, "launcher", relay=False))
    stops = StopSignals()  # (before the start: a signal while it starts stops it cleanly, not with a traceback)
    node = Node(settings, ray_address=ray_address, out=out, stops=stops)
    try:
        node.start()
    except StartInterrupted as e:  # (the node is stopped already)
        out(f"mqnode stopped: {e}", flush=True)
        return 0
    except (ray_setup.ForeignListener, StartFailed) as e:  # (the node is stopped already)
        out(f"mqnode failed: {e}", file=sys.stderr, flush=True)
        return 1
    except OSError as e:
        if e.filename and e.errno in PATH_ERRORS:  # (the host's doing, not the node's: no traceback)
            out(f"mqnode failed: cannot use {e.filename}: {e.strerror} (this process runs as uid {os.getuid()})",
                file=sys.stderr, flush=True)
            return 1
        if e.errno not in ray_setup.LIMIT_ERRORS:
            raise
        out(f"mqnode failed: {e}: {ray_setup.host_limits()}", file=sys.stderr, flush=True)
        return 1
    return node.serve_forever()


if __name__ == "__main__":  # pragma: no cover - the CLI's `start` is the way in
    sys.exit(run(settings_module.load()))
