"""`--slave`: a slave beside the node the run starts, and the checks at the end that its
CommitLog is byte for byte the master's (it catches up within CATCH_UP_S after the load), and
its copy of the master's pop log too (within POP_CATCH_UP_S)."""

from __future__ import annotations

import time
from pathlib import Path

from node.tools.local_node import NodeProcess, free_port, local_settings
from shm.control_block import peek
from shm.mapped_file import file_name
from shm.pop_log import POP_REPLICA, PopLogTail

CATCH_UP_S = 120.0
POP_CATCH_UP_S = 30.0
CHUNK = 1 << 20


# the slave's own place beside its master: never the master's --node-option
SLAVE_OWN = frozenset({"brokerRole", "brokerId", "haMasterAddress", "haListenPort", "listen", "listenPort",
                       "storePathRootDir", "runDir"})
PORTS = frozenset({"grpcServerPort", "metricsPort"})  # the master's, bound: the slave takes only 0 (off)


def slave_options(options: dict[str, str]) -> dict[str, str]:
    """The master's --node-option settings the slave runs with too (its topology, its sizes, a
    proxy turned off), all but its own place and the master's ports."""
    return {name: value for name, value in options.items()
            if name not in SLAVE_OWN and (name not in PORTS or value == "0")}


def start_slave(master, directory: Path, log: Path, chaos: bool, options: dict[str, str]) -> NodeProcess:
    values = slave_options(options) | {"mappedFileSizeCommitLog": master.mappedFileSizeCommitLog}
    if chaos:
        values["actorMaxRestarts"] = 1000
    settings = local_settings(directory, **values, brokerRole="SLAVE", brokerId=1, haListenPort=free_port(),
                              haMasterAddress=f"127.0.0.1:{master.ha_port}")
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


def check_pop(master, slave) -> dict:
    """Wait for the slave's copy of the pop log to be the master's (its generation's snapshot
    and journal), then say so: {"ok", "generation", "bytes", "problem"}."""
    ours, theirs = PopLogTail(master.root / "pop"), PopLogTail(slave.root / POP_REPLICA)
    deadline = time.monotonic() + POP_CATCH_UP_S
    while True:
        mine, copy = _pop_log(ours), _pop_log(theirs)
        if mine == copy:
            return {"ok": True, "generation": mine[0], "bytes": len(mine[1]) + len(mine[2]), "problem": ""}
        if time.monotonic() > deadline:
            return {"ok": False, "generation": mine[0], "bytes": 0,
                    "problem": f"the slave's copy is at generation {copy[0]}, {len(copy[2])} journal bytes; the "
                               f"master's at {mine[0]}, {len(mine[2])} (after {POP_CATCH_UP_S:.0f} s)"}
        time.sleep(0.2)


def _pop_log(tail: PopLogTail) -> tuple[int, bytes, bytes]:
    gen, snapshot = tail.current()
    return gen, snapshot, tail.journal(gen, 0, -1)  # (-1: the whole journal)
