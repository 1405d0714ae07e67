"""Timer messages (RocketMQ 5's arbitrary delays): the wheel over the timer log. No I/O.

A send with TIMER_DELIVER_MS, TIMER_DELAY_SEC or TIMER_DELAY_MS due in the future is stored in
`rmq_sys_wheel_timer` queue 0 with TIMER_OUT_MS, its due time rounded up to `timerPrecisionMs`
(actors.sendcore). The schedule service takes each such message in (`add`): one timer
log entry (shm.timer_log), hung under its slot. The wheel maps a slot (the due time in ms) to
its newest entry and count; entries of a slot chain back through `prev`. It lives in memory as
an index of the log, rebuilt from the log at start (`rebuild`): a million pending timers cost the
log's 48 bytes each on disk and one dict item a slot in memory.

Slots fire in time order, one at a time (`due`): a slot's entries are handed out for re-put
(in the order they were taken in, up to the room given) and the next slot starts once every one is stored. Then the
slot is `delivered_ms`, persisted by the shell's checkpoint: after a restart or a kill -9, every
entry hanging under a later slot is pending again, so a timer may be delivered twice across a
crash, never lost, never early.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from shm.codec import PROPERTY_REAL_TOPIC, PROPERTY_TIMER_DEL_UNIQKEY, PROPERTY_UNIQ_KEY
from shm.timer_log import TimerLog

RETRY_MS = 100  # a re-put that was not stored goes again after this
RECALLED = "RECALLED"  # `stored`'s status for an entry a recall cancelled: done, delivered to no one
RECALLS_MAX = 100_000  # recalls remembered at once (each until its message's time has passed)
RECALL_GRACE_MS = 60_000  # a recall is forgotten this long after the time it names
CHAIN_READ = 65536  # entries of a slot read ahead to be handed out oldest first (a list of ints)
_COUNT_BITS = 32


@dataclass
class _Firing:
    """The slot being delivered."""

    link_ms: int
    cursor: int  # the next entry of the chain to read (-1: all read)
    left: int  # entries of the slot not handed out yet
    read: list[int] = field(default_factory=list)  # read from the chain, to hand out oldest first
    in_flight: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # index -> (phy, size, due_ms)
    retry: list[int] = field(default_factory=list)
    retry_at: int = 0


class TimerCore:
    """`add` takes a stored timer message in, `due(now_ms, room)` hands out (index, phy, size)
    to re-put, `stored(index, status, now_ms)` takes their answers."""

    def __init__(self, log: TimerLog, delivered_ms: int, permanent: frozenset[str]):
        self.log = log
        self.delivered_ms = delivered_ms  # every slot up to this is delivered
        self.permanent = permanent  # statuses a re-put is never tried again for
        self.wheel: dict[int, int] = {}  # slot ms -> newest entry << 32 | count
        self.slots: list[int] = []  # heap of the wheel's slots
        self.firing: _Firing | None = None
        self.pending = 0
        self.delivered = self.dropped = self.late_adds = self.recalled = 0
        self.lateness: deque[int] = deque(maxlen=1024)  # ms past due of the last deliveries
        self.dirty = False

    def rebuild(self) -> None:
        """The wheel from the log's entries under slots after `delivered_ms`."""
        newest: dict[int, int] = {}
        counts: dict[int, int] = {}
        for first, records in self.log.scan():
            import numpy as np  # (here: a log with nothing live is rebuilt without it)

            links = records["link"]
            live = np.nonzero(links > self.delivered_ms)[0]
            if not len(live):
                continue
            slots, last_at, count = _group(links[live])
            for slot, at, n in zip(slots.tolist(), last_at.tolist(), count.tolist()):
                newest[slot] = first + int(live[at])
                counts[slot] = counts.get(slot, 0) + n
        self.wheel = {slot: newest[slot] << _COUNT_BITS | counts[slot] for slot in newest}
        self.slots = list(self.wheel)
        heapq.heapify(self.slots)
        self.pending = sum(counts.values())
        self.log.note_links()

    # -- in ------------------------------------------------------------------------------------------

    def add(self, due_ms: int, phy: int, size: int, cq: int) -> None:
        """A timer message taken in: hung under its due slot, or under the first slot still to
        fire when that one is past (a message taken in late, or after a restart)."""
        floor = self.firing.link_ms if self.firing else self.delivered_ms
        link = due_ms if due_ms > floor else floor + 1
        packed = self.wheel.get(link)
        prev, count = (packed >> _COUNT_BITS, packed & ((1 << _COUNT_BITS) - 1)) if packed is not None else (-1, 0)
        index = self.log.append(link, due_ms, phy, prev, cq, size)  # (first: a full disk here changes nothing)
        self.late_adds += link != due_ms
        if packed is None:
            heapq.heappush(self.slots, link)
        self.wheel[link] = index << _COUNT_BITS | (count + 1)
        self.pending += 1

    # -- out -----------------------------------------------------------------------------------------

    def due(self, now_ms: int, room: int) -> list[tuple[int, int, int]]:
        """(log index, phy, size) of entries to re-put now, at most `room`."""
        out: list[tuple[int, int, int]] = []
        for _ in range(len(self.slots) + 1):  # each pass finishes a slot or stops
            firing = self.firing
            if firing is None:
                if not self.slots or self.slots[0] > now_ms:
                    break
                firing = self.firing = self._fire(heapq.heappop(self.slots))
            if firing.retry and now_ms >= firing.retry_at:
                while firing.retry and len(out) < room:
                    index = firing.retry.pop()
                    out.append((index, *firing.in_flight[index][:2]))
            while (firing.read or firing.cursor >= 0) and len(out) < room:
                if not firing.read:
                    self._read_chain(firing)
                index = firing.read.pop()
                _, due_ms, phy, _, _, size = self.log.entry(index)
                firing.in_flight[index] = (phy, size, due_ms)
                out.append((index, phy, size))
                firing.left -= 1
            if firing.read or firing.cursor >= 0 or firing.in_flight:
                break  # room used up, or answers awaited: the next slot waits for this one
            self._finish(firing)
        return out

    def _read_chain(self, firing: _Firing) -> None:
        """The next CHAIN_READ entries of the slot's chain (newest first), kept to be handed out
        oldest first: a slot's timers go in the order they were taken in (a slot of up to
        CHAIN_READ exactly; a larger one chunk by chunk, newest chunk first)."""
        for _ in range(CHAIN_READ):
            if firing.cursor < 0:
                break
            link, _, _, prev, _, _ = self.log.entry(firing.cursor)
            assert link == firing.link_ms, f"timer log entry {firing.cursor} hangs under {link}, not {firing.link_ms}"
            firing.read.append(firing.cursor)
            firing.cursor = prev

    def _fire(self, link_ms: int) -> _Firing:
        packed = self.wheel.pop(link_ms)
        return _Firing(link_ms, packed >> _COUNT_BITS, packed & ((1 << _COUNT_BITS) - 1))

    def _finish(self, firing: _Firing) -> None:
        assert firing.left == 0, f"slot {firing.link_ms}: its chain ended {firing.left} entries short of its count"
        self.delivered_ms = firing.link_ms
        self.firing = None
        self.dirty = True

    def stored(self, index: int, status: str, now_ms: int) -> None:
        """The answer to a re-put: stored, given up (a permanent refusal), recalled (RECALLED: not
        re-put at all), or to be tried again."""
        firing = self.firing
        if firing is None or index not in firing.in_flight:
            return
        if status != "PUT_OK" and status != RECALLED and status not in self.permanent:
            firing.retry.append(index)
            firing.retry_at = now_ms + RETRY_MS
            return
        _, _, due_ms = firing.in_flight.pop(index)
        self.pending -= 1
        if status == "PUT_OK":
            self.delivered += 1
            self.lateness.append(now_ms - due_ms)
        elif status == RECALLED:
            self.recalled += 1
        else:
            self.dropped += 1
        if firing.cursor < 0 and not firing.read and not firing.in_flight:
            self._finish(firing)

    def skip(self, index: int, now_ms: int) -> None:
        """An entry with nothing to deliver (its record gone, or not a timer message)."""
        self.stored(index, "MESSAGE_ILLEGAL", now_ms)

    def next_due(self) -> int | None:
        """The epoch ms the next slot fires, None when there is none (or one is firing)."""
        if self.firing is not None:  # (its answers wake the shell; a retry is due at its time)
            return self.firing.retry_at if self.firing.retry else None
        return self.slots[0] if self.slots else None

    def statistics(self, now_ms: int) -> dict:
        firing = self.firing
        due_now = sum(self.wheel[slot] & ((1 << _COUNT_BITS) - 1) for slot in self.slots if slot <= now_ms)
        if firing is not None:
            due_now += firing.left + len(firing.in_flight)
        recent = sorted(self.lateness)
        return {"pending": self.pending, "dueUndelivered": due_now, "delivered": self.delivered,
                "dropped": self.dropped, "recalled": self.recalled, "slots": len(self.wheel), "deliveredTo": self.delivered_ms,
                "lateAdds": self.late_adds,
                "latenessMillis": {"last": self.lateness[-1], "p50": recent[len(recent) // 2],
                                   "p99": recent[len(recent) * 99 // 100], "max": recent[-1]} if recent else None,
                "log": self.log.statistics()}


class Recalls:
    """Timer messages recalled before their delivery (RocketMQ 5.3's RecallMessage). A recall is
    stored as RocketMQ stores it: a timer record for the same topic and time whose
    TIMER_DEL_UNIQKEY names the message's UNIQ_KEY. Taken in, it is not hung on the wheel: its
    key (topic + "+" + UNIQ_KEY) is remembered with its time, and a timer message of that key
    is not re-put when it falls due. The keys are kept in the timer checkpoint (`snapshot`) and
    forgotten RECALL_GRACE_MS after their time. A recall taken in after its message was re-put
    cancels nothing (RocketMQ's answer is the same: best effort, up to the delivery)."""

    def __init__(self, saved: dict | None = None):
        self.keys: dict[str, int] = {str(k): int(v) for k, v in (saved or {}).items()}
        self.taken = self.cancelled = self.full = 0

    @staticmethod
    def key_of_recall(properties: dict) -> str | None:
        """The key a recall record cancels; None for a timer message that is no recall."""
        target = properties.get(PROPERTY_TIMER_DEL_UNIQKEY)
        return None if target is None else f"{properties.get(PROPERTY_REAL_TOPIC, '')}+{target}"

    def add(self, key: str, due_ms: int) -> None:
        if key not in self.keys and len(self.keys) >= RECALLS_MAX:
            self.full += 1  # (counted: a recall past the bound cancels nothing)
            return
        self.keys[key] = due_ms
        self.taken += 1

    def cancels(self, properties: dict) -> bool:
        """Whether a due timer message (its properties) was recalled."""
        key = f"{properties.get(PROPERTY_REAL_TOPIC, '')}+{properties.get(PROPERTY_UNIQ_KEY, '')}"
        if key in self.keys:
            self.cancelled += 1
            return True
        return False

    def prune(self, delivered_ms: int) -> None:
        """Forget the recalls whose time passed RECALL_GRACE_MS before the wheel's delivered slot."""
        old = [k for k, due in self.keys.items() if due < delivered_ms - RECALL_GRACE_MS]
        for key in old:
            del self.keys[key]

    def snapshot(self) -> dict[str, int]:
        return dict(self.keys)

    def statistics(self) -> dict:
        return {"pending": len(self.keys), "taken": self.taken, "cancelled": self.cancelled, "full": self.full}


def _group(links):
    """Per distinct value of `links`: the value, the position of its last occurrence, its count."""
    import numpy as np

    order = np.argsort(links, kind="stable")
    ordered = links[order]
    boundaries = np.flatnonzero(np.diff(ordered)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [len(ordered)]))
    return ordered[starts].astype(np.int64), order[ends - 1], ends - starts
