"""parse() in a real Spark session: one flat row per event, plus one ``partition_count_change``
row per change a valid metadata refresh reports (keyed by topic); refused events keep their
reason and raw text and derive nothing."""

from __future__ import annotations

import json

import pytest

from monitor.contract import Event, MetadataRefresh, PartitionCountChange, PartitionOffsets
from streaming.job import FLAT_COLUMNS, parse

pytestmark = pytest.mark.integration


def ev(data, seq: int) -> str:
    return Event.of(data, cluster="c1", source="p1", seq=seq, observed_at=1_000 + seq).to_json().decode()


def refresh(changes: list[PartitionCountChange]) -> MetadataRefresh:
    return MetadataRefresh(version=3, reason="periodic", ok=True, duration_ms=1.0, partition_count_changes=changes)


def test_events_and_derived_partition_count_changes(spark):
    two = [PartitionCountChange(topic="orders", old_count=3, new_count=6, unseen_for_at_most_ms=10_000),
           PartitionCountChange(topic="pay", old_count=1, new_count=2)]
    bad_refresh = json.loads(ev(refresh(two), 4))
    del bad_refresh["data"]["ok"]  # a required field: the event is refused, its changes are not derived
    values = [ev(refresh(two), 1), ev(refresh([]), 2),
              ev(PartitionOffsets(topic="orders", partition=2, high_watermark=50, via="list_offsets"), 3),
              json.dumps(bad_refresh), "{not json"]
    raw = spark.createDataFrame([(None, v) for v in values], "key string, value string")
    parsed = parse(raw)
    assert [f.name for f in parsed.schema.fields] == [n for n, _ in FLAT_COLUMNS]
    rows = sorted((r.asDict() for r in parsed.collect()), key=lambda r: (r["seq"] or 0, r["type"] or "", r["topic"] or ""))

    got = [(r["seq"], r["type"], r["reason"], r["entity"], r["bucket_key"], r["topic"], r["old_count"], r["new_count"],
            r["unseen_for_at_most_ms"]) for r in rows]
    assert got == [
        (None, None, "malformed_json", None, None, None, None, None, None),
        (1, "metadata_refresh", None, "client|c1/p1", "c1/p1", None, None, None, None),
        (1, "partition_count_change", None, "topic|c1/orders", "c1/orders", "orders", 3, 6, 10_000),
        (1, "partition_count_change", None, "topic|c1/pay", "c1/pay", "pay", 1, 2, None),
        (2, "metadata_refresh", None, "client|c1/p1", "c1/p1", None, None, None, None),
        (3, "partition_offsets", None, "partition|c1/orders/2", "c1/orders/2", "orders", None, None, None),
        (4, "metadata_refresh", "missing_field", "client|c1/p1", "c1/p1", None, None, None, None),
    ]
    by_seq = {(r["seq"], r["type"]): r for r in rows}
    derived = by_seq[(1, "partition_count_change")]
    # a derived row carries its event's envelope, and nothing of the refresh's own payload
    assert (derived["event_id"], derived["cluster"], derived["source"], derived["observed_at"]) == (
        by_seq[(1, "metadata_refresh")]["event_id"], "c1", "p1", 1_001)
    assert derived["refresh_reason"] is None and derived["ok"] is None and derived["version"] is None
    assert by_seq[(1, "metadata_refresh")]["refresh_reason"] == "periodic"
    assert by_seq[(3, "partition_offsets")]["high_watermark"] == 50
    # refused events keep their raw text (for the quarantine sink); good ones and derived rows do not
    assert rows[0]["raw"] == "{not json" and by_seq[(4, "metadata_refresh")]["raw"] == json.dumps(bad_refresh)
    assert by_seq[(1, "metadata_refresh")]["raw"] is None and derived["raw"] is None
