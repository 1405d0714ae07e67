"""The JSON files under `<store>/config/`, read and written as RocketMQ 4.9 (fastjson) does.

fastjson writes maps with integer keys bare (`{0:12,1:7}`), which is not JSON: `loads` accepts
that; `dumps` writes it, with fastjson's pretty format (tabs; a bean's fields on their own lines,
alphabetical). Persisting follows spec §8: write `<file>.tmp`, copy the current file to
`<file>.bak`, replace; a missing, empty or unparseable file falls back to `.bak`.

A full disk: a file that cannot be written for want of room keeps its previous content and
`persist` answers False; its owner keeps the change in memory and writes it at its next period
(RocketMQ logs the failure and goes on the same way). A service must not die of it: it would die
again at each restart while the disk stays full, and with it the node's reads. A failed fsync
still raises (fail-stop: the process stops and its restart is recovery).
"""

from __future__ import annotations

import abc
import logging
import re
from collections.abc import Callable
from pathlib import Path

import orjson

from shm.disk import write_whole

log = logging.getLogger("mqnode")
_unwritten: set[Path] = set()  # this process's files whose last write found no room (logged once a streak)

_BARE_INT_KEY = re.compile(r'([{,]\s*)(-?\d+)\s*:')


def loads(text: str):
    """Parse fastjson output, quoting bare integer keys first (values are never touched: the
    pattern only matches after `{` or `,`, and strings in these files hold no `{`/`,` + digits + `:`)."""
    return orjson.loads(_BARE_INT_KEY.sub(r'\1"\2":', text))


_flat_beans: dict[tuple, str] = {}  # (indent, a bean's items) -> its text: a table's entries, written again at each change
FLAT_BEANS_KEPT = 1 << 16  # (then forgotten whole: at most ~26 MB)


def dumps(value, indent: int = 0) -> str:
    """fastjson PrettyFormat: dicts with str keys are beans (fields on their own lines), dicts
    with int keys are maps (`{k:v,...}` as fastjson prints them). A table's bean of scalars (a
    topic's or a group's entry) is written from the text it had the last time: a table is written whole at
    each change, and writing its unchanged entries field by field again took the front 35 ms a new
    topic at 3,500 topics."""
    if indent >= 2 and isinstance(value, dict) and value and isinstance(next(iter(value)), str):
        # (a table's entry; not an int-keyed map of offsets, nor a file's dataVersion: they change at each write)
        types = tuple(map(type, value.values()))  # (True == 1, but "true" != "1"; a float is written each time: 0.0 == -0.0)
        try:
            key = (indent, *value, *value.values(), *types)  # (one flat tuple: ~400 bytes an entry with its text)
            return _flat_beans[key]  # (a nested dict or list is unhashable: TypeError, written below)
        except KeyError:
            if float in types:
                return _dumps(value, indent)
            text = _dumps(value, indent)
            if len(_flat_beans) >= FLAT_BEANS_KEPT:
                _flat_beans.clear()
            _flat_beans[key] = text
            return text
        except TypeError:
            pass
    return _dumps(value, indent)


def _dumps(value, indent: int) -> str:
    pad = "\t" * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        if all(isinstance(k, int) for k in value):
            return "{" + ",".join(f"{k}:{dumps(v, indent + 1)}" for k, v in value.items()) + "\n" + pad + "}"
        inner = ",\n".join(f'{pad}\t{orjson.dumps(str(k)).decode()}:{dumps(v, indent + 1)}' for k, v in value.items())
        return "{\n" + inner + "\n" + pad + "}"
    return orjson.dumps(value).decode()


def read(path: Path):
    """The file's content, or its `.bak`, or None when neither parses."""
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            text = candidate.read_text(encoding="utf-8")
            if text.strip():
                return loads(text)
        except (OSError, orjson.JSONDecodeError, UnicodeDecodeError):
            continue
    return None


def persist(path: Path, value) -> bool:
    """`value` written to `path` (fastjson's format), the previous content kept as `.bak`; False
    when the disk had no room (the file as it was)."""
    return write(path, dumps(value).encode(), backup=True)


def write(path: Path, data: bytes, *, backup: bool = False) -> bool:
    """shm.disk.write_whole, fsynced, its failures for want of room logged once a streak."""
    if not write_whole(path, data, backup=backup):
        if path not in _unwritten:
            _unwritten.add(path)
            log.error("%s not written (no space left on the device): the change is kept in memory and written "
                      "when there is room", path)
        return False
    if path in _unwritten:
        _unwritten.discard(path)
        log.warning("%s written again", path)
    return True


class VersionedFile(abc.ABC):
    """A table kept in a config file RocketMQ versions (`dataVersion`: a counter and the time of
    each write), written whole at each change (`persist`) under the key `table_name`, its content
    what `table()` answers. `on_persist` hears of each write (the front: the ha-server ships the
    file); a change the full disk kept from the file stays `unwritten` until `persist_unwritten`
    (the owner's period) writes it."""

    table_name: str

    def __init__(self, path: Path, counter: int, clock):
        self.path, self.counter, self.clock = path, counter, clock
        self.on_persist: Callable[[], None] | None = None
        self.unwritten = False

    @abc.abstractmethod
    def table(self) -> dict:
        """The table as the file holds it."""

    def extras(self) -> dict:
        """mqnode's own keys beside the table (RocketMQ's loader passes over keys it does not know)."""
        return {}

    def persist(self) -> None:
        self.counter += 1
        self.unwritten = not persist(self.path, {
            "dataVersion": {"counter": self.counter, "timestamp": int(self.clock() * 1000)}, self.table_name: self.table()}
            | self.extras())
        if self.on_persist is not None and not self.unwritten:
            self.on_persist()

    def persist_unwritten(self) -> None:
        if self.unwritten:
            self.persist()
