"""The event contract: round-trips, rejections with reasons, sentinels, generated docs in step."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor import contract as c
from monitor.contract_docs import json_schema, markdown

ROOT = pathlib.Path(__file__).resolve().parents[2]

_text = st.text(min_size=0, max_size=12)
_int = st.integers(min_value=-(2**40), max_value=2**62)


def _strategy(typ):
    inner, optional = c._unwrap_optional(typ)
    if dataclasses.is_dataclass(inner):
        s = st.builds(inner, **{f.name: _strategy(c.hints(inner)[f.name]) for f in dataclasses.fields(inner)})
    elif typing.get_origin(inner) is list:
        s = st.lists(_strategy(typing.get_args(inner)[0]), max_size=4)
    else:
        s = {int: _int, float: st.floats(allow_nan=False, allow_infinity=False), str: _text,
             bool: st.booleans()}[inner]
    return st.one_of(st.none(), s) if optional else s


_events = st.sampled_from(list(c.PAYLOADS)).flatmap(
    lambda t: st.builds(
        c.Event, type=st.just(t), cluster=_text, source=_text, seq=st.integers(0, 2**62),
        observed_at=st.integers(0, 2**45), data=_strategy(c.PAYLOADS[t][0])))


@settings(max_examples=300, deadline=None)
@given(_events)
def test_every_event_type_round_trips_through_json(ev):
    back = c.Event.from_json(ev.to_json())
    assert back == ev
    assert back.key() == ev.key()


def test_unknown_fields_are_accepted_and_ignored():
    ev = c.Event.of(c.PartitionOffsets(topic="t", partition=0, high_watermark=10, via="fetch"),
                    cluster="k", source="p", seq=0, observed_at=1)
    d = ev.to_dict()
    d["future_envelope_field"] = 1
    d["data"]["future_payload_field"] = {"x": 1}
    assert c.Event.from_dict(d) == ev


@pytest.mark.parametrize("mutate, reason", [
    (lambda d: "{not json", "malformed_json"),
    (lambda d: json.dumps([1, 2]), "not_an_object"),
    (lambda d: json.dumps({**d, "schema": "kafka-monitor/v9"}), "unknown_schema"),
    (lambda d: json.dumps({k: v for k, v in d.items() if k != "schema"}), "unknown_schema"),
    (lambda d: json.dumps({**d, "type": "gossip"}), "unknown_type"),
    (lambda d: json.dumps({k: v for k, v in d.items() if k != "event_id"}), "missing_field"),
    (lambda d: json.dumps({**d, "seq": -1}), "out_of_range"),
    (lambda d: json.dumps({**d, "seq": "7"}), "wrong_type"),
    (lambda d: json.dumps({**d, "data": {**d["data"], "high_watermark": None}}), "missing_field"),
    (lambda d: json.dumps({**d, "data": {**d["data"], "high_watermark": 1.5}}), "wrong_type"),
    (lambda d: json.dumps({**d, "data": {**d["data"], "high_watermark": True}}), "wrong_type"),
    (lambda d: json.dumps({**d, "data": "x"}), "wrong_type"),
])
def test_bad_events_are_rejected_with_a_reason(mutate, reason):
    d = c.Event.of(c.PartitionOffsets(topic="t", partition=0, high_watermark=10, via="fetch"),
                   cluster="k", source="p", seq=3, observed_at=1).to_dict()
    with pytest.raises(c.ContractError) as e:
        c.Event.from_json(mutate(d))
    assert e.value.reason == reason


def test_optional_field_without_default_must_be_present_but_may_be_null():
    base = {"schema": c.SCHEMA_V1, "type": "group_offsets", "event_id": "e", "cluster": "k", "source": "p",
            "seq": 0, "observed_at": 0, "data": {"group": "g", "topic": "t", "partition": 0,
                                                 "committed_offset": None, "high_watermark": 5}}
    assert c.Event.from_dict(base).data.committed_offset is None
    del base["data"]["committed_offset"]
    with pytest.raises(c.ContractError, match="committed_offset"):
        c.Event.from_dict(base)


@pytest.mark.parametrize("raw, expected", [(None, None), (-1, None), (-1001, None), (-5, None), (0, 0), (42, 42)])
def test_kafka_offset_sentinels_become_null(raw, expected):
    assert c.kafka_offset(raw) == expected


@pytest.mark.parametrize("data, key", [
    (c.PartitionMetadata(topic="t", partition=3, leader=1, replicas=[1], isr=[1], metadata_version=1), "k/t"),
    (c.PartitionOffsets(topic="t", partition=3, high_watermark=1, via="fetch"), "k/t"),
    (c.GroupOffsets(group="g", topic="t", partition=3, committed_offset=None, high_watermark=None), "k/g/t"),
    (c.PartitionGone(topic="t", partition=3), "k/t"),
    (c.GroupPartitionGone(group="g", topic="t", partition=3), "k/g/t"),
    (c.Heartbeat(interval_ms=1000, events_sent=0, events_dropped=0), "k/probe-1"),
    (c.MetadataRefresh(version=1, reason="bootstrap", ok=True, duration_ms=1.0), "k/probe-1"),
])
def test_record_key_is_the_entity_or_for_a_partition_its_topic(data, key):
    # a topic's partitions under one key: one partition of the events topic, whether sent in a v3
    # record or alone, their *_gone events with them (ordered after them)
    assert c.Event.of(data, cluster="k", source="probe-1", seq=0, observed_at=0).key() == key


def test_event_refuses_a_payload_of_another_type():
    with pytest.raises(c.ContractError):
        c.Event(type="heartbeat", cluster="k", source="p", seq=0, observed_at=0,
                data=c.PartitionOffsets(topic="t", partition=0, high_watermark=1, via="fetch"))


def test_committed_json_schema_is_generated_from_the_code():
    committed = json.loads((ROOT / "docs" / "event-schema.json").read_text())
    assert committed == json_schema(), "run: kafka-monitor schema --format json > docs/event-schema.json"


def test_committed_reference_is_generated_from_the_code():
    committed = (ROOT / "docs" / "events.md").read_text()
    assert committed == markdown(), "run: kafka-monitor schema --format markdown > docs/events.md"


def test_json_schema_describes_every_type_and_field():
    s = json_schema()
    assert set(s["properties"]["type"]["enum"]) == set(c.PAYLOADS)
    for cls, _ in c.PAYLOADS.values():
        props = s["$defs"][cls.__name__]["properties"]
        assert set(props) == {f.name for f in dataclasses.fields(cls)}
        assert all(p["description"] for p in props.values())
