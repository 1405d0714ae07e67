"""The embedded Ray's worker program (`RayParams.worker_path`: node.server.ray_setup.start_head):
Ray's own `default_worker.py`, run after the packages in DEFERRED are deferred to their first use;
and so are the two agents the raylet starts (ray_setup._agents_run_by), each ~0.2 CPU-s lighter.

`import ray` imports requests (to ask a cloud's metadata server about TPUs), jsonschema (to
validate runtime_env plugins' schemas) and yaml (to read node labels from a file), and a node's
workers use none of them (yaml only with an ACL file): loading them is ~0.13 CPU-s of the ~0.45
that `import ray` costs, in every worker a node starts (11 at a lean start, again at every restart;
~1,000 in a run of the test suite).

Deferred, such a package is a stand-in in `sys.modules` before Ray is imported, so every
`import requests` binds it. It has what an import statement reads (`__spec__`: a second import
loads nothing) and loads the real package at the first other attribute asked of it; from then on
the real one is in `sys.modules` and the stand-in passes every attribute on to it. (importlib's
LazyLoader, used here before for jsonschema, loads at any attribute, `__spec__` too: Ray imports
requests twice, and a lazy requests was loaded by the second.) Run as a script, before Ray is
imported: nothing of mqnode's is imported here. `mqnode start`, `namesrv` and `cluster up` call
`defer` too, before their launchers import Ray.

The raylet's two agents serve nothing a node uses, and the embedded Ray runs a quiet stand-in for
each (`stand_in`): the dashboard's agent, in the minimal Ray a node installs (no dashboard
packages: Ray passes it `--minimal`), only publishes that its ports are not served; the runtime
environments' agent builds the environments of `runtime_env` options, and no node, name service
or cluster part passes one (their workers' set-up hook goes by the environment:
ray_setup.workers_set_up). Each started ~0.3 CPU-s and ~1 s of a node's start; the stand-in
publishes the same (-1: Ray's word for a port not served) and waits, importing nothing of Ray. The
raylet still fate-shares with it, and it ends with the raylet. A Ray cluster a node joins runs its
own agents."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import runpy
import sys
import threading
import types

DEFERRED = ("jsonschema", "requests", "yaml")
_LOADING = threading.RLock()  # (a worker's threads may touch a stand-in at once; loading one may touch another)


class Deferred(types.ModuleType):
    """A top-level package's stand-in until the first use of one of its attributes."""

    def __init__(self, spec) -> None:
        super().__init__(spec.name)
        self.__spec__, self.__loader__, self.__file__ = spec, spec.loader, spec.origin

    def __getattr__(self, attribute: str):  # (only what the stand-in lacks: `__path__` too, see Submodules)
        return getattr(self.load(), attribute)

    def load(self) -> types.ModuleType:
        with _LOADING:
            real = self.__dict__.get("_real")
            if real is None:
                if sys.modules.get(self.__name__) is self:
                    del sys.modules[self.__name__]
                real = self.__dict__["_real"] = importlib.import_module(self.__name__)
            return real


class Submodules(importlib.abc.MetaPathFinder):
    """A submodule of a deferred package imported before the package's first use
    (`from requests.exceptions import ...`): the import asks the stand-in for its `__path__`, which
    loads the real package, whose own import may import that very submodule, after the import
    statement looked for it in `sys.modules` and before it looks for where it is. Found here, it is
    the module just made, not run a second time (two of its classes would not be the same)."""

    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] not in DEFERRED or name not in sys.modules:
            return None
        return importlib.util.spec_from_loader(name, _Made(sys.modules[name]))


class _Made(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec  # (the import set this finder's in its place)


def defer(names=DEFERRED) -> list[str]:
    """Puts a stand-in in `sys.modules` for each of `names` installed and not yet imported; the
    names deferred."""
    done = []
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        sys.modules[name] = Deferred(spec)
        done.append(name)
    if done and not any(isinstance(finder, Submodules) for finder in sys.meta_path):
        sys.meta_path.insert(0, Submodules())
    return done


def default_worker_path() -> str:
    """Ray's worker program, found without importing Ray (which would load what is deferred)."""
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.submodule_search_locations, "Ray is installed"
    return f"{list(spec.submodule_search_locations)[0]}/_private/workers/default_worker.py"


def program_of(argv: list[str]) -> str:
    """The Ray program to run: the one named first (one of the agents the raylet starts,
    node.server.ray_setup._agents_run_by), taken off `argv`; else Ray's worker (whose arguments
    are all options). Only Ray's own programs are run here."""
    if len(argv) > 1 and argv[1].endswith(".py"):
        program = os.path.realpath(argv.pop(1))
        home = os.path.realpath(os.path.dirname(os.path.dirname(os.path.dirname(default_worker_path()))))
        assert program.startswith(home + os.sep), f"{program} is not one of Ray's programs"
        argv[0] = program
        return program
    return default_worker_path()


# The ports each agent publishes in the session directory, by Ray's names (ray._raylet's
# *_PORT_NAME: test_ray_worker checks them), for the agents the embedded Ray does without.
QUIET_AGENTS = {
    "dashboard/agent.py": ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port"),
    "_private/runtime_env/agent/main.py": ("runtime_env_agent_port",),
}
NOT_SERVED = -1
PR_SET_PDEATHSIG = 1


def quiet_ports(program: str, argv: list[str]) -> tuple[str, ...]:
    """The ports a stand-in publishes for the agent `program` (with its arguments `argv`), or ()
    when the real agent runs: a dashboard agent that is not minimal serves Ray's metrics."""
    for tail, ports in QUIET_AGENTS.items():
        if program.endswith(os.sep + tail.replace("/", os.sep)):
            return ports if tail != "dashboard/agent.py" or "--minimal" in argv else ()
    return ()


def publish(argv: list[str], ports: tuple[str, ...]) -> None:
    """Each of `ports` as not served, where the raylet waits for it: a file
    `<session dir>/<port name>_<node id>` holding the port (written whole, then renamed in place,
    as the raylet may read it at any moment)."""
    options = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    for name in ports:
        path = os.path.join(options["session-dir"], f"{name}_{options['node-id']}")
        with open(path + ".part", "w") as out:
            out.write(str(NOT_SERVED))
        os.replace(path + ".part", path)


def stand_in(argv: list[str], ports: tuple[str, ...]) -> None:
    """An agent that serves nothing: publishes `ports` and waits until the raylet (its parent)
    ends, or stops it."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if str(os.getppid()) != os.environ.get("RAY_RAYLET_PID", str(os.getppid())):
        sys.exit(1)  # the raylet ended before the line above
    publish(argv, ports)
    while True:
        signal.pause()


if __name__ == "__main__":
    defer()
    program = program_of(sys.argv)
    quiet = quiet_ports(program, sys.argv)
    if quiet:
        stand_in(sys.argv, quiet)
    sys.path[0] = os.path.dirname(program)  # as if run itself: node/server's modules are no top-level names
    runpy.run_path(program, run_name="__main__")
