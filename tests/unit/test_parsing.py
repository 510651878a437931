"""streaming.ingest.parsing without Spark: decoding (bulk and value by value agree), what a bad value
becomes, the derived partition-count-change rows, and the gate's reasons merged in."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from monitor.contract import (Event, GroupOffsets, Heartbeat, MetadataRefresh, PartitionCountChange,
                              PartitionMetadata, PartitionOffsets)
from streaming.ingest import parsing
from streaming.ingest.schema import FLAT_COLUMNS


def ev(data, seq: int = 1, **kw) -> dict:
    return Event.of(data, cluster="c1", source="p1", seq=seq, observed_at=1_000 + seq, **kw).to_dict()


def offsets(seq: int = 1, **kw) -> dict:
    return ev(PartitionOffsets(topic="t", partition=2, high_watermark=50, via="list_offsets", **kw), seq)


def metadata(seq: int = 1, **kw) -> dict:
    base = dict(topic="t", partition=2, leader=1, replicas=[1, 2], isr=[1, 2], metadata_version=1)
    return ev(PartitionMetadata(**{**base, **kw}), seq)


def with_data(d: dict, **kw) -> dict:
    return {**d, "data": {**d["data"], **kw}}


def rows(values: list, gate: bool = False) -> list[dict]:
    return parsing.parse_values(pa.array([v if v is None or isinstance(v, str) else json.dumps(v) for v in values],
                                         pa.string()), gate=gate).to_pylist()


def one(value, gate: bool = False) -> dict:
    (r,) = rows([value], gate)
    return r


def test_output_columns_are_the_flat_columns():
    out = parsing.parse_values(pa.array([json.dumps(offsets())]), gate=False)
    assert out.schema.names == [n for n, _ in FLAT_COLUMNS]


def test_a_good_event_becomes_a_keyed_flat_row_without_its_raw_text():
    r = one(offsets(metadata_at=900))
    assert (r["reason"], r["raw"], r["type"], r["entity"], r["bucket_key"]) == (
        None, None, "partition_offsets", "partition|c1/t/2", "c1/t/2")
    assert (r["topic"], r["partition"], r["high_watermark"], r["metadata_at"], r["seq"], r["observed_at"]) == (
        "t", 2, 50, 900, 1, 1_001)
    g = one(ev(GroupOffsets(group="g", topic="t", partition=2, committed_offset=7, high_watermark=9)))
    assert (g["entity"], g["bucket_key"], g["committed_offset"]) == ("group_partition|c1/g/t/2", "c1/g", 7)
    h = one(ev(Heartbeat(interval_ms=5_000, events_sent=3, events_dropped=0)))
    assert (h["entity"], h["bucket_key"], h["interval_ms"]) == ("source|c1/p1", "c1/p1", 5_000)


@pytest.mark.parametrize("value, reason", [
    ("{not json", "malformed_json"),
    ("null", "malformed_json"),          # pyarrow 26's JSON reader crashes on a block starting with null
    ("[1, 2]", "malformed_json"),
    ("", "malformed_json"),
    (None, "malformed_json"),
    ('{"a": 1} {"b": 2}', "malformed_json"),  # two objects in one value
    pytest.param(json.dumps(offsets()) + " xx", "malformed_json", id="an-event-then-junk"),  # its event_id is random
    (json.dumps({}), "malformed_json"),      # neither schema nor type
    ('{"data":' + "[" * 30_000 + "]" * 30_000 + "}", "malformed_json"),  # deeper than json.loads goes
    ({**offsets(), "schema": "kafka-monitor/v9"}, "unknown_schema"),
    ({k: v for k, v in offsets().items() if k != "schema"}, "unknown_schema"),
    ({**offsets(), "type": "gossip"}, "unknown_type"),
    ({**offsets(), "type": 5}, "unknown_type"),
    ({k: v for k, v in offsets().items() if k != "event_id"}, "missing_envelope"),
    ({**offsets(), "seq": "7"}, "missing_envelope"),     # wrong type -> null
    ({**offsets(), "seq": True}, "missing_envelope"),
    ({**offsets(), "seq": 2 ** 70}, "missing_envelope"),  # beyond int64
    (with_data(offsets(), high_watermark=None), "missing_field"),
    (with_data(offsets(), high_watermark=1.5), "missing_field"),
    (with_data(offsets(), high_watermark=10.0), "missing_field"),
    (with_data(offsets(), high_watermark="12"), "missing_field"),
    (with_data(offsets(), topic=5), "missing_field"),
    ({**offsets(), "data": "x"}, "missing_field"),
    ({**offsets(), "data": None}, "missing_field"),
    (with_data(metadata(), isr=[1, "a"]), "missing_field"),  # one wrong element: the array is null
    (with_data(metadata(), isr="1,2"), "missing_field"),
    (with_data(offsets(), partition=-1), "out_of_range"),
    (with_data(offsets(), high_watermark=-5), "out_of_range"),
    # beyond 2**53: the state function gets nullable longs as float64 (2**63 - 1 once crashed it)
    (with_data(offsets(), high_watermark=2 ** 63 - 1), "out_of_range"),
    (with_data(offsets(), log_start_offset=2 ** 53), "out_of_range"),
    ({**offsets(), "seq": -(2 ** 53)}, "out_of_range"),
    (with_data(metadata(), replicas=[1, 2 ** 60]), "out_of_range"),
])
def test_bad_values_get_a_reason_and_keep_their_raw_text(value, reason):
    r = one(value)
    assert r["reason"] == reason
    text = value if value is None or isinstance(value, str) else json.dumps(value)
    # a sample of the text (the first RAW_SAMPLE_CHARS characters) and the size of all of it
    assert r["raw"] == (None if text is None else text[:parsing.RAW_SAMPLE_CHARS])
    assert r["raw_bytes"] == (None if text is None else len(text.encode()))


def test_tolerated_variations():
    # unknown fields (envelope and payload, nested too) are ignored; a JSON number is a double
    r = one({**with_data(offsets(), future={"x": [1, "y"]}, via="fetch"), "later": 1})
    assert r["reason"] is None and r["high_watermark"] == 50
    assert one(with_data(offsets(), high_watermark=50))["reason"] is None
    r = one(ev(MetadataRefresh(version=3, reason="periodic", ok=True, duration_ms=1.0)))
    assert (r["reason"], r["refresh_reason"], r["ok"], r["version"]) == (None, "periodic", True, 3)
    r = one(json.dumps(offsets(), indent=2))  # a line break inside a value: decoded on its own
    assert r["reason"] is None and r["high_watermark"] == 50
    r = one(with_data(metadata(), isr=[1, None]))  # a null broker id is the gate's to refuse
    assert r["reason"] is None and r["isr"] == [1, None]


def _mutants(n: int, seed: int) -> list[str]:
    good = [json.dumps(offsets(i)) for i in range(20)] + [json.dumps(metadata(i)) for i in range(20)]
    toks = ["null", "{", "}", "[", "]", ",", ":", '"', "1", "-1", "true", "1.5", " ", "{}", '"x"']
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        v = list(rnd.choice(good))
        for _ in range(rnd.randint(0, 2)):
            i = rnd.randrange(len(v))
            v[i:i + rnd.randint(0, 3)] = rnd.choice(toks)
        out.append("".join(v))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_block_decodes_like_its_values_one_by_one(seed):
    """A failing block is split until its bad values are alone: the rows are the same as when
    every value is decoded by itself (and no good value is lost to a bad neighbour)."""
    values = _mutants(300, seed)
    together = rows(values)
    alone = [one(v) for v in values]
    assert len(together) == len(values)
    assert together == alone
    assert sum(r["reason"] is None for r in together) > 50  # the test mixes good and bad


def test_partition_count_changes_become_rows_keyed_by_topic():
    two = [PartitionCountChange(topic="orders", old_count=3, new_count=6, unseen_for_at_most_ms=10_000),
           PartitionCountChange(topic="pay", old_count=1, new_count=2)]
    refresh = ev(MetadataRefresh(version=3, reason="periodic", ok=True, duration_ms=1.0, partition_count_changes=two))
    broken = with_data(refresh, partition_count_changes=[{"topic": None, "old_count": 1, "new_count": 2}])
    refused = with_data(refresh, ok=None)  # a refused refresh derives nothing
    got = rows([refresh, broken, refused])
    assert [(r["type"], r["reason"], r["entity"], r["topic"], r["old_count"], r["new_count"], r["unseen_for_at_most_ms"])
            for r in got] == [
        ("metadata_refresh", None, "client|c1/p1", None, None, None, None),
        ("metadata_refresh", None, "client|c1/p1", None, None, None, None),
        ("metadata_refresh", "missing_field", "client|c1/p1", None, None, None, None),
        ("partition_count_change", None, "topic|c1/orders", "orders", 3, 6, 10_000),
        ("partition_count_change", None, "topic|c1/pay", "pay", 1, 2, None),
        ("partition_count_change", "missing_field", None, None, 1, 2, None),
    ]
    assert got[4]["bucket_key"] == "c1/pay" and got[4]["seq"] == got[0]["seq"] and got[4]["raw"] is None
    assert got[5]["raw"] == json.dumps(broken)  # the bad change keeps its event's text


def test_the_gate_runs_on_the_decoded_rows():
    values = [metadata(1), metadata(2, isr=[1, 4]), offsets(3), with_data(offsets(4), high_watermark=-1)]
    got = [r["reason"] for r in rows(values, gate=True)]
    # decoding's own reason (out_of_range) wins over the gate's (offset_sentinel)
    assert got == [None, "isr_subset_of_replicas", None, "out_of_range"]
    assert rows(values, gate=False)[1]["reason"] is None
    assert rows(values, gate=True)[1]["raw"] == json.dumps(values[1])


def test_parse_batches_validates_a_task_in_chunks():
    values = [json.dumps(offsets(i)) for i in range(25)]
    batches = [pa.RecordBatch.from_pydict({"value": values[i:i + 10]}) for i in range(0, 25, 10)]
    out = list(parsing.parse_batches(iter(batches)))
    assert sum(b.num_rows for b in out) == 25
    assert [r["seq"] for b in out for r in b.to_pylist()] == list(range(25))


def test_the_per_value_decoder_agrees_with_pyarrow_on_good_events():
    """The two decoders (pyarrow.json for blocks, json.loads + coercion for values it refused)
    give the same row for every event type."""
    two = [PartitionCountChange(topic="orders", old_count=3, new_count=6)]
    values = [json.dumps(v) for v in (
        offsets(1, metadata_at=5), metadata(2, offline_replicas=[2], min_insync_replicas=2),
        ev(GroupOffsets(group="g", topic="t", partition=2, committed_offset=7, high_watermark=9)),
        ev(Heartbeat(interval_ms=5_000, events_sent=3, events_dropped=0)),
        ev(MetadataRefresh(version=3, reason="periodic", ok=True, duration_ms=1.5, partition_count_changes=two)))]
    for v in values:
        for schema in (parsing.EVENT_ARROW, parsing.EVENTS_ARROW):
            by_arrow = parsing._bulk([v], schema)
            assert by_arrow is not None, v
            assert by_arrow.to_pylist() == [parsing.decode_one(v, schema)], v


def test_bytes_that_are_not_utf8_are_replaced_not_fatal():
    """Spark's cast of a binary Kafka value to string passes invalid UTF-8 through; converting
    such a string to Python raises.  The bad bytes become U+FFFD (as in our source), the event
    is still decoded, and its raw text is valid for the quarantine sink."""
    good = json.dumps(offsets()).encode()
    bad = b'{"not": "\xff\xfe utf-8"'
    as_binary = pa.array([good, bad], pa.binary())
    unchecked = pa.Array.from_buffers(pa.string(), 2, as_binary.buffers())  # what Spark hands over
    for values in (unchecked, as_binary):
        got = parsing.parse_values(values, gate=False).to_pylist()
        assert [r["reason"] for r in got] == [None, "malformed_json"]
        assert got[0]["high_watermark"] == 50
        assert got[1]["raw"] == '{"not": "\ufffd\ufffd utf-8"'


# ---------------------------------------------------------------------------------------------
# What a record can make the job keep (issue 19)
# ---------------------------------------------------------------------------------------------


def parsed(values: list, timestamps=None, limits=parsing.LIMITS, gate: bool = False) -> list[dict]:
    arr = pa.array([v if v is None or isinstance(v, (str, bytes)) else json.dumps(v) for v in values])
    ts = None if timestamps is None else pa.array(timestamps, pa.int64())
    return parsing.parse_values(arr, gate=gate, timestamps=ts, limits=limits).to_pylist()


def test_an_oversized_value_is_refused_before_decoding_with_a_sample_and_its_size():
    blob = "x" * 100_000
    big_event = json.dumps(with_data(offsets(), future=blob))  # a good event but for its size
    garbage = b"\xff" * 70_000                                 # not even UTF-8
    small = json.dumps(with_data(offsets(), future="x" * 50_000))  # under the limit: good, extra field dropped
    got = parsed([big_event, garbage, small])
    assert [r["reason"] for r in got] == ["oversized", "oversized", None]
    assert got[0]["raw"] == big_event[:parsing.RAW_SAMPLE_CHARS] and got[0]["raw_bytes"] == len(big_event)
    assert got[1]["raw"] == "\ufffd" * parsing.RAW_SAMPLE_CHARS and got[1]["raw_bytes"] == 70_000
    assert got[0]["type"] is None and got[0]["entity"] is None  # not decoded at all
    assert got[2]["high_watermark"] == 50 and got[2]["raw"] is None and got[2]["raw_bytes"] is None
    # the limit is a setting; exactly at it is fine
    at = parsing.Limits(max_event_bytes=len(big_event))
    assert parsed([big_event], limits=at)[0]["reason"] is None


def test_refused_rows_keep_bounded_samples():
    long_bad = json.dumps(with_data(offsets(), high_watermark=-5, junk="j" * 10_000))
    r = parsed([long_bad])[0]
    assert r["reason"] == "out_of_range"
    assert r["raw"] == long_bad[:parsing.RAW_SAMPLE_CHARS] and r["raw_bytes"] == len(long_bad)
    many = parsed(["{bad"] * (parsing.RAW_SAMPLES_PER_CHUNK + 5))
    assert all(r["reason"] == "malformed_json" and r["raw_bytes"] == 4 for r in many)
    assert sum(r["raw"] is not None for r in many) == parsing.RAW_SAMPLES_PER_CHUNK


def test_identifiers_over_the_cap_are_refused_and_free_text_is_cut():
    n = parsing.MAX_STRING_CHARS
    assert parsed([with_data(offsets(), topic="t" * n)])[0]["reason"] is None
    for value in (with_data(offsets(), topic="t" * (n + 1)), {**offsets(), "cluster": "c" * (n + 1)},
                  {**offsets(), "source": "é" * (n + 1)}, {**offsets(), "event_id": "e" * (n + 1)},
                  ev(GroupOffsets(group="g" * (n + 1), topic="t", partition=0, committed_offset=1, high_watermark=2)),
                  ev(MetadataRefresh(version=1, reason="r" * (n + 1), ok=True, duration_ms=1.0))):
        assert parsed([value])[0]["reason"] == "field_too_long", value
    r = parsed([ev(MetadataRefresh(version=1, reason="periodic", ok=False, duration_ms=1.0, error="e" * 50_000,
                                   cause="c" * 5_000))])[0]
    assert r["reason"] is None and r["error"] == "e" * n and r["cause"] == "c" * n
    # a partition-count change whose topic is too long is refused on its own row
    two = [PartitionCountChange(topic="o" * (n + 1), old_count=1, new_count=2), PartitionCountChange(topic="ok", old_count=1, new_count=2)]
    got = parsed([ev(MetadataRefresh(version=1, reason="periodic", ok=True, duration_ms=1.0, partition_count_changes=two))])
    assert [(r["type"], r["reason"]) for r in got] == [("metadata_refresh", None), ("partition_count_change", "field_too_long"),
                                                       ("partition_count_change", None)]


def test_event_time_is_checked_against_the_record_timestamp():
    skew = parsing.LIMITS.max_clock_skew_ms
    t = 1_700_000_000_000
    e = lambda at: {**offsets(), "observed_at": at}  # noqa: E731
    values = [e(t), e(t + skew), e(t + skew + 1), e(t - skew), e(t - skew - 1), e(1000), e(t + 86_400_000),
              e(t), e(t)]
    stamps = [t, t, t, t, t, t, t, None, -1]  # no timestamp, or Kafka's "none": not checked
    got = [r["reason"] for r in parsed(values, stamps)]
    assert got == [None, None, "event_time_ahead", None, "event_time_behind", "event_time_behind", "event_time_ahead",
                   None, None]
    assert [r["reason"] for r in parsed(values, stamps, limits=parsing.Limits(max_clock_skew_ms=0))] == [None] * 9
    assert [r["reason"] for r in parsed([e(t + 10 ** 15), e(-(10 ** 15))], [t, t])] == [
        "event_time_ahead", "event_time_behind"]
    # the gate's fixed bounds still apply, and decoding's reasons come first
    assert [r["reason"] for r in parsed([e(0), with_data(e(t + 10 * skew), partition=-1)], [0, t], gate=True)] == [
        "observed_at_in_range", "out_of_range"]


def test_parse_batches_chunks_by_bytes_and_passes_timestamps(monkeypatch):
    monkeypatch.setattr(parsing, "MAX_BYTES_PER_CHUNK", 2_000)
    calls = []
    real = parsing.parse_pieces
    monkeypatch.setattr(parsing, "parse_pieces", lambda v, **kw: calls.append(len(v)) or real(v, **kw))
    t = 1_700_000_000_000
    values = [json.dumps({**offsets(i), "observed_at": t + (0 if i % 2 else 10 ** 9)}) for i in range(30)]
    batches = [pa.RecordBatch.from_pydict({"value": values[i:i + 5], "timestamp": [t] * 5}) for i in range(0, 30, 5)]
    out = [r for b in parsing.parse_batches(iter(batches)) for r in b.to_pylist()]
    assert len(calls) > 1 and sum(calls) == 30  # several chunks
    assert [r["reason"] for r in out] == [None if i % 2 else "event_time_ahead" for i in range(30)]


def test_reasons_are_listed_once_for_the_exporter():
    from streaming.sinks import catalogue
    from streaming.ingest import quality
    assert catalogue.QUARANTINE_REASONS == parsing.REASONS + tuple(quality.RULES)


def test_group_state_rows_carry_a_fingerprint_of_members_and_assignments():
    from monitor.contract import GroupMember, GroupState

    def gs(*members):
        return ev(GroupState(group="g", state="Stable", members=[GroupMember(member_id=m, assignment=list(a))
                                                                   for m, a in members]))
    a = one(gs(("m1", ["t/0", "t/1"]), ("m2", ["t/2"])))
    assert a["members"] == 2 and a["members_sig"]
    same = one(gs(("m2", ["t/2"]), ("m1", ["t/1", "t/0"])))  # order does not matter
    assert same["members_sig"] == a["members_sig"]
    assert one(gs(("m1", ["t/0", "t/1"]), ("m3", ["t/2"])))["members_sig"] != a["members_sig"]  # another member
    assert one(gs(("m1", ["t/0"]), ("m2", ["t/1", "t/2"])))["members_sig"] != a["members_sig"]  # reassigned
    assert one(offsets())["members_sig"] is None  # other types: none


def test_a_consumers_fetch_report_is_keyed_by_its_group_partition_and_keeps_its_fields():
    from monitor.contract import ClientFetch
    r = one(ev(ClientFetch(group="g", topic="t", partition=3, fetch_state="active", position=40, committed=38,
                           high_watermark=50, last_stable_offset=50, log_start_offset=0, consumer_lag=12,
                           leader=1, leader_epoch=2), seq=7), gate=True)
    assert r["reason"] is None
    assert (r["entity"], r["bucket_key"]) == ("client_fetch|c1/g/t/3", "c1/g")  # the bucket of its group
    assert (r["fetch_state"], r["position"], r["committed"], r["consumer_lag"]) == ("active", 40, 38, 12)
    assert (r["high_watermark"], r["last_stable_offset"], r["leader"]) == (50, 50, 1)
    no_partition = with_data(ev(ClientFetch(group="g", topic="t", partition=3), seq=8), partition=None)
    assert one(no_partition)["reason"] == "missing_field"


def test_a_canary_report_shares_its_partitions_bucket_and_keeps_its_counters_as_json():
    from monitor.canary import CanaryStats
    stats = CanaryStats(b"run-0001", 30.0)
    seq, value = stats.next_record(2)
    stats.on_delivery(2, seq, None, 0.004)
    stats.on_record(2, value)
    stats.on_delivery(2, stats.next_record(2)[0], "NOT_ENOUGH_REPLICAS")
    (report,) = stats.reports("t", 1_700_000_000_000)
    r = one(ev(report, seq=9), gate=True)
    assert r["reason"] is None
    assert (r["entity"], r["bucket_key"], r["leader"]) == ("canary|c1/t/2", "c1/t/2", None)  # the partition's bucket
    rep = json.loads(r["report"])
    assert (rep["sent"], rep["acked"], rep["received"], rep["pending"], rep["errors"]) == (
        2, 1, 1, 0, {"NOT_ENOUGH_REPLICAS": 1})
    assert sum(rep["produce_latency_counts"]) == 1 and rep["started_at"] == 1_700_000_000_000
    # error codes become label values: bounded in number and length
    d = ev(report, seq=10)
    d["data"]["errors"] = [{"code": f"E{i}" + "x" * 100, "count": 1} for i in range(40)]
    errors = json.loads(one(d)["report"])["errors"]
    assert len(errors) == parsing.CANARY_MAX_CODES and all(len(c) == parsing.CANARY_CODE_CHARS for c in errors)
    assert one(with_data(ev(report, seq=11), started_at=None))["reason"] == "missing_field"


def test_a_client_produce_report_carries_its_deliveries_and_their_errors_by_code():
    from monitor.contract import ClientProduce, DeliveryErrorCount
    r = one(ev(ClientProduce(topic="t", partition=2, leader=1, in_flight_messages=4, delivered_messages=9,
                             delivery_errors=[DeliveryErrorCount(code="NOT_ENOUGH_REPLICAS", count=2)],
                             delivery_latency_counts=[0] * 13 + [9], delivery_latency_sum_ms=320000.0)))
    assert r["reason"] is None and r["entity"] == "client_produce|c1/p1/t/2"
    rep = json.loads(r["report"])
    assert (rep["in_flight_messages"], rep["delivered_messages"], rep["delivery_errors"]) == (
        4, 9, {"NOT_ENOUGH_REPLICAS": 2})
    assert rep["delivery_latency_counts"][-1] == 9 and rep["delivery_latency_sum_ms"] == 320000.0


def test_a_broker_state_is_keyed_by_its_broker_and_keeps_its_counts():
    from monitor.contract import BrokerState
    r = one(ev(BrokerState(node_id=3, registered=False, metadata_version=4, leader_partitions=0,
                           replica_partitions=12, out_of_sync_replicas=12), seq=5), gate=True)
    assert r["reason"] is None
    assert (r["entity"], r["bucket_key"]) == ("broker|c1/broker/3", "c1/broker/3")
    assert (r["node_id"], r["registered"], r["replica_partitions"], r["out_of_sync_replicas"]) == (3, False, 12, 12)
    assert json.loads(r["report"]) == {"writes_waiting_since": None, "writes_waiting_partitions": None}
    r = one(ev(BrokerState(node_id=2, registered=True, metadata_version=4, leader_partitions=1, replica_partitions=2,
                           out_of_sync_replicas=0, writes_waiting_since=1_700_000_000_000, writes_waiting_partitions=2)))
    assert json.loads(r["report"]) == {"writes_waiting_since": 1_700_000_000_000, "writes_waiting_partitions": 2}
    d = ev(BrokerState(node_id=3, registered=True, metadata_version=4, leader_partitions=1, replica_partitions=2,
                       out_of_sync_replicas=0), seq=6)
    del d["data"]["registered"]
    assert one(d)["reason"] == "missing_field"
