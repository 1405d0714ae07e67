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


# The longest modules, longest first (seconds of one run, 2026-11-30; `scripts/test --junitxml`
# tells a module's sum). scripts/test hands whole modules to two workers in collection order
# (--no-loadscope-reorder): longest first, the last to finish are short ones, and neither worker
# idles while the other runs a three-minute module alone. A module missing here only runs later.
LONGEST_FIRST = ("test_transactions", "test_grpc", "test_spark", "test_ha", "test_node_crash", "test_loadtest",
                 "test_schedule", "test_supervision", "test_pop", "test_cluster", "test_push", "test_read_path",
                 "test_clean", "test_ha_acl", "test_fail_stop", "test_grpc_cluster", "test_hangs", "test_security",
                 "test_bugs", "test_archive", "test_offline", "test_flush_hang", "test_listeners", "test_fuzz")


def pytest_collection_modifyitems(config, items):
    """The longest integration modules first (LONGEST_FIRST), the others after them in their
    order; with --reverse-order, each module's tests run last to first (a module's tests stay
    together, so it still shares its node): the suite's tests must pass in either order."""
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    rank = {f"tests/integration/{name}.py": place for place, name in enumerate(LONGEST_FIRST)}
    ordered = sorted(modules, key=lambda path: rank.get(path, len(rank)))  # (stable: the rest keep their order)
    reverse = config.getoption("--reverse-order")
    items[:] = [item for path in ordered for item in (reversed(modules[path]) if reverse else modules[path])]
