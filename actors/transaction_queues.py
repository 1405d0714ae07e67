"""The transaction service's two queues read back (docs/storage.md "Transaction state"): the op
records of RMQ_SYS_TRANS_OP_HALF_TOPIC and the halves of RMQ_SYS_TRANS_HALF_TOPIC, each queue 0,
into the core (actors.transaction_core), at most READ_A_TURN entries of each a turn; and what the
service's start asks of them. Reads only, up to the dispatched end the shell gives.
"""

from __future__ import annotations

from actors.reput import PROPERTY_TRANSACTION_OP, stored_of
from actors.transaction_core import TransactionCore
from actors.transaction_halves import half_of
from shm import consume_queue
from shm.codec import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

READ_A_TURN = 8192  # half and op entries read a turn


class TransactionQueues:
    def __init__(self, reader, core: TransactionCore):
        self.reader, self.core = reader, core

    def follow(self, dispatched: int) -> None:
        """The op records, then the halves, stored since the last turn (the ops first: a half
        ended before it was read is then never taken for open)."""
        core, reader = self.core, self.reader
        ops = reader.queue(TRANS_OP_HALF_TOPIC, 0, dispatched)
        core.op_read_to = max(core.op_read_to, ops.min_offset(reader.commitlog_min))  # (cleaned: gone)
        for phy, size in places(ops, core.op_read_to, READ_A_TURN):
            record = stored_of(reader.record_bytes(phy, size))
            if record is None:  # (gone, or not a record)
                core.op_read_to += 1
                continue
            core.op(record.properties.get(PROPERTY_TRANSACTION_OP, ""), record.body.decode(errors="replace").split(","))
        halves = reader.queue(TRANS_HALF_TOPIC, 0, dispatched)
        core.halves_gone(halves.min_offset(reader.commitlog_min))
        for phy, size in places(halves, core.read_to, min(READ_A_TURN, core.room())):
            core.half(half_of(core.read_to, phy, size, reader.record_bytes(phy, size)))

    def ops_read(self, dispatched: int) -> bool:
        """Whether every op record below `dispatched` is read."""
        return self.core.op_read_to >= self.reader.queue(TRANS_OP_HALF_TOPIC, 0, dispatched).max_offset

    def last_op_end(self, dispatched: int) -> int:
        """Where the last op record below `dispatched` ends in the CommitLog (0: none)."""
        ops = self.reader.queue(TRANS_OP_HALF_TOPIC, 0, dispatched)
        last = ops.queue.entry(ops.max_offset - 1) if ops.max_offset > 0 else None
        return last.physical_offset + last.size if last is not None else 0

    def halves_end(self, dispatched: int) -> int:
        """The half queue's next offset, below `dispatched`."""
        return self.reader.queue(TRANS_HALF_TOPIC, 0, dispatched).max_offset


def places(view, offset: int, count: int) -> list[tuple[int, int]]:
    """(phy, size) of up to `count` entries of the queue `view` from `offset`."""
    out: list[tuple[int, int]] = []
    end = min(view.max_offset, offset + count)
    while offset < end:
        raw = view.queue.raw_entries(offset, end - offset, limit_offset=view.max_offset)
        if not raw:
            break
        found = [(phy, size) for phy, size, _ in consume_queue.entries(raw)]
        out += found
        offset += len(found)
    return out
