import os
import sys
from pathlib import Path

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


def pytest_collection_modifyitems(config, items):
    """With --reverse-order, each module's tests run last to first (modules keep their places, so a
    module still shares its node): the suite's tests must pass in either order."""
    if not config.getoption("--reverse-order"):
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    items[:] = [item for tests in modules.values() for item in reversed(tests)]
