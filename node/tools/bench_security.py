"""scripts/bench-security: what the ACL's signatures and CURVE's encryption cost the write path.

Starts `mqnode start` (compact, ASYNC_FLUSH) three ways on temporary stores, side by side: plaintext and
unsigned, with `aclEnable` (every request signed by the client, checked by the node: an account
that is no admin, with a default topic permission), and with `curveEnable` (a fresh key pair
from `mqnode keygen`). Each runs bench-produce's batch sends (128 a batch, 4 senders) and
concurrent single sends (1024), `--rounds` times, the configurations taking turns; the best
and the median round of each are printed with their share of the plaintext figure. Targets: signed sends cost
<= 15% (>= 85% of plaintext), CURVE batch sends >= 70% of plaintext. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from node.client import aio
from node.tools.bench_produce import Usage, batches, settle, singles
from node.tools.local_node import NodeProcess, local_settings

ACCOUNT = ("benchUser", "benchSecret1234")
ACL = f"""accounts:
  - accessKey: {ACCOUNT[0]}
    secretKey: {ACCOUNT[1]}
    admin: false
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
    topicPerms: [SomeoneElses=DENY]
"""


def configurations(base: Path) -> dict[str, tuple[dict, dict]]:
    """name -> (node settings, client environment)."""
    import zmq.auth

    (base / "plain_acl.yml").write_text(ACL)
    keys = base / "curve"
    keys.mkdir()
    public, secret = zmq.auth.create_certificates(keys, "node")
    return {
        "plaintext": ({}, {}),
        "acl": ({"aclEnable": "true", "aclFile": str(base / "plain_acl.yml")},
                {"MQNODE_ACCESS_KEY": ACCOUNT[0], "MQNODE_SECRET_KEY": ACCOUNT[1]}),
        "curve": ({"curveEnable": "true", "curveSecretKeyFile": secret}, {"MQNODE_SERVER_KEY": public}),
    }


@contextlib.contextmanager
def started(base: Path, configs: dict[str, tuple[dict, dict]]):
    """One node per configuration, all running for the whole benchmark (idle while another is
    measured): the rounds then take turns within seconds of each other, so a machine whose speed
    drifts over minutes weighs on every configuration alike."""
    nodes = {}
    try:
        for name, (settings, _) in configs.items():
            directory = base / f"node-{name}"
            directory.mkdir()
            nodes[name] = NodeProcess(local_settings(directory, flushDiskType="ASYNC_FLUSH", **settings),
                                      directory / "node.log").start(timeout=120)
        yield nodes
    finally:
        for node in nodes.values():
            node.stop(timeout=60, strict=False)


@contextlib.contextmanager
def environment(values: dict):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000, help="messages per figure")
    parser.add_argument("--rounds", type=int, default=4, help="turns of each configuration")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-security-"))
    try:
        configs = configurations(base)
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
        with started(base, configs) as nodes:
            for round_number in range(args.rounds):
                for name, (_, env) in configs.items():
                    _settle(nodes, configs)
                    with environment(env):
                        usage = Usage(nodes[name])
                        batch, batch_sent = aio.run(batches(nodes[name].endpoint, args.count, 128, 4))
                        single, single_sent = aio.run(singles(nodes[name].endpoint, args.count, 1024, "BenchSingle"))
                    figures[name].append((batch, single))
                    print(f"round {round_number + 1} {name:>9}: batch {batch:>9,.0f} msgs/s, "
                          f"singles {single:>9,.0f} msgs/s; {usage.report(batch_sent + single_sent)}", flush=True)
        _summary(figures)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _settle(nodes: dict, configs: dict) -> None:
    """Every node's dispatcher caught up with what the last figure wrote: its catching up would
    take CPU from the next figure, whichever node that is."""
    for name, node in nodes.items():
        with environment(configs[name][1]):
            aio.run(settle(node.endpoint))


def _summary(figures: dict[str, list[tuple[float, float]]]) -> None:
    best = {name: (max(b for b, _ in rounds), max(s for _, s in rounds)) for name, rounds in figures.items()}
    median = {name: (statistics.median(b for b, _ in rounds), statistics.median(s for _, s in rounds))
              for name, rounds in figures.items()}
    for title, table in (("best", best), ("median", median)):
        plain = table["plaintext"]
        print(f"{title} of each (share of plaintext's {title}):")
        for name, (batch, single) in table.items():
            print(f"  {name:>9}: batch {batch:>9,.0f} msgs/s ({batch / plain[0]:.0%}), "
                  f"singles {single:>9,.0f} msgs/s ({single / plain[1]:.0%})")
    print("targets: acl >= 85% of plaintext for both (signing costs <= 15%); curve batch >= 70%")


if __name__ == "__main__":
    main()
