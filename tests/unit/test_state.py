"""The applyInPandasWithState function, driven without Spark through a fake GroupState."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from streaming.rules.client import ClientRulesConfig
from streaming.rules.source import SourceRulesConfig

from streaming.state import function as st
from streaming.state import fold as sfold
from streaming.state import codec
from streaming.state import rows as st_rows
from streaming.job import FLAT_COLUMNS
from tests.support.state_fakes import FakeState, call, canary, goff, pmd, poff, rows


def test_batch_folds_in_event_order_and_emits_gauges_and_transitions():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=60_000))
    s = FakeState()
    # deliberately out of order in the frame: the shrink (seq 2) must be seen after the full ISR (seq 1)
    out = call(fn, 3, rows(pmd(2, 2000, [1, 3]), pmd(1, 1000, [1, 2, 3]), poff(3, 2000, 500),
                           goff(4, 2000, 450, 500)), s)
    alerts = out[out.kind == "alert"]
    assert sorted(zip(alerts.alert, alerts.action)) == [("IsrShrink", "open"), ("UnderReplicated", "open")]
    part = out[out.kind == "partition"].iloc[0]
    assert (part.high_watermark, part.isr, part.replicas, part.leader) == (500, 2, 3, 1)
    gp = out[out.kind == "group_partition"].iloc[0]
    assert (gp.committed_offset, gp.lag, gp.consumer_group) == (450, 50, "g")
    assert s.timeout == st.StateConfig().tick_ms
    assert set(codec.stored_entities(s.value[0])) == {"partition|k/t/0", "group_partition|k/g/t/0"}
    assert list(out.columns) == [n for n, _ in st_rows.OUTPUT_COLUMNS]


def test_state_carries_over_between_batches():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=60_000))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 1000, [1, 2, 3])), s)
    out = call(fn, 0, rows(pmd(2, 2000, [1, 2])), s)
    assert ("IsrShrink", "open") in set(zip(out.alert, out.action))


def test_a_new_run_restates_the_alerts_still_open_once_and_publishes_nothing():
    """A restarted job (a new run id) starts with an empty exporter: each bucket's first call in
    the run restates its open alerts (``open_alert`` rows, as they were opened: labels and
    severity), once, on the data path or the timer's; they are not transitions."""
    from streaming.sinks.exporter import Exporter
    from streaming.sinks.batch import sink_rows
    import pyarrow as pa

    s = FakeState()
    first = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id="run-1"))
    call(first, 0, rows(pmd(1, 1000, [1, 2, 3]), goff(2, 1000, 0, 10)), s)
    opened = call(first, 0, rows(pmd(3, 2000, [1, 3])), s)
    opened = opened[opened.kind == "alert"]
    assert set(opened.alert) == {"IsrShrink", "UnderReplicated"}
    assert call(first, 0, rows(pmd(4, 3000, [1, 3])), s).query("kind == 'open_alert'").empty  # same run

    again = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id="run-2"))
    out = call(again, 0, rows(goff(5, 4000, 0, 20)), s)  # the partition itself is not in the batch
    restated = out[out.kind == "open_alert"]
    assert out[out.kind == "alert"].empty
    cols = ["alert", "alert_id", "severity", "cluster", "topic", "partition", "broker", "at"]
    assert (restated[cols].sort_values("alert").reset_index(drop=True)
            .equals(opened[cols].sort_values("alert").reset_index(drop=True)))
    assert call(again, 0, rows(goff(6, 5000, 0, 30)), s).query("kind == 'open_alert'").empty  # once a run

    third = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id="run-3"))
    s.hasTimedOut, s.processing_time_ms = True, 6000
    timed = pd.concat(list(third((0,), iter([]), s)), ignore_index=True)
    assert set(timed[timed.kind == "open_alert"].alert) == {"IsrShrink", "UnderReplicated"}

    e = Exporter()
    e.apply(sink_rows(pa.Table.from_pandas(out, preserve_index=False)), batch_id=0)
    assert e.registry.get_sample_value("kafka_monitor_alert_active", {
        "alert": "IsrShrink", "severity": "warning", "cluster": "k", "topic": "t", "partition": "0", "group": "",
        "source": "", "broker": "2"}) == 1  # broker 2 left the ISR: the alert names it
    assert e.registry.get_sample_value("kafka_monitor_alert_transitions_total",
                                       {"alert": "IsrShrink", "action": "open"}) is None


def test_entities_not_seen_for_the_ttl_are_removed_with_their_alerts_resolved():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=10_000))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 1000, [1, 2, 3], part=0), pmd(2, 1000, [1, 2, 3], part=1)), s)
    call(fn, 0, rows(pmd(3, 2000, [1], part=1)), s)
    out = call(fn, 0, rows(pmd(4, 30_000, [1, 2, 3], part=0)), s)  # partition 1 silent for 28 s
    removed = out[(out.kind == "partition") & (out.action == "remove")]
    assert list(removed.partition) == [1]
    resolved = out[(out.kind == "alert") & (out.action == "resolve")]
    assert set(resolved.alert) == {"IsrShrink", "UnderReplicated"}
    assert set(codec.stored_entities(s.value[0])) == {"partition|k/t/0"}


def test_timeout_evicts_by_the_clock_and_drops_empty_state():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=10_000))
    s = FakeState()
    call(fn, 0, rows(poff(1, 1000, 5)), s)
    s.hasTimedOut, s.processing_time_ms = True, 100_000
    out = list(fn((0,), iter([]), s))
    assert len(out) == 1
    df = out[0]
    assert list(df[df.kind == "partition"].action) == ["remove"]
    # silent for 99 s: PartitionUnobserved is raised, and resolved as the partition is dropped
    assert sorted(zip(df[df.kind == "alert"].alert, df[df.kind == "alert"].action)) == [
        ("PartitionUnobserved", "open"), ("PartitionUnobserved", "resolve")]
    assert s.value is None


def test_quarantine_bucket_counts_by_reason_and_keeps_no_state():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=10_000))
    s = FakeState()
    bad = [{"reason": "malformed_json", "raw": "{oops", "observed_at": None},
           {"reason": "malformed_json", "raw": "{", "observed_at": None},
           {"reason": "unknown_type", "raw": "{...}", "observed_at": 5}]
    out = call(fn, st.QUARANTINE_BUCKET, rows(*bad), s)
    counts = out[out.kind == "quarantine"]
    got = {r.alert: r["count"] for _, r in counts.iterrows()}
    assert got == {"malformed_json": 2, "unknown_type": 1}
    assert set(out.kind) == {"quarantine", "quarantine_event"}
    events = out[out.kind == "quarantine_event"]
    assert sorted(zip(events.alert, events.evidence)) == [("malformed_json", "{"), ("malformed_json", "{oops"),
                                                          ("unknown_type", "{...}")]
    assert json.loads(counts[counts.alert == "malformed_json"].evidence.iloc[0])["sample"] == "{oops"
    assert s.value is None


# -- duplicates and out-of-order observations --------------------------------------------------

@pytest.mark.parametrize("applied, etype, source, t, event_id, expected", [
    ([], "partition_metadata", "p", 1000, "a", None),                                     # first
    ([("partition_metadata", "p", 1000, "a")], "partition_metadata", "p", 1000, "a", "duplicate"),
    ([("partition_metadata", "p", 1000, "a")], "partition_metadata", "p", 1000, "b", None),  # same ms, other event
    ([("partition_metadata", "p", 1000, "a")], "partition_metadata", "p", 2000, "a", None),  # newer: a new observation
    ([("partition_metadata", "p", 2000, "a")], "partition_metadata", "p", 1000, "b", "out_of_order"),
    ([("partition_metadata", "p", 1000, "a"), ("partition_metadata", "p", 1000, "b")],
     "partition_metadata", "p", 1000, "a", "duplicate"),                                  # every id at the latest time
    ([("partition_metadata", "p", 2000, "a")], "partition_offsets", "p", 1000, "b", None),   # other type: independent
    ([("partition_metadata", "p", 2000, "a")], "partition_metadata", "q", 1000, "b", None),  # other source: own clock
    ([("partition_metadata", "p", 1000, None)], "partition_metadata", "p", 1000, None, None),  # no id: never a duplicate
])
def test_admit(applied, etype, source, t, event_id, expected):
    s: dict = {}
    for a in applied:
        assert sfold.admit(s, *a) is None
    assert sfold.admit(s, etype, source, t, event_id) == expected


def test_memory_of_ids_per_entity_is_bounded():
    s: dict = {}
    for i in range(100):
        sfold.admit(s, "partition_offsets", "p", 1000, f"e{i}")
    assert len(s["applied"][("partition_offsets", "p")][1]) == sfold.DEDUP_IDS
    sfold.admit(s, "partition_offsets", "p", 2000, "x")
    assert s["applied"][("partition_offsets", "p")] == (2000, ["x"])


def test_sources_remembered_per_entity_are_bounded():
    """Every restarted probe pod is a new source (probe-<hostname>): an entity remembers at most
    MAX_SOURCES per type, forgetting the one that reported longest ago; the others keep their
    clocks, and another type's sources are not touched."""
    s: dict = {}
    assert sfold.admit(s, "partition_metadata", "old", 500, "m") is None
    for i in range(sfold.MAX_SOURCES + 3):
        assert sfold.admit(s, "partition_offsets", f"probe-{i}", 1000 + i, f"e{i}") is None
    offsets = sorted(src for typ, src in s["applied"] if typ == "partition_offsets")
    assert offsets == sorted(f"probe-{i}" for i in range(3, sfold.MAX_SOURCES + 3))
    assert ("partition_metadata", "old") in s["applied"]
    assert sfold.admit(s, "partition_offsets", "probe-5", 1004, "x") == "out_of_order"  # still remembered
    assert sfold.admit(s, "partition_offsets", "probe-0", 900, "y") is None  # forgotten: a new source again


def test_a_replayed_event_changes_nothing_and_is_counted():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=60_000))
    s = FakeState()
    first = {**pmd(1, 1000, [1, 2, 3]), "event_id": "e1"}
    shrink = {**pmd(2, 2000, [1, 3]), "event_id": "e2"}
    out = call(fn, 0, rows(first, shrink, {**shrink}), s)  # a duplicate in the same batch
    assert sorted(zip(out[out.kind == "alert"].alert, out[out.kind == "alert"].action)) == [
        ("IsrShrink", "open"), ("UnderReplicated", "open")]
    assert {r.alert: r["count"] for _, r in out[out.kind == "dropped"].iterrows()} == {"duplicate": 1}
    # the same two events again in a later batch (a producer retry), then a stale full ISR
    stale = {**pmd(3, 1500, [1, 2, 3]), "event_id": "e3"}
    out = call(fn, 0, rows(first, shrink, stale), s)
    assert out[out.kind == "alert"].empty
    # only ids at the latest event time are remembered: the replay of the older event (e1)
    # counts as out of order, the replay of the latest (e2) as a duplicate
    assert {r.alert: r["count"] for _, r in out[out.kind == "dropped"].iterrows()} == {
        "duplicate": 1, "out_of_order": 2}
    assert codec.stored_entities(s.value[0])["partition|k/t/0"]["isr"] == [1, 3]


# -- gauges are sent when they change ----------------------------------------------------------

def test_unchanged_entities_are_not_sent_again_within_a_run():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=60_000, run_id="run-1"))
    s = FakeState()
    out = call(fn, 0, rows(poff(1, 1000, 5, part=0), poff(2, 1000, 7, part=1)), s)
    assert sorted(out[out.kind == "partition"].partition) == [0, 1]
    out = call(fn, 0, rows(poff(3, 2000, 5, part=0), poff(4, 2000, 8, part=1)), s)  # only partition 1 moved
    assert list(out[out.kind == "partition"].partition) == [1]
    assert list(out[out.kind == "partition"].high_watermark) == [8]
    # a new run (a restarted job: its exporter is empty) sends every touched entity once
    fn2 = st.make_state_function(st.StateConfig(entity_ttl_ms=60_000, run_id="run-2"))
    out = call(fn2, 0, rows(poff(5, 3000, 5, part=0), poff(6, 3000, 8, part=1)), s)
    assert sorted(out[out.kind == "partition"].partition) == [0, 1]


def test_the_change_signature_covers_every_exported_field():
    ents: dict = {}
    sfold.fold(ents, rows({**pmd(1, 1000, [1, 2]), "event_id": "a"}, {**poff(2, 1000, 9), "event_id": "b"},
                       {**goff(3, 1000, 4, 9), "event_id": "c"}), st.StateConfig())
    fields = {"partition": ("leader", "replicas", "isr", "high_watermark", "log_start_offset", "last_stable_offset"),
              "group_partition": ("committed_offset", "high_watermark", "lag", "lag_seconds", "lag_status",
                                  "read_committed_lag")}
    for s in ents.values():
        row = st_rows._entity_row(s)
        assert st_rows._exported(s) == tuple(row[f] for f in fields[s["kind"]]), s["kind"]


def test_text_columns_are_the_string_columns_of_the_flat_rows():
    assert st_rows._TEXT_COLUMNS == {n for n, t in FLAT_COLUMNS if t == "string"}


def test_bucket_keys_are_distinct_stable_and_spread():
    from streaming.job import bucket_keys, spark_hash_int
    for buckets in (1, 2, 16, 100, 4096):
        keys = bucket_keys(buckets)
        assert len(set(keys)) == buckets and min(keys) >= 0  # never the quarantine bucket (-1)
        assert [spark_hash_int(k) % buckets for k in keys] == list(range(buckets))
    assert bucket_keys(16) == [12, 16, 5, 1, 37, 20, 2, 35, 13, 6, 49, 7, 25, 15, 4, 0]  # state is keyed by these


def test_quarantine_samples_are_bounded_per_batch_and_any_event_time_is_survived(monkeypatch):
    """The quarantine bucket gets every refused row of a batch: it reads them frame by frame,
    lists each (reason, size, time) but keeps samples only within the batch's budget; a refused
    row's observed_at may be anything (2**63 - 1 arrives as the float 2**63)."""
    monkeypatch.setattr(st_rows, "QUARANTINE_SAMPLE_BUDGET", 10)
    fn = st.make_state_function(st.StateConfig())
    frames = [rows({"reason": "oversized", "raw": "x" * 6, "raw_bytes": 100_000, "observed_at": None},
                   {"reason": "malformed_json", "raw": "{bad", "raw_bytes": 4, "observed_at": float(2 ** 63)}),
              rows({"reason": "malformed_json", "raw": "{worse", "raw_bytes": 6, "observed_at": 1_000.0})]
    out = pd.concat(list(fn((st.QUARANTINE_BUCKET,), iter(frames), FakeState())), ignore_index=True)
    events = out[out.kind == "quarantine_event"]
    assert list(events.alert) == ["oversized", "malformed_json", "malformed_json"]
    assert list(events["count"]) == [100_000, 4, 6]                       # each value's whole size
    assert list(events.evidence) == ["x" * 6, "{bad", None]               # 10 characters of samples in all
    assert [None if pd.isna(v) else v for v in events["at"]] == [None, None, 1_000]
    counts = {r.alert: r["count"] for _, r in out[out.kind == "quarantine"].iterrows()}
    assert counts == {"oversized": 1, "malformed_json": 2}


def test_the_read_committed_lag_is_measured_to_the_last_stable_offset():
    """An open transaction: HW 13, LSO 6, committed 2 -> lag 11, read_committed lag 4; unknown LSO:
    no read_committed lag (never a guess from the HW)."""
    from streaming.sinks.exporter import Exporter
    from streaming.sinks.batch import sink_rows
    import pyarrow as pa

    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=60_000))
    s = FakeState()
    out = call(fn, 0, rows({**goff(1, 1000, 2, 13), "last_stable_offset": 6},
                           {**goff(2, 1000, 2, 13, part=1)}), s)
    gp = out[out.kind == "group_partition"].set_index("partition")
    assert (gp.loc[0, "lag"], gp.loc[0, "read_committed_lag"]) == (11, 4)
    assert gp.loc[1, "lag"] == 11 and pd.isna(gp.loc[1, "read_committed_lag"])
    e = Exporter()
    e.apply(sink_rows(pa.Table.from_pandas(out, preserve_index=False)), batch_id=0)
    lab = {"cluster": "k", "group": "g", "topic": "t"}
    assert e.registry.get_sample_value("kafka_monitor_group_partition_read_committed_lag",
                                       {**lab, "partition": "0"}) == 4
    assert e.registry.get_sample_value("kafka_monitor_group_partition_read_committed_lag",
                                       {**lab, "partition": "1"}) is None


def test_timers_expire_at_their_moment_whatever_the_batches():
    """A client whose metadata refreshes succeed every second with max age 1 s (stale after
    2 s), then one that took 3.5 s, and later one that took 3.5 s again; a source whose heartbeats (1 s interval) pause for
    4 s: the same events folded in one batch, in a batch per event and in random batches (each
    ticked at its end, as the job does) give the same transitions, stamped when the timer
    expired.  A restarted job re-reads its backlog in other batches than the run it replaces."""
    import random

    def mr(seq, t, ok=True):
        return {"type": "metadata_refresh", "entity": "client|k/p", "cluster": "k", "source": "p", "seq": seq,
                "observed_at": t, "version": seq, "refresh_reason": "periodic", "ok": ok,
                "metadata_max_age_ms": 1000}

    def hb(seq, t):
        return {"type": "heartbeat", "entity": "source|k/p", "cluster": "k", "source": "p", "seq": seq,
                "observed_at": t, "interval_ms": 1000, "events_sent": seq, "events_dropped": 0, "started_at": 0}

    times = [0, 1000, 2000, 5500, 6500, 7500, 11000, 12000]
    events = [mr(i, t) for i, t in enumerate(times)] + [hb(100 + i, t) for i, t in enumerate([0, 1000, 5000, 6000])]
    events.sort(key=lambda e: e["observed_at"])

    cfg = st.StateConfig(client=ClientRulesConfig(silence_grace_ms=0),  # the factors' limits alone
                         source=SourceRulesConfig(silence_grace_ms=0))

    def run(batches):
        ents, out = {}, []
        for b in batches:
            got, _ = sfold.fold(ents, rows(*b), cfg)
            out += got
            out += sfold.tick(ents, max(e["observed_at"] for e in b), cfg)
        return sorted((t.at, t.alert.value, t.action) for t in out)

    whole = run([events])
    assert [x for x in whole if x[1] == "MetadataStale"] == [
        (2000 + 2001, "MetadataStale", "open"), (5500, "MetadataStale", "resolve"),
        (7500 + 2001, "MetadataStale", "open"), (11000, "MetadataStale", "resolve")]
    assert [x for x in whole if x[1] == "SourceSilent"] == [  # and silent for good after 6000
        (4001, "SourceSilent", "open"), (5000, "SourceSilent", "resolve"), (9001, "SourceSilent", "open")]
    assert run([[e] for e in events]) == whole
    rnd = random.Random(7)
    for _ in range(20):
        cuts = sorted(rnd.sample(range(1, len(events)), rnd.randint(1, 5)))
        parts = [events[i:j] for i, j in zip([0] + cuts, cuts + [len(events)])]
        assert run(parts) == whole, cuts


def cfetch(seq, t, position, committed, hw, state="active", source="app-1", part=0):
    return {"type": "client_fetch", "entity": f"client_fetch|k/g/t/{part}", "cluster": "k", "source": source,
            "seq": seq, "observed_at": t, "group": "g", "topic": "t", "partition": part, "fetch_state": state,
            "position": position, "committed": committed, "high_watermark": hw, "last_stable_offset": hw,
            "log_start_offset": 0, "consumer_lag": hw - committed, "leader": 1}


def test_a_consumers_fetch_reports_become_client_fetch_rows_and_go_with_the_ttl():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=60_000, run_id="r"))
    s = FakeState()
    out = call(fn, 0, rows(cfetch(1, 1_000, 40, 38, 50), cfetch(2, 2_000, 45, 44, 50)), s)
    got = out[out.kind == "client_fetch"]
    assert len(got) == 1  # the latest report of the batch
    r = got.iloc[0]
    assert (r.consumer_group, r.topic, r.partition, r.source, r.fetch_state) == ("g", "t", 0, "app-1", "active")
    assert (r.position, r.committed_offset, r.high_watermark, r.lag, r.leader) == (45, 44, 50, 6, 1)
    assert out[out.kind == "alert"].empty
    # after a rebalance the partition's new owner reports it: same entity, its values
    out = call(fn, 0, rows(cfetch(1, 3_000, 46, 46, 52, state="offset-query", source="app-2")), s)
    r = out[out.kind == "client_fetch"].iloc[0]
    assert (r.source, r.fetch_state, r.position) == ("app-2", "offset-query", 46)
    # not reported for the TTL: removed
    s.hasTimedOut, s.processing_time_ms = True, 70_000
    out = call(fn, 0, rows(), s)
    assert list(zip(out.kind, out.action)) == [("client_fetch", "remove"), ("removed", "count"), ("state", "count")]


def test_canary_writes_pending_under_a_flat_hw_raise_high_watermark_stalled_until_it_moves():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id="r"))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 1_000, [1, 2, 3]), poff(2, 1_000, 100)), s)
    # the canary reports its latest counters; none pending: nothing to decide
    out = call(fn, 0, rows(canary(1, 2_000, 0), poff(3, 2_000, 110)), s)
    got = out[out.kind == "canary"].iloc[0]
    assert (got.topic, got.partition, got.leader, json.loads(got.report)["sent"]) == ("t", 0, 1, 10)
    # writes pending from 10 s on, the HW flat: the stall opens once it lasted hw_stall_ms (10 s)
    out = call(fn, 0, rows(canary(2, 10_000, 3, sent=20), poff(4, 10_000, 110), poff(5, 19_000, 110)), s)
    assert out[out.kind == "alert"].empty
    out = call(fn, 0, rows(poff(6, 20_000, 110)), s)
    (opened,) = out[(out.kind == "alert") & (out.action == "open")].itertuples()
    assert opened.alert == "HighWatermarkStalled" and json.loads(opened.evidence)["pending_writes_since"] == 10_000
    # the HW moves (the write path recovered): resolved
    out = call(fn, 0, rows(canary(3, 71_000, 0, sent=30), poff(7, 72_000, 130)), s)
    (resolved,) = out[(out.kind == "alert") & (out.action == "resolve")].itertuples()
    assert resolved.alert == "HighWatermarkStalled"


def test_a_canary_write_unacknowledged_for_the_stall_window_opens_the_stall_without_hw_observations():
    """The probe may be blind (waiting for a paused broker): a write the canary has waited 10 s
    for is evidence enough that the HW has not passed it."""
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id="r"))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 1_000, [1, 2, 3]), poff(2, 1_000, 100)), s)
    out = call(fn, 0, rows(canary(1, 6_000, 4, oldest=9_999)), s)
    assert out[out.kind == "alert"].empty
    out = call(fn, 0, rows(canary(3, 14_000, 9, oldest=12_000)), s)
    (opened,) = out[out.kind == "alert"].itertuples()
    assert (opened.alert, opened.action, opened.partition) == ("HighWatermarkStalled", "open", 0)
    assert json.loads(opened.evidence)["oldest_unacknowledged_write_sent_at"] == 2_000
    out = call(fn, 0, rows(canary(4, 16_000, 14, oldest=14_000)), s)
    assert out[out.kind == "alert"].empty  # open once
    # an observation older than the stall, arriving after it, does not resolve it; a newer one does
    out = call(fn, 0, rows(poff(3, 13_900, 140)), s)
    assert out[out.kind == "alert"].empty
    out = call(fn, 0, rows(poff(4, 18_000, 150)), s)
    (resolved,) = out[out.kind == "alert"].itertuples()
    assert (resolved.alert, resolved.action, resolved.at) == ("HighWatermarkStalled", "resolve", 18_000)


def test_a_canary_report_without_pending_writes_never_stalls_a_flat_hw():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id="r"))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 1_000, [1, 2, 3]), poff(2, 1_000, 100)), s)
    for i in range(1, 10):  # an idle partition with a canary that has nothing in flight
        out = call(fn, 0, rows(canary(i, i * 20_000, 0), poff(2 + i, i * 20_000, 100)), s)
        assert out[out.kind == "alert"].empty


def bstate(seq, t, node, registered, holds=10, behind=0, leads=3):
    return {"type": "broker_state", "entity": f"broker|k/broker/{node}", "cluster": "k", "source": "p", "seq": seq,
            "observed_at": t, "node_id": node, "registered": registered, "leader_partitions": leads,
            "replica_partitions": holds, "out_of_sync_replicas": behind}


def test_a_broker_down_then_back_and_a_broker_behind_are_one_alert_each_naming_the_broker():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id="r"))
    s = FakeState()
    out = call(fn, 0, rows(bstate(1, 1_000, 3, True)), s)
    got = out[out.kind == "broker"].iloc[0]
    assert (got.broker, got.registered, got.leader_partitions, got.replicas, got.out_of_sync_replicas) == (3, 1, 3, 10, 0)
    assert out[out.kind == "alert"].empty
    # stopped: not listed, its replicas out of every ISR; one alert, not one per partition
    out = call(fn, 0, rows(bstate(2, 2_000, 3, False, behind=10, leads=0), bstate(3, 3_000, 3, False, behind=10, leads=0)), s)
    (down,) = out[out.kind == "alert"].itertuples()
    assert (down.alert, down.action, down.broker, down.severity) == ("BrokerDown", "open", 3, "critical")
    assert json.loads(down.evidence) == {"replica_partitions": 10, "leader_partitions": 0, "out_of_sync_replicas": 10,
                                         "unlisted_since": 2_000}
    # back, catching up: BrokerDown resolves, BrokerUnderReplicating until its replicas are in sync
    out = call(fn, 0, rows(bstate(4, 4_000, 3, True, behind=4, leads=0)), s)
    assert sorted(zip(out[out.kind == "alert"].alert, out[out.kind == "alert"].action)) == [
        ("BrokerDown", "resolve"), ("BrokerUnderReplicating", "open")]
    out = call(fn, 0, rows(bstate(5, 5_000, 3, True, behind=0)), s)
    assert list(zip(out[out.kind == "alert"].alert, out[out.kind == "alert"].action)) == [
        ("BrokerUnderReplicating", "resolve")]
    # a broker that holds nothing and is not listed (decommissioned) is not down
    out = call(fn, 1, rows(bstate(1, 6_000, 7, False, holds=0, leads=0)), FakeState())
    assert out[out.kind == "alert"].empty


def test_a_broker_the_canarys_writes_wait_for_is_named_after_the_stall_window():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id="r"))
    s = FakeState()

    def waiting(seq, t, since, n=2):
        ev = bstate(seq, t, 3, True)
        ev["report"] = json.dumps({"writes_waiting_since": since, "writes_waiting_partitions": n})
        return ev
    out = call(fn, 0, rows(waiting(1, 3_000, 1_000), waiting(2, 10_000, 1_000)), s)
    assert out[out.kind == "alert"].empty  # 9 s: inside the window
    out = call(fn, 0, rows(waiting(3, 11_000, 1_000)), s)
    (opened,) = out[out.kind == "alert"].itertuples()
    assert (opened.alert, opened.action, opened.broker, opened.severity) == ("BrokerStallingWrites", "open", 3, "critical")
    assert json.loads(opened.evidence) == {"writes_waiting_since": 1_000, "waiting_partitions": 2, "waited_ms": 10_000}
    out = call(fn, 0, rows(waiting(4, 12_000, 1_000)), s)
    assert out[out.kind == "alert"].empty  # still open: once
    # the follower is dropped from the ISR: the writes go through, the wait ends
    out = call(fn, 0, rows(waiting(5, 13_000, None, None)), s)
    assert list(zip(out[out.kind == "alert"].alert, out[out.kind == "alert"].action)) == [
        ("BrokerStallingWrites", "resolve")]


def cprod(seq, t, in_flight, source="app-1", part=0):
    report = {"leader": 1, "queued_messages": 0, "in_flight_messages": in_flight, "sent_messages": 100 + seq,
              "sent_bytes": 1000, "leader_rtt_avg_ms": 3.0, "leader_rtt_p99_ms": 9.0,
              "leader_queue_latency_p99_ms": 0.5, "leader_request_errors": 0, "leader_request_retries": 0,
              "leader_request_timeouts": 0}
    return {"type": "client_produce", "entity": f"client_produce|k/{source}/t/{part}", "cluster": "k",
            "source": source, "seq": seq, "observed_at": t, "topic": "t", "partition": part, "leader": 1,
            "report": json.dumps(report)}


def test_an_instrumented_producers_writes_in_flight_under_a_flat_hw_raise_high_watermark_stalled():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id="r"))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 1_000, [1, 2, 3]), poff(2, 1_000, 100)), s)
    out = call(fn, 0, rows(cprod(1, 2_000, 5), poff(3, 3_000, 100), cprod(2, 12_000, 5), poff(4, 13_000, 100)), s)
    got = out[out.kind == "client_produce"]
    assert list(got.source) == ["app-1"] and json.loads(got.iloc[0].report)["sent_messages"] == 102
    (opened,) = out[(out.kind == "alert") & (out.action == "open")].itertuples()
    assert opened.alert == "HighWatermarkStalled" and json.loads(opened.evidence)["pending_writes_since"] == 2_000
    out = call(fn, 0, rows(cprod(3, 14_000, 0), poff(5, 15_000, 180)), s)
    assert list(zip(out[out.kind == "alert"].alert, out[out.kind == "alert"].action)) == [
        ("HighWatermarkStalled", "resolve")]


def test_alert_columns_are_the_alert_rows():
    """A batch's transitions leave as columns (``_transition_columns``): the alert rows, labels
    that are absent null, evidence that JSON cannot hold as its text."""
    from streaming.rules import base as rules

    ts = [rules.Transition(rules.Alert.ISR_SHRINK, "open", "a1", 1_000, "partition|c/t/3",
                           {"cluster": "c", "topic": "t", "partition": 3, "broker": 2},
                           {"removed": [2], "isr": [1, 3], "z": 1, "a": {1, 2}}),
           rules.Transition(rules.Alert.CONSUMER_LAG_STATUS, "resolve", "a2", 2_000, "group_partition|c/g/t/0",
                            {"cluster": "c", "group": "g", "topic": "t", "partition": 0}, {},
                            severity_override=rules.Severity.CRITICAL),
           rules.Transition(rules.Alert.SOURCE_SILENT, "open", "a3", 3_000, "source|c/p",
                            {"cluster": "c", "source": "p"}, {"silent_ms": 60_000})]
    rows = st_rows._frame([st_rows._row(kind="alert", action=t.action, cluster=t.labels["cluster"], topic=t.labels.get("topic"),
                              partition=t.labels.get("partition"), consumer_group=t.labels.get("group"),
                              source=t.labels.get("source"), broker=t.labels.get("broker"), alert=t.alert.value,
                              alert_id=t.alert_id, severity=t.severity.name.lower(),
                              evidence=json.dumps(t.evidence, sort_keys=True, default=str), at=t.at) for t in ts])
    cols = st_rows._frame(st_rows._transition_columns(ts))
    pd.testing.assert_frame_equal(cols, rows)
    assert cols["severity"].tolist() == ["warning", "critical", rules.SEVERITY[rules.Alert.SOURCE_SILENT].name.lower()]
    assert json.loads(cols["evidence"][0]) == {"a": str({1, 2}), "isr": [1, 3], "removed": [2], "z": 1}
    assert cols["broker"].isna().tolist() == [False, True, True]
    assert len(st_rows._frame(st_rows._transition_columns([]), [])) == 0
