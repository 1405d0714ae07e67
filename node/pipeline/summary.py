"""`scripts/pipeline summary`: what a store or an archive holds, computed on Spark.

Per topic: messages and body bytes, and both over time (buckets of a round width chosen so the
span has at most ~120); body sizes (percentiles and a power-of-two histogram); born-to-store
latency percentiles; queue skew (the busiest queue against the mean, per topic); the top tags
and keys. Written as `summary.json`, PNG plots and a self-contained `report.html` (as the load
test's report is), and printed as a table.
"""

from __future__ import annotations

import html
from pathlib import Path

import orjson

from node.figures import embedded, save

BUCKETS_S = (1, 10, 60, 600, 3600, 6 * 3600, 86400)  # round widths for "over time"
PERCENTILES = (0.5, 0.9, 0.99, 0.999)
PLOTS = {"over_time.png": "messages per bucket, by topic", "body_sizes.png": "body sizes (bytes, log2 buckets)",
         "latency.png": "born-to-store latency percentiles (ms)", "queue_skew.png": "messages per queue"}
TOP = 10


def compute(frame) -> dict:
    """The summary of a DataFrame with the connector's columns (a node, a store or an archive)."""
    from pyspark.sql import functions as F

    rows = frame.select("topic", "queueId", "tags", "keys", F.length("body").alias("size"),
                        F.unix_millis("storeTimestamp").alias("stored"),
                        (F.unix_millis("storeTimestamp") - F.unix_millis("bornTimestamp")).alias("latency")).cache()
    try:
        span = rows.agg(F.min("stored").alias("first"), F.max("stored").alias("last"), F.count("*").alias("n")).first()
        if not span["n"]:
            return {"messages": 0, "bytes": 0, "topics": {}}
        bucket = next((b for b in BUCKETS_S if (span["last"] - span["first"]) / 1000 / b <= 120), BUCKETS_S[-1])
        return {"messages": span["n"], "bytes": rows.agg(F.sum("size")).first()[0] or 0,
                "firstStored": span["first"], "lastStored": span["last"], "bucketSeconds": bucket,
                "topics": _topics(rows, bucket, F), "bodySizes": _sizes(rows, F),
                "latencyMillis": _percentiles(rows, "latency", F), "topTags": _top(rows, F.col("tags"), F),
                "topKeys": _top(rows.select(F.explode("keys").alias("key")), F.col("key"), F)}
    finally:
        rows.unpersist()


def _topics(rows, bucket: int, F) -> dict:
    out = {}
    for r in rows.groupBy("topic").agg(F.count("*").alias("n"), F.sum("size").alias("b")).collect():
        out[r["topic"]] = {"messages": r["n"], "bytes": r["b"] or 0, "overTime": [], "queues": {}}
    width = bucket * 1000
    for r in rows.groupBy("topic", (F.floor(F.col("stored") / width) * width).alias("at")).agg(
            F.count("*").alias("n"), F.sum("size").alias("b")).orderBy("topic", "at").collect():
        out[r["topic"]]["overTime"].append({"at": r["at"], "messages": r["n"], "bytes": r["b"] or 0})
    for r in rows.groupBy("topic", "queueId").count().collect():
        out[r["topic"]]["queues"][str(r["queueId"])] = r["count"]
    for topic in out.values():
        counts = list(topic["queues"].values())
        topic["queueSkew"] = round(max(counts) / (sum(counts) / len(counts)), 3)  # busiest / mean
    return out


def _sizes(rows, F) -> dict:
    sizes = _percentiles(rows, "size", F)
    histogram = rows.groupBy(F.when(F.col("size") > 0, F.floor(F.log2("size")) + 1).otherwise(0).alias("bucket")) \
        .count().orderBy("bucket").collect()
    sizes["histogram"] = [{"below": 2 ** int(r["bucket"]), "messages": r["count"]} for r in histogram]
    return sizes


def _percentiles(rows, column: str, F) -> dict:
    row = rows.agg(F.percentile_approx(column, list(PERCENTILES), 10000).alias("p"), F.max(column).alias("max"),
                   F.min(column).alias("min")).first()
    out = {f"p{round(q * 100, 1):g}": v for q, v in zip(PERCENTILES, row["p"] or [])}
    return out | {"min": row["min"], "max": row["max"]}


def _top(rows, column, F) -> list[dict]:
    counted = rows.where(column.isNotNull()).groupBy(column.alias("value")).count()
    return [{"value": r["value"], "messages": r["count"]} for r in counted.orderBy(F.desc("count"), "value").limit(TOP)
            .collect()]


# -- output -------------------------------------------------------------------------------------------


def table(summary: dict) -> str:
    """The printed table: a line a topic, then the percentiles."""
    lines = [f"{'topic':<32} {'messages':>12} {'bytes':>14} {'queue skew':>10}"]
    for name, topic in sorted(summary.get("topics", {}).items()):
        lines.append(f"{name:<32} {topic['messages']:>12,} {topic['bytes']:>14,} {topic['queueSkew']:>10}")
    lines.append(f"{'all':<32} {summary['messages']:>12,} {summary['bytes']:>14,}")
    if summary["messages"]:
        sizes, latency = summary["bodySizes"], summary["latencyMillis"]
        lines.append("body bytes: " + ", ".join(f"{k} {v:,}" for k, v in sizes.items() if k != "histogram"))
        lines.append("born-to-store ms: " + ", ".join(f"{k} {v:,}" for k, v in latency.items()))
        lines.append("top tags: " + ", ".join(f"{t['value']} ({t['messages']:,})" for t in summary["topTags"]))
    return "\n".join(lines)


def write(summary: dict, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    if summary["messages"]:
        _plots(summary, output)
    (output / "report.html").write_text(_html(summary, output))


def _plots(summary: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topics = sorted(summary["topics"].items(), key=lambda item: -item[1]["messages"])[:8]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name, topic in topics:
        first = summary["firstStored"]
        ax.plot([(p["at"] - first) / 1000 for p in topic["overTime"]], [p["messages"] for p in topic["overTime"]],
                label=name, drawstyle="steps-post")
    ax.set(xlabel=f"seconds since the first message ({summary['bucketSeconds']} s buckets)", ylabel="messages",
           title=PLOTS["over_time.png"])
    ax.legend(loc="best", fontsize="small")
    save(fig, output / "over_time.png", plt)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    histogram = summary["bodySizes"]["histogram"]
    ax.bar([str(h["below"]) for h in histogram], [h["messages"] for h in histogram])
    ax.set(xlabel="body bytes below", ylabel="messages", title=PLOTS["body_sizes.png"])
    save(fig, output / "body_sizes.png", plt)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    latency = {k: v for k, v in summary["latencyMillis"].items() if k.startswith("p")}
    ax.bar(list(latency), list(latency.values()))
    ax.set(ylabel="ms", title=PLOTS["latency.png"])
    save(fig, output / "latency.png", plt)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for index, (name, topic) in enumerate(topics):
        queues = sorted(topic["queues"].items(), key=lambda item: int(item[0]))
        ax.bar([f"{name}/{q}" for q, _ in queues], [n for _, n in queues], color=f"C{index}")
    ax.tick_params(axis="x", labelrotation=90, labelsize="x-small")
    ax.set(ylabel="messages", title=PLOTS["queue_skew.png"])
    save(fig, output / "queue_skew.png", plt)


def _html(summary: dict, output: Path) -> str:
    e = html.escape
    images = embedded(output, PLOTS)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>mqnode summary</title>
<style>body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
pre {{ background: #f6f6f6; padding: 1em; }} .grid {{ display: grid; grid-template-columns: 1fr 1fr; gap: 8px; }}
img {{ width: 100%; }} figure {{ margin: 0; }} figcaption {{ color: #666; font-size: 90%; }}</style></head><body>
<h1>mqnode summary</h1><pre>{e(table(summary))}</pre><div class="grid">{images}</div>
<p>The figures are in <code>summary.json</code> beside this page.</p></body></html>
"""
