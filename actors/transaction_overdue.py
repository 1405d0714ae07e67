"""Re-puts of the transaction service (actors.transaction) the write path has not answered in
time (actors.reput's ReputDeadline: a writer stalled on its disk, a front restarted under
them). Stored or not, nobody can say yet. Counting one as not stored would open its halves
again, and an end again would commit one a second time once the slow write path stored both.
So they wait here, their halves still decided, and a barrier (an empty re-put) is sent behind
them. The write path keeps a service's re-puts in order (its ring, the front's first link, the
writer's ring), so once the barrier is stored and the op records below it are read, an overdue
re-put's op record has been read if it was stored at all: the shell answers those as stored,
and sends the others again (a discard's halves are open again). A re-put is stored whole or
not at all, its op records last (docs/protocol.md "Transactions").

No I/O: the shell sends the barrier, reads the queues and says when they are read to an end."""

from __future__ import annotations

from collections.abc import Callable

from actors.transaction_core import DISCARD, TransactionCore


class Overdue:
    __slots__ = ("entries", "barrier_seq", "barrier_end")

    def __init__(self):
        self.entries: dict[int, tuple] = {}  # opaque -> its waiting entry (what, records, sent at, bytes, seq)
        self.barrier_seq: int | None = None  # the send sequence of the barrier on its way
        self.barrier_end: int | None = None  # `written` when the write path answered it stored

    def add(self, opaque: int, entry: tuple) -> None:
        self.entries[opaque] = entry

    def pop(self, opaque) -> tuple | None:
        """A late answer's entry (the answer says what became of it)."""
        return self.entries.pop(opaque, None)

    def needs_barrier(self) -> bool:
        return bool(self.entries) and self.barrier_seq is None

    def barrier_sent(self, seq: int) -> None:
        self.barrier_seq, self.barrier_end = seq, None

    def barrier_answered(self, stored: bool, written: int) -> None:
        if stored:
            self.barrier_end = written
        else:  # (refused at the front, or overdue itself: another one next turn)
            self.barrier_seq = None

    def settled(self, caught_up: Callable[[int], bool]) -> list[tuple]:
        """The entries the barrier settles, once the op records below its end are read (`caught_up`):
        each sent before it. Later ones wait for the next barrier."""
        if self.barrier_end is None or not caught_up(self.barrier_end):
            return []
        settled = [opaque for opaque, entry in self.entries.items() if entry[4] < self.barrier_seq]
        self.barrier_seq = self.barrier_end = None
        return [self.entries.pop(opaque) for opaque in settled]


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
        decided = None if end.offset in core.ending else core.outcome(end.offset)
        if end.offset in core.ending:
            again.append(end)
        elif decided == end.asked:
            end.batch.set(end.i, out, "OK", "")
        elif decided is not None:
            end.batch.set(end.i, out, "OK", f"the transaction was ended already ({decided})", outcome=decided)
        else:  # (opened again meanwhile: nothing of it was stored)
            end.batch.set(end.i, out, "SYSTEM_BUSY", "the outcome was not stored; end it again")
    return again
