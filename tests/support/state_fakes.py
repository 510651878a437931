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
