"""Building small stores for tests: settings with small files, messages, puts."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import numpy as np

from shm import settings as settings_module
from shm.codec import encode, encode_host, properties_string
from shm.dispatch import reput
from shm.encoded_batch import EncodedBatch
from shm.settings import Settings
from shm.store import MessageStore

BORN = encode_host("127.0.0.1", 50000)
STORE_HOST = encode_host("127.0.0.1", 10911)
BORN_V6 = encode_host("::1", 50000)
STORE_V6 = encode_host("::1", 10911)


def small_settings(root: Path, **overrides) -> Settings:
    values = {"storePathRootDir": str(root), "mappedFileSizeCommitLog": 64 * 1024,
              "mappedFileSizeConsumeQueue": 100 * 20, "maxHashSlotNum": 500, "maxIndexNum": 400,
              "frontPinBelowCpu": 0}  # (the default) a front opened here must never pin pytest's threads
    values.update(overrides)
    return settings_module.load(None, values)


def message(i: int, *, topic: str = "TopicA", queues: int = 4, size: int | None = None, born=BORN,
            store_host=STORE_HOST, delay: int = 0, sys_flag: int = 0) -> bytes:
    """Message i: body of a size that varies with i, tags/keys on some, as the golden harness."""
    length = size if size is not None else 1 + (i * 997 + (i * i) % 13) % 700
    props: dict[str, str | None] = {
        "TAGS": ("TagA", "TagB", None)[i % 3],
        "KEYS": f"key-{i}" + (f" alt-{i % 10}" if i % 4 == 3 else "") if i % 2 else None,
        "UNIQ_KEY": f"{i:032X}" if i % 5 == 0 else None,
        "CLUSTER": "DefaultCluster",
    }
    if delay:
        props["DELAY"] = str(delay)
    body = bytes((i * 7 + j) % 251 for j in range(length))
    return encode(topic=topic, body=body, queue_id=i % queues, born_timestamp=1700000000000 + i,
                  born_host=born, store_host=store_host, properties=properties_string(props), sys_flag=sys_flag)


def put(store: MessageStore, records: list[bytes], *, store_timestamp: int = 1795000000000, dispatch: bool = True):
    batch = EncodedBatch()
    for record in records:
        batch.add(record)
    begin = store.commitlog.offset_written
    result = store.commitlog.append_batch(batch, store_timestamp)
    if dispatch:
        reput(store, begin)
    return result


def open_store(settings: Settings, **kwargs) -> MessageStore:
    from shm.recovery import recover
    from shm.store_files import mark_running

    store = MessageStore(settings, **kwargs)
    store.report = recover(store)
    mark_running(settings.root)
    return store


def close_clean(store: MessageStore) -> None:
    from shm.store_files import mark_clean_exit

    store.flush_all()
    root = store.root
    store.close()
    mark_clean_exit(root)


_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def cached_pages(path, low: int, high: int) -> int:
    """How many pages of [low, high) of the file are in the page cache (mincore(2) on a fresh
    read-only mapping: it reports the cache, whether or not any process has them mapped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, high, prot=mmap.PROT_READ) as mapped:
            view = np.frombuffer(mapped, dtype=np.uint8)
            pages = (ctypes.c_ubyte * ((high - low) // mmap.PAGESIZE))()
            assert _LIBC.mincore(ctypes.c_void_p(view.ctypes.data + low), ctypes.c_size_t(high - low), pages) == 0
            del view
            return sum(b & 1 for b in bytes(pages))
    finally:
        os.close(fd)


READ_COUNTERS = ("served", "found", "held", "woken", "expired", "deferred", "deferrals")


def read_statistics(info: dict) -> dict:
    """The read service's counters from a GET_BROKER_RUNTIME_INFO reply, summed over its shells
    (`pull-i`): in compact, `pull-0` in the front's process (live); in split, each pull worker's
    own (pushed once a second, so up to a second behind)."""
    total = dict.fromkeys(READ_COUNTERS, 0)
    for label, stats in info["actors"].items():
        if not label.startswith("pull-"):
            continue
        for name in READ_COUNTERS:
            total[name] += stats.get(name, 0)
    return total


def wait_until(predicate, timeout: float, what: str):
    """`predicate()`'s first true value, asked every 0.1 s; AssertionError naming `what` after `timeout` s."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
