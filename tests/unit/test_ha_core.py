"""Replication without sockets: the epoch file and its fencing rule, the HA link's sessions and
byte stream (actors.ha_link), and the follower's raw appends (actors.ha_client.Follower)."""

from __future__ import annotations

import orjson
import pytest
from helpers import message, open_store, put, small_settings
from hypothesis import given
from hypothesis import strategies as st

from actors.ha_client import Follower
from actors import ha_link
from actors.ha_link import HEADER, REPORT, LinkError, MasterSession, SlaveSession, StreamDecoder
from shm.control_block import ControlBlock
from shm.epochs import Epoch, EpochFile, common_prefix, from_wire
from shm.mapped_file import StoreError

A, B, C, D = "a" * 16, "b" * 16, "c" * 16, "d" * 16


# -- epochs ------------------------------------------------------------------------------------------


def test_the_epoch_file_round_trips_and_refuses_a_history_that_goes_backwards(tmp_path):
    epochs = EpochFile(tmp_path)
    assert epochs.entries == [] and epochs.current == -1
    epochs.genesis(0)
    epochs.genesis(99)  # only the first start writes it
    first = epochs.begin(4096)
    assert [e.epoch for e in EpochFile(tmp_path).entries] == [0, 1] and EpochFile(tmp_path).last == first
    (tmp_path / "epoch").write_text(f"0 0 {A}\n1 10 {B}\n1 20 {C}\n")
    with pytest.raises(StoreError, match="count up"):
        EpochFile(tmp_path)
    (tmp_path / "epoch").write_text("0 zero token\n")
    with pytest.raises(StoreError, match="line 1"):
        EpochFile(tmp_path)


def test_a_follower_of_the_same_epoch_keeps_everything_its_master_has():
    history = [Epoch(0, 0, A)]
    assert common_prefix(history, 1000, history, 600) == (fence := common_prefix(history, 1000, history, 600))
    assert (fence.keep, fence.dropped, fence.refusal) == (600, 0, None)
    ahead = common_prefix(history, 500, history, 600)  # the master lost its tail: the follower cuts it
    assert (ahead.keep, ahead.dropped) == (500, 100)


def test_an_old_masters_tail_past_the_promotion_is_cut():
    old_master = [Epoch(0, 0, A)]
    new_master = [Epoch(0, 0, A), Epoch(1, 700, B)]  # the slave was promoted with 700 bytes
    fence = common_prefix(new_master, 900, old_master, 1000)
    assert (fence.keep, fence.dropped, fence.refusal) == (700, 300, None)
    twice = [Epoch(0, 0, A), Epoch(1, 700, B), Epoch(2, 800, C)]
    assert common_prefix(twice, 900, [Epoch(0, 0, A), Epoch(1, 700, B)], 850).keep == 800


def test_a_follower_promoted_after_the_masters_history_is_never_cut_by_it():
    """The old master brought back as a master (a stale toml), the promoted node as its slave."""
    old_master = [Epoch(0, 0, A)]
    promoted = [Epoch(0, 0, A), Epoch(1, 700, B)]
    fence = common_prefix(old_master, 1000, promoted, 900)
    assert (fence.keep, fence.dropped) == (900, 0) and "epoch 1 (from offset 700)" in fence.refusal
    assert "nothing was cut" in fence.refusal and fence.superseded == 1
    unused = common_prefix(old_master, 1000, promoted, 700)  # promoted, but it took nothing: it follows
    assert (unused.keep, unused.dropped, unused.refusal) == (700, 0, None)
    assert common_prefix(old_master, 600, promoted, 700).dropped == 100  # (the old master lost its tail)
    rival = [Epoch(0, 0, A), Epoch(1, 650, C)]  # two nodes promoted into one epoch: neither cuts the other
    assert common_prefix(rival, 1000, promoted, 900).superseded == 1
    later = [Epoch(0, 0, A), Epoch(1, 650, C), Epoch(2, 800, D)]  # the master's history went on past it: cut
    fence = common_prefix(later, 1000, promoted, 900)
    assert (fence.keep, fence.dropped, fence.refusal, fence.superseded) == (650, 250, None, 0)


def test_logs_with_no_shared_epoch_are_never_mixed():
    refusal = common_prefix([Epoch(0, 0, A)], 900, [Epoch(0, 0, B)], 100).refusal
    assert "shares no epoch" in refusal
    assert common_prefix([Epoch(0, 0, A)], 900, [], 0).keep == 0  # an empty follower takes everything
    assert common_prefix([Epoch(0, 0, A), Epoch(1, 50, B)], 900, [Epoch(1, 60, B)], 100).refusal


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 10_000))
def test_the_kept_prefix_is_never_past_either_log_or_the_promotion(promoted, master_end, follower_end):
    master = [Epoch(0, 0, A), Epoch(1, promoted, B)]
    master_end = max(master_end, promoted)
    fence = common_prefix(master, master_end, [Epoch(0, 0, A)], follower_end)
    assert fence.keep <= min(follower_end, promoted, master_end) or follower_end == 0
    assert fence.keep + fence.dropped == follower_end


def test_a_peers_epoch_list_is_checked():
    assert from_wire([[0, 0, A], [1, 5, B]]) == [Epoch(0, 0, A), Epoch(1, 5, B)]
    for bad in ("x", [[0, 0]], [[0, "0", A]], [[1, 0, A], [0, 5, B]]):
        with pytest.raises(ValueError):
            from_wire(bad)


# -- the link's sessions ------------------------------------------------------------------------------


@pytest.fixture
def settings(tmp_path):
    return small_settings(tmp_path / "store", haTransferBatchSize=1000, haSendHeartbeatInterval=5000,
                          haHousekeepingInterval=20000)


def _hello(broker_id=1, max_offset=0, epochs=((0, 0, A),)):
    return orjson.dumps({"brokerId": broker_id, "maxOffset": max_offset, "epochs": [list(e) for e in epochs],
                         "endpoint": "tcp://127.0.0.1:1"})


def test_a_master_session_sends_within_segments_batches_and_the_window(settings):
    session = MasterSession(settings, 0, handshake=True)
    welcome = session.on_hello(_hello(max_offset=100), [Epoch(0, 0, A)], 200_000, 0)
    assert welcome[:1] == ha_link.WELCOME and orjson.loads(welcome[1:])["keep"] == 100
    transfers = []
    for _ in range(300):
        transfer = session.next_transfer(200_000, 0, 0)
        if transfer is None:
            break
        transfers.append(transfer)
    segment = settings.mappedFileSizeCommitLog
    assert transfers[0].offset == 100 and all(t.size <= 1000 for t in transfers)
    assert all(t.offset // segment == (t.offset + t.size - 1) // segment for t in transfers)  # never across
    assert sum(t.size for t in transfers) == 200_000 - 100  # (the window is 8 MiB)
    session.on_report(50_000, 200_000, 1)
    assert session.acked == 50_000 and session.lag_ms(200_000, 1) >= 0
    with pytest.raises(LinkError, match="past the master's end"):
        session.on_report(200_001, 200_000, 2)


def test_a_master_session_refuses_what_it_cannot_serve(settings):
    with pytest.raises(LinkError, match="malformed"):
        MasterSession(settings, 0, handshake=True).on_hello(b"\xff garbage", [Epoch(0, 0, A)], 10, 0)
    with pytest.raises(LinkError, match="drop 1 bytes past 10"):  # past the master's end
        MasterSession(settings, 0, handshake=True).on_hello(_hello(max_offset=11), [Epoch(0, 0, A)], 10, 0)
    with pytest.raises(LinkError, match="shares no epoch"):
        MasterSession(settings, 0, handshake=True).on_hello(_hello(max_offset=5, epochs=((0, 0, B),)),
                                                            [Epoch(0, 0, A)], 10, 0)
    with pytest.raises(LinkError, match="drop 3 bytes"):
        MasterSession(settings, 0, handshake=True).on_hello(_hello(max_offset=8), [Epoch(0, 0, A), Epoch(1, 5, B)],
                                                            10, 0)
    with pytest.raises(LinkError, match="before the hello"):
        MasterSession(settings, 0, handshake=True).on_report(0, 10, 0)


def test_only_a_refusal_that_a_cut_mends_asks_the_slaves_node_to_restart(settings):
    """The ha-client ends its node (node.server.fencing.pending) on `cut_asked`: a log with bytes
    past the common history; never on a refusal that a cut would not mend."""
    def refusal(hello, master_epochs, master_end) -> str:
        with pytest.raises(LinkError) as refused:
            MasterSession(settings, 0, handshake=True).on_hello(hello, master_epochs, master_end, 0)
        return str(refused.value)
    assert ha_link.cut_asked(refusal(_hello(max_offset=8), [Epoch(0, 0, A), Epoch(1, 5, B)], 10)) == (3, 5)
    assert ha_link.cut_asked(refusal(_hello(max_offset=11), [Epoch(0, 0, A)], 10)) == (1, 10)
    assert ha_link.cut_asked(refusal(_hello(max_offset=5, epochs=((0, 0, B),)), [Epoch(0, 0, A)], 10)) is None
    promoted = refusal(_hello(max_offset=900, epochs=((0, 0, A), (1, 700, C))), [Epoch(0, 0, A)], 600)
    assert promoted.startswith(ha_link.DIVERGED) and ha_link.cut_asked(promoted) is None  # (an old master: said only)
    assert ha_link.cut_asked("the master refused: a second hello on one link") is None


def test_the_rocketmq_link_starts_an_empty_slave_at_the_last_segment_and_heartbeats(settings):
    segment = settings.mappedFileSizeCommitLog
    session = MasterSession(settings, 0, handshake=False)
    assert session.next_transfer(3 * segment + 10, 0, 0) is None  # nothing before the first report
    session.on_report(0, 3 * segment + 10, 0)
    assert session.next_transfer(3 * segment + 10, 0, 0) == ha_link.Transfer(3 * segment, 10)
    assert session.next_transfer(3 * segment + 10, 0, 10) is None
    assert session.next_transfer(3 * segment + 10, 0, 5000) == ha_link.Transfer(3 * segment + 10, 0)  # heartbeat
    assert session.expired(20_001) and not session.expired(20_000)


def test_only_a_slave_whose_hello_asks_for_it_gets_the_pop_log(settings):
    """An mqnode slave's hello asks for the pop log's copy (`popLog`); a slave written from the
    protocol before it (or elsewhere) gets no b"Q" item it does not know."""
    hello = SlaveSession(settings, 0, 0, handshake=True).hello(1, [Epoch(0, 0, A)], "tcp://127.0.0.1:1")
    asking, plain = MasterSession(settings, 0, handshake=True), MasterSession(settings, 0, handshake=True)
    asking.on_hello(hello[1:], [Epoch(0, 0, A)], 0, 0)
    plain.on_hello(_hello(), [Epoch(0, 0, A)], 0, 0)
    assert asking.pop_log and not plain.pop_log


def test_a_slave_session_checks_each_transfer_lands_at_its_end(settings):
    slave = SlaveSession(settings, 100, 0, handshake=True)
    assert not slave.report_due(0)  # nothing before the welcome
    with pytest.raises(LinkError, match="before the welcome"):
        slave.on_data(100, 5, 0)
    slave.on_welcome(orjson.dumps({"epochs": [[0, 0, A]], "maxOffset": 500, "keep": 100}), 0)
    assert slave.report_due(0) and slave.report(0) == REPORT.pack(100) and not slave.report_due(1)
    assert slave.on_data(100, 5, 1) and not slave.on_data(105, 0, 1)
    with pytest.raises(LinkError, match="this log ends at 100"):
        slave.on_data(99, 5, 1)
    slave.appended(105)
    assert slave.report_due(2) and slave.report_due(5000)
    cut = SlaveSession(settings, 100, 0, handshake=True)
    with pytest.raises(LinkError, match="only below 80"):
        cut.on_welcome(orjson.dumps({"epochs": [[0, 0, A]], "maxOffset": 80, "keep": 80}), 0)


def test_the_rocketmq_byte_stream_is_cut_into_reports_and_transfers():
    decoder = StreamDecoder()
    decoder.feed(REPORT.pack(7) + REPORT.pack(9)[:5])
    assert decoder.reports() == [7]
    decoder.feed(REPORT.pack(9)[5:])
    assert decoder.reports() == [9]
    stream = HEADER.pack(100, 3) + b"abc" + HEADER.pack(103, 0) + HEADER.pack(103, 2) + b"d"
    decoder = StreamDecoder()
    decoder.feed(stream)
    assert decoder.transfers() == [(100, b"abc"), (103, b"")]
    decoder.feed(b"e")
    assert decoder.transfers() == [(103, b"de")]
    decoder.feed(HEADER.pack(0, -1))
    with pytest.raises(LinkError, match="-1 bytes"):
        decoder.transfers()


# -- the follower's log ----------------------------------------------------------------------------------


def _master_log(tmp_path, count=40):
    settings = small_settings(tmp_path / "master")
    store = open_store(settings)
    put(store, [message(i) for i in range(count)])
    end = store.commitlog.offset_written
    data = b"".join(bytes(s.map[: s.position_written]) for s in store.commitlog.segments.files)
    store.close()
    return data, end


def _follower(tmp_path):
    settings = small_settings(tmp_path / "slave")
    settings.root.mkdir(parents=True)
    control = ControlBlock(settings.root / "control", create=True)
    control.publish_recovered(written=0, flushed=0, dispatched=0, min_offset=0)
    return Follower(settings, control), control


def test_the_follower_publishes_only_whole_records_and_ends_byte_identical(tmp_path):
    data, end = _master_log(tmp_path, 120)  # crosses segments, with their blank ends
    follower, control = _follower(tmp_path)
    published = []
    for at in range(0, len(data), 777):  # transfers that cut records anywhere
        follower.append(at, data[at: at + 777])
        follower.publish()
        published.append(control.get("written"))
    assert published == sorted(published) and published[-1] == end == follower.end
    assert all(p <= a for p, a in zip(published, range(777, len(data) + 777, 777)))
    copy = b"".join(bytes(s.map[: s.position_written]) for s in follower.log.segments.files)
    assert copy == data
    follower.close()


def test_the_follower_drops_garbage_and_keeps_exactly_the_records_before_it(tmp_path):
    data, _ = _master_log(tmp_path, 10)
    follower, control = _follower(tmp_path)
    follower.append(0, data[:1000])
    follower.publish()
    kept = control.get("written")
    whole = kept + int.from_bytes(data[kept: kept + 4], "big")  # the end of the next record
    follower.append(1000, data[1000: whole] + b"\x00" * 100)  # that record, then zeros
    with pytest.raises(LinkError, match="no record header"):
        follower.publish()
    assert follower.end == control.get("written") == whole  # the whole records stay, the garbage goes
    assert bytes(follower.log.segments.files[0].map[whole: whole + 200]) == bytes(200)
    follower.append(follower.end, data[follower.end:])  # following resumes from the last whole record
    follower.publish()
    assert bytes(follower.log.segments.files[0].map[: len(data)]) == data
    follower.close()


def test_admin_ha_shows_a_slaves_epoch_as_its_follower_adopted_it(tmp_path):
    """A slave's ha-server, idle, read the epoch file at its start; the ha-client adopts its
    master's history later (a master not up at the slave's start): admin ha shows the latter."""
    from nodes import node_settings

    from actors.ha_status import ha_status
    from shm.control_block import ROLE_CODES, ControlBlock

    settings = node_settings(tmp_path / "store")
    settings.root.mkdir(parents=True)
    control = ControlBlock(settings.root / "control", create=True)
    stats = {"ha-server": {"epoch": 0}, "ha-client": {"epoch": 2}}
    control.set("role", ROLE_CODES["SLAVE"])
    assert ha_status(settings, control, stats)["epoch"] == 2
    control.set("role", ROLE_CODES["ASYNC_MASTER"])  # (promoted: its ha-server began the next epoch)
    assert ha_status(settings, control, {"ha-server": {"epoch": 3}, "ha-client": {"epoch": 2}})["epoch"] == 3
    control.close()
