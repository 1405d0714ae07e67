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


def pytest_xdist_make_scheduler(config, log):
    """scripts/test's `--dist loadfile`, with the Spark modules one unit: each module's tests run
    in one worker and share its node, and the Spark modules share one worker and its JVM.
    (pytest-xdist's `--dist loadgroup` would do it with marks, but it renames test ids in a way
    pytest 9.2 no longer sees, and silently hands out each test alone.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return "spark" if module in SPARK_MODULES else module

    return SparkTogether(config, log)


def pytest_collection_modifyitems(config, items):
    """SPARK_MODULES must name every module using `spark` (one left out starts a JVM of its own).
    In each module the tests that share none of its module fixtures (a node they start and kill
    themselves) run first, in their order, then the rest in theirs: a module's shared node starts
    at its first use, and so no longer idles beside theirs (~18 % of a core a node, two for a
    pair), slowing them and the other worker's tests. With --reverse-order, each module's tests
    run last to first (modules keep their places, so a module still shares its node): the suite's
    tests must pass in either order."""
    spark = {item.nodeid.split("::")[0] for item in items if "spark" in getattr(item, "fixturenames", ())}
    assert spark <= SPARK_MODULES, f"add {sorted(spark - SPARK_MODULES)} to tests/conftest.py's SPARK_MODULES"
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    for tests in modules.values():
        tests[:] = [t for t in tests if not _shares(t)] + [t for t in tests if _shares(t)]
    reverse = config.getoption("--reverse-order")
    items[:] = [item for tests in modules.values() for item in (reversed(tests) if reverse else tests)]


def _shares(item) -> bool:
    """Whether the test uses a module fixture (a shared node), or may (it asks `request` for one)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None or "request" in info.argnames:
        return True
    return any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())
