"""Supervision: a service killed again and again by a bug keeps coming back (with a back-off),
and a node whose service cannot come back exits non-zero with the reason, never alive and deaf.

The policies run on a mock clock; the integration tests start real nodes with a bug injected
into the front (MQNODE_INJECT_BUG: a request code that makes it raise).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import orjson
import psutil
import pytest
import zmq
from helpers import message, open_store, put
from nodes import ROOT, NodeProcess, in_process_node, node_settings

from node import protocol
from node.server.supervision import (
    BURST,
    RESTART_DEADLINE_S,
    Rendezvous,
    RestartBackoff,
    Watch,
    actor_states,
    pid_of,
    record_start,
)
from node.tools.local_node import start_flags

BUG_CODE = 4343


def test_restarts_back_off_after_a_burst_and_start_afresh_after_calm():
    policy = RestartBackoff(max_s=30.0)
    starts: list[float] = []
    delays = []
    now = 1000.0
    for _ in range(12):  # a service that dies as soon as it starts
        delay = policy.delay(starts, now)
        delays.append(delay)
        starts.append(now + delay)
        now += delay + 0.1
    assert delays[:BURST] == [0.0] * BURST
    assert delays[BURST:BURST + 4] == [0.5, 1.0, 2.0, 4.0] and max(delays) == 30.0
    assert policy.delay(starts, now + 61) == 0.0  # up for a minute: a fresh start


def test_start_history_lives_in_the_run_directory(tmp_path):
    clock = iter(range(100)).__next__
    policy = RestartBackoff(max_s=5.0)
    delays = [record_start(tmp_path, "front", policy, clock=lambda: float(clock())) for _ in range(6)]
    assert delays[:BURST] == [0.0] * BURST and all(d > 0 for d in delays[BURST:])
    assert len((tmp_path / "front.starts").read_text().split()) == 6
    (tmp_path / f".front.starts.{os.getpid()}.tmp").symlink_to("/dev/full")  # a full disk (ENOSPC)
    record_start(tmp_path, "front", policy, clock=lambda: 50.0)  # (no error: the service still starts)
    assert len((tmp_path / "front.starts").read_text().split()) == 6  # the history as it was, not emptied


def test_the_watch_names_a_dead_service_and_one_that_never_comes_back():
    now = [0.0]
    watch = Watch(clock=lambda: now[0])
    assert watch.check({"front": {"State": "ALIVE", "NumRestarts": 0}}) is None
    assert watch.check({"front": {"State": "RESTARTING", "NumRestarts": 1}}) is None
    now[0] += RESTART_DEADLINE_S + 1
    assert "has not come back" in watch.check({"front": {"State": "RESTARTING", "NumRestarts": 1}})
    assert watch.check({"front": {"State": "ALIVE", "NumRestarts": 1}}) is None and watch.restarts["front"] == 1
    assert "dead" in watch.check({"dispatcher": {"State": "DEAD", "DeathCause": "boom"}})


@pytest.fixture(scope="module")
def buggy_node(tmp_path_factory):
    os.environ["MQNODE_INJECT_BUG"] = f"front:{BUG_CODE}"  # inherited by the embedded Ray's workers
    try:
        yield from in_process_node(tmp_path_factory.mktemp("buggy"), actorRestartBackoffMaxMillis=100)
    finally:
        os.environ.pop("MQNODE_INJECT_BUG", None)


def _ask(endpoint: str, header: dict, body: bytes | None = None, timeout_ms: int = 3000) -> dict | None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([orjson.dumps(header)] + ([body] if body is not None else []))
        return orjson.loads(sock.recv_multipart()[0]) if sock.poll(timeout_ms) else None
    finally:
        sock.close(0)
        context.term()


def _send_until_stored(endpoint: str, deadline_s: float) -> float:
    began = time.monotonic()
    while time.monotonic() - began < deadline_s:
        reply = _ask(endpoint, {"code": protocol.SEND_MESSAGE, "topic": "Survivor", "queueId": 0}, b"x", 1000)
        if reply is not None and reply["status"] == "PUT_OK":
            return time.monotonic() - began
    raise AssertionError(f"the front did not come back within {deadline_s} s")


@pytest.mark.slow
def test_a_front_killed_by_a_bug_10_times_keeps_coming_back(buggy_node):
    endpoint = buggy_node.settings.listen
    _send_until_stored(endpoint, 10)
    for _ in range(10):  # (past the backoff's 3 starts in 10 s: each later start waits, up to 100 ms here)
        assert _ask(endpoint, {"code": BUG_CODE}, timeout_ms=100) is None  # it died: no reply (NumRestarts below)
        _send_until_stored(endpoint, 30)
    states = actor_states(buggy_node.hosts)
    assert states["front"]["State"] == "ALIVE" and states["front"]["NumRestarts"] >= 10
    assert all(info["State"] == "ALIVE" for info in states.values())


@pytest.mark.slow
def test_a_node_whose_service_cannot_restart_exits_non_zero(tmp_path):
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), actorMaxRestarts=0)
    node = NodeProcess(settings, tmp_path / "node.log")
    os.environ["MQNODE_INJECT_BUG"] = f"front:{BUG_CODE}"
    try:
        node.start()
    finally:
        os.environ.pop("MQNODE_INJECT_BUG", None)
    try:
        assert _ask(settings.listen, {"code": BUG_CODE}, timeout_ms=300) is None
        assert node.process.wait(60) == 1
        log = node.log.read_text()
        assert "mqnode failed: service front is dead" in log and "mqnode stopped" in log, log[-3000:]
    finally:
        node.stop(strict=False)


def test_the_rendezvous_names_a_removed_directory_or_ring_and_not_a_rebound_socket(tmp_path):
    run, rings = tmp_path / "run", tmp_path / "rings"
    run.mkdir()
    rings.mkdir()
    (run / "front").write_bytes(b"")  # (an ipc socket: a service that stops unbinds it, and its restart binds it)
    (rings / "front-to-writer.ring").write_bytes(b"r")
    rendezvous = Rendezvous([run, rings])
    (run / "front").unlink()
    assert rendezvous.lost() is None
    (rings / "front-to-writer.ring").unlink()
    assert "front-to-writer.ring was removed" in rendezvous.lost()
    (rings / "front-to-writer.ring").write_bytes(b"r")
    assert rendezvous.lost() is None
    shutil.rmtree(run)  # (a logout's)
    assert f"{run} was removed" in rendezvous.lost()


@pytest.mark.slow
def test_a_node_whose_run_directory_is_removed_exits_to_be_restarted_whole(tmp_path):
    """A logout removes $XDG_RUNTIME_DIR: the ipc sockets go, and a service restarted after it
    would serve nothing (a pull worker killed then answered no pull). The node exits non-zero."""
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"))
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        shutil.rmtree(settings.run_dir)
        assert node.process.wait(30) == 1
        log = node.log.read_text()
        assert "mqnode failed: " in log and "was removed under the running node" in log, log[-3000:]
    finally:
        node.stop(strict=False)


def test_a_start_out_of_descriptors_says_which_limit_to_raise(tmp_path):
    """A store of more queues than the process may open files: recovery runs out (EMFILE) and
    the start says so, and what to raise, in one `mqnode failed:` line, exit 1 (a traceback
    before); the store is left as it was."""
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), topology="compact")
    store = open_store(settings)
    put(store, [message(i, queues=400) for i in range(400)])
    store.close()
    limited = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300)); "
               "os.execv(sys.executable, [sys.executable, '-m', 'node.tools.cli', 'start', *sys.argv[1:]])")
    done = subprocess.run([sys.executable, "-c", limited, *start_flags(settings)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "mqnode failed: [Errno 24] Too many open files" in done.stderr and "may open 300 files" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    reopened = open_store(settings)  # (nothing lost: every queue's message is there)
    assert sum(queue.offset_max for queue in reopened.consume_queues.values()) == 400
    reopened.close()


@pytest.mark.slow
def test_the_embedded_ray_holds_the_node_s_token_its_memory_and_restart_arguments_and_its_gcs_lost_ends_the_node(
        tmp_path, monkeypatch):
    """Ray's servers listen on every interface and run what a peer sends: the node's embedded
    Ray requires a fresh token that only the node's processes know. Its memory monitor kills no
    service for the host's memory (here told to act at 1 % used, where it killed every service
    as it started and the node never became ready). Recovery's queue offsets reach the write
    service through a file of the run directory: Ray stores an argument past its inline limit
    (100 KiB, ~5,000 queues; here told 4 KiB) and freed it once the actor started, so the
    writer's first restart failed and ended the node; held by the launcher in Ray's object store
    instead, it had Ray log an error at each start that a restart "will fail". And without its GCS nothing
    could restart a service (Ray ended the launcher only after 60 s of reconnecting, serving
    unsupervised meanwhile): the watch looks at the embedded Ray's own processes first, and the
    node says which is gone and exits 1 at once, its store closed cleanly."""
    monkeypatch.delenv("RAY_memory_monitor_refresh_ms", raising=False)
    monkeypatch.setenv("RAY_memory_usage_threshold", "0.01")
    monkeypatch.setenv("RAY_max_direct_call_object_size", "4096")
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), topology="compact")
    store = open_store(settings)  # (queues at start: recovery's offsets are more than 4 KiB)
    put(store, [message(i, queues=400) for i in range(400)])
    store.close()
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        raylet = next(p for p in node.tree() if p.name() == "raylet")
        assert raylet.environ().get("RAY_memory_monitor_refresh_ms") == "0"
        time.sleep(3)  # (Ray frees the arguments it stored soon after the actors started, not at once)
        front = node.actor_process("front")  # (compact: it runs the write service)
        front.kill()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "service front restarted" not in node.log.read_text():
            time.sleep(0.2)
        sent = _ask(settings.listen, {"code": protocol.SEND_MESSAGE, "topic": "TopicA", "queueId": 0,
                                      "bornTimestamp": 1, "flag": 0, "properties": {}}, b"after", timeout_ms=30_000)
        assert sent is not None and sent["status"] == "PUT_OK" and sent["queueOffset"] == 1, node.log.read_text()[-3000:]
        assert list((tmp_path / "run").glob("argument-*.pickle"))  # (the offsets were past the limit)
        assert "constructor arguments in the object store" not in node.log.read_text()
        assert node.process.poll() is None
        gcs = [p for p in node.tree() if p.name() == "gcs_server"]
        assert len(gcs) == 1 and gcs[0].environ().get("RAY_AUTH_MODE") == "token"
        port = next(c.laddr.port for c in gcs[0].net_connections("tcp") if c.status == psutil.CONN_LISTEN)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        # a client of the GCS without the token: refused at its first request (a whole ray.init
        # gets there too, after 20 s of retries)
        intruder = subprocess.run(
            [sys.executable, "-c", f"from ray._raylet import GcsClient; "
                                   f"GcsClient(address='127.0.0.1:{port}').internal_kv_keys(b'', None, timeout=10); "
                                   f"print('connected')"],
            env=env, capture_output=True, text=True, timeout=120, check=False)
        assert intruder.returncode != 0 and "connected" not in intruder.stdout
        assert "InvalidAuthToken" in intruder.stderr, intruder.stderr[-2000:]
        assert _ask(settings.listen, {"code": protocol.GET_MAX_OFFSET, "topic": "T", "queueId": 0})["status"] == "OK"
        assert node.log.read_text().count("restarted") == 1  # (the front's: nothing for memory)
        gcs[0].kill()
        began = time.monotonic()
        assert node.process.wait(60) == 1
        assert time.monotonic() - began < 30
        log = node.log.read_text()
        assert f"mqnode failed: Ray's gcs_server (pid {gcs[0].pid}) exited" in log and "mqnode stopped" in log, log[-3000:]
        assert "or by 'ray stop' on this host, which stops every Ray of its user" in log  # (as `ray stop --force` kills it)
    finally:
        node.stop(strict=False)
    assert not (settings.root / "abort").exists()  # (a clean stop: the next start's recovery is normal)


def test_the_watch_names_only_alive_processes_whose_heartbeat_is_stale():
    watch = Watch()
    states = {"front": {"State": "ALIVE"}, "writer": {"State": "RESTARTING"}, "flush": {"State": "ALIVE"}}
    beats = {"front": 1_000, "writer": 1_000, "flush": 11_500}
    assert watch.hung(states, beats, now_ms=12_000, timeout_ms=10_000) == ["front"]  # restarting is not hung
    assert watch.hung(states, beats, now_ms=12_000, timeout_ms=10_000) == ["front"]
    assert watch.hangs == {"front": 2}  # counted each time it is found


def test_a_pid_file_names_only_the_process_that_wrote_it(tmp_path):
    pid_file = tmp_path / "front.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    assert pid_of(pid_file) == os.getpid()
    later = subprocess.Popen(["sleep", "30"])
    try:
        pid_file.write_text(f"{later.pid}\n")
        os.utime(pid_file, (1, 1))  # written long before that process began: its pid was reused
        assert pid_of(pid_file) is None
    finally:
        later.kill()
        later.wait()
    pid_file.write_text(f"{later.pid}\n")  # a process gone
    assert pid_of(pid_file) is None
    pid_file.unlink()
    assert pid_of(pid_file) is None
