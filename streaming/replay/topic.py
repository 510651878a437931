"""A replay from the events topic instead of the archive: APPROXIMATE.

The topic keeps the events (within its retention) but not the job's micro-batches, nor which
bucket each row went to, nor the moments the job's timeouts woke a bucket.  So this replay makes
its own: batches cut every ``trigger_ms`` by the records' timestamps (each processed at its
window's end), buckets by ``crc32(bucket_key) % buckets`` (not Spark's hash: the grouping of
entities is the same kind, the members differ), timeouts fired as Spark fires them at those
batches (``ReplayGroupState.due``).  The rules then see the same events but at other moments:
time-driven alerts can move by up to a trigger or a tick, and their alert ids with them.  Use the
archive when it covers the range.

``window_batches`` is pure; ``read_records`` is the thin Kafka part.
"""

from __future__ import annotations

import heapq
import time
import uuid
import zlib
from typing import Iterable, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.ingest import parsing
from streaming.replay.engine import ReplayBatch
from streaming.state.rows import ARCHIVE_SCHEMA

#: the query id of a replay from the topic (there is one: its batches are its own)
TOPIC_QUERY = "events-topic"


def windows(start_ms: int, end_ms: int, trigger_ms: int) -> int:
    """How many batches [start_ms, end_ms] is cut into."""
    return max(1, -(-(end_ms - start_ms) // trigger_ms))


def bucket_of(keys: list[Optional[str]], buckets: int) -> np.ndarray:
    return np.array([zlib.crc32((k or "").encode()) % buckets for k in keys], np.int64)


#: records parsed at a time (the quality gate costs ~0.15 s a call whatever its size up to
#: thousands of rows: one call per batch would cost a week's replay hours)
PARSE_CHUNK = 50_000


def _parsed(records: Iterator[tuple[int, bytes]], kept_types: list[str], limits: parsing.Limits,
            chunk: int) -> Iterator[tuple[np.ndarray, pa.Table]]:
    """Chunks of records parsed as the job parses them (decode, flatten, the quality gate), the
    accepted rows of the types the state keeps, each with its record's timestamp (a v3 record's
    events, and a metadata refresh's derived rows, take their record's)."""
    while True:
        got = [r for _, r in zip(range(chunk), records)]
        if not got:
            return
        stamps = np.array([ts for ts, _ in got], np.int64)
        for flat, record in parsing.parse_pieces(pa.array([v for _, v in got], pa.binary()),
                                                 timestamps=pa.array(stamps), limits=limits):
            ts = stamps[record]
            keep = pc.and_(pc.is_null(flat.column("reason")), pc.is_in(
                flat.column("type"), value_set=pa.array(kept_types))).to_numpy(zero_copy_only=False)
            yield ts[keep], flat.filter(pa.array(keep))


def _with_buckets(flat: pa.Table, buckets: int) -> pa.Table:
    """A batch's rows with a bucket (``bucket_of``) and their order in it (``bucket_row``)."""
    n = flat.num_rows
    b = bucket_of(flat.column("bucket_key").to_pylist(), buckets)
    order = np.zeros(n, np.int64)
    for k in np.unique(b).tolist():
        at = np.flatnonzero(b == k)
        order[at] = np.arange(len(at))
    cols = {name: (flat.column(name) if name in flat.column_names else pa.nulls(n, ARCHIVE_SCHEMA.field(name).type))
            for name in ARCHIVE_SCHEMA.names if name not in ("bucket", "bucket_row")}
    cols["bucket"], cols["bucket_row"] = pa.array(b), pa.array(order)
    return pa.table(cols).cast(ARCHIVE_SCHEMA)


def window_batches(records: Iterable[tuple[int, bytes]], start_ms: int, end_ms: int, trigger_ms: int, buckets: int,
                   kept_types: Iterable[str], limits: parsing.Limits = parsing.LIMITS,
                   chunk: int = PARSE_CHUNK) -> Iterator[ReplayBatch]:
    """``records`` ((timestamp ms, value), in timestamp order, roughly) as the batches a job with
    ``trigger_ms`` would have run over [start_ms, end_ms]: batch k holds the records stamped in
    its window and runs at the window's end; a window without records is a batch all the same
    (Spark runs one to fire the timeouts).  A record older than its window (out of order) goes
    into the current one."""
    chunks = _parsed(iter(records), sorted(set(kept_types)), limits, chunk)
    ts = np.empty(0, np.int64)
    rows = ARCHIVE_SCHEMA.empty_table()
    flat: Optional[pa.Table] = None
    more = True
    for k in range(windows(start_ms, end_ms, trigger_ms)):
        close = start_ms + (k + 1) * trigger_ms
        while more and (not len(ts) or ts[-1] < close):
            got = next(chunks, None)
            if got is None:
                more = False
                break
            flat = got[1] if flat is None or not len(ts) else pa.concat_tables([flat, got[1]])
            ts = np.concatenate([ts, got[0]])
        if flat is not None and len(ts):
            now = ts < close
            rows = _with_buckets(flat.filter(pa.array(now)), buckets)
            flat, ts = flat.filter(pa.array(~now)), ts[~now]
        else:
            rows = ARCHIVE_SCHEMA.empty_table()
        yield ReplayBatch(TOPIC_QUERY, k, rows, None, close)


def read_records(kafka: dict[str, str], topic: str, start_ms: int, end_ms: int, timeout_s: float = 60.0,
                 buffered: int = 20_000) -> tuple[Iterator[tuple[int, bytes]], Optional[int]]:
    """The events topic's records stamped in [start_ms, end_ms], merged across partitions in
    timestamp order (a partition far ahead is paused while others catch up), and the earliest
    moment every partition covers (None: from ``start_ms``; later: the topic's retention deleted
    what was before, or the topic is younger)."""
    from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition

    c = Consumer({**kafka, "group.id": f"kafka-monitor-replay-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    meta = c.list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or not meta.partitions:
        c.close()
        raise RuntimeError(f"events topic {topic!r} is not available: {meta.error if meta else 'absent'}")
    wanted = c.offsets_for_times([TopicPartition(topic, p, start_ms) for p in meta.partitions], timeout=30)
    starts, lows = [], {}
    for tp in wanted:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=30)
        if tp.offset not in (OFFSET_END, -1) and tp.offset < hi:
            starts.append(TopicPartition(topic, tp.partition, max(tp.offset, lo)))
            lows[tp.partition] = (max(tp.offset, lo) == lo, hi)
    if not starts:
        c.close()
        return iter(()), None
    c.assign(starts)
    first_ms: Optional[int] = None
    seen_first: set[int] = set()

    def merged() -> Iterator[tuple[int, bytes]]:
        nonlocal first_ms
        held = {tp.partition: 0 for tp in starts}  # records buffered per partition
        live = set(held)  # partitions still to be read
        paused: set[int] = set()
        heap: list[tuple[int, int, int, bytes]] = []
        n = 0
        deadline = time.monotonic() + timeout_s
        try:
            while live or heap:
                # a record is next in time once every partition still read has one buffered
                while heap and all(held[p] for p in live):
                    ts, _, p, v = heapq.heappop(heap)
                    held[p] -= 1
                    if p in paused and held[p] < buffered // 10:
                        c.resume([TopicPartition(topic, p)])
                        paused.discard(p)
                    yield ts, v
                if not live:
                    continue
                msgs = c.consume(1000, timeout=1.0)
                if msgs:
                    deadline = time.monotonic() + timeout_s
                elif time.monotonic() > deadline:
                    raise RuntimeError(f"events topic {topic!r}: partitions {sorted(live)} gave nothing for "
                                       f"{timeout_s:.0f}s")
                for m in msgs:
                    p = int(m.partition() or 0)
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            live.discard(p)
                        continue
                    ts = int(m.timestamp()[1])
                    if p not in seen_first:
                        seen_first.add(p)
                        if lows[p][0] and ts > start_ms:  # read from the partition's start: nothing older kept
                            first_ms = max(first_ms or ts, ts)
                    done = ts > end_ms or int(m.offset() or 0) + 1 >= lows[p][1]
                    if done:
                        live.discard(p)
                        c.pause([TopicPartition(topic, p)])
                    if ts > end_ms:
                        continue
                    heapq.heappush(heap, (ts, n, p, m.value() or b""))
                    held[p] += 1
                    n += 1
                    if held[p] >= buffered and p not in paused and not done:
                        c.pause([TopicPartition(topic, p)])
                        paused.add(p)
        finally:
            c.close()

    it = merged()
    # the first record comes once every partition has given one: how far back the topic goes is
    # known then, before the caller reports the coverage
    first = next(it, None)

    def chained() -> Iterator[tuple[int, bytes]]:
        if first is not None:
            yield first
            yield from it

    return chained(), first_ms


