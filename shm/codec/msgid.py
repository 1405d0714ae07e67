"""Hosts and message ids: RocketMQ's 8- or 20-byte host encoding and the offsetMsgId (store host +
physical offset, in hex) that names a stored record. Pure functions."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from functools import lru_cache

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class Host:
    ip: str
    port: int

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"


@lru_cache(maxsize=4096)
def encode_host(ip: str, port: int) -> bytes:
    """Address bytes in network order, then the port as i32: 8 bytes (IPv4) or 20 (IPv6).
    Cached like decode_host: every msgId of a pull reply goes through here."""
    return ipaddress.ip_address(ip).packed + _I32.pack(port)


@lru_cache(maxsize=4096)
def decode_host(raw: bytes) -> Host:
    """Hosts repeat (one store host, few producers): cached, since ipaddress is slow."""
    return Host(str(ipaddress.ip_address(raw[:-4])), _I32.unpack(raw[-4:])[0])


def offset_msg_id(store_host: Host | bytes, physical_offset: int) -> str:
    """The store ("offset") msgId: store address, port i32, physical offset i64, upper hex."""
    raw = store_host if isinstance(store_host, bytes) else encode_host(store_host.ip, store_host.port)
    return (raw + _I64.pack(physical_offset)).hex().upper()


def decode_msg_id(msg_id: str) -> tuple[Host, int]:
    raw = bytes.fromhex(msg_id)
    return decode_host(raw[:-8]), _I64.unpack(raw[-8:])[0]
