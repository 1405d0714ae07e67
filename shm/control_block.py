"""The control block: shared int64 counters that publish the store's positions to every actor.

File: `<store>/control`, one 4096-byte page, memory-mapped by every process of a node. It is
mqnode's own file (RocketMQ has none and ignores it). Slots are 8-byte aligned int64 in the
machine's byte order, read and written through `memoryview.cast('q')`: an aligned 8-byte store
is one instruction on x86-64, so a reader sees the old or the new value, never a mix. (Never use
struct.pack_into here: it zeroes the bytes before writing, so a reader can see a transient 0.)

| slot | name            | single writer                | meaning                               |
|------|-----------------|------------------------------|---------------------------------------|
| 0    | magic           | recovery                     | CONTROL_MAGIC once initialised         |
| 1    | written         | append writer / HA client    | CommitLog bytes readable below this    |
| 2    | committed       | flush (write-buffer mode)    | bytes handed from the buffer to the file |
| 3    | flushed         | flush                        | bytes durable on disk                  |
| 4    | dispatched      | reput dispatcher             | CommitLog bytes in ConsumeQueue/index  |
| 5    | min_offset      | clean                        | first CommitLog byte still stored      |
| 6    | slave_acked     | HA server                    | bytes a slave has confirmed            |
| 7    | flags           | recovery / clean / node      | FLAG_* bits                            |
| 8    | store_timestamp | append writer                | store time of the last appended record |
| 9    | generation      | recovery                     | bumped on every start (stale readers)  |
| 11   | reput_polling_until | reput dispatcher         | CLOCK_MONOTONIC ns: it looks at `written` again at or after this, unwoken |
| 12   | deletions       | clean                        | bumped after each batch of deleted store files: processes drop their mappings |
| 441  | topics_deleted  | front                        | bumped after a write (a slave's: a read of its master's) of topics.json whose deletion floors changed: readers and the dispatcher read them again |
| 442  | queues_dropped  | reput dispatcher             | bumped after it removed queues of deleted topics (MessageStore.drop_queues_of): as `deletions` |
| 13   | role            | launcher; ha-client (promotion); front (`admin role` on a master) | ROLE_CODES: the node's broker role now |
| 14   | ha_slaves       | ha-server                    | slaves following now (SYNC_MASTER waits only with one) |
| 15   | master_offset   | ha-client                    | a slave: its master's written end, as last heard (lag = master_offset - written) |
| 16-440 | heartbeats    | each actor its own slot      | last loop time, ms                     |
| 443  | fence_pending   | ha-client (0 at start)       | a slave: bytes of its log past its master's history, for which the master refused it (node.server.fencing); the launcher then ends the node, whose restart cuts them |
| 444  | superseded_in_routes | registrar (0 at start)  | a master: the epoch of the group's master a name service holds past this node's (0: none); as `superseded_by` |
| 445  | superseded_by   | ha-server (0 at start)       | a master: the epoch a would-be slave began past this node's history (0: none); no client send is taken |
| 446  | broker_permission | recovery (the setting); front (`admin config update`) | brokerPermission now (PermName bits) |
| 447  | config_changes  | front                        | bumped after each write of topics.json or subscriptionGroup.json: the ha-server ships the files before the records written after them |
| 448-511 | watchers     | each reader its own slot     | 1 while it holds pulls (wants `arrivals`), else 0 |

Ordering: data first, then the counter that publishes it; readers also check each record's
magic and size. Invariant (asserted by writers): min_offset <= flushed <= committed <= written.
The watcher slots are read the other way round: a reader sets its slot, then looks at
`dispatched`; the dispatcher advances `dispatched`, then reads the slots (actors.dispatcher says
what covers a read that x86's store buffer leaves stale).
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

from shm.invariant import invariant
from shm.mapped_file import allocate
from shm.ring import FENCED, fence
from shm.settings import MAX_PULL_WORKERS

FILE_SIZE = 4096
CONTROL_MAGIC = 0x6D716E6F64650001  # "mqnode" v1

SLOTS = {
    "magic": 0, "written": 1, "committed": 2, "flushed": 3, "dispatched": 4, "min_offset": 5,
    "slave_acked": 6, "flags": 7, "store_timestamp": 8, "generation": 9, "writer_generation": 10,
    "reput_polling_until": 11, "deletions": 12, "role": 13, "ha_slaves": 14,
    "master_offset": 15, "topics_deleted": 441, "queues_dropped": 442, "fence_pending": 443, "superseded_in_routes": 444, "superseded_by": 445, "broker_permission": 446,
    "config_changes": 447,
}
ROLE_CODES = {"ASYNC_MASTER": 0, "SYNC_MASTER": 1, "SLAVE": 2}
ROLE_NAMES = {code: name for name, code in ROLE_CODES.items()}
HEARTBEAT_BASE = 16
WATCHERS_BASE = 448  # the front is watcher 0, pull worker i is watcher 1 + i, the pop service the last
WATCHER_SLOTS = FILE_SIZE // 8 - WATCHERS_BASE
HEARTBEAT_SLOTS = SLOTS["topics_deleted"] - HEARTBEAT_BASE
invariant(WATCHER_SLOTS == 2 + MAX_PULL_WORKERS)
_NO_WATCHERS = bytes(WATCHER_SLOTS * 8)

FLAG_WRITABLE = 1 << 0
FLAG_DISK_FULL = 1 << 4  # RocketMQ's running-flags DISK_FULL bit
FLAG_LOGICS_WRITE_ERROR = 1 << 2
FLAG_INDEX_WRITE_ERROR = 1 << 3
FLAG_SHUTTING_DOWN = 1 << 8


# the heartbeat slot of each service process, by label (`ha-client` far from the instanced runs)
HEARTBEAT_SLOT_OF = {"front": 0, "writer": 1, "flush": 2, "allocator": 3, "dispatcher": 4, "clean": 5, "schedule": 6,
                   "ha-server": 7, "ha-client": 88, "ingress": 8, "pull": 24,
                   "pop": 89, "proxy": 90, "transaction": 91}
INSTANCED = ("ingress", "pull")  # services that run as several processes, labelled kind-i


def monotonic_ms() -> int:
    """Heartbeat time: CLOCK_MONOTONIC is one clock for every process of the host, and a step of
    the wall clock (NTP) must not make every process look hung."""
    return int(time.monotonic() * 1000)


def heartbeat_slot(label: str) -> int:
    """The control block's heartbeat slot of the service process `label` ("front", "pull-3")."""
    if label in HEARTBEAT_SLOT_OF:
        return HEARTBEAT_SLOT_OF[label]
    kind, _, instance = label.partition("-")
    return HEARTBEAT_SLOT_OF.get(kind, 15) + (int(instance) if kind in INSTANCED and instance else 0)


class ControlBlock:
    def __init__(self, path: Path, *, create: bool = False):
        self.path = Path(path)
        if create and not self.path.exists():
            allocate(self.path, FILE_SIZE)
        self.fd = os.open(self.path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, FILE_SIZE)
        self.slots = memoryview(self.map).cast("q")

    def get(self, name: str) -> int:
        return self.slots[SLOTS[name]]

    def set(self, name: str, value: int) -> None:
        self.slots[SLOTS[name]] = value

    def advance(self, name: str, value: int) -> None:
        """Move a monotone counter forward (never back)."""
        slot = SLOTS[name]
        invariant(value >= self.slots[slot], (name, value, self.slots[slot]))
        self.slots[slot] = value

    # flags are written by few writers, each owning distinct bits, at quiet moments
    def set_flag(self, bit: int, on: bool) -> None:
        flags = self.slots[SLOTS["flags"]]
        self.slots[SLOTS["flags"]] = (flags | bit) if on else (flags & ~bit)

    def has_flag(self, bit: int) -> bool:
        return bool(self.slots[SLOTS["flags"]] & bit)

    def heartbeat(self, actor_slot: int, now_ms: int) -> None:
        invariant(0 <= actor_slot < HEARTBEAT_SLOTS)
        self.slots[HEARTBEAT_BASE + actor_slot] = now_ms

    def heartbeat_of(self, actor_slot: int) -> int:
        return self.slots[HEARTBEAT_BASE + actor_slot]

    def removals(self) -> int:
        """Changes when store files are gone (the clean service's deletions, the dispatcher's
        dropped queues): each process drops its mappings of them at its next turn."""
        return self.slots[SLOTS["deletions"]] + self.slots[SLOTS["queues_dropped"]]

    def set_watching(self, watcher: int, on: bool) -> None:
        """A reader says whether it holds pulls, so wants the dispatcher's "queue grew"; set, the
        slot's store is fenced before the reader's next look at `dispatched` (see `watchers`)."""
        invariant(0 <= watcher < WATCHER_SLOTS, watcher)
        self.slots[WATCHERS_BASE + watcher] = int(on)
        if on and FENCED:
            fence()

    def watchers(self) -> list[int]:
        """The slots of the readers holding pulls, read after a fence: with `set_watching`'s,
        a reader whose slot this does not see set looked at `dispatched` after the dispatcher's
        last store to it (Dekker's order, both sides fenced), so found what it announces.
        Without the C fence that is not promised (actors.dispatcher keeps what no one was seen
        watching, and announces to every reader)."""
        if FENCED:
            fence()
        if not self.watched():
            return []
        return [watcher for watcher in range(WATCHER_SLOTS) if self.slots[WATCHERS_BASE + watcher]]

    def watched(self) -> bool:
        """Whether any reader holds pulls: one 512-byte compare, not 64 slot reads."""
        return self.map[WATCHERS_BASE * 8:FILE_SIZE] != _NO_WATCHERS

    def publish_recovered(self, *, written: int, flushed: int, dispatched: int, min_offset: int,
                          broker_permission: int = 6) -> None:
        """Start-up: publish what recovery found, and the start's brokerPermission (a change made
        while the node ran lasts until it stops), before any actor starts."""
        invariant(min_offset <= flushed <= written and dispatched <= written)
        for name, value in (("written", written), ("committed", written), ("flushed", flushed),
                            ("dispatched", dispatched), ("min_offset", min_offset), ("slave_acked", 0), ("ha_slaves", 0),
                            ("superseded_by", 0), ("superseded_in_routes", 0), ("fence_pending", 0),
                            ("broker_permission", broker_permission),
                            ("reput_polling_until", 0)):  # a monotonic time: meaningless after a reboot
            self.set(name, value)
        self.map[WATCHERS_BASE * 8:FILE_SIZE] = _NO_WATCHERS  # readers set theirs again as they hold pulls
        self.set("generation", self.get("generation") + 1 if self.get("magic") == CONTROL_MAGIC else 1)
        self.set("magic", CONTROL_MAGIC)

    def superseded(self) -> int:
        """A master's: the later epoch another node began past this node's history, as a would-be
        slave's hello (the ha-server) or a name service (the registrar) showed it; 0: none."""
        return max(self.get("superseded_by"), self.get("superseded_in_routes"))

    def check(self) -> None:
        written, committed, flushed = self.get("written"), self.get("committed"), self.get("flushed")
        invariant(self.get("min_offset") <= flushed <= committed <= written, (flushed, committed, written))

    def snapshot(self) -> dict[str, int]:
        return {name: self.slots[slot] for name, slot in SLOTS.items()}

    def close(self) -> None:
        if self.fd >= 0:
            self.slots.release()
            self.map.close()
            os.close(self.fd)
            self.fd = -1


def peek(root: Path, name: str) -> int:
    """One counter of the store at `root`, read from outside the node (tools, tests)."""
    block = ControlBlock(Path(root) / "control")
    try:
        return block.get(name)
    finally:
        block.close()
