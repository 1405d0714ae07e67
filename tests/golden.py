"""Access to the golden store written by real RocketMQ 4.9.8 (tests/data/rocketmq-4.9-store, with its
manifest and provenance README)."""

from __future__ import annotations

import functools
import os
import shutil
import stat
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("MQNODE_GOLDEN", ROOT / "tests" / "data" / "rocketmq-4.9-store"))
GOLDEN_STORE = GOLDEN / "store"
GOLDEN_SETTINGS = {
    "mappedFileSizeCommitLog": 65536,
    "mappedFileSizeConsumeQueue": 2000,
    "maxHashSlotNum": 500,
    "maxIndexNum": 400,
    "flushDiskType": "SYNC_FLUSH",
}


@functools.cache
def manifest() -> dict:
    return orjson.loads((GOLDEN / "manifest.json").read_bytes())


def copy_store(destination: Path) -> Path:
    """A writable copy of the golden store (the original is read-only and must stay untouched)."""
    target = destination / "store"
    shutil.copytree(GOLDEN_STORE, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return target


def all_records() -> list[dict]:
    """Every record in the golden CommitLog: the harness's puts plus the store's redeliveries."""
    m = manifest()
    return [*m["puts"], *m["storeGenerated"]]
