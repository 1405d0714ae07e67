"""The parameters of a load-test run, the `--scenario` presets, and message-size distributions.

Precedence: built-in defaults, then the preset, then the flags the user gave. The resolved
parameters go into results.json, so a run can be repeated exactly.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass

from node.tools.loadtest.payload import HEADER_SIZE

FLUSH_MODES = ("ASYNC_FLUSH", "SYNC_FLUSH")


@dataclass
class RunParams:
    scenario: str | None = None
    endpoint: str | None = None      # None: start a node on a temporary store
    topic: str = "LoadTest"
    topics: int = 1                  # > 1: topics <topic>-0 .. <topic>-<N-1>, sends spread over them
    queues: int = 8                  # queues of the topic, on a node the run starts
    producers: int = 1
    consumers: int = 1
    size: str = "1024"               # see SizeSpec
    rate: float = 0.0                # total msgs/s over all producers; 0 = as fast as possible
    batch: int = 1                   # > 1: send_batch of this many; 1: single sends
    concurrency: int = 64            # sends (or batches) in flight per producer
    linger_ms: float = 1.0           # single sends coalesced for up to this long
    tags: str = ""                   # comma-separated, cycled over the messages
    keys: bool = False               # give each message a key (indexed by the node)
    flush: str = "ASYNC_FLUSH"       # flushDiskType of a node the run starts
    node_options: list[str] = dataclasses.field(default_factory=list)  # KEY=VALUE settings
    duration: float | None = None    # seconds of producing
    count: int | None = None         # messages to produce in all
    backlog: bool = False            # consumers start when the producers are done
    pop: bool = False                # consumers pop (RocketMQ 5's model) as one group from every queue, acking each
    invisible_ms: int = 5000         # --pop: a popped message not acked comes back after this
    drain_timeout: float = 60.0      # seconds consumers get to catch up after producing ends
    send_timeout: float = 5.0
    verify: bool = False
    chaos: bool = False
    slave: bool = False              # a slave beside the node the run starts (struck by --chaos too)
    chaos_interval: tuple[float, float] = (2.0, 5.0)
    seed: int = 1
    output: str | None = None
    profile: bool = False            # py-spy every actor and worker (see profile.py)
    interval: float = 0.5            # seconds between progress samples

    def validate(self) -> None:
        problems = []
        if self.producers < 1 or self.producers > 64:
            problems.append("--producers must be 1..64")
        if self.consumers < 0 or self.consumers > 64:
            problems.append("--consumers must be 0..64")
        if self.batch < 1 or self.batch > 4096:
            problems.append("--batch must be 1..4096")
        if self.concurrency < 1 or self.concurrency > 10_000:
            problems.append("--concurrency must be 1..10000")
        if self.topics < 1 or self.topics > 256:
            problems.append("--topics must be 1..256")
        if self.queues < 1 or self.queues > 1024:
            problems.append("--queues must be 1..1024")
        if self.rate < 0:
            problems.append("--rate must be >= 0")
        if self.flush not in FLUSH_MODES:
            problems.append(f"--flush must be one of {', '.join(FLUSH_MODES)}")
        if self.duration is not None and self.duration <= 0:
            problems.append("--duration must be > 0")
        if self.count is not None and self.count < 1:
            problems.append("--count must be >= 1")
        if self.slave and self.endpoint:
            problems.append("--slave starts a slave of the node the run starts (no --endpoint)")
        if self.chaos and self.endpoint:
            problems.append("--chaos restarts what it kills, so it needs a node the run starts (no --endpoint)")
        if not 1000 <= self.invisible_ms <= 600_000:
            problems.append("--invisible-ms must be 1000..600000")
        if not 0.05 <= self.interval <= 60:  # (0: each worker reported in a busy loop and never finished)
            problems.append("--interval must be 0.05..60 seconds")
        if not self.send_timeout > 0:  # (0: every worker's client refused it, and the worker died)
            problems.append("--send-timeout must be > 0")
        if not self.drain_timeout >= 0:
            problems.append("--drain-timeout must be >= 0")
        if not self.linger_ms >= 0:
            problems.append("--linger-ms must be >= 0")
        low, high = self.chaos_interval
        if not 0 < low <= high:
            problems.append("--chaos-interval MIN,MAX needs 0 < MIN <= MAX")
        if self.verify and self.consumers < 1:
            problems.append("--verify needs consumers (--consumers >= 1)")
        try:
            SizeSpec.parse(self.size)
        except ValueError as e:
            problems.append(str(e))
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def topic_names(self) -> list[str]:
        return [self.topic] if self.topics == 1 else [f"{self.topic}-{i}" for i in range(self.topics)]

    def bounded(self) -> RunParams:
        """Every run stops by itself: no count and no duration means 30 seconds."""
        if self.count is None and self.duration is None:
            return dataclasses.replace(self, duration=30.0)
        return self

    @property
    def pop_group(self) -> str:
        """--pop: the consumers' group, one per topic name (its offsets begin at the run's start)."""
        return f"{self.topic}-pop"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


PRESETS: dict[str, dict] = {
    # What the published figures in docs/performance.md come from; flags still override.
    "async-batch": dict(flush="ASYNC_FLUSH", producers=2, consumers=0, batch=128, concurrency=2, count=400_000),
    "async-single": dict(flush="ASYNC_FLUSH", producers=2, consumers=0, batch=1, concurrency=512, count=200_000),
    "sync-flush": dict(flush="SYNC_FLUSH", producers=2, consumers=0, batch=1, concurrency=64, count=100_000),
    "consume-backlog": dict(flush="ASYNC_FLUSH", producers=2, consumers=1, batch=128, concurrency=2,
                            count=1_000_000, backlog=True, drain_timeout=600.0),
    "latency": dict(flush="ASYNC_FLUSH", producers=1, consumers=1, batch=1, concurrency=64, rate=1000,
                    linger_ms=0.0, duration=20.0),
    "mixed": dict(flush="ASYNC_FLUSH", producers=2, consumers=2, batch=1, concurrency=256, rate=10_000,
                  size="200-4000", tags="TagA,TagB,TagC", keys=True, duration=30.0),
}


_SIZE = re.compile(r"^\s*(\d+)\s*(k|kb|kib|m|mb|mib)?\s*$", re.I)


def parse_bytes(text: str) -> int:
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"--size: {text!r} is not a size (e.g. 1024, 4k, 1MiB)")
    unit = (match.group(2) or "").lower()
    return int(match.group(1)) * (1024 if unit.startswith("k") else 1024 * 1024 if unit.startswith("m") else 1)


@dataclass(frozen=True)
class SizeSpec:
    """`N` fixed; `A-B` uniform between A and B; `A,B,C` one of these, equally likely.
    Sizes are whole bodies, at least the 32-byte load-test header."""

    choices: tuple[int, ...] = ()
    low: int = 0
    high: int = 0

    @classmethod
    def parse(cls, text: str) -> SizeSpec:
        if "-" in text:
            low, high = (parse_bytes(p) for p in text.split("-", 1))
            spec = cls(low=low, high=high)
        else:
            spec = cls(choices=tuple(parse_bytes(p) for p in text.split(",")))
        smallest = min(spec.choices) if spec.choices else spec.low
        if smallest < HEADER_SIZE or (not spec.choices and spec.high < spec.low):
            raise ValueError(f"--size {text!r}: sizes start at {HEADER_SIZE} bytes and ranges go up")
        if spec.largest > 4 * 1024 * 1024:
            raise ValueError(f"--size {text!r}: bodies go up to 4 MiB (maxMessageSize)")
        return spec

    @property
    def largest(self) -> int:
        return max(self.choices) if self.choices else self.high

    @property
    def mean(self) -> float:
        return sum(self.choices) / len(self.choices) if self.choices else (self.low + self.high) / 2

    def sampler(self, seed: int):
        rng = random.Random(seed)
        if self.choices and len(self.choices) == 1:
            fixed = self.choices[0]
            return lambda: fixed
        if self.choices:
            return lambda: rng.choice(self.choices)
        return lambda: rng.randint(self.low, self.high)
