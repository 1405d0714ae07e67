"""The embedded Ray's worker program (`RayParams.worker_path`: node.server.ray_setup.start_head):
Ray's own `default_worker.py`, run after jsonschema is deferred to its first use.

`import ray` loads jsonschema, to validate the schemas of runtime_env plugins, which a node never
has: ~0.06 CPU-s of the ~0.38 that import costs, in every worker a node starts (11 at a lean
start, again at every restart). Deferred, it is a module object that loads itself whole when it
is first touched (importlib.util.LazyLoader), so whatever does use it still gets it. (requests
costs as much, but Ray's own modules import it twice, and a lazy module is loaded by its second
import: the import statement reads its `__spec__`.) Run as a script, before Ray is imported:
nothing of mqnode's is imported here."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys

DEFERRED = frozenset({"jsonschema"})


class DeferredImports(importlib.abc.MetaPathFinder):
    """Finds the DEFERRED top-level modules where the path finder would, with a lazy loader."""

    def find_spec(self, name, path, target=None):
        if name not in DEFERRED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def default_worker_path() -> str:
    """Ray's worker program, found without importing Ray (which would load what is deferred)."""
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.submodule_search_locations, "Ray is installed"
    return f"{list(spec.submodule_search_locations)[0]}/_private/workers/default_worker.py"


if __name__ == "__main__":
    sys.meta_path.insert(0, DeferredImports())
    program = default_worker_path()
    sys.path[0] = os.path.dirname(program)  # as if run itself: node/server's modules are no top-level names
    runpy.run_path(program, run_name="__main__")
