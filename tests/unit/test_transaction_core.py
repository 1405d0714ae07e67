"""The transaction service's core without I/O: outcomes read back from op records, open halves,
checks and discards on a given clock, repeats that change nothing, and a restart from a snapshot
plus the queues that rebuilds the same state whatever order the replay takes."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.transaction_core import CHECK, COMMIT, DISCARD, ENDED, GONE, ROLLBACK, Half, TornCommits, TransactionCore


def core(**kw) -> TransactionCore:
    return TransactionCore(timeout_ms=6000, check_max=3, interval_ms=60_000, **kw)


def half(offset: int, stored_ms: int = 0, **kw) -> Half:
    return Half(offset, phy=offset * 100, size=100, stored_ms=stored_ms, group="PG", immunity_ms=0, **kw)


def read(c: TransactionCore, count: int, stored_ms: int = 0) -> None:
    for _ in range(count):
        c.half(half(c.read_to, stored_ms))


def test_an_outcome_read_back_closes_its_half_and_moves_low():
    c = core()
    read(c, 3)
    assert list(c.pending) == [0, 1, 2] and c.low == 0
    c.op(COMMIT, ["0"])
    c.op(ROLLBACK, ["2"])
    assert list(c.pending) == [1] and c.low == 1
    assert c.outcome(0) == COMMIT and c.outcome(2) == ROLLBACK and c.outcome(1) is None
    c.op(COMMIT, ["1"])
    assert not c.pending and c.low == 3 and c.counts == {COMMIT: 2, ROLLBACK: 1, DISCARD: 0}


def test_an_end_before_its_half_is_read_is_known_when_it_is():
    c = core()
    assert c.end(5, COMMIT) is None
    c.op(COMMIT, ["5"])
    read(c, 6)
    assert list(c.pending) == [0, 1, 2, 3, 4] and c.outcome(5) == COMMIT


def test_a_repeat_changes_nothing_whatever_it_asks():
    c = core()
    read(c, 1)
    assert c.end(0, ROLLBACK) is None
    assert c.end(0, COMMIT) == ROLLBACK  # decided, its op not read back yet
    c.op(ROLLBACK, ["0"])
    c.op(COMMIT, ["0"])  # (a record that would flip it: ignored)
    assert c.end(0, COMMIT) == ROLLBACK and c.counts[COMMIT] == 0 and c.repeats == 2


def test_a_failed_end_opens_the_half_again():
    c = core()
    read(c, 1)
    c.end(0, COMMIT)
    c.end_failed(0)
    assert c.end(0, ROLLBACK) is None


def test_checks_start_after_the_timeout_and_repeat_each_interval_until_the_max():
    c = core()
    read(c, 1, stored_ms=1000)
    assert c.due_checks(6999) == ([], [])
    checks, _ = c.due_checks(7000)
    assert [h.offset for h in checks] == [0]
    assert c.due_checks(7000 + 59_999) == ([], [])  # asked within the interval
    c.op(CHECK, ["0:1"])
    for n in (2, 3):
        checks, _ = c.due_checks(7000 + 60_000 * (n - 1))
        assert [h.offset for h in checks] == [0]
        c.op(CHECK, [f"0:{n}"])
    checks, discards = c.due_checks(7000 + 60_000 * 3)
    assert checks == [] and [h.offset for h in discards] == [0]
    assert c.end(0, COMMIT) == DISCARD  # a discard under way is decided
    c.op(DISCARD, ["0"])
    assert c.outcome(0) == DISCARD and not c.pending


def test_a_half_asks_for_more_time_with_its_immunity():
    c = core()
    c.half(Half(0, 0, 100, stored_ms=0, group="PG", immunity_ms=20_000))
    assert c.due_checks(19_999) == ([], [])
    assert len(c.due_checks(20_000)[0]) == 1


def test_check_counts_replay_as_counts_not_additions():
    c = core()
    c.op(CHECK, ["0:2"])
    c.op(CHECK, ["0:2"])  # (read twice: a restart from an older snapshot)
    read(c, 1)
    assert c.pending[0].checks == 2


def test_records_that_are_not_halves_are_gone_and_do_not_hold_low():
    c = core()
    c.half(None)
    read(c, 1)
    c.half(None)
    assert c.outcome(0) == GONE and c.low == 1
    c.op(COMMIT, ["1"])
    assert c.low == 3 and c.counts[COMMIT] == 1


def test_a_cleaned_half_queue_drops_what_lay_below():
    c = core()
    read(c, 4)
    c.op(COMMIT, ["1"])
    c.end(9, ROLLBACK)
    c.op(ROLLBACK, ["9"])
    c.halves_gone(6)
    assert not c.pending and c.low == c.read_to == 6 and c.outcome(9) == ROLLBACK and c.outcome(3) == ENDED


def test_ops_that_are_not_offsets_are_skipped():
    c = core()
    read(c, 1)
    c.op(COMMIT, ["", "x", "-1"])
    assert list(c.pending) == [0] and c.op_read_to == 1


def test_a_restart_from_a_snapshot_and_the_queues_rebuilds_the_same_state():
    rng = random.Random(7)
    ops: list[tuple[str, list[str]]] = []
    c = core()
    for _ in range(50):
        read(c, 20)
        for offset in list(c.pending):
            pick = rng.random()
            if pick < 0.5:
                ops.append((COMMIT if rng.random() < 0.7 else ROLLBACK, [str(offset)]))
            elif pick < 0.6:
                ops.append((CHECK, [f"{offset}:1"]))
        for kind, items in ops[c.op_read_to:]:
            c.op(kind, items)
    total = c.read_to
    snapshot = c.snapshot()
    for cut in (0, len(ops) // 3, len(ops)):  # (an older snapshot replays more: the same result)
        again = core(snapshot=snapshot if cut == len(ops) else None)
        for kind, items in ops[again.op_read_to:]:
            again.op(kind, items)
        while again.read_to < total:
            again.half(half(again.read_to))
        assert list(again.pending) == list(c.pending)
        assert {o: h.checks for o, h in again.pending.items()} == {o: h.checks for o, h in c.pending.items()}
        assert all(again.outcome(o) == c.outcome(o) for o in range(c.low, total))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([COMMIT, ROLLBACK, CHECK]), st.integers(0, 40)), max_size=120),
       st.integers(0, 40))
def test_low_is_always_the_first_offset_still_open(events, reads):
    c = core()
    read(c, reads)
    for kind, offset in events:
        c.op(kind, [f"{offset}:1" if kind == CHECK else str(offset)])
        first_open = next(iter(c.pending), None)
        assert c.low == (first_open if first_open is not None else max(c.read_to, c.low))
        assert all(c.outcome(o) is None for o in c.pending)
        assert set(c.pending) == {o for o in range(c.read_to) if c.outcome(o) is None}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("read"), st.integers(1, 5)),
                          st.tuples(st.just("cleaned"), st.integers(0, 3)),
                          st.tuples(st.sampled_from([COMMIT, ROLLBACK, CHECK]), st.integers(0, 40))), max_size=120))
def test_the_checked_count_kept_as_halves_change_is_what_the_open_halves_say(events):
    """`statistics` counts the checked halves without walking a million of them: the count kept
    is the walk's, whatever order reads, checks (before or after their half is read), ends and
    a cleaned queue come in."""
    c = core()
    for kind, n in events:
        if kind == "read":
            read(c, n)
        elif kind == "cleaned":
            c.halves_gone(c.read_to + n)
        else:
            c.op(kind, [f"{n}:2" if kind == CHECK else str(n)])
        assert c.statistics(0)["checked"] == sum(1 for h in c.pending.values() if h.checks)


def test_ends_past_the_waiting_bound_are_refused_busy_and_states_still_answered(tmp_path):
    """The service reads its ring on (the front's answers to its re-puts share it) and refuses
    ends while ENDS_WAITING wait for the write path: memory stays bounded, the client is told."""
    import collections

    import orjson

    from actors import transaction as service
    from node import protocol
    from shm import settings as settings_module

    shell = service.Transaction(settings_module.load(None, {"storePathRootDir": str(tmp_path)}))
    shell.core = TransactionCore(6000, 15, 60_000)
    shell.ends, shell.refused_ends = collections.deque([None] * service.ENDS_WAITING), 0
    out: list = []
    shell._serve({"code": protocol.END_TRANSACTIONS, "opaque": 7, "producerGroup": "PG",
                  "ends": [{"tranStateTableOffset": 0, "commitLogOffset": 0, "commitOrRollback": 8}]}, b"c", 1, out)
    shell._serve({"code": protocol.GET_TRANSACTION_STATE, "opaque": 8}, b"c", 2, out)
    refused, state = (orjson.loads(reply[2]) for reply in out)
    assert refused["status"] == "SYSTEM_BUSY" and "wait for the write path" in refused["remark"]
    assert state["status"] == "OK" and shell.refused_ends == 1 and len(shell.ends) == service.ENDS_WAITING


class _Queues:
    """TornCommits' `count`: committed records by queue as (CommitLog offset, the half's offset),
    and each read asked of it."""

    def __init__(self, stored: dict):
        self.stored, self.reads = stored, []

    def __call__(self, topic: str, queue_id: int, low: int, high: int, limit: int) -> tuple[Counter, int, int]:
        self.reads.append((topic, queue_id, low, high))
        records = [(phy, half) for phy, half in self.stored.get((topic, queue_id), []) if low <= phy < high]
        read, rest = records[:limit], records[limit:]
        return Counter(half for _, half in read), rest[0][0] if rest else high, len(read)


def test_a_torn_commit_is_counted_between_the_last_op_and_the_start_and_each_queue_read_once():
    queues = _Queues({("T", 1): [(900, 500), (1000, 500), (1100, 700), (1200, 500)],  # (900: below the horizon)
                      ("T", 2): [(1300, 800)]})
    torn = TornCommits(horizon=950, before=2000, halves_before=10, count=queues)
    assert torn.stored("T", 1, 4, 700) == 1 and torn.stored("T", 1, 3, 500) == 2  # (500's at 900 is an older op's)
    assert queues.reads == [("T", 1, 950, 2000)]  # (the second half read nothing: its queue was read down to it)
    assert torn.stored("T", 2, 5, 800) == 1 and torn.found == {500, 700, 800}
    assert torn.stored("T", 1, 10, 600) == 0  # stored by this run (at or past halves_before): not a suspect
    assert torn.stored("T", 1, 2, 100) == 0 and len(queues.reads) == 2  # (its commit would lie past the horizon: read)
    assert torn.suspects(low=9) and not torn.suspects(low=10)


def test_a_half_older_than_what_was_read_reads_its_queue_further_down_only():
    queues = _Queues({("T", 0): [(100, 50), (300, 250)]})
    torn = TornCommits(horizon=0, before=1000, halves_before=5, count=queues)
    assert torn.stored("T", 0, 3, 250) == 1 and queues.reads == [("T", 0, 250, 1000)]
    assert torn.stored("T", 0, 1, 50) == 1 and queues.reads[-1] == ("T", 0, 50, 250)
    assert torn.stored("T", 0, 2, 250) == 1  # (what was read stays counted)


def test_no_tear_is_looked_for_when_no_record_followed_the_last_op():
    queues = _Queues({})
    torn = TornCommits(horizon=2000, before=2000, halves_before=10, count=queues)
    assert torn.stored("T", 0, 1, 100) == 0 and queues.reads == [] and not torn.suspects(low=0)


def test_a_long_read_goes_on_over_turns_within_a_budget_and_answers_once_it_is_whole():
    queues = _Queues({("T", 0): [(100 + i, 50 if i % 2 else 60) for i in range(7)],
                      ("U", 0): [(200, 70)]})
    torn = TornCommits(horizon=0, before=1000, halves_before=5, count=queues, budget=3)
    assert torn.stored("T", 0, 1, 50) is None and torn.stored("U", 0, 2, 70) is None  # (the turn's 3 are spent)
    assert torn.new_turn()  # (the reads under way go on: 3 more of T's)
    assert torn.stored("T", 0, 1, 50) is None
    assert not torn.new_turn()  # T's last one and U's: both whole
    assert torn.stored("T", 0, 1, 50) == 3 and torn.stored("T", 0, 2, 60) == 4 and torn.stored("U", 0, 3, 70) == 1
    assert torn.stored("T", 0, 4, 40) == 0 and queues.reads[-1] == ("T", 0, 40, 50)  # (below: read further down)
    assert torn.found == {50, 60, 70} and len(queues.reads) == 5
