"""Hostile records for the events topic (issue 19): what a broken or malicious producer can
write, and a stream of valid probe-like events to mix them with.

``garbage(n)``: 12 kinds of records a decoder must refuse (not JSON, truncated, binary, unknown
type or schema, missing fields, 200 KB payloads, ...).  ``well_formed(n)``: records whose
envelope is complete but whose values are hostile (wrong types, negative, huge and
out-of-order offsets, ISR outside the replicas, events from the future and from 1970, nulls,
nested garbage, Kafka's sentinels), plus ``VALID_BLOBS`` valid events each carrying an extra
300 KB field.  Every record is ``(kind, reason, key, value)``: ``reason`` is the quarantine
reason it must get, worked out by hand (not by the parser).  ``valid_cycle()``: one cycle of a
healthy probe over a few partitions and a group; ``valid_expected()``: the gauges it leaves."""

from __future__ import annotations

import json
import random
import uuid
from typing import Optional

SCHEMA = "kafka-monitor/v1"
#: the 500 valid events with an extra 300 KB field in the report
VALID_BLOBS = 500
BLOB_BYTES = 300 * 1024


def _env(etype: str, data: dict, now_ms: int, seq: int, **kw) -> dict:
    return {"schema": SCHEMA, "type": etype, "event_id": uuid.UUID(int=random.getrandbits(128)).hex, "cluster": "hostile",
            "source": "forger", "seq": seq, "observed_at": now_ms, "data": data, **kw}


def _offsets(i: int, **kw) -> dict:
    return {"topic": f"h{i % 7}", "partition": i % 5, "high_watermark": 100 + i, "via": "fetch", **kw}


def _metadata(i: int, **kw) -> dict:
    return {"topic": f"h{i % 7}", "partition": i % 5, "leader": 1, "replicas": [1, 2, 3], "isr": [1, 2],
            "metadata_version": 1, **kw}


def _group(i: int, **kw) -> dict:
    return {"group": f"hg{i % 3}", "topic": f"h{i % 7}", "partition": i % 5, "committed_offset": 5, "high_watermark": 9,
            **kw}


def _j(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


GARBAGE_KINDS = ("truncated_json", "invalid_json", "binary_garbage", "not_an_object", "empty_value", "deep_nesting",
                 "unknown_type", "unknown_schema", "missing_envelope", "missing_field", "data_not_an_object",
                 "payload_200kb")
WELL_FORMED_KINDS = ("wrong_type", "negative_offset", "negative_other", "huge_value", "out_of_order_offsets",
                     "isr_outside_replicas", "bad_broker_id", "from_the_future", "from_1970", "nulls",
                     "nested_garbage", "sentinel")
#: a record: (kind, the quarantine reason it must get, key, value)
Record = tuple[str, str, bytes, Optional[bytes]]


def _garbage_one(kind: str, i: int, now_ms: int, rnd: random.Random) -> tuple[str, Optional[bytes]]:
    """(expected reason, value) of one record the decoder refuses."""
    good = _j(_env("partition_offsets", _offsets(i), now_ms, i))
    if kind == "truncated_json":  # the outer object closes only at its last byte
        return "malformed_json", good[: rnd.randrange(1, len(good) - 1)]
    if kind == "invalid_json":
        return rnd.choice([("malformed_json", b"{this is not json"), ("malformed_json", b"{'schema': 'kafka-monitor/v1'}"),
                           ("malformed_json", good[:-1] + b",}"), ("malformed_json", good.replace(b":", b"=", 1)),
                           ("unknown_type", b'{"schema": "kafka-monitor/v1", "type": NaN}')])  # Python reads NaN
    if kind == "binary_garbage":
        return "malformed_json", bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 400)))
    if kind == "not_an_object":
        return "malformed_json", rnd.choice([b"[1, 2]", b'"text"', b"42", b"null", b"true", b"[" + good + b"]"])
    if kind == "empty_value":
        return "malformed_json", rnd.choice([None, b"", b"   "])
    if kind == "deep_nesting":  # deeper than json.loads goes, within 64 KiB
        d = rnd.randrange(5_000, 30_000)
        return "malformed_json", b'{"data":' + b"[" * d + b"]" * d + b"}"
    if kind == "unknown_type":
        return "unknown_type", _j(_env(rnd.choice(["gossip", "PARTITION_OFFSETS", ""]), _offsets(i), now_ms, i))
    if kind == "unknown_schema":
        return "unknown_schema", _j({**_env("partition_offsets", _offsets(i), now_ms, i),
                                     "schema": rnd.choice(["kafka-monitor/v9", "kafka-monitor/v0", "v1"])})
    if kind == "missing_envelope":
        e = _env("partition_offsets", _offsets(i), now_ms, i)
        del e[rnd.choice(["event_id", "cluster", "source", "seq", "observed_at"])]
        return "missing_envelope", _j(e)
    if kind == "missing_field":
        d = _offsets(i)
        del d[rnd.choice(["topic", "partition", "high_watermark"])]
        return "missing_field", _j(_env("partition_offsets", d, now_ms, i))
    if kind == "data_not_an_object":
        return "missing_field", _j({**_env("partition_offsets", {}, now_ms, i), "data": rnd.choice(["x", [1, 2], 7, None])})
    if kind == "payload_200kb":
        blob = "x" * (200 * 1024)
        return "oversized", rnd.choice([_j({"blob": blob}), _j(_env("partition_offsets", _offsets(i, topic=blob), now_ms, i)),
                                        b"{" + blob.encode(), blob.encode()])
    raise ValueError(kind)


def garbage(n: int, now_ms: int, seed: int = 19) -> list[Record]:
    """``n`` records the decoder refuses, the 12 kinds in turn."""
    rnd = random.Random(seed)
    random.seed(seed)
    out = []
    for i in range(n):
        kind = GARBAGE_KINDS[i % len(GARBAGE_KINDS)]
        reason, value = _garbage_one(kind, i, now_ms, rnd)
        out.append((kind, reason, b"hostile-%d" % i, value))
    return out


def _well_formed_one(kind: str, i: int, now_ms: int, rnd: random.Random) -> tuple[str, dict]:
    """(expected reason, event) with a complete envelope and a hostile value."""
    pick = rnd.choice
    off = lambda **kw: _env("partition_offsets", _offsets(i, **kw), now_ms, i)  # noqa: E731
    md = lambda **kw: _env("partition_metadata", _metadata(i, **kw), now_ms, i)  # noqa: E731
    grp = lambda **kw: _env("group_offsets", _group(i, **kw), now_ms, i)  # noqa: E731
    hb = lambda **kw: _env("heartbeat", {"interval_ms": 1000, "events_sent": 1, "events_dropped": 0, **kw}, now_ms, i)  # noqa: E731
    # a wrong-typed, null or beyond-int64 required field is null: missing_field / missing_envelope
    if kind == "wrong_type":
        return pick([("missing_field", off(high_watermark="12")), ("missing_field", off(partition="3")),
                     ("missing_field", off(high_watermark=12.5)), ("missing_field", md(isr="1,2")),
                     ("missing_field", md(replicas=[1, "2"])), ("missing_field", hb(interval_ms=True)),
                     ("missing_envelope", {**off(), "seq": "7"}), ("missing_envelope", {**off(), "observed_at": str(now_ms)}),
                     ("missing_envelope", {**off(), "cluster": 5})])
    if kind == "negative_offset":
        return pick([("out_of_range", off(high_watermark=-5)), ("offset_not_negative", off(log_start_offset=-3)),
                     ("offset_not_negative", off(last_stable_offset=-9)), ("out_of_range", grp(committed_offset=-7))])
    if kind == "negative_other":
        return pick([("out_of_range", off(partition=-2)), ("leader_not_below_minus_one", md(leader=-5)),
                     ("leader_epoch_not_negative", md(leader_epoch=-1)), ("min_insync_replicas_positive", md(min_insync_replicas=0)),
                     ("interval_positive", hb(interval_ms=-1000)), ("events_dropped_not_negative", hb(events_dropped=-4)),
                     ("seq_not_negative", {**off(), "seq": -1})])
    if kind == "huge_value":  # beyond int64 (null), beyond 2**53 (the state's float64), an event time in us / ns
        return pick([("missing_field", off(high_watermark=2 ** 64)), ("missing_field", off(high_watermark=10 ** 30)),
                     ("missing_field", grp(partition=2 ** 70)), ("missing_envelope", {**off(), "seq": 2 ** 63}),
                     ("out_of_range", off(high_watermark=2 ** 63 - 1)), ("out_of_range", grp(committed_offset=2 ** 53)),
                     ("out_of_range", md(replicas=[1, 2 ** 60], isr=[1])),
                     ("event_time_ahead", {**off(), "observed_at": now_ms * 1000}),
                     ("out_of_range", {**off(), "observed_at": now_ms * 1_000_000})])
    if kind == "out_of_order_offsets":  # log start above the HW
        return "hw_not_below_log_start", off(high_watermark=10, log_start_offset=50 + i)
    if kind == "isr_outside_replicas":
        return "isr_subset_of_replicas", md(isr=pick([[1, 7], [9], [1, 2, 3, 4]]))
    if kind == "bad_broker_id":
        return "replica_id_not_negative", md(**pick([{"replicas": [1, -2, 3]}, {"isr": [None, 1]}, {"offline_replicas": [-1]}]))
    if kind == "from_the_future":  # leader -1: it would open OfflinePartition if it got through
        return "event_time_ahead", {**md(leader=-1), "observed_at": now_ms + pick([86_400_000, 365 * 86_400_000,
                                                                                   4_200_000_000_000])}
    if kind == "from_1970":
        return "event_time_behind", {**md(leader=-1), "observed_at": pick([0, 1, 1000, 86_400_000])}
    if kind == "nulls":
        return pick([("missing_field", off(high_watermark=None)), ("missing_field", md(replicas=None)),
                     ("missing_field", grp(group=None)), ("missing_envelope", {**off(), "event_id": None}),
                     ("missing_envelope", {**off(), "observed_at": None}), ("missing_field", {**off(), "data": None})])
    if kind == "nested_garbage":
        nest = {"a": [1, {"b": [None, {"c": "d" * 50}]}]}
        return pick([("missing_field", off(topic=nest)), ("missing_field", off(high_watermark=[nest])),
                     ("missing_field", md(replicas=[[1], [2]])), ("missing_field", hb(interval_ms={"ms": 1000})),
                     ("missing_envelope", {**off(), "source": nest})])
    if kind == "sentinel":
        return pick([("out_of_range", off(high_watermark=-1)), ("offset_sentinel", off(log_start_offset=-1001)),
                     ("out_of_range", grp(committed_offset=-1001))])
    raise ValueError(kind)


def well_formed(n: int, now_ms: int, seed: int = 20, blobs: int = VALID_BLOBS) -> list[Record]:
    """``n`` records with a complete envelope and hostile values, the last ``blobs`` of them valid
    events with an extra 300 KB field (in the envelope or in ``data``, in turn): oversized."""
    rnd = random.Random(seed)
    random.seed(seed)
    out = []
    for i in range(n - blobs):
        kind = WELL_FORMED_KINDS[i % len(WELL_FORMED_KINDS)]
        reason, event = _well_formed_one(kind, i, now_ms, rnd)
        out.append((kind, reason, b"hostile-wf-%d" % i, _j(event)))
    blob = "y" * BLOB_BYTES
    for i in range(blobs):
        e = _env("partition_offsets", _offsets(i, **({"extra": blob} if i % 2 else {})), now_ms, 10_000 + i)
        if not i % 2:
            e["extra"] = {"nested": [blob]}
        out.append(("valid_with_300kb_field", "oversized", b"hostile-blob-%d" % i, _j(e)))
    return out


def quarantined_blobs(n: int, now_ms: int) -> list[Record]:
    """``n`` events the gate refuses (ISR outside the replicas) each carrying an extra 300 KB
    field: refused, oversized."""
    blob = "z" * BLOB_BYTES
    return [("isr_outside_replicas_300kb", "oversized", b"hostile-qblob-%d" % i,
             _j({**_env("partition_metadata", _metadata(i, isr=[1, 7]), now_ms, 20_000 + i), "extra": blob}))
            for i in range(n)]


# ---------------------------------------------------------------------------------------------
# The valid stream
# ---------------------------------------------------------------------------------------------

VALID_TOPIC, VALID_GROUP, VALID_PARTITIONS = "orders", "billing", 6
VALID_PER_CYCLE = 3 * VALID_PARTITIONS + 1


def valid_cycle(c: int, t_ms: int) -> list[tuple[str, bytes, bytes]]:
    """Cycle ``c`` of a healthy probe at ``t_ms``: per partition its metadata (3 replicas, all
    in sync, the preferred leader) and offsets, the group's committed offsets (3 behind), a
    heartbeat.  Nothing in it is wrong: no alert may open while cycles keep coming."""
    from monitor.contract import Event, GroupOffsets, Heartbeat, PartitionMetadata, PartitionOffsets

    evs = []
    for p in range(VALID_PARTITIONS):
        hw = 1000 + 10 * p + 100 * c
        evs.append(PartitionMetadata(topic=VALID_TOPIC, partition=p, leader=1, replicas=[1, 2, 3], isr=[1, 2, 3],
                                     metadata_version=c + 1, leader_epoch=0, min_insync_replicas=2))
        evs.append(PartitionOffsets(topic=VALID_TOPIC, partition=p, high_watermark=hw, log_start_offset=0,
                                    via="fetch", metadata_at=t_ms))
        evs.append(GroupOffsets(group=VALID_GROUP, topic=VALID_TOPIC, partition=p, committed_offset=hw - 3,
                                high_watermark=hw, hw_observed_at=t_ms))
    # a heartbeat every cycle, announced as once a minute: SourceSilent only after 3 minutes and the silence grace
    evs.append(Heartbeat(interval_ms=60_000, events_sent=c * VALID_PER_CYCLE, events_dropped=0))
    out = []
    for i, d in enumerate(evs):
        e = Event.of(d, cluster="valid", source="probe-valid", seq=c * VALID_PER_CYCLE + i, observed_at=t_ms)
        out.append(("valid", e.key().encode(), e.to_json()))
    return out


def valid_expected(c: int) -> dict[tuple, float]:
    """The gauges after cycle ``c``: (metric name, sorted labels) -> value."""
    out = {}
    for p in range(VALID_PARTITIONS):
        part = (("cluster", "valid"), ("partition", str(p)), ("topic", VALID_TOPIC))
        gp = (("cluster", "valid"), ("group", VALID_GROUP), ("partition", str(p)), ("topic", VALID_TOPIC))
        hw = 1000 + 10 * p + 100 * c
        out[("kafka_monitor_partition_high_watermark", part)] = hw
        out[("kafka_monitor_partition_log_start_offset", part)] = 0
        out[("kafka_monitor_partition_leader", part)] = 1
        out[("kafka_monitor_partition_replicas", part)] = 3
        out[("kafka_monitor_partition_in_sync_replicas", part)] = 3
        out[("kafka_monitor_group_partition_committed_offset", gp)] = hw - 3
        out[("kafka_monitor_group_partition_lag", gp)] = 3
    out[("kafka_monitor_source_heartbeat_interval_seconds", (("cluster", "valid"), ("source", "probe-valid")))] = 60
    return out
