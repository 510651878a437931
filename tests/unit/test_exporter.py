"""The exporter against a fresh CollectorRegistry, and the metric catalogue in docs/metrics.md."""

from __future__ import annotations

import pandas as pd

import json
import pathlib
import re
import time

from streaming.sinks.catalogue import CATALOGUE, ROW_COLUMNS
from streaming.sinks.exporter import Exporter
from streaming.rules.notify import NotifyConfig
from streaming.state.rows import OUTPUT_COLUMNS

ROOT = pathlib.Path(__file__).resolve().parents[2]


def row(**kw):
    return {**{n: None for n, _ in OUTPUT_COLUMNS}, **kw}


def part(action="upsert", **kw):
    return row(**{**dict(kind="partition", action=action, cluster="k", topic="t", partition=0, leader=1, replicas=3,
                         isr=2, high_watermark=100, log_start_offset=0), **kw})


def v(e, name, **labels):
    return e.registry.get_sample_value("kafka_monitor_" + name, labels)


def test_partition_gauges_set_and_removed():
    e = Exporter()
    e.apply([part()], batch_id=0)
    lab = {"cluster": "k", "topic": "t", "partition": "0"}
    assert v(e, "partition_high_watermark", **lab) == 100
    assert v(e, "partition_in_sync_replicas", **lab) == 2
    assert v(e, "partition_last_stable_offset", **lab) is None  # unknown stays absent, not 0
    e.apply([part(action="remove")], batch_id=1)
    assert v(e, "partition_high_watermark", **lab) is None


def test_sample_reads_the_exporters_own_series_without_the_partition_stores():
    e = Exporter()
    e.apply([part()], batch_id=0)
    assert e.sample("kafka_monitor_job_start_timestamp_seconds") == v(e, "job_start_timestamp_seconds") > 0
    lab = {"cluster": "k", "topic": "t", "partition": "0"}
    assert v(e, "partition_high_watermark", **lab) == 100
    assert e.sample("kafka_monitor_partition_high_watermark", lab) is None  # not collected: bench/e2e_bench.py


def test_alert_series_count_against_the_cap_and_come_back_when_freed():
    e = Exporter(max_series=4)  # two open alerts: alert_active and alert_opened_timestamp_seconds each
    def a(p):
        return dict(kind="alert", alert="IsrShrink", severity="warning", cluster="k", topic="t", partition=p,
                    at=1_000_000 + p)
    def lab(p):
        return {"alert": "IsrShrink", "severity": "warning", "cluster": "k", "topic": "t", "partition": str(p),
                "group": "", "source": "", "broker": ""}
    e.apply([row(action="open", **a(p)) for p in range(3)] + [row(action="open", **a(0))], batch_id=0)
    assert [v(e, "alert_active", **lab(p)) for p in range(3)] == [1, 1, None]
    assert v(e, "exporter_series_refused_total") == 1  # the third; the first opened again is no new series
    e.apply([row(action="resolve", **a(0)), row(action="open", **{**a(2), "kind": "open_alert"})],
            batch_id=1)
    assert [v(e, "alert_active", **lab(p)) for p in range(3)] == [None, 1, 1]
    assert v(e, "alert_transitions_total", alert="IsrShrink", action="open") == 4
    assert 'kafka_monitor_alert_active{alert="IsrShrink",broker="",cluster="k",group="",partition="2",' in e.render().decode()
    # when each opened (event time, s): a restated alert keeps the time it was opened at
    assert [v(e, "alert_opened_timestamp_seconds", **lab(p)) for p in range(3)] == [None, 1000.001, 1000.002]


def test_notify_holds_are_served_per_alert():
    e = Exporter()
    assert v(e, "alert_notify_after_seconds", alert="IsrShrink") == 300  # the defaults from the start
    e.set_notify_holds(NotifyConfig(isr_shrink_after_ms=90_000).holds_s())
    assert v(e, "alert_notify_after_seconds", alert="IsrShrink") == 90
    assert v(e, "alert_notify_after_seconds", alert="OfflinePartition") == 0
    assert v(e, "alert_notify_after_seconds", alert="ConsumerLagHigh") is None  # held by its own rule


def test_lag_absent_when_unknown():
    e = Exporter()
    g = dict(kind="group_partition", cluster="k", consumer_group="g", topic="t", partition=1)
    e.apply([row(action="upsert", committed_offset=5, high_watermark=9, lag=4, **g)], batch_id=0)
    lab = {"cluster": "k", "group": "g", "topic": "t", "partition": "1"}
    assert v(e, "group_partition_lag", **lab) == 4
    e.apply([row(action="upsert", committed_offset=None, high_watermark=9, lag=None, **g)], batch_id=1)
    assert v(e, "group_partition_lag", **lab) is None


def test_alert_series_open_and_resolve_and_counters():
    e = Exporter()
    a = dict(kind="alert", alert="IsrShrink", severity="warning", cluster="k", topic="t", partition=0)
    e.apply([row(action="open", **a)], batch_id=0)
    lab = {"alert": "IsrShrink", "severity": "warning", "cluster": "k", "topic": "t", "partition": "0", "group": "", "source": "", "broker": ""}
    assert v(e, "alert_active", **lab) == 1
    e.apply([row(action="resolve", **a)], batch_id=1)
    assert v(e, "alert_active", **lab) is None
    assert v(e, "alert_transitions_total", alert="IsrShrink", action="open") == 1
    assert v(e, "alert_transitions_total", alert="IsrShrink", action="resolve") == 1


def test_a_replayed_batch_is_not_counted_twice():
    e = Exporter()
    q = row(kind="quarantine", action="count", alert="malformed_json", count=3)
    e.apply([q], batch_id=7)
    e.apply([q], batch_id=7)
    assert v(e, "events_quarantined_total", reason="malformed_json") == 3


def test_series_cap_refuses_and_counts():
    e = Exporter(max_series=5)  # one partition with an unknown LSO = 5 series
    e.apply([part(), {**part(), "partition": 1}], batch_id=0)
    assert v(e, "partition_high_watermark", cluster="k", topic="t", partition="0") == 100
    assert v(e, "partition_high_watermark", cluster="k", topic="t", partition="1") is None
    assert v(e, "exporter_series_refused_total") == 5


def test_every_metric_is_documented_in_the_catalogue():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(kafka_monitor_[a-z0-9_]+)`", doc, re.M))
    assert documented == set(CATALOGUE)
    for name, (typ, _, labels) in CATALOGUE.items():
        assert name.endswith("_total") == (typ == "counter"), name
        line = next(l for l in doc.splitlines() if l.startswith(f"| `{name}`"))
        assert typ in line and all(f"`{lab}`" in line for lab in labels), line


def test_source_heartbeat_and_interval_and_quarantine_reasons_start_at_zero():
    e = Exporter()
    assert v(e, "events_quarantined_total", reason="malformed_json") == 0
    e.apply([row(kind="source", action="upsert", cluster="k", source="p", at=5000, interval_ms=2000)], batch_id=0)
    assert v(e, "source_last_heartbeat_timestamp_seconds", cluster="k", source="p") == 5.0
    assert v(e, "source_heartbeat_interval_seconds", cluster="k", source="p") == 2.0
    e.apply([row(kind="source", action="remove", cluster="k", source="p", at=5000)], batch_id=1)
    assert v(e, "source_heartbeat_interval_seconds", cluster="k", source="p") is None


def test_a_sources_dropped_events_are_served_and_follow_its_restarts():
    e = Exporter()
    e.apply([row(kind="source", action="upsert", cluster="k", source="p", at=5000, count=7)], batch_id=0)
    assert v(e, "source_events_dropped", cluster="k", source="p") == 7.0
    e.apply([row(kind="source", action="upsert", cluster="k", source="p", at=6000, count=0)], batch_id=1)
    assert v(e, "source_events_dropped", cluster="k", source="p") == 0.0  # restarted
    e.apply([row(kind="source", action="upsert", cluster="k", source="p", at=7000, count=None)], batch_id=2)
    assert v(e, "source_events_dropped", cluster="k", source="p") == 0.0  # without the count: as it was
    e.apply([row(kind="source", action="upsert", cluster="k", source="p", at=8000, count=3)], batch_id=3)
    e.apply([row(kind="source", action="remove", cluster="k", source="p", at=8000)], batch_id=4)
    assert v(e, "source_events_dropped", cluster="k", source="p") is None


def test_the_heartbeat_delay_is_the_age_of_a_heartbeat_when_the_exporter_gets_it():
    e = Exporter()
    now_ms = int(time.time() * 1000)
    e.apply([row(kind="source", action="upsert", cluster="k", source="p", at=now_ms - 4000, interval_ms=2000),
             row(kind="source", action="upsert", cluster="k", source="q", at=now_ms - 40_000, interval_ms=2000)],
            batch_id=0)
    e.apply([row(kind="source", action="remove", cluster="k", source="q", at=now_ms - 40_000)], batch_id=1)
    assert v(e, "source_heartbeat_delay_seconds_count") == 2  # a removal is no heartbeat
    assert v(e, "source_heartbeat_delay_seconds_bucket", le="3.0") == 0
    assert v(e, "source_heartbeat_delay_seconds_bucket", le="5.0") == 1
    assert v(e, "source_heartbeat_delay_seconds_bucket", le="45.0") == 2
    assert 44 <= v(e, "source_heartbeat_delay_seconds_sum") < 50


def test_the_exporter_says_when_the_job_started():
    before = time.time()
    e = Exporter()
    assert before <= v(e, "job_start_timestamp_seconds") <= time.time()


def test_dropped_events_are_counted_by_reason_from_zero():
    e = Exporter()
    assert v(e, "events_dropped_total", reason="duplicate") == 0
    assert v(e, "events_dropped_total", reason="out_of_order") == 0
    e.apply([row(kind="dropped", action="count", alert="duplicate", count=3)], batch_id=0)
    e.apply([row(kind="dropped", action="count", alert="duplicate", count=3)], batch_id=0)  # a replayed batch
    assert v(e, "events_dropped_total", reason="duplicate") == 3


def test_updates_reuse_the_series_and_the_cap_still_holds():
    e = Exporter(max_series=2)
    e.apply([row(kind="group_partition", action="upsert", cluster="k", consumer_group="g", topic="t", partition=0,
                 committed_offset=5, lag=1)], batch_id=0)
    e.apply([row(kind="group_partition", action="upsert", cluster="k", consumer_group="g", topic="t", partition=0,
                 committed_offset=7, lag=0)], batch_id=1)
    assert v(e, "group_partition_committed_offset", cluster="k", group="g", topic="t", partition="0") == 7
    assert v(e, "group_partition_lag", cluster="k", group="g", topic="t", partition="0") == 0
    e.apply([row(kind="group_partition", action="upsert", cluster="k", consumer_group="g", topic="t", partition=1,
                 committed_offset=1, lag=1)], batch_id=2)
    assert v(e, "group_partition_lag", cluster="k", group="g", topic="t", partition="1") is None
    assert v(e, "exporter_series_refused_total") == 2
    e.apply([row(kind="group_partition", action="remove", cluster="k", consumer_group="g", topic="t", partition=0)],
            batch_id=3)
    assert v(e, "group_partition_lag", cluster="k", group="g", topic="t", partition="0") is None


def test_removed_or_refused_series_come_back():
    e = Exporter(max_series=7)
    lab = {"cluster": "k", "topic": "t", "partition": "0"}
    e.apply([part()], batch_id=0)
    e.apply([part(high_watermark=150, last_stable_offset=None)], batch_id=1)
    assert v(e, "partition_high_watermark", **lab) == 150
    e.apply([part(high_watermark=150, leader=2)], batch_id=2)
    assert v(e, "partition_leader", **lab) == 2

    # group partition: None removes the series; the value coming back re-creates it
    g = dict(kind="group_partition", cluster="k", consumer_group="g", topic="t", partition=0)
    glab = {"cluster": "k", "group": "g", "topic": "t", "partition": "0"}
    e.apply([row(action="upsert", committed_offset=5, lag=4, **g)], batch_id=3)
    e.apply([row(action="upsert", committed_offset=5, lag=None, **g)], batch_id=4)
    assert v(e, "group_partition_committed_offset", **glab) == 5
    e.apply([row(action="upsert", committed_offset=6, lag=None, **g)], batch_id=40)
    e.apply([row(action="upsert", committed_offset=5, lag=None, **g)], batch_id=41)
    assert v(e, "group_partition_lag", **glab) is None and v(e, "group_partition_committed_offset", **glab) == 5
    e.apply([row(action="upsert", committed_offset=5, lag=3, **g)], batch_id=5)
    assert v(e, "group_partition_lag", **glab) == 3
    assert v(e, "exporter_series_refused_total") == 0

    # the cap (7 = 5 partition series + 2 group series) refuses a third group series; once a
    # series is freed, the same unchanged row is tried again and gets it
    e.apply([row(action="upsert", committed_offset=5, lag=3, lag_seconds=1.5, **g)], batch_id=6)
    assert v(e, "group_partition_lag_seconds", **glab) is None and v(e, "exporter_series_refused_total") == 1
    e.apply([part(action="remove")], batch_id=7)
    assert v(e, "partition_high_watermark", **lab) is None
    e.apply([row(action="upsert", committed_offset=5, lag=3, lag_seconds=1.5, **g)], batch_id=8)
    assert v(e, "group_partition_lag_seconds", **glab) == 1.5
    # a removed partition sent again with the values it had gets its series back
    e.apply([row(action="remove", **g)], batch_id=9)
    e.apply([part(high_watermark=150, leader=2)], batch_id=10)
    assert v(e, "partition_high_watermark", **lab) == 150 and v(e, "partition_leader", **lab) == 2


def samples(e):
    """The exporter's series, less what depends on the wall clock (creation and start times)."""
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                  for m in e.registry.collect() for s in m.samples
                  if not any(w in s.name for w in ("created", "start_timestamp", "delay_seconds_sum")))


def _table(rows):
    import pyarrow as pa
    arrow = {"long": pa.int64(), "string": pa.string(), "double": pa.float64(), "binary": pa.binary()}
    return pa.Table.from_pylist(rows, schema=pa.schema([(n, arrow[t]) for n, t in OUTPUT_COLUMNS]))


def test_partition_upserts_as_a_block_give_the_series_rows_give():
    """Random batches of partition rows (HW moves, other values change or become unknown,
    removals, a series cap that refuses some): the exporter fed ``sink_rows``' blocks ends each
    batch with the same series as one fed the rows one by one."""
    import random

    from streaming.sinks.batch import sink_rows
    rng = random.Random(7)
    by_rows, by_block = Exporter(max_series=40), Exporter(max_series=40)
    hw = dict.fromkeys(range(12), 100)
    kinds = set()
    for batch in range(60):
        rows = []
        for p in rng.sample(range(12), rng.randrange(1, 12)):
            if rng.random() < 0.08:
                rows.append(part(action="remove", partition=p))
                continue
            hw[p] += rng.choice([0, 5, 5, 5])
            rows.append(part(partition=p, high_watermark=hw[p] if rng.random() > 0.05 else None,
                             leader=rng.choice([1, 1, 1, 2, None]), isr=rng.choice([3, 3, 3, 2]),
                             last_stable_offset=rng.choice([None, None, hw[p]])))
        rows.sort(key=lambda r: r["action"] == "remove")  # as the state emits them: evictions last
        got = sink_rows(_table(rows))
        kinds |= {r["kind"] for r in got}
        assert by_block.apply(got, batch_id=batch) == by_rows.apply(rows, batch_id=batch) == len(rows)
        assert samples(by_block) == samples(by_rows), batch
    assert kinds == {"partition_block", "partition"}
    assert by_rows.registry.get_sample_value("kafka_monitor_exporter_series_refused_total") > 0


def test_packed_partition_blocks_give_the_series_their_rows_give():
    """The state packs its quiet partitions' upserts into ``partition_block`` rows
    (``state.pack_block``); the sink unpacks them next to the ordinary partition rows: the
    exporter ends with the series the same rows give one by one, unknown values included."""
    import numpy as np

    from streaming.state import rows as st_rows
    from streaming.sinks.batch import sink_rows
    from streaming.state.table import NULL

    def gauges(parts, hw, lso):
        n = len(parts)
        return {"kind": np.full(n, "partition", object), "action": np.full(n, "upsert", object),
                "cluster": np.full(n, "k", object), "topic": np.array([f"t{p % 3}" for p in parts], object),
                "partition": np.array(parts, np.int64), "leader": np.full(n, 1, np.int64),
                "replicas": np.full(n, 3, np.int64), "isr": np.array([2 + p % 2 for p in parts], np.int64),
                "high_watermark": np.array([hw + p for p in parts], np.int64), "log_start_offset": np.zeros(n, np.int64),
                "last_stable_offset": np.array([NULL if p % 2 else lso for p in parts], np.int64),
                "at": np.full(n, 1000, np.int64)}

    def as_rows(g):
        return [part(topic=t, partition=int(p), high_watermark=int(h), log_start_offset=0, leader=1, replicas=3,
                     isr=int(i), last_stable_offset=None if lso == NULL else int(lso), at=1000)
                for t, p, h, i, lso in zip(g["topic"], g["partition"], g["high_watermark"], g["isr"],
                                           g["last_stable_offset"])]

    b1, b2 = gauges([0, 1, 2, 3], 100, 50), gauges([4, 5], 200, 70)
    alert = row(kind="alert", action="open", alert="IsrShrink", severity="warning", cluster="k", topic="t", partition=0)
    packed = [part(partition=9), st_rows.pack_block(b1), alert, part(partition=8, action="remove"), st_rows.pack_block(b2)]
    by_rows = [part(partition=9)] + as_rows(b1) + [alert, part(partition=8, action="remove")] + as_rows(b2)
    expanded = st_rows.expand_blocks(st_rows._frame(packed))  # where each block stood, as the state emitted them before
    assert list(expanded["kind"]) == [r["kind"] for r in by_rows]
    for c in ("partition", "high_watermark", "last_stable_offset", "isr"):
        assert [None if pd.isna(x) else x for x in expanded[c]] == [r[c] for r in by_rows], c
    got = sink_rows(_table(packed))
    assert got[0]["kind"] == "partition_block" and got[0]["rows"] == 7
    assert sorted(r["kind"] for r in got[1:]) == ["alert", "partition"]
    block, one_by_one = Exporter(), Exporter()
    assert block.apply(got) == one_by_one.apply(by_rows) == 9
    assert samples(block) == samples(one_by_one)
    assert v(block, "partition_last_stable_offset", cluster="k", topic="t1", partition="1") is None
    assert v(block, "partition_last_stable_offset", cluster="k", topic="t2", partition="2") == 50
    assert v(block, "partition_high_watermark", cluster="k", topic="t2", partition="5") == 205


def test_the_sink_hands_over_only_the_columns_the_exporter_reads():
    """sink_rows keeps, of partition and group-partition rows, only ROW_COLUMNS: the
    exporter must end up with the same series as from whole rows (it would raise KeyError on a
    column it reads that is not listed)."""
    from streaming.sinks.batch import sink_rows
    rows = [part(), part(partition=1, last_stable_offset=90), part(partition=2, action="remove"),
            row(kind="group_partition", action="upsert", cluster="k", consumer_group="g", topic="t", partition=0,
                committed_offset=5, high_watermark=9, lag=4, lag_seconds=1.5, lag_status="ok"),
            row(kind="group_partition", action="remove", cluster="k", consumer_group="g", topic="t", partition=1),
            row(kind="alert", action="open", alert="IsrShrink", severity="warning", cluster="k", topic="t", partition=0),
            row(kind="group", action="upsert", cluster="k", consumer_group="g", group_state="Stable", members=2),
            row(kind="source", action="upsert", cluster="k", source="p", at=1000, interval_ms=5000),
            row(kind="client", action="upsert", cluster="k", source="p", last_ok_at=2000),
            row(kind="quarantine", action="count", alert="malformed_json", count=2),
            row(kind="dropped", action="count", alert="duplicate", count=1)]
    table = _table(rows)
    whole, narrow = Exporter(), Exporter()
    whole.apply(rows)
    got = sink_rows(table)
    assert got[0]["kind"] == "partition_block" and got[0]["rows"] == 2  # the upserts, as columns
    assert tuple(got[0]["columns"]) == ROW_COLUMNS["partition"]
    assert got[1]["kind"] == "partition" and got[1]["action"] == "remove"  # after the block
    assert len(got[1]) == len(ROW_COLUMNS["partition"]) < len(rows[0])
    assert narrow.apply(got) == whole.apply([]) + len(rows)
    assert samples(narrow) == samples(whole)
    assert v(narrow, "partition_high_watermark", cluster="k", topic="t", partition="1") == 100


def test_metrics_render_once_per_change_and_match_the_registry():
    """/metrics: the text (and OpenMetrics) exposition of every series the registry holds,
    rendered once per change of the exporter and shared by the scrapes in between; gzip on
    request."""
    import gzip
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    e = Exporter()
    e.apply([part(), part(partition=1, topic='we"ird\\topic', high_watermark=7.5),
             row(kind="group_partition", action="upsert", cluster="k", consumer_group="g", topic="t", partition=0,
                 committed_offset=5, lag=4, lag_seconds=1.5, lag_status="OK")], batch_id=0)
    port = e.serve(0)
    try:
        def get(accept=None, gz=False):
            headers = {**({"Accept": accept} if accept else {}), **({"Accept-Encoding": "gzip"} if gz else {})}
            with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)) as r:
                body = r.read()
                return gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body
        text = get()
        served = sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                        for f in text_string_to_metric_families(text.decode()) for s in f.samples)
        assert served == sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                                for m in e.registry.collect() for s in m.samples)
        assert ("kafka_monitor_partition_high_watermark", (("cluster", "k"), ("partition", "1"),
                                                           ("topic", 'we"ird\\topic')), 7.5) in served
        assert get(gz=True) == text
        first = e._rendered[False]
        assert get() == text and e._rendered[False] is first  # no change: not rendered again
        om = get(accept="application/openmetrics-text; version=1.0.0")
        assert om.endswith(b"# EOF\n") and om.count(b"# EOF") == 1
        assert b'kafka_monitor_group_partition_lag{cluster="k",group="g",partition="0",topic="t"} 4.0' in om
        e.apply([part(high_watermark=101)], batch_id=1)
        assert b'kafka_monitor_partition_high_watermark{cluster="k",partition="0",topic="t"} 101.0' in get()
    finally:
        e.shutdown()


def test_metrics_lines_are_byte_for_byte_those_prometheus_client_writes():
    """The partition stores are written to /metrics by hand; each line must read exactly as
    prometheus-client would write it (``3.0``, not ``3``: dashboards, greps and the e2e tests
    match the text)."""
    from prometheus_client import generate_latest

    e = Exporter()
    e.apply([part(high_watermark=3), part(partition=1, high_watermark=10**17, isr=3),
             part(partition=2, high_watermark=7.25, log_start_offset=float("inf")),
             row(kind="group_partition", action="upsert", cluster="k", consumer_group="g", topic="t", partition=0,
                 committed_offset=0, lag=-1, lag_seconds=float("nan"), lag_status="OK")], batch_id=0)

    def samples(text: bytes) -> set[bytes]:
        return {ln for ln in text.splitlines() if ln.startswith(b"kafka_monitor_partition_")
                or ln.startswith(b"kafka_monitor_group_partition_")}
    ours, theirs = samples(e.render()), samples(generate_latest(e.registry))
    assert ours == theirs and len(ours) >= 15
    assert b'kafka_monitor_partition_in_sync_replicas{cluster="k",partition="1",topic="t"} 3.0' in ours


def gp(partition, lag, lag_seconds=None, status="OK", topic="t", group="g"):
    return row(kind="group_partition", action="upsert", cluster="k", consumer_group=group, topic=topic,
               partition=partition, committed_offset=1, lag=lag, lag_seconds=lag_seconds, lag_status=status)


def test_per_topic_aggregates_at_both_granularities_and_only_them_at_topic():
    rows = [part(partition=0, isr=3, high_watermark=10), part(partition=1, isr=2, high_watermark=5),
            part(partition=2, leader=-1, isr=0, high_watermark=None), part(topic="u", isr=3),
            gp(0, 4, 1.5), gp(1, 10, 0.5, "STALL"), gp(2, None, None, None), gp(0, 0, 0.0, "OK", topic="u")]
    want = {
        ("topic_partitions", (("cluster", "k"), ("topic", "t"))): 3,
        ("topic_under_replicated_partitions", (("cluster", "k"), ("topic", "t"))): 2,
        ("topic_offline_partitions", (("cluster", "k"), ("topic", "t"))): 1,
        ("topic_high_watermark_sum", (("cluster", "k"), ("topic", "t"))): 15,
        ("topic_under_replicated_partitions", (("cluster", "k"), ("topic", "u"))): 0,
        ("group_topic_lag", (("cluster", "k"), ("group", "g"), ("topic", "t"))): 14,
        ("group_topic_lag_max", (("cluster", "k"), ("group", "g"), ("topic", "t"))): 10,
        ("group_topic_lag_seconds_max", (("cluster", "k"), ("group", "g"), ("topic", "t"))): 1.5,
        ("group_topic_lag_status_partitions", (("cluster", "k"), ("group", "g"), ("status", "STALL"),
                                               ("topic", "t"))): 1,
        ("group_topic_lag_status_partitions", (("cluster", "k"), ("group", "g"), ("status", "OK"), ("topic", "t"))): 1,
        ("group_topic_lag_status_partitions", (("cluster", "k"), ("group", "g"), ("status", "STOP"),
                                               ("topic", "t"))): 0,
        ("group_topic_lag_max", (("cluster", "k"), ("group", "g"), ("topic", "u"))): 0,
    }
    for granularity in ("partition", "topic"):
        e = Exporter(max_series=1000, granularity=granularity)
        e.apply(rows + [row(kind="alert", action="open", alert="UnderReplicated", severity="warning", cluster="k",
                            topic="t", partition=1, alert_id="a1")], batch_id=0)
        got = {(n[len("kafka_monitor_"):], lab): val for n, lab, val in samples(e)}
        for k, val in want.items():
            assert got.get(k) == val, (granularity, k, got.get(k))
        per_partition = {n for n, _ in got if n.startswith(("partition_", "group_partition_"))}
        assert bool(per_partition) == (granularity == "partition"), (granularity, per_partition)
        assert v(e, "alert_active", alert="UnderReplicated", severity="warning", cluster="k", topic="t",
                 partition="1", group="", source="", broker="") == 1  # alerts keep their partition at both
        text = e.render().decode()
        assert 'kafka_monitor_group_topic_lag_max{cluster="k",group="g",topic="t"} 10.0' in text
        assert ("kafka_monitor_partition_high_watermark{" in text) == (granularity == "partition")
    import pytest
    with pytest.raises(ValueError, match="granularity"):
        Exporter(granularity="broker")


def test_the_cap_holds_against_ten_times_the_entities_it_allows_and_counts_each_refusal():
    """max_series 1,000; 10x that many entity series arrive (partitions and group partitions, in
    several batches, some updated twice): never more than 1,000 entity series, every refused
    series counted once per row that tried it, and the aggregates still count every partition."""
    cap = 1000
    e = Exporter(max_series=cap)
    n_parts, n_gparts = 1000, 1000  # 6,000 + 4,000 = 10,000 entity series offered
    for b in range(4):
        rows = [part(topic=f"t{i % 50}", partition=i, high_watermark=100 + b, last_stable_offset=100)
                for i in range(b * n_parts // 4, (b + 1) * n_parts // 4)]
        rows += [gp(i, 5, 1.0, topic=f"t{i % 50}") for i in range(b * n_gparts // 4, (b + 1) * n_gparts // 4)]
        e.apply(rows, batch_id=b)
    served = [s for s in samples(e) if s[0].startswith(("kafka_monitor_partition_", "kafka_monitor_group_partition_"))]
    assert len(served) <= cap and len(served) >= cap - 10
    refused = v(e, "exporter_series_refused_total")
    assert refused == 6 * n_parts + 4 * n_gparts - len(served)
    # the same rows again: each refused series is tried (and counted) again, none served twice
    e.apply([part(topic=f"t{i % 50}", partition=i, high_watermark=200, last_stable_offset=100)
             for i in range(n_parts)], batch_id=9)
    assert len([s for s in samples(e) if s[0].startswith(("kafka_monitor_partition_", "kafka_monitor_group_partition_"))]) <= cap
    assert v(e, "exporter_series_refused_total") > refused
    assert sum(v(e, "topic_partitions", cluster="k", topic=f"t{i}") for i in range(50)) == n_parts


def test_a_consumers_fetch_view_is_served_and_removed_with_its_entity():
    e = Exporter()
    lab = dict(cluster="k", group="g", topic="t", partition="0")
    fetch = dict(kind="client_fetch", cluster="k", consumer_group="g", topic="t", partition=0, source="app-1",
                 position=45, committed_offset=44, high_watermark=50, lag=6, fetch_state="active")
    e.apply([row(action="upsert", **fetch)], batch_id=0)
    assert (v(e, "client_fetch_position", **lab), v(e, "client_fetch_committed_offset", **lab),
            v(e, "client_fetch_high_watermark", **lab), v(e, "client_fetch_lag", **lab)) == (45, 44, 50, 6)
    assert v(e, "client_fetch_state", state="active", **lab) == 1
    e.apply([row(action="upsert", **{**fetch, "fetch_state": "stopped", "lag": None})], batch_id=1)
    assert v(e, "client_fetch_state", state="active", **lab) is None
    assert v(e, "client_fetch_state", state="stopped", **lab) == 1
    assert v(e, "client_fetch_lag", **lab) is None  # unknown now: absent, not 0
    e.apply([row(action="remove", **fetch)], batch_id=2)
    assert all(v(e, m, **lab) is None for m in ("client_fetch_position", "client_fetch_committed_offset",
                                                 "client_fetch_high_watermark"))
    assert v(e, "client_fetch_state", state="stopped", **lab) is None


def canary_row(action="upsert", leader=2, **kw):
    rep = {"started_at": 1, "sent": 12, "acked": 10, "received": 9, "lost": 1, "duplicated": 0, "out_of_order": 0,
           "pending": 2, "oldest_pending_ms": 1500, "produce_latency_counts": [0, 4, 5] + [0] * 10 + [1],
           "produce_latency_sum_ms": 40_100.0, "e2e_latency_counts": [0, 0, 9] + [0] * 11, "e2e_latency_sum_ms": 63.0,
           "errors": {"NOT_ENOUGH_REPLICAS": 2}, **kw}
    return row(kind="canary", action=action, cluster="k", topic="c", partition=0, leader=leader, report=json.dumps(rep))


def test_canary_reports_are_served_as_histograms_counters_and_gauges_of_partition_and_broker():
    e = Exporter()
    e.apply([canary_row()], batch_id=0)
    lab = {"cluster": "k", "topic": "c", "partition": "0", "broker": "2"}
    assert v(e, "canary_messages_sent_total", **lab) == 12
    assert v(e, "canary_messages_lost_total", **lab) == 1
    assert v(e, "canary_produce_errors_total", **lab, code="NOT_ENOUGH_REPLICAS") == 2
    assert v(e, "canary_pending_messages", **lab) == 2 and v(e, "canary_oldest_pending_seconds", **lab) == 1.5
    # buckets are cumulative, in seconds: 4 writes <= 5 ms, 9 <= 10 ms, the 10th above 30 s
    assert v(e, "canary_produce_latency_seconds_bucket", **lab, le="0.005") == 4
    assert v(e, "canary_produce_latency_seconds_bucket", **lab, le="0.01") == 9
    assert v(e, "canary_produce_latency_seconds_bucket", **lab, le="30.0") == 9
    assert v(e, "canary_produce_latency_seconds_bucket", **lab, le="+Inf") == 10
    assert v(e, "canary_produce_latency_seconds_count", **lab) == 10
    assert v(e, "canary_produce_latency_seconds_sum", **lab) == 40.1
    text = e.render().decode()
    assert "# TYPE kafka_monitor_canary_end_to_end_latency_seconds histogram" in text
    # leadership moved: the partition's series follow its broker (no series left for the old one)
    e.apply([canary_row(leader=3, sent=20)], batch_id=1)
    assert v(e, "canary_messages_sent_total", **lab) is None
    assert v(e, "canary_messages_sent_total", **{**lab, "broker": "3"}) == 20
    e.apply([canary_row(action="remove")], batch_id=2)
    assert "kafka_monitor_canary_messages_sent_total{" not in e.render().decode()


def test_canary_histograms_of_other_buckets_are_not_served_and_partitions_are_capped(monkeypatch):
    import streaming.sinks.exporter as ex
    e = Exporter()
    e.apply([canary_row(produce_latency_counts=[1, 2, 3])], batch_id=0)
    lab = {"cluster": "k", "topic": "c", "partition": "0", "broker": "2"}
    assert v(e, "canary_produce_latency_seconds_count", **lab) is None  # not served rather than served wrong
    assert v(e, "canary_end_to_end_latency_seconds_count", **lab) == 9
    monkeypatch.setattr(ex, "MAX_CANARY_PARTITIONS", 1)
    e.apply([{**canary_row(), "partition": 1}], batch_id=1)
    assert v(e, "canary_messages_sent_total", **{**lab, "partition": "1"}) is None
    assert v(e, "exporter_series_refused_total") == 1


def test_an_instrumented_producers_partition_report_is_served_per_source_and_leader():
    e = Exporter()
    rep = {"leader": 1, "queued_messages": 4, "in_flight_messages": 2, "sent_messages": 40, "sent_bytes": 4000,
           "leader_rtt_avg_ms": 1.5, "leader_rtt_p99_ms": 3.9, "leader_queue_latency_p99_ms": None,
           "leader_request_errors": 2, "leader_request_retries": 5, "leader_request_timeouts": 1,
           "delivered_messages": 37, "delivery_errors": {"NOT_ENOUGH_REPLICAS": 3},
           "delivery_latency_counts": [0, 0, 30, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "delivery_latency_sum_ms": 400.0}
    r = row(kind="client_produce", action="upsert", cluster="k", source="app-1", topic="t", partition=0, leader=1,
            report=json.dumps(rep))
    e.apply([r], batch_id=0)
    lab = {"cluster": "k", "source": "app-1", "topic": "t", "partition": "0", "broker": "1"}
    assert v(e, "client_produce_in_flight_messages", **lab) == 2
    assert v(e, "client_produce_sent_messages_total", **lab) == 40
    assert v(e, "client_produce_leader_rtt_p99_seconds", **lab) == 0.0039
    assert v(e, "client_produce_leader_queue_latency_p99_seconds", **lab) is None  # unknown: absent, not 0
    assert v(e, "client_produce_leader_request_errors_total", **lab) == 2
    assert v(e, "client_produce_delivered_messages_total", **lab) == 37
    assert v(e, "client_produce_delivery_errors_total", **lab, code="NOT_ENOUGH_REPLICAS") == 3
    assert v(e, "client_produce_delivery_latency_seconds_bucket", **lab, le="0.01") == 30
    assert v(e, "client_produce_delivery_latency_seconds_bucket", **lab, le="+Inf") == 37
    assert v(e, "client_produce_delivery_latency_seconds_sum", **lab) == 0.4
    e.apply([{**r, "action": "remove"}], batch_id=1)
    assert v(e, "client_produce_in_flight_messages", **lab) is None


def test_each_metric_is_described_once_in_the_exposition():
    """The report-based series (canary, instrumented producers) come from their collector only: a
    second HELP line for a name makes Prometheus refuse the whole scrape."""
    e = Exporter()
    e.apply([canary_row(), row(kind="client_produce", action="upsert", cluster="k", source="a", topic="t",
                               partition=0, leader=1, report=json.dumps({"sent_messages": 3, "in_flight_messages": 0}))],
            batch_id=0)
    helps = [line.split()[2] for line in e.render().decode().splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps)), sorted(h for h in helps if helps.count(h) > 1)


def test_the_sink_shows_a_batch_on_metrics_before_it_publishes_its_alerts(monkeypatch):
    """Publishing waits out a fault of the alerts topic's brokers (issue 33): the batch's alerts
    are on /metrics while it waits, and the batch counts as done only once they are published."""
    from streaming.sinks import batch

    e = Exporter()
    lab = {"alert": "IsrShrink", "severity": "warning", "cluster": "k", "topic": "t", "partition": "0",
           "group": "", "source": "", "broker": ""}
    seen = []

    class SlowAlerts:
        def publish(self, batch_id, rows):
            seen.append((batch_id, [r["alert"] for r in rows], v(e, "alert_active", **lab),
                         v(e, "job_batches_total")))
            return len(rows)

    class Batch:
        def toArrow(self):
            return [row(kind="alert", action="open", alert="IsrShrink", severity="warning", cluster="k", topic="t",
                        partition=0)]

    monkeypatch.setattr(batch, "sink_rows", lambda rows: rows)
    batch.ExporterSink(e, SlowAlerts())(Batch(), 7)
    assert seen == [(7, ["IsrShrink"], 1.0, 0.0)]
    assert v(e, "job_batches_total") == 1
