"""Per-message records of a run, one file per worker under `<output>/records/`.

Producers append a SENT row for every message whose send finished (any outcome); consumers a
CONSUMED row for every load-test message they received, in the order received. Rows are numpy
structured arrays written raw (little-endian), so a million messages cost ~30 MB and one
`np.fromfile`. `verify` needs nothing else, which is what lets `--reverify DIR` check a run
again, and the tests feed it deliberately broken records.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Outcome of a send, from the producer's point of view.
ACKED = 0     # PUT_OK: the node promised it is stored (and flushed, under SYNC_FLUSH)
STORED = 1    # stored with a weaker promise (FLUSH_DISK_TIMEOUT, SLAVE_NOT_AVAILABLE, ...)
REFUSED = 2   # a status that says it was not stored (SYSTEM_BUSY, SERVICE_NOT_AVAILABLE, ...)
UNKNOWN = 3   # no reply (timeout, the node died): stored or not, at most once
OUTCOMES = {ACKED: "acked", STORED: "stored", REFUSED: "refused", UNKNOWN: "unknown"}

SENT = np.dtype([("producer", "<u4"), ("seq", "<u8"), ("topic", "<u2"), ("queue", "<i4"), ("offset", "<i8"),
                 ("size", "<u4"), ("outcome", "u1")])
CONSUMED = np.dtype([("producer", "<u4"), ("seq", "<u8"), ("topic", "<u2"), ("queue", "<i4"), ("offset", "<i8"),
                     ("size", "<u4"), ("intact", "u1"), ("consumer", "<u2")])
# `topic` is the index in the run's topic list (RunParams.topic_names).
UNREADABLE = 0xFFFFFFFF  # CONSUMED.producer of a body whose header could not be read


class RecordWriter:
    """Appends rows given as tuples; `flush` writes what is buffered (bounded by the caller's
    report interval, so a killed worker loses at most that much)."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path = path
        self.dtype = dtype
        self.rows: list[tuple] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "ab")

    def add(self, row: tuple) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        if self.rows:
            np.array(self.rows, dtype=self.dtype).tofile(self.file)
            self.rows.clear()
        self.file.flush()

    def close(self) -> None:
        self.flush()
        self.file.close()


def load(directory: Path, kind: str) -> np.ndarray:
    """Every row of `kind` ("sent" or "consumed") under `directory`, files in name order."""
    dtype = SENT if kind == "sent" else CONSUMED
    parts = [np.fromfile(p, dtype=dtype) for p in sorted(directory.glob(f"{kind}-*.bin"))]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def save(directory: Path, kind: str, rows: np.ndarray, index: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rows.astype(SENT if kind == "sent" else CONSUMED).tofile(directory / f"{kind}-{index}.bin")
