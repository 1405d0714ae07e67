"""`--slave`: a slave beside the node the run starts, and the check at the end that its
CommitLog is byte for byte the master's (it catches up within CATCH_UP_S after the load)."""

from __future__ import annotations

import time
from pathlib import Path

from node.tools.local_node import NodeProcess, free_port, local_settings
from shm.control_block import peek
from shm.mapped_file import file_name

CATCH_UP_S = 120.0
CHUNK = 1 << 20


def start_slave(master, directory: Path, log: Path, chaos: bool) -> NodeProcess:
    settings = local_settings(directory, brokerRole="SLAVE", brokerId=1, haListenPort=free_port(),
                              haMasterAddress=f"127.0.0.1:{master.ha_port}",
                              mappedFileSizeCommitLog=master.mappedFileSizeCommitLog,
                              **({"actorMaxRestarts": 1000} if chaos else {}))
    return NodeProcess(settings, log).start(timeout=120)


def _counter(settings, name: str) -> int:
    return peek(settings.root, name)


def check(master, slave) -> dict:
    """Wait for the slave to reach the master's written end, then compare their bytes from the
    slave's first one: {"ok", "masterWritten", "slaveWritten", "comparedBytes", "problem"}."""
    deadline = time.monotonic() + CATCH_UP_S
    while _counter(slave, "written") != _counter(master, "written") and time.monotonic() < deadline:
        time.sleep(0.1)
    end, slave_end = _counter(master, "written"), _counter(slave, "written")
    out = {"ok": False, "masterWritten": end, "slaveWritten": slave_end, "comparedBytes": 0, "problem": ""}
    if slave_end != end:
        out["problem"] = f"the slave reached {slave_end} of {end} within {CATCH_UP_S:.0f} s"
        return out
    at, size = _counter(slave, "min_offset"), master.mappedFileSizeCommitLog
    while at < end:
        n = min(CHUNK, end - at, size - at % size)
        theirs, ours = _read(master, at, n), _read(slave, at, n)
        if theirs != ours:
            out["problem"] = f"the bytes differ in [{at}, {at + n})"
            return out
        at += n
        out["comparedBytes"] += n
    out["ok"] = True
    return out


def _read(settings, offset: int, size: int) -> bytes:
    segment = offset - offset % settings.mappedFileSizeCommitLog
    with open(settings.commitlog_dir / file_name(segment), "rb") as f:
        f.seek(offset - segment)
        return f.read(size)
