"""The layout shows the architecture: which package may import which (no cycles), and a client
that needs nothing of the server."""

from __future__ import annotations

import ast
import subprocess
import sys

from nodes import ROOT

# package -> the packages it may import (besides itself, node.protocol and the standard library)
ALLOWED = {
    "shm": set(),
    "node.client": {"shm"},
    "actors": {"shm", "node.client"},  # (node.client: the gRPC proxy, a client of the front); never the assembly
    "node.server": {"shm", "node.client", "actors"},  # it assembles the services: imports them plainly
    "node.tools": {"shm", "node.client", "node.server", "actors"},
}


def _package(module: str) -> str | None:
    for package in sorted(ALLOWED, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    return None


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_packages_import_only_downward():
    wrong = []
    for path in sorted(ROOT.glob("**/*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in (".venv", "tests", "build"):
            continue
        package = _package(".".join(relative.with_suffix("").parts))
        if package is None:
            continue
        for module in _imports(path):
            target = _package(module)
            if target is not None and target != package and target not in ALLOWED[package]:
                wrong.append(f"{relative} imports {module}")
    assert not wrong, wrong


def test_the_client_imports_nothing_of_the_server():
    code = ("import sys; from node.client import Producer, PullConsumer; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'psutil', 'numpy', 'actors') "
            "or m.startswith(('node.server', 'node.tools'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_server_names_no_service_by_a_module_string():
    """The assembly imports the services it starts plainly, so the import graph shows them (no
    `importlib` by a "module:class" string hiding a cycle)."""
    for path in sorted((ROOT / "node" / "server").glob("*.py")):
        if path.name == "ray_worker.py":  # (Ray's worker program: it loads the third-party packages it defers, by name)
            continue
        assert "import_module" not in path.read_text(), path


# Byte layouts that are not the store's: the internal wire, the HA link's frames, the kernel's PM
# QoS value, the client's message-id generator, the load tester's own payload header.
NOT_STORAGE = {"actors/wire.py", "actors/ha_link.py", "actors/host_tuning.py", "node/client/uniq_keys.py",
               "node/tools/loadtest/payload.py", "node/tools/bench_spark.py"}


def test_only_shm_reads_storage_formats():
    """A byte layout of the store (a record, a ConsumeQueue entry, an index header) is read in
    shm/ only: everywhere else asks shm's functions, so each layout has one definition."""
    found = []
    for path in sorted([*(ROOT / "actors").glob("*.py"), *(ROOT / "node").glob("**/*.py")]):
        relative = str(path.relative_to(ROOT))
        if relative not in NOT_STORAGE and "struct.Struct(" in path.read_text():
            found.append(relative)
    assert found == [], found


def test_the_client_package_names_load_on_use_and_every_one_resolves():
    """`from node.client import Producer` as ever; a part of the client imported alone (the
    gRPC proxy's message) does not load the producers and consumers (node/client/__init__.py)."""
    import pytest

    import importlib

    import node.client as client

    assert {"Producer", "PullConsumer", "PushConsumer", "PopConsumer", "TransactionProducer"} <= set(client.__all__)
    for name in client.__all__:  # each the very object its home module holds
        assert getattr(client, name) is getattr(importlib.import_module(client._HOMES[name]), name), name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        client.Nope  # noqa: B018
    loaded = _loaded("node.client.message")
    assert "node.client.producer" not in loaded and "node.client.consumer" not in loaded


def test_a_service_but_the_grpc_proxy_loads_nothing_of_the_client():
    """The framing a node's processes share with the clients is node.frames, beside
    node.protocol; only the proxy, itself a client of the front, uses the client package."""
    kinds = ("front", "ingress", "writer", "flush", "allocator", "dispatcher", "pull", "clean", "schedule", "pop",
             "transaction", "ha-server", "ha-client", "registrar")
    shells = "; ".join(f"actor_class({kind!r})" for kind in kinds)
    loaded = _loaded("node.server.topology", f"from node.server.topology import actor_class; {shells}")
    assert "actors.front" in loaded and not [m for m in loaded if m.startswith("node.client")], loaded
    assert "node.client.producer" in _loaded("node.server.topology", "node.server.topology.actor_class('proxy')")


def _loaded(module: str, then: str = "None") -> list[str]:
    code = f"import sys, {module}; {then}; print(' '.join(sys.modules))"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          timeout=60).stdout.split()
