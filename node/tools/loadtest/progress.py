"""The coordinator's view of a run: the latest report of every worker, merged into totals, a
time series sampled every interval, and the live dashboard (rich) drawn from it."""

from __future__ import annotations

import time
from collections import Counter

from rich.table import Table

from node.tools.loadtest.histogram import LogHistogram

PERCENTILES = ("50", "90", "99", "99.9")


class Progress:
    def __init__(self, producers: int, consumers: int):
        self.latest: dict[tuple[str, int], dict] = {}
        self.expected = {"producer": producers, "consumer": consumers}
        self.series: list[dict] = []
        self.started = time.time()
        self.cpu: float | None = None
        self.memory: dict | None = None

    def update(self, report: dict) -> None:
        self.latest[(report["role"], report["index"])] = report

    def _of(self, role: str) -> list[dict]:
        return [r for (kind, _), r in self.latest.items() if kind == role]

    def done(self, role: str) -> bool:
        reports = self._of(role)
        return len(reports) == self.expected[role] and all(r["done"] for r in reports)

    def total(self, role: str, field: str) -> int:
        return sum(r[field] for r in self._of(role))

    def errors(self) -> Counter:
        out: Counter = Counter()
        for r in self.latest.values():
            out.update(r["errors"])
        return out

    def histogram(self, role: str, field: str) -> LogHistogram:
        out = LogHistogram()
        for r in self._of(role):
            out.merge(LogHistogram.from_sparse(r[field]))
        return out

    def lag(self) -> int:
        return max(0, self.total("producer", "messages") - self.total("consumer", "messages"))

    def sample(self, cpu: float | None, memory: dict | None) -> dict:
        """Append one point of the time series (rates over the last interval)."""
        now = time.time() - self.started
        produced, consumed = self.total("producer", "messages"), self.total("consumer", "messages")
        previous = self.series[-1] if self.series else {"t": 0.0, "produced": 0, "consumed": 0,
                                                          "producedBytes": 0, "consumedBytes": 0}
        span = max(now - previous["t"], 1e-6)
        point = {"t": round(now, 3), "produced": produced, "consumed": consumed,
                 "producedBytes": self.total("producer", "bytes"), "consumedBytes": self.total("consumer", "bytes"),
                 "errors": sum(self.errors().values()), "cpu": cpu, "lag": self.lag()}
        for key in MEMORY_KEYS:  # (bytes; None when the node's processes cannot be seen)
            point[key] = memory[key] if memory else None
        point["produceRate"] = (produced - previous["produced"]) / span
        point["consumeRate"] = (consumed - previous["consumed"]) / span
        point["produceMBps"] = (point["producedBytes"] - previous["producedBytes"]) / span / 1e6
        point["consumeMBps"] = (point["consumedBytes"] - previous["consumedBytes"]) / span / 1e6
        self.series.append(point)
        if cpu is not None:
            self.cpu, self.memory = cpu, memory
        return point

    def rate(self, role: str) -> tuple[float, float]:
        """(msgs/s, MB/s) from the first worker start to the last message, over all workers."""
        reports = [r for r in self._of(role) if r["began"] and r["ended"]]
        if not reports:
            return 0.0, 0.0
        span = max(r["ended"] for r in reports) - min(r["began"] for r in reports)
        if span <= 0:
            return 0.0, 0.0
        return self.total(role, "messages") / span, self.total(role, "bytes") / span / 1e6

    def summary(self) -> dict:
        ack, e2e = self.histogram("producer", "ack"), self.histogram("consumer", "e2e")
        produce_rate, produce_mb = self.rate("producer")
        consume_rate, consume_mb = self.rate("consumer")
        cpus = [p["cpu"] for p in self.series if p["cpu"] is not None]
        peaks = {key: max((p[key] for p in self.series if p.get(key) is not None), default=None)
                 for key in MEMORY_KEYS}
        outcomes = [0, 0, 0, 0]
        for r in self._of("producer"):
            outcomes = [a + b for a, b in zip(outcomes, r["outcomes"])]
        return {
            "produced": self.total("producer", "messages"), "produceRate": produce_rate, "produceMBps": produce_mb,
            "consumed": self.total("consumer", "messages"), "consumeRate": consume_rate, "consumeMBps": consume_mb,
            "outcomes": dict(zip(("acked", "stored", "refused", "unknown"), outcomes)),
            "ack": _percentiles(ack), "e2e": _percentiles(e2e), "errors": dict(self.errors()),
            "maxLag": max((p["lag"] for p in self.series), default=0),
            "cpuMean": sum(cpus) / len(cpus) if cpus else None, "cpuMax": max(cpus) if cpus else None,
            "rssMax": peaks["rss"], "anonMax": peaks["anon"], "pssMax": peaks["pss"], "pssFileMax": peaks["pssFile"],
            "anonFirst": next((p["anon"] for p in self.series if p.get("anon") is not None), None),
            "foreign": self.total("consumer", "foreign"),
            "unfinishedQueues": sorted(q for r in self._of("consumer") for q in r["unfinished"]),
        }

    def dashboard(self, title: str, remaining: str) -> Table:
        point = self.series[-1] if self.series else None
        table = Table(title=f"{title}  [dim]{remaining}[/dim]", show_header=True, header_style="bold")
        for column in ("", "msgs/s", "MB/s", "total", "latency p50 / p99"):
            table.add_column(column, justify="right" if column else "left")
        ack, e2e = self.histogram("producer", "ack"), self.histogram("consumer", "e2e")
        if point:
            table.add_row("produce (ack)", f"{point['produceRate']:,.0f}", f"{point['produceMBps']:,.1f}",
                          f"{point['produced']:,}", f"{_fmt(ack.percentile(50))} / {_fmt(ack.percentile(99))}")
            if self.expected["consumer"]:
                table.add_row("consume (end-to-end)", f"{point['consumeRate']:,.0f}", f"{point['consumeMBps']:,.1f}",
                              f"{point['consumed']:,}", f"{_fmt(e2e.percentile(50))} / {_fmt(e2e.percentile(99))}")
        errors = ", ".join(f"{k} {v:,}" for k, v in sorted(self.errors().items())) or "none"
        node = "-" if self.cpu is None else f"CPU {self.cpu:.0f}%  {memory_text(self.memory)}"
        table.caption = f"lag {self.lag():,} msgs   node {node}   errors: {errors}"
        return table

    def line(self) -> str:
        """The dashboard as one plain line, for logs when stdout is not a terminal."""
        point = self.series[-1] if self.series else {"produceRate": 0, "produced": 0, "consumeRate": 0, "consumed": 0}
        return (f"t={time.time() - self.started:6.1f}s produce {point['produceRate']:>9,.0f}/s "
                f"({point['produced']:,}) consume {point['consumeRate']:>9,.0f}/s ({point['consumed']:,}) "
                f"lag {self.lag():,} errors {sum(self.errors().values()):,} {memory_text(self.memory)}")


def _percentiles(h: LogHistogram) -> dict[str, float | None]:
    out = {k: h.percentile(float(k)) for k in PERCENTILES}
    out["max"] = h.max()
    out["count"] = h.total
    return out


def _fmt(micros: float | None) -> str:
    if micros is None:
        return "-"
    return f"{micros / 1000:,.1f} ms" if micros >= 1000 else f"{micros:,.0f} µs"


MEMORY_KEYS = ("rss", "anon", "pss", "pssFile")  # a point's memory figures (actors.memory)


def memory_text(memory: dict | None) -> str:
    """The live line's memory: what the node owns (anonymous), what it costs (PSS) and of that
    the mapped files' share (page cache the kernel can take back)."""
    if not memory:
        return "memory -"
    mib = 2 ** 20
    return (f"anon {memory['anon'] / mib:,.0f} MiB  PSS {memory['pss'] / mib:,.0f} MiB "
            f"(files {memory['pssFile'] / mib:,.0f})")
