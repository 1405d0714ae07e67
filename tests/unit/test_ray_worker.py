"""The embedded Ray's workers defer what `import ray` loads for features a node never uses
(node.server.ray_worker), and get it whole once something does use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nodes import ROOT

from node.server import ray_worker

IMPORT_RAY = """
import json, sys
from node.server.ray_worker import Deferred, defer
deferred = defer()
import ray
left = sorted(name for name in deferred if isinstance(sys.modules[name], Deferred))
loaded = sorted(name for name in sys.modules if name.partition(".")[0] in deferred and "." in name)
"""

FIRST_USE = IMPORT_RAY + """
import jsonschema, requests
jsonschema.validate({"a": 1}, {"type": "object"})
from ray._private.accelerators import tpu  # (what imported the stand-in keeps it, and reaches the real one through it)
same = tpu.requests.Session is sys.modules["requests"].Session
print(json.dumps([left, loaded, type(sys.modules["jsonschema"]).__name__, type(sys.modules["requests"]).__name__, same]))
"""

SUBMODULE_FIRST = IMPORT_RAY + """
from requests.exceptions import ConnectionError  # (as Ray's local coordinator imports it)
import jsonschema.validators
import requests, jsonschema
print(json.dumps([ConnectionError is requests.ConnectionError,
                  jsonschema.validators.Draft7Validator is jsonschema.Draft7Validator,
                  sys.modules["requests.exceptions"].__spec__.origin.endswith("requests/exceptions.py")]))
"""


def _run(program: str) -> list:
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_import_ray_leaves_the_deferred_packages_unloaded_until_their_first_use():
    left, loaded, jsonschema_after, requests_after, same = _run(FIRST_USE)
    assert left == sorted(ray_worker.DEFERRED) and loaded == []  # (Ray imports each, and uses neither)
    assert jsonschema_after == requests_after == "module" and same


def test_a_submodule_imported_first_is_the_packages_own():
    assert _run(SUBMODULE_FIRST) == [True, True, True]  # (not run twice: its classes are the package's)


def test_the_worker_program_run_is_ray_s_own():
    path = Path(ray_worker.default_worker_path())
    assert path.parts[-4:] == ("ray", "_private", "workers", "default_worker.py")
    assert "main_loop()" in path.read_text()


def test_an_agent_named_first_is_run_in_place_of_the_worker_and_only_one_of_ray_s():
    agent = str(Path(ray_worker.default_worker_path()).parents[2] / "dashboard" / "agent.py")
    argv = ["ray_worker.py", agent, "--node-id=x"]
    assert ray_worker.program_of(argv) == os.path.realpath(agent) and argv == [os.path.realpath(agent), "--node-id=x"]
    worker = ["ray_worker.py", "--node-ip-address=127.0.0.1"]
    assert ray_worker.program_of(worker) == ray_worker.default_worker_path() and len(worker) == 2
    with pytest.raises(AssertionError, match="not one of Ray's programs"):
        ray_worker.program_of(["ray_worker.py", __file__])


def _agent_program(tail: str) -> str:
    return os.path.realpath(Path(ray_worker.default_worker_path()).parents[2] / tail)


def test_the_stand_ins_publish_what_ray_s_agents_do_under_ray_s_names():
    from ray import _raylet

    assert set(ray_worker.QUIET_AGENTS) == {"dashboard/agent.py", "_private/runtime_env/agent/main.py"}
    assert all(Path(_agent_program(tail)).is_file() for tail in ray_worker.QUIET_AGENTS)
    assert set(ray_worker.QUIET_AGENTS["dashboard/agent.py"]) == {
        _raylet.METRICS_AGENT_PORT_NAME, _raylet.METRICS_EXPORT_PORT_NAME, _raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME}
    assert ray_worker.QUIET_AGENTS["_private/runtime_env/agent/main.py"] == (_raylet.RUNTIME_ENV_AGENT_PORT_NAME,)


def test_only_a_minimal_dashboard_agent_and_the_runtime_env_agent_are_stood_in_for():
    dashboard, runtime_env = _agent_program("dashboard/agent.py"), _agent_program("_private/runtime_env/agent/main.py")
    assert ray_worker.quiet_ports(dashboard, ["x", "--minimal", "--head"]) == ray_worker.QUIET_AGENTS["dashboard/agent.py"]
    assert ray_worker.quiet_ports(dashboard, ["x", "--head"]) == ()  # (with Ray's dashboard packages it serves metrics)
    assert ray_worker.quiet_ports(runtime_env, ["x"]) == ("runtime_env_agent_port",)
    assert ray_worker.quiet_ports(ray_worker.default_worker_path(), ["x", "--minimal"]) == ()


def test_a_port_is_published_as_ray_writes_it(tmp_path):
    from ray import _raylet

    node = "ab" * 28  # (a node id as Ray makes them)
    _raylet.persist_port(str(tmp_path), node, "ray_s_port", -1)
    ray_worker.publish([f"--session-dir={tmp_path}", f"--node-id={node}", "--minimal"], ("our_port",))
    assert (tmp_path / f"our_port_{node}").read_bytes() == (tmp_path / f"ray_s_port_{node}").read_bytes() == b"-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"our_port_{node}", f"ray_s_port_{node}"]  # (no part file left)


STAND_IN_PARENT = """
import os, subprocess, sys, time
from pathlib import Path
session = Path(sys.argv[1])
agent = subprocess.Popen([sys.executable, "-u", "node/server/ray_worker.py", sys.argv[2], f"--session-dir={session}",
                          "--node-id=n1"], env={**os.environ, "RAY_RAYLET_PID": str(os.getpid())})
deadline = time.monotonic() + 30
while not (session / "runtime_env_agent_port_n1").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(agent.pid, flush=True)
os._exit(0)  # (a raylet ended at once: no word to its agent)
"""


def test_a_stand_in_publishes_its_ports_and_ends_with_the_raylet(tmp_path):
    runtime_env = _agent_program("_private/runtime_env/agent/main.py")
    done = subprocess.run([sys.executable, "-c", STAND_IN_PARENT, str(tmp_path), runtime_env], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "runtime_env_agent_port_n1").read_text() == "-1"
    agent = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(agent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(agent)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except OSError:
        return False
