"""The transaction service's own writes on their way (`Reputs`): committed messages, op records,
discards and barriers, each a re-put through the front and the write path, kept until the
write path answers it; the bytes they hold; those past their deadline, and the barriers.

A barrier is an empty re-put (SEND_MESSAGES with no messages: answered PUT_OK, nothing stored)
sent behind others the way they went. The write path keeps a service's re-puts in order (its
ring, the front's first link, the writer's ring), so once a barrier is stored and the op records
below where it stood are read, what was sent before it is stored and read, or never will be. The
service sends one before it first ends halves (what a killed predecessor left on its way:
actors.transaction `_prepare_ending`) and one behind re-puts past their deadline (below).

A re-put unanswered past actors.reput's ReputDeadline (a writer stalled on its disk, a front
restarted under it) may be stored or not; nobody can say yet. Counting it as not stored would
open its halves again, and an end again would commit one a second time once the slow write path
stored both. So it waits here (`Overdue`), its halves still decided, until a barrier behind it
passes: the halves whose op record was read by then are answered as ended; the others were not
stored, and their ends go again (a discard's halves are open again). A re-put is stored whole or
not at all, its op records last (docs/protocol.md "Transactions").

No I/O: the shell sends the barriers, reads the queues and says when they are read to an end."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from actors.reput import ReputDeadline, delivery_request
from actors.transaction_core import CHECK, DISCARD, TransactionCore
from node import protocol

BARRIER = "barrier"  # a barrier's re-put: (BARRIER, the Barrier)


class Barrier:
    """An empty re-put sent behind others, the way they went: once the write path has stored it
    (`answered`) and the op records below where it stood are read (`passed`), each re-put sent
    before it is stored and read, or never will be. One is on its way at a time."""

    __slots__ = ("seq", "end")

    def __init__(self):
        self.seq: int | None = None  # its send sequence, while on its way
        self.end: int | None = None  # `written` when the write path answered it stored

    def on_its_way(self) -> bool:
        return self.seq is not None

    def sent(self, seq: int) -> None:
        self.seq, self.end = seq, None

    def answered(self, stored: bool, written: int) -> None:
        if stored:
            self.end = written
        else:  # (refused at the front, or unanswered itself: another one next turn)
            self.seq = None

    def passed(self, caught_up: Callable[[int], bool]) -> int | None:
        """Its send sequence once it has passed (and it is done), else None."""
        if self.end is None or not caught_up(self.end):
            return None
        seq, self.seq, self.end = self.seq, None, None
        return seq


class Overdue:
    """The re-puts past their deadline, each until a barrier sent after it has passed."""

    __slots__ = ("entries", "barrier")

    def __init__(self):
        self.entries: dict[int, tuple] = {}  # opaque -> its waiting entry (what, records, sent at, bytes, seq)
        self.barrier = Barrier()  # behind them

    def add(self, opaque: int, entry: tuple) -> None:
        self.entries[opaque] = entry

    def pop(self, opaque) -> tuple | None:
        """A late answer's entry (the answer says what became of it)."""
        return self.entries.pop(opaque, None)

    def needs_barrier(self) -> bool:
        return bool(self.entries) and not self.barrier.on_its_way()

    def settled(self, caught_up: Callable[[int], bool]) -> list[tuple]:
        """The entries the barrier settles, once the op records below its end are read (`caught_up`):
        each sent before it. Later ones wait for the next barrier."""
        seq = self.barrier.passed(caught_up)
        if seq is None:
            return []
        settled = [opaque for opaque, entry in self.entries.items() if entry[4] < seq]
        return [self.entries.pop(opaque) for opaque in settled]


class Reputs:
    """The re-puts on their way: `put` sends one (`what` says what it is, for its answer: a
    barrier's, an end's, a discard's, a check's op record), `answer` takes the write path's
    answer back, `expire` and `settled` deal with those not answered in time."""

    def __init__(self, send: Callable[[dict, bytes], None]):
        self.send = send  # (header, body): the shell's send of a SEND_MESSAGES request to the front
        self.waiting: dict[int, tuple] = {}  # opaque -> (what, records, sent at, bytes, send sequence)
        self.overdue = Overdue()  # those past the deadline: not known to be stored or not
        self.deadline = ReputDeadline()  # when an unanswered re-put is past it
        self.opaque = random.randrange(1 << 30)
        self.sent = 0  # re-puts sent (the sequence)
        self.bytes = 0  # of the re-puts unanswered, the overdue ones' too (they may yet be stored)
        self.expired = 0

    def put(self, items: list, what: tuple) -> None:
        self.opaque = (self.opaque + 1) % (1 << 31)
        header, body = delivery_request(items, self.opaque)
        records = sum(item["_reput"].get("inner", 1) for item in header["messages"])
        self.sent += 1
        self.waiting[self.opaque] = (what, records, time.monotonic(), len(body), self.sent)
        self.bytes += len(body)
        self.send(header, body)

    def barrier(self, barrier: Barrier) -> None:
        self.put([], (BARRIER, barrier))
        barrier.sent(self.sent)

    def answer(self, header: dict, written: int) -> tuple[tuple, int] | None:
        """The write path's answer to a re-put (`written` as it stands now): (what, its records) for
        the shell to act on; None for a barrier's (its Barrier told here), or for a re-put
        expired and counted already, or settled."""
        self.deadline.answered(time.monotonic())
        entry = self.waiting.pop(header.get("opaque"), None) or self.overdue.pop(header.get("opaque"))
        if entry is None:
            return None
        what, records, _, size, _ = entry
        self.bytes -= size
        if what[0] == BARRIER:
            what[1].answered(header.get("status") in protocol.STORED_STATUSES, written)
            return None
        return what, records

    def expire(self, now: float) -> None:
        """Re-puts past their deadline: a barrier counts as not stored (another is sent), a check's
        op record as done (one more or less changes only a count); an end or a discard waits,
        decided, for a barrier to settle it (`settled`)."""
        for opaque in [o for o, (_, _, at, _, _) in self.waiting.items() if self.deadline.expired(at, now)]:
            self.expired += 1
            entry = self.waiting.pop(opaque)
            what = entry[0]
            if what[0] in (BARRIER, CHECK):
                self.bytes -= entry[3]
                if what[0] == BARRIER:
                    what[1].answered(False, 0)
            else:
                self.overdue.add(opaque, entry)

    def settled(self, caught_up: Callable[[int], bool]) -> list[tuple]:
        """The overdue re-puts a barrier has settled (what each was: `answer_settled` says what
        became of it); sends that barrier first, when none is on its way."""
        if self.overdue.needs_barrier():
            self.barrier(self.overdue.barrier)
            return []
        settled = self.overdue.settled(caught_up)
        self.bytes -= sum(entry[3] for entry in settled)
        return [entry[0] for entry in settled]

    def in_flight(self) -> bool:
        return bool(self.waiting or self.overdue.entries)

    def statistics(self) -> dict:
        return {"waiting": len(self.waiting), "overdue": len(self.overdue.entries), "reputBytes": self.bytes,
                "expired": self.expired}


def answer_settled(what: tuple, core: TransactionCore, out: list) -> list:
    """An overdue re-put, settled (`what` as the shell sent it: a discard's half offsets, or an
    end's `End`s): each half whose op record was read is answered as ended; the others' re-put
    was not stored. Returns the ends to re-put (a discard's halves are open again instead)."""
    if what[0] == DISCARD:
        for offset in what[1]:
            if offset in core.ending:
                core.end_failed(offset)
        return []
    again = []
    for end in what[1]:
        if end.offset in core.ending:
            again.append(end)
            continue
        decided = core.outcome(end.offset)
        if decided == end.asked:
            end.batch.set(end.i, out, "OK", "")
        elif decided is not None:
            end.batch.set(end.i, out, "OK", f"the transaction was ended already ({decided})", outcome=decided)
        else:  # (opened again meanwhile: nothing of it was stored)
            end.batch.set(end.i, out, "SYSTEM_BUSY", "the outcome was not stored; end it again")
    return again
