"""A node's processes keep their heap's pages for the next big buffer (ray_setup.steady_heap)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from nodes import ROOT

# On a thread, as an actor runs: make and free 200 buffers of 140-280 KiB (a pop's answer of up to
# 256 messages is one a turn), and print the minor page faults that took.
CYCLES = """
import resource, sys, threading
from node.server import ray_setup
steady = sys.argv[1] == "steady" and ray_setup.steady_heap()
parts = [bytes([i % 251]) * 1100 for i in range(256)]
out = []
def run():
    b"".join(parts)  # (a first one faults either way)
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for i in range(200):
        data = b"".join(parts[: 128 + i % 128])
        del data
    out.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
thread = threading.Thread(target=run)
thread.start()
thread.join()
print(steady, out[0])
"""


def _faults(mode: str) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", CYCLES, mode], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    steady, faults = done.stdout.split()
    return steady, int(faults)


def test_a_big_buffer_made_again_and_again_faults_its_pages_in_only_once():
    steady, faults = _faults("steady")
    if steady != "True":
        pytest.skip("not glibc: no mallopt")
    _, default = _faults("default")
    if default < 20:
        pytest.skip(f"this C library's default faults only {default} times here: nothing to show")
    assert faults < 20  # the heap kept the pages
