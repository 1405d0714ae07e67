"""What a master's ha-server ships to each slave beside the log (docs/protocol.md
"Replication"), without I/O but the files' stat and read: the config files (the zmq link's `C`
items: the ha-server asks `look` each turn, forced when the front announces a write or a slave
is new, and sends what `changed_for` each started slave says), and the pop log (`Q` items:
`PopShipper`)."""

from __future__ import annotations

from actors import ha_link
from shm.pop_log import PopLogTail


class ConfigShipper:
    """Which config files changed since each slave last got them, looked at every LOOK_MS (a few
    stat calls) and at once on the front's word (`look(force=True)`). A file's version is its
    mtime and size, and for the files the front announces (FRONT_WRITTEN) the announcement's
    count too: two writes within one tick of the file system's clock, of one size, still
    differ. RocketMQ's slave pulls these every 10 s."""

    LOOK_MS = 100
    FRONT_WRITTEN = ("topics.json", "subscriptionGroup.json")

    def __init__(self, directory, extra: dict | None = None):
        self.directory = directory
        self.files = {name: directory / name for name in ha_link.SYNCED_CONFIG} | (extra or {})  # name -> path
        self.next_look = 0
        self.versions: dict[str, tuple[int, ...]] = {}
        self.sent: dict[object, dict[str, tuple[int, ...]]] = {}

    def look(self, now: int, *, force: bool = False, announced: int = 0) -> bool:
        """Whether it looked (`announced`: the front's count of its writes, `config_changes`)."""
        if now < self.next_look and not force:
            return False
        self.next_look = now + self.LOOK_MS
        for name, path in self.files.items():
            try:
                info = path.stat()
                self.versions[name] = (info.st_mtime_ns, info.st_size) + ((announced,) if name in self.FRONT_WRITTEN else ())
            except OSError:
                self.versions.pop(name, None)
        return True

    def changed_for(self, peer) -> list[tuple[str, bytes]]:
        sent = self.sent.setdefault(peer, {})
        out = []
        for name, version in self.versions.items():
            if sent.get(name) != version:
                try:
                    out.append((name, self.files[name].read_bytes()))
                except OSError:
                    continue  # replaced meanwhile: the next look sends it
                sent[name] = version
        return out

    def is_new(self, peer) -> bool:
        """Whether `peer` has got no file yet (its first look ships it every one)."""
        return peer not in self.sent

    def forget(self, peer) -> None:
        self.sent.pop(peer, None)


class PopShipper:
    """The pop service's log (shm.pop_log) to each slave, for a promoted slave to go on with
    what its master's pop groups had in flight and acked: the current generation's snapshot in
    chunks, then the journal's whole frames as they are appended, looked at every LOOK_MS; from
    the snapshot again when the pop service compacts (a new generation) or a slave is new. At
    most CHUNKS_A_LOOK chunks a slave a look, so the log's own transfers are not held up."""

    LOOK_MS = 100
    CHUNK = 1 << 20
    CHUNKS_A_LOOK = 4
    WINDOW = 8 << 20  # bytes shipped to a slave past what it said it took (b"T"): a slave that stops
    # reading stops the shipping (the link's socket queues without bound), as the log's own WINDOW does

    def __init__(self, directory):
        self.tail = PopLogTail(directory)
        self.at: dict[object, list] = {}  # peer -> [generation, "S" or "J", offset]
        self.sent: dict[object, int] = {}  # peer -> bytes shipped since its session began
        self.taken: dict[object, int] = {}  # peer -> bytes it said it took
        self.next_look = 0
        self.chunks = self.bytes = self.held_back = 0

    def due(self, now: int) -> bool:
        if now < self.next_look:
            return False
        self.next_look = now + self.LOOK_MS
        return True

    def items_for(self, peer) -> list[bytes]:
        """The link's items that bring `peer`'s copy up to the log as it is now (some of them)."""
        gen, snapshot = self.tail.current()
        at = self.at.get(peer)
        if at is None or at[0] != gen:
            at = self.at[peer] = [gen, "S", 0]
        items, sent = [], self.sent.get(peer, 0)
        while len(items) < self.CHUNKS_A_LOOK:
            if sent - self.taken.get(peer, 0) >= self.WINDOW:
                self.held_back += 1
                break
            if at[1] == "S":
                data = snapshot[at[2]: at[2] + self.CHUNK]
                items.append(ha_link.pop_message(ha_link.POP_SNAPSHOT, gen, at[2], data))
                at[2] += len(data)
                sent += len(data)
                if at[2] >= len(snapshot):
                    at[1], at[2] = "J", 0
                    items.append(ha_link.pop_message(ha_link.POP_JOURNAL, gen, 0, b""))  # (the snapshot is whole)
                continue
            data = self.tail.journal(gen, at[2], self.CHUNK)
            if not data:
                break
            items.append(ha_link.pop_message(ha_link.POP_JOURNAL, gen, at[2], data))
            at[2] += len(data)
            sent += len(data)
        self.sent[peer] = sent
        self.chunks += len(items)
        self.bytes += sum(map(len, items))
        return items

    def took(self, peer, taken: int) -> None:
        """The slave's b"T": what it took of what was shipped (never more)."""
        if not 0 <= taken <= self.sent.get(peer, 0):
            raise ha_link.LinkError(f"a pop log report of {taken} bytes taken; {self.sent.get(peer, 0)} were shipped")
        self.taken[peer] = taken

    def forget(self, peer) -> None:
        for table in (self.at, self.sent, self.taken):
            table.pop(peer, None)

    def statistics(self) -> dict:
        return {"popChunks": self.chunks, "popBytes": self.bytes, "popHeldBack": self.held_back}
