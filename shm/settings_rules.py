"""What a setting's value may be: the rules `shm.settings.load` applies after mapping a file.

`validate` refuses, naming the setting, a value mqnode cannot act on: out of range, a
combination that contradicts itself, or a RocketMQ setting mqnode reads but does not implement
(`NOT_IMPLEMENTED`: anything but the default is refused, so nobody believes something happens).
The settings themselves, their defaults and the file format are `shm.settings`'; every name here
is imported from there too.
"""

from __future__ import annotations

import re
from pathlib import Path

from shm import archive_manifest

MAX_PULL_WORKERS = 62  # the control block's watcher slots, less the front's and the pop service's (shm.control_block)
BROKER_PERMISSIONS = (6, 4, 2, 0)  # read and write, read only, write only, neither (RocketMQ's PermName bits)


class SettingsError(ValueError):
    pass


CHOICES = {
    "flushDiskType": ("ASYNC_FLUSH", "SYNC_FLUSH"),
    "brokerRole": ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"),
    "logLevel": ("DEBUG", "INFO", "WARNING", "ERROR"),
    "haProtocol": ("zmq", "rocketmq"),
    "topology": ("compact", "split"),
}

_UNITS = {"s": 1000, "m": 60000, "h": 3600000, "d": 86400000}


def parse_delay_levels(text: str) -> list[int]:
    levels = []
    for item in text.split(" "):
        if not item:
            continue
        try:
            levels.append(int(item[:-1]) * _UNITS[item[-1]])
        except (KeyError, ValueError):
            raise SettingsError(f"messageDelayLevel: {item!r} is not a number followed by s, m, h or d") from None
    return levels


# Settings mqnode reads but does not act on yet: a value other than the default is refused at
# load, naming the setting, so nobody believes something happens. The reason says what will
# implement it (or why it has no meaning here).
NOT_IMPLEMENTED = {
    **dict.fromkeys(["enableScheduleMessageStats", "enableScheduleAsyncDeliver",
                     "scheduleAsyncDeliverMaxPendingLimit", "scheduleAsyncDeliverMaxResendNum2Blocked"], "the schedule service always re-puts asynchronously, in batches, with its own limits"),
    "duplicationEnable": "a slave dispatches everything it has; there is no confirm offset",
    "offsetCheckInSlave": "a slave answers pull offsets as a master does",
    **dict.fromkeys(["mappedFileSizeConsumeQueueExt", "bitMapLengthConsumeQueueExt"],
                    "ConsumeQueueExt is not supported"),
    **dict.fromkeys(["transientStorePoolSize", "fastFailIfNoBufferInStorePool"],
                    "mqnode's write buffer is the segment's own mapping, not a pool of buffers"),
    **dict.fromkeys(["flushCommitLogTimed", "useReentrantLockWhenPutMessage"],
                    "a Java threading choice with no counterpart here"),
    **dict.fromkeys(["flushConsumeQueueLeastPages", "flushConsumeQueueThoroughInterval"],
                    "ConsumeQueue files are derived and rebuilt after a crash; mqnode does not flush them on a timer"),
    "flushLeastPagesWhenWarmMapedFile": "the allocator prefaults pages (prefaultAheadBytes); it does not flush them",
    "defaultQueryMaxNum": "QUERY_MESSAGE is capped by maxMsgsNumBatch",
    "diskFallRecorded": "consumer disk-lag statistics are not kept yet",
    "osPageCacheBusyTimeOutMills": "OS_PAGECACHE_BUSY is not detected yet",
    "waitTimeMillsInPullQueue": "pulls are not queued before they are served",
}


# the least value each of these numbers may take (ms, counts, bytes): below it a node started and
# then spun (a flush interval of -1 crashed its flusher over and over), refused every send
# (maxMessageSize 0), made topics of no queue (defaultTopicQueueNums 0), dropped every member at
# once (clientChannelExpiredTimeout 0) or answered every pull with nothing
LEAST = {
    **dict.fromkeys(["flushIntervalCommitLog", "commitIntervalCommitLog", "flushIntervalConsumeQueue",
                     "syncFlushTimeout", "flushDelayOffsetInterval", "flushConsumerOffsetInterval",
                     "waitTimeMillsInSendQueue", "maxMessageSize", "maxMsgsNumBatch", "defaultTopicQueueNums",
                     "maxTransferBytesOnMessageInMemory", "maxTransferCountOnMessageInMemory",
                     "maxTransferBytesOnMessageInDisk", "maxTransferCountOnMessageInDisk"], 1),
    **dict.fromkeys(["flushCommitLogLeastPages", "flushCommitLogThoroughInterval", "commitCommitLogLeastPages",
                     "commitCommitLogThoroughInterval", "shortPollingTimeMills", "accessMessageInMemoryMaxRatio"], 0),
    **dict.fromkeys(["clientChannelExpiredTimeout", "rebalanceLockMaxLiveTime"], 1000),
    "rayObjectStoreMemory": 78 * 1024 * 1024,  # (Ray's own least)
}
MOST = {"defaultTopicQueueNums": 1024, "accessMessageInMemoryMaxRatio": 100}


def _validate_ranges(settings) -> None:
    for name, least in LEAST.items():
        value, most = getattr(settings, name), MOST.get(name)
        if value < least or (most is not None and value > most):
            bound = f"from {least} to {most}" if most is not None else f"at least {least}"
            raise SettingsError(f"{name} must be {bound}, not {value}")


def validate(settings) -> None:
    defaults = type(settings)()  # (the class's defaults: this module imports no Settings)
    _validate_ranges(settings)
    if settings.topology not in CHOICES["topology"]:
        raise SettingsError(f"topology: {settings.topology!r} is not one of compact, split")
    for name, why in NOT_IMPLEMENTED.items():
        if getattr(settings, name) != getattr(defaults, name):
            raise SettingsError(f"{name} is not implemented by mqnode yet ({why}): remove it or leave it "
                                f"at its default, {render_value(getattr(defaults, name))}")
    _validate_cleaning(settings)
    if settings.brokerPermission not in BROKER_PERMISSIONS:
        raise SettingsError(f"brokerPermission must be one of {', '.join(map(str, BROKER_PERMISSIONS))}, "
                            f"not {settings.brokerPermission}")
    if settings.mappedFileSizeCommitLog < 4096:
        raise SettingsError("mappedFileSizeCommitLog must be at least 4096 bytes")
    if settings.mappedFileSizeConsumeQueue < 20:
        raise SettingsError("mappedFileSizeConsumeQueue must hold at least one 20-byte entry")
    if settings.maxHashSlotNum <= 0 or settings.maxIndexNum <= 1:
        raise SettingsError("maxHashSlotNum must be > 0 and maxIndexNum > 1")
    if settings.enableConsumeQueueExt:
        raise SettingsError("enableConsumeQueueExt=true is not supported by mqnode")
    parse_delay_levels(settings.messageDelayLevel)
    if not 10 <= settings.timerPrecisionMs <= 1000:
        raise SettingsError("timerPrecisionMs must be 10..1000 ms")
    if settings.timerMaxDelaySec < 1 or settings.timerFlushIntervalMs < 1:
        raise SettingsError("timerMaxDelaySec and timerFlushIntervalMs must be >= 1")
    if not 0 <= settings.frontPinBelowCpu < 0.85:
        raise SettingsError("frontPinBelowCpu must be at least 0 and below 0.85 (0 = never pin)")
    if settings.cpuIdleLatencyUs < -1:
        raise SettingsError("cpuIdleLatencyUs must be -1 (no request) or a limit in µs, 0 or more")
    if not 0 <= settings.dispatcherNiceness <= 19:
        raise SettingsError("dispatcherNiceness must be between 0 and 19")
    if settings.dispatcherPollMillis < 1 or settings.dispatcherPollHoldMillis < 0:
        raise SettingsError("dispatcherPollMillis must be >= 1 and dispatcherPollHoldMillis >= 0")
    if settings.processHangTimeoutMillis < 1000:
        raise SettingsError("processHangTimeoutMillis must be at least 1000")
    if settings.actorMaxRestarts < -1 or settings.actorRestartBackoffMaxMillis < 0:
        raise SettingsError("actorMaxRestarts must be -1 (no limit) or more; actorRestartBackoffMaxMillis >= 0")
    if settings.prefaultAheadBytes < 0:
        raise SettingsError("prefaultAheadBytes must be >= 0")
    if settings.ingressWorkers < 0 or settings.pullWorkers < 0 or settings.sendQueueCapacity < 1:
        raise SettingsError("ingressWorkers and pullWorkers must be >= 0, sendQueueCapacity >= 1")
    if settings.topology == "compact" and (settings.ingressWorkers or settings.pullWorkers):
        raise SettingsError("ingressWorkers and pullWorkers scale topology = split (compact encodes and reads in the front)")
    if settings.pullWorkers > MAX_PULL_WORKERS:  # each has a watcher slot in the control block
        raise SettingsError(f"pullWorkers must be at most {MAX_PULL_WORKERS}")
    if not 0 <= settings.metricsPort <= 65535:
        raise SettingsError("metricsPort must be a port, 1..65535, or 0 (off)")
    if not 0 <= settings.grpcServerPort <= 65535:
        raise SettingsError("grpcServerPort must be a port, 1..65535, or 0 (off)")
    if not 1000 <= settings.defaultInvisibleTimeMills <= 12 * 3600_000 or not 1000 <= settings.renewSliceTimeMillis <= 12 * 3600_000:
        raise SettingsError("defaultInvisibleTimeMills and renewSliceTimeMillis must be 1000 ms to 12 h")
    if not 0 < settings.renewAheadTimeMillis < settings.renewSliceTimeMillis or settings.renewMaxTimeMillis < 0:
        raise SettingsError("renewAheadTimeMillis must be above 0 and below renewSliceTimeMillis; renewMaxTimeMillis >= 0")
    if not 0 <= settings.grpcClientConsumerMaxLongPollingTimeoutMillis <= 60_000:
        raise SettingsError("grpcClientConsumerMaxLongPollingTimeoutMillis must be 0 to 60000 ms (the longest wait a receive may name)")
    if settings.transactionTimeOut < 0 or settings.transactionCheckMax < 0 or settings.transactionCheckInterval < 100:
        raise SettingsError("transactionTimeOut and transactionCheckMax must be >= 0, transactionCheckInterval >= 100 ms")
    if bool(settings.grpcTlsCertFile) != bool(settings.grpcTlsKeyFile):
        raise SettingsError("grpcTlsCertFile and grpcTlsKeyFile go together: set both (TLS) or neither (plaintext)")
    problem = endpoint_problem(settings.listen)
    if problem:
        raise SettingsError(f"listen: {problem}")
    _validate_ha(settings)
    _validate_cluster(settings)


def endpoint_problem(endpoint: str) -> str | None:
    """Why `endpoint` is no endpoint to bind (None: it is one): a tcp:// one needs a host and a
    port of 1..65535 (ZeroMQ bound port 0 anywhere, which no client then knew, and from it the
    node's HA and gRPC ports became 1 and 2), an ipc:// one a path."""
    kind, _, rest = endpoint.partition("://")
    if kind == "ipc" and rest:
        return None
    if kind != "tcp":
        return f"{endpoint!r} is not a tcp://HOST:PORT or ipc://PATH endpoint"
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{endpoint!r} needs a host and a port of 1..65535 (tcp://HOST:PORT)"
    return None


def _validate_cluster(settings) -> None:
    for what in ("brokerName", "brokerClusterName"):
        if not re.fullmatch(r"[%|a-zA-Z0-9_.:-]{1,127}", getattr(settings, what)):
            raise SettingsError(f"{what} must be 1-127 characters of [%|a-zA-Z0-9_.:-], not {getattr(settings, what)!r}")
    for address in filter(None, (a.strip() for a in settings.namesrvAddr.split(";"))):
        if "://" not in address and not re.fullmatch(r"\[?[^\s\[\]]+\]?:\d{1,5}", address):
            raise SettingsError(f"namesrvAddr: {address!r} is neither host:port nor a tcp:// or ipc:// endpoint")
    if settings.registerNameServerPeriod < 1000:
        raise SettingsError("registerNameServerPeriod must be at least 1000 ms")


def _validate_ha(settings) -> None:
    if settings.brokerId < 0 or settings.whichBrokerWhenConsumeSlowly < 0:
        raise SettingsError("brokerId and whichBrokerWhenConsumeSlowly must be >= 0")
    if settings.is_slave:
        if settings.brokerId == 0:
            raise SettingsError("brokerRole = SLAVE needs brokerId >= 1 (0 is the master's)")
        host, _, port = settings.haMasterAddress.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingsError(f"brokerRole = SLAVE needs haMasterAddress = host:port, not {settings.haMasterAddress!r}")
    if settings.curveEnable and settings.haProtocol == "rocketmq":
        raise SettingsError("curveEnable needs haProtocol = zmq: RocketMQ's plain-TCP link cannot be encrypted")
    if settings.aclEnable and settings.haProtocol == "rocketmq" and not settings.haAllowUnauthenticated:
        raise SettingsError("aclEnable with haProtocol = rocketmq: RocketMQ's plain-TCP link cannot authenticate a "
                            "slave, so anyone reaching the HA port would get every message; use haProtocol = zmq, "
                            "or set haAllowUnauthenticated = true to accept that (RocketMQ 4.x's behaviour)")
    if not 0 < settings.ha_port < 65536:
        raise SettingsError(f"haListenPort: {settings.ha_port} is not a port")
    if min(settings.haSendHeartbeatInterval, settings.haHousekeepingInterval, settings.haTransferBatchSize,
           settings.haSlaveFallbehindMax, settings.slaveTimeout) < 1:
        raise SettingsError("the ha* intervals, haTransferBatchSize, haSlaveFallbehindMax and slaveTimeout must be >= 1")


def _validate_cleaning(settings) -> None:
    hours = [part.strip() for part in settings.deleteWhen.split(";")]
    if not all(part.isdigit() and 0 <= int(part) <= 23 for part in hours):
        raise SettingsError(f"deleteWhen: {settings.deleteWhen!r} must be hours 00..23 separated by ';'")
    if settings.fileReservedTime <= 0:
        raise SettingsError("fileReservedTime must be > 0 hours")
    if not (0 < settings.diskSpaceCleanForciblyRatio <= 1 and 0 < settings.diskSpaceWarningLevelRatio <= 1):
        raise SettingsError("diskSpaceWarningLevelRatio and diskSpaceCleanForciblyRatio are fractions in (0, 1]")
    if min(settings.cleanResourceInterval, settings.deleteCommitLogFilesInterval,
           settings.deleteConsumeQueueFilesInterval, settings.redeleteHangedFileInterval,
           settings.destroyMapedFileIntervalForcibly) < 0 or settings.cleanResourceInterval < 1:
        raise SettingsError("the cleaning intervals are ms >= 0 (cleanResourceInterval >= 1)")
    tiered = Path(settings.tieredArchiveDir).expanduser() if settings.tieredArchiveDir else None
    if tiered is not None and (why := archive_manifest.unreadable(tiered)):
        raise SettingsError(f"tieredArchiveDir: {why}")


def render_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    return str(value)
