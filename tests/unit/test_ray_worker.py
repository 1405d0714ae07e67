"""The embedded Ray's workers defer what `import ray` loads for features a node never uses
(node.server.ray_worker), and get it whole once something does use it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nodes import ROOT

from node.server import ray_worker

PROBE = """
import importlib.util, json, sys
from node.server.ray_worker import DEFERRED, DeferredImports
sys.meta_path.insert(0, DeferredImports())
import ray
lazy = sorted(name for name in DEFERRED if isinstance(sys.modules.get(name), importlib.util._LazyModule))
import jsonschema
jsonschema.validate({"a": 1}, {"type": "object"})  # (a first use loads it whole)
print(json.dumps([lazy, type(sys.modules["jsonschema"]).__name__]))
"""


def test_import_ray_leaves_the_deferred_modules_unloaded_until_their_first_use():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    lazy, after_use = json.loads(done.stdout)
    assert lazy == sorted(ray_worker.DEFERRED)  # (Ray imports each at its import, and only once)
    assert after_use == "module"


def test_the_worker_program_run_is_ray_s_own():
    path = Path(ray_worker.default_worker_path())
    assert path.parts[-4:] == ("ray", "_private", "workers", "default_worker.py")
    assert "main_loop()" in path.read_text()
