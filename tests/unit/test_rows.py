"""Contract v3's ``rows``: one record standing for several events of one type.  The contract's
Python side (batch, expand, from_json, key) and the job's parsing: a v3 record's events become the
same flat rows as the v1/v2 events it stands for; a malformed one is refused whole, with a reason."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from monitor import contract
from monitor.contract import (ContractError, Event, GroupMember, GroupOffsets, GroupState, MetadataRefresh,
                              PartitionCountChange, PartitionMetadata, PartitionOffsets)
from streaming.ingest import parsing

ENV = dict(cluster="c1", source="p1", observed_at=1_700_000_000_000)
#: columns a v3 record's events share with their record, not with the v1 events they stand for
PER_RECORD = ("event_id", "seq", "raw", "raw_bytes")


def offsets(i: int, **kw) -> PartitionOffsets:
    return PartitionOffsets(**{**dict(topic="orders", partition=i, high_watermark=100 + i, via="list_offsets",
                                      log_start_offset=0, metadata_at=5), **kw})


def metadata(i: int) -> PartitionMetadata:
    return PartitionMetadata(topic="orders", partition=i, leader=1 + i % 3, replicas=[1, 2, 3],
                             isr=[1, 2, 3] if i % 2 else [1, 2], metadata_version=4, min_insync_replicas=2)


def group(i: int) -> GroupOffsets:
    return GroupOffsets(group="g", topic="orders", partition=i, committed_offset=10 * i, high_watermark=10 * i + 3)


def parse(values: list, gate: bool = True) -> list[dict]:
    texts = [v if isinstance(v, str) else (v.to_json().decode() if isinstance(v, Event) else json.dumps(v))
             for v in values]
    return parsing.parse_values(pa.array(texts, pa.string()), gate=gate,
                                timestamps=pa.array([ENV["observed_at"]] * len(texts))).to_pylist()


def strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in PER_RECORD} for r in rows]


# ---------------------------------------------------------------------------------------------
# The contract
# ---------------------------------------------------------------------------------------------


def test_batch_lists_only_the_fields_that_differ_and_expands_back():
    ps = [offsets(i) for i in range(4)]
    e = Event.batch(ps, seq=7, **ENV)
    d = e.to_dict()
    assert d["schema"] == contract.SCHEMA_V3 and set(d["rows"]) == {"partition", "high_watermark"}
    assert d["data"] == contract._fields(ps[0])
    assert [x.data for x in e.expand()] == ps
    assert {(x.event_id, x.seq, x.schema, x.rows) for x in e.expand()} == {(e.event_id, 7, contract.SCHEMA_V3, None)}
    assert Event.from_json(e.to_json()) == e
    assert e.key() == "c1/orders"  # the key's fields not in rows
    assert Event.batch([offsets(3)], seq=1, **ENV).expand()[0].data == offsets(3)


def test_nested_values_round_trip():
    gs = [GroupState(group=f"g{i}", state="Stable", generation=i, members=[GroupMember(member_id=f"m{i}")])
          for i in range(2)]
    e = Event.batch(gs, seq=1, **ENV)
    assert set(e.rows or {}) == {"group", "generation", "members"}
    back = Event.from_json(e.to_json())
    assert [x.data for x in back.expand()] == gs


@pytest.mark.parametrize("rows, code", [
    ({"partition": [0, 1], "high_watermark": [5]}, "missing_field"),
    ({}, "missing_field"),
    ({"partition": 3}, "missing_field"),
    ({"nope": [1]}, "unknown_field"),
    ({"partition": [0, "x"]}, "wrong_type"),
    ({"partition": [1, 2]}, "wrong_value"),  # the first values are data's
    ({"partition": list(range(contract.MAX_ROWS_PER_RECORD + 1))}, "out_of_range"),
])
def test_from_json_refuses_bad_rows(rows, code):
    d = Event.batch([offsets(0), offsets(1)], seq=1, **ENV).to_dict()
    d["rows"] = rows
    with pytest.raises(ContractError) as err:
        Event.from_dict(d)
    assert err.value.reason == code


def test_rows_are_v3_only():
    d = Event.of(offsets(0), seq=1, **ENV).to_dict()
    assert Event.from_dict({**d, "rows": {"partition": [0, 1]}}).rows is None  # v1: an unknown field
    with pytest.raises(ContractError):
        Event(type="partition_offsets", data=offsets(0), seq=1, schema=contract.SCHEMA_V1,
              rows={"partition": [0]}, **ENV)


# ---------------------------------------------------------------------------------------------
# The job's parsing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [offsets, metadata, group], ids=["offsets", "metadata", "group_offsets"])
def test_a_v3_record_gives_the_rows_of_the_events_it_stands_for(make):
    ps = [make(i) for i in range(5)]
    v1 = parse([Event.of(p, seq=1, **ENV) for p in ps])
    v3 = parse([Event.batch(ps, seq=1, **ENV)])
    assert strip(v3) == strip(v1)
    assert all(r["reason"] is None for r in v3)
    assert len({r["event_id"] for r in v3}) == 1


def test_records_of_both_kinds_keep_their_order():
    batch = Event.batch([offsets(i) for i in range(3)], seq=2, **ENV)
    single = Event.of(offsets(9), seq=3, **ENV)
    escaped = batch.to_json().decode().replace("kafka-monitor/v3", "kafka-monitor\\/v3")  # still v3
    out = parse([single, batch, single, escaped])
    assert [r["partition"] for r in out] == [9, 0, 1, 2, 9, 0, 1, 2]
    assert [r["reason"] for r in out] == [None] * 8


def test_a_refresh_in_rows_derives_its_count_changes():
    rs = [MetadataRefresh(version=v, reason="periodic", ok=True, duration_ms=1.0,
                          partition_count_changes=[PartitionCountChange(topic=f"t{v}", old_count=1, new_count=2)])
          for v in (1, 2)]
    out = parse([Event(type="metadata_refresh", data=rs[0], seq=1, rows={"version": [1, 2],
                                                                          "partition_count_changes": [
                                                                              contract._plain(r.partition_count_changes)
                                                                              for r in rs]}, **ENV)])
    assert [(r["type"], r["topic"]) for r in out] == [("metadata_refresh", None)] * 2 + [
        ("partition_count_change", "t1"), ("partition_count_change", "t2")]


@pytest.mark.parametrize("rows, reason", [
    ({"partition": [0, 1], "high_watermark": [5]}, "missing_field"),
    ({}, "missing_field"),
    ({"partition": list(range(contract.MAX_ROWS_PER_RECORD + 1))}, "out_of_range"),
])
def test_a_malformed_v3_record_is_refused_whole(rows, reason):
    d = Event.batch([offsets(0), offsets(1)], seq=1, **ENV).to_dict()
    (r,) = parse([{**d, "rows": rows}])
    assert r["reason"] == reason and r["raw"] is not None and r["raw_bytes"] > 0


def test_one_bad_event_in_a_record_is_refused_alone():
    d = Event.batch([offsets(i) for i in range(3)], seq=1, **ENV).to_dict()
    d["rows"]["high_watermark"][1] = None  # required
    d["rows"]["partition"][2] = -4
    out = parse([d])
    assert [r["reason"] for r in out] == [None, "missing_field", "out_of_range"]
    text = json.dumps(d)  # a refused event keeps its record's sample and size; a good one neither
    assert [(r["raw"], r["raw_bytes"]) for r in out] == [(None, None)] + [(text, len(text))] * 2


def test_rows_outside_v3_are_ignored():
    d = Event.of(offsets(0), seq=1, **ENV).to_dict()
    assert [r["partition"] for r in parse([{**d, "rows": {"partition": [0, 1, 2]}}])] == [0]


def test_pieces_are_bounded_and_name_their_records(monkeypatch):
    monkeypatch.setattr(parsing, "MAX_ROWS_PER_CHUNK", 7)
    records = [Event.batch([offsets(i) for i in range(k * 10, k * 10 + 4)], seq=k, **ENV) for k in range(5)]
    records.insert(2, Event.of(offsets(99), seq=9, **ENV))
    values = pa.array([r.to_json().decode() for r in records], pa.string())
    pieces = list(parsing.parse_pieces(values))
    assert len(pieces) > 1 and all(t.num_rows <= 7 for t, _ in pieces)
    parts = np.concatenate([np.array(t.column("partition").to_pylist()) for t, _ in pieces])
    index = np.concatenate([i for _, i in pieces])
    want = [(k, p.data.partition) for k, r in enumerate(records) for p in r.expand()]
    assert list(zip(index.tolist(), parts.tolist())) == want
