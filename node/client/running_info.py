"""A push consumer's own view, as it answers GET_CONSUMER_RUNNING_INFO (RocketMQ's
ConsumerRunningInfo; `mqnode admin consumer-status`): what only the member knows, for finding
out why a group lags. Its field names are RocketMQ's:

- `properties`: its settings, when it started (`PROP_CONSUMER_START_TIMESTAMP`), whether it
  consumes orderly, its pool size;
- `subscriptionSet`: each subscription, `{topic, subString, expressionType}`;
- `mqTable`: each queue it holds, as `topic@queueId`: `commitOffset` (what it commits next),
  `cachedMsgMinOffset`/`cachedMsgMaxOffset`/`cachedMsgCount`/`cachedMsgSizeInMiB` (pulled,
  not yet done), `locked`/`lastLockTimestamp` (orderly), `droped` (RocketMQ's spelling),
  `lastPullTimestamp`, `lastConsumeTimestamp` (wall ms, 0: never);
- `statusTable`: per topic over the last minute, `pullTPS`, `pullRT` (ms), `consumeOKTPS`,
  `consumeFailedTPS`, `consumeRT` (ms a listener call), and `consumeFailedMsgs` over the last hour;
- `jstack` (when asked, `jstackEnable`): every thread's Python stack, so a listener stuck in a
  call shows where.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
import traceback
from dataclasses import asdict

MINUTE_S = 60
HOUR_MINUTES = 60
MAX_STACKS_CHARS = 1 << 20  # (an answer is one header, at most 4 MiB: a process of many threads is cut here)


class ConsumeStats:
    """One topic's pulls and consumption in per-second buckets over the last minute (and its
    failures in per-minute buckets over the last hour). Called from the consumer's loop only;
    `clock` is injectable (monotonic seconds)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        # second -> [pulled messages, pulls, pull ms, ok, failed, listener calls, listener ms]
        self.seconds: collections.deque = collections.deque()
        self.minutes: collections.deque = collections.deque()  # [minute, failed]

    def pulled(self, count: int, rt_ms: float) -> None:
        bucket = self._bucket()
        bucket[1] += count
        bucket[2] += 1
        bucket[3] += rt_ms

    def consumed(self, ok: int, failed: int, calls: int, rt_ms: float) -> None:
        bucket = self._bucket()
        bucket[4] += ok
        bucket[5] += failed
        bucket[6] += calls
        bucket[7] += rt_ms
        if failed:
            minute = int(self.clock() // MINUTE_S)
            if not self.minutes or self.minutes[-1][0] != minute:
                self.minutes.append([minute, 0])
            self.minutes[-1][1] += failed

    def status(self) -> dict:
        """RocketMQ's ConsumeStatus over the last minute."""
        self._trim()
        sums = [sum(b[i] for b in self.seconds) for i in range(8)]
        _, pulled, pulls, pull_ms, ok, failed, calls, call_ms = sums
        return {"pullTPS": round(pulled / MINUTE_S, 2), "pullRT": round(pull_ms / pulls, 2) if pulls else 0.0,
                "consumeOKTPS": round(ok / MINUTE_S, 2), "consumeFailedTPS": round(failed / MINUTE_S, 2),
                "consumeRT": round(call_ms / calls, 2) if calls else 0.0,
                "consumeFailedMsgs": sum(failed for _, failed in self.minutes)}

    def _bucket(self) -> list:
        second = int(self.clock())
        if not self.seconds or self.seconds[-1][0] != second:
            self.seconds.append([second, 0, 0, 0.0, 0, 0, 0, 0.0])
            self._trim()
        return self.seconds[-1]

    def _trim(self) -> None:
        now = self.clock()
        while self.seconds and self.seconds[0][0] <= now - MINUTE_S:
            self.seconds.popleft()
        while self.minutes and self.minutes[0][0] <= now // MINUTE_S - HOUR_MINUTES:
            self.minutes.popleft()


def running_info(consumer, *, stacks: bool) -> dict:
    """`consumer` (an AsyncPushConsumer) as GET_CONSUMER_RUNNING_INFO answers it."""
    options = consumer.options
    properties = {_camel(key): "" if value is None else str(value) for key, value in asdict(options).items()
                  if key != "credentials"}  # (RocketMQ's consumer field names: consumeThreadMax, pullBatchSize, ...)
    properties |= {"PROP_CONSUME_TYPE": "CONSUME_PASSIVELY", "PROP_CONSUME_ORDERLY": str(consumer.orderly).lower(),
                   "PROP_THREADPOOL_CORE_SIZE": str(options.consume_thread_max),
                   "PROP_CONSUMER_START_TIMESTAMP": str(consumer.started_ms), "PROP_CLIENT_VERSION": "mqnode"}
    info = {"properties": properties,
            "subscriptionSet": [{"topic": topic, "subString": expression,
                                 "expressionType": consumer.expression_types.get(topic, "TAG")}
                                for topic, expression in sorted(consumer.subscriptions.items())],
            "mqTable": {f"{topic}@{queue}": _queue_info(pq, consumer)
                        for (topic, queue), pq in sorted(consumer.queues.items())},
            "statusTable": {topic: stats.status() for topic, stats in sorted(consumer.consume_stats.items())}}
    if stacks:
        info["jstack"] = thread_stacks()
    return info


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def _queue_info(pq, consumer) -> dict:
    cached = list(pq.pending)
    locked_ms = 0  # (locked_at is monotonic: shown as the wall clock's)
    if pq.locked_at > 0:
        locked_ms = int(time.time() * 1000 - (time.monotonic() - pq.locked_at) * 1000)
    return {"commitOffset": pq.commit_offset(), "cachedMsgMinOffset": min(cached, default=0),
            "cachedMsgMaxOffset": max(cached, default=0), "cachedMsgCount": len(cached),
            "cachedMsgSizeInMiB": round(pq.size / (1024 * 1024), 3),
            "locked": consumer.orderly and pq.lock_valid(consumer.lock_valid_s), "lastLockTimestamp": locked_ms,
            "droped": pq.dropped, "lastPullTimestamp": pq.last_pull_ms, "lastConsumeTimestamp": pq.last_consume_ms}


def thread_stacks() -> str:
    """Every thread's stack, innermost call last (as a traceback reads), each under its name."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sorted(sys._current_frames().items(), key=lambda item: names.get(item[0], "")):
        parts.append(f'"{names.get(ident, "?")}" (thread {ident})\n' + "".join(traceback.format_stack(frame)))
    text = "\n".join(parts)
    if len(text) > MAX_STACKS_CHARS:
        text = text[:MAX_STACKS_CHARS] + f"\n... ({len(text) - MAX_STACKS_CHARS} more characters cut)"
    return text
