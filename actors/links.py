"""Links: the hand-offs between the node's processes, through rings in shared memory.

A link is one `shm.ring` (one producer process, one consumer process) plus the consumer's
doorbell (`actors.base.Doorbell`, a FIFO in the run directory that every producer of that
consumer rings). Each hop carries one message a loop turn at most (a turn's sends, a turn's
replies), so its cost is paid per turn, not per message (docs/architecture.md); a read is a
message of its own.

`shm.ring.rings(settings)` declares every link between two processes; the launcher makes their
files before any service starts (node.server.launcher) and each service opens the ends it owns.
The write path's links exist under split only (compact's front hosts the write path); the read
path's to each pull worker under split; the pop and transaction services' (each a process of
its own) in both.

| link                  | producer  | consumer  | carries                                     |
|-----------------------|-----------|-----------|---------------------------------------------|
| front-to-writer       | front     | writer    | sends to encode (ingressWorkers = 0)        |
| front-to-ingress-i    | front     | ingress-i | sends to encode                             |
| ingress-i-to-writer   | ingress-i | writer    | encoded groups                              |
| ingress-i-to-front    | ingress-i | front     | replies to the sends it refused             |
| writer-to-front       | writer    | front     | replies                                     |
| writer-to-flush       | writer    | flush     | SYNC_FLUSH / SYNC_MASTER sends held         |
| flush-to-front        | flush     | front     | replies of the held sends                   |
| front-to-pull-i       | front     | pull-i    | reads, each to the first worker keeping up (`SpreadOutbox`) |
| pull-i-to-front       | pull-i    | front     | read replies, with their records (`ReplyOutbox`) |
| front-to-pop          | front     | pop       | pops, acks, peeks; answers to its re-puts   |
| pop-to-front          | pop       | front     | their replies, with the popped records (`ReplyOutbox`); its re-puts (dead letters) |
| front-to-transaction  | front     | transaction | transactions' ends, GET_TRANSACTION_STATE; answers to its re-puts |
| transaction-to-front  | transaction | front   | their replies (`ReplyOutbox`); its re-puts (commits, op records) |

Message formats are actors.wire's: a turn's sends or an encoded group as length-prefixed
frames (`join_frames`), replies as `pack_replies`, held sends as `waits_to_wire`. Each end is
given the codec of its link (`encode` at the producer, `decode` at the consumer), so a service
sends and takes Python objects whichever way the link runs.

When both ends of a link are shells hosted by one process (actors.host: the compact topology's
front hosts the router, write, read and, on a thread, group commit), the link is a `LocalLink`
instead: a deque of those objects, no bytes at all, and an eventfd that wakes a consumer on
another thread. `LocalLinks` makes a process's local links before its shells open; `outbox`
and `inbox` give a shell the right end whichever process hosts it, so no service asks which
topology it runs in.

| local link (compact) | producer  | consumer  | carries                                      |
|----------------------|-----------|-----------|----------------------------------------------|
| front-to-pull-0      | front     | pull-0    | read requests (header, client, arrival, raw) |
| pull-0-to-front      | pull-0    | front     | read replies                                 |
"""

from __future__ import annotations

import os
import time
from collections import deque

import zmq

from actors.base import Doorbell, socket
from actors.wire import pack_replies, reply_size
from node.frames import send_frames
from shm.ring import Ring, RingFull, inbound, ring_dir, wake_path

FULL_WAIT_S = 30.0  # a producer whose consumer takes nothing for this long stops (its restart is recovery)


class Outbox:
    """The producer's end of one link between processes: a ring. `encode` turns the object a
    service sends into the message's parts (bytes)."""

    local = False

    def __init__(self, settings, name: str, encode=None):
        self.name = name
        self.consumer = name.rpartition("-to-")[2]  # (the consumer's process label)
        self.encode = encode
        self.ring = Ring(ring_dir(settings) / f"{name}.ring")
        self.bell = Doorbell(wake_path(settings, self.consumer), listen=False)
        self.waited_s = 0.0
        self.rung = 0

    def send(self, item) -> bool:
        """Publish one message and wake the consumer; False when the ring is full."""
        return self._offer(item if self.encode is None else self.encode(item))

    def send_waiting(self, item) -> None:
        """Publish one message that must not be dropped (replies, held sends, encoded groups),
        waiting while the consumer catches up; a consumer that takes nothing for FULL_WAIT_S
        (gone for good, or hung and about to be killed) stops this process."""
        parts = item if self.encode is None else self.encode(item)
        if self._offer(parts):
            return
        began = time.monotonic()
        while not self._offer(parts):
            self.bell.ring()
            if time.monotonic() - began > FULL_WAIT_S:
                raise RuntimeError(f"link {self.name}: its consumer took nothing for {FULL_WAIT_S:.0f} s")
            time.sleep(0.0005)
        self.waited_s += time.monotonic() - began

    @property
    def max_message(self) -> int:
        return self.ring.max_message

    def pending_bytes(self) -> int:
        return self.ring.pending_bytes()

    def _offer(self, parts) -> bool:
        try:
            self.ring.offer(parts)
        except RingFull:
            return False
        if self.ring.consumer_may_sleep():  # (a busy consumer takes it at its next turn unrung)
            self.bell.ring()
            self.rung += 1
        return True

    def statistics(self) -> dict:
        return self.ring.statistics() | {"waitedSeconds": round(self.waited_s, 3), "rung": self.rung}

    def close(self) -> None:
        self.bell.close()
        self.ring.close()


class Inbox:
    """A consumer's ends of all its links: rings from other processes (with its doorbell) and
    local links from shells of its own process. `decode` turns a ring's message into the object
    its producer sent; a local link's objects come as they were sent."""

    local = False

    def __init__(self, settings, consumer: str, decode=None, local: list[LocalLink] | tuple = ()):
        local_names = {link.name for link in local}  # (a link its process hosts both ends of is never a ring)
        names = [name for name in inbound(settings, consumer) if name not in local_names]
        self.bell = Doorbell(wake_path(settings, consumer), listen=True) if names else None
        self.rings = {name: Ring(ring_dir(settings) / f"{name}.ring") for name in names}
        self.from_local = list(local)
        self.decode = decode

    def poll_items(self) -> list:
        items = [(self.bell.fileno(), zmq.POLLIN)] if self.bell is not None else []
        return items + [item for link in self.from_local for item in link.poll_items()]

    def wait_ms(self, timeout_ms: int) -> int:
        """How long the consumer may wait on its doorbell: 0 when a message came since its last
        take, else `timeout_ms` (and the producers now ring: shm.ring's sleeping flag)."""
        pending = False
        for ring in self.rings.values():
            pending |= ring.about_to_sleep()
        for link in self.from_local:
            pending |= link.about_to_sleep()
        return 0 if pending else timeout_ms

    def take(self, limit: int = 8 * 1024 * 1024) -> list:
        """Every message waiting on any link (about `limit` bytes a ring at most). The doorbell
        is drained first: a ring after this finds the messages it announces, or wakes us again."""
        out: list = []
        if self.bell is not None:
            self.bell.drain()
            decode = self.decode
            for ring in self.rings.values():  # (what a limit leaves makes the next `wait_ms` 0: no sleep)
                out += ring.take(limit) if decode is None else [decode(message) for message in ring.take(limit)]
        for link in self.from_local:
            out += link.take()
        return out

    def statistics(self) -> dict:
        return {name: ring.statistics() for name, ring in self.rings.items()}

    def close(self) -> None:
        if self.bell is not None:
            self.bell.close()
        for ring in self.rings.values():
            ring.close()


MAX_LOCAL = 100_000  # objects a local link holds; past it the producer waits, as on a full ring


class LocalLink:
    """A link whose two ends are shells of one process (actors.host): a deque of the objects
    sent, no encoding. Its consumer may run on another thread (the compact front's group commit),
    so it is woken through an eventfd, and only when it may be asleep: the consumer sets
    `sleeping` and then looks at the deque once more (`about_to_sleep`), the producer appends and
    then looks at `sleeping`. Under the GIL each of these steps is atomic and they are seen in
    order, so either the consumer sees the object or the producer rings (the ring's protocol,
    shm.ring, without a fence)."""

    local = True
    max_message = 1 << 62  # (nothing is copied: any request fits)

    def __init__(self, name: str, *, threads: bool = True):
        self.name = name
        self.items: deque = deque()
        self.sleeping = False
        # between two shells of one loop nobody sleeps apart: the loop looks at the deque itself
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) if threads else -1
        self.sent = self.rung = 0
        self.waited_s = 0.0

    def fileno(self) -> int:
        return self.fd

    def send(self, item) -> bool:
        """Hand `item` to the consumer; False while MAX_LOCAL wait (it is behind)."""
        if len(self.items) >= MAX_LOCAL:
            return False
        self.items.append(item)
        self.sent += 1
        if self.sleeping and self.fd >= 0:
            self.sleeping = False
            os.eventfd_write(self.fd, 1)
            self.rung += 1
        return True

    def send_waiting(self, item) -> None:
        """As `Outbox.send_waiting`: a consumer that takes nothing for FULL_WAIT_S stops this process."""
        began = time.monotonic()
        while not self.send(item):
            if time.monotonic() - began > FULL_WAIT_S:
                raise RuntimeError(f"link {self.name}: its consumer took nothing for {FULL_WAIT_S:.0f} s")
            time.sleep(0.0005)
        self.waited_s += time.monotonic() - began

    def poll_items(self) -> list:  # (a consumer with only this link takes it as its inbox)
        return [(self.fd, zmq.POLLIN)] if self.fd >= 0 else []

    def wait_ms(self, timeout_ms: int) -> int:
        return 0 if self.about_to_sleep() else timeout_ms

    def about_to_sleep(self) -> bool:
        """The consumer, before it waits: True when something is waiting (then it must not)."""
        self.sleeping = True
        return bool(self.items)

    def take(self) -> list:
        self.sleeping = False
        if self.fd >= 0:
            try:
                os.eventfd_read(self.fd)
            except BlockingIOError:
                pass  # not rung
        items, out = self.items, []
        for _ in range(len(items)):  # (what a producer on another thread adds meanwhile waits a turn)
            out.append(items.popleft())
        return out

    def pending_bytes(self) -> int:
        return 0  # (as a ring that keeps up: `first_keeping_up` looks no further)

    def statistics(self) -> dict:
        return {"local": True, "sent": self.sent, "pending": len(self.items), "rung": self.rung,
                "waitedSeconds": round(self.waited_s, 3)}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def local_link_ends(settings) -> dict[str, tuple[str, str]]:
    """Every link a shell may have with another shell: name -> (producer, consumer), both shell
    labels. Those whose two ends a process hosts together are local (`LocalLinks`); the others
    are rings (shm.ring.rings)."""
    ends = {"front-to-writer": ("front", "writer"), "writer-to-front": ("writer", "front"),
            "writer-to-flush": ("writer", "flush"), "flush-to-front": ("flush", "front"),
            "front-to-pull-0": ("front", "pull-0"), "pull-0-to-front": ("pull-0", "front")}
    for i in range(settings.ingressWorkers):
        ends |= {f"front-to-ingress-{i}": ("front", f"ingress-{i}"),
                 f"ingress-{i}-to-writer": (f"ingress-{i}", "writer"),
                 f"ingress-{i}-to-front": (f"ingress-{i}", "front")}
    return ends


class LocalLinks:
    """The local links of one process: those whose producer and consumer are both among the
    shells it hosts (`loop`: the shells of its loop; `threads`: those on threads of their own).
    Made before any of them opens."""

    def __init__(self, settings, loop, threads=()):
        self.links: dict[str, LocalLink] = {}
        self.by_consumer: dict[str, list[LocalLink]] = {}
        labels = {*loop, *threads}
        for name, (producer, consumer) in local_link_ends(settings).items():
            if producer in labels and consumer in labels:
                self.links[name] = LocalLink(name, threads=producer in threads or consumer in threads)
                self.by_consumer.setdefault(consumer, []).append(self.links[name])

    def get(self, name: str) -> LocalLink | None:
        return self.links.get(name)

    def waiting(self, consumer: str) -> bool:
        """Whether a local link into `consumer` holds something."""
        for link in self.by_consumer.get(consumer, ()):
            if link.items:
                return True
        return False

    def into(self, consumer: str) -> list[LocalLink]:
        return self.by_consumer.get(consumer, [])

    def close(self) -> None:
        for link in self.links.values():
            link.close()


def outbox(actor, name: str, encode=None) -> Outbox | LocalLink:
    """The producer's end of link `name` for `actor`: local when its process hosts the consumer."""
    local = actor.local_links.get(name) if actor.local_links is not None else None
    return local if local is not None else Outbox(actor.settings, name, encode)


def reply_outbox(actor) -> ReplyOutbox:
    """A read service's replies to the front: its ring, and the `replies` socket for a reply no
    ring message holds."""
    replies = socket(actor.context, zmq.PUSH, hwm=100000)
    replies.connect(actor.endpoints["replies"])
    return ReplyOutbox(Outbox(actor.settings, f"{actor.label}-to-front"), replies)


def service_links_statistics(requests: Inbox, replies: ReplyOutbox) -> dict:
    """A read-side service's rings, by name (`statistics()`' `links`)."""
    return requests.statistics() | {replies.name: replies.statistics()}


def inbox(actor, decode=None) -> Inbox:
    """Every link into `actor` (by its label): rings from other processes, local links from its own."""
    local = actor.local_links.into(actor.label) if actor.local_links is not None else ()
    return Inbox(actor.settings, actor.label, decode, local)


READ_SPILL_BYTES = 8 * 1024  # reads (~250 bytes each) a pull worker has not taken before the next gets them
REPLY_CHUNK = 256 * 1024  # a ring message of replies: the front answers it while the rest are packed


class SpreadOutbox:
    """The producer's ends of the rings to several workers of one service (the pull workers):
    each message goes to the first live worker that keeps up (`first_keeping_up`), so on a host
    with few cores one worker takes the reads and the others sleep until the load needs them.
    `alive(label)` says whether a worker's process is there (its heartbeat is recent): one that
    died or is restarting, which may take up to its restart back-off, gets nothing while another
    lives; what its ring holds already waits for its successor, which opens the same ring.
    With none alive, the reads wait in the ring of the first that keeps up."""

    local = False

    def __init__(self, outboxes: list[Outbox], *, alive=None, spill_bytes: int = READ_SPILL_BYTES):
        self.outboxes, self.alive, self.spill_bytes = outboxes, alive, spill_bytes
        self.max_message = min(out.max_message for out in outboxes)
        self.skipped = 0

    def send(self, item) -> bool:
        outboxes = self.outboxes
        if self.alive is not None and len(outboxes) > 1:
            live = [out for out in outboxes if self.alive(out.consumer)]
            if live and len(live) < len(outboxes):
                self.skipped += 1
                outboxes = live
        return first_keeping_up(outboxes, self.spill_bytes).send(item)

    def statistics(self) -> dict:
        return {out.name: out.statistics() for out in self.outboxes} | {"skippedNotAlive": self.skipped}

    def close(self) -> None:
        for out in self.outboxes:
            out.close()


class ReplyOutbox:
    """A read service's replies to the front, a turn's at a time (`send(out)`, `out` being
    `pack_replies`' tuples): through its ring in messages of about REPLY_CHUNK, so the front
    answers the first while the next are packed; a reply larger than a ring message holds (a
    QUERY_MESSAGE of large messages) over the front's `replies` socket instead."""

    local = False

    def __init__(self, ring: Outbox, sock: zmq.Socket):
        self.ring, self.sock = ring, sock
        self.oversized = 0

    @property
    def name(self) -> str:
        return self.ring.name

    def send(self, out: list) -> None:
        largest, chunk, size = self.ring.max_message, [], 0
        for reply in out:
            n = reply_size(reply)
            if n > largest:
                send_frames(self.sock, [pack_replies([reply])])
                self.oversized += 1
                continue
            if chunk and size + n > REPLY_CHUNK:
                self.ring.send_waiting([pack_replies(chunk)])
                chunk, size = [], 0
            chunk.append(reply)
            size += n
        if chunk:
            self.ring.send_waiting([pack_replies(chunk)])

    def statistics(self) -> dict:
        return self.ring.statistics() | {"oversized": self.oversized}

    def close(self) -> None:
        self.ring.close()
        self.sock.close(0)


class WaitingOutbox:
    """An outbox whose consumer may be absent for a moment (a pull worker restarting, or not yet
    reconnected to a restarted front): what it cannot take now waits here, in arrival order, at
    most `limit` items and `patience_s` seconds each, and goes out at the next `retry` it can.
    `retry` gives back the items that waited past their patience, for the caller to refuse; so
    a reader that is gone for good costs the client a clear status, never its own timeout."""

    def __init__(self, out, *, limit: int, patience_s: float):
        self.out, self.limit, self.patience_s = out, limit, patience_s
        self.local = out.local
        self.waiting: deque = deque()  # (deadline, item), oldest first
        self.waited = self.expired = 0

    @property
    def max_message(self) -> int:
        return self.out.max_message

    def send(self, item, now: float) -> bool:
        """False only when the waiting room is full."""
        if not self.waiting and self.out.send(item):
            return True
        if len(self.waiting) >= self.limit:
            return False
        self.waiting.append((now + self.patience_s, item))
        self.waited += 1
        return True

    def retry(self, now: float) -> list:
        """Sends what waits, oldest first, while the consumer takes it; returns the items past
        their deadline."""
        while self.waiting and self.out.send(self.waiting[0][1]):
            self.waiting.popleft()
        expired = []
        while self.waiting and self.waiting[0][0] <= now:
            expired.append(self.waiting.popleft()[1])
        self.expired += len(expired)
        return expired

    def statistics(self) -> dict:
        return {"waiting": len(self.waiting), "waited": self.waited, "expired": self.expired}

    def close(self) -> None:
        self.out.close()


def first_keeping_up(outboxes: list[Outbox], turn_bytes: int) -> Outbox:
    """Where a turn's sends go: the first ingress worker whose ring holds less than a turn's worth
    (`turn_bytes`) not yet taken, else the one with the least. Load spills over to the next worker
    only while the ones before it are behind, so on a host with few cores the workers not needed
    stay asleep (each wake-up of a process costs CPU), and on a busy host with many cores they
    all work."""
    best = outboxes[0]
    for out in outboxes:
        pending = out.pending_bytes()
        if pending < turn_bytes:
            return out
        if pending < best.pending_bytes():
            best = out
    return best
