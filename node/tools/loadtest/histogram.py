"""Latency histograms with logarithmic buckets (about 2% wide), mergeable by addition.

A sample of `v` microseconds goes to bucket floor(log(v) / log(GROWTH)), clamped to the range;
a percentile is read as the geometric middle of its bucket, so it is within ~1% of the truth.
Workers keep one per figure and ship the counts; the coordinator adds them.
"""

from __future__ import annotations

import math

import numpy as np

GROWTH = 1.02
BUCKETS = int(math.log(1e9) / math.log(GROWTH)) + 1  # up to 1,000 s in µs


class LogHistogram:
    def __init__(self, counts: np.ndarray | None = None):
        self.counts = np.zeros(BUCKETS, np.int64) if counts is None else counts
        self.pending: list[float] = []

    def add(self, micros: float) -> None:
        self.pending.append(micros)

    def settle(self) -> LogHistogram:
        """Bucket the samples added since the last call (one vectorised step, not one per add)."""
        if self.pending:
            values = np.maximum(np.asarray(self.pending, np.float64), 1.0)
            index = np.minimum((np.log(values) / math.log(GROWTH)).astype(np.int64), BUCKETS - 1)
            np.add.at(self.counts, index, 1)
            self.pending.clear()
        return self

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def merge(self, other: LogHistogram) -> LogHistogram:
        self.counts += other.settle().counts
        return self

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0..100) in µs, or None when empty."""
        total = self.total
        if total == 0:
            return None
        rank = max(1, math.ceil(total * q / 100))
        bucket = int(np.searchsorted(np.cumsum(self.counts), rank))
        return value_of(bucket)

    def max(self) -> float | None:
        nonzero = np.flatnonzero(self.counts)
        return value_of(int(nonzero[-1])) if len(nonzero) else None

    def to_sparse(self) -> dict[int, int]:
        self.settle()
        nonzero = np.flatnonzero(self.counts)
        return {int(i): int(self.counts[i]) for i in nonzero}

    @classmethod
    def from_sparse(cls, sparse: dict) -> LogHistogram:
        out = cls()
        for i, n in sparse.items():
            out.counts[int(i)] = n
        return out

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """(bucket values in µs, counts) of the non-empty buckets, for plots."""
        nonzero = np.flatnonzero(self.counts)
        return np.array([value_of(int(i)) for i in nonzero]), self.counts[nonzero]


def value_of(bucket: int) -> float:
    return GROWTH ** (bucket + 0.5)
