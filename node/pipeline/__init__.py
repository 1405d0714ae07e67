"""Spark on mqnode: `register(spark)` makes `spark.read.format("mqnode")`, `spark.readStream`,
`df.write` and `df.writeStream` talk to a node over the wire protocol (docs/protocol.md), and
`spark.read.format("mqnode").option("store", DIR)` read a store directory without a node.

    from node.pipeline import register
    register(spark)
    spark.read.format("mqnode").option("endpoint", "tcp://127.0.0.1:10911").option("topic", "T").load()
"""

from __future__ import annotations


def register(spark) -> None:
    from node.pipeline.source import MqnodeDataSource

    spark.dataSource.register(MqnodeDataSource)
    # the offline reader narrows each segment's rows by the query's `topic` and `storeTimestamp`
    # filters (Spark evaluates them again); a Python source may take filters only with this on
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
