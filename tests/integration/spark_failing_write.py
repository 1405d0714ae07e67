"""A transactional Spark write whose first task attempt fails half-way, in a Spark of its own that
retries a failed task once (`local[2,2]`; the tests' shared session never retries): run by
tests/integration/test_spark.py as `python spark_failing_write.py ENDPOINT TOPIC ROWS`."""

from __future__ import annotations

import os
import sys

from pyspark import TaskContext
from pyspark.sql import SparkSession

from node.pipeline import register


def fail_first_attempt(batches):
    context = TaskContext.get()
    for i, batch in enumerate(batches):
        if i == 1 and context.partitionId() == 0 and context.attemptNumber() == 0:
            raise RuntimeError("the first attempt of task 0 fails after its first batch")
        yield batch


def main() -> None:
    endpoint, topic, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2,2]").appName("mqnode-failing-write")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
             .getOrCreate())
    register(spark)
    frame = spark.range(rows, numPartitions=2).selectExpr("CAST(id AS STRING) AS body")
    schema = frame.schema
    frame = frame.mapInArrow(fail_first_attempt, schema)
    (frame.write.format("mqnode").option("endpoint", endpoint).option("topic", topic)
     .option("transactional", "true").mode("append").save())
    spark.stop()


if __name__ == "__main__":
    main()
