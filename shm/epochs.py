"""The epoch file: which master wrote which stretch of the CommitLog, so a failed-over log can be fenced.

File: `<store>/epoch`, mqnode's own (RocketMQ 4.x has none; 5.x's controller mode keeps an
`epochFileCheckpoint` of the same idea, as Kafka keeps `leader-epoch-checkpoint`). Text, one
line per epoch, oldest first:

    <epoch> <startOffset> <token>

`epoch` counts up from 0, bumped at each promotion; `startOffset` is the CommitLog offset of the
first byte that epoch's master wrote; `token` is 16 random hex digits drawn when the epoch
began, so two stores that each began an epoch 0 on their own (two independent masters) are
never mistaken for one history. Bytes [start of epoch e, start of epoch e+1) were written by
epoch e's master; the last epoch runs to the log's end.

Who writes it: a master store's first start writes epoch 0 (`genesis`); a promotion appends the
next epoch at the written end (`begin`); a slave takes its master's list when it starts to
follow (`adopt`), after its log was cut to the common prefix (`common_prefix`).

Crash policy: the file is replaced whole (write a temporary, fsync, rename, fsync the
directory), so a crash leaves the old list or the new one. A line that does not parse, epochs
that do not count up or starts that go down are refused (StoreError): the store's history is
unknown, and a node that guessed could keep records its master never had.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from shm.mapped_file import StoreError

MAX_EPOCHS = 100_000  # lines read at most: a promotion a minute for two months


@dataclass(frozen=True, slots=True)
class Epoch:
    epoch: int
    start: int
    token: str

    def same_as(self, other: Epoch) -> bool:
        return self.epoch == other.epoch and self.token == other.token


class EpochFile:
    def __init__(self, root: Path):
        self.path = Path(root) / "epoch"
        self.entries: list[Epoch] = _parse(self.path.read_text()) if self.path.exists() else []

    @property
    def last(self) -> Epoch | None:
        return self.entries[-1] if self.entries else None

    @property
    def current(self) -> int:
        """The epoch now in force (-1: none yet)."""
        return self.entries[-1].epoch if self.entries else -1

    def genesis(self, start: int) -> None:
        """A master's first epoch, when the store has none."""
        if not self.entries:
            self._write([Epoch(0, start, secrets.token_hex(8))])

    def begin(self, start: int) -> Epoch:
        """A promotion: the next epoch, starting at the written end `start`."""
        last = self.last
        assert last is None or start >= last.start, (start, last)
        epoch = Epoch(0 if last is None else last.epoch + 1, start, secrets.token_hex(8))
        self._write([*self.entries, epoch])
        return epoch

    def adopt(self, entries: list[Epoch]) -> None:
        """A slave takes its master's history (its own log now a prefix of the master's)."""
        _check(entries)
        if entries != self.entries:
            self._write(list(entries))

    def as_wire(self) -> list[list]:
        return [[e.epoch, e.start, e.token] for e in self.entries]

    def _write(self, entries: list[Epoch]) -> None:
        _check(entries)
        temporary = self.path.with_suffix(".tmp")
        with open(temporary, "w") as out:
            out.write("".join(f"{e.epoch} {e.start} {e.token}\n" for e in entries))
            out.flush()
            os.fsync(out.fileno())  # a failure raises: never retried (fail-stop)
        temporary.replace(self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.entries = entries


def from_wire(items) -> list[Epoch]:
    """A peer's epoch list (the HA handshake): ValueError when it is not one."""
    if not isinstance(items, list) or len(items) > MAX_EPOCHS:
        raise ValueError("epochs must be a list")
    out = []
    for item in items:
        if (not isinstance(item, list) or len(item) != 3 or not all(type(v) is int for v in item[:2])
                or not isinstance(item[2], str)):
            raise ValueError(f"an epoch is [epoch, startOffset, token], not {item!r}")
        out.append(Epoch(item[0], item[1], item[2]))
    try:
        _check(out)
    except StoreError as e:
        raise ValueError(str(e)) from None
    return out


@dataclass(frozen=True)
class Fence:
    """What a follower must do before it follows: keep its log below `keep` (dropping
    `dropped` bytes), or refuse to follow at all (`refusal`). `superseded`: the epoch, begun by
    the follower and holding its bytes, that the master's history is older than (0: none)."""

    keep: int
    dropped: int
    refusal: str | None = None
    superseded: int = 0


def common_prefix(master: list[Epoch], master_end: int, follower: list[Epoch], follower_end: int) -> Fence:
    """Where the follower's log stops agreeing with the master's (Kafka's leader-epoch rule).

    The last epoch both histories hold (same number, same token) was written by one master; the
    two logs agree up to where the earlier of them leaves that epoch (the next epoch's start, or
    the log's end). Beyond that the follower's bytes were written by a master the current
    history does not know (an old master's tail no slave had when another was promoted), or the
    master never had them: they are cut. A follower with data but no shared epoch shares no
    history with this master: following would mix two logs, so it is refused.

    Only a later history cuts an earlier one. A follower with bytes in epochs the master does
    not hold, the last numbered at or past the master's last, was itself promoted after the
    master's history ends: the "master" is an old one, brought back with its old role (a stale
    toml, a name service that forgot the promotion), and cutting would drop sends the promoted
    node acknowledged. Refused: the operator decides which node is the master."""
    if follower_end == 0:
        return Fence(0, 0)
    shared = [(i, j) for i, f in enumerate(follower) for j, m in enumerate(master) if f.same_as(m)]
    if not shared:
        return Fence(follower_end, 0, "the follower's log shares no epoch with the master's: empty its store "
                                      "to follow this master")
    i, j = shared[-1]
    newer = follower[-1]
    if i < len(follower) - 1 and newer.epoch >= master[-1].epoch and follower_end > follower[i + 1].start:
        return Fence(follower_end, 0, f"the follower was a master in epoch {newer.epoch} (from offset {newer.start}), "
                                      f"which the master (its last epoch {master[-1].epoch}) never knew: the master "
                                      f"is an old one, or was promoted beside it. Promote the follower (admin role, "
                                      f"or brokerRole) and make the other its slave; nothing was cut",
                     superseded=newer.epoch)
    if follower[i].start != master[j].start:
        return Fence(follower_end, 0, f"epoch {follower[i].epoch} starts at {follower[i].start} on the follower "
                                      f"but at {master[j].start} on the master")
    follower_leaves = follower[i + 1].start if i + 1 < len(follower) else follower_end
    master_leaves = master[j + 1].start if j + 1 < len(master) else master_end
    keep = min(follower_end, follower_leaves, master_leaves)
    return Fence(keep, follower_end - keep)


def _parse(text: str) -> list[Epoch]:
    entries = []
    for number, line in enumerate(text.splitlines()[:MAX_EPOCHS], 1):
        parts = line.split()
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            raise StoreError(f"epoch file line {number}: {line!r} is not '<epoch> <startOffset> <token>'")
        entries.append(Epoch(int(parts[0]), int(parts[1]), parts[2]))
    _check(entries)
    return entries


def _check(entries: list[Epoch]) -> None:
    for before, after in zip(entries, entries[1:]):
        if after.epoch <= before.epoch or after.start < before.start:
            raise StoreError(f"epochs must count up with starts that never go down: {before} then {after}")
