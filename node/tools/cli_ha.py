"""`scripts/mqnode admin ha` and `admin role` (node.tools.cli dispatches here): replication's
status as JSON (actors.ha_status), and a slave's promotion."""

from __future__ import annotations

import argparse

from shm.settings import SettingsError


def admin_ha(client, args: argparse.Namespace) -> tuple[dict, dict]:
    from node import protocol

    if args.what == "ha":
        reply, _ = client.request({"code": protocol.GET_BROKER_HA_STATUS})
        return reply, {k: v for k, v in reply.items() if k not in ("code", "opaque", "status")}
    if not args.role:
        raise SettingsError("admin role needs --role ASYNC_MASTER|SYNC_MASTER")
    reply, _ = client.request({"code": protocol.HA_ROLE, "role": args.role})
    return reply, {k: v for k, v in reply.items() if k not in ("code", "opaque", "status")}
