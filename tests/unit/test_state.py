"""The applyInPandasWithState function, driven without Spark through a fake GroupState."""

from __future__ import annotations

import json
import pickle

import pandas as pd

from streaming import state as st
from streaming.job import FLAT_COLUMNS

COLS = [n for n, _ in FLAT_COLUMNS] + ["bucket"]


class FakeState:
    """The part of pyspark's GroupState the function uses."""

    def __init__(self, value=None, timed_out=False, processing_time_ms=0):
        self.value, self.hasTimedOut, self.timeout = value, timed_out, None
        self.processing_time_ms = processing_time_ms

    def getCurrentProcessingTimeMs(self):
        return self.processing_time_ms

    @property
    def exists(self):
        return self.value is not None

    @property
    def get(self):
        return self.value

    def update(self, v):
        self.value = v

    def remove(self):
        self.value = None

    def setTimeoutDuration(self, ms):
        self.timeout = ms


def rows(*dicts):
    return pd.DataFrame([{c: d.get(c) for c in COLS} for d in dicts], columns=COLS)


def pmd(seq, t, isr, replicas=(1, 2, 3), part=0):
    return {"type": "partition_metadata", "entity": f"partition|k/t/{part}", "cluster": "k", "source": "p", "seq": seq,
            "observed_at": t, "topic": "t", "partition": part, "leader": 1, "replicas": list(replicas),
            "isr": list(isr)}


def poff(seq, t, hw, part=0):
    return {"type": "partition_offsets", "entity": f"partition|k/t/{part}", "cluster": "k", "source": "p", "seq": seq,
            "observed_at": t, "topic": "t", "partition": part, "high_watermark": hw, "log_start_offset": 0}


def goff(seq, t, committed, hw, part=0):
    return {"type": "group_offsets", "entity": f"group_partition|k/g/t/{part}", "cluster": "k", "source": "p", "seq": seq,
            "observed_at": t, "group": "g", "topic": "t", "partition": part, "committed_offset": committed,
            "high_watermark": hw}


def call(fn, bucket, df, state):
    out = list(fn((bucket,), iter([df]), state))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=[n for n, _ in st.OUTPUT_COLUMNS])


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
    assert set(pickle.loads(s.value[0])) == {"partition|k/t/0", "group_partition|k/g/t/0"}
    assert list(out.columns) == [n for n, _ in st.OUTPUT_COLUMNS]


def test_state_carries_over_between_batches():
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=60_000))
    s = FakeState()
    call(fn, 0, rows(pmd(1, 1000, [1, 2, 3])), s)
    out = call(fn, 0, rows(pmd(2, 2000, [1, 2])), s)
    assert ("IsrShrink", "open") in set(zip(out.alert, out.action))


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
    assert set(pickle.loads(s.value[0])) == {"partition|k/t/0"}


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
