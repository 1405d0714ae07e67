"""Running a name service: `mqnode namesrv` (alone, on an embedded Ray or a Ray cluster) and the
cluster launcher's (node.server.cluster), both a Ray actor of its own that Ray restarts where
it was (its table's file is there: actors.namesrv).

`NamesrvHost` is that actor: the shell runs in a thread, and the process exits when the shell
dies, so Ray restarts it (as node.server.actor_host.ActorHost does for a node's services).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

from actors.base import write_pid_file
from node.server import preflight, ray_setup
from node.server.signals import StopSignals
from shm.settings import SettingsError
from shm.settings_rules import endpoint_problem

DEFAULT_PORT = 9876
READY_TIMEOUT_S = 30.0


def endpoint_of(address: str) -> str:
    """A name service's ZeroMQ endpoint from RocketMQ's `host:port` (or a `tcp://` / `ipc://` one)."""
    address = address.strip()
    return address if "://" in address else f"tcp://{address}"


class NamesrvHost:
    """The name service in a Ray actor process (see the module's docstring)."""

    def __init__(self, listen: str, directory: str, expiry_ms: int | None = None):
        from actors.namesrv import Namesrv

        ray_setup.normal_priority()
        ray_setup.more_open_files()
        self.service = Namesrv(listen, directory, expiry_ms=expiry_ms)
        Path(directory).mkdir(parents=True, exist_ok=True)
        write_pid_file(Path(directory) / "namesrv.pid")
        self.thread = threading.Thread(target=self._run, name="mqnode-namesrv", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.service.run()
        except BaseException:
            logging.getLogger("mqnode").exception("the name service died")
            os._exit(1)  # Ray restarts the process; its file brings the table back

    def wait_ready(self, timeout: float) -> bool:
        return self.service.ready.wait(timeout)

    def statistics(self) -> dict:
        return self.service.statistics()

    def stop(self, timeout: float) -> bool:
        self.service.stop()
        self.thread.join(timeout)
        return not self.thread.is_alive()


def launch(listen: str, directory: str | Path, *, placement: dict | None = None, name: str | None = None,
           expiry_ms: int | None = None):
    """Start a NamesrvHost under the running Ray (restarted without limit) and wait until it
    serves: its handle. RuntimeError when it does not start."""
    import ray

    options = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": 0, "max_concurrency": 4, **(placement or {})}
    if name:
        options["name"] = name
    handle = ray.remote(NamesrvHost).options(**options).remote(listen, str(directory), expiry_ms)
    if not ray.get(handle.wait_ready.remote(READY_TIMEOUT_S), timeout=READY_TIMEOUT_S + 30):
        raise RuntimeError(f"the name service on {listen} did not start")
    return handle


def stop(handle) -> None:
    import ray

    try:
        ray.get(handle.stop.remote(5.0), timeout=10)
    except Exception:  # a dead or stuck actor: killed below
        pass
    ray.kill(handle, no_restart=True)


def default_directory(listen: str) -> Path:
    port = listen.rpartition(":")[2] if listen.startswith("tcp://") else "ipc"
    return Path.home() / "mqnode" / f"namesrv-{port}"


def run(listen: str, directory: str | None, ray_address: str | None, out=print) -> int:
    """`mqnode namesrv`: serve until SIGINT/SIGTERM/SIGHUP."""
    problem = endpoint_problem(listen)
    if problem:  # (`--listen bad` crashed its actor over and over; port 0 said "ready" on a port none knew)
        raise SettingsError(f"--listen: {problem}")
    directory = (Path(directory).expanduser() if directory else default_directory(listen)).absolute()
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise SettingsError(f"--dir {directory}: {e.strerror}") from None
    # (two on one directory shared its pid file and their embedded Rays' session directory)
    lock = preflight.hold_directory(directory, "directory", "name service", "--dir")
    ray_setup.prepare_embedded(ray_address)
    started = ray_setup.init(ray_address, ray_setup.ray_dir_in(directory), 100 * 1024 * 1024, home=directory)
    handle = launch(listen, directory)
    out(f"mqnode namesrv ready endpoint={listen} dir={directory} pid={os.getpid()}", flush=True)
    stops = StopSignals()
    failure = None
    while not stops.wait(1.0) and failure is None:
        failure = (started and ray_setup.head_lost()) or gone_for_good(handle)
    if failure:
        print(f"mqnode namesrv failed: {failure}", file=sys.stderr, flush=True)
    out("mqnode namesrv stopping", flush=True)
    stop(handle)
    if started:
        ray_setup.shutdown()
    lock.release()
    out("mqnode namesrv stopped", flush=True)
    return 0 if failure is None else 1


def gone_for_good(handle) -> str | None:
    """Why the name service's actor will not come back (its Ray gone, its restarts spent), or
    None while it serves or is being restarted."""
    import ray
    from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError

    try:
        ray.get(handle.statistics.remote(), timeout=10)
    except (ActorUnavailableError, GetTimeoutError):
        return None  # restarting, or busy: asked again in a second
    except ActorDiedError as e:
        return f"its actor died for good ({type(e).__name__})"
    except Exception as e:  # (Ray itself gone)
        return f"Ray is gone ({type(e).__name__}: {e})"
    return None


def wait_serving(endpoint: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Block until a name service answers at `endpoint` (GET_BROKER_CLUSTER_INFO)."""
    from node import protocol
    from node.security import Credentials
    from node.server.asker import NodeAsker

    asker = NodeAsker(endpoint, Credentials(), timeout_ms=1000)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                asker.ask({"code": protocol.GET_BROKER_CLUSTER_INFO})
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
    finally:
        asker.close()


if __name__ == "__main__":  # pragma: no cover - `mqnode namesrv` is the way in
    sys.exit(run(f"tcp://127.0.0.1:{DEFAULT_PORT}", None, None))
