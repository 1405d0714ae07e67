"""`scripts/pipeline`: Spark jobs over a node's topics, each on a local Spark (`local[*]`) unless
`--master` names a cluster.

    count        one JSON line per topic and tag: topic, tags, count, bytes (over an offset or time range),
                 from a node (--endpoint), a store directory without a node (--store) or an archive
    stream-copy  topic -> topic through a SQL transform, from its checkpoint (restart it: it goes on)
    archive      a store's sealed CommitLog segments into a Parquet archive, incremental and idempotent
    summary      what a store or an archive holds: summary.json, PNG plots, report.html, a table
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import orjson

from node.tools.cli import CREDENTIAL_FLAGS, _add_store_options, _settings_from, add_credentials, add_settings_flags
from node.tools import cli_values as values

# count and summary read a store's files as they are: of the store's settings only where its
# CommitLog lives matters to them; they take the same flags as `archive`, `verify` and `dump`
OFFLINE_SETTINGS = ("settings (override --conf; reading a store offline needs only storePathCommitLog, when "
                    "the CommitLog is not under --store: the rest are accepted and change nothing)")


def spark_session(master: str, name: str):
    from pyspark.sql import SparkSession

    from node.pipeline import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(name).config("spark.ui.enabled", "false")
    if master.startswith("local"):  # (SPARK_LOCAL_IP: Spark's start resolves the hostname, and died where it does not)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def _credential_options(args) -> dict[str, str]:
    """accessKey, secretKey, serverKey, clientKey from the flags, else from MQNODE_* variables:
    passed as options, so the executors get them too."""
    options = {}
    for flag, variable, _ in CREDENTIAL_FLAGS:
        value = getattr(args, variable, None) or os.environ.get(variable)
        if value:
            options[CREDENTIAL_OPTIONS[flag]] = value
    return options


CREDENTIAL_OPTIONS = {"--access-key": "accessKey", "--secret-key": "secretKey", "--server-key": "serverKey",
                      "--client-key": "clientKey"}


def _source_options(args) -> dict[str, str]:
    if getattr(args, "store", None):  # a store directory, read without a node
        node_only = [flag for flag, name in (("--starting-offsets", "startingOffsets"), ("--ending-offsets", "endingOffsets"),
                                             ("--subscription", "subscription")) if getattr(args, name, None) is not None]
        if node_only:
            raise SystemExit(f"pipeline: {', '.join(node_only)} read from a node (--endpoint); a store directory is "
                             f"read by --topic and --starting-timestamp / --ending-timestamp")
        options = _store_options(args) | ({"topic": args.topic} if args.topic else {})
    else:
        options = {"endpoint": args.endpoint, "topic": args.topic} | _credential_options(args)
    for name in ("startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp", "subscription"):
        value = getattr(args, name, None)
        if value is not None:
            options[name] = str(value)
    return options


def _store_options(args) -> dict[str, str]:
    """The data source's options for a store directory, with its settings flags (a CommitLog
    elsewhere: storePathCommitLog)."""
    settings = _settings_from(args)
    return {"store": args.store} | ({"storePathCommitLog": settings.storePathCommitLog}
                                    if settings.storePathCommitLog else {})


def cmd_archive(args) -> int:
    """Sealed segments of a store into the Parquet archive (node.pipeline.archive)."""
    from node.pipeline import archive

    settings = _settings_from(args)
    spark = spark_session(args.master, "mqnode-archive")
    try:
        done = archive.run(spark, str(settings.root), args.archive, settings.storePathCommitLog or None)
    except (archive.ArchiveError, FileNotFoundError) as e:
        print(f"pipeline archive: {e}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    sys.stdout.write(orjson.dumps(done).decode() + "\n")
    return 0


def cmd_count(args) -> int:
    from pyspark.sql import functions as F

    if args.endpoint and not args.topic:
        raise SystemExit("pipeline count: --topic is required with --endpoint")
    options = None if args.archive else _source_options(args)  # (its refusals before Spark starts)
    spark = spark_session(args.master, "mqnode-count")
    try:
        if args.archive:
            frame = spark.read.parquet(args.archive)
            if args.topic:
                frame = frame.where(F.col("topic").isin([t.strip() for t in args.topic.split(",")]))
        else:
            frame = spark.read.format("mqnode").options(**options).load()
        for line in counts(frame):
            sys.stdout.write(orjson.dumps(line).decode() + "\n")
    finally:
        spark.stop()
    return 0


def counts(frame) -> list[dict]:
    """`count`'s lines: messages and body bytes per topic and tag, in that order."""
    from pyspark.sql import functions as F

    totals = frame.selectExpr("topic", "tags", "length(body) AS size").groupBy("topic", "tags").agg(
        F.count("*").alias("count"), F.sum("size").alias("bytes"))
    return [{"topic": row["topic"], "tags": row["tags"], "count": row["count"], "bytes": row["bytes"] or 0}
            for row in totals.orderBy("topic", "tags").collect()]


def cmd_summary(args) -> int:
    """What a store directory or an archive holds (node.pipeline.summary): summary.json, plots,
    report.html in --output, and a table on stdout."""
    from pathlib import Path

    from node.pipeline import summary

    spark = spark_session(args.master, "mqnode-summary")
    try:
        if args.archive:
            frame = spark.read.parquet(args.archive)
        else:
            frame = spark.read.format("mqnode").options(**_store_options(args)).load()
        result = summary.compute(frame)
    finally:
        spark.stop()
    summary.write(result, Path(args.output))
    print(summary.table(result))
    print(f"written: {Path(args.output) / 'report.html'}")
    return 0


def cmd_stream_copy(args) -> int:
    if not args.topic:
        raise SystemExit("pipeline stream-copy: --topic is required")
    spark = spark_session(args.master, "mqnode-stream-copy")
    try:
        options = _source_options(args)
        options.setdefault("startingOffsets", "earliest")
        if args.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(args.max_offsets_per_trigger)
        spark.readStream.format("mqnode").options(**options).load().createOrReplaceTempView("source")
        copied = spark.sql(args.sql)
        query = (copied.writeStream.format("mqnode").option("endpoint", args.to_endpoint or args.endpoint)
                 .options(**_credential_options(args))
                 .option("topic", args.to).option("checkpointLocation", args.checkpoint)
                 .trigger(processingTime=f"{args.trigger_ms} milliseconds").start())
        _run(query, args.idle_stop)
    finally:
        spark.stop()
    return 0


def _run(query, idle_stop: float | None) -> None:
    """Until stopped (Ctrl-C), or `idle_stop` seconds with no new rows."""
    last_rows, quiet_since = -1, time.monotonic()
    try:
        while query.isActive:
            time.sleep(0.5)
            progress = query.recentProgress
            rows = sum(p.get("numInputRows", 0) for p in progress) if progress else 0
            if rows != last_rows:
                last_rows, quiet_since = rows, time.monotonic()
                if progress:
                    sys.stdout.write(orjson.dumps({"batch": progress[-1].get("batchId"),
                                                   "inputRows": progress[-1].get("numInputRows")}).decode() + "\n")
                    sys.stdout.flush()
            elif idle_stop is not None and time.monotonic() - quiet_since >= idle_stop:
                break
        if query.exception():
            raise RuntimeError(str(query.exception()))
    except KeyboardInterrupt:
        pass
    finally:
        query.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, handler, help_text in (("count", cmd_count, "messages and bytes per topic and tag"),
                                     ("stream-copy", cmd_stream_copy, "copy a topic into another through SQL")):
        sub = commands.add_parser(name, help=help_text)
        where = sub.add_mutually_exclusive_group(required=True)
        where.add_argument("--endpoint", help="the node, e.g. tcp://127.0.0.1:10911")
        if name == "count":
            where.add_argument("--store", help="a store directory, read without a node (a stopped or running one)")
            where.add_argument("--archive", help="an archive `pipeline archive` wrote")
        add_credentials(sub)
        if name == "count":
            add_settings_flags(sub, OFFLINE_SETTINGS)
        sub.add_argument("--topic", help="a topic, or a comma list (required with --endpoint)")
        sub.add_argument("--master", default="local[*]", help="Spark master (default: a local Spark)")
        sub.add_argument("--subscription", help="a tag expression, e.g. 'TagA || TagB'")
        sub.add_argument("--starting-offsets", dest="startingOffsets", help="earliest, latest or JSON")
        sub.add_argument("--starting-timestamp", dest="startingTimestamp", type=int, help="store time, ms")
        sub.set_defaults(handler=handler)
        if name == "count":
            sub.add_argument("--ending-offsets", dest="endingOffsets", help="earliest, latest or JSON")
            sub.add_argument("--ending-timestamp", dest="endingTimestamp", type=int, help="store time, ms")
        else:
            sub.add_argument("--to", required=True, help="the topic written into")
            sub.add_argument("--to-endpoint", help="the node written to (default: --endpoint)")
            sub.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory: where a restart goes on")
            sub.add_argument("--sql", default="SELECT body, tags FROM source",
                             help="the transform, over the view `source` (the connector's columns)")
            sub.add_argument("--trigger-ms", type=values.COUNT, default=1000, help="a micro-batch every N ms (0: at once)")
            sub.add_argument("--max-offsets-per-trigger", type=values.MOST,  # (0 went uncapped, silently)
                             help="the most messages a micro-batch reads")
            sub.add_argument("--idle-stop", type=values.SECONDS, help="stop after this many seconds with no new rows")
    report = commands.add_parser("summary", help="messages, bytes, sizes, latency, skew, top tags and keys: "
                                                 "summary.json, plots and report.html")
    source = report.add_mutually_exclusive_group(required=True)
    source.add_argument("--store", help="a store directory")
    source.add_argument("--archive", help="an archive `pipeline archive` wrote")
    add_settings_flags(report, OFFLINE_SETTINGS)
    report.add_argument("--output", default="summary", help="where summary.json, the plots and report.html go")
    report.add_argument("--master", default="local[*]", help="Spark master (default: a local Spark)")
    report.set_defaults(handler=cmd_summary)
    archive = commands.add_parser("archive", help="sealed CommitLog segments into a Parquet archive (incremental)")
    _add_store_options(archive)
    archive.add_argument("--archive", required=True, help="the archive directory (created on first use)")
    archive.add_argument("--master", default="local[*]", help="Spark master (default: a local Spark)")
    archive.set_defaults(handler=cmd_archive)
    return parser


def main(argv: list[str] | None = None) -> int:
    from node.pipeline import WorkerPythonError
    from node.pipeline.ranges import PipelineError

    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (WorkerPythonError, PipelineError) as e:  # (what the user can mend: one line, not a traceback)
        print(f"pipeline {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
