import os
import stat
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from golden import GOLDEN_STORE, manifest
from helpers import close_clean, message, open_store, put, small_settings
from nodes import free_port

from shm import settings as settings_module
from shm.conf_file import render_conf
from shm.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_FLAGS = ["--mappedFileSizeCommitLog", "65536", "--mappedFileSizeConsumeQueue", "2000",
                "--maxHashSlotNum", "500", "--set", "maxIndexNum=400"]


def mqnode(*args):
    return subprocess.run([sys.executable, "-m", "node.tools.cli", *args], capture_output=True, text=True, cwd=ROOT)


def test_verify_golden_store_is_clean():
    out = mqnode("verify", "--store", str(GOLDEN_STORE), *GOLDEN_FLAGS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "623 records" in out.stdout and "OK: no fault found" in out.stdout


def test_dump_golden_store_matches_the_manifest():
    out = mqnode("dump", "--store", str(GOLDEN_STORE), *GOLDEN_FLAGS)
    assert out.returncode == 0, out.stderr
    lines = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 623
    by_offset = {p["commitLogOffset"]: p for p in manifest()["puts"]}
    empty = next(x for x in lines if x["offset"] == 433220)
    assert empty["body"] == "" and empty["properties"]["KEYS"] == "empty-key"
    for line in lines:
        if line["offset"] in by_offset:
            put = by_offset[line["offset"]]
            assert line["msgId"] == put["msgId"] and line["queueOffset"] == put["queueOffset"]
            assert line["bodyCrc"] == put["bodyCRC"] and line["properties"] == put["properties"]
            assert ("body" in line) or bytes.fromhex(put["bodyHex"]) != b""
    some = mqnode("dump", "--store", str(GOLDEN_STORE), *GOLDEN_FLAGS, "--topic", "TopicB", "--count", "3")
    assert [orjson.loads(x)["topic"] for x in some.stdout.splitlines()] == ["TopicB"] * 3
    start = lines[5]["offset"]
    later = mqnode("dump", "--store", str(GOLDEN_STORE), *GOLDEN_FLAGS, "--from", str(start), "--count", "1")
    assert orjson.loads(later.stdout)["offset"] == start


def test_verify_reports_a_flipped_byte_and_exits_nonzero(tmp_path):
    settings = small_settings(tmp_path / "s")
    store = open_store(settings)
    put(store, [message(i) for i in range(100)])
    close_clean(store)
    flags = ["--store", str(settings.root), "--mappedFileSizeCommitLog", "65536", "--mappedFileSizeConsumeQueue",
             "2000", "--maxHashSlotNum", "500", "--maxIndexNum", "400"]
    assert mqnode("verify", *flags).returncode == 0
    with open(settings.commitlog_dir / f"{0:020d}", "r+b") as f:
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 0xFF]))
    out = mqnode("verify", *flags)
    assert out.returncode == 1 and "FAULT: CommitLog" in out.stdout
    with open(settings.commitlog_dir / f"{0:020d}", "r+b") as f:
        f.seek(5000)
        f.write(byte)
    queue_file = settings.consumequeue_dir / "TopicA" / "0" / f"{0:020d}"
    with open(queue_file, "r+b") as f:
        f.seek(20 * 3 + 8)
        f.write((999).to_bytes(4, "big"))
    out = mqnode("verify", *flags)
    assert out.returncode == 1 and "TopicA/0 offset 3" in out.stdout and "size differ" in out.stdout


def test_bad_usage_is_a_clear_error():
    out = mqnode("verify", "--store", str(GOLDEN_STORE), "--mappedFileSizeCommitLog", "big")
    assert out.returncode == 2 and "not a int" in out.stderr
    out = mqnode("dump", "--store", "/nonexistent/store")
    assert out.returncode == 2 and "no store" in out.stderr


def test_a_store_the_node_cannot_use_is_named_without_a_traceback(tmp_path):
    (tmp_path / "a-file").write_text("")
    port = free_port()
    out = mqnode("start", "--store", str(tmp_path / "a-file" / "store"), "--listen", f"tcp://127.0.0.1:{port}",
                 "--listenPort", str(port), "--grpcServerPort", "0")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.endswith(f"mqnode failed: cannot use {tmp_path}/a-file/store: Not a directory "
                               f"(this process runs as uid {os.getuid()})\n"), out.stderr[-2000:]


def test_the_scripts_run_through_a_symlink_from_anywhere(tmp_path):
    (tmp_path / "mqnode").symlink_to(ROOT / "scripts" / "mqnode")  # (a user's ~/bin/mqnode)
    out = subprocess.run([str(tmp_path / "mqnode"), "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage: mqnode"), out.stderr[-2000:]


def test_conf_file_lists_every_setting_with_its_default():
    import tomllib

    conf = (ROOT / "conf" / "broker.toml").read_text()
    assert conf == render_conf()
    assert tomllib.loads(conf) == {k: getattr(Settings(), k) for k in tomllib.loads(conf)}
    assert settings_module.load(ROOT / "conf" / "broker.toml") == Settings()


def test_broker_conf_style_and_overrides(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("# RocketMQ style\nflushDiskType=SYNC_FLUSH\nmappedFileSizeCommitLog = 65536\nbrokerIP1=10.0.0.5\n")
    settings = settings_module.load(conf, {"maxIndexNum": "400"})
    assert (settings.flushDiskType, settings.mappedFileSizeCommitLog, settings.brokerIP1, settings.maxIndexNum) == (
        "SYNC_FLUSH", 65536, "10.0.0.5", 400)
    assert settings.fileReservedTime == 72  # omitted keys keep their defaults
    conf.write_bytes("\ufeffbrokerName = b1\r\n# ünïcödé\r\nflushDiskType=SYNC_FLUSH\r\n".encode())  # (a Windows editor's)
    assert (settings_module.load(conf).brokerName, settings_module.load(conf).flushDiskType) == ("b1", "SYNC_FLUSH")
    conf.write_text("offsetCheckInSlave = true\n")  # accepted and ignored would mislead: refused by name
    with pytest.raises(SettingsError, match="offsetCheckInSlave is not implemented by mqnode yet"):
        settings_module.load(conf)
    default = settings_module.Settings().offsetCheckInSlave
    assert settings_module.load(None, {"offsetCheckInSlave": str(default).lower()}).offsetCheckInSlave == default
    conf.write_text("brokerRole=SLAVE\nbrokerId=1\n")  # a slave needs its master
    with pytest.raises(SettingsError, match="haMasterAddress"):
        settings_module.load(conf)
    conf.write_text("brokerRole=SLAVE\nhaMasterAddress=10.0.0.1:10912\n")
    with pytest.raises(SettingsError, match="brokerId"):
        settings_module.load(conf)
    assert settings_module.load(None, {"listen": "tcp://127.0.0.1:20000"}).ha_port == 20001  # RocketMQ's rule
    conf.write_text("fileReservedTime = 0.5\ndeleteWhen = \"04;16\"\n")  # the clean service's: a fraction of an hour
    assert settings_module.load(conf).fileReservedTime == 0.5
    for bad in ({"deleteWhen": "24"}, {"fileReservedTime": "0"}, {"diskSpaceWarningLevelRatio": "90"}):
        with pytest.raises(SettingsError, match=next(iter(bad))):
            settings_module.load(None, bad)
    assert settings_module.Settings().cpuIdleLatencyUs == -1  # host tuning is an operator's opt-in
    conf.write_text("noSuchKey = 1\n")
    with pytest.raises(SettingsError, match="broker.conf:1: unknown setting 'noSuchKey'"):
        settings_module.load(conf)
    # a RocketMQ broker.conf brought over: every unknown key at once, each with the setting it looks like
    conf.write_text("brokerName = b\nmapedFileSizeCommitLog = 65536\nsendMessageThreadPoolNums = 16\nflushDiskTyp = x\n")
    with pytest.raises(SettingsError) as refused:
        settings_module.load(conf)
    assert str(refused.value).splitlines() == [
        f"{conf}:2: unknown setting 'mapedFileSizeCommitLog' (did you mean mappedFileSizeCommitLog?)",
        f"{conf}:3: unknown setting 'sendMessageThreadPoolNums'",
        f"{conf}:4: unknown setting 'flushDiskTyp' (did you mean flushDiskType?)"]
    with pytest.raises(SettingsError, match="flushDiskType"):
        settings_module.load(None, {"flushDiskType": "FAST"})
    with pytest.raises(SettingsError, match="dispatcherNiceness"):
        settings_module.load(None, {"dispatcherNiceness": "20"})
    with pytest.raises(SettingsError, match="cpuIdleLatencyUs"):
        settings_module.load(None, {"cpuIdleLatencyUs": "-2"})
    assert settings_module.load(None, {"cpuIdleLatencyUs": "-1"}).cpuIdleLatencyUs == -1  # no request
    with pytest.raises(SettingsError, match="dispatcherPollMillis"):
        settings_module.load(None, {"dispatcherPollMillis": "0"})
    with pytest.raises(SettingsError, match="dispatcherPollHoldMillis"):
        settings_module.load(None, {"dispatcherPollHoldMillis": "-1"})
    with pytest.raises(SettingsError, match="pullWorkers must be at most 62"):  # (a watcher slot each, the pop service one)
        settings_module.load(None, {"topology": "split", "pullWorkers": "63"})
    assert settings_module.load(None, {"topology": "split", "pullWorkers": "62"}).pullWorkers == 62
    assert settings_module.parse_delay_levels("1s 5s 2m 1h") == [1000, 5000, 120000, 3600000]


def test_relative_paths_are_the_working_directorys_and_absolute_ones_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    given = settings_module.load(None, {"storePathRootDir": "store", "runDir": "../run", "logDir": "~/logs",
                                        "aclFile": "/etc/acl.yml", "listen": "ipc://node.sock"})
    settings = settings_module.absolute_paths(given)
    assert (settings.storePathRootDir, settings.runDir, settings.logDir, settings.aclFile, settings.listen) == (
        str(tmp_path / "store"), str(tmp_path.parent / "run"), str(tmp_path / "home" / "logs"), "/etc/acl.yml",
        f"ipc://{tmp_path}/node.sock")
    assert settings.storePathCommitLog == "" and settings.tieredArchiveDir == ""  # (empty: the derived default)
    assert settings_module.absolute_paths(settings) == settings
    assert settings_module.absolute_paths(settings_module.load(None, {"listen": "ipc://@mqnode"})).listen == "ipc://@mqnode"
    assert all(isinstance(getattr(settings, name), str) for name in settings_module.PATH_SETTINGS)


def test_the_run_directory_is_private_held_and_fresh(tmp_path, monkeypatch):
    from node.server.preflight import prepare_run_dir

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    settings = settings_module.load(None, {"storePathRootDir": str(tmp_path / "store")})
    assert settings.run_dir == tmp_path / "store" / "run"  # not a predictable /tmp path
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert settings.run_dir.parent == tmp_path / "xdg"
    path, lock = prepare_run_dir(settings)
    assert path == settings.run_dir and stat.S_IMODE(path.stat().st_mode) == 0o700
    (path / "front.pid").write_text("1\n")
    holder = subprocess.run([sys.executable, "-c", "from node.server.preflight import prepare_run_dir; "
                             "from shm import settings; import sys; "
                             "prepare_run_dir(settings.load(None, {'runDir': sys.argv[1]}))", str(path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert f"run directory {path} is in use by another node (pid {os.getpid()})" in holder.stderr, holder.stderr
    assert (path / "front.pid").exists()  # (the holder's files left alone)
    lock.release()
    again, lock = prepare_run_dir(settings)
    assert again == path and not (path / "front.pid").exists()  # fresh: no stale pid files
    lock.release()
    path.chmod(0o755)
    with pytest.raises(SettingsError, match="mode 0700"):
        prepare_run_dir(settings)
    path.chmod(0o700)
    if os.getuid() == 0:  # another user's directory is refused too
        os.chown(path, 12345, 12345)
        with pytest.raises(SettingsError, match="owner uid 12345"):
            prepare_run_dir(settings)
    deep = settings_module.load(None, {"storePathRootDir": str(tmp_path / ("d" * 120))})
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    short, lock = prepare_run_dir(deep)  # too long for an ipc socket: a new private temporary directory
    assert len(str(short)) < 100 and stat.S_IMODE(short.stat().st_mode) == 0o700
    lock.release()
    from shm.store_files import StoreLock

    root = tmp_path / "own"  # a run directory that is the store's root: its lock is not the store's
    root.mkdir(mode=0o700)
    with StoreLock(root):
        own, lock = prepare_run_dir(settings_module.load(None, {"storePathRootDir": str(root), "runDir": str(root)}))
        assert own == root
        lock.release()


def test_a_new_store_on_a_disk_too_small_for_its_segments_is_refused_with_a_size_that_fits(tmp_path):
    """A store needs two CommitLog segments and a new one's headroom on its disk (the segment
    being written is never cleaned): `mqnode start` of a new store on a smaller disk says so and
    which mappedFileSizeCommitLog would fit, before anything is made. (Before: it started, and
    every send was CREATE_MAPEDFILE_FAILED, or took sends until one segment filled the disk and
    then refused every one for good.)"""
    import re

    from node.server.preflight import store_disk_too_small
    from shm.disk import capacity_bytes

    capacity = capacity_bytes(tmp_path)
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "node.tools.cli", "start", "--store", str(tmp_path / "store"),
                          "--runDir", str(tmp_path / "run"), "--listen", f"tcp://127.0.0.1:{port}", "--listenPort",
                          str(port), "--grpcServerPort", "0", "--mappedFileSizeCommitLog", str(capacity)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)  # (a segment no disk could hold)
    assert out.returncode == 2 and out.stderr.startswith("mqnode start: the store's disk"), out.stderr
    assert f"holds {capacity} bytes in all" in out.stderr and not (tmp_path / "store").exists()
    fits = int(re.search(r"set mappedFileSizeCommitLog to at most (\d+) MiB", out.stderr).group(1)) << 20
    assert store_disk_too_small(settings_module.load(None, {"mappedFileSizeCommitLog": fits}), capacity) is None
    assert store_disk_too_small(settings_module.load(None, {"mappedFileSizeCommitLog": fits + (2 << 20)}), capacity)


def test_the_store_disk_rule_counts_two_segments_the_entry_files_and_the_headroom_and_spares_a_store_with_data(
        tmp_path, caplog):
    import re

    from node.server.preflight import check_store_disk, store_disk_needs, store_disk_too_small

    gib, mib = 1 << 30, 1 << 20
    defaults = settings_module.load(None, {"storePathRootDir": str(tmp_path / "store")})
    from shm.index_file import index_file_size

    index, queue_files = index_file_size(5_000_000, 20_000_000), 8 * 300_000 * 20  # RocketMQ's sizes
    assert defaults.index_file_bytes == index
    need = 2 * gib + index + queue_files + gib // 2  # two segments, the entry files, a new one's headroom
    assert store_disk_needs(defaults, gib) == need  # (~2.94 GiB: over it the 0.9 warning level needs less)
    assert store_disk_too_small(defaults, need) is None and store_disk_too_small(defaults, need - 1)
    for capacity in (1500 * mib, 2 * gib, need - 1):  # the advice fits, a MiB more does not
        largest = int(re.search(r"at most (\d+) MiB", store_disk_too_small(defaults, capacity)).group(1)) * mib
        assert store_disk_needs(defaults, largest) <= capacity < store_disk_needs(defaults, largest + mib)
    # what stands must stay under the warning level: it binds once that is low
    lean = {"messageIndexEnable": "false", "mappedFileSizeConsumeQueue": "6000"}
    assert store_disk_needs(settings_module.load(None, lean), 100 * mib) == 200 * mib + 48_000 + 50 * mib
    low = settings_module.load(None, lean | {"diskSpaceWarningLevelRatio": "0.5", "diskSpaceCleanForciblyRatio": "0.4"})
    assert store_disk_needs(low, 100 * mib) == 2 * (200 * mib + 48_000)
    tiny = store_disk_too_small(defaults, 100 * mib)  # under the default index file (420 MB) alone
    assert "put the store on a larger disk, or make its index files smaller" in tiny
    huge = settings_module.load(None, {"storePathRootDir": str(tmp_path / "store"), "mappedFileSizeCommitLog": 1 << 50})
    with pytest.raises(SettingsError, match="the store's disk"):
        check_store_disk(huge)
    (huge.commitlog_dir).mkdir(parents=True)
    (huge.commitlog_dir / "00000000000000000000").touch()  # a store with data: started (read), warned
    with caplog.at_level("WARNING", logger="mqnode"):
        check_store_disk(huge)
    assert "its sends will be refused once the disk is full" in caplog.text
