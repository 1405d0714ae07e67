"""transaction: transactional messages' service (RocketMQ 4.9's EndTransactionProcessor and
TransactionalMessageCheckService in one process actor; docs/protocol.md "Transactions").

A send with TRAN_MSG=true is stored by the write path as a half (actors.delays): queue 0 of
RMQ_SYS_TRANS_HALF_TOPIC, its real topic and queue in REAL_TOPIC/REAL_QID, invisible. This
service ends it: END_TRANSACTION commit re-puts the real message (sysFlag COMMIT,
PREPAREDTRANSACTIONOFFSET the half's offset) and an op record; rollback writes the op record
only. Every `transactionCheckInterval` ms it asks a producer of the half's group about each half
older than `transactionTimeOut` that nothing ended (CHECK_TRANSACTION_STATE through the front, over
that producer's own connection); after `transactionCheckMax` checks the half goes to
TRANS_CHECK_MAX_TIME_TOPIC instead. `TransactionCore` (actors.transaction_core) decides.

Links (actors.links) and sockets:
- ring `front-to-transaction`: END_TRANSACTION, END_TRANSACTIONS, GET_TRANSACTION_STATE, and the
  front's answers to this service's re-puts (addressed to TRANSACTION_CLIENT).
- ring `transaction-to-front`: their answers (one too large for a ring message, a long listing:
  the front's `replies`), and the re-puts: the committed messages, discards and op records,
  stored through the write path as given, as replies to TRANSACTION_CLIENT, which the front
  serves as the write path's requests. (Over ZeroMQ sockets, each re-put and its answer woke
  three threads more a round: ~10-15 % of a transactional send's node CPU at 64 in flight.)
- `checks` PUSH to the front's `transaction-checks`: each check, with the group to ask.

Commit order: one request carries a turn's committed messages and then their op record, so the
writer appends them together, the op last. The outcome counts once the op is stored (answered as
the write mode promises). A node killed inside that append keeps the messages before the cut and
not the op: the half is open again, and its next end re-puts only what is missing
(`TornCommits`, actors.transaction_core), where RocketMQ would commit it a second time. This
service killed alone can leave a commit on its way that its successor cannot see yet: that one
ends nothing before a barrier sent behind it has passed the write path (`_prepare_ending`). A
re-put the write path does not answer in time stays decided until a barrier behind it says
whether it was stored (actors.transaction_reputs, which keeps the re-puts on their way).

State is what the op and half queues say (read back each turn, on a slave too: a promoted slave
goes on from where its own reading stands), plus a snapshot (`config/transactionCheck.json`,
every `flushConsumerOffsetInterval` ms and at stop) that says where to read them from.
"""

from __future__ import annotations

import collections
import time

import orjson
import zmq

from actors import config_files
from actors.base import Actor, socket
from actors.links import inbox, reply_outbox, service_links_statistics
from actors.reput import (
    stored_of,
    commit_batch_item,
    commit_item,
    delivered_statuses,
    discard_item,
    op_item,
)
from actors.transaction_core import (
    CHECK,
    COMMIT,
    DISCARD,
    NO_HALF,
    ROLLBACK,
    WRONG_GROUP,
    Half,
    TornCommits,
    TransactionCore,
    end_outcome,
)
from actors.transaction_ends import End, Ends, reply
from actors.transaction_halves import inner_count, not_the_half
from actors.transaction_queues import TransactionQueues
from actors.transaction_reputs import Barrier, Reputs, answer_settled
from actors.wire import SERVICE_SEND, read_from_wire
from node import protocol
from node.frames import send_frames
from shm import reader as store_reader
from shm.codec import PROPERTY_UNIQ_KEY, offset_msg_id
from shm.control_block import ROLE_CODES

TRANSACTION_CLIENT = b"\x00mqnode-transaction"  # its re-puts' pseudo-client at the front (no peer's id begins with 0)
ENDS_A_REQUEST = 256  # ends a re-put request carries at most ...
REPUT_BYTES = 768 << 10  # ... and bytes of committed messages (unless one alone is more): a re-put request
# then fits a message of the service's ring to the front (READ_RING: ~1 MiB), not its socket fallback
REPUT_BYTES_IN_FLIGHT = 8 << 20  # bytes of re-puts unanswered at once: the rest wait here (a Spark commit of
# a million rows would otherwise fill the writer's ring, and its sends be refused SYSTEM_BUSY)
ENDS_WAITING = 200_000  # ends decided and not yet re-put; beyond, an end request is refused SYSTEM_BUSY
OP_RETRY_S = 1.0  # a commit's op record refused is written again after this
LIST_LIMIT = 100  # open halves `admin transactions` lists
LATER = object()  # `_commit_item`: not yet (TornCommits reads on next turn)
HELD_LIMIT = 10_000  # end requests held while the service prepares to end halves; beyond, SYSTEM_BUSY
OPEN_ENDS_A_REQUEST = 100_000  # open halves one `openOfGroup` request rolls back (the client asks again)


class Transaction(Actor):
    name = "transaction"

    def __init__(self, settings):
        super().__init__(settings)
        self.core: TransactionCore | None = None
        self.reader = None
        self.requests = self.replies = None

    def open(self) -> None:
        s = self.settings
        self.reader = store_reader.StoreReader(s)
        self.reader.commitlog_min = self.control.get("min_offset")
        self.path = s.root / "config" / "transactionCheck.json"
        snapshot = config_files.read(self.path) or {}
        self.core = TransactionCore(s.transactionTimeOut, s.transactionCheckMax, s.transactionCheckInterval, snapshot)
        self.queues = TransactionQueues(self.reader, self.core)
        self.torn_horizon = snapshot.get("tornHorizon")  # an earlier run's, while its suspects stay open
        self.torn: TornCommits | None = None  # set when this run begins to end halves (as a master)
        self.start = Barrier()  # this run's first (`_prepare_ending`)
        self.held: collections.deque = collections.deque()  # end requests that came before it passed
        self.requests = inbox(self, read_from_wire)
        self.replies = reply_outbox(self)
        self.checks = socket(self.context, zmq.PUSH, hwm=1_000_000)
        self.checks.connect(self.endpoints["transaction-checks"])
        self.items = self.requests.poll_items()
        self.ends: collections.deque[End] = collections.deque()  # decided, waiting for their re-put
        self.reputs = Reputs(self._send_reput)
        self.next_check = time.monotonic() + min(s.transactionCheckInterval, s.transactionTimeOut) / 1000
        self.next_persist = time.monotonic() + s.flushConsumerOffsetInterval / 1000
        self.ops_again: list[tuple[float, list]] = []  # (when, ends): commits stored whose op record was not
        self.refused_ends = self.op_retries = 0

    # -- the turn ----------------------------------------------------------------------------------

    def poll_items(self) -> list:
        return self.items

    def timeout_ms(self) -> int:
        if self.torn is not None and self.torn.reading:
            return 0  # (TornCommits reads a queue, a budget a turn: an end waits for it)
        # (the queues are read back each turn; while a barrier passes, soon again)
        soon = self.reputs.in_flight() or (self.torn is None and not self._slave())
        return self.requests.wait_ms(20 if soon else 100)

    def step(self, events: set) -> None:
        self._follow()
        out: list = []
        if self.torn is None and not self._slave():
            self._prepare_ending(out)
        if self.torn is not None:
            self.torn.new_turn()
        for header, client, arrival in self.requests.take():
            if client == TRANSACTION_CLIENT:  # the front's answer to a re-put
                self._answered(header)
            elif self._holding(header):
                self._hold(header, client, arrival, out)
            else:
                self._serve(header, client, arrival, out)
        self._ship_ends(out)
        if out:
            self.replies.send(out)
        now = time.monotonic()
        self.reputs.expire(now)
        self._settle()
        while self.ops_again and self.ops_again[0][0] <= now:
            self._put_op_again(self.ops_again.pop(0)[1])
        if now >= self.next_check and self.torn is not None and not self._slave():
            self.next_check = now + self.settings.transactionCheckInterval / 1000
            self._check()
        if now >= self.next_persist:
            self.next_persist = now + self.settings.flushConsumerOffsetInterval / 1000
            self._persist()

    def _slave(self) -> bool:
        return self.control.get("role") == ROLE_CODES["SLAVE"]

    def _follow(self) -> None:
        self.queues.follow(self.control.get("dispatched"))

    # -- ends ----------------------------------------------------------------------------------------

    def _serve(self, header: dict, client: bytes, arrival: int, out: list) -> None:
        code = header["code"]  # (checked at the edge)
        if code == protocol.GET_TRANSACTION_STATE:
            now_ms = time.time_ns() // 1_000_000
            limit = header.get("limit") if isinstance(header.get("limit"), int) else LIST_LIMIT
            out.append(reply(client, arrival, header.get("opaque"), "OK", "", **self.core.statistics(now_ms),
                              halves=self.core.listing(now_ms, limit)))
            return
        if len(self.ends) >= ENDS_WAITING:  # (answers share the ring: it is read on, and ends refused)
            self.refused_ends += 1
            out.append(reply(client, arrival, header.get("opaque"), "SYSTEM_BUSY",
                              f"{len(self.ends)} ends wait for the write path; end them again later"))
            return
        ends = header["ends"] if code == protocol.END_TRANSACTIONS and "ends" in header else [header]
        if header.get("openOfGroup") is True:  # every open half the group has here, rolled back
            for _ in range(64):  # (what was stored before the request, read first: a bound on the loop)
                read_to = self.core.read_to
                self._follow()
                if self.core.read_to == read_to:
                    break
            group = header["producerGroup"]
            ends = [{"tranStateTableOffset": h.offset, "commitLogOffset": h.phy, "commitOrRollback": 12}
                    for h in self.core.pending.values() if h.group == group and h.offset not in self.core.ending]
            ends = ends[:OPEN_ENDS_A_REQUEST]
            if not ends:
                out.append(reply(client, arrival, header.get("opaque"), "OK", "", results=[]))
                return
        batch = Ends(client, arrival, header.get("opaque"), header.get("oneway") is True, len(ends),
                     single=code == protocol.END_TRANSACTION)
        if self._slave():
            self.refused_ends += len(ends)
            remark = f"this node is a slave of {self.settings.haMasterAddress}: end transactions at its master"
            for i in range(len(ends)):
                batch.set(i, out, "SERVICE_NOT_AVAILABLE", remark)
            return
        for i, end in enumerate(ends):
            self._end(end, header["producerGroup"], batch, i, out)

    def _end(self, end: dict, group: str, batch: Ends, i: int, out: list) -> None:
        """One end: answered now (unknown, a repeat, a refusal) or queued for this turn's re-put."""
        outcome = end_outcome(end)
        if outcome is None:  # UNKNOW: the check asks again later
            return batch.set(i, out, "OK", "left open: the check will ask again")
        offset, phy = end["tranStateTableOffset"], end["commitLogOffset"]
        half = self.core.pending.get(offset)
        stored = None
        if half is not None and half.phy == phy:  # (read already: its record is read again at its re-put)
            problem = None if half.group == group else f"{WRONG_GROUP}: the half belongs to {half.group}"
        else:
            half, stored = None, stored_of(self._record(phy))
            problem = not_the_half(stored, end, group)
        if problem is not None:
            self.refused_ends += 1
            return batch.set(i, out, "SYSTEM_ERROR", problem)
        decided = self.core.end(offset, outcome)
        if decided is not None:  # a repeat: nothing changes
            remark = "" if decided == outcome else f"the transaction was ended already ({decided})"
            return batch.set(i, out, "OK", remark, outcome=decided)
        self.ends.append(End(offset, outcome, phy, half, stored, batch, i))

    def _record(self, phy: int) -> bytes | None:
        """The bytes of the record at CommitLog offset `phy`, below `written` (None: none there)."""
        written = self.control.get("written")
        head = self.reader.record_bytes(phy, 4) if 0 <= phy < written else None
        size = int.from_bytes(head, "big", signed=True) if head else 0
        return self.reader.record_bytes(phy, size) if 0 < size and phy + size <= written else None

    def _ship_ends(self, out: list) -> None:
        """The ends decided: the committed messages, then one op record per outcome, a request per
        ENDS_A_REQUEST ends or REPUT_BYTES of messages, while less than REPUT_BYTES_IN_FLIGHT of
        re-puts wait for the write path (the rest wait here, for their answers)."""
        now_ms = time.time_ns() // 1_000_000
        later = False  # (an end waits for TornCommits' read: it and the ends behind it, in order)
        while self.ends and self.reputs.bytes < REPUT_BYTES_IN_FLIGHT and not later:
            part, items, size = [], [], 0
            while self.ends and len(part) < ENDS_A_REQUEST:
                end = self.ends[0]
                if end.outcome == ROLLBACK and self._torn_rollback(end) is LATER:
                    later = True
                    break
                if part and size + end.size() > REPUT_BYTES:
                    break
                if end.outcome == COMMIT:
                    commit = self._commit_item(end, out)
                    if commit is LATER:
                        later = True
                        break
                    self.ends.popleft()
                    if commit is None:
                        continue
                    items += commit
                    size += sum(len(item[1]) for item in commit)
                else:
                    self.ends.popleft()
                part.append(end)
            ops = {kind: [str(end.offset) for end in part if end.outcome == kind] for kind in (COMMIT, ROLLBACK)}
            kinds = [kind for kind in (COMMIT, ROLLBACK) if ops[kind]]
            if kinds:
                self.reputs.put(items + [op_item(kind, ops[kind], now_ms) for kind in kinds], ("end", part, kinds))

    def _torn_rollback(self, end: End):
        """A rollback of a half an earlier run's torn commit stored messages of: the commit was
        decided, so it is finished instead (`end` becomes a commit, answered as a repeat is).
        LATER while that is not known yet."""
        found = self._torn_found(end.offset, end.phy, end.target())
        if found is None:
            return LATER
        if found:
            end.outcome, end.asked = COMMIT, ROLLBACK
            self.core.ending[end.offset] = COMMIT
        return None

    def _torn_found(self, offset: int, phy: int, target: tuple[str, int] | None) -> int | None:
        """The half's messages an earlier run's torn commit stored (TornCommits; None: not known yet)."""
        if self.torn is None or target is None:
            return 0
        return self.torn.stored(*target, offset, phy)

    def _commit_item(self, end: End, out: list):
        """The re-put of a committed half's message (or, a one-half batch's, its messages): one
        item, or none when an earlier run's torn commit stored them all already (TornCommits; a
        one-half batch's first ones only: the rest go); None, answered, when its record is gone
        (its segment cleaned away since it was read); LATER while TornCommits reads its queue."""
        half, target = end.half, end.target()
        if half is not None:
            stored = stored_of(self.reader.record_bytes(half.phy, half.size), parse=False)
            inner = half.inner
        else:  # (`_end` read it to find it, and checked it is a half)
            stored = end.stored
            inner = inner_count(stored.properties)
        if stored is None:
            self.core.end_failed(end.offset)
            end.batch.set(end.i, out, "SYSTEM_ERROR", f"{NO_HALF}: the half at commitLogOffset {end.phy} is gone")
            return None
        already = self._torn_found(end.offset, end.phy, target)
        if already is None:
            return LATER
        if already >= max(inner, 1):
            return []  # (end.records stays 0: the op record alone)
        if inner:
            item = commit_batch_item(stored, end.phy, target, skip=already)
        else:
            item = commit_item(stored, end.phy, target)
        end.records = item[0]["_reput"].get("inner", 1)
        return [item]

    def _send_reput(self, header: dict, body: bytes) -> None:
        self.replies.send([(TRANSACTION_CLIENT, SERVICE_SEND, orjson.dumps(header), body)])  # (the front serves it as a send)

    def _answered(self, header: dict) -> None:
        answered = self.reputs.answer(header, self.control.get("written"))
        if answered is None:
            return
        what, count = answered
        statuses = delivered_statuses(header, count)
        if what[0] == "end" and len(what) > 3:  # an op record written again: the messages are stored
            statuses = ["PUT_OK"] * sum(end.records for end in what[1]) + statuses
            self._ended(what[1], what[2], statuses)
        elif what[0] == "end":
            self._ended(what[1], what[2], statuses)
        elif what[0] == DISCARD and statuses[-1] not in protocol.STORED_STATUSES:
            for offset in what[1]:
                self.core.end_failed(offset)

    def _ended(self, part: list, kinds: list[str], statuses: list[str]) -> None:
        """Each end's answer: its op record's status (and a commit's own message's, when that
        was refused for good: a topic deleted since). A commit whose message was stored but
        whose op record was not stays decided: its op record alone is written again (opening
        it again would let the check commit it twice)."""
        op_status = dict(zip(kinds, statuses[len(statuses) - len(kinds):]))
        at = 0  # the commits' statuses come first, `records` each
        out, again = [], []
        for end in part:
            status = op_status[end.outcome]
            own = None
            if end.outcome == COMMIT and end.records:  # (none: a torn commit's op record alone)
                own = next((s for s in statuses[at: at + end.records] if s not in protocol.STORED_STATUSES),
                           statuses[at])
                at += end.records
            if status in protocol.STORED_STATUSES:
                if end.asked != end.outcome and (own is None or own in protocol.STORED_STATUSES):
                    end.batch.set(end.i, out, "OK", f"the transaction was ended already ({end.outcome})",
                                  outcome=end.outcome)
                elif own is None or own in protocol.STORED_STATUSES:
                    end.batch.set(end.i, out, "OK", "")
                else:
                    end.batch.set(end.i, out, _status(own), f"the committed message was refused ({own})")
            elif own in protocol.STORED_STATUSES:
                again.append(end)
                self.op_retries += 1
            else:
                self.core.end_failed(end.offset)
                end.batch.set(end.i, out, _status(status), "the outcome was not stored; end it again")
        if again:  # (a second later: a refusal now, a full disk, is likely a refusal for a while)
            self.ops_again.append((time.monotonic() + OP_RETRY_S, again))
        if out:
            self.replies.send(out)

    def _put_op_again(self, ends: list) -> None:
        """The op record alone of commits whose messages are stored."""
        self.reputs.put([op_item(COMMIT, [str(end.offset) for end in ends], time.time_ns() // 1_000_000)],
                        ("end", ends, [COMMIT], "op only"))

    def _settle(self) -> None:
        if self._slave():
            return  # (a barrier is refused on a slave: settled once it is promoted)
        out: list = []
        for what in self.reputs.settled(self._caught_up):
            again = answer_settled(what, self.core, out)
            if again and len(what) > 3:  # (an op record alone: the messages are stored)
                self._put_op_again(again)
            elif again:
                self.ends.extend(again)
        if out:
            self.replies.send(out)

    # -- checks --------------------------------------------------------------------------------------

    def _check(self) -> None:
        """One check pass: a check to a producer of each due half's group, and their op record;
        the halves checked too often to TRANS_CHECK_MAX_TIME_TOPIC, and theirs."""
        now_ms = time.time_ns() // 1_000_000
        checks, discards = (self._torn_finished(halves) for halves in self.core.due_checks(now_ms))
        items = []
        for half in checks:
            raw = self.reader.record_bytes(half.phy, half.size)
            stored = stored_of(raw)
            if stored is None:
                continue
            key = stored.properties.get(PROPERTY_UNIQ_KEY) or ""
            header = {"code": protocol.CHECK_TRANSACTION_STATE, "producerGroup": half.group,
                      "tranStateTableOffset": half.offset, "commitLogOffset": half.phy, "msgId": key,
                      "transactionId": key, "offsetMsgId": offset_msg_id(stored.store_host, half.phy)}
            send_frames(self.checks, [half.group.encode(), orjson.dumps(header), raw])
            items.append(f"{half.offset}:{half.checks + 1}")
        for at in range(0, len(items), 4096):
            self.reputs.put([op_item(CHECK, items[at: at + 4096], now_ms)], (CHECK,))
        left = collections.deque(discards)
        while left:  # (in requests of ENDS_A_REQUEST halves or REPUT_BYTES, as the ends)
            part, copies, size = [], [], 0
            while left and len(part) < ENDS_A_REQUEST and not (part and size + left[0].size > REPUT_BYTES):
                half = left.popleft()
                part.append(half)
                record = stored_of(self.reader.record_bytes(half.phy, half.size))
                if record is not None:
                    copies.append(discard_item(record))
                    size += len(record.body)
            self.reputs.put(copies + [op_item(DISCARD, [str(h.offset) for h in part], now_ms)],
                            (DISCARD, [h.offset for h in part]))

    def _torn_finished(self, halves: list[Half]) -> list[Half]:
        """The due halves less those an earlier run's torn commit stored messages of: their commit
        was decided, and is finished now, whatever a producer would answer (and not discarded).
        Those not known yet (TornCommits reads on) wait for the next pass."""
        if self.torn is None:
            return halves
        left = []
        for half in halves:
            found = self._torn_found(half.offset, half.phy, (half.topic, half.queue_id))
            if found == 0:
                left.append(half)
            elif found and self.core.end(half.offset, COMMIT) is None:
                self.ends.append(End(half.offset, COMMIT, half.phy, half, None,
                                     Ends(b"", 0, None, True, 1, single=True), 0))  # (oneway: nobody to answer)
        return left

    # -- the rest ------------------------------------------------------------------------------------

    def _persist(self) -> None:
        snapshot = self.core.snapshot()
        if self.torn is None:  # (a slave: an earlier run's, kept for its promotion)
            horizon = self.torn_horizon
        else:
            horizon = self.torn.horizon if self.torn.suspects(self.core.low) else None
        config_files.persist(self.path, snapshot if horizon is None else snapshot | {"tornHorizon": horizon})

    # -- beginning to end halves ----------------------------------------------------------------------

    def _prepare_ending(self, out: list) -> None:
        """Before this run ends halves (a master's start, a promotion), everything an earlier
        instance of this service sent must be stored and read back: a commit it re-put just
        before it was killed is still on its way (in its ring, at the front, in the writer's
        ring), and a half whose op record is not read yet looks open, so its next end would
        commit it a second time. A barrier, an empty re-put, goes the way those went, each link
        in order (the front gives a service's re-puts the first of its links); once the write
        path has answered it and the dispatcher has passed where it stood, their op records are
        read here, and the ends that came meanwhile are served, in order."""
        if not self.start.on_its_way():
            self.reputs.barrier(self.start)
        elif self.start.passed(self._caught_up) is not None:
            self._begin_ending()
            held, self.held = self.held, collections.deque()
            for header, client, arrival in held:
                self._serve(header, client, arrival, out)

    def _caught_up(self, end: int) -> bool:
        """Whether the op records stored below CommitLog offset `end` are all read."""
        dispatched = self.control.get("dispatched")
        return dispatched >= end and self.queues.ops_read(dispatched)

    def _holding(self, header: dict) -> bool:
        """Whether this request waits for `_prepare_ending` (an end, on a master, before it is done)."""
        return self.torn is None and header["code"] != protocol.GET_TRANSACTION_STATE and not self._slave()

    def _hold(self, header: dict, client: bytes, arrival: int, out: list) -> None:
        if len(self.held) >= HELD_LIMIT:
            self.refused_ends += 1
            out.append(reply(client, arrival, header.get("opaque"), "SYSTEM_BUSY",
                             "the transaction service is starting; end it again later"))
            return
        self.held.append((header, client, arrival))

    def _begin_ending(self) -> None:
        """This run ends halves from now on (a master's start, or a promotion): where a torn commit
        of an earlier run can lie is fixed now (TornCommits), and kept in the snapshot at once,
        so that a crash before the suspects are ended does not lose it."""
        dispatched = self.control.get("dispatched")
        horizon = self.queues.last_op_end(dispatched)
        if self.torn_horizon is not None:
            horizon = min(horizon, int(self.torn_horizon))
        self.torn = TornCommits(horizon, dispatched, self.queues.halves_end(dispatched), self._commits_stored)
        if self.torn.suspects(self.core.low):
            self._persist()

    def _commits_stored(self, topic: str, queue_id: int, low: int, high: int, limit: int):
        return self.reader.commits_stored(topic, queue_id, low, high, self.control.get("dispatched"), limit)

    def follow_min_offset(self, min_offset: int) -> None:
        self.reader.follow_min_offset(min_offset)

    def drain(self) -> None:
        if self.core is not None:
            self._persist()

    def statistics(self) -> dict:
        if self.core is None:
            return super().statistics()
        return super().statistics() | self.core.statistics(time.time_ns() // 1_000_000) | self.reputs.statistics() | {
            "endsWaiting": len(self.ends), "refusedEnds": self.refused_ends,
            "opRetries": self.op_retries, "tornCommits": len(self.torn.found) if self.torn is not None else 0,
            "links": service_links_statistics(self.requests, self.replies)}

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        for end in (self.requests, self.replies):
            if end is not None:
                end.close()
        super().close()


def _status(status: str) -> str:
    return "OK" if status in protocol.STORED_STATUSES else status
