"""actors.transaction_overdue: re-puts past their deadline wait for a barrier sent behind them,
only what was sent before the barrier is settled by it, and each is answered or sent again as
the op records read by then say."""

from actors.transaction_core import COMMIT, DISCARD, ROLLBACK, TransactionCore
from actors.transaction_ends import End, Ends
from actors.transaction_overdue import Overdue, answer_settled


def entry(seq: int) -> tuple:
    return ("end", [], 0.0, 100, seq)


def test_nothing_is_settled_before_the_barrier_is_stored_and_read_to_its_end():
    overdue = Overdue()
    overdue.add(7, entry(1))
    assert overdue.needs_barrier()
    overdue.barrier.sent(3)
    assert not overdue.needs_barrier()  # (one at a time)
    assert overdue.settled(lambda end: True) == []  # not answered yet
    overdue.barrier.answered(True, 4096)
    assert overdue.settled(lambda end: end < 4096) == []  # the op records below it not read yet
    assert overdue.settled(lambda end: end == 4096) == [entry(1)]
    assert overdue.entries == {} and not overdue.needs_barrier()


def test_a_barrier_refused_is_sent_again():
    overdue = Overdue()
    overdue.add(7, entry(1))
    overdue.barrier.sent(2)
    overdue.barrier.answered(False, 0)
    assert overdue.needs_barrier() and overdue.settled(lambda end: True) == []


def test_a_re_put_sent_after_the_barrier_waits_for_the_next_one():
    overdue = Overdue()
    overdue.add(1, entry(1))
    overdue.barrier.sent(2)
    overdue.add(5, entry(3))  # (sent after the barrier, overdue since)
    overdue.barrier.answered(True, 100)
    assert overdue.settled(lambda end: True) == [entry(1)]
    assert list(overdue.entries) == [5] and overdue.needs_barrier()


def test_a_late_answer_takes_its_entry_out():
    overdue = Overdue()
    overdue.add(1, entry(1))
    assert overdue.pop(1) == entry(1) and overdue.pop(1) is None
    assert not overdue.needs_barrier()


def test_a_settled_end_is_answered_if_its_op_record_was_read_and_goes_again_if_not():
    core = TransactionCore(6000, 15, 60000)
    assert core.end(5, COMMIT) is None and core.end(6, COMMIT) is None
    batch = Ends(b"client", 1, 9, False, 2, single=False)
    ends = [End(5, COMMIT, 100, None, None, batch, 0), End(6, COMMIT, 200, None, None, batch, 1)]
    core.op(COMMIT, ["5"])  # (5's op record stored before the barrier; 6's not)
    out: list = []
    assert answer_settled(("end", ends, [COMMIT]), core, out) == [ends[1]]
    assert batch.results[0] == {"status": "OK"} and batch.left == 1 and out == []  # (6 still to come)
    assert core.ending == {6: COMMIT}  # still decided: an end of it meanwhile is a repeat
    assert core.end(6, ROLLBACK) == COMMIT


def test_a_settled_discard_not_stored_opens_its_halves_again():
    core = TransactionCore(6000, 15, 60000)
    core.ending.update({3: DISCARD, 4: DISCARD})
    core.op(DISCARD, ["3"])
    assert answer_settled((DISCARD, [3, 4]), core, []) == []
    assert core.ending == {} and core.outcome(3) == DISCARD and core.outcome(4) is None
