"""The job's state function and sink driven the way Spark drives them, without Spark: for the
replay's tests.  Each micro-batch has a processing time and rows per bucket; a bucket with rows is
called with them (converted through Arrow, as Spark hands them over), a bucket without rows whose
state has a timeout that passed is called timed out at the batch's processing time (Spark's
``ProcessingTimeTimeout``), and the batch's output goes through the job's own ``ExporterSink``:
the exporter, the alerts topic (a producer that keeps the records) and the event archive.

Also a scenario of events over two hours in two clusters: lag episodes, an ISR shrink, and the
probe of one cluster silent for minutes (buckets woken by their timeouts)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

import pandas as pd
import pyarrow as pa

from streaming.ingest.schema import FLAT_COLUMNS
from streaming.sinks.alerts import AlertsTopicSink
from streaming.sinks.archive import ArchiveFiles
from streaming.sinks.batch import ExporterSink
from streaming.sinks.exporter import Exporter
from streaming.state import function as st
from tests.support.state_fakes import FakeState, goff, pmd, poff

_ARROW = {"string": pa.string(), "bigint": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
          "array<bigint>": pa.list_(pa.int64())}
INPUT_SCHEMA = pa.schema([(n, _ARROW[t]) for n, t in FLAT_COLUMNS] + [("bucket", pa.int32())])
MIN = 60_000
T0 = 1_764_450_000_000  # 2025-11-29T21:00Z


class _Producer:
    """Keeps what the alerts sink produces; every record is delivered at once."""

    def __init__(self) -> None:
        self.values: list[bytes] = []

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: Any = None) -> None:
        self.values.append(value)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def __len__(self) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


class KeptAlerts(AlertsTopicSink):
    """The job's alerts sink, its producer replaced by one that keeps the records."""

    def __init__(self) -> None:
        super().__init__({}, "alerts")
        self._recovered = True
        self.kept = _Producer()
        self._producer = self.kept

    def records(self) -> list[dict]:
        return [json.loads(v) for v in self.kept.values]

    def close(self) -> None:
        pass


class _Output:
    def __init__(self, t: pa.Table):
        self.t = t

    def toArrow(self) -> pa.Table:
        return self.t


def spark_frame(dicts: list[dict], bucket: int) -> pd.DataFrame:
    """Rows as Spark hands them to the state function: through Arrow (nullable longs become
    float64 with NaN, arrays numpy arrays)."""
    return pa.Table.from_pylist([{**{n: d.get(n) for n in INPUT_SCHEMA.names}, "bucket": bucket} for d in dicts],
                                schema=INPUT_SCHEMA).to_pandas()


@dataclass
class Job:
    """One query of the job (one checkpoint): its state per bucket and batch ids from 0."""
    cfg: st.StateConfig
    archive: ArchiveFiles
    alerts: KeptAlerts = field(default_factory=KeptAlerts)
    states: dict[int, FakeState] = field(default_factory=dict)
    timeout_at: dict[int, int] = field(default_factory=dict)
    batch_id: int = 0
    ticks: int = 0

    def __post_init__(self) -> None:
        self.fn = st.make_state_function(self.cfg)
        self.sink = ExporterSink(Exporter(), self.alerts, archive=self.archive)

    def _call(self, bucket: int, frames: list[pd.DataFrame], now_ms: int, timed_out: bool) -> list[pd.DataFrame]:
        s = self.states.setdefault(bucket, FakeState())
        s.hasTimedOut, s.processing_time_ms, s.timeout = timed_out, now_ms, None  # reset each call
        out = list(self.fn((bucket,), iter(frames), s))
        if s.value is not None and s.timeout is not None:
            self.timeout_at[bucket] = now_ms + s.timeout
        else:
            self.timeout_at.pop(bucket, None)
        return out

    def batch(self, now_ms: int, by_bucket: dict[int, list[dict]]) -> None:
        """One micro-batch at processing time ``now_ms``."""
        out: list[pd.DataFrame] = []
        for bucket, dicts in sorted(by_bucket.items()):
            if dicts:
                out += self._call(bucket, [spark_frame(dicts, bucket)], now_ms, False)
        for bucket, due in sorted(self.timeout_at.items()):
            if bucket not in by_bucket and due < now_ms:
                self.ticks += 1
                out += self._call(bucket, [], now_ms, True)
        frame = pd.concat(out, ignore_index=True) if out else None
        t = pa.Table.from_pandas(frame, preserve_index=False) if frame is not None else pa.table({"kind": []})
        self.sink(_Output(t), self.batch_id)
        self.batch_id += 1


# --- a scenario --------------------------------------------------------------------------------

def hb(seq: int, t: int, cluster: str = "k") -> dict:
    return {"type": "heartbeat", "entity": f"source|{cluster}/p", "cluster": cluster, "source": "p", "seq": seq,
            "observed_at": t, "interval_ms": 10_000, "events_sent": seq, "events_dropped": 0, "started_at": 0,
            "event_id": f"hb-{cluster}-{seq}"}


def on(cluster: str, d: dict) -> dict:
    d = {**d, "cluster": cluster, "entity": d["entity"].replace("|k/", f"|{cluster}/")}
    d["event_id"] = f"{d['type']}-{cluster}-{d['seq']}-{d.get('partition')}"
    return d


#: the group's lag in offsets over the scenario: (from minute, to minute, lag)
LAG_EPISODES = ((4, 7, 20_000), (12, 15, 8_000), (20, 21.5, 15_000), (26, 30, 12_000))
ISR_SHRINK = (16, 18)      # minutes: replica 3 out of the ISR of t/0 in cluster k
SILENT = (32, 37)          # minutes: cluster j's probe sends nothing
MINUTES = 40
#: buckets: both clusters' partitions share one, and their group partitions another; each
#: cluster's source has its own (j's is woken by its timeout while j is silent)
BUCKETS = {("partition", "k"): 1, ("partition", "j"): 1, ("group_partition", "k"): 2, ("group_partition", "j"): 2,
           ("source", "k"): 3, ("source", "j"): 4}


def cycle(at_ms: int, i: int, cluster: str) -> list[tuple[int, dict]]:
    """One probe cycle's events at ``at_ms`` (ms since T0) for ``cluster``: (bucket, row)."""
    t, m = T0 + at_ms, at_ms / MIN
    hw = 1_000_000 + i * 500
    lag = next((v for a, b, v in LAG_EPISODES if a <= m < b), 100) if cluster == "k" else 50
    isr = [1, 2] if cluster == "k" and ISR_SHRINK[0] <= m < ISR_SHRINK[1] else [1, 2, 3]
    out = [(BUCKETS["partition", cluster], on(cluster, poff(2 * i, t, hw))),
           (BUCKETS["group_partition", cluster], on(cluster, goff(2 * i + 1, t, hw - lag, hw))),
           (BUCKETS["source", cluster], hb(i, t, cluster))]
    if i % 6 == 0 or isr != [1, 2, 3] or (cluster == "k" and m == ISR_SHRINK[1]):
        out.insert(0, (BUCKETS["partition", cluster], on(cluster, {**pmd(2 * i, t - 1, isr), "seq": 2 * i})))
    return out


def scenario(minutes: int = MINUTES, interval_ms: int = 10_000) -> list[tuple[int, int, dict]]:
    """Every event: (arrival at the job's source, bucket, row); arrivals 2 s after observation."""
    out = []
    for i in range(minutes * MIN // interval_ms):
        at = i * interval_ms
        for cluster in ("k", "j"):
            if cluster == "j" and SILENT[0] * MIN <= at < SILENT[1] * MIN:
                continue
            out += [(T0 + at + 2_000, b, r) for b, r in cycle(at, i, cluster)]
    return out


def cut(events: list[tuple[int, int, dict]], start_ms: int, end_ms: int, trigger_ms: int = 5_000,
        down: Optional[tuple[int, int]] = None) -> list[tuple[int, dict[int, list[dict]]]]:
    """Micro-batches every ``trigger_ms`` of processing time over [start_ms, end_ms), each with the
    events that arrived since the last, as (processing time, {bucket: rows}); ``down``: (from, to)
    processing times the job was not running (the next batch then reads the backlog)."""
    events = sorted(events, key=lambda e: e[0])
    now, at, out = start_ms, 0, []
    while at < len(events) and events[at][0] < start_ms:
        at += 1
    while now < end_ms:
        now += trigger_ms
        if down is not None and down[0] <= now < down[1]:
            continue
        by: dict[int, list[dict]] = {}
        while at < len(events) and events[at][0] < now:
            by.setdefault(events[at][1], []).append(events[at][2])
            at += 1
        out.append((now, by))
    return out


def run_batches(job: Job, events: list[tuple[int, int, dict]], start_ms: int, end_ms: int,
                trigger_ms: int = 5_000, down: Optional[tuple[int, int]] = None) -> None:
    """``cut``'s batches through ``job``."""
    for now, by in cut(events, start_ms, end_ms, trigger_ms, down):
        job.batch(now, by)
