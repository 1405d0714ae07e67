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


def test_an_embedded_rays_session_goes_in_the_directory_given_unless_too_long_or_not_ascii(tmp_path):
    """(Ray's core worker takes its sockets' paths as ASCII: a store under /tmp/ünï failed to start)"""
    from pathlib import Path

    assert ray_setup.ray_dir_in(Path("/tmp/run")) == Path("/tmp/run/ray")
    for directory in (Path("/tmp/rün"), tmp_path / ("x" * ray_setup.RAY_DIR_MAX)):
        fallback = ray_setup.ray_dir_in(directory)
        assert fallback.name.startswith("mqnode-ray-") and str(fallback).isascii()
        assert fallback == ray_setup.ray_dir_in(directory) != ray_setup.ray_dir_in(Path("/tmp/rün2"))
