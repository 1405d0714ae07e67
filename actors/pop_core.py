"""Pop consumption's core (RocketMQ 5's pop, docs/protocol.md "Pop"): which messages a consumer
group has in flight, until when, which it acked, and what is due again. No I/O: the reads, the
log (shm.pop_log) and the clock (wall ms, so deadlines survive a restart) are given to it.

Per (group, topic, queue) a `QueueState`:

    low      every offset below it is retired (acked, dead-lettered, filtered out or gone)
    next     no offset from it on was ever handed out
    leases   offset -> (ck, deadline): in flight, invisible to the group until the deadline
    ready    offsets whose lease ran out: handed out again first (a heap, smallest first)
    retired  offsets in [low, next) retired out of order
    times    offset -> how often it was handed out (reconsumeTimes = times before this delivery)
    reset_ck the first ck after the queue's last reset (0: never reset): a handle of an older ck
             was issued before it, and no longer holds (RECEIPT_HANDLE_EXPIRED, not INVALID)

A pop takes a queue's ready offsets first, then new ones from `next`; each pop of a queue is a
checkpoint `ck` (a number, never reused) and every message of it gets the receipt handle
`"<ck> <topic> <queueId> <offset>"`. An ack or change-invisible is taken only while the lease
of that offset is still that ck and its deadline has not passed: any other handle is
INVALID_RECEIPT_HANDLE (never issued) or RECEIPT_HANDLE_EXPIRED (issued, no longer holds).

State changes only through `apply(record)`, the same code live and at replay (event sourcing):
the live path checks a request, makes its record, logs it and applies it. Records:

    ["S", g, t, q, start]                         a queue's state begins at `start` (again, after a
                                                  reset: its leases, retries and retired offsets go)
    ["P", g, t, q, ck, deadline, offsets, next]   a pop: leases; offsets skipped below `next` retire
    ["A", g, t, q, [[offset, ck], ...]]           acks
    ["C", g, t, q, offset, ck, new_ck, deadline]  change invisible time
    ["R", g, t, q, offsets]                       retired without an ack: dead-lettered, or gone
    ["D", g, t, q]                                the queue's state forgotten: its group or topic was
                                                  deleted (its next pop starts as a first one)

Expiry is not logged: it follows from the deadlines and the clock, so a replayed lease whose
deadline passed during the crash expires at the first `expire` after it. A lease that runs out
after `retry_max` + 1 deliveries goes to `%DLQ%<group>` (the shell re-puts it, then logs "R").

Orderly (`order`): a queue with a lease or a message on its way to the DLQ hands nothing out,
and what ran out is handed out again before anything newer, in offset order: FIFO per queue.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

MIN, MAX = 0, 1  # initMode: a queue never popped starts at its min or max offset (RocketMQ's ConsumeInitMode)
MAX_SPAN = 200_000  # offsets between low and next per queue: popping new ones stops beyond (a stuck message)
MAX_IN_FLIGHT = 2_000_000  # leases on the node: pops find nothing beyond
MAX_DUE_A_TICK = 100_000  # leases one `expire` call runs out (the rest next call)
DEFAULT_RETRY_MAX = 16  # a group's retryMaxTimes until the router says otherwise
CK_FENCE = 1 << 32  # how far a promoted slave's checkpoints jump past its copy's (`fence`)

OK, EXPIRED, INVALID = "OK", "RECEIPT_HANDLE_EXPIRED", "INVALID_RECEIPT_HANDLE"


@dataclass(slots=True)
class QueueState:
    low: int
    next: int
    leases: dict[int, tuple[int, int]] = field(default_factory=dict)
    ready: list[int] = field(default_factory=list)
    retired: set[int] = field(default_factory=set)
    times: dict[int, int] = field(default_factory=dict)
    dying: set[int] = field(default_factory=set)
    reset_ck: int = 0

    def advance(self) -> None:
        while self.low in self.retired:
            self.retired.discard(self.low)
            self.times.pop(self.low, None)
            self.low += 1
        if self.low > self.next:  # (an "S" start above offsets never handed out)
            self.next = self.low

    def retire(self, offset: int) -> None:
        if offset >= self.low:
            self.retired.add(offset)
            self.times.pop(offset, None)

    def locked(self) -> bool:
        """Orderly: something of this queue is in flight or on its way to the DLQ."""
        return bool(self.leases) or bool(self.dying)


class Entry(NamedTuple):
    """A stored message as the shell read it: its queue offset, its record's bytes and the
    reconsumeTimes stored in it. (A tuple: the shell makes one a message handed out, and a
    frozen dataclass's __init__ cost three times as much.)"""
    offset: int
    raw: bytes | memoryview
    reconsume: int


@dataclass(slots=True)
class Delivery:
    raw: bytes
    handle: str
    reconsume_times: int


@dataclass(slots=True)
class PopRequest:
    group: str
    topic: str
    queues: list[int]  # the queues to look at, in order
    max_count: int
    invisible_ms: int
    orderly: bool = False
    start: dict[int, int] = field(default_factory=dict)  # queue -> the group's committed offset, if any
    init_mode: int = MIN
    codes: set[int] | None = None  # tag hash codes to match (None: every message)
    match: Callable[[bytes], bool] | None = None  # a SQL92 selector's test of a record (None: every message)


def handle_of(ck: int, topic: str, queue_id: int, offset) -> str:
    return f"{ck} {topic} {queue_id} {offset}"


def handle_parts(handle: str) -> tuple[int, str, int, int] | None:
    """(ck, topic, queue id, offset) of what `handle_of` made; None for anything else."""
    parts = handle.split(" ")
    if len(parts) != 4 or not all(parts[i].isdigit() for i in (0, 2, 3)):
        return None
    return int(parts[0]), parts[1], int(parts[2]), int(parts[3])


class PopCore:
    """`read(topic, queue, offset, count, codes, match)` -> (entries, next offset to look at, min, max)
    reads the store; `log` takes each record (`append`); `clock_ms` is wall time in ms."""

    def __init__(self, log, clock_ms, read):
        self.log, self.clock_ms, self.read = log, clock_ms, read
        self.queues: dict[tuple[str, str, int], QueueState] = {}
        self.expiries: list[tuple[int, int, tuple, tuple]] = []  # (deadline, ck, key, offsets)
        self.next_ck = 1
        self.in_flight = 0
        self.turns: dict[tuple[str, str], int] = {}  # (group, topic) -> where the next any-queue pop starts
        self.retry_max_of: dict[str, int] = {}  # group -> retryMaxTimes, as the router last said (the shell sets it)
        self.popped = self.acked = self.redelivered = self.dead_lettered = self.expired_acks = self.invalid = 0
        self.resets = self.forgotten = 0
        self.moved: set[tuple[str, str, int]] = set()  # queues whose `low` moved since `progress` last said

    # -- the one mutator ---------------------------------------------------------------------------

    def apply(self, record: list) -> None:
        kind, key = record[0], (record[1], record[2], record[3])
        if kind == "S":
            old = self.queues.get(key)
            qs = self.queues[key] = QueueState(record[4], record[4])
            if old is not None:  # a reset: its leases no longer hold (their expiries find none)
                self.in_flight -= len(old.leases)
                qs.reset_ck = self.next_ck
            self.moved.add(key)
            return
        if kind == "D":
            self.in_flight -= len(self.queues.pop(key).leases)  # (their expiries find no queue)
            self.moved.discard(key)
            return
        qs = self.queues[key]  # (every other record follows its queue's "S")
        low = qs.low
        if kind == "P":
            self._apply_pop(key, qs, *record[4:])
        elif kind == "A":
            for offset, ck in record[4]:
                if self._drop_lease(qs, offset, ck):
                    qs.retire(offset)
        elif kind == "C":
            offset, ck, new_ck, deadline = record[4:]
            if self._drop_lease(qs, offset, ck):
                self._lease(key, qs, new_ck, deadline, (offset,))
        elif kind == "R":
            for offset in record[4]:
                if qs.leases.pop(offset, None) is not None:
                    self.in_flight -= 1
                qs.dying.discard(offset)
                qs.retire(offset)
        else:
            raise AssertionError(f"pop record of unknown kind {kind!r}")  # only this module writes them
        qs.advance()
        if qs.low != low:
            self.moved.add(key)

    def _apply_pop(self, key, qs: QueueState, ck: int, deadline: int, offsets: list, next_offset: int) -> None:
        for offset in offsets:
            if offset in qs.leases:  # (replay: a lease that ran out while the node was up)
                self.in_flight -= 1
            qs.times[offset] = qs.times.get(offset, 0) + 1
        if offsets:
            self._lease(key, qs, ck, deadline, tuple(offsets))
        if next_offset > qs.next:
            handed = set(offsets)
            for offset in range(qs.next, next_offset):
                if offset not in handed:  # filtered out, or its file cleaned away
                    qs.retire(offset)
            qs.next = next_offset

    def _lease(self, key, qs: QueueState, ck: int, deadline: int, offsets: tuple) -> None:
        for offset in offsets:
            qs.leases[offset] = (ck, deadline)
        self.in_flight += len(offsets)
        self.next_ck = max(self.next_ck, ck + 1)
        heapq.heappush(self.expiries, (deadline, ck, key, offsets))

    def _drop_lease(self, qs: QueueState, offset: int, ck: int) -> bool:
        lease = qs.leases.get(offset)
        if lease is None or lease[0] != ck:
            return False
        del qs.leases[offset]
        self.in_flight -= 1
        return True

    def _log(self, record: list) -> None:
        self.log.append(record)
        self.apply(record)

    # -- recovery ----------------------------------------------------------------------------------

    def restore(self, state: dict | None, records: list) -> None:
        if state is not None:
            self.next_ck = state["nextCk"]
            for g, t, q, low, nxt, leases, retired, times, *reset_ck in state["queues"]:
                qs = self.queues[(g, t, q)] = QueueState(low, nxt, retired=set(retired),
                                                         times={o: n for o, n in times},
                                                         reset_ck=reset_ck[0] if reset_ck else 0)  # (older snapshots: none)
                for offset, ck, deadline in leases:
                    self._lease((g, t, q), qs, ck, deadline, (offset,))
        for record in records:
            self.apply(record)
        self.moved = set(self.queues)  # (said once more: the front may not have taken the last)

    def fence(self, high: Callable[[str, int], int]) -> int:
        """A slave promoted with its master's pop state (restored from its copy of the master's
        pop log): its CommitLog may end before offsets that state counts as handed out or
        retired (the master's last records never reached it), and new messages will be stored
        there. Each queue's state is cut at `high(topic, queue)`, this node's next offset in it:
        from there on nothing was handed out or retired. And the checkpoints the master issued
        after the copy ends name no lease here: `next_ck` jumps past them. (leases cut)"""
        cut = 0
        for (_, topic, queue_id), qs in self.queues.items():
            end = high(topic, queue_id)
            if qs.next <= end:
                continue
            for offset in [o for o in qs.leases if o >= end]:  # (their expiries then find no lease)
                del qs.leases[offset]
                self.in_flight -= 1
                cut += 1
            qs.retired = {o for o in qs.retired if o < end}
            qs.times = {o: n for o, n in qs.times.items() if o < end}
            qs.dying = {o for o in qs.dying if o < end}
            qs.ready = [o for o in qs.ready if o < end]
            heapq.heapify(qs.ready)
            qs.next, qs.low = end, min(qs.low, end)
        self.next_ck += CK_FENCE
        self.moved = set(self.queues)
        return cut

    def snapshot(self) -> dict:
        """The whole state; a lease on its way to the DLQ is kept as run out (deadline 0): after a
        restart it runs out again and goes to the DLQ again (at least once)."""
        queues = []
        for (g, t, q), qs in self.queues.items():
            leases = [[o, ck, deadline] for o, (ck, deadline) in qs.leases.items()]
            leases += [[o, 0, 0] for o in qs.dying]
            leases += [[o, 0, 0] for o in set(qs.ready)  # (ran out: handed out again first, as now)
                       if o not in qs.leases and o not in qs.dying and o >= qs.low and o not in qs.retired]
            queues.append([g, t, q, qs.low, qs.next, leases, sorted(qs.retired), sorted(qs.times.items()), qs.reset_ck])
        return {"nextCk": self.next_ck, "queues": queues}

    # -- pop ---------------------------------------------------------------------------------------

    def pop(self, request: PopRequest) -> list[Delivery]:
        out: list[Delivery] = []
        queues = request.queues
        if len(queues) > 1:  # any queue: start where the last pop of the group stopped
            turn = self.turns.get((request.group, request.topic), 0) % len(queues)
            queues = queues[turn:] + queues[:turn]
            self.turns[(request.group, request.topic)] = turn + 1
        for queue_id in queues:
            room = request.max_count - len(out)
            if room <= 0 or self.in_flight >= MAX_IN_FLIGHT:
                break
            out += self._pop_queue(request, queue_id, room)
        self.popped += len(out)
        return out

    def _pop_queue(self, request: PopRequest, queue_id: int, room: int) -> list[Delivery]:
        key = (request.group, request.topic, queue_id)
        qs = self.queues.get(key) or self._begin(key, request)
        if request.orderly and qs.locked():
            return []
        entries, gone = self._take_ready(key, qs, room)
        next_offset = qs.next
        if not qs.ready and len(entries) < room and qs.next - qs.low < MAX_SPAN:
            found, next_offset, _, _ = self.read(request.topic, queue_id, qs.next, room - len(entries), request.codes,
                                                 request.match)
            entries += found
        if gone:
            self._log(["R", *key, gone])
        if not entries:
            if next_offset > qs.next:  # all filtered out: they retire
                self._log(["P", *key, 0, 0, [], next_offset])
            return []
        ck, deadline = self.next_ck, self.clock_ms() + request.invisible_ms
        times, head = qs.times, handle_of(ck, request.topic, queue_id, "")  # (a pop's handles share all but the offset)
        out = [Delivery(e.raw, f"{head}{e.offset}", e.reconsume + times.get(e.offset, 0)) for e in entries]
        self._log(["P", *key, ck, deadline, [e.offset for e in entries], next_offset])
        return out

    def _begin(self, key, request: PopRequest) -> QueueState:
        start = request.start.get(key[2])
        if start is None:
            _, _, low, high = self.read(key[1], key[2], 0, 0, None)
            start = high if request.init_mode == MAX else low
        self._log(["S", *key, start])
        return self.queues[key]

    def _take_ready(self, key, qs: QueueState, room: int) -> tuple[list[Entry], list[int]]:
        """Up to `room` offsets that ran out, read again; those whose record is gone (cleaned)."""
        entries, gone = [], []
        while qs.ready and len(entries) < room:
            offset = heapq.heappop(qs.ready)
            if offset in qs.leases or offset < qs.low or offset in qs.retired:
                continue  # (acked or handed out since: a stale heap entry)
            found, _, _, _ = self.read(key[1], key[2], offset, 1, None)
            if found and found[0].offset == offset:
                entries.append(found[0])
            else:
                gone.append(offset)
        return entries, gone

    # -- ack and change invisible ------------------------------------------------------------------

    def check(self, group: str, handle, now: int | None = None, heads: dict | None = None) -> tuple[str, tuple | None]:
        """(OK, (key, offset, ck)) when `handle` holds its message now, else (status, None).
        `heads` caches what the part before the offset names (a pop's messages share it)."""
        if not isinstance(handle, str) or len(handle) > 512:
            self.invalid += 1
            return INVALID, None
        head, _, tail = handle.rpartition(" ")
        found = heads.get(head) if heads is not None else None
        if found is None:
            found = self._head(group, head)
            if heads is not None:
                heads[head] = found
        if found is False or not tail.isdigit():
            self.invalid += 1
            return INVALID, None
        key, qs, ck = found
        offset = int(tail)
        if offset >= qs.next and ck >= qs.reset_ck:
            self.invalid += 1
            return INVALID, None  # never issued (by this node, to this group)
        lease = qs.leases.get(offset)
        if lease is None or lease[0] != ck or lease[1] <= (self.clock_ms() if now is None else now):
            self.expired_acks += 1
            return EXPIRED, None  # issued; acked, changed or run out since
        return OK, (key, offset, ck)

    def _head(self, group: str, head: str):
        """(key, its state, ck) for a handle's "<ck> <topic> <queueId>", False when no pop of
        this node to this group could have issued it."""
        parts = head.split(" ")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
            return False
        ck, key = int(parts[0]), (group, parts[1], int(parts[2]))
        qs = self.queues.get(key)
        return False if qs is None or ck >= self.next_ck else (key, qs, ck)

    def ack(self, group: str, handles: list) -> list[str]:
        """Each handle's status; the ones that hold retire their messages (one record a queue)."""
        statuses, acks, heads, now = [], {}, {}, self.clock_ms()
        for handle in handles:
            status, held = self.check(group, handle, now, heads)
            statuses.append(status)
            if held is not None:
                key, offset, ck = held
                acks.setdefault(key, {})[offset] = ck  # (the same handle twice: once)
        for key, pairs in acks.items():
            self._log(["A", *key, [[o, ck] for o, ck in pairs.items()]])
            self.acked += len(pairs)
        return statuses

    def change_invisible(self, group: str, handle, invisible_ms: int) -> tuple[str, str | None, int]:
        """(status, the new handle, its deadline): the old handle no longer holds."""
        status, held = self.check(group, handle)
        if held is None:
            return status, None, 0
        key, offset, ck = held
        new_ck, deadline = self.next_ck, self.clock_ms() + invisible_ms
        self._log(["C", *key, offset, ck, new_ck, deadline])
        return OK, handle_of(new_ck, key[1], key[2], offset), deadline

    def peek(self, request: PopRequest) -> list[Entry]:
        """What a pop would hand out next (ready first), changing nothing."""
        out: list[Entry] = []
        for queue_id in request.queues:
            room = request.max_count - len(out)
            if room <= 0:
                break
            qs = self.queues.get((request.group, request.topic, queue_id))
            for offset in sorted(qs.ready)[:room] if qs is not None else ():
                found, _, _, _ = self.read(request.topic, queue_id, offset, 1, None)
                out += found[:1]
            if qs is not None and qs.ready:
                continue
            start = qs.next if qs is not None else request.start.get(queue_id)
            if start is None:
                _, _, low, high = self.read(request.topic, queue_id, 0, 0, None)
                start = high if request.init_mode == MAX else low
            out += self.read(request.topic, queue_id, start, room - len(out), request.codes, request.match)[0]
        return out

    # -- reset -------------------------------------------------------------------------------------

    def reset(self, group: str, topic: str, table: dict[int, int]) -> tuple[int, int]:
        """`admin reset-offset` for a pop group (RocketMQ 5's server-side reset): each of the
        topic's queues the group ever popped starts again at its offset in `table`, forward or
        back; what was in flight there is dropped (its handles are then RECEIPT_HANDLE_EXPIRED).
        A queue never popped is left alone: its first pop starts at the committed offset, which
        the reset set too. (queues reset, leases dropped)."""
        queues = dropped = 0
        for queue_id, offset in sorted(table.items()):
            key = (group, topic, queue_id)
            qs = self.queues.get(key)
            if qs is None:
                continue
            dropped += len(qs.leases)
            self._log(["S", *key, offset])
            queues += 1
        self.resets += queues
        return queues, dropped

    def forget(self, group: str | None = None, topic: str | None = None) -> tuple[int, int]:
        """The group (or the topic) was deleted, and its committed offsets with it: every queue
        of it here is forgotten, what was in flight dropped (its handles are then
        INVALID_RECEIPT_HANDLE, or RECEIPT_HANDLE_EXPIRED once the queue is popped again), and
        the next pop of it starts as a first pop does (`initMode`). (queues, leases dropped)."""
        keys = sorted(key for key in self.queues
                      if (group is None or key[0] == group) and (topic is None or key[1] == topic))
        dropped = sum(len(self.queues[key].leases) for key in keys)
        for key in keys:
            self._log(["D", *key])
        for turn in [turn for turn in self.turns if (group is None or turn[0] == group)
                     and (topic is None or turn[1] == topic)]:
            del self.turns[turn]
        if group is not None and topic is None:
            self.retry_max_of.pop(group, None)
        self.forgotten += len(keys)
        return len(keys), dropped

    # -- time --------------------------------------------------------------------------------------

    def expire(self) -> tuple[set[tuple[str, str]], list[tuple[tuple, int]]]:
        """Run out the leases whose deadline passed: ((group, topic) with messages due again,
        [(key, offset) to dead-letter])."""
        now, due, dead = self.clock_ms(), set(), []
        budget = MAX_DUE_A_TICK
        while self.expiries and self.expiries[0][0] <= now and budget > 0:
            _, ck, key, offsets = heapq.heappop(self.expiries)
            qs = self.queues.get(key)
            if qs is None:
                continue  # forgotten since
            for offset in offsets:
                if not self._drop_lease(qs, offset, ck):
                    continue  # acked or changed since
                budget -= 1
                if qs.times.get(offset, 0) > self.retry_max(key[0]):
                    qs.dying.add(offset)
                    dead.append((key, offset))
                else:
                    heapq.heappush(qs.ready, offset)
                    self.redelivered += 1
                    due.add((key[0], key[1]))
        return due, dead

    def retry_max(self, group: str) -> int:
        return self.retry_max_of.get(group, DEFAULT_RETRY_MAX)

    def dead_lettered_done(self, done: list[tuple[tuple, int]]) -> None:
        """The shell re-put these into the DLQ (or found them cleaned away): they retire, unless
        their queue was reset since (it starts anew, and would hand them out again)."""
        by_key: dict[tuple, list[int]] = {}
        for key, offset in done:
            qs = self.queues.get(key)
            if qs is not None and offset in qs.dying:
                by_key.setdefault(key, []).append(offset)
        for key, offsets in by_key.items():
            self._log(["R", *key, offsets])
            self.dead_lettered += len(offsets)

    def soonest_deadline(self) -> int | None:
        return self.expiries[0][0] if self.expiries else None

    def progress(self) -> list[list]:
        """[[group, topic, queue, low], ...] of the queues whose `low` moved since the last call
        (after a restart: every queue): the shell commits each as the group's consumer offset, as
        RocketMQ 5's acks advance a pop group's, so a slave promoted after the master was lost
        starts the group there (the pop log stays on its node)."""
        moved, self.moved = sorted(self.moved), set()
        return [[*key, self.queues[key].low] for key in moved]

    # -- views -------------------------------------------------------------------------------------

    def group_view(self, group: str) -> dict:
        """topic -> queue -> its pop state's numbers (`admin group`)."""
        out: dict[str, dict] = {}
        for (g, topic, queue_id), qs in sorted(self.queues.items()):
            if g == group:
                out.setdefault(topic, {})[str(queue_id)] = {
                    "inFlight": len(qs.leases), "ready": len(qs.ready), "dying": len(qs.dying),
                    "low": qs.low, "next": qs.next}
        return out

    def statistics(self) -> dict:
        return {"popped": self.popped, "acked": self.acked, "redelivered": self.redelivered,
                "deadLettered": self.dead_lettered, "inFlight": self.in_flight, "queues": len(self.queues),
                "expiredAcks": self.expired_acks, "invalidHandles": self.invalid, "queuesReset": self.resets, "queuesForgotten": self.forgotten}
