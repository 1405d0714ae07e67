"""Which config files a master's ha-server ships to each slave (the zmq link's `C` items,
docs/protocol.md "Replication"), without I/O but the files' stat and read: the ha-server asks
`look` each turn (forced when the front announces a write, or a slave is new) and sends what
`changed_for` each started slave says."""

from __future__ import annotations

from actors import ha_link


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
