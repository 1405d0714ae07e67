"""`--chaos`: kill -9 an actor or the whole node at random instants, restart what was killed;
or stop the whole node cleanly (SIGTERM, as `mqnode stop`) under the load and start it again.

With `--slave`, the slave is a target too: its whole node (`slave`) or one of its processes
(`slave:ha-client`, ...), and the master's `ha-server` is among the master's processes.

The schedule is seeded (`--seed`): the same seed gives the same pauses and the same choice of
target, so a failing run replays. An actor is killed by the pid in `<runDir>/<label>.pid`, and
Ray restarts it (the node is started with a high `actorMaxRestarts`); the strike waits until a
new process has written that pid file. The whole node is killed as a process tree, then started
again on the same store and port, which runs abnormal recovery. A clean stop (`stop`) must end
the node with status 0 within STOP_LIMIT seconds, and its restart must find a clean exit
(`recovery=normal`): a stop that loses, duplicates or hangs under load fails the run or its
verification. Every strike is an event in the results, with how long the node took to come back.
"""

from __future__ import annotations

import random
import signal
import threading
import time

import psutil

from node.tools.local_node import NodeProcess

NODE = "node"
STOP = "stop"            # the whole master node stopped cleanly (SIGTERM), then started again
SLAVE = "slave"
NODE_SHARE = 1 / 3       # of strikes that take down the whole node (a third of those a clean stop), the rest one actor
STOP_SHARE = 1 / 3
RECOVERY_LIMIT = 120.0   # seconds a restart may take before the run fails
STOP_LIMIT = 60.0        # seconds a clean stop may take before the run fails
MAX_STRIKES = 1000


class Chaos:
    def __init__(self, node: NodeProcess, seed: int, interval: tuple[float, float], slave: NodeProcess | None = None):
        self.node = node
        self.slave = slave
        self.rng = random.Random(seed)
        self.interval = interval
        self.events: list[dict] = []
        self.failure: str | None = None
        self.quiet = threading.Event()  # set by the coordinator: no new strikes
        self.thread = threading.Thread(target=self._run, name="chaos", daemon=True)

    def start(self) -> Chaos:
        self.thread.start()
        return self

    def stop(self) -> None:
        """No new strikes; waits for one in progress to finish its restart."""
        self.quiet.set()
        self.thread.join(RECOVERY_LIMIT + 30)

    def _run(self) -> None:
        for _ in range(MAX_STRIKES):
            if self.quiet.wait(self.rng.uniform(*self.interval)):
                return
            labels = self.node.actor_labels()
            if self.slave is not None:
                labels += [SLAVE] + [f"{SLAVE}:{label}" for label in self.slave.actor_labels()]
            target = self.choose(labels)
            try:
                self.events.append(self.strike(target))
            except Exception as e:  # a node that does not come back fails the run
                self.failure = f"{target}: {type(e).__name__}: {e}"
                self.events.append({"t": time.time(), "target": target, "error": self.failure})
                return

    def choose(self, labels: list[str]) -> str:
        if not labels or self.rng.random() < NODE_SHARE:
            return STOP if self.rng.random() < STOP_SHARE else NODE
        return self.rng.choice(labels)

    def strike(self, target: str) -> dict:
        began = time.time()
        node, _, label = target.partition(":") if target.startswith(SLAVE) else (NODE, "", target)
        process = self.slave if node == SLAVE else self.node
        if target == STOP:
            pid = process.process.pid
            self._stop_and_start(process)
        elif target in (NODE, SLAVE):
            pid = process.process.pid
            process.kill_all()
            process.start(timeout=RECOVERY_LIMIT)
        else:
            pid = self._kill_actor(process, label)
        return {"t": began, "target": target, "pid": pid, "recoveredAfter": round(time.time() - began, 3)}

    @staticmethod
    def _stop_and_start(node: NodeProcess) -> None:
        """SIGTERM under the load: it must exit 0 (sends in flight answered, everything flushed,
        every service stopped) and its next start must be a normal recovery."""
        code = node.stop(timeout=STOP_LIMIT, strict=False)
        if code != 0:
            raise RuntimeError(f"a clean stop under load ended with status {code}")
        seen = node.log.stat().st_size
        node.start(timeout=RECOVERY_LIMIT)
        ready = [line for line in node.log.read_bytes()[seen:].splitlines() if line.startswith(b"mqnode ready")]
        if not ready or b"recovery=normal" not in ready[-1]:
            raise RuntimeError(f"the start after a clean stop was not a normal recovery: {ready[-1:]}")

    def _kill_actor(self, node: NodeProcess, label: str) -> int:
        path = node.settings.run_dir / f"{label}.pid"
        pid = int(path.read_text())
        try:
            psutil.Process(pid).send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
        deadline = time.monotonic() + RECOVERY_LIMIT
        while time.monotonic() < deadline:
            try:
                if int(path.read_text()) != pid:
                    return pid
            except (OSError, ValueError):
                pass  # being rewritten
            time.sleep(0.05)
        raise TimeoutError(f"actor {label} was not restarted within {RECOVERY_LIMIT:.0f} s")
