"""Spark on mqnode: `register(spark)` makes `spark.read.format("mqnode")`, `spark.readStream`,
`df.write` and `df.writeStream` talk to a node over the wire protocol (docs/protocol.md), and
`spark.read.format("mqnode").option("store", DIR)` read a store directory without a node.

    from node.pipeline import register
    register(spark)
    spark.read.format("mqnode").option("endpoint", "tcp://127.0.0.1:10911").option("topic", "T").load()
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# what the connector's Python workers import (node.pipeline.source and what it needs)
WORKER_IMPORTS = "import pyarrow, orjson, zmq, node.pipeline.source"


class WorkerPythonError(RuntimeError):
    """Spark's Python workers would run an interpreter that cannot import the connector."""


def register(spark) -> None:
    """Register the `mqnode` data source with `spark`. With a local master it first checks that
    the Python Spark's workers run (PYSPARK_PYTHON, else `python3` from PATH: not the interpreter
    that made the session) can import the connector, and says in one line what to set if not:
    otherwise the first query fails inside a task."""
    from node.pipeline.source import MqnodeDataSource

    check_worker_python(spark)

    spark.dataSource.register(MqnodeDataSource)
    # the offline reader narrows each segment's rows by the query's `topic` and `storeTimestamp`
    # filters (Spark evaluates them again); a Python source may take filters only with this on
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


def check_worker_python(spark) -> None:
    """WorkerPythonError naming PYSPARK_PYTHON when a local Spark's workers could not import the
    connector (on a cluster the executors' Python is theirs to check: `spark.pythonExec` names it
    as they run it)."""
    context = spark.sparkContext
    if not context.master.startswith("local"):
        return
    worker = context.pythonExec or "python3"
    found = shutil.which(worker) or worker
    try:
        done = subprocess.run([found, "-c", WORKER_IMPORTS], capture_output=True, text=True, timeout=60)
        ok, why = done.returncode == 0, (done.stderr.strip().splitlines() or [""])[-1]
    except OSError as e:
        ok, why = False, str(e)
    if ok:
        return
    if os.path.realpath(found) != os.path.realpath(sys.executable):
        raise WorkerPythonError(
            f"Spark's Python workers run {worker!r} ({found}), which cannot import the mqnode connector ({why}): "
            f"set PYSPARK_PYTHON={sys.executable} before creating the Spark session")
    raise WorkerPythonError(  # (this interpreter: what differs is the workers' sys.path, which starts at the cwd)
        f"Spark's Python workers ({found}) cannot import the mqnode connector ({why}) in {os.getcwd()}: a file "
        "there may shadow a module; run from another directory, or with PYTHONSAFEPATH=1 (scripts/pipeline sets it)")
