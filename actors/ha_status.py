"""`mqnode admin ha` (GET_BROKER_HA_STATUS): the node's replication as one JSON object, from the
control block and what the ha-server and ha-client processes last reported (once a second).

A master: role, epoch, its written offset, and per following slave its brokerId, client
endpoint, acked offset, lag in bytes and ms, bytes sent; the transfer rate. A slave: its
master, the master's offset as last heard, its own, the lag, whether it is connected (and a
divergence that needs a restart to cut).
"""

from __future__ import annotations

from node import protocol
from shm.control_block import ROLE_NAMES


def ha_status(settings, control, actor_stats: dict[str, dict]) -> dict:
    server = actor_stats.get("ha-server", {})
    client = actor_stats.get("ha-client", {})
    role = ROLE_NAMES.get(control.get("role"), "UNKNOWN")
    status = {"role": role, "brokerId": settings.brokerId, "brokerName": settings.brokerName,
              "protocol": settings.haProtocol, "epoch": _epoch(role, server, client),
              "haListen": server.get("listen", protocol.host_port(settings.ha_host, settings.ha_port)),
              "written": control.get("written"), "slaveAcked": control.get("slave_acked"),
              "slavesFollowing": control.get("ha_slaves")}
    if role != "SLAVE":
        status |= {"slaves": server.get("slaves", []), "transferBytesPerSecond": server.get("transferBytesPerSecond", 0),
                   "bound": server.get("bound", False), "bindError": server.get("bindError", ""),
                   "supersededBy": control.superseded()}
    if role == "SLAVE":  # from the control block: its master's end as last heard, its own
        master = control.get("master_offset")
        status |= {"masterOffset": master, "lagBytes": max(0, master - control.get("written"))}
    if client:
        status["follower"] = {key: client.get(key) for key in (
            "master", "masterEndpoint", "following", "connected", "masterOffset", "offset", "written", "lagBytes",
            "lagMs", "receivedBytes", "connects", "linkErrors", "lastError", "diverged")}
    return status


def _epoch(role: str, server: dict, client: dict) -> int:
    """The epoch in force: a slave's as its ha-client adopted it from its master (its ha-server,
    idle on a slave, read the file at its start), a master's as its ha-server began or read it."""
    first, second = (client, server) if role == "SLAVE" else (server, client)
    return first.get("epoch", second.get("epoch", -1))
