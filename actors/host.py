"""host: one process running several services' shells, each the same shell that runs alone.

The topology (node.server.topology) gives a process one service or several. A process with
several runs a `Host`: its `members` share the process's loop (one wait over every member's
sockets and descriptors, the shortest timeout, then each member's `step` in order, and the
first's once more if the others left it something: the write shell's replies go out in the turn
that brought their sends), and its
`threads` each run their own loop on a thread of the process (the compact front's group commit,
whose fdatasync must not stop the loop). A member is an ordinary actor (actors.base.Actor) that
gives its turn as `poll_items`/`timeout_ms`/`step`; whether it runs alone or here, it runs the
same code. Between members the links are local (actors.links.LocalLinks: objects in a deque,
no encoding), made before any member opens.

The host writes the process's heartbeat and pid file, pushes each member's statistics once a
second, passes a deletion (`follow_min_offset`) to every member; a thread member writes its own
heartbeat (node.server.topology: `Process.threads`), so a hung fdatasync is found by the node's
watch as a hung loop is. Any member's exception, or a thread member's death, ends the process
(fail-stop; Ray restarts it, and the restart is recovery).

Stop: the members drain last to first (the write shell's drain commits a write buffer's tail),
then each thread stops and drains (the group commit flushes and answers what it holds, through
its link to the router), and the first member drains last: the router answers what came back.
"""

from __future__ import annotations

import sys
import threading
import time

import orjson
import zmq

from actors.base import POLL_MS, Actor, wait_readable
from actors.links import LocalLinks

THREAD_STOP_S = 30.0
# A thread member woken by its eventfd (the group commit: held sends came) needs the GIL while the
# loop runs Python; CPython makes it wait up to the switch interval (5 ms) for it. With thread
# members the process asks for the GIL's hand-over after this instead (its own setting, no host's).
THREAD_SWITCH_S = 0.0005
NOTHING: frozenset = frozenset()  # no socket ready: a step for what local links brought


class Host(Actor):
    def __init__(self, settings, label: str, members: list[Actor], threads: list[Actor] = ()):
        super().__init__(settings)
        assert members, "a host runs at least one member in its loop"
        self.name = label
        self.members = list(members)
        self.threads = list(threads)
        self.runners: list[threading.Thread] = []
        self.failures: dict[str, BaseException] = {}  # a thread member's exception, for the process's own
        self.links: LocalLinks | None = None

    @property
    def main(self) -> Actor:
        return self.members[0]

    def open(self) -> None:
        shells = self.members + self.threads
        self.links = LocalLinks(self.settings, [m.label for m in self.members], [t.label for t in self.threads])
        for shell in shells:
            shell.local_links = self.links
            shell.neighbours = [other for other in shells if other is not shell]
        for member in self.members:
            member.control = self.control
            member.removals_seen = self.removals_seen
            member.deletions_followed = self.deletions_followed
            member.open()
        if self.threads:
            sys.setswitchinterval(min(sys.getswitchinterval(), THREAD_SWITCH_S))
        for shell in self.threads:  # (each opens in its own thread: its loop owns its sockets)
            shell.pid_file = False  # (the process's is the host's)
            runner = threading.Thread(target=self._run_thread, args=(shell,), name=f"mqnode-{shell.label}", daemon=True)
            runner.start()
            self.runners.append(runner)
        for shell, runner in zip(self.threads, self.runners):
            while not shell.ready.wait(0.05):
                if not runner.is_alive():
                    raise RuntimeError(f"{shell.label} failed to open")

    def turn(self) -> None:
        items, timeout = [], POLL_MS
        for member in self.members:
            items += member.poll_items()
            timeout = min(timeout, member.timeout_ms())
        events = wait_readable(items, timeout)
        self._follow_removals()  # (as Actor.turn: before the members' steps)
        self._follow_topic_deletions()
        for member in self.members:
            member.step(events)
            member.loops += 1
        if self.links.waiting(self.main.label):  # replies the others made this turn: out now, not a turn later
            self.main.step(NOTHING)
        for shell, runner in zip(self.threads, self.runners):
            if not runner.is_alive():
                failure = self.failures.get(shell.label)
                raise RuntimeError(f"{self.label}: its {shell.label} thread died: {failure!r}") from failure

    def _run_thread(self, shell: Actor) -> None:
        try:
            shell.run()
        except BaseException as e:  # (raised again by the loop's next turn: the process fails)
            self.failures[shell.label] = e

    def follow_min_offset(self, min_offset: int) -> None:
        for member in self.members:
            member.follow_min_offset(min_offset)  # (a thread member follows by its own housekeeping)

    def follow_topic_deletions(self) -> None:
        for member in self.members:
            member.follow_topic_deletions()

    def drain(self) -> None:
        for member in reversed(self.members[1:]):
            member.drain()
        for shell, runner in zip(self.threads, self.runners):
            shell.stop()
            runner.join(THREAD_STOP_S)
        self.main.drain()

    def statistics(self) -> dict:
        return self.main.statistics()  # (each member's own go out in `_housekeeping`)

    def _housekeeping(self) -> None:
        due = time.monotonic() >= self._stats_due
        super()._housekeeping()  # (its own statistics are its main member's)
        if due:
            for member in self.members[1:]:
                try:
                    self._stats_socket.send(orjson.dumps(member.statistics()), zmq.NOBLOCK)
                except zmq.Again:
                    pass

    def close(self) -> None:
        for shell in self.threads:  # (a thread that has not finished yet: stopped here)
            shell.stop()
        for runner in self.runners:
            runner.join(THREAD_STOP_S)
        for member in reversed(self.members):
            member.control = None  # (the host's, closed below)
            member.close()
        if self.links is not None:
            self.links.close()
        super().close()
