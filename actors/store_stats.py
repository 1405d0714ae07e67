"""StoreStatsService's put figures (spec §13), kept by the front. Pure: the caller passes times.

putTps is "<10 s> <60 s> <600 s>" over one-second snapshots of the total (601 kept);
putMessageDistributeTime counts replies by latency bucket; putMessageEntireTimeMax is the
slowest request from arrival at the front to its reply, in ms.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque

BUCKET_BOUNDS_MS = [0, 10, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 10000]
BUCKET_NAMES = ["<=0ms", "0~10ms", "10~50ms", "50~100ms", "100~200ms", "200~500ms", "500ms~1s", "1~2s", "2~3s",
                "3~4s", "4~5s", "5~10s", "10s~"]
SNAPSHOTS = 601


class StoreStats:
    def __init__(self, now_ms: int):
        self.boot_ms = now_ms
        self.entire_time_max_ms = 0
        self.distribution = [0] * len(BUCKET_NAMES)
        self.snapshots: deque[tuple[int, int]] = deque(maxlen=SNAPSHOTS)
        self.put_times_total = 0
        self.put_size_total = 0
        self.put_failed_times = 0

    def record_latency(self, ms: float) -> None:
        self.entire_time_max_ms = max(self.entire_time_max_ms, int(ms))
        self.distribution[bisect_left(BUCKET_BOUNDS_MS, ms) if ms > 0 else 0] += 1

    def sample(self, now_ms: int, put_times_total: int, put_size_total: int, put_failed_times: int) -> None:
        """Once a second: the writer's cumulative counters."""
        self.put_times_total, self.put_size_total = put_times_total, put_size_total
        self.put_failed_times = put_failed_times
        if not self.snapshots or now_ms - self.snapshots[-1][0] >= 900:
            self.snapshots.append((now_ms, put_times_total))

    def tps(self, seconds: int) -> str:
        """Puts a second over the last `seconds` s; before that much time has passed since boot,
        over the time so far (RocketMQ leaves the field empty then); "0.00" before the second
        snapshot."""
        if len(self.snapshots) < 2:
            return "0.00"
        first, last = self.snapshots[-1 - min(seconds, len(self.snapshots) - 1)], self.snapshots[-1]
        elapsed = last[0] - first[0]
        return f"{(last[1] - first[1]) * 1000 / elapsed:.2f}" if elapsed > 0 else "0.00"

    def runtime_info(self, now_ms: int) -> dict[str, str]:
        seconds = (now_ms - self.boot_ms) // 1000
        days, rest = divmod(seconds, 86400)
        hours, rest = divmod(rest, 3600)
        minutes, secs = divmod(rest, 60)
        total = self.put_times_total
        return {
            "bootTimestamp": str(self.boot_ms),
            "runtime": f"[ {days} days, {hours} hours, {minutes} minutes, {secs} seconds ]",
            "putMessageTimesTotal": str(total or 1),
            "putMessageSizeTotal": str(self.put_size_total),
            "putMessageAverageSize": f"{self.put_size_total / total:.2f}" if total else "0.00",
            "putMessageFailedTimes": str(self.put_failed_times),
            "putMessageEntireTimeMax": str(self.entire_time_max_ms),
            "putMessageDistributeTime": " ".join(f"[{n}]:{c}" for n, c in zip(BUCKET_NAMES, self.distribution)),
            "putTps": f"{self.tps(10)} {self.tps(60)} {self.tps(600)}",
        }
