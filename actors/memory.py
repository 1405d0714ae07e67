"""A node's memory as an operator can act on it, from /proc (Linux).

Every process of a node maps the same CommitLog segments, so the sum of their RSS counts each
page of those files once per process that touched it: a 5-minute load at 20k msgs/s read as
27 GiB on a 24 GiB machine. What a node costs is two other figures:
- anonymous memory (`anon`: the processes' own heaps, stacks, Python objects), which only grows
  with what the node holds, and is what runs a machine out of memory;
- the proportional set size (`pss`: each page divided among the processes that map it, so a
  shared page counts once over the node), of which `pssFile` is the mapped files' share: page
  cache the kernel gives back under pressure (clean pages) or writes back first (dirty ones).

`rss` (the sum over processes) stays for comparison. Each figure is in bytes; a process that
has gone (Ray restarting it) or cannot be read is left out.
"""

from __future__ import annotations

FIELDS = {"Rss:": "rss", "Pss:": "pss", "Pss_Anon:": "anon", "Pss_File:": "pssFile", "Pss_Shmem:": "pssShmem"}
EMPTY = {"rss": 0, "pss": 0, "anon": 0, "pssFile": 0, "pssShmem": 0}


def process_memory(pid: int) -> dict[str, int] | None:
    """One process's figures (smaps_rollup: one pass of the kernel over its mappings); None
    when it is gone or not readable."""
    out = dict(EMPTY)
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(" ")
                key = FIELDS.get(name)
                if key is not None:
                    out[key] = int(rest.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return out


def node_memory(pids) -> dict[str, int]:
    """The figures summed over `pids` (each distinct pid once): `rss`, `pss`, `anon`, `pssFile`,
    `pssShmem`, and `processes` (how many were read)."""
    total, read = dict(EMPTY), 0
    for pid in set(pids):
        figures = process_memory(pid)
        if figures is None:
            continue
        read += 1
        for key, value in figures.items():
            total[key] += value
    return total | {"processes": read}
