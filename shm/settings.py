"""Every setting of the store and node, with RocketMQ's camelCase names and 4.9 defaults.

This is the one place settings are defined; `conf/broker.toml` is rendered from it
(`python -m shm.settings > conf/broker.toml`, by shm.conf_file; checked by a test) so the two
cannot drift.

Files hold flat `key = value` lines, as RocketMQ's broker.conf: TOML-style (`"quoted"` strings)
and broker.conf-style (`key=value`, bare strings) both parse. Keys a file omits keep their
defaults; a value of the wrong type is an error naming the line, and unknown keys are named all
at once, each with its line and the setting it most looks like (RocketMQ's ignores them: a typo
would pass unseen). What a value
may be once typed (ranges, combinations, what mqnode does not implement) is shm.settings_rules'.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import os
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from shm.cpus import available_cpus
from shm.settings_rules import CHOICES, MAX_PULL_WORKERS, SettingsError, parse_delay_levels, validate

GiB = 1024 * 1024 * 1024


def _s(default, comment: str, group: str):
    return field(default=default, metadata={"comment": comment, "group": group})


STORE = "Storage paths and sizes"
FLUSH = "CommitLog flush and commit"
CQ_FLUSH = "ConsumeQueue flush"
CLEAN = "File cleaning"
LIMITS = "Message limits, recovery and delayed messages"
INDEX = "Message index"
PULL = "Pull and read"
HA = "HA and broker role"
BROKER = "Broker settings that affect store behaviour"
NODE = "mqnode's node: endpoints, actors and Ray"


@dataclass(frozen=True)
class Settings:
    # -- storage paths and sizes
    storePathRootDir: str = _s("~/store", "Store root directory", STORE)
    storePathCommitLog: str = _s("", "CommitLog directory; empty means <storePathRootDir>/commitlog", STORE)
    mappedFileSizeCommitLog: int = _s(1 * GiB, "CommitLog segment size in bytes", STORE)
    mappedFileSizeConsumeQueue: int = _s(300000 * 20, "ConsumeQueue file size (rounded up to a multiple of 20)", STORE)
    enableConsumeQueueExt: bool = _s(False, "Write ConsumeQueueExt units (not supported by mqnode; must stay false)", STORE)
    mappedFileSizeConsumeQueueExt: int = _s(48 * 1024 * 1024, "ConsumeQueueExt file size", STORE)
    bitMapLengthConsumeQueueExt: int = _s(64, "Bits of the ConsumeQueueExt filter bitmap", STORE)
    # -- CommitLog flush and commit
    flushDiskType: str = _s("ASYNC_FLUSH", "ASYNC_FLUSH or SYNC_FLUSH", FLUSH)
    flushIntervalCommitLog: int = _s(500, "Async flush period, ms", FLUSH)
    flushCommitLogTimed: bool = _s(True, "Async flush sleeps a fixed interval instead of a wakeable wait", FLUSH)
    flushCommitLogLeastPages: int = _s(4, "Minimum dirty 4 KiB pages for an async flush", FLUSH)
    flushCommitLogThoroughInterval: int = _s(10000, "Period of a forced full flush, ms", FLUSH)
    commitIntervalCommitLog: int = _s(200, "Write-buffer commit period, ms", FLUSH)
    commitCommitLogLeastPages: int = _s(4, "Minimum pages per write-buffer commit", FLUSH)
    commitCommitLogThoroughInterval: int = _s(200, "Period of a forced full commit, ms", FLUSH)
    syncFlushTimeout: int = _s(5000, "SYNC_FLUSH wait limit, ms (then FLUSH_DISK_TIMEOUT)", FLUSH)
    transientStorePoolEnable: bool = _s(False, "Write buffers in memory, committed to the file (ASYNC_FLUSH, non-slave only)", FLUSH)
    transientStorePoolSize: int = _s(5, "Number of write buffers, each one segment in size", FLUSH)
    fastFailIfNoBufferInStorePool: bool = _s(False, "Limit pre-allocation to the free pool buffers", FLUSH)
    warmMapedFileEnable: bool = _s(False, "Pre-touch every page of a new segment", FLUSH)
    flushLeastPagesWhenWarmMapedFile: int = _s(4096, "Flush step while warming with SYNC_FLUSH, pages", FLUSH)
    useReentrantLockWhenPutMessage: bool = _s(True, "Put lock type (no effect: mqnode has one writer process)", FLUSH)
    # -- ConsumeQueue flush
    flushIntervalConsumeQueue: int = _s(1000, "ConsumeQueue flush period, ms", CQ_FLUSH)
    flushConsumeQueueLeastPages: int = _s(2, "Minimum dirty pages for a ConsumeQueue flush", CQ_FLUSH)
    flushConsumeQueueThoroughInterval: int = _s(60000, "Full ConsumeQueue flush and checkpoint force, ms", CQ_FLUSH)
    # -- file cleaning
    fileReservedTime: float = _s(72.0, "CommitLog retention, hours (a fraction is accepted)", CLEAN)
    deleteWhen: str = _s("04", "Hours (;-separated, local time) when expired files are deleted", CLEAN)
    diskMaxUsedSpaceRatio: int = _s(75, "Disk use (%) above which files are deleted before their time; clamped to [10, 95]", CLEAN)
    cleanResourceInterval: int = _s(10000, "Cleaner period, ms", CLEAN)
    deleteCommitLogFilesInterval: int = _s(100, "Pause between CommitLog deletions, ms", CLEAN)
    deleteConsumeQueueFilesInterval: int = _s(100, "Pause between ConsumeQueue deletions, ms", CLEAN)
    destroyMapedFileIntervalForcibly: int = _s(120000, "Force delete of a still-referenced file after, ms", CLEAN)
    redeleteHangedFileInterval: int = _s(120000, "Retry period for a hanged first file, ms", CLEAN)
    cleanFileForciblyEnable: bool = _s(True, "Ignore file age when the disk is nearly full", CLEAN)
    diskSpaceWarningLevelRatio: float = _s(0.90, "Disk use above which writes are refused (disk full) and cleaning is immediate; taken again at or under diskSpaceCleanForciblyRatio", CLEAN)
    diskSpaceCleanForciblyRatio: float = _s(0.85, "Disk use above which cleaning is immediate", CLEAN)
    tieredArchiveDir: str = _s("", "A Parquet archive of this store (scripts/pipeline archive): pulls below a queue's min offset are served from it, and only segments it holds are deleted; empty: no tiered reads", CLEAN)
    # -- message limits, recovery and delayed messages
    maxMessageSize: int = _s(4 * 1024 * 1024, "Maximum body size in bytes; a record may be 64 KiB larger", LIMITS)
    checkCRCOnRecover: bool = _s(True, "Verify body CRCs during CommitLog recovery", LIMITS)
    messageDelayLevel: str = _s("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h", "Delay levels 1..N", LIMITS)
    flushDelayOffsetInterval: int = _s(10000, "delayOffset.json persist period, ms", LIMITS)
    timerWheelEnable: bool = _s(True, "Accept and deliver timer messages (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS)", LIMITS)
    timerPrecisionMs: int = _s(1000, "Timer precision, ms (10..1000); due times are rounded up to it", LIMITS)
    timerMaxDelaySec: int = _s(259200, "Longest timer, s (3 days); a later one is refused MESSAGE_ILLEGAL", LIMITS)
    timerFlushIntervalMs: int = _s(1000, "Timer log flush and checkpoint period, ms", LIMITS)
    enableScheduleMessageStats: bool = _s(True, "Count schedule deliveries in the broker stats", LIMITS)
    enableScheduleAsyncDeliver: bool = _s(False, "Async re-put of delayed messages", LIMITS)
    scheduleAsyncDeliverMaxPendingLimit: int = _s(2000, "Async pending limit per level", LIMITS)
    scheduleAsyncDeliverMaxResendNum2Blocked: int = _s(3, "Resends before a level blocks", LIMITS)
    # -- message index
    messageIndexEnable: bool = _s(True, "Build IndexFiles", INDEX)
    messageIndexSafe: bool = _s(False, "Abnormal recovery also considers the index checkpoint", INDEX)
    maxHashSlotNum: int = _s(5000000, "Index slots per file", INDEX)
    maxIndexNum: int = _s(20000000, "Index entries per file (one fewer are usable)", INDEX)
    maxMsgsNumBatch: int = _s(64, "Maximum offsets per index query", INDEX)
    defaultQueryMaxNum: int = _s(32, "Default query count", INDEX)
    # -- pull and read
    accessMessageInMemoryMaxRatio: int = _s(40, "Share of RAM (%) treated as hot; drives suggestPullingFromSlave", PULL)
    maxTransferBytesOnMessageInMemory: int = _s(262144, "Pull byte cap for hot data", PULL)
    maxTransferCountOnMessageInMemory: int = _s(32, "Pull message cap for hot data", PULL)
    maxTransferBytesOnMessageInDisk: int = _s(65536, "Pull byte cap for cold data", PULL)
    maxTransferCountOnMessageInDisk: int = _s(8, "Pull message cap for cold data", PULL)
    diskFallRecorded: bool = _s(True, "Record consumer disk-lag stats", PULL)
    offsetCheckInSlave: bool = _s(False, "If false, a slave returns the requested offset as nextBeginOffset on errors", PULL)
    osPageCacheBusyTimeOutMills: int = _s(1000, "Append time that signals OS_PAGECACHE_BUSY, ms", PULL)
    # -- HA and broker role
    brokerRole: str = _s("ASYNC_MASTER", "ASYNC_MASTER, SYNC_MASTER or SLAVE (the role at start; `mqnode admin role` promotes a running slave)", HA)
    brokerId: int = _s(0, "0 for a master, 1 or more for a slave (its id in GET_ROUTEINFO_BY_TOPIC's brokerAddrs)", HA)
    haListenPort: int = _s(10912, "HA port the ha-server binds (the client port + 1 when left at the default)", HA)
    haListenAddress: str = _s("127.0.0.1", "Address the ha-server binds (the host of a tcp `listen` when left at the default)", HA)
    haProtocol: str = _s("zmq", "The HA link: zmq (ZeroMQ, with the epoch handshake that fences a failed-over log) or rocketmq (RocketMQ 4.x's plain-TCP protocol: 8-byte reports, 12-byte headers, no handshake)", HA)
    haSendHeartbeatInterval: int = _s(5000, "HA heartbeat / report period, ms", HA)
    haHousekeepingInterval: int = _s(20000, "Idle HA connection timeout, ms", HA)
    haTransferBatchSize: int = _s(32768, "Maximum bytes per HA transfer", HA)
    haMasterAddress: str = _s("", "A slave's master HA address, host:port", HA)
    haMasterPublicKeyFile: str = _s("", "A slave of a master with curveEnable: the master's public key (its node.key); the link is then CURVE-encrypted, the slave showing its own key pair (curveSecretKeyFile) to the master's allow-list", HA)
    haAccessKey: str = _s("", "A slave of a master with aclEnable: the ACL account it proves to follow (one with admin: true or replication: true in the master's aclFile); empty = MQNODE_ACCESS_KEY", HA)
    haSecretKey: str = _s("", "That account's secret key; empty = MQNODE_SECRET_KEY", HA)
    haAllowUnauthenticated: bool = _s(False, "With aclEnable, let haProtocol = rocketmq serve slaves anyway: RocketMQ 4.x's plain-TCP link carries no signature, so any host that reaches the HA port gets every message (RocketMQ 4.x's own behaviour)", HA)
    haSlaveFallbehindMax: int = _s(268435456, "SYNC_MASTER fails fast with SLAVE_NOT_AVAILABLE beyond this lag, bytes", HA)
    slaveTimeout: int = _s(3000, "SYNC_MASTER replication wait, ms (then FLUSH_SLAVE_TIMEOUT)", HA)
    duplicationEnable: bool = _s(False, "Dispatch only below the confirm offset", HA)
    # -- broker settings that affect store behaviour
    brokerClusterName: str = _s("DefaultCluster", "Cluster name, stored in every record's CLUSTER property", BROKER)
    storeReplyMessageEnable: bool = _s(True, "Store a request's reply (SEND_REPLY_MESSAGE) in its topic, <brokerClusterName>_REPLY_TOPIC, besides pushing it to the requester", BROKER)
    brokerName: str = _s("broker-a", "Broker name: the broker group's (a master and its slaves) in a cluster's routes", BROKER)
    brokerPermission: int = _s(6, "The node's permission (RocketMQ's PermName bits): 6 read and write; 4 read only (the name services route no sends here, sends to order topics are refused); 2 write only (pulls and pops are refused); `mqnode admin config update` changes it while the node runs", BROKER)
    namesrvAddr: str = _s("", "Name services this node registers with, host:port separated by ';' (tcp://host:port too); empty = none", BROKER)
    registerNameServerPeriod: int = _s(30000, "How often the node registers with each name service, ms (and at once when its topics change)", BROKER)
    brokerIP1: str = _s("127.0.0.1", "Address stored as each record's store host", BROKER)
    listenPort: int = _s(10911, "Port stored as each record's store host (and the default listen port)", BROKER)
    longPollingEnable: bool = _s(True, "Hold empty pulls until a message arrives", BROKER)
    shortPollingTimeMills: int = _s(1000, "Hold time and check period without long polling, ms", BROKER)
    brokerFastFailureEnable: bool = _s(True, "Expire queued requests", BROKER)
    waitTimeMillsInSendQueue: int = _s(200, "Send-queue wait limit, ms (then SYSTEM_BUSY)", BROKER)
    waitTimeMillsInPullQueue: int = _s(5000, "Pull-queue wait limit, ms", BROKER)
    slaveReadEnable: bool = _s(False, "Allow redirecting consumers to a slave", BROKER)
    enablePropertyFilter: bool = _s(False, "Serve SQL92 subscriptions (expressionType SQL92: pulls, pops, gRPC filters) by message properties; off, they are refused as RocketMQ refuses them", BROKER)
    whichBrokerWhenConsumeSlowly: int = _s(1, "The brokerId a master suggests to consumers reading data no longer in memory (slaveReadEnable)", BROKER)
    flushConsumerOffsetInterval: int = _s(5000, "consumerOffset.json persist period, ms", BROKER)
    clientChannelExpiredTimeout: int = _s(120000, "A consumer group member silent (no HEART_BEAT) for this long is dropped and its group told, ms", BROKER)
    rebalanceLockMaxLiveTime: int = _s(60000, "An orderly consumer's queue lock not renewed for this long may be taken by another member, ms", BROKER)
    defaultTopicQueueNums: int = _s(8, "Queues of an auto-created topic", BROKER)
    transactionTimeOut: int = _s(6000, "A half message no producer ended is checked once it is this old (CHECK_IMMUNITY_TIME_IN_SECONDS can ask for longer), ms", BROKER)
    transactionCheckMax: int = _s(15, "Checks of one half message before it is discarded into TRANS_CHECK_MAX_TIME_TOPIC", BROKER)
    transactionCheckInterval: int = _s(60000, "How often the transaction service checks the open half messages, ms", BROKER)
    autoCreateTopicEnable: bool = _s(True, "Create a topic on its first send", BROKER)
    # -- mqnode's node
    listen: str = _s("tcp://127.0.0.1:10911", "Client endpoint the front binds (ZeroMQ ROUTER)", NODE)
    ingressWorkers: int = _s(0, "topology = split: encoding processes between the front and the writer; 0 = the writer encodes", NODE)
    pullWorkers: int = _s(0, "topology = split: processes serving reads; 0 = one per CPU the node may use (its affinity and cgroup quota; at most 62)", NODE)
    topology: str = _s("split", "Which process hosts which service (node/server/topology.py, docs/architecture.md): split (the default) = every service a process of its own, handing sends off through rings in shared memory, ingressWorkers and pullWorkers of them for encoding and reads (scales across cores); compact = the front's process also runs the write and read services in its loop and the group commit on a thread, with a dispatcher and an allocator beside it (fewest processes and wake-ups: an operator's choice on one or two cores, docs/performance.md)", NODE)
    frontPinBelowCpu: float = _s(0.0, "While the front's process uses less than this fraction of one CPU (0.7, say), all its threads run on one CPU: local wake-ups, lower ack latency at light load, but slower reads under load; lifted when that CPU is nearly full or contended; 0 = never pin", NODE)
    cpuIdleLatencyUs: int = _s(-1, "Host tuning, an operator's opt-in (docs/operations.md): while the front serves (until 2 s after its last request), it asks the kernel (/dev/cpu_dma_latency, needs root) to keep every idle CPU of the host able to wake within this many µs: 0 = idle CPUs poll instead of halting, so the wake-ups of a request's threads are quick (a virtual machine's halted CPU costs tens of µs each) at the cost of the host's power; -1 = no request (the default)", NODE)
    dispatcherNiceness: int = _s(5, "Nice value of the dispatcher's loop (0-19): on a busy CPU the front and the clients go first and it catches up in larger batches; 0 = normal priority", NODE)
    dispatcherPollMillis: int = _s(1, "While records keep coming, the dispatcher looks at the written end this often and the writer stops waking it", NODE)
    dispatcherPollHoldMillis: int = _s(10, "How long the dispatcher goes on polling after the last record it found, before it waits for the writer's wake-up again (0 = never poll: a wake-up for every writer turn that wrote)", NODE)
    prefaultAheadBytes: int = _s(32 * 1024 * 1024, "The allocator reads the CommitLog's pages this far past the written end, so the writer never takes the page-cache allocation faults (0 = off)", NODE)
    sendQueueCapacity: int = _s(10000, "Send requests the front lets wait before answering SYSTEM_BUSY", NODE)
    metricsPort: int = _s(0, "Port of the Prometheus endpoint /metrics (docs/operations.md \"Metrics\"); 0 = off", NODE)
    metricsAddress: str = _s("127.0.0.1", "Address the metrics endpoint binds", NODE)
    grpcServerPort: int = _s(8081, "Port of the gRPC proxy (RocketMQ 5's apache.rocketmq.v2, for RocketMQ 5 clients in every language; docs/protocol.md \"gRPC\"), bound at the host of a tcp `listen`; 0 = off. Left at 8081 by a node whose `listen` port is not the default, it is that port + 2 (beside the HA port's + 1)", NODE)
    grpcTlsCertFile: str = _s("", "The gRPC proxy serves TLS with this certificate chain (PEM) and grpcTlsKeyFile; empty = plaintext", NODE)
    grpcTlsKeyFile: str = _s("", "The private key (PEM) of grpcTlsCertFile", NODE)
    defaultInvisibleTimeMills: int = _s(60000, "The gRPC proxy: how long a message received by a push consumer (auto_renew), or by a receive that names no invisible duration, stays invisible at first, ms (RocketMQ 5 proxy's setting)", NODE)
    renewAheadTimeMillis: int = _s(10000, "The gRPC proxy renews an auto_renew message's invisible time this long before it runs out, ms", NODE)
    renewSliceTimeMillis: int = _s(60000, "How much invisible time each renewal gives, ms", NODE)
    renewMaxTimeMillis: int = _s(10800000, "How long after it was received a message stops being renewed (then it comes back when its time runs out), ms", NODE)
    grpcClientConsumerMaxLongPollingTimeoutMillis: int = _s(20000, "The gRPC proxy: how long a consumer's settings tell it to long-poll a receive, ms (RocketMQ 5 proxy's setting; a push consumer's shutdown waits out its receive in flight, up to this)", NODE)
    aclEnable: bool = _s(False, "Check every client request against aclFile: RocketMQ's plain ACL, signed requests (docs/operations.md \"Access control\")", NODE)
    aclFile: str = _s("conf/plain_acl.yml", "The ACL's accounts and permissions in RocketMQ's plain_acl.yml format, re-read when it changes (relative: to the directory mqnode start runs in)", NODE)
    curveEnable: bool = _s(False, "Encrypt and authenticate the client endpoint with ZeroMQ CURVE: clients need the node's public key", NODE)
    curveSecretKeyFile: str = _s("conf/curve/node.key_secret", "The node's CURVE key pair (scripts/mqnode keygen writes it)", NODE)
    curveClientKeysDir: str = _s("", "With curveEnable: only clients whose public key has a certificate (*.key) in this directory connect; empty = any client with the node's key", NODE)
    actorMaxRestarts: int = _s(-1, "Times Ray restarts a dead service process; -1 = no limit (restarts back off instead). When a service cannot be restarted, the node exits non-zero", NODE)
    actorRestartBackoffMaxMillis: int = _s(30000, "A service that keeps dying (more than 3 starts in 10 s) waits before each restart, doubling from 0.5 s up to this; it starts afresh after 60 s up", NODE)
    processHangTimeoutMillis: int = _s(10000, "A service process whose loop has not turned for this long (a deadlock, SIGSTOP, a disk that never returns) is killed with SIGKILL, and Ray restarts it", NODE)
    rayNode: str = _s("", "With --ray-address (a Ray cluster): the Ray node that hosts this node's processes, by node id (hex) or by a custom resource that node declares (ray start --resources); empty = the Ray node of the host mqnode start runs on. The store must be on that node's host", NODE)
    rayObjectStoreMemory: int = _s(80 * 1024 * 1024, "Object store of an embedded Ray, bytes (nothing large goes through it)", NODE)
    logLevel: str = _s("INFO", "The node's log (on the launcher's stderr, one line an event from every service): DEBUG, INFO, WARNING or ERROR", NODE)
    logDir: str = _s("", "With a directory: every process of the node also appends its log lines to <logDir>/<process>.log, rotated at 64 MiB (5 kept); empty = stderr only", NODE)
    runDir: str = _s("", "Directory for the node's ipc sockets and pid files, private to the node's user (mode 0700; refused if another user owns it or others may enter it); empty means $XDG_RUNTIME_DIR/mqnode-<hash of the store path> when XDG_RUNTIME_DIR is set, else run/ inside the store", NODE)

    # -- derived ------------------------------------------------------------------------------

    @property
    def is_slave(self) -> bool:
        return self.brokerRole == "SLAVE"

    @property
    def pull_processes(self) -> int:
        """topology = split: the pull workers, `pullWorkers` or one per CPU the node may use (at
        most MAX_PULL_WORKERS); compact reads in the front's process, so none."""
        if self.topology != "split":
            return 0
        return self.pullWorkers or min(available_cpus(), MAX_PULL_WORKERS)

    @property
    def commitlog_headroom(self) -> int:
        """Bytes a new CommitLog segment must leave free on its disk (the writer's, the allocator's
        and a slave's ha-client's): the reput's room to give the oldest segment's records their
        ConsumeQueue and index entries. Half a segment (a record's entries are 40 bytes, a fifth
        of a 200-byte record, and files are taken whole: a ConsumeQueue file a queue, an index
        file at a time), and at least a new index file and a ConsumeQueue file. Without it a log
        that filled its disk could leave the reput no room to finish the oldest segment, and the
        clean service, which deletes only segments dispatched whole, nothing to delete: each
        waited on the other until a restart (a slave catching up on a small disk, under load)."""
        return self.headroom_for(self.mappedFileSizeCommitLog)

    def headroom_for(self, segment: int) -> int:
        """commitlog_headroom, were the segments `segment` bytes."""
        return max(segment // 2, self.index_file_bytes + self.mappedFileSizeConsumeQueue)

    @property
    def index_file_bytes(self) -> int:
        """One index file's size (shm.index_file.index_file_size), 0 without the index."""
        return 40 + self.maxHashSlotNum * 4 + self.maxIndexNum * 20 if self.messageIndexEnable else 0

    @property
    def ha_port(self) -> int:
        """The ha-server's port: haListenPort, or the client port + 1 when left at its default
        (RocketMQ's rule, applied to mqnode's `listen`)."""
        if self.haListenPort != _DEFAULT_HA_PORT:
            return self.haListenPort
        return self.store_address[1] + 1

    @property
    def grpc_port(self) -> int:
        """The gRPC proxy's port (0: off): grpcServerPort, or the client port + 2 when it is left
        at 8081 and `listen` is not on the default port (so two nodes of one host do not collide,
        as `ha_port` follows the client port)."""
        port = self.store_address[1]
        if self.grpcServerPort != _DEFAULT_GRPC_PORT or port == _DEFAULT_LISTEN_PORT:
            return self.grpcServerPort
        return port + 2

    @property
    def listen_host(self) -> str:
        """The host of a tcp `listen`, where the node serves clients (127.0.0.1 for ipc); ZeroMQ's
        wildcard `*` as the address it binds, 0.0.0.0, which the gRPC proxy and a RocketMQ HA
        listener bind too (given `*` they failed: "Name or service not known")."""
        host, _ = self._tcp_listen or ("127.0.0.1", "")
        return "0.0.0.0" if host == "*" else host or "127.0.0.1"

    @property
    def grpc_host(self) -> str:
        """The address the gRPC proxy binds: `listen_host`."""
        return self.listen_host

    @property
    def ha_host(self) -> str:
        """The address the ha-server binds: haListenAddress, or, left at its default (loopback),
        the host of a tcp `listen` (as `ha_port` follows its port): a node that serves clients
        of other hosts serves its slaves there too, and so does a slave once promoted (its old
        master, on another host, comes back as its slave). An ipc `listen` keeps loopback."""
        return self.haListenAddress if self.haListenAddress != _DEFAULT_BROKER_IP else self.listen_host

    @property
    def ha_master(self) -> tuple[str, int]:
        """A slave's master HA address, `haMasterAddress` as host:port."""
        host, _, port = self.haMasterAddress.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def root(self) -> Path:
        return Path(os.path.expanduser(self.storePathRootDir))

    @property
    def commitlog_dir(self) -> Path:
        return Path(os.path.expanduser(self.storePathCommitLog)) if self.storePathCommitLog else self.root / "commitlog"

    @property
    def consumequeue_dir(self) -> Path:
        return self.root / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.root / "index"

    @property
    def sync_flush(self) -> bool:
        return self.flushDiskType == "SYNC_FLUSH"

    @property
    def run_dir(self) -> Path:
        """The node's ipc sockets and pid files: `runDir`, else a directory under
        `$XDG_RUNTIME_DIR` (the user's private runtime directory), else `run/` inside the store.
        The launcher makes it private (node.server.preflight.prepare_run_dir)."""
        if self.runDir:
            return Path(os.path.expanduser(self.runDir))
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if runtime:
            digest = hashlib.sha1(str(self.root.resolve()).encode()).hexdigest()[:12]
            return Path(runtime) / f"mqnode-{digest}"
        return self.root / "run"

    @property
    def store_address(self) -> tuple[str, int]:
        """The address stored as each record's store host and encoded in every offsetMsgId: where
        clients reach this node (RocketMQ: brokerIP1:listenPort). A brokerIP1 or listenPort left at
        its default follows the host and port of a tcp `listen` (a wildcard host keeps
        brokerIP1: set it to the address clients use)."""
        host, port = self.brokerIP1, self.listenPort
        if self._tcp_listen:
            listen_host, listen_port = self._tcp_listen
            if port == _DEFAULT_LISTEN_PORT and listen_port.isdigit():
                port = int(listen_port)
            if host == _DEFAULT_BROKER_IP and _is_address(listen_host) and listen_host not in ("0.0.0.0", "::"):
                host = listen_host
        return host, port

    def advertised(self, host: str) -> str:
        """The host others are told for a listener bound at `host`: a wildcard's (0.0.0.0, ::) is
        the store host's, `store_address`, as RocketMQ registers brokerIP1 (a client told 0.0.0.0
        reached its own host)."""
        return self.store_address[0] if host in WILDCARD_HOSTS else host

    @property
    def client_endpoint(self) -> str:
        """`listen` as clients are told it (a route's brokerAddrs, the HA link's hello and
        welcome, the name service's registration): its host `advertised`."""
        if not self._tcp_listen:
            return self.listen
        bound, port = self._tcp_listen
        host = self.advertised(bound)
        return self.listen if host == bound else _tcp_endpoint(host, port)

    @property
    def local_endpoint(self) -> str:
        """`listen` as the node's own processes reach it (its launcher's and the metrics' asks, the
        gRPC proxy's link): a wildcard's as loopback. ZeroMQ connects to no `*` (its own wildcard,
        which a launcher given `tcp://*:P` asked of, failing its start)."""
        if not self._tcp_listen or self._tcp_listen[0] not in WILDCARD_HOSTS:
            return self.listen
        bound, port = self._tcp_listen
        return _tcp_endpoint("::1" if bound == "::" else "127.0.0.1", port)

    @property
    def _tcp_listen(self) -> tuple[str, str] | None:
        """A tcp `listen`'s host (an IPv6 one without its brackets) and port, as written; None
        for ipc."""
        if not self.listen.startswith("tcp://"):
            return None
        host, _, port = self.listen[len("tcp://"):].rpartition(":")
        return host.strip("[]"), port

    def delay_levels_ms(self) -> list[int]:
        return parse_delay_levels(self.messageDelayLevel)


def _tcp_endpoint(host: str, port) -> str:
    """(node.protocol.tcp_endpoint's rule: this storage layer imports nothing of the client's)"""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


_DEFAULT_LISTEN_PORT, _DEFAULT_HA_PORT, _DEFAULT_BROKER_IP = 10911, 10912, "127.0.0.1"
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "*", "")  # a listener's host that is every interface, none to reach
_DEFAULT_GRPC_PORT = 8081


def _is_address(text: str) -> bool:
    try:
        return bool(ipaddress.ip_address(text))
    except ValueError:
        return False


FIELDS = {f.name: f for f in fields(Settings)}
# settings that chose process placement one flag at a time, replaced by `topology`
REPLACED_BY_TOPOLOGY = ("writesInFront", "flushInFront", "readsInFront")


def _replaced(name: str) -> SettingsError:
    return SettingsError(f"{name} is gone: set topology = compact (the front writes, flushes and serves reads) "
                         f"or topology = split (a process for each service)")


class UnknownSetting(SettingsError):
    """A key no setting has: named with the setting it most looks like (a typo, or a RocketMQ
    release's older spelling: 4.x's `mapedFileSizeCommitLog`)."""

    def __init__(self, name: str):
        close = difflib.get_close_matches(name, FIELDS, n=1, cutoff=0.8)
        super().__init__(f"unknown setting {name!r}" + (f" (did you mean {close[0]}?)" if close else ""))


def coerce(name: str, raw: str) -> object:
    """Turn the text of a value into the setting's type, or raise SettingsError."""
    if name in REPLACED_BY_TOPOLOGY:
        raise _replaced(name)
    if name not in FIELDS:
        raise UnknownSetting(name)
    kind = type(FIELDS[name].default)
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    try:
        if kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError
            value: object = text.lower() == "true"
        elif kind is int:
            value = int(text.replace("_", ""))
        elif kind is float:
            value = float(text)
        else:
            value = text
    except ValueError:
        raise SettingsError(f"{name}: {raw.strip()!r} is not a {kind.__name__}") from None
    if name in CHOICES and value not in CHOICES[name]:
        raise SettingsError(f"{name}: {value!r} is not one of {', '.join(CHOICES[name])}")
    return value


def parse_conf(text: str, origin: str = "<conf>") -> dict[str, object]:
    """The file's settings. Its unknown keys are named all at once, a line each (a RocketMQ
    broker.conf brought over named them one start at a time); any other error is the first."""
    values: dict[str, object] = {}
    unknown: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = _strip_comment(line).strip()
        if not stripped or stripped.startswith("["):
            continue
        name, separator, raw = stripped.partition("=")
        if not separator:
            raise SettingsError(f"{origin}:{number}: expected key = value, got {line.strip()!r}")
        try:
            values[name.strip()] = coerce(name.strip(), raw)
        except UnknownSetting as e:
            unknown.append(f"{origin}:{number}: {e}")
        except SettingsError as e:
            raise SettingsError(f"{origin}:{number}: {e}") from None
    if unknown:
        raise SettingsError("\n".join(unknown))
    return values


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if ch in "\"'":
            quote = None if quote == ch else (quote or ch)
        elif ch == "#" and quote is None:
            return line[:i]
    return line


# The settings naming a file or a directory of the host the node runs on.
PATH_SETTINGS = ("storePathRootDir", "storePathCommitLog", "tieredArchiveDir", "haMasterPublicKeyFile", "aclFile",
                 "curveSecretKeyFile", "curveClientKeysDir", "grpcTlsCertFile", "grpcTlsKeyFile", "logDir", "runDir")


def absolute_paths(settings: Settings) -> Settings:
    """`settings` with its paths (PATH_SETTINGS and an ipc:// `listen`) absolute, `~` expanded:
    relative ones are taken from the working directory `mqnode start` runs in, once, since no
    process of the node works there (Ray refuses a relative session directory, and a node's
    processes run in its run directory: node.server.ray_setup.init)."""
    paths = {name: absolute_path(value) for name in PATH_SETTINGS if (value := getattr(settings, name))}
    if settings.listen.startswith("ipc://") and not settings.listen.startswith("ipc://@"):  # (@: Linux's abstract names)
        paths["listen"] = "ipc://" + absolute_path(settings.listen.removeprefix("ipc://"))
    return replace(settings, **paths)


def absolute_path(text: str) -> str:
    """A path setting's value, `~` expanded, relative to the working directory made absolute."""
    return os.path.abspath(os.path.expanduser(text))


def load(conf: str | Path | None = None, overrides: dict[str, object] | None = None) -> Settings:
    """Defaults, then the file's keys, then explicit overrides (already typed or text)."""
    values: dict[str, object] = {}
    if conf is not None:
        path = Path(conf)
        try:
            values.update(parse_conf(path.read_text(encoding="utf-8-sig"), str(path)))  # (-sig: a BOM a Windows editor wrote)
        except OSError as e:
            raise SettingsError(f"cannot read {path}: {e.strerror}") from None
    for name, value in (overrides or {}).items():
        if name in REPLACED_BY_TOPOLOGY:
            raise _replaced(name)
        values[name] = coerce(name, value) if isinstance(value, str) else value
    if "listenPort" in values and "listen" not in values:  # RocketMQ's way to choose the port
        values["listen"] = f"tcp://127.0.0.1:{values['listenPort']}"
    settings = replace(Settings(), **values)
    validate(settings)
    return settings


if __name__ == "__main__":  # python -m shm.settings > conf/broker.toml
    from shm.conf_file import render_conf
    sys.stdout.write(render_conf())
