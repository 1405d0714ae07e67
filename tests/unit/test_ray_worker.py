"""The embedded Ray's workers defer what `import ray` loads for features a node never uses
(node.server.ray_worker), and get it whole once something does use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
