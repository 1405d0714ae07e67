"""The tiered archive's manifest, `<archive>/_manifest.json`: which CommitLog segments an archive
(`scripts/pipeline archive`, node.pipeline.archive) holds, and so which the store may delete.

Layout (JSON, keys sorted):

    {"format": 2,
     "segments": {"<the segment's 20-digit name>": {"size": bytes, "crc": CRC-32 of its bytes,
                  "rows": records archived, "crcErrors": records skipped, "files": [Parquet files,
                  relative to the archive]}}}

Format 2 is the first a node can read from: its files carry each record's `envelope` (the record
without its body, shm.codec.envelope) in row groups of at most 2,048 rows. An archive of another
format is refused by every reader and writer, never guessed at.

Crash policy: the manifest is rewritten whole (written beside it, fsynced, renamed over it, the
directory fsynced), so a reader sees the old one or the new one, never a torn one. A segment is
recorded only after its files are in place, so every file a manifest names exists; a failed
fsync raises and the run that wrote it stops (its next run completes the segment).

Readers: the archive job; the node's clean service, which with `tieredArchiveDir` deletes only
segments recorded here with their size; and the node's tiered reads (actors.tiered).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

FILE = "_manifest.json"
FORMAT = 2


class ManifestError(RuntimeError):
    """The archive is not one this mqnode reads or writes."""


def read(archive: Path) -> dict:
    """The manifest of `archive`; an empty one when there is none yet."""
    try:
        manifest = orjson.loads((Path(archive) / FILE).read_bytes())
    except FileNotFoundError:
        return {"format": FORMAT, "segments": {}}
    except orjson.JSONDecodeError as e:  # never written torn (see the crash policy): someone edited it
        raise ManifestError(f"{Path(archive) / FILE} is not JSON: {e}") from None
    found = manifest.get("format", 1)
    if found != FORMAT:
        raise ManifestError(f"{archive} is an archive of format {found}; this mqnode reads and writes format "
                            f"{FORMAT} (records with their envelopes, for tiered reads): archive into a new directory")
    return manifest


def unreadable(archive: Path) -> str | None:
    """Why a node with `tieredArchiveDir` could not read from `archive` (None: it can). It needs
    pyarrow and an archive of this format, or none yet: one may be made after the node starts."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        return "tiered reads need pyarrow (pip install 'mqnode[server]')"
    if archive.exists() and not archive.is_dir():
        return f"{archive} is not a directory"
    try:
        read(archive)
    except ManifestError as e:
        return str(e)
    except OSError as e:
        return f"cannot read {archive}: {e.strerror}"
    return None


def write(archive: Path, manifest: dict) -> None:
    """Replace the manifest of `archive` atomically and durably."""
    archive = Path(archive)
    manifest["format"] = FORMAT
    temporary = archive / (FILE + ".tmp")
    with open(temporary, "wb") as f:
        f.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, archive / FILE)
    fsync_dir(archive)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def holds(manifest: dict, name: str, size: int) -> bool:
    """Whether the archive holds segment `name` as it is now (`size` bytes): what the clean
    service asks before it deletes a segment under `tieredArchiveDir`."""
    entry = manifest["segments"].get(name)
    return entry is not None and entry["size"] == size
