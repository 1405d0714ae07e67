"""Fixtures the integration modules share."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    """One local Spark for the whole run (its JVM takes ~10 s to start), with the mqnode data
    source registered; the modules that use it stop nothing. A failed task is tried again once
    (`local[2,2]`), as a cluster's Spark does (4 attempts by default): a test of a failed job sees
    its task fail twice, and the transactional writes are tested against a retried task here."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from node.pipeline import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    # The tests' JVMs (this one, and the jobs they run as subprocesses) live a minute or two on two
    # cores: C2's compiler threads and the parallel collector cost more CPU than they save there
    # (test_spark and test_offline: the JVM's 87 CPU-s down to 39-46, their wall 136 s to 109-122 s).
    # An operator's long jobs keep the JVM's defaults.
    os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    session = (SparkSession.builder.master("local[2,2]").appName("mqnode-tests")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    register(session)
    yield session
    session.stop()
