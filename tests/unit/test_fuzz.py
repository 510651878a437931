"""Fuzzing the parser, the quality gate and the rules with Hypothesis (issue 19).

``KAFKA_MONITOR_FUZZ_CASES`` (default 2,000) cases per test:

* the parser: batches of records (events of every type with hostile values put in, fields
  removed, unknown fields added, wrong types, huge and negative numbers, events from the future
  and from 1970, long strings, truncated or non-JSON values, invalid UTF-8, values over the size
  limit), with and without record timestamps: no exception, one row per record, every refused
  row has a known reason, a bounded sample and its size, every accepted row has what the state
  needs and nothing over the caps;
* the gate and the rules: scenarios of a few micro-batches over a small set of entities (so
  that state carries over, events repeat, arrive out of order, from several sources), parsed,
  gated and folded by the real state function, with processing-time timeouts in between: no
  exception, lag >= 0 and ISR within the replicas in every row and every state the rules keep,
  every quarantined row counted with a reason.

The gate's great-expectations suite costs ~0.1-0.3 s per validation, so the second test draws
its scenarios first and validates all their rows at once (the gate judges each row alone, so
this gives every row the reason it gets in its own batch), then replays each scenario through
the state function; a failure there prints the scenario's records.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.contract import SCHEMA_OF_TYPE, SCHEMA_V1
from streaming.ingest import parsing
from streaming.ingest import quality
from streaming.rules import base as rules
from streaming.state import function as stt
from streaming.state import codec
from streaming.state import rows as st_rows
from streaming.job import ENTITY_OF_TYPE

pytestmark = pytest.mark.slow  # ~80 s of cases (docs/tests.md)

CASES = int(os.environ.get("KAFKA_MONITOR_FUZZ_CASES", "2000"))
#: scenarios of the second test (each 1-3 micro-batches of 1-8 records)
SCENARIOS = max(1, CASES // 2)
BASE = 1_700_000_000_000
SAFE = (1 << 53) - 1
FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: the event types drawn (client_fetch is parsed but never reaches state: no required fields)
REQUIRED = {**parsing.REQUIRED_BY_TYPE, "client_fetch": ()}
INT_COLUMNS = [f.name for f in parsing.FLAT_ARROW if pa.types.is_int64(f.type) and f.name != "raw_bytes"]
LIST_COLUMNS = ("replicas", "isr", "offline_replicas")

# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

edge_ints = st.sampled_from([0, 1, 2, -1, -2, -1001, 2 ** 31 - 1, SAFE, SAFE + 1, 2 ** 53 + 1, 2 ** 63 - 1, -(2 ** 63),
                             2 ** 64, 10 ** 30, BASE, BASE * 1000])
ints = st.one_of(edge_ints, st.integers(0, 5000), st.integers())
#: the edge values a valid event may carry (offsets up to 2**53 - 1)
valid_edge = edge_ints.filter(lambda v: 0 <= v <= SAFE)
def long_text(lo: int, hi: int) -> st.SearchStrategy:
    return st.builds(lambda n, c: c * n, st.integers(lo, hi), st.sampled_from(["x", "é", "\u2603", "\U0001F600"]))


scalars = st.one_of(st.none(), ints, st.floats(), st.booleans(), st.text(max_size=8), long_text(1020, 1030))
junk = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=3),
                                                   st.dictionaries(st.text(max_size=4), c, max_size=3)), max_leaves=6)
hostile = st.one_of(scalars, st.lists(ints, max_size=4), junk)


@st.composite
def broker_ids(draw, valid: bool = True) -> list:
    if valid:
        return draw(st.lists(st.integers(1, 4), min_size=1, max_size=4, unique=True))
    return draw(st.lists(st.one_of(st.integers(-3, 6), st.none(), st.just(SAFE)), max_size=5))


@st.composite
def payload(draw, etype: str) -> dict:
    topic, part = draw(st.sampled_from(["t0", "t1"])), draw(st.integers(0, 1))
    hw = draw(st.one_of(st.integers(0, 10_000), valid_edge))
    if etype == "partition_metadata":
        replicas = draw(broker_ids())
        isr = draw(st.one_of(st.lists(st.sampled_from(replicas), max_size=len(replicas), unique=True), broker_ids(False)))
        return {"topic": topic, "partition": part, "leader": draw(st.sampled_from([-1, *replicas])), "replicas": replicas,
                "isr": isr, "metadata_version": draw(st.integers(0, 50)),
                "leader_epoch": draw(st.one_of(st.none(), st.integers(0, 5))),
                "min_insync_replicas": draw(st.one_of(st.none(), st.integers(1, 3))),
                "offline_replicas": draw(st.lists(st.sampled_from(replicas), max_size=1))}
    if etype == "partition_offsets":
        return {"topic": topic, "partition": part, "high_watermark": hw, "via": "fetch",
                "log_start_offset": draw(st.one_of(st.none(), st.integers(0, max(0, min(hw, SAFE))))),
                "last_stable_offset": draw(st.one_of(st.none(), st.just(hw))),
                "metadata_at": draw(st.one_of(st.none(), st.integers(BASE - 60_000, BASE + 60_000)))}
    if etype in ("group_offsets", "client_fetch"):
        d = {"group": "g0", "topic": topic, "partition": part}
        if etype == "group_offsets":
            d.update(committed_offset=draw(st.one_of(st.none(), st.integers(0, 12_000), valid_edge)),
                     high_watermark=draw(st.one_of(st.none(), st.just(hw))),
                     hw_observed_at=draw(st.one_of(st.none(), st.integers(BASE - 60_000, BASE + 60_000))),
                     last_stable_offset=draw(st.one_of(st.none(), st.integers(0, 12_000))),
                     held_by_transaction=draw(st.one_of(st.none(), st.just("tx0"))),
                     held_by_producer=draw(st.one_of(st.none(), st.integers(0, 10))))
        else:
            d.update(position=draw(st.one_of(st.none(), st.integers(0, 100))), high_watermark=hw)
        return d
    if etype == "group_state":
        return {"group": "g0", "state": draw(st.sampled_from(["Empty", "Stable", "PreparingRebalance",
                                                              "CompletingRebalance", "Dead", "Unknown"])),
                "generation": draw(st.one_of(st.none(), st.integers(0, 9))),
                "members": [{"member_id": f"m{i}", "assignment": [f"{topic}/{part}"]} for i in range(draw(st.integers(0, 2)))]}
    if etype == "rebalance":
        return {"group": "g0", "phase": draw(st.sampled_from(["join_started", "assigned", "revoked", "lost", "failed"])),
                "generation": draw(st.one_of(st.none(), st.integers(0, 9))),
                "duration_ms": draw(st.one_of(st.none(), st.floats(0, 1e6)))}
    if etype == "metadata_refresh":
        changes = [{"topic": draw(st.sampled_from(["t0", "t1"])), "old_count": draw(st.integers(1, 4)),
                    "new_count": draw(st.integers(1, 8))} for _ in range(draw(st.integers(0, 2)))]
        ok = draw(st.booleans())
        return {"version": draw(st.integers(0, 50)), "reason": draw(st.sampled_from(["periodic", "invalidated"])),
                "ok": ok, "duration_ms": draw(st.one_of(st.none(), st.floats(0, 1e4))),
                "error": None if ok else draw(st.text(max_size=30)), "partition_count_changes": changes,
                "metadata_max_age_ms": draw(st.one_of(st.none(), st.integers(1000, 600_000)))}
    if etype == "client_produce":
        return {"topic": topic, "partition": part, "leader": draw(st.one_of(st.none(), st.integers(1, 4))),
                "queued_messages": draw(st.integers(0, 9)), "in_flight_messages": draw(st.integers(0, 9)),
                "sent_messages": draw(st.integers(0, 10 ** 6)), "leader_rtt_p99_ms": draw(st.one_of(st.none(), st.floats(0, 1e4)))}
    if etype == "broker_state":
        holds = draw(st.integers(0, 50))
        return {"node_id": draw(st.integers(0, 4)), "registered": draw(st.booleans()), "metadata_version": 3,
                "leader_partitions": draw(st.integers(0, holds)), "replica_partitions": holds,
                "out_of_sync_replicas": draw(st.integers(0, holds)), "host": "127.0.0.1", "port": 9092}
    if etype == "canary":
        n = draw(st.integers(0, 50))
        buckets = st.lists(st.integers(0, 9), min_size=14, max_size=14)
        return {"topic": "kafka-monitor-canary", "partition": part, "started_at": BASE - 10 ** 6,
                "leader": draw(st.one_of(st.none(), st.integers(-1, 4))), "sent": n + 2, "acked": n, "received": n,
                "lost": 0, "duplicated": draw(st.integers(0, 2)), "out_of_order": 0, "pending": draw(st.integers(0, 2)),
                "oldest_pending_ms": draw(st.one_of(st.none(), st.integers(0, 60_000))),
                "produce_latency_counts": draw(buckets), "produce_latency_sum_ms": draw(st.floats(0, 1e6)),
                "e2e_latency_counts": draw(buckets), "e2e_latency_sum_ms": draw(st.floats(0, 1e6)),
                "errors": [{"code": draw(st.sampled_from(["NOT_ENOUGH_REPLICAS", "_MSG_TIMED_OUT"])),
                            "count": draw(st.integers(1, 5))} for _ in range(draw(st.integers(0, 2)))]}
    if etype == "partition_gone":
        return {"topic": topic, "partition": part}
    if etype == "group_gone":
        return {"group": "g0"}
    if etype == "group_partition_gone":
        return {"group": "g0", "topic": topic, "partition": part}
    if etype == "quorum_state":
        ok = draw(st.booleans())
        maybe = st.one_of(st.none(), st.integers(0, 60_000))

        def nodes(ids):
            return [{"replica_id": i, "log_end_offset": draw(st.one_of(st.none(), st.integers(0, 500))),
                     "lag": draw(maybe), "last_fetch_ms_ago": draw(maybe), "last_caught_up_ms_ago": draw(maybe)}
                    for i in ids]
        if not ok:
            return {"ok": False, "interval_ms": 10_000, "error": "boom",
                    "error_kind": draw(st.sampled_from(["permission", "no_answer", "error"]))}
        return {"ok": True, "interval_ms": 10_000, "leader_id": draw(st.sampled_from([-1, 100, 101])),
                "leader_epoch": draw(st.one_of(st.none(), st.integers(0, 9))),
                "high_watermark": draw(st.one_of(st.none(), st.integers(0, 500))),
                "voters": nodes([100, 101, 102]), "observers": nodes(range(1, draw(st.integers(0, 4))))}
    if etype == "log_dirs":
        def one(i):
            if draw(st.booleans()):
                return {"log_dir": f"/d{i}", "online": False, "error": "KAFKA_STORAGE_ERROR", "held_replicas": 2,
                        "held_partitions": ["t-0", "t-1"]}
            total = draw(st.integers(1, 10 ** 12))
            return {"log_dir": f"/d{i}", "online": True, "total_bytes": total, "usable_bytes": draw(st.integers(0, total)),
                    "held_replicas": draw(st.integers(0, 50)), "held_bytes": draw(st.integers(0, 10 ** 9)),
                    "held_partitions": ["t-0"], "moving_replicas": 0}
        return {"broker": draw(st.integers(1, 3)), "interval_ms": 30_000,
                "dirs": [one(i) for i in range(draw(st.integers(0, 3)))]}
    if etype == "transactions":
        def txn(i):
            if draw(st.booleans()):
                return {"transactional_id": f"tx{i}", "producer_id": 1000 + i, "state": "Ongoing", "coordinator": 1,
                        "described": False}
            return {"transactional_id": f"tx{i}", "producer_id": 1000 + i, "state": "Ongoing", "coordinator": 2,
                    "producer_epoch": 0, "started_ms_ago": draw(st.integers(0, 10 ** 7)),
                    "timeout_ms": draw(st.one_of(st.none(), st.integers(1, 900_000))),
                    "partitions": ["t-0", "t-1"], "partitions_count": 2}
        txns = [txn(i) for i in range(draw(st.integers(0, 3)))]
        held = [{"topic": "t", "partition": draw(st.integers(0, 3)), "producer_id": draw(st.integers(1000, 1004)),
                 "producer_epoch": 0, "first_offset": draw(st.integers(0, 500)),
                 "last_stable_offset": draw(st.one_of(st.none(), st.integers(0, 500))),
                 "high_watermark": draw(st.one_of(st.none(), st.integers(0, 900)))}
                for _ in range(draw(st.integers(0, 3)))]
        ok = draw(st.booleans())
        return {"ok": ok, "interval_ms": 30_000, "transactions": txns if ok else [],
                "transactions_count": len(txns) if ok else 0, "held_partitions": held if ok else [],
                "held_partitions_count": len(held) if ok else 0, "unlisted_brokers": draw(st.sampled_from([[], [2]])),
                "error": None if ok else "KafkaTimeoutError", "error_kind": None if ok else "no_answer"}
    if etype == "ha_member":
        held = sorted(draw(st.sets(st.integers(0, 9), max_size=6)))
        return {"ha_group": draw(st.sampled_from(["g", "h"])), "shards": draw(st.sampled_from([8, 10])),
                "interval_ms": 1000, "held": held, "epochs": [draw(st.integers(0, 50)) for _ in held],
                "watched": [draw(st.integers(0, 5)) for _ in held], "handovers": draw(st.integers(0, 9))}
    return {"interval_ms": draw(st.sampled_from([1000, 10_000])), "events_sent": draw(st.integers(0, 10 ** 6)),
            "events_dropped": draw(st.integers(0, 10)), "started_at": draw(st.one_of(st.none(), st.just(BASE - 10 ** 6)))}


@st.composite
def event(draw, t: int) -> tuple[dict, bool]:
    """(an event, whether it is left valid): one of every type, sometimes broken on purpose."""
    etype = draw(st.sampled_from(sorted(REQUIRED)))
    e = {"schema": SCHEMA_OF_TYPE.get(etype, SCHEMA_V1), "type": etype, "event_id": f"e{draw(st.integers(0, 30))}", "cluster": "c",
         "source": draw(st.sampled_from(["p1", "p2"])), "seq": draw(st.integers(0, 100)),
         "observed_at": t + draw(st.integers(-3000, 3000)), "data": draw(payload(etype))}
    valid = True
    for _ in range(draw(st.integers(0, 2)) if draw(st.booleans()) else 0):
        where = e["data"] if isinstance(e.get("data"), dict) and draw(st.booleans()) else e
        name = draw(st.sampled_from(sorted(where) + ["extra"]))
        action = draw(st.sampled_from(["set", "delete", "extra"]))
        if action == "delete" and name in where:
            del where[name]
        elif action == "extra":
            where["x_" + name] = draw(st.one_of(hostile, long_text(500, 3000)))
            continue  # an unknown field: still valid (its size aside)
        else:
            where[name] = draw(hostile)
        valid = False
    if draw(st.integers(0, 9)) == 0:  # an event time far away
        e["observed_at"] = draw(st.sampled_from([0, 1, 1000, t + 86_400_000, t * 1000, 4_102_444_800_000, 2 ** 63 - 1]))
        valid = False
    return e, valid


@st.composite
def record(draw, t: int) -> tuple[Optional[bytes], bool]:
    """(a record value, whether it is a valid event)."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.one_of(st.none(), st.binary(max_size=200), st.text(max_size=200).map(str.encode))), False
    if kind == 1:
        return json.dumps(draw(junk)).encode(), False
    e, valid = draw(event(t))
    text = json.dumps(e, indent=draw(st.sampled_from([None, None, None, 1])))
    if kind == 2:  # truncated, or bytes that are not UTF-8 inside
        cut = draw(st.integers(0, len(text)))
        return text.encode()[:cut] + draw(st.sampled_from([b"", b"\xff\xfe"])), False
    return text.encode(), valid


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def check_parsed(values: list, stamps: Optional[list], limits: parsing.Limits, out: pa.Table,
                 valid: list[bool], gated: bool = False) -> None:
    """The parser's invariants for one call (``gated``: reasons may also be the gate's rules)."""
    rows = out.to_pylist()
    n = len(values)
    assert len(rows) >= n and all(r["type"] == "partition_count_change" for r in rows[n:])
    known = set(parsing.REASONS) | (set(quality.RULES) if gated else set())
    for i, r in enumerate(rows):
        reason = r["reason"]
        assert reason is None or reason in known, reason
        if i >= n:  # a derived row
            if reason is None:
                assert r["topic"] is not None and len(r["topic"]) <= parsing.MAX_STRING_CHARS
                assert r["old_count"] is not None and r["new_count"] is not None and r["entity"] is not None
            continue
        v = values[i]
        size = None if v is None else len(v)
        assert (reason == "oversized") == (size is not None and size > limits.max_event_bytes)
        if reason is None:
            assert r["raw"] is None and r["raw_bytes"] is None
            assert r["type"] in REQUIRED and r["entity"] is not None and r["bucket_key"] is not None
            for f in ("event_id", "cluster", "source", "seq", "observed_at", *REQUIRED[r["type"]]):
                fld = {"state": "group_state", "reason": "refresh_reason", "broker": "node_id"}.get(f, f)
                assert r[fld if fld in r else "report"] is not None, (f, r)  # not a column: in the report
            for f in ("event_id", "cluster", "source", "topic", "group", "group_state", "phase", "member_id",
                      "refresh_reason", "cause", "error"):
                assert r[f] is None or len(r[f]) <= parsing.MAX_STRING_CHARS, f
            for f in INT_COLUMNS:
                assert r[f] is None or -SAFE <= r[f] <= SAFE, (f, r[f])
            for f in LIST_COLUMNS:
                assert r[f] is None or all(x is None or -SAFE <= x <= SAFE for x in r[f]), (f, r[f])
            for f in ("partition", "high_watermark", "committed_offset"):
                assert r[f] is None or r[f] >= 0, (f, r[f])
            if stamps is not None and stamps[i] is not None and stamps[i] > 0 and limits.max_clock_skew_ms:
                assert abs(r["observed_at"] - stamps[i]) <= limits.max_clock_skew_ms
        else:
            assert r["raw_bytes"] == size
            assert (r["raw"] is None) == (v is None)  # fewer refused rows than RAW_SAMPLES_PER_CHUNK here
            if v is not None:
                assert len(r["raw"]) <= parsing.RAW_SAMPLE_CHARS
                if size <= limits.max_event_bytes:
                    assert r["raw"] == v.decode("utf-8", "replace")[:parsing.RAW_SAMPLE_CHARS]
        if valid[i] and v is not None and size <= limits.max_event_bytes and stamps is not None and stamps[i] == BASE:
            assert reason is None or gated, (reason, v[:300])


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------


@FUZZ
@given(st.data())
def test_fuzz_the_parser(data):
    recs = data.draw(st.lists(record(BASE), min_size=1, max_size=6))
    values = [v for v, _ in recs]
    stamps = data.draw(st.one_of(st.none(), st.lists(st.sampled_from([BASE, BASE, BASE - 10 ** 6, 0, -1, None]),
                                                     min_size=len(values), max_size=len(values))))
    limits = parsing.Limits(max_event_bytes=data.draw(st.sampled_from([1024, 2048, 65_536])),
                            max_clock_skew_ms=data.draw(st.sampled_from([0, 300_000])))
    arr = pa.array(values, pa.binary())
    out = parsing.parse_values(arr, gate=False, timestamps=None if stamps is None else pa.array(stamps, pa.int64()),
                               limits=limits)
    assert out.schema == parsing.FLAT_ARROW
    check_parsed(values, stamps, limits, out, [ok for _, ok in recs])


# ---------------------------------------------------------------------------------------------
# The gate and the rules
# ---------------------------------------------------------------------------------------------


class FakeState:
    """The part of pyspark's GroupState the state function uses."""

    def __init__(self) -> None:
        self.value, self.hasTimedOut, self.processing_time_ms, self.timeout = None, False, 0, None

    def getCurrentProcessingTimeMs(self) -> int:
        return self.processing_time_ms

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> Any:
        return self.value

    def update(self, v: Any) -> None:
        self.value = v

    def remove(self) -> None:
        self.value = None

    def setTimeoutDuration(self, ms: int) -> None:
        self.timeout = ms


@st.composite
def scenario(draw) -> list[dict]:
    """A few micro-batches: their records, record timestamps, and processing-time timeouts after them."""
    batches = []
    for b in range(draw(st.integers(1, 3))):
        t = BASE + b * 10_000 + draw(st.integers(0, 2000))
        recs = draw(st.lists(record(t), min_size=1, max_size=8))
        batches.append({"values": [v for v, _ in recs], "valid": [ok for _, ok in recs], "t": t,
                        "timeout_after_ms": draw(st.one_of(st.none(), st.sampled_from([30_000, 120_000, 10 ** 6])))})
    return batches


ALERTS = {a.value for a in rules.Alert}


def check_output(out: pd.DataFrame) -> None:
    cols = {c: out[c].tolist() for c in ("kind", "action", "lag", "lag_seconds", "isr", "replicas", "alert", "alert_id")}
    na = lambda v: v is None or v is pd.NA or v != v  # noqa: E731
    for i, kind in enumerate(cols["kind"]):
        upsert = cols["action"][i] == "upsert"
        if kind == "group_partition" and upsert:
            assert (na(cols["lag"][i]) or cols["lag"][i] >= 0) and (na(cols["lag_seconds"][i]) or cols["lag_seconds"][i] >= 0)
        elif kind == "partition" and upsert:
            isr, rep = cols["isr"][i], cols["replicas"][i]
            assert na(isr) or na(rep) or isr <= rep, (isr, rep)
        elif kind == "alert":
            assert cols["action"][i] in ("open", "resolve") and cols["alert"][i] in ALERTS and cols["alert_id"][i]
        elif kind in ("quarantine", "quarantine_event"):
            assert isinstance(cols["alert"][i], str) and cols["alert"][i]


def check_states(fs: FakeState) -> None:
    if fs.value is None:
        return
    for key, s in codec.stored_entities(fs.value[0]).items():
        if s["kind"] == "partition" and s.get("replicas") is not None and s.get("isr") is not None:
            assert set(s["isr"]) <= set(s["replicas"]), (key, s)
        if s["kind"] == "group_partition":
            assert s.get("lag") is None or s["lag"] >= 0, (key, s)


def replay(sc: list[dict], parsed: list[pa.Table]) -> None:
    """One scenario through the state function, batch by batch, as the job routes its rows."""
    fn = stt.make_state_function(stt.StateConfig(entity_ttl_ms=600_000, run_id="fuzz"))
    states: dict[int, FakeState] = {}
    for batch, table in zip(sc, parsed):
        pdf = table.to_pandas()  # as Spark hands them over: nullable longs as float64, arrays as ndarrays
        refused = pdf["reason"].notna()
        kept = pdf[refused | pdf["type"].isin(list(ENTITY_OF_TYPE))].copy()
        kept["bucket"] = [stt.QUARANTINE_BUCKET if not pd.isna(r) else zlib.crc32(k.encode()) % 2
                          for r, k in zip(kept["reason"], kept["bucket_key"])]
        for bucket, rows in kept.groupby("bucket", sort=True):
            fs = states.setdefault(int(bucket), FakeState())
            fs.hasTimedOut, fs.processing_time_ms = False, batch["t"]
            outs = list(fn((int(bucket),), iter([rows.reset_index(drop=True)]), fs))
            out = st_rows.expand_blocks(pd.concat(outs, ignore_index=True)) if outs else None
            if out is not None:
                check_output(out)
            if bucket == stt.QUARANTINE_BUCKET:
                assert out is not None and fs.value is None
                q = out[out.kind == "quarantine"]
                assert int(q["count"].sum()) == int(refused.sum()) == int((out.kind == "quarantine_event").sum())
            check_states(fs)
        if batch["timeout_after_ms"] is not None:
            for bucket, fs in states.items():
                if fs.value is None:
                    continue
                fs.hasTimedOut, fs.processing_time_ms = True, batch["t"] + batch["timeout_after_ms"]
                outs = list(fn((bucket,), iter([]), fs))
                if outs:
                    check_output(st_rows.expand_blocks(pd.concat(outs, ignore_index=True)))
                check_states(fs)


def test_fuzz_the_gate_and_the_rules():
    drawn: list[tuple[list[dict], list[pa.Table]]] = []

    @settings(FUZZ, max_examples=SCENARIOS)
    @given(scenario())
    def draw(sc):
        parsed = []
        for batch in sc:
            ts = pa.array([batch["t"]] * len(batch["values"]), pa.int64())
            out = parsing.parse_values(pa.array(batch["values"], pa.binary()), gate=False, timestamps=ts)
            check_parsed(batch["values"], [batch["t"]] * len(batch["values"]), parsing.LIMITS, out, batch["valid"])
            parsed.append(out)
        drawn.append((sc, parsed))

    draw()
    assert len(drawn) >= SCENARIOS
    # the gate, once over every row of every scenario
    tables = [t for _, parsed in drawn for t in parsed]
    every = pa.concat_tables(tables)
    upstream = every.column("reason").to_numpy(zero_copy_only=False)
    checked = quality.validate_frame(every.select(list(quality.INPUT_COLUMNS)).to_pandas(split_blocks=True)).to_numpy()
    reasons = np.where(pd.isna(upstream), checked, upstream)
    at = 0
    gated_tables = []
    for t in tables:
        gated_tables.append(t.set_column(0, "reason", pa.array(reasons[at:at + t.num_rows], pa.string())))
        at += t.num_rows
    assert set(reasons[pd.notna(reasons)]) <= set(parsing.REASONS) | set(quality.RULES)
    # each scenario through the state function
    at = 0
    for sc, parsed in drawn:
        gated = gated_tables[at:at + len(parsed)]
        at += len(parsed)
        try:
            replay(sc, gated)
        except Exception:
            print("scenario:", json.dumps([{**b, "values": [None if v is None else v.decode("utf-8", "replace")
                                                            for v in b["values"]]} for b in sc])[:20_000])
            raise
    print(f"\nfuzz: {len(drawn)} scenarios, {sum(len(sc) for sc, _ in drawn)} micro-batches, {every.num_rows} rows "
          f"({int(pd.notna(reasons).sum())} quarantined) through the gate and the state function")
