"""actors.transaction_reputs: a re-put is kept until it is answered; past its deadline an end
waits for a barrier sent behind it, only what was sent before a barrier is settled by it, and
each is answered or sent again as the op records read by then say."""

import time

from actors.reput import op_item
from actors.transaction_core import CHECK, COMMIT, DISCARD, ROLLBACK, TransactionCore
from actors.transaction_ends import End, Ends
from actors.transaction_reputs import Barrier, Overdue, Reputs, answer_settled


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


def reputs() -> tuple[Reputs, list]:
    sent: list = []
    return Reputs(lambda header, body: sent.append((header, body))), sent


def test_a_re_put_is_kept_until_its_answer():
    r, sent = reputs()
    r.put([op_item(COMMIT, ["1", "2"], 0)], ("end", [], [COMMIT]))
    header, body = sent[0]
    assert header["messages"][0]["topic"] == "RMQ_SYS_TRANS_OP_HALF_TOPIC" and body == b"1,2"
    assert r.bytes == 3 and r.in_flight()
    assert r.answer({"opaque": header["opaque"], "status": "PUT_OK"}, 0) == (("end", [], [COMMIT]), 1)
    assert r.bytes == 0 and not r.in_flight()
    assert r.answer({"opaque": header["opaque"], "status": "PUT_OK"}, 0) is None  # (answered once)


def test_past_the_deadline_an_end_waits_for_a_barrier_a_check_and_a_barrier_do_not():
    r, sent = reputs()
    start = Barrier()
    r.put([op_item(COMMIT, ["5"], 0)], ("end", ["the end"], [COMMIT]))
    r.put([op_item(CHECK, ["6:1"], 0)], (CHECK,))
    r.barrier(start)
    r.expire(time.monotonic() + 3600)
    assert r.expired == 3 and not start.on_its_way()  # (the start's barrier: sent again by its owner)
    assert list(r.overdue.entries) == [sent[0][0]["opaque"]] and r.bytes == 1
    assert r.settled(lambda end: True) == []  # first a barrier behind it
    barrier = sent[-1][0]
    assert barrier["messages"] == [] and r.overdue.barrier.on_its_way()
    assert r.answer({"opaque": barrier["opaque"], "status": "PUT_OK"}, 4096) is None
    assert r.settled(lambda end: end < 4096) == []  # (its op records not read yet)
    assert r.settled(lambda end: end == 4096) == [("end", ["the end"], [COMMIT])]
    assert r.bytes == 0 and not r.in_flight()


def test_a_late_answer_to_an_overdue_re_put_is_taken():
    r, sent = reputs()
    r.put([op_item(ROLLBACK, ["7"], 0)], ("end", [], [ROLLBACK]))
    r.expire(time.monotonic() + 3600)
    assert r.answer({"opaque": sent[0][0]["opaque"], "status": "PUT_OK"}, 0) == (("end", [], [ROLLBACK]), 1)
    assert r.overdue.entries == {} and r.bytes == 0
