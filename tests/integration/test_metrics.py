"""/metrics end to end: a real node with `metricsPort`, real sends, pulls and commits, scraped
over HTTP and parsed as Prometheus text; each figure checked against what the test did."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request

import pytest
from nodes import NodeProcess, free_port, node_settings
from prometheus_client.parser import text_string_to_metric_families

from node.client import Producer, PullConsumer
from node.client.producer import SendError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    settings = node_settings(tmp / "store", runDir=str(tmp / "run"), metricsPort=free_port(), timerMaxDelaySec=60,
                             grpcServerPort=free_port())
    process = NodeProcess(settings, tmp / "node.log").start()
    yield process
    process.stop(strict=False)


def scrape(node) -> dict[tuple[str, tuple], float]:
    url = f"http://{node.settings.metricsAddress}:{node.settings.metricsPort}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_for(node, check, timeout: float = 10.0) -> dict:
    """Scrape until `check(samples)` holds (the services report their statistics once a second)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(node)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.3)


def value(samples, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_puts_pulls_and_lag_are_what_the_clients_did(node):
    with Producer(node.endpoint) as producer:
        for i in range(10):
            producer.send("MetricsA", b"a" * 100, queue_id=0)
        for i in range(3):
            producer.send("MetricsB", b"b" * 10, queue_id=1)
        with pytest.raises(SendError, match="MESSAGE_ILLEGAL"):
            producer.send("MetricsB", b"far", delay_ms=3_600_000, queue_id=1)  # past timerMaxDelaySec
        producer.send("MetricsB", b"later", delay_ms=50_000, queue_id=1)  # a timer, pending
    with PullConsumer(node.endpoint) as consumer:
        offset, deadline = 0, time.monotonic() + 10
        while offset < 6:  # (a pull right after the sends may see only what is dispatched so far)
            pulled = consumer.pull("MetricsA", 0, offset, max_count=6 - offset, group="readers", suspend_ms=1000)
            offset = pulled.next_begin_offset
            assert time.monotonic() < deadline
        consumer.commit("readers", "MetricsA", 0, offset)
    # (each process's counts reach the front once a second: wait for the pull worker's too)
    samples = wait_for(node, lambda s: value(s, "mqnode_put_messages_total", topic="MetricsB", status="PUT_OK") == 4
                       and value(s, "mqnode_timers_pending") == 1
                       and value(s, "mqnode_pull_messages_total", topic="MetricsA", group="readers") == 6)
    assert value(samples, "mqnode_put_messages_total", topic="MetricsA", status="PUT_OK") == 10
    assert value(samples, "mqnode_put_messages_total", topic="MetricsB", status="PUT_OK") == 4  # 3 + the timer
    assert value(samples, "mqnode_put_messages_total", topic="MetricsB", status="MESSAGE_ILLEGAL") == 1
    assert value(samples, "mqnode_put_bytes_total", topic="MetricsA") > 10 * 100
    assert value(samples, "mqnode_pull_messages_total", topic="MetricsA", group="readers") == 6
    assert value(samples, "mqnode_consumer_lag_messages", group="readers", topic="MetricsA", queue="0") == 4
    assert value(samples, "mqnode_timers_pending") == 1
    assert value(samples, "mqnode_put_latency_seconds_bucket", le="+Inf") >= 15
    assert value(samples, "mqnode_dispatch_lag_bytes") is not None
    assert value(samples, "mqnode_schedule_lag_messages", level="18") == 0
    assert value(samples, "mqnode_disk_used_ratio", store="commitlog") > 0
    assert value(samples, "mqnode_process_cpu_seconds_total", process="front") > 0
    assert value(samples, "mqnode_process_resident_memory_bytes", process="dispatcher") > 0
    assert value(samples, "mqnode_process_restarts_total", process="front") == 0


def test_a_scrape_while_sends_run_stays_consistent(node):
    """Counters only grow between scrapes, whatever else the node is doing."""
    before = scrape(node)
    with Producer(node.endpoint) as producer:
        for i in range(50):
            producer.send("MetricsScrape", b"c", queue_id=1)  # (its own topic: the counts of the others stay exact)
    sent_before = value(before, "mqnode_put_messages_total", topic="MetricsScrape", status="PUT_OK") or 0  # (none: first)
    after = wait_for(node, lambda s: (value(s, "mqnode_put_messages_total", topic="MetricsScrape", status="PUT_OK") or 0)
                     >= sent_before + 50)
    for key, old in before.items():
        if key[0].endswith("_total") and key in after:
            assert after[key] >= old, key


# promtool's lint: a time or a size is named in its base unit (seconds, bytes), not a scaled one
SCALED_UNITS = ("milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days", "kilobytes",
                "megabytes", "gigabytes", "kibibytes", "mebibytes", "percent")


def test_every_metric_is_named_in_prometheus_base_units_and_promtool_agrees(node):
    url = f"http://{node.settings.metricsAddress}:{node.settings.metricsPort}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"mqnode_put_latency_seconds", "mqnode_flush_max_seconds", "mqnode_schedule_lag_seconds",
            "mqnode_pop_in_flight_messages", "mqnode_pop_popped", "mqnode_grpc_calls", "mqnode_grpc_clients",
            "mqnode_grpc_messages_sent", "mqnode_replies", "mqnode_broker_permission"} <= names
    assert "\nmqnode_broker_permission 6.0\n" in text
    assert not [name for name in names if any(unit in name for unit in SCALED_UNITS)]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it): the lint above stands in")
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
