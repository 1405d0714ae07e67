import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_configure(config):
    """Under pytest-xdist (scripts/test), each worker picks its ports (node.tools.local_node.
    free_port) from a block of its own: a port is free when picked but bound seconds later, when
    the node started with it is up, and another worker must not pick it meanwhile. A node also
    binds the ports after its listen port (HA, gRPC): each block ends 16 short of the next."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count <= 1:
        return
    from node.tools import local_node

    ports, index = local_node.LISTEN_PORTS, int(worker[2:])
    span = len(ports) // count
    local_node.LISTEN_PORTS = range(ports.start + index * span, ports.start + (index + 1) * span - 16)


def pytest_addoption(parser):
    parser.addoption("--reverse-order", action="store_true",
                     help="run each module's tests in reverse order: a test leaning on an earlier one fails")


# The modules that use the `spark` fixture: scripts/test runs them in one worker, so that one
# worker starts a Spark JVM (~20-35 s of CPU on this machine's two cores), not both.
SPARK_MODULES = frozenset(f"tests/integration/test_{name}.py" for name in ("archive", "cluster", "offline", "spark", "tiered"))


# Roughly how long each of the slowest units runs (seconds, from a junit report of a whole run):
# scripts/test hands them out first, longest first, so the last units handed out are short and
# the two workers end together (by test count, xdist's order, two of the slowest went last and
# one worker idled ~55 s at the end). A unit not listed goes after them; a wrong figure only
# costs balance.
SLOWEST = {"spark": 375, "tests/integration/test_grpc.py": 260, "tests/integration/test_transactions.py": 162,
           "tests/integration/test_ha.py": 157, "tests/integration/test_loadtest.py": 125,
           "tests/integration/test_node_crash.py": 119, "tests/integration/test_schedule.py": 106,
           "tests/integration/test_pop.py": 99, "tests/integration/test_push.py": 78,
           "tests/integration/test_read_path.py": 68, "tests/integration/test_clean.py": 56,
           "tests/integration/test_supervision.py": 47, "tests/integration/test_ha_acl.py": 47,
           "tests/integration/test_fail_stop.py": 43, "tests/integration/test_grpc_cluster.py": 38,
           "tests/integration/test_hangs.py": 33, "tests/integration/test_security.py": 32,
           "tests/integration/test_bugs.py": 31, "tests/integration/test_node.py": 30}


def pytest_xdist_make_scheduler(config, log):
    """scripts/test's `--dist loadfile`, with the Spark modules one unit: each module's tests run
    in one worker and share its node, and the Spark modules share one worker and its JVM; the
    SLOWEST units go first.
    (pytest-xdist's `--dist loadgroup` would do it with marks, but it renames test ids in a way
    pytest 9.2 no longer sees, and silently hands out each test alone.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkTogether(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return "spark" if module in SPARK_MODULES else module

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # (the first hand-out: the queue is whole) the slowest first
                self.ordered = True
                units = sorted(self.workqueue.items(), key=lambda unit: -SLOWEST.get(unit[0], 0))  # (stable)
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return SparkTogether(config, log)


def pytest_collection_modifyitems(config, items):
    """SPARK_MODULES must name every module using `spark` (one left out starts a JVM of its own).
    With --reverse-order, each module's tests run last to first (modules keep their places, so a
    module still shares its node): the suite's tests must pass in either order."""
    spark = {item.nodeid.split("::")[0] for item in items if "spark" in getattr(item, "fixturenames", ())}
    assert spark <= SPARK_MODULES, f"add {sorted(spark - SPARK_MODULES)} to tests/conftest.py's SPARK_MODULES"
    if not config.getoption("--reverse-order"):
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    items[:] = [item for tests in modules.values() for item in reversed(tests)]
