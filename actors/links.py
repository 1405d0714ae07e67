"""Links: the write path's hand-offs between the node's processes, through rings in shared memory.

A link is one `shm.ring` (one producer process, one consumer process) plus the consumer's
doorbell (`actors.base.Doorbell`, a FIFO in the run directory that every producer of that
consumer rings). Each hop carries one message a loop turn at most (a turn's sends, a turn's
replies), so its cost is paid per turn, not per message (docs/architecture.md).

`shm.ring.rings(settings)` declares every link of the write path under the split topology;
the launcher makes their files before any service starts (node.server.launcher) and each service
opens the ends it owns. The compact topology has none: its front hosts the write path.

| link                  | producer  | consumer  | carries                                     |
|-----------------------|-----------|-----------|---------------------------------------------|
| front-to-writer       | front     | writer    | sends to encode (ingressWorkers = 0)        |
| front-to-ingress-i    | front     | ingress-i | sends to encode                             |
| ingress-i-to-writer   | ingress-i | writer    | encoded groups                              |
| ingress-i-to-front    | ingress-i | front     | replies to the sends it refused             |
| writer-to-front       | writer    | front     | replies                                     |
| writer-to-flush       | writer    | flush     | SYNC_FLUSH / SYNC_MASTER sends held         |
| flush-to-front        | flush     | front     | replies of the held sends                   |

Message formats are actors.wire's: a turn's sends or an encoded group as length-prefixed
frames (`join_frames`), replies as `pack_replies`, held sends as `waits_to_wire`.
"""

from __future__ import annotations

import time

from actors.base import Doorbell
from shm.ring import Ring, RingFull, inbound, ring_dir, wake_path

FULL_WAIT_S = 30.0  # a producer whose consumer takes nothing for this long stops (its restart is recovery)


class Outbox:
    """The producer's end of one link."""

    def __init__(self, settings, name: str):
        self.name = name
        self.ring = Ring(ring_dir(settings) / f"{name}.ring")
        self.bell = Doorbell(wake_path(settings, name.rpartition("-to-")[2]), listen=False)
        self.waited_s = 0.0
        self.rung = 0

    def send(self, parts) -> bool:
        """Publish one message and wake the consumer; False when the ring is full."""
        try:
            self.ring.offer(parts)
        except RingFull:
            return False
        if self.ring.consumer_may_sleep():  # (a busy consumer takes it at its next turn unrung)
            self.bell.ring()
            self.rung += 1
        return True

    def send_waiting(self, parts) -> None:
        """Publish one message that must not be dropped (replies, held sends, encoded groups),
        waiting while the consumer catches up; a consumer that takes nothing for FULL_WAIT_S
        (gone for good, or hung and about to be killed) stops this process."""
        if self.send(parts):
            return
        began = time.monotonic()
        while not self.send(parts):
            self.bell.ring()
            if time.monotonic() - began > FULL_WAIT_S:
                raise RuntimeError(f"link {self.name}: its consumer took nothing for {FULL_WAIT_S:.0f} s")
            time.sleep(0.0005)
        self.waited_s += time.monotonic() - began

    def statistics(self) -> dict:
        return self.ring.statistics() | {"waitedSeconds": round(self.waited_s, 3), "rung": self.rung}

    def close(self) -> None:
        self.bell.close()
        self.ring.close()


class Inbox:
    """A consumer's ends of all its links, and its doorbell (one descriptor to poll)."""

    def __init__(self, settings, consumer: str):
        self.bell = Doorbell(wake_path(settings, consumer), listen=True)
        self.rings = {name: Ring(ring_dir(settings) / f"{name}.ring") for name in inbound(settings, consumer)}

    def fileno(self) -> int:
        return self.bell.fileno()

    def wait_ms(self, timeout_ms: int) -> int:
        """How long the consumer may wait on its doorbell: 0 when a message came since its last
        take, else `timeout_ms` (and the producers now ring: shm.ring's sleeping flag)."""
        pending = False
        for ring in self.rings.values():
            pending |= ring.about_to_sleep()
        return 0 if pending else timeout_ms

    def take(self, limit: int = 8 * 1024 * 1024) -> list[bytes]:
        """Every message waiting on any link (about `limit` bytes a link at most). The doorbell
        is drained first: a ring after this finds the messages it announces, or wakes us again."""
        self.bell.drain()
        out: list[bytes] = []
        for ring in self.rings.values():
            out += ring.take(limit)  # (what a limit leaves makes the next `wait_ms` 0: no sleep)
        return out

    def statistics(self) -> dict:
        return {name: ring.statistics() for name, ring in self.rings.items()}

    def close(self) -> None:
        self.bell.close()
        for ring in self.rings.values():
            ring.close()


def first_keeping_up(outboxes: list[Outbox], turn_bytes: int) -> Outbox:
    """Where a turn's sends go: the first ingress worker whose ring holds less than a turn's worth
    (`turn_bytes`) not yet taken, else the one with the least. Load spills over to the next worker
    only while the ones before it are behind, so on a host with few cores the workers not needed
    stay asleep (each wake-up of a process costs CPU), and on a busy host with many cores they
    all work."""
    best = outboxes[0]
    for out in outboxes:
        pending = out.ring.pending_bytes()
        if pending < turn_bytes:
            return out
        if pending < best.ring.pending_bytes():
            best = out
    return best
