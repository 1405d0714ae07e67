"""dispatcher (reput): tails the CommitLog and builds the ConsumeQueues and the IndexFile.

Socket: `arrivals` PUB (bound): after each batch, [topic, queueId, new max offset] per queue
that grew, for the pull workers' held pulls. It follows the control block's `written` counter, dispatches every record
below it with the batched `shm.dispatch.reput`, then advances `dispatched` (data first,
counter second: a reader below `dispatched` finds every entry). It is the single writer of the
ConsumeQueue and IndexFile files and of the checkpoint's logics and index timestamps, which it
advances only after flushing what they describe (every `flushIntervalConsumeQueue` ms, and at
stop).

Restart: it resumes at `dispatched`; entries already written are recognised and skipped
(dispatch is idempotent), so a crash between writing entries and advancing the counter is
harmless.
"""

from __future__ import annotations

import time

import orjson
import zmq

from actors.base import Actor, socket
from shm.commitlog import CommitLog
from shm.control_block import FLAG_LOGICS_WRITE_ERROR
from shm.dispatch import reput
from shm.mapped_file import StoreError
from shm.store import MessageStore

RETRY_S = 0.5

IDLE_SLEEP_S = (0.001, 0.02)  # poll fast while records arrive, back off when idle


class Dispatcher(Actor):
    name = "dispatcher"

    def open(self) -> None:
        s = self.settings
        self.store = MessageStore(s, lock=False)
        self.store.commitlog.close()
        self.store.commitlog = CommitLog(s.commitlog_dir, s.mappedFileSizeCommitLog, readonly=True)
        self.store.commitlog.segments.load()
        self.store.index.load(last_exit_ok=True)
        self.store.load_consume_queues()
        for queue in self.store.consume_queues.values():
            queue.recover()
        self.position = self.control.get("dispatched")
        self.arrivals = socket(self.context, zmq.PUB, hwm=10000)
        self.arrivals.bind(self.endpoints["arrivals"])
        self.records = self.stalls = 0
        self.last_error = ""
        self.sleep = IDLE_SLEEP_S[0]
        self.next_flush = time.monotonic() + s.flushIntervalConsumeQueue / 1000

    def turn(self) -> None:
        if not self.catch_up():
            self.sleep = min(self.sleep * 2, IDLE_SLEEP_S[1])
        else:
            self.sleep = IDLE_SLEEP_S[0]  # busy: still pause 1 ms, so each reput takes a batch
        self.stopping.wait(self.sleep)
        if time.monotonic() >= self.next_flush:
            self.next_flush = time.monotonic() + self.settings.flushIntervalConsumeQueue / 1000
            self.flush()

    def catch_up(self) -> bool:
        """Dispatch up to the published end; True when something was dispatched."""
        written = self.control.get("written")
        if written <= self.position:
            return False
        log = self.store.commitlog
        if log.segments.find(written - 1) is None or log.segments.find(self.position) is None:
            log.segments.refresh()
        touched: dict = {}
        try:
            reached, count = reput(self.store, self.position, written, touched)
        except StoreError as e:  # a full disk: no room for a ConsumeQueue or index file
            self.errors += 1
            self.last_error = str(e)
            self.control.set_flag(FLAG_LOGICS_WRITE_ERROR, True)  # the writer refuses sends meanwhile
            self.stopping.wait(RETRY_S)
            return False
        if self.control.has_flag(FLAG_LOGICS_WRITE_ERROR):
            self.control.set_flag(FLAG_LOGICS_WRITE_ERROR, False)
        if reached == self.position:
            self.stalls += 1  # below a published counter: only a fault elsewhere explains this
            return False
        self.position = reached
        self.records += count
        self.control.advance("dispatched", reached)
        if touched:  # "queue grew": wakes the pulls held on these queues
            self.arrivals.send(orjson.dumps([[t, q, m] for (t, q), m in touched.items()]))
        return True

    def flush(self) -> None:
        store = self.store
        for queue in store.consume_queues.values():
            queue.flush()
        store.index.flush()
        if store.checkpoint.logics_timestamp:
            store.checkpoint.flush_logics(store.checkpoint.logics_timestamp)

    def drain(self) -> None:
        for _ in range(1000):  # bounded: each round moves forward or stops
            if not self.catch_up():
                break
        self.flush()

    def statistics(self) -> dict:
        return super().statistics() | {"dispatched": self.position, "records": self.records, "stalls": self.stalls,
                                       "lastError": getattr(self, "last_error", ""),
                                       "queues": len(self.store.consume_queues) if hasattr(self, "store") else 0}

    def close(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
        super().close()
