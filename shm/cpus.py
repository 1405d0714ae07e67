"""The CPUs a process may use, as the JVM that RocketMQ runs in counts them (availableProcessors):
not os.cpu_count(), the host's. A node sizes its pull workers (Settings.pull_processes) and its
embedded Ray (node.server.ray_setup.init) by them."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def available_cpus(cgroup: Path = CGROUP) -> int:
    """The CPUs this process may use, as the JVM that RocketMQ runs in counts them
    (availableProcessors): its affinity mask (taskset, a container's cpuset) and its cgroup's CPU
    quota (a container's --cpus, a Kubernetes limit), rounded up. os.cpu_count() counts the
    host's: in a container given 2 CPUs of a 64-core host a node started 62 pull workers (~60 MB
    each) and told its Ray it had 64 CPUs."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not Linux)
        count = os.cpu_count() or 1
    quota = cpu_quota(cgroup)
    return max(1, min(count, math.ceil(quota))) if quota else count


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPUs a CFS quota allows, as a container sees its own cgroup at the mount's root (as Ray
    and the JVM read it): cgroup v2's `cpu.max` ("max 100000": none), else v1's
    `cpu/cpu.cfs_quota_us` over `cpu.cfs_period_us` (-1: none). None without one."""
    try:
        limit, period = (cgroup / "cpu.max").read_text().split()
        return int(limit) / int(period) if limit != "max" else None
    except (OSError, ValueError):
        pass
    try:
        limit = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return limit / period if limit > 0 and period > 0 else None
