"""The embedded Ray's head is made through Ray's private API only where it is the one it was
made for (node.server.ray_setup.start_head); elsewhere nothing is started and ray.init starts Ray."""

from __future__ import annotations

import pytest

from node.server import ray_setup


@pytest.mark.parametrize("moved", ["RayParams", "Node"])
def test_a_ray_whose_private_head_api_moved_gets_no_head_and_nothing_started(monkeypatch, moved):
    from ray._private import node, parameter

    def unlike(*args, **kwargs):
        raise TypeError("an unexpected keyword argument 'no_monitor'")

    class NodeOfAnotherRay:
        def __init__(self, ray_params, head):
            raise AssertionError("started")

    if moved == "RayParams":
        monkeypatch.setattr(parameter, "RayParams", unlike)
    else:
        monkeypatch.setattr(node, "Node", NodeOfAnotherRay)
    assert ray_setup.start_head(None, 80 << 20, 2) is None
    assert ray_setup._head is None
