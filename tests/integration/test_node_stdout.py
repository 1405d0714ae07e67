"""`mqnode start`'s stdout carries only the node's own lines: Ray's driver prints its raylet's
"A worker died" there (in colour) when a service process is killed; it reaches the log on stderr
as one line instead (node.server.logs.ForeignLines). And a stop signal while it starts stops it
with its own line too, as `mqnode stop` stops it from another shell; and a service that never
starts ends the start with the node's own line, not a traceback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from nodes import HOST_DISK_BLIND, ROOT, SMALL_STORE, free_port

from node.server import ray_setup
from shm.store_files import last_exit_ok

pytestmark = pytest.mark.slow

SMALL = [word for name, value in (SMALL_STORE | HOST_DISK_BLIND).items() for word in (f"--{name}", str(value))]


def test_a_killed_service_leaves_stdout_to_the_nodes_own_lines(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    port, ha = free_port(), free_port()
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        node = subprocess.Popen([str(ROOT / "scripts" / "mqnode"), "start", "--storePathRootDir", str(tmp_path / "store"),
                                 "--runDir", str(run), "--listen", f"tcp://127.0.0.1:{port}", "--listenPort", str(port),
                                 "--haListenPort", str(ha), *SMALL], stdout=stdout, stderr=stderr)
        try:
            deadline = time.monotonic() + 120
            while b"mqnode ready" not in out.read_bytes():
                assert node.poll() is None and time.monotonic() < deadline, err.read_text()[-2000:]
                time.sleep(0.2)
            os.kill(int((run / "dispatcher.pid").read_text()), signal.SIGKILL)
            deadline = time.monotonic() + 60
            while b"service dispatcher restarted" not in err.read_bytes():
                assert time.monotonic() < deadline, err.read_text()[-2000:]
                time.sleep(0.2)
            time.sleep(2.0)  # (the raylet's message comes on its own thread)
        finally:
            node.send_signal(signal.SIGTERM)
            node.wait(60)
    lines = out.read_text().splitlines()
    assert lines and all(line.startswith("mqnode ") for line in lines), lines
    assert "\x1b[" not in err.read_text()
    # no error line of Ray's own on a sound node's stderr (its core worker's "restart will fail" for
    # each constructor argument in the object store came at every start)
    assert not re.findall(r"^\[[0-9-]+ [0-9:,]+ E \d+ \d+\].*", err.read_text(), re.MULTILINE)


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_while_the_node_starts_stops_it_cleanly(tmp_path, number):
    """A signal once the store is recovered, before the node's Ray is up, stops the node at the
    launcher's first look, once Ray is: as after its start (exit 0, its store closed cleanly, nothing of
    it left running), not with a traceback (SIGINT) or Ray's driver's own exit (SIGTERM, 15)."""
    run, store = tmp_path / "run", tmp_path / "store"
    run.mkdir(mode=0o700)
    port, ha = free_port(), free_port()
    args = [str(ROOT / "scripts" / "mqnode"), "start", "--storePathRootDir", str(store), "--runDir", str(run),
            "--listen", f"tcp://127.0.0.1:{port}", "--listenPort", str(port), "--haListenPort", str(ha),
            "--grpcServerPort", "0", *SMALL]
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        node = subprocess.Popen(args, stdout=stdout, stderr=stderr)
        try:
            deadline = time.monotonic() + 120
            while b"recovery (normal)" not in err.read_bytes():  # (then its Ray starts: seconds from `ready`)
                assert node.poll() is None and time.monotonic() < deadline, err.read_text()[-2000:]
                time.sleep(0.01)
            node.send_signal(number)
            assert node.wait(60) == 0, err.read_text()[-2000:]
        finally:
            if node.poll() is None:
                node.kill()
    lines = out.read_text().splitlines()
    assert lines == [f"mqnode stopped: {signal.Signals(number).name} while starting"], lines
    assert "Traceback" not in err.read_text(), err.read_text()[-2000:]
    assert not [process for process in psutil.process_iter() if _of(process, tmp_path)]  # (its Ray's and services' too)
    with open(tmp_path / "out2.txt", "wb") as stdout:
        node = subprocess.Popen(args, cwd=tmp_path, stdout=stdout, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while b"mqnode ready" not in (tmp_path / "out2.txt").read_bytes():
                assert node.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            assert b"recovery=normal" in (tmp_path / "out2.txt").read_bytes()  # (stopped cleanly, not crashed)
        finally:
            node.send_signal(signal.SIGTERM)
            node.wait(60)


@pytest.mark.parametrize("end", ["time out", "SIGTERM"])
def test_a_service_that_never_starts_ends_the_start_cleanly_and_soon(tmp_path, end):
    """A service stuck in its start (MQNODE_INJECT_BUG `hang-start`: as one still opening, or
    placed on a Ray node without room for it) ends the start with `mqnode failed: ...` and exit 1
    once the start's time is out (8 s here, READY_TIMEOUT_S), or with `mqnode stopped: SIGTERM
    while starting` and exit 0 at a signal, seen within a second; its stop does not wait for the
    stuck service, which is killed with the rest, and nothing of the node is left running."""
    run, store = tmp_path / "run", tmp_path / "store"
    run.mkdir(mode=0o700)
    port, ha = free_port(), free_port()
    code = ("import sys; from node.server import launcher; launcher.READY_TIMEOUT_S = 8; "
            "from node.tools.cli import main; sys.exit(main(sys.argv[1:]))")
    args = [sys.executable, "-c", code, "start", "--storePathRootDir", str(store), "--runDir", str(run),
            "--listen", f"tcp://127.0.0.1:{port}", "--listenPort", str(port), "--haListenPort", str(ha),
            "--grpcServerPort", "0", *SMALL]
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        node = subprocess.Popen(args, cwd=ROOT, env=os.environ | {"MQNODE_INJECT_BUG": "schedule:hang-start"},
                                stdout=stdout, stderr=stderr)
        try:
            if end == "SIGTERM":
                deadline = time.monotonic() + 120
                while not (run / "front.pid").exists():  # (the others start; the schedule service never does)
                    assert node.poll() is None and time.monotonic() < deadline, err.read_text()[-2000:]
                    time.sleep(0.05)
                node.send_signal(signal.SIGTERM)
            began = time.monotonic()
            code = node.wait(90)
            took = time.monotonic() - began
        finally:
            if node.poll() is None:
                node.kill()
    log = err.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert "service schedule did not answer (still starting, restarting or never placed): killed, not stopped" in log
    if end == "SIGTERM":
        assert code == 0 and out.read_text().splitlines() == ["mqnode stopped: SIGTERM while starting"]
        assert took < 30, took  # (before: the start's look at the stuck service blocked 30 s, then a traceback)
    else:
        assert code == 1 and out.read_text() == "", out.read_text()
        assert "mqnode failed: services not started within 8 s: schedule (" in log, log[-3000:]
    assert not [process for process in psutil.process_iter() if _of(process, tmp_path)]


def test_a_terminal_gone_stops_the_node_cleanly(tmp_path):
    """Its stdout's reader goes after the ready line (`mqnode start | head -1`, or a terminal
    closed), then SIGHUP comes (the session's end). The node stops as on SIGTERM (exit 0, its
    store closed cleanly, the log saying why its lines stopped). Before: SIGHUP's default action
    ended the launcher at once; and on SIGTERM the write of `mqnode stopping` raised
    BrokenPipeError, which ended it too (exit 0 all the same). Either way the next start
    recovered the store as after a crash."""
    run, store = tmp_path / "run", tmp_path / "store"
    run.mkdir(mode=0o700)
    port = free_port()
    node = subprocess.Popen([str(ROOT / "scripts" / "mqnode"), "start", "--store", str(store), "--runDir", str(run),
                             "--listen", f"tcp://127.0.0.1:{port}", "--listenPort", str(port), "--haListenPort",
                             str(free_port()), "--grpcServerPort", "0", *SMALL],
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "err.txt", "wb"))
    try:
        assert node.stdout.readline().startswith(b"mqnode ready ")
        node.stdout.close()
        node.send_signal(signal.SIGHUP)
        assert node.wait(60) == 0
    finally:
        if node.poll() is None:
            node.kill()
    assert last_exit_ok(store)
    assert "<stdout> is gone (Broken pipe)" in (tmp_path / "err.txt").read_text()


def test_mqnode_stop_stops_the_node_on_a_store_and_nothing_else(tmp_path):
    """`mqnode stop --store S` finds the node by its store's lock, stops it as SIGTERM does (exit 0,
    its own lines, the store closed cleanly) and says so once it has exited, even while its parent
    has not reaped it yet; it leaves alone a store nobody runs and a lock held by anything else.
    Started with stdin and stderr closed, in a directory of the user's, with relative paths that
    are not ASCII and a file named as a module of Python's own there: the paths are that directory's, and nothing of the node
    imports the file (`python -m` and Ray's workers put the working directory first on sys.path)."""
    store, other, run = tmp_path / "störe", tmp_path / "other", tmp_path / "rün"
    run.mkdir(mode=0o700)
    (tmp_path / "queue.py").write_text("raise SystemExit('the user\'s queue.py was imported')\n")
    port, ha = free_port(), free_port()
    mqnode = str(ROOT / "scripts" / "mqnode")
    args = [mqnode, "start", "--store", "störe", "--runDir", "rün", "--listen", f"tcp://127.0.0.1:{port}",
            "--listenPort", str(port), "--haListenPort", str(ha), "--grpcServerPort", "0", *SMALL]
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from shm.store_files import StoreLock; "
                               f"StoreLock({str(other)!r}).acquire(); print('held', flush=True); time.sleep(120)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    out = tmp_path / "out.txt"
    with open(out, "wb") as stdout:
        node = subprocess.Popen(args, cwd=tmp_path, stdout=stdout, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=_closed_stdin_and_stderr)
        try:
            assert holder.stdout.readline() == "held\n"
            refused = subprocess.run([mqnode, "stop", "--store", str(other)], capture_output=True, text=True, timeout=60)
            assert refused.returncode == 1 and refused.stdout == ""
            assert f"is held by pid {holder.pid}, which is not a `mqnode start`" in refused.stderr, refused.stderr
            assert holder.poll() is None  # (not signalled)
            deadline = time.monotonic() + 120
            while b"mqnode ready" not in out.read_bytes():
                assert node.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            pid = int(re.search(rb" pid=(\d+)", out.read_bytes()).group(1))
            assert f" store={store} " in out.read_text()
            assert {psutil.Process(p).cwd() for p in [pid, int((run / "dispatcher.pid").read_text())]} == {str(run)}
            stopped = subprocess.run([mqnode, "stop", "--store", str(store)], capture_output=True, text=True,
                                     timeout=90)  # (before this test reaps the node: a zombie is stopped too)
            assert stopped.returncode == 0, stopped.stderr
            assert stopped.stdout == f"mqnode stopped pid={pid} store={store}\n"
            assert node.wait(5) == 0
            assert out.read_text().splitlines()[-1] == "mqnode stopped"
            again = subprocess.run([mqnode, "stop", "--store", str(store)], capture_output=True, text=True, timeout=60)
            assert again.returncode == 1 and f"no node runs on {store}" in again.stderr, again.stderr
        finally:
            holder.kill()
            if node.poll() is None:
                node.kill()
    assert last_exit_ok(store)  # (its next start's recovery is a normal one)
    assert not ray_setup.ray_dir_in(run).exists()  # (its embedded Ray's session files: gone at the stop)


def _closed_stdin_and_stderr() -> None:
    """As a supervisor that closes them starts a node (`<&- 2>&-`): before, its start died in Ray's
    without a word (node.tools.cli.standard_streams_open)."""
    os.close(0)
    os.close(2)


def _of(process: psutil.Process, directory) -> bool:
    """Whether `process` is one of a node's under `directory`: its launcher's and Ray's command
    lines name its store or run directory, and a service process maps its store's files."""
    try:
        return (str(directory) in " ".join(process.cmdline())
                or str(directory) in Path(f"/proc/{process.pid}/maps").read_text())
    except (psutil.Error, OSError):
        return False
