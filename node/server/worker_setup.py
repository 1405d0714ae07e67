"""What every Ray worker of a node runs before its first task: Ray's `worker_process_setup_hook`,
named in the environment of the Ray a node starts (node.server.ray_setup.workers_set_up); the
launcher makes its own serialization context the same way (ray_setup.init). Kept apart and small:
every service process imports it at every start and restart."""

from __future__ import annotations

import sys


def setup() -> None:
    without_arrow_serializers()


def without_arrow_serializers() -> None:
    """Make the worker's serialization context with pyarrow out of reach. Ray registers
    serializers for Ray Data's Arrow tables in every worker's context, importing pyarrow (and
    numpy with it) to do so: ~0.2 CPU-s a process, a sixth of a service process's start, and a
    node starts ~11 of them at each start (and one at each restart). No node passes Arrow data
    through Ray; where pyarrow is not installed, Ray skips those serializers, as it does here.
    Then pyarrow is importable again, for the services that read the Parquet archive
    (tieredArchiveDir). A context Ray makes before the job is known is the job's context later
    (`Worker.get_serialization_context`)."""
    if "pyarrow" in sys.modules:
        return
    import ray

    sys.modules["pyarrow"] = None  # (an import of it raises ModuleNotFoundError)
    try:
        ray._private.worker.global_worker.get_serialization_context()
    except Exception:  # a shortcut that fails leaves Ray to make the context as it would have
        pass
    finally:
        if "pyarrow" in sys.modules and sys.modules["pyarrow"] is None:
            del sys.modules["pyarrow"]
