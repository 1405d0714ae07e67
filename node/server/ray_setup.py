"""How a node uses Ray: its processes' priority, the embedded Ray's token, and where a node that
joins a Ray cluster places its processes (node.server.launcher starts them)."""

from __future__ import annotations

import os
import secrets

from shm.settings import SettingsError


def normal_priority() -> None:
    """Ray starts workers at nice 15 (for batch jobs); the node's actors serve requests and must
    not lose the CPU to every other process. Lowering niceness needs privilege: best effort (an
    embedded Ray is started with RAY_worker_niceness=0 anyway)."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass


def embedded_ray_token() -> None:
    """Ray runs whatever code a peer sends it, and its gRPC servers listen on every interface:
    the embedded Ray requires a token (Ray's token authentication), a fresh random one per start
    unless the environment names one, known only to this process and the ones Ray starts."""
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ["RAY_AUTH_MODE"] = "token"


def placement(settings) -> dict:
    """Where a node joining a Ray cluster runs its processes: all on one Ray node, on the host of
    its store (they share its mapped files and ipc sockets). `rayNode` names it by node id or by a
    custom resource only it declares; by default it is the Ray node this process is attached to."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = [node for node in ray.nodes() if node.get("Alive")]
    wanted = settings.rayNode
    if not wanted:
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}
    for node in alive:
        if node.get("NodeID") == wanted:
            return {"scheduling_strategy": NodeAffinitySchedulingStrategy(wanted, soft=False)}
    if any(wanted in (node.get("Resources") or {}) for node in alive):
        return {"resources": {wanted: 0.001}}
    raise SettingsError(f"rayNode: no live Ray node has the id or the resource {wanted!r}")
