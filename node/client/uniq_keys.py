"""The msgId a client gives each message (its UNIQ_KEY): RocketMQ's MessageClientIDSetter layout,
so ids look and sort as a RocketMQ client's do."""

from __future__ import annotations

import functools
import itertools
import os
import socket as socket_module
import struct
import time

_U16 = struct.Struct(">H")


@functools.cache
def local_ip() -> str:
    """This host's address as its hostname resolves (a RocketMQ client's clientIP), once a process:
    the resolver may take seconds. 127.0.0.1 where the hostname does not resolve (a container's or
    laptop's name in no /etc/hosts or DNS: a PushConsumer could not be made there)."""
    try:
        return socket_module.gethostbyname(socket_module.gethostname())
    except OSError:
        return "127.0.0.1"


class UniqKeys:
    """MessageClientIDSetter: ip(4) pid(2) random(4) | ms since the month began(4) counter(2), hex."""

    def __init__(self):
        ip = socket_module.inet_aton(local_ip())
        self.prefix = (ip + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)).hex().upper()
        self.counter = itertools.count()
        now = time.localtime()
        self.month_start = int(time.mktime((now.tm_year, now.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000)

        self._ms, self._stem = -1, ""

    def next(self, now_ms: int | None = None) -> str:
        """The next key; `now_ms` is the caller's clock reading, when it has one."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if now_ms != self._ms:  # the stem changes once a millisecond, not once a key
            self._ms, self._stem = now_ms, self.prefix + f"{(now_ms - self.month_start) & 0xFFFFFFFF:08X}"
        return self._stem + _U16.pack(next(self.counter) & 0xFFFF).hex().upper()  # beats :04X here

    def next_many(self, count: int) -> list[str]:
        """`count` keys sharing one clock reading (a batch is stamped in the same millisecond)."""
        stem = self.prefix + f"{(int(time.time() * 1000) - self.month_start) & 0xFFFFFFFF:08X}"
        return [f"{stem}{next(self.counter) & 0xFFFF:04X}" for _ in range(count)]
