"""A fake of the part of pyspark's GroupState the state function uses, and builders of the flat
event rows the function is given: shared by the tests of streaming.state, bench/state_bench.py
and tests/fixtures/state/make_fixture.py."""

from __future__ import annotations

import json

import pandas as pd

from streaming.state import rows as st_rows
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
    """The function's output, its packed partition blocks expanded into rows."""
    out = list(fn((bucket,), iter([df]), state))
    return st_rows.expand_blocks(pd.concat(out, ignore_index=True)) if out else pd.DataFrame(
        columns=[n for n, _ in st_rows.OUTPUT_COLUMNS])


def canary(seq, t, pending, sent=10, part=0, oldest=None):
    report = {"started_at": 1, "leader": 1, "sent": sent, "acked": sent - pending, "received": sent - pending,
              "lost": 0, "duplicated": 0, "out_of_order": 0, "pending": pending, "oldest_pending_ms": oldest,
              "produce_latency_counts": [0] * 14, "produce_latency_sum_ms": 0.0, "e2e_latency_counts": [0] * 14,
              "e2e_latency_sum_ms": 0.0, "lost_after_ms": 30_000, "errors": {}}
    return {"type": "canary", "entity": f"canary|k/t/{part}", "cluster": "k", "source": "p", "seq": seq,
            "observed_at": t, "topic": "t", "partition": part, "leader": 1, "started_at": 1,
            "report": json.dumps(report)}


class RecordingProducer:
    """The slice of confluent_kafka.Producer that EventEmitter calls, keeping each record's value."""

    def __init__(self):
        self.values: list[bytes] = []

    def produce(self, topic, key=None, value=None, on_delivery=None):
        self.values.append(value)

    def poll(self, timeout=0):
        return 0

    def flush(self, timeout=0):
        return 0


class EventsJob:
    """One bucket of the state function (``cfg``) and an exporter, fed serialized events as the
    job parses them, batch by batch; ``timeout(now)`` wakes the bucket as Spark's timeout does.
    The alert transitions seen so far: ``opened`` and ``resolved``, as (alert, source, evidence),
    and ``transitions``, the rows whole."""

    def __init__(self, cfg):
        from streaming.sinks.exporter import Exporter
        from streaming.state import function as st

        self.fn = st.make_state_function(cfg)
        self.state, self.exporter, self.batches = FakeState(), Exporter(), 0
        self.opened: list[tuple] = []
        self.resolved: list[tuple] = []
        self.transitions: list[dict] = []  # every alert row, whole

    def batch(self, *values: bytes) -> pd.DataFrame:
        import pyarrow as pa

        from streaming.ingest import parsing

        table = parsing.parse_values(pa.array(list(values), pa.binary()), gate=False)
        good = [r for r in table.to_pylist() if r["reason"] is None]
        assert len(good) == len(values), [r["reason"] for r in table.to_pylist()]
        df = pd.DataFrame([{c: r.get(c) for c in COLS} for r in good], columns=COLS)
        df["bucket"] = 0
        return self._sink(call(self.fn, 0, df, self.state))

    def timeout(self, now: int) -> pd.DataFrame:
        self.state.hasTimedOut, self.state.processing_time_ms = True, now
        try:
            return self._sink(call(self.fn, 0, pd.DataFrame(columns=COLS), self.state))
        finally:
            self.state.hasTimedOut = False

    def _sink(self, out: pd.DataFrame) -> pd.DataFrame:
        import pyarrow as pa

        from streaming.sinks.batch import sink_rows

        self.exporter.apply(sink_rows(pa.Table.from_pandas(out, preserve_index=False)), batch_id=self.batches)
        self.batches += 1
        rows = out[out.kind == "alert"].to_dict("records")
        self.transitions += rows
        for r in rows:
            (self.opened if r["action"] == "open" else self.resolved).append((r["alert"], r["source"], r["evidence"]))
        return out

    def value(self, name: str, **labels):
        return self.exporter.registry.get_sample_value(f"kafka_monitor_{name}", labels)
