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

import logging
import os
import re
import shutil
from pathlib import Path

import orjson

from shm.mapped_file import NO_ROOM

log = logging.getLogger("mqnode")
_unwritten: set[Path] = set()  # this process's files whose last write found no room (logged once a streak)

_BARE_INT_KEY = re.compile(r'([{,]\s*)(-?\d+)\s*:')


def loads(text: str):
    """Parse fastjson output, quoting bare integer keys first (values are never touched: the
    pattern only matches after `{` or `,`, and strings in these files hold no `{`/`,` + digits + `:`)."""
    return orjson.loads(_BARE_INT_KEY.sub(r'\1"\2":', text))


def dumps(value, indent: int = 0, *, bean: bool = True) -> str:
    """fastjson PrettyFormat: dicts with str keys are beans (fields on their own lines), dicts
    with int keys are maps (`{k:v,...}` as fastjson prints them)."""
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
    return write_whole(path, dumps(value).encode(), backup=True)


def write_whole(path: Path, data: bytes, *, backup: bool = False, suffix: str = ".tmp") -> bool:
    """`data` as `path`'s content, whole or not at all: written to a temporary, fsynced, renamed
    over it (with `backup`, the previous content copied to `.bak` first). False, the file as it
    was, when the disk has no room; any other failure raises."""
    temporary = path.with_name(path.name + suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:  # (no room, even from the fsync: the temporary goes, never synced again)
        if e.errno not in NO_ROOM:
            raise
        temporary.unlink(missing_ok=True)
        return _no_room(path, e)
    if backup and path.exists():
        bak = path.with_name(path.name + ".bak")
        try:
            shutil.copyfile(path, bak)
        except OSError as e:
            if e.errno not in NO_ROOM:
                raise
            bak.unlink(missing_ok=True)  # (a cut copy is no fallback; the new content is whole and synced)
    os.replace(temporary, path)
    if path in _unwritten:
        _unwritten.discard(path)
        log.warning("%s written again", path)
    return True


def _no_room(path: Path, error: OSError) -> bool:
    if path not in _unwritten:
        _unwritten.add(path)
        log.error("%s not written (%s): the change is kept in memory and written when there is room", path,
                  error.strerror)
    return False
