"""The transaction service's core (RocketMQ 4.9's TransactionalMessageServiceImpl, its check
service and EndTransactionProcessor, in one state machine). No I/O: the shell reads the half and
op queues for it, hands it the clock, and carries out what it decides.

A half is known by its queue offset in RMQ_SYS_TRANS_HALF_TOPIC queue 0 (`offset`). Its fate is
written, never kept only in memory, as op records in RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0: a body
of comma-joined half offsets (RocketMQ 5's form; 4.9 writes one per record) and the property
`TRAN_OP` naming the outcome: `commit`, `rollback` or `discard` (final), or `check` (one more
check was sent: `offset:count` items, so a replay sets the count instead of adding to it). The
state is what those records say, read back in queue order (`op`), on a master as on a slave, so
a restart, a promoted slave and the running master rebuild it the same way. What is decided but
not yet read back (`ending`) is held only to answer a repeat at once.

Per half offset below `read_to`: an outcome byte in `outcomes` (from `base`; `low` is the first
offset not final, and up to KEEP_BELOW_LOW outcomes below it are kept, so a late repeat of an end
is told what it was) and, while undecided, a `Half` in `pending` (insertion order = offset order, as the halves
are read in order). A check pass (`due_checks`) finds the pending halves older than
`transactionTimeOut` (or their own CHECK_IMMUNITY_TIME_IN_SECONDS) and not checked for an
interval: those checked `transactionCheckMax` times are discarded, the others checked.
"""

from __future__ import annotations

import base64
import zlib
from collections import Counter
from dataclasses import dataclass

TORN_READ_A_TURN = 65_536  # queue entries TornCommits reads at most a turn (~80 ms: the loop's heartbeat waits)
PENDING_MAX = 1_000_000  # halves held undecided at once; reading the half queue waits beyond it
KEEP_BELOW_LOW = 1 << 20  # final outcomes kept below `low` (a byte each)
CHECKS_PER_PASS = 200_000  # halves a check pass takes at most (the rest: the next pass)
COMMIT, ROLLBACK, DISCARD, CHECK = "commit", "rollback", "discard", "check"
FINAL = (COMMIT, ROLLBACK, DISCARD)
GONE, ENDED = "gone", "ended"  # read but not a half (or its record gone); below `low` (which outcome, forgotten)
_CODE = {COMMIT: 1, ROLLBACK: 2, DISCARD: 3, GONE: 4}  # outcome bytes (0: not final)
_NAME = {code: name for name, code in _CODE.items()}
# END_TRANSACTION's refusals (SYSTEM_ERROR, as 4.9 answers them): their remarks begin so
NO_HALF, WRONG_GROUP = "Find prepared transaction message failed", "The producer group wrong"
END_OUTCOMES = {8: COMMIT, 12: ROLLBACK}  # END_TRANSACTION's commitOrRollback (0, unknown: nothing to do)


@dataclass(slots=True)
class Half:
    offset: int
    phy: int  # its CommitLog offset and size
    size: int
    stored_ms: int
    group: str  # PGROUP: the producers asked about it
    immunity_ms: int  # no check before it is this old
    topic: str = ""  # REAL_TOPIC and REAL_QID: where its commit goes
    queue_id: int = 0
    checks: int = 0  # as the op records say
    checked_ms: int = 0  # when this service last asked (0: not since it started)
    inner: int = 0  # a one-half batch's message count (INNER_NUM; 0: one message)


class TransactionCore:
    def __init__(self, timeout_ms: int, check_max: int, interval_ms: int, snapshot: dict | None = None):
        self.timeout_ms, self.check_max, self.interval_ms = timeout_ms, check_max, interval_ms
        snapshot = snapshot or {}
        self.low = self.read_to = int(snapshot.get("low", 0))
        self.base = int(snapshot.get("base", self.low))  # the offset of outcomes[0]
        self.op_read_to = int(snapshot.get("opOffset", 0))
        self.outcomes = bytearray(zlib.decompress(base64.b64decode(snapshot["outcomes"]))) if snapshot.get("outcomes") \
            else bytearray()  # offset low + i -> outcome code
        self.checks_of: dict[int, int] = {int(k): v for k, v in (snapshot.get("checks") or {}).items()}
        self.pending: dict[int, Half] = {}
        self.ending: dict[int, str] = {}  # decided here, op not yet read back
        self.counts = dict.fromkeys(FINAL, 0) | (snapshot.get("counts") or {})
        self.checks_sent = self.repeats = 0
        self.checked = 0  # pending halves checked at least once (kept as they change: statistics walk nothing)

    # -- what the queues say -------------------------------------------------------------------------

    def outcome(self, offset: int) -> str | None:
        """The final outcome of a half, or None while it is open (or not read yet)."""
        i = offset - self.base
        if i < 0:
            return ENDED
        return _NAME.get(self.outcomes[i]) if i < len(self.outcomes) else None

    def op(self, kind: str, items: list[str]) -> None:
        """One op record read back: `items` its body split at commas."""
        for item in items:
            offset_text, _, count = item.partition(":")
            if not offset_text.isdigit():
                continue  # (not ours: a record another writer made; nothing to learn from it)
            offset = int(offset_text)
            if kind == CHECK:
                self._checked(offset, int(count) if count.isdigit() else 1)
            elif kind in FINAL:
                self._final(offset, kind)
        self.op_read_to += 1

    def _checked(self, offset: int, count: int) -> None:
        half = self.pending.get(offset)
        if half is not None:
            self.checked += not half.checks and count > 0
            half.checks = max(half.checks, count)
        elif offset >= self.read_to:
            self.checks_of[offset] = max(self.checks_of.get(offset, 0), count)

    def _final(self, offset: int, kind: str) -> None:
        self.ending.pop(offset, None)
        if not self._mark(offset, kind):
            return  # a repeat (a replay, a second end): nothing changes
        self.counts[kind] += 1
        half = self.pending.pop(offset, None)
        self.checked -= half is not None and half.checks > 0
        self.checks_of.pop(offset, None)
        self._advance()

    def _mark(self, offset: int, kind: str) -> bool:
        """The outcome byte of `offset` set, unless it is set already (False)."""
        i = offset - self.base
        if i < 0 or (i < len(self.outcomes) and self.outcomes[i]):
            return False
        if i >= len(self.outcomes):
            self.outcomes.extend(bytes(i + 1 - len(self.outcomes)))
        self.outcomes[i] = _CODE[kind]
        return True

    def half(self, half: Half | None) -> None:
        """The half at `read_to`, read (None: not a half this service can use, a record gone)."""
        offset = self.read_to
        self.read_to += 1
        if self.outcome(offset) is None:
            if half is None:
                self._mark(offset, GONE)
            else:
                half.checks = max(half.checks, self.checks_of.pop(offset, 0))
                self.pending[offset] = half
                self.checked += half.checks > 0
                if offset - self.base >= len(self.outcomes):  # (its byte, 0 while open, keeps `low` here)
                    self.outcomes.extend(bytes(offset - self.base + 1 - len(self.outcomes)))
        self._advance()

    def halves_gone(self, first: int) -> None:
        """The half queue now starts at `first` (cleaned): what lay below is gone, open or not
        (all of it was read: `first` > `read_to`). Outcomes of halves ended before they were read
        stay."""
        if first <= self.read_to:
            return
        self.pending.clear()
        self.checked = 0
        del self.outcomes[:first - self.base]
        self.base = self.low = self.read_to = first

    def room(self) -> int:
        """How many more halves may be read now."""
        return max(0, PENDING_MAX - len(self.pending))

    def _advance(self) -> None:
        """`low` to the first offset that is neither final nor beyond what was read; outcome
        bytes more than KEEP_BELOW_LOW below it are dropped (a slice now and then)."""
        outcomes, base = self.outcomes, self.base
        # (an open half's byte is 0: the walk stops there without looking at `pending`, whose first
        # key costs a walk over every slot its deleted keys left)
        limit = min(self.read_to, base + len(outcomes)) - base
        i = self.low - base
        while i < limit and outcomes[i]:
            i += 1
        self.low = base + i
        if i > 2 * KEEP_BELOW_LOW:
            cut = i - KEEP_BELOW_LOW
            del outcomes[:cut]
            self.base = base + cut

    # -- ends ---------------------------------------------------------------------------------------

    def end(self, offset: int, outcome: str) -> str | None:
        """An END_TRANSACTION for a half (its record checked by the shell): None when this
        service is to store the outcome now, else the outcome already decided (a repeat changes
        nothing, whatever it asks)."""
        decided = self.ending.get(offset) or self.outcome(offset)
        if decided is not None:
            self.repeats += 1
            return decided
        self.ending[offset] = outcome
        return None

    def end_failed(self, offset: int) -> None:
        """Its outcome was not stored: the half is open again (a producer may end it, or the check)."""
        self.ending.pop(offset, None)

    # -- checks -------------------------------------------------------------------------------------

    def due_checks(self, now_ms: int) -> tuple[list[Half], list[Half]]:
        """(to check, to discard): pending halves old enough and not asked for an interval."""
        checks, discards = [], []
        for half in self.pending.values():
            if len(checks) + len(discards) >= CHECKS_PER_PASS:
                break
            if half.offset in self.ending or now_ms - half.stored_ms < max(self.timeout_ms, half.immunity_ms):
                continue
            if half.checked_ms and now_ms - half.checked_ms < self.interval_ms:
                continue
            if half.checks >= self.check_max:
                discards.append(half)
                self.ending[half.offset] = DISCARD
            else:
                half.checked_ms = now_ms
                checks.append(half)
        self.checks_sent += len(checks)
        return checks, discards

    # -- state ------------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """What a restart needs besides the queues: where to read them from, and the outcomes of
        what was read (the halves still open are read again)."""
        return {"low": self.low, "base": self.base, "opOffset": self.op_read_to,
                "outcomes": base64.b64encode(zlib.compress(bytes(self.outcomes), 1)).decode(),
                "checks": {str(o): h.checks for o, h in self.pending.items() if h.checks}
                | {str(o): n for o, n in self.checks_of.items()},
                "counts": dict(self.counts)}

    def statistics(self, now_ms: int) -> dict:
        oldest = self.pending.get(self.low)  # (the first open half is where `low` stopped)
        return {"pending": len(self.pending), "checked": self.checked, "committed": self.counts[COMMIT],
                "rolledBack": self.counts[ROLLBACK], "discarded": self.counts[DISCARD], "ending": len(self.ending),
                "checksSent": self.checks_sent, "repeatedEnds": self.repeats, "low": self.low, "readTo": self.read_to,
                "opReadTo": self.op_read_to, "oldestPendingMillis": now_ms - oldest.stored_ms if oldest else 0}

    def listing(self, now_ms: int, limit: int = 100) -> list[dict]:
        """The first `limit` open halves, for `mqnode admin transactions`."""
        out = []
        for half in self.pending.values():
            if len(out) >= limit:
                break
            out.append({"offset": half.offset, "commitLogOffset": half.phy, "producerGroup": half.group,
                        "topic": half.topic, "ageMillis": now_ms - half.stored_ms, "checks": half.checks,
                        "messages": half.inner or 1})
        return out


def end_outcome(header: dict) -> str | None:
    """END_TRANSACTION's asked outcome (None: UNKNOW, left to the check)."""
    return END_OUTCOMES.get(header["commitOrRollback"])


class TornCommits:
    """Committed messages a crash stored without their op record, so that a half is never
    committed twice, nor rolled back half-committed, by the node's own fault.

    The service writes a commit as one request, the committed messages and then the op record,
    which the writer appends whole; but a node killed inside that append keeps, after recovery,
    the messages before the cut and not the op (a writer killed alone loses the whole append: it
    resumes at `written`). The half is then open, and ending it again would store those messages
    a second time. So before a half stored by an earlier run of the node is ended, the messages
    of it already stored are counted (`stored`): a commit re-puts only the rest (none: the op
    record alone), and a rollback, a check or a discard of such a half finishes its commit
    instead (the shell).

    Where such messages can lie: past `horizon`, the end of the last op record stored before
    this run began to end halves (every request before the torn one ended with its op record),
    and below `before`, the CommitLog's dispatched end then. Only halves below `halves_before` (the
    half queue's end then) are suspects. `count(topic, queue_id, low, high, limit)` reads a
    queue's committed records in [low, high), at most `limit` entries: (counts by the half they
    commit, where it stopped, entries read) (shm.reader.commits_stored). Each queue is read once,
    and again only below where it was read; at most `budget` entries a turn (`new_turn`), so a long
    read goes on over turns and `stored` says None until it is whole.

    A commit still on its way when only the service was killed is not torn: its successor ends
    nothing before a barrier behind it has passed the write path (actors.transaction
    `_prepare_ending`), and then reads its op record."""

    def __init__(self, horizon: int, before: int, halves_before: int, count, budget: int = TORN_READ_A_TURN):
        self.horizon, self.before, self.halves_before, self.count, self.budget = \
            horizon, before, halves_before, count, budget
        self.seen: dict[tuple[str, int], tuple[int, Counter]] = {}  # queue -> (read down to, counts)
        self.reading: dict[tuple[str, int], tuple[int, int]] = {}  # queue -> (reading down to, from where on)
        self.left = budget  # entries this turn may still read
        self.found: set[int] = set()  # the halves found with messages stored already (their CommitLog offsets)

    def suspects(self, low: int) -> bool:
        """Whether any half below `halves_before` may still be open (`low`: the first not final)."""
        return low < self.halves_before and self.horizon < self.before

    def new_turn(self) -> bool:
        """A turn's budget, spent first on the reads under way; True while one is (turn again soon)."""
        self.left = self.budget
        if self.reading:
            for key in list(self.reading):
                self._read(key)
        return bool(self.reading)

    def stored(self, topic: str, queue_id: int, offset: int, phy: int) -> int | None:
        """How many committed messages of the half at queue offset `offset`, CommitLog offset `phy`,
        for `topic` and `queue_id`, are stored already; None while its queue is still being read."""
        if offset >= self.halves_before or self.horizon >= self.before:
            return 0
        low, key = max(self.horizon, phy), (topic, queue_id)
        if low < self.seen.get(key, (self.before,))[0]:
            if key not in self.reading:
                self.reading[key] = (low, low)
            self._read(key)
            if low < self.seen.get(key, (self.before,))[0]:
                return None
        found = self.seen[key][1].get(phy, 0)
        if found:
            self.found.add(phy)
        return found

    def _read(self, key: tuple[str, int]) -> None:
        """The read under way for `key` goes on, within this turn's budget."""
        if self.left <= 0:
            return
        target, at = self.reading[key]
        down_to, counts = self.seen.get(key, (self.before, Counter()))
        found, at, read = self.count(*key, at, down_to, self.left)
        self.left -= read
        counts = counts + found
        if at < down_to:
            self.seen[key], self.reading[key] = (down_to, counts), (target, at)
        else:
            del self.reading[key]
            self.seen[key] = (target, counts)
