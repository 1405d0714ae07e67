"""What every actor shares: endpoints, the run-loop skeleton, statistics pushed to the front.

An actor is a plain class: `start()` opens its files and sockets, `run()` loops until `stop()`
is called (from any thread), `statistics()` says what it has done. Ray only hosts it
(`node.server.actor_host.ActorHost`); a test can run one in a thread. Each loop turn is bounded (a poll timeout,
a cap on messages taken per turn), so `stop()` takes effect within one turn.

A turn is three steps a service may give separately: `poll_items()` (what it waits on),
`timeout_ms()` (how long it may wait), `step(events)` (what it does with what is ready). A
service written so can share its process's loop with others (actors.host): the compact
topology's front process runs the router, write and read shells in one loop, the same shells
that run alone in the split topology.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import orjson
import zmq
from zmq.backend import zmq_poll

from node.frames import recv_frame, recv_frames, recv_frames_sourced
from shm.control_block import INSTANCED, ControlBlock, heartbeat_slot, monotonic_ms
from shm.disk import write_whole

POLL_MS = 50  # longest a loop sleeps before it looks at its stop flag again
STATS_PERIOD_S = 1.0
def endpoints(settings) -> dict[str, str]:
    """The node's internal ipc endpoints, under its run directory."""
    run = settings.run_dir
    return {name: f"ipc://{run}/{name}" for name in ("replies", "stats", "arrivals", "reput", "clean", "schedule",
                                                      "reput-in", "reput-out", "ha-admin", "transaction-checks")}


def socket(context: zmq.Context, kind: int, *, hwm: int = 10000) -> zmq.Socket:
    s = context.socket(kind)
    s.setsockopt(zmq.LINGER, 0)  # never hang at close on unsent messages
    s.setsockopt(zmq.SNDHWM, hwm)
    s.setsockopt(zmq.RCVHWM, hwm)
    return s


def conflated(context: zmq.Context, kind: int) -> zmq.Socket:
    """A socket that keeps only the latest message (wake-ups: one pending says it all)."""
    s = socket(context, kind, hwm=1)
    s.setsockopt(zmq.CONFLATE, 1)  # before bind/connect
    return s



def write_pid_file(path: Path) -> None:
    """This process's pid in `path`, whole or not at all: a reader (an operator, a test, the
    launcher's listener check) never sees a restarted process's file empty or half written. On a
    full disk the file goes instead: a predecessor's pid left there would name another process
    (the launcher kills a hung service by its pid file)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if not write_whole(path, f"{os.getpid()}\n".encode(), temporary=temporary, sync=False):
        path.unlink(missing_ok=True)


class Doorbell:
    """A wake-up between two processes of the node through a FIFO in the run directory: one
    byte rung, any number drained at once (conflated, as a wake-up should be). Cheaper than a
    ZeroMQ message on the paths a SYNC_MASTER send waits on: a ZeroMQ hop wakes the sender's
    I/O thread and the receiver's before the receiver, a FIFO only the receiver (measured:
    SYNC_MASTER with 64 senders, docs/performance.md).

    The listener opens it read-write, so it never reads as hung up while no ringer has it open;
    a ringer whose listener is not there (yet, or restarting) rings nothing and tries again at
    its next ring. Its descriptor goes into zmq_poll beside the sockets."""

    def __init__(self, path: Path, *, listen: bool):
        self.path = Path(path)
        self.fd = -1
        self.listening = listen
        if listen:
            if not self.path.exists():
                try:
                    os.mkfifo(self.path, 0o600)
                except FileExistsError:
                    pass
            self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)

    def fileno(self) -> int:
        return self.fd

    def ring(self) -> None:
        if self.fd < 0:
            try:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no listener (ENXIO) or no FIFO yet: its own timer covers the miss
                return
        try:
            os.write(self.fd, b"\0")
        except BlockingIOError:
            pass  # rung already, many times: the listener has enough to wake on
        except OSError:
            os.close(self.fd)  # the listener's FIFO is gone: opened again at the next ring
            self.fd = -1

    def drain(self) -> None:
        for _ in range(64):
            try:
                if len(os.read(self.fd, 4096)) < 4096:
                    return
            except BlockingIOError:
                return

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def doorbell(settings, name: str, *, listen: bool) -> Doorbell:
    """The node's doorbell `name` (`ha-wake`: written moved, to the ha-server; `acked`: a slave
    acked more, to whoever holds the SYNC_MASTER sends)."""
    return Doorbell(Path(settings.run_dir) / f"{name}.fifo", listen=listen)


def give_way(niceness: int) -> int:
    """Run the calling thread (on Linux nice is a thread's) at `niceness` unless it already runs
    lower: background work yields the CPU to the front and the clients, and on an idle CPU it
    runs as before. Best effort, as raising priority back would need privilege. Returns the
    thread's niceness."""
    try:
        if niceness > os.getpriority(os.PRIO_PROCESS, 0):
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
        return os.getpriority(os.PRIO_PROCESS, 0)
    except OSError:
        return 0


class InjectedBug(RuntimeError):
    """A bug put in on purpose (MQNODE_INJECT_BUG), to test fail-stop and supervision."""


def _injected(label: str) -> list[str]:
    """What `MQNODE_INJECT_BUG` (in the environment of the node's processes; tests only) puts
    into process `label`: comma-separated `label:what` entries, `*` for every process."""
    out = []
    for entry in os.environ.get("MQNODE_INJECT_BUG", "").split(","):
        target, _, what = entry.strip().partition(":")
        if target in (label, "*"):
            out.append(what)
    return out


def injected_bug_code(label: str) -> int | None:
    """`front:4242`: the request code that makes the front raise InjectedBug."""
    return next((int(what) for what in _injected(label) if what.isdigit()), None)


def injected_start_hang(label: str) -> bool:
    """`schedule:hang-start`: process `label`'s actor never finishes starting (its constructor
    sleeps), as one stuck opening a file or never placed by Ray."""
    return "hang-start" in _injected(label)


def injected_bug_turn(label: str) -> int | None:
    """`dispatcher:turn=300`: the loop turn at which the process raises InjectedBug."""
    return next((int(what[5:]) for what in _injected(label) if what.startswith("turn=") and what[5:].isdigit()),
                None)


class Actor:
    name = "actor"

    def __init__(self, settings, *, instance: int = 0):
        self.settings = settings
        self.instance = instance
        self.endpoints = endpoints(settings)
        self.context = zmq.Context.instance()
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.started_at = time.time()
        self.loops = 0
        self.errors = 0
        self.control: ControlBlock | None = None
        self._stats_socket: zmq.Socket | None = None
        self._stats_due = 0.0
        self.pid_file = True  # <runDir>/<label>.pid, for operators and tests: one a process (not for a host's threads)
        self.local_links = None  # actors.links.LocalLinks: set by the process's host (actors.host), if any
        self.neighbours: list[Actor] = []  # the other shells its process hosts (actors.host)

    @property
    def label(self) -> str:
        return f"{self.name}-{self.instance}" if self.name in INSTANCED else self.name

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        Path(self.settings.run_dir).mkdir(parents=True, exist_ok=True)
        if self.pid_file:
            write_pid_file(self.settings.run_dir / f"{self.label}.pid")
        self.control = ControlBlock(self.settings.root / "control")
        self.beat()  # alive while it opens (an open that takes long beats as it goes: `beat`)
        self.removals_seen = self.control.removals()
        self.deletions_followed = self.control.get("topics_deleted")  # (before `open` reads the floors)
        self._stats_socket = socket(self.context, zmq.PUSH, hwm=10)
        self._stats_socket.connect(self.endpoints["stats"])
        self.open()

    def open(self) -> None:
        """Files and sockets of the actor (subclasses)."""

    def run(self) -> None:
        """The loop; returns after `stop()`. Opens and closes the sockets in this thread."""
        self.start()
        self.ready.set()
        bug_turn = injected_bug_turn(self.label)
        try:
            while not self.stopping.is_set():
                self.turn()
                self.loops += 1
                if self.loops == bug_turn:
                    raise InjectedBug(f"{self.label}: turn {bug_turn} (MQNODE_INJECT_BUG)")
                self._housekeeping()
            self.drain()
        finally:
            self.close()

    def turn(self) -> None:
        events = wait_readable(self.poll_items(), self.timeout_ms())
        self._follow_removals()  # (before the step: what woke it may be a queue made again in their place)
        self._follow_topic_deletions()
        self.step(events)

    def poll_items(self) -> list:
        """What this turn waits on: [(socket or descriptor, zmq.POLLIN), ...] (services that `step`)."""
        raise NotImplementedError

    def timeout_ms(self) -> int:
        """How long this turn may wait for them."""
        return POLL_MS

    def step(self, events: set) -> None:
        """The turn's work, `events` being the ready sockets and descriptors of every shell of
        the process (a service looks only at its own)."""
        raise NotImplementedError

    def drain(self) -> None:
        """Finish what is in hand after stop (subclasses)."""

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        for value in list(vars(self).values()):
            if isinstance(value, zmq.Socket):
                value.close(0)
        if self.control is not None:
            self.control.close()
            self.control = None

    @property
    def main(self) -> Actor:
        """The service the launcher's calls (`drain_mode`, statistics) are for: itself (a host: its first)."""
        return self

    # -- statistics ------------------------------------------------------------------------------

    def statistics(self) -> dict:
        return {"actor": self.label, "pid": os.getpid(), "uptimeSeconds": round(time.time() - self.started_at, 1),
                "loops": self.loops, "errors": self.errors}

    def follow_min_offset(self, min_offset: int) -> None:
        """The clean service deleted files below the CommitLog's min offset: drop what this
        process maps of them, which frees their space (subclasses holding mappings)."""

    def follow_topic_deletions(self) -> None:
        """topics.json's deletion floors changed (a topic was deleted): subclasses that read
        queues read them again (actors.topics.deletion_floors)."""

    def _follow_topic_deletions(self) -> None:
        deleted = self.control.get("topics_deleted")
        if deleted != self.deletions_followed:
            self.deletions_followed = deleted
            self.follow_topic_deletions()

    def _follow_removals(self) -> None:
        removals = self.control.removals()
        if removals != self.removals_seen:  # the clean service deleted files, or the dispatcher queues
            self.removals_seen = removals
            self.follow_min_offset(self.control.get("min_offset"))

    def beat(self) -> None:
        """This service is alive: its heartbeat, which the launcher's watch reads (a service
        that beats no more within processHangTimeoutMillis is killed and restarted)."""
        self.control.heartbeat(heartbeat_slot(self.label), monotonic_ms())

    def _housekeeping(self) -> None:
        now = time.monotonic()
        self.beat()
        self._follow_removals()
        self._follow_topic_deletions()
        if now >= self._stats_due:
            self._stats_due = now + STATS_PERIOD_S
            try:
                self._stats_socket.send(orjson.dumps(self.statistics()), zmq.NOBLOCK)
            except zmq.Again:
                pass  # the front is gone or slow: statistics are best effort


# -- receiving without pyzmq's conveniences on the hot path -------------------------------------
# Measured on a lone request (docs/performance.md): `Socket.poll` builds a Poller per call, a
# NOBLOCK recv that finds nothing raises zmq.Again (errno lookup, enum conversion), and
# `Poller.poll` rebuilds its lists each call. Together ~40 µs of a ~180 µs writer turn.


def wait_readable(items: list, timeout_ms: int) -> set:
    """Which sockets of `items` ([(socket, zmq.POLLIN), ...]) are readable, waiting up to
    `timeout_ms`: zmq_poll directly (~1.5 µs instead of ~5-15 through Poller or Socket.poll)."""
    return {sock for sock, _ in zmq_poll(items, timeout_ms)}


def incoming(sock: zmq.Socket, limit: int, *, multipart: bool = True, sourced: bool = False):
    """The messages waiting on `sock` now, at most `limit`, without blocking: zmq_poll before
    each recv, so a drained socket ends the loop without raising zmq.Again. With `sourced`, each
    as (frames, its first frame: where it came from, node.frames.recv_frames_sourced)."""
    items = [(sock, zmq.POLLIN)]
    for _ in range(limit):
        if not zmq_poll(items, 0):
            return
        try:
            yield recv_frames_sourced(sock) if sourced else recv_frames(sock) if multipart else recv_frame(sock)
        except zmq.Again:  # raced away (not expected: each socket has one reader)
            return
