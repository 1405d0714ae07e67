"""scripts/loadtest: its pure pieces (the verifier above all: it must fail on broken results),
then small real runs of every preset against real nodes, `--reverify` on tampered records, and a
chaos run under SYNC_FLUSH. Nothing here asserts a speed."""

from __future__ import annotations

import subprocess
import sys
import zlib

import numpy as np
import orjson
import psutil
import pytest
from nodes import HOST_DISK_BLIND, LEAN, LEAN_SPLIT, ROOT, NodeProcess, node_settings

from node.client import PullConsumer
from node.tools.loadtest import payload, records
from node.tools.loadtest.histogram import LogHistogram
from node.tools.loadtest.params import PRESETS, SizeSpec
from node.tools.loadtest.replication import slave_options
from node.tools.loadtest.run import build_parser, main, node_options, resolve
from node.tools.loadtest.verify import verify
from shm.settings import Settings

# -- the verifier -------------------------------------------------------------------------------


def clean_run(producers: int = 2, per_producer: int = 100, queues: int = 4):
    """What a perfect run records: every send acked, consumed once, in order, by two consumers."""
    sent, consumed, next_offset = [], [], [0] * queues
    for seq in range(per_producer):
        for p in range(producers):
            q = (p + seq) % queues
            sent.append((p, seq, 0, q, next_offset[q], 100, records.ACKED))
            consumed.append((p, seq, 0, q, next_offset[q], 100, 1, q % 2))
            next_offset[q] += 1
    return np.array(sent, records.SENT), np.array(consumed, records.CONSUMED)


def test_verify_accepts_a_clean_run():
    sent, consumed = clean_run()
    verdict = verify(sent, consumed)
    assert verdict.ok, verdict.lines()
    assert verdict.counts["acked"] == verdict.counts["consumedUnique"] == 200


def _drop(s, c):
    return s, np.delete(c, 17)


def _duplicate(s, c):
    return s, np.insert(c, 50, c[20])


def _corrupt(s, c):
    c = c.copy()
    c["intact"][33] = 0
    return s, c


def _unreadable(s, c):
    c = c.copy()
    c["producer"][5] = records.UNREADABLE
    return s, c


def _misplace(s, c):
    s = s.copy()
    s["offset"][40] += 1000  # acked at one place, consumed at another
    return s, c


def _reorder(s, c):
    c = c.copy()
    i, j = 8, 16  # two messages of queue 0, consumer 0
    assert c["queue"][i] == c["queue"][j] == 0
    c[[i, j]] = c[[j, i]]
    return s, c


def _phantom(s, c):
    return s, np.append(c, np.array([(7, 99, 0, 1, 9999, 100, 1, 1)], records.CONSUMED))


def _other_topic(s, c):
    c = c.copy()
    c["topic"][60] = 1  # same queue and offset, but of another topic
    return s, c


def _refused_yet_delivered(s, c):
    s = s.copy()
    s["outcome"][3] = records.REFUSED
    return s, c


def _resized(s, c):
    c = c.copy()
    c["size"][12] = 99
    return s, c


@pytest.mark.parametrize("breakage, kind", [
    (_drop, "lost"), (_duplicate, "duplicate"), (_corrupt, "corrupt"), (_unreadable, "corrupt"),
    (_misplace, "misplaced"), (_other_topic, "misplaced"), (_reorder, "out-of-order"), (_phantom, "phantom"),
    (_refused_yet_delivered, "phantom"), (_resized, "corrupt-size"),
])
def test_verify_fails_a_broken_run(breakage, kind):
    verdict = verify(*breakage(*clean_run()))
    assert not verdict.ok
    assert kind in verdict.findings, verdict.lines()
    assert verdict.findings[kind]["count"] >= 1 and verdict.findings[kind]["examples"]


def test_an_unanswered_send_may_be_missing_or_delivered_once_but_not_twice():
    sent, consumed = clean_run()
    sent = sent.copy()
    sent["outcome"][:2] = records.UNKNOWN
    missing = consumed[~((consumed["producer"] == sent["producer"][0]) & (consumed["seq"] == sent["seq"][0]))]
    verdict = verify(sent, missing)
    assert verdict.ok, verdict.lines()
    assert verdict.counts["unknownDelivered"] == 1
    assert "duplicate" in verify(sent, np.append(consumed, consumed[1:2])).findings


def test_a_popped_run_counts_a_message_handed_out_again_and_checks_no_order():
    """--pop: a message received again at its one position is a redelivery (at least once), a
    queue's order means nothing to a pop group; lost, misplaced, corrupt and stored twice still
    fail the run."""
    sent, consumed = clean_run()
    again = np.concatenate([consumed, consumed[10:30]])
    again[[8, 16]] = again[[16, 8]]  # (queue 0 of consumer 0 backwards: a pull run's out-of-order)
    verdict = verify(sent, again, popped=True)
    assert verdict.ok, verdict.lines()
    assert verdict.counts["redelivered"] == 20 and verdict.counts["consumed"] == 220
    assert {"duplicate", "out-of-order"} <= set(verify(sent, again).findings)  # (pulled: both findings)
    assert "lost" in verify(sent, np.delete(again, 40), popped=True).findings
    assert "misplaced" in verify(*_misplace(sent, again), popped=True).findings
    assert "corrupt" in verify(*_corrupt(sent, again), popped=True).findings
    damaged_again = again.copy()
    damaged_again["intact"][-1] = 0  # (the second copy of a message handed out twice)
    assert "corrupt" in verify(sent, damaged_again, popped=True).findings
    assert "phantom" in verify(*_phantom(sent, again), popped=True).findings
    twice = np.append(consumed, consumed[3:4])
    twice["offset"][-1] += 1000  # the same message at a second position: stored twice
    assert "duplicate" in verify(sent, twice, popped=True).findings


def test_verify_lists_what_went_wrong_with_counts_beyond_the_examples():
    sent, consumed = clean_run(per_producer=100)
    verdict = verify(sent, consumed[:50])
    assert verdict.findings["lost"]["count"] == 150
    assert len(verdict.findings["lost"]["examples"]) == 10
    assert "acknowledged, never consumed" in verdict.lines()[1]


# -- payload, histogram, sizes, flags -----------------------------------------------------------


def test_payload_round_trip_and_damage():
    filler = payload.Filler(seed=5, max_size=4096)
    body = payload.make(run_id=9, producer=3, seq=77, send_ns=123, size=1000, filler=filler)
    assert len(body) == 1000
    assert payload.read(body) == payload.Parsed(9, 3, 77, 123, True)
    damaged = bytearray(body)
    damaged[500] ^= 1
    assert payload.read(bytes(damaged)).intact is False
    assert payload.read(b"XXXX" + body[4:]) is None
    assert payload.read(body[:20]) is None
    other = payload.make(9, 3, 78, 123, 1000, filler)
    assert other[32:] != body[32:] and zlib.crc32(other[32:]) != zlib.crc32(body[32:])


def test_histogram_percentiles_are_within_a_bucket():
    h = LogHistogram()
    for v in range(1, 10_001):
        h.add(float(v))
    h.settle()
    assert h.total == 10_000
    assert abs(h.percentile(50) - 5000) / 5000 < 0.03
    assert abs(h.percentile(99) - 9900) / 9900 < 0.03
    merged = LogHistogram.from_sparse(h.to_sparse()).merge(LogHistogram.from_sparse(h.to_sparse()))
    assert merged.total == 20_000 and merged.percentile(50) == h.percentile(50)
    assert LogHistogram().percentile(50) is None


def test_size_specs():
    assert SizeSpec.parse("1k").sampler(1)() == 1024
    spec = SizeSpec.parse("200-4000")
    draw = spec.sampler(1)
    assert all(200 <= draw() <= 4000 for _ in range(1000))
    draw = SizeSpec.parse("256,4KiB").sampler(2)
    assert {draw() for _ in range(100)} == {256, 4096}
    for bad in ("10", "abc", "5MiB", "4000-200"):
        with pytest.raises(ValueError):
            SizeSpec.parse(bad)


def test_the_send_plan_paces_and_stops_at_the_share():
    from node.tools.loadtest.workers import MAX_CATCH_UP, _Plan

    plan = _Plan(share=10, batch=4, rate=100.0, began=1000.0, deadline=None)
    claims = []
    while (claim := plan.claim()) is not None:
        claims.append(claim)
    assert [list(c[0]) for c in claims] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [c[1] for c in claims] == [0, 1, 2]
    # began long ago: the first claim is overdue by more than MAX_CATCH_UP, so the schedule restarts now
    assert claims[0][2] > 1000.0 + MAX_CATCH_UP and claims[1][2] - claims[0][2] == pytest.approx(0.04)
    unpaced = _Plan(share=None, batch=1, rate=0.0, began=0.0, deadline=0.0)
    assert unpaced.claim() is None  # past its deadline


def test_the_slave_runs_with_the_runs_node_options_but_its_own_place():
    params = resolve(build_parser().parse_args(["--slave", "--node-option", "topology=compact", "--node-option",
                                                "brokerRole=SYNC_MASTER", "--node-option", "grpcServerPort=0",
                                                "--node-option", "metricsPort=9100", "--node-option", "haListenPort=1"]))
    options = node_options(params)
    assert options["brokerRole"] == "SYNC_MASTER" and options["metricsPort"] == "9100"
    assert slave_options(options) == {"topology": "compact", "grpcServerPort": "0"}
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        node_options(resolve(build_parser().parse_args(["--node-option", "topology"])))


def test_presets_resolve_and_flags_override_them():
    params = resolve(build_parser().parse_args(["--scenario", "sync-flush", "--count", "10"]))
    assert params.flush == "SYNC_FLUSH" and params.count == 10 and params.concurrency == 64
    assert resolve(build_parser().parse_args([])).duration == 30.0  # no bound given: 30 s
    assert set(PRESETS) == {"async-batch", "async-single", "sync-flush", "consume-backlog", "latency", "mixed"}


@pytest.mark.parametrize("flags", [["--producers", "0"], ["--chaos", "--endpoint", "tcp://127.0.0.1:1"],
                                   ["--verify", "--consumers", "0"], ["--size", "8"], ["--count", "0"],
                                   ["--pop", "--invisible-ms", "10"], ["--interval", "0"], ["--send-timeout", "0"],
                                   ["--drain-timeout", "-1"], ["--linger-ms", "-1"], ["--chaos-interval", "5,1"],
                                   ["--chaos-interval", "x"], ["--chaos-interval", "0,1"]])
def test_bad_flags_exit_2_before_starting_anything(flags, capsys):
    assert main(flags) == 2
    assert "loadtest:" in capsys.readouterr().out


def test_a_node_that_does_not_answer_fails_the_run_clearly(tmp_path, capsys):
    from nodes import free_port

    assert main(["--endpoint", f"tcp://127.0.0.1:{free_port()}", "--count", "10", "--quiet",
                 "--output", str(tmp_path)]) == 1
    assert "no answer from" in capsys.readouterr().out


# -- real runs ----------------------------------------------------------------------------------


# the nodes the load tester starts itself, lean as tests.nodes makes a test's node (no gRPC proxy, one
# pull worker: ~3 CPU-s less at each start and restart, the chaos run's among them), on 8 MiB
# segments (on the defaults a master and its slave held 4 GiB of disk: two 1 GiB segments each)
LEAN_NODE = tuple(part for name, value in (LEAN | LEAN_SPLIT | HOST_DISK_BLIND | {"mappedFileSizeCommitLog": 8 * 1024 * 1024}).items()
                  for part in ("--node-option", f"{name}={value}"))


def loadtest(*args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict]:
    output = next(a for a in args[args.index("--output") + 1:])
    done = subprocess.run([sys.executable, "-m", "node.tools.loadtest.run", "--quiet", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    results = orjson.loads((ROOT / output / "results.json").read_bytes()) if (ROOT / output / "results.json").exists() else {}
    return done, results


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("loadtest-node")
    running = NodeProcess(node_settings(directory / "store", mappedFileSizeCommitLog=8 * 1024 * 1024,
                                        mappedFileSizeConsumeQueue=60_000), directory / "node.log").start()
    yield running
    running.stop()


SMALL = {
    "async-batch": ["--count", "4000"],
    "async-single": ["--count", "3000"],
    "consume-backlog": ["--count", "4000", "--verify"],
    "latency": ["--duration", "3", "--rate", "300", "--verify"],
    "mixed": ["--duration", "3", "--rate", "1000", "--verify", "--topics", "3"],
}


@pytest.mark.parametrize("scenario", sorted(SMALL))
def test_each_preset_runs_and_reports(scenario, node, tmp_path):
    done, results = loadtest("--scenario", scenario, "--endpoint", node.endpoint, "--topic", f"LT{scenario.replace('-', '')}",
                             "--output", str(tmp_path), *SMALL[scenario])
    assert done.returncode == 0, done.stdout + done.stderr
    summary = results["summary"]
    if "--count" in SMALL[scenario]:
        assert summary["produced"] == int(SMALL[scenario][1])
    assert summary["produced"] > 0 and summary["produceRate"] > 0 and summary["ack"]["50"] > 0
    assert summary["outcomes"]["refused"] == summary["outcomes"]["unknown"] == 0
    assert summary["cpuMean"] is not None and summary["rssMax"] > 0  # found the node by its port
    # what the node owns and costs, shared pages once: less than the RSS summed over its processes
    assert 0 < summary["anonMax"] <= summary["pssMax"] < summary["rssMax"]
    if results["params"]["consumers"]:
        assert results["verify"]["ok"], results["verify"]
        assert summary["consumed"] == summary["produced"] and summary["e2e"]["count"] == summary["consumed"]
    assert len(results["series"]) >= 2
    if "--topics" in SMALL[scenario]:
        assert len(results["startOffsets"]) == 3 * 8
    for name in ("throughput.png", "ack_latency_cdf.png", "e2e_latency_hist.png", "node_resources.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "publish-ack latency" in page
    assert "produce rate" in done.stdout and "report.html" in done.stdout


def test_reverify_fails_on_tampered_records(node, tmp_path):
    done, results = loadtest("--endpoint", node.endpoint, "--topic", "LTReverify", "--count", "600",
                             "--consumers", "2", "--verify", "--output", str(tmp_path))
    assert done.returncode == 0 and results["verify"]["ok"], done.stdout
    again = subprocess.run([sys.executable, "-m", "node.tools.loadtest.run", "--reverify", str(tmp_path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "PASSED" in again.stdout
    consumed = records.load(tmp_path / "records", "consumed")
    for path in (tmp_path / "records").glob("consumed-*.bin"):
        path.unlink()
    broken = np.delete(consumed, 10)                      # a loss
    broken = np.append(broken, broken[100:101])           # a duplicate
    broken["intact"][200] = 0                             # a corruption
    records.save(tmp_path / "records", "consumed", broken)
    again = subprocess.run([sys.executable, "-m", "node.tools.loadtest.run", "--reverify", str(tmp_path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1, again.stdout
    for kind in ("lost: 1", "duplicate: 1", "corrupt: 1"):
        assert kind in again.stdout


def test_a_pop_group_consumes_every_message_and_its_records_reverify_as_pops(node, tmp_path):
    """--pop: two consumers pop as one group from every queue and ack; the run ends when the
    group has retired every queue. A message handed out again at its position passes
    --reverify (the run was a pop run: results.json says), a lost one does not."""
    done, results = loadtest("--endpoint", node.endpoint, "--topic", "LTPop", "--count", "3000", "--consumers", "2",
                             "--pop", "--invisible-ms", "2000", "--verify", "--output", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert results["verify"]["ok"] and results["verify"]["counts"]["consumedUnique"] == 3000, results["verify"]
    assert "redelivered" in results["verify"]["counts"] and results["summary"]["unfinishedQueues"] == []
    with PullConsumer(node.endpoint) as consumer:
        assert all(q["inFlight"] == 0 for q in consumer.pop_state("LTPop-pop")["LTPop"].values())
    consumed = records.load(tmp_path / "records", "consumed")
    for path in (tmp_path / "records").glob("consumed-*.bin"):
        path.unlink()
    records.save(tmp_path / "records", "consumed", np.append(consumed, consumed[7:9]))  # handed out again
    again = subprocess.run([sys.executable, "-m", "node.tools.loadtest.run", "--reverify", str(tmp_path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "redelivered 2" in again.stdout, again.stdout
    records.save(tmp_path / "records", "consumed", np.delete(consumed, 5))
    again = subprocess.run([sys.executable, "-m", "node.tools.loadtest.run", "--reverify", str(tmp_path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "lost: 1" in again.stdout, again.stdout


def test_sigterm_stops_producing_drains_and_still_reports(node, tmp_path):
    import signal
    import time

    run = subprocess.Popen([sys.executable, "-m", "node.tools.loadtest.run", "--quiet", "--endpoint", node.endpoint,
                            "--topic", "LTSigterm", "--duration", "120", "--rate", "500", "--consumers", "1",
                            "--verify", "--output", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "records").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    run.send_signal(signal.SIGTERM)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 0, out
    results = orjson.loads((tmp_path / "results.json").read_bytes())
    assert results["verify"]["ok"] and 0 < results["summary"]["produced"] < 500 * 60
    assert results["elapsed"] < 60


def _left_behind(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow
def test_sync_flush_preset_starts_and_stops_its_own_node(tmp_path):
    done, results = loadtest("--scenario", "sync-flush", "--count", "10000", "--consumers", "1", "--verify",
                             "--profile", "--output", str(tmp_path), *LEAN_NODE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert results["node"]["started"] and results["params"]["flush"] == "SYNC_FLUSH"
    assert results["verify"]["ok"] and results["summary"]["produced"] == 10000
    assert b"mqnode ready" in (tmp_path / "node.log").read_bytes()
    assert not _left_behind("mqnode-loadtest-")
    profile = results["profile"]  # py-spy on every actor and worker; one that cannot attach says why
    assert {"front", "dispatcher", "producer-0", "consumer-0"} <= set(profile)
    if Settings().topology == "compact":  # the front's process writes and flushes: no such processes
        assert "writer" not in profile and "flush" not in profile
    else:  # every service a process, each profiled
        assert {"writer", "flush"} <= set(profile)
    assert profile["front"]["samples"] > 0 and profile["front"]["top"], profile["front"]
    assert "where the time goes" in (tmp_path / "report.html").read_text().lower()


@pytest.mark.slow
def test_chaos_under_sync_flush_with_a_slave_loses_nothing_and_keeps_the_copy(tmp_path):
    """SYNC_FLUSH and SYNC_MASTER, a slave beside (`--slave`): the master's processes, its whole
    node, the slave's processes and the slave's whole node are struck; every acknowledged message
    is consumed, and the slave's CommitLog (and its copy of the pop log, empty here) ends byte for
    byte as the master's. (A pop group under kill -9 of its service and of the whole node:
    test_pop; the pop log's copy through a failover: test_ha.)"""
    done, results = loadtest("--flush", "SYNC_FLUSH", "--node-option", "brokerRole=SYNC_MASTER", "--slave",
                             "--producers", "2", "--consumers", "1", "--rate", "1500", "--duration", "9", "--verify",
                             "--chaos", "--chaos-interval", "1.5,2.5", "--seed", "1", "--output", str(tmp_path),
                             *LEAN_NODE, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    strikes = results["chaos"]
    assert strikes and all("recoveredAfter" in s for s in strikes), strikes
    assert any(s["target"].startswith("slave") for s in strikes), strikes
    assert results["verify"]["ok"] and results["verify"]["counts"]["acked"] > 1000
    assert results["replication"]["ok"] and results["replication"]["comparedBytes"] > 0, results["replication"]
    assert results["replication"]["popLog"]["ok"], results["replication"]
    assert "chaos" in done.stdout and "PASSED" in done.stdout and "identical" in done.stdout
    assert not _left_behind("mqnode-loadtest-")
