"""A Spark streaming source for Kafka written as a Python data source over confluent-kafka.

PySpark's wheel has no Kafka connector and no Maven repository is reachable, so the job reads
the events topic with this reader (format name ``kafka-monitor-kafka``).

Semantics (the ones Spark's own Kafka source has):
- the offset Spark checkpoints is ``{"topic": T, "offsets": {"<partition>": <next offset>}}``;
- a micro-batch reads exactly the records with offsets in [start, end) of each partition; a
  replayed batch reads the same records.  The partitions with new records are spread over as
  few Spark tasks as the records need (one per 1,000, at most option ``maxTasks``, default 1):
  each task pays for a consumer and its connection, so small batches are one task (a v3 record
  holds up to 1,000 events: 1,000 records are up to a million events' decoding);
- ``maxOffsetsPerTrigger`` caps the records per micro-batch (shared across partitions in
  proportion to their backlog) through Spark's admission control (``latestOffset(start, limit)``,
  PySpark >= 4.2);
- ``startingOffsets``: ``earliest`` (default), ``latest`` or JSON ``{"<partition>": offset}``;
  partitions that appear later are read from offset 0 (as Spark's kafka source does: if their
  first records are already gone, that is data loss, below);
- ``failOnDataLoss`` (default true): when records in [start, end) were deleted by retention
  before they were read, or a partition's log now ends before the checkpointed offset (topic
  deleted and recreated), fail with a message that says so; with false, skip them / go on.
- every option starting with ``kafka.`` is passed to librdkafka without the prefix
  (``kafka.bootstrap.servers``, ``kafka.security.protocol``, ``kafka.sasl.*``, ``kafka.ssl.*``).

The events topic may live on the cluster the monitor watches, so its brokers fail under the
source (issue 33).  A partition whose offsets cannot be had -- no leader, its leader down, paused
or fenced, an answer that is an error or a sentinel such as -1001, none within
``offsetsTimeoutMs`` (default 10000) -- is *unknown*, never data loss: it keeps its offset and
is asked again at the next trigger, while the others go on.  Its leader's partitions are asked
in a request of their own, so one broker that does not answer holds up no other; when the
metadata request itself gets no answer within half a timeout, the leaders of the last answer
are asked.  How long each
partition has been unreadable goes out with ``reportLatestOffset`` (``"unreadable"``), which the
job exports.  A read task waits out a leader change (transient consumer errors are retried by
librdkafka) for up to ``idle_timeout_s``, and an "offset out of range" from a broker whose log
does not reach the offset while the log still starts below it (a leader back from a pause,
named by stale metadata) for as long.  Only what retrying cannot fix fails the query:
authorization or authentication refused, the topic absent, a log that truly went back.

End offsets come from ListOffsets.  On Tansu that answer is the base offset of the last record
batch + 1, so the last batch of a partition becomes visible only once another batch is written
after it (the probe writes every cycle, so this costs at most one probe interval there; Apache
Kafka answers with the true high watermark).

Option keys reach the reader lower-cased (Spark's options are case-insensitive), so they are
looked up in lower case here.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from concurrent.futures import wait as wait_futures
from typing import Any, Iterator, Optional, Union

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from monitor.access import again_if_timed_out, permanent_error

log = logging.getLogger(__name__)

FORMAT = "kafka-monitor-kafka"
SCHEMA = "key string, value string, topic string, partition int, offset long, timestamp long"
ARROW_SCHEMA = pa.schema([
    ("key", pa.string()), ("value", pa.string()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.int64()),
])
ARROW_BATCH_ROWS = 20_000
#: ... or fewer: a batch holds at most about this many bytes of keys and values
ARROW_BATCH_BYTES = 32 << 20
#: a micro-batch gets one more read task per this many records (up to option maxTasks): records,
#: not events, are what a plan knows; at 100k partitions a v3 cycle is ~2,100 records, ~128k events
RECORDS_PER_TASK = 1_000
#: how long a watermark read waits for brokers (option offsetsTimeoutMs)
OFFSETS_TIMEOUT_S = 10.0
#: clients kept after being replaced (_list_topic), while requests of theirs may be out
RETIRED_MAX = 4
#: how long a read task waits for the records of its range (a leader change, a broker down)
READ_IDLE_TIMEOUT_S = 300.0


class SourceError(RuntimeError):
    pass


def _options(options: Any) -> tuple[str, dict[str, str], dict[str, str]]:
    opts = {k.lower(): v for k, v in dict(options).items()}
    topic = opts.get("subscribe")
    if not topic or "," in topic:
        raise SourceError("option 'subscribe' must name exactly one topic (the events topic)")
    kafka = {k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")}
    if "bootstrap.servers" not in kafka:
        raise SourceError("option 'kafka.bootstrap.servers' is required")
    return topic, kafka, opts


class KafkaSourcePartition(InputPartition):
    """One Spark task: [start, end) of one or more Kafka partitions, read by one consumer."""

    def __init__(self, topic: str, ranges: list[tuple[int, int, int]], kafka: dict[str, str],
                 fail_on_data_loss: bool):
        self.topic = topic
        self.ranges = ranges  # (partition, start, end)
        self.kafka = kafka
        self.fail_on_data_loss = fail_on_data_loss


def plan_tasks(ranges: list[tuple[int, int, int]], max_tasks: int,
               records_per_task: int = RECORDS_PER_TASK) -> list[list[tuple[int, int, int]]]:
    """Spread the partition ranges with records over as few tasks as the records need (one
    per ``records_per_task``, at most ``max_tasks``), balanced by record count.  Every task
    pays a consumer, a connection and a Python worker hand-off, so a small batch is one task
    and a large one uses every core."""
    ranges = [r for r in ranges if r[2] > r[1]]
    total = sum(e - s for _, s, e in ranges)
    n = max(1, min(len(ranges), max_tasks, -(-total // records_per_task)))
    tasks: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    load = [0] * n
    for r in sorted(ranges, key=lambda r: r[1] - r[2]):  # largest first
        i = load.index(min(load))
        tasks[i].append(r)
        load[i] += r[2] - r[1]
    return [sorted(t) for t in tasks if t]


class KafkaEventSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> "KafkaStreamReader":
        return KafkaStreamReader(self.options)


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: Any):
        self.topic, self.kafka, opts = _options(options)
        self.starting = opts.get("startingoffsets", "earliest")
        self.fail_on_data_loss = opts.get("failondataloss", "true").lower() != "false"
        self.max_offsets = int(opts["maxoffsetspertrigger"]) if opts.get("maxoffsetspertrigger") else None
        if self.max_offsets is not None and self.max_offsets <= 0:
            raise SourceError("option 'maxOffsetsPerTrigger' must be > 0")
        self.max_tasks = int(opts.get("maxtasks", "1"))
        if self.max_tasks <= 0:
            raise SourceError("option 'maxTasks' must be > 0")
        self.timeout_s = int(opts.get("offsetstimeoutms", str(int(OFFSETS_TIMEOUT_S * 1000)))) / 1000.0
        if self.timeout_s <= 0:
            raise SourceError("option 'offsetsTimeoutMs' must be > 0")
        self._admin: Any = None
        #: (client, its requests still out when it was replaced) after a metadata request timed
        #: out (``_retire``)
        self._retired: list[tuple[Any, list]] = []
        self.metadata_retries = 0
        self._brokers: list[str] = []  # host:port of the brokers the last metadata answer listed
        self._latest: Optional[dict] = None
        #: partition -> (since when it is unreadable, epoch ms; why)
        self._unreadable: dict[int, tuple[int, str]] = {}
        self._pending: list = []  # ListOffsets futures not answered when last waited for
        self._leaders: dict[int, int] = {}  # partition -> leader, from the last metadata answer

    # -- driver side ------------------------------------------------------------------------

    def _admin_client(self):
        if self._admin is None:
            self._admin = self._new_client(dict(self.kafka))
        return self._admin

    def _new_client(self, conf: dict) -> Any:
        from confluent_kafka.admin import AdminClient
        return AdminClient(conf)

    def _list_topic(self, timeout_s: float) -> Any:
        """The events topic's metadata.  A paused broker held every trigger's metadata, and the
        leaders the source fell back to were stale for the whole pause (a batch of 73 s, seen in
        tests/e2e/test_own_cluster.py).  So the first attempt waits half the time, and a
        timed-out one is sent again through a new client (``again_if_timed_out``), bootstrapped
        from the brokers the last answer listed as well as the configured ones, which the source
        then keeps: its ListOffsets go to the leaders that client just learnt."""
        return again_if_timed_out(lambda: self._admin_client().list_topics(self.topic, timeout=timeout_s / 2),
                                  lambda: self._list_topic_again(timeout_s / 2))

    def _list_topic_again(self, timeout_s: float) -> Any:
        self.metadata_retries += 1
        self._retire(self._admin)
        configured = [b.strip() for b in str(self.kafka.get("bootstrap.servers", "")).split(",") if b.strip()]
        bootstrap = ",".join(dict.fromkeys(configured + self._brokers))
        self._admin = self._new_client({**self.kafka, "bootstrap.servers": bootstrap})
        log.info("%s: metadata request timed out after %.1fs; asking again through a new client", self.topic,
                 timeout_s)
        return self._admin.list_topics(self.topic, timeout=timeout_s)

    def _retire(self, client: Any) -> None:
        """Keep a replaced client while ListOffsets requests are out (librdkafka can crash a
        client destroyed with requests in flight), with those requests; clients whose requests
        all ended go.  At most ``RETIRED_MAX`` are kept: past that, the oldest one's requests
        are waited for (they end within a request timeout) before it goes."""
        self._pending = [f for f in self._pending if not f.done()]
        self._retired = [(c, fs) for c, fs in self._retired if not all(f.done() for f in fs)]
        if self._pending:
            self._retired.append((client, list(self._pending)))
        while len(self._retired) > RETIRED_MAX:
            oldest, futures = self._retired.pop(0)
            wait_futures(futures, timeout=self.timeout_s + 1.0)
            del oldest

    def _watermarks(self, known: tuple[int, ...] = ()) -> dict[int, tuple[int, int]]:
        """(earliest, latest) of every partition that answered; the others are noted as
        unreadable (``self._unreadable``) and left out.  Raises SourceError only for what
        retrying cannot fix."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        asked_at = int(time.time() * 1000)
        # metadata comes from one broker, which may be the one that does not answer: with the
        # leaders of the last answer at hand, wait half a timeout for it and go on with those
        try:
            md = self._list_topic(self.timeout_s / 2 if self._leaders else self.timeout_s)
            tmd = md.topics.get(self.topic)
            err = tmd.error if tmd is not None else None
            self._brokers = [f"{b.host}:{b.port}" for b in md.brokers.values()]
        except KafkaException as e:
            tmd, err = None, e.args[0] if e.args else e
            if not self._leaders:
                self._note_unreadable(set(self._known_partitions()) | set(known), {}, f"metadata: {err}", asked_at)
                return {}
        else:
            if tmd is None or (err is not None and (err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                                                    or permanent_error(err))):
                raise SourceError(f"events topic {self.topic!r} is not available: {err if tmd else 'absent'}")
            if err is None and tmd.partitions:
                self._leaders = {p: pm.leader for p, pm in tmd.partitions.items()}
            elif not self._leaders:  # e.g. LEADER_NOT_AVAILABLE while the cluster settles
                self._note_unreadable(set(self._known_partitions()) | set(known), {},
                                      f"metadata: {err or 'no partitions'}",
                                      asked_at)
                return {}
        if err is not None:
            log.info("%s: metadata unavailable (%s); asking the leaders it last named", self.topic, err)
        admin = self._admin_client()
        why: dict[int, str] = {}
        by_leader: dict[int, list] = {}
        for p, leader in self._leaders.items():
            if leader < 0:
                why[p] = "no leader"
            else:
                by_leader.setdefault(leader, []).append(TopicPartition(self.topic, p))
        # one request per leader and kind: a broker that does not answer delays only its own
        asked: dict[Any, tuple[int, int, int]] = {}  # future -> (partition, 0 earliest / 1 latest, leader)
        for leader, tps in by_leader.items():
            for i, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
                for tp, f in admin.list_offsets({tp: spec for tp in tps},
                                                request_timeout=self.timeout_s).items():
                    asked[f] = (tp.partition, i, leader)
        done, late = wait_futures(list(asked), timeout=self.timeout_s + 1.0)
        # unanswered requests stay with their client until they end: librdkafka can crash a
        # client destroyed with requests in flight (stop() waits for them)
        self._pending = [f for f in self._pending if not f.done()] + list(late)
        got: dict[int, list[int]] = {}
        for f, (p, i, leader) in asked.items():
            if p in why:
                continue
            if f not in done:
                why[p] = f"no answer from its leader {leader} within {self.timeout_s:g}s"
                continue
            exc = f.exception()
            if exc is not None:
                fatal = permanent_error(exc)
                if fatal:
                    raise SourceError(f"{self.topic}/{p}: {fatal}")
                why[p] = f"leader {leader}: {exc.args[0] if exc.args else exc}"
                continue
            off = f.result().offset
            if off < 0:  # librdkafka's sentinels (-1001: no offset) are no position in the log
                why[p] = f"leader {leader} answered no offset ({off})"
                continue
            got.setdefault(p, [-1, -1])[i] = off
        marks = {p: (lo, hi) for p, (lo, hi) in got.items() if p not in why}
        self._note_unreadable(set(why), why, "", asked_at)
        return marks

    def _known_partitions(self) -> list[int]:
        return [int(p) for p in (self._latest or {}).get("offsets", {})] or list(self._unreadable)

    def _note_unreadable(self, now_unreadable: set[int], why: dict[int, str], default: str, asked_at: int) -> None:
        """Start the clock of each partition that just became unreadable (from when it was
        asked); stop the others'."""
        now = asked_at
        for p in sorted(now_unreadable):
            reason = why.get(p, default)
            if p not in self._unreadable:
                log.warning("%s/%s: offsets unknown (%s); asking again at the next trigger", self.topic, p, reason)
                self._unreadable[p] = (now, reason)
            else:
                self._unreadable[p] = (self._unreadable[p][0], reason)
        for p in [p for p in self._unreadable if p not in now_unreadable]:
            since, _ = self._unreadable.pop(p)
            log.warning("%s/%s: offsets readable again after %.1fs", self.topic, p, (time.time() * 1000 - since) / 1000)

    def initialOffset(self) -> dict:
        """Partitions whose offsets are unknown now are left out: they are read from their
        earliest offset once known (as partitions added later are)."""
        marks = self._watermarks()
        deadline = time.monotonic() + 6 * self.timeout_s
        while (self._unreadable or not marks) and time.monotonic() < deadline:
            time.sleep(1.0)  # a first start during a broker fault: give its partitions a leader
            marks = self._watermarks()
        if self._unreadable:
            log.warning("%s: starting without partitions %s (offsets unknown); they will be read from their "
                        "earliest offset", self.topic, sorted(self._unreadable))
        if self.starting == "earliest":
            offs = {str(p): lo for p, (lo, _) in marks.items()}
        elif self.starting == "latest":
            offs = {str(p): hi for p, (_, hi) in marks.items()}
        else:
            try:
                given = parse_starting_offsets(self.starting)
            except ValueError as e:
                raise SourceError(f"option 'startingOffsets' must be earliest, latest or JSON "
                                  f"{{\"<partition>\": offset}}: {e}") from None
            if not isinstance(given, dict):  # "earliest" / "latest" were handled above
                raise SourceError(f"option 'startingOffsets': unexpected {given!r}")
            offs = {str(p): given.get(str(p), lo) for p, (lo, _) in marks.items()}
        return {"topic": self.topic, "offsets": offs}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_offsets) if self.max_offsets else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = {int(p): o for p, o in (start or {}).get("offsets", {}).items()}
        marks = self._watermarks(tuple(begin))
        # an unknown partition keeps its offset (no records this batch), never loses it
        end: dict[int, int] = {p: o for p, o in begin.items() if p not in marks}
        for p, (lo, hi) in marks.items():
            s = begin.get(p, lo)
            if hi < s:
                # the log ends before what was read: the topic was deleted and recreated (or
                # truncated); records written to the new log below ``s`` would be skipped
                if self.fail_on_data_loss:
                    raise SourceError(
                        f"{self.topic}/{p}: the end offset went back from {s} to {hi} (topic deleted and "
                        f"recreated?): records written since may be missed; restart with option "
                        f"failOnDataLoss=false to go on from offset {hi}")
                log.warning("%s/%s: end offset went back from %d to %d; going on from %d", self.topic, p, s, hi, hi)
            end[p] = hi  # >= s unless the log went back (failOnDataLoss=false: go on from there)
        self._latest = {"topic": self.topic, "offsets": {str(p): o for p, o in sorted(end.items())}}
        if self._unreadable:
            self._latest["unreadable"] = {str(p): {"since": t, "reason": r[:200]}
                                          for p, (t, r) in sorted(self._unreadable.items())}
        if isinstance(limit, ReadMaxRows):
            end = cap(begin, end, limit.max_rows, {p: lo for p, (lo, _) in marks.items()})
        return {"topic": self.topic, "offsets": {str(p): o for p, o in sorted(end.items())}}

    def reportLatestOffset(self) -> Optional[dict]:
        """The uncapped end seen by the last latestOffset(): Spark reports it in the query's
        progress, and the job exports end - processed as how far behind it is, and from
        ``"unreadable"`` (partitions whose offsets were unknown: since when, why) how long it
        could not read."""
        return self._latest

    def partitions(self, start: dict, end: dict) -> list[KafkaSourcePartition]:
        begin = start.get("offsets", {}) if start else {}
        ranges = [(int(p), begin.get(p, 0), e) for p, e in end.get("offsets", {}).items()]
        return [KafkaSourcePartition(self.topic, t, self.kafka, self.fail_on_data_loss)
                for t in plan_tasks(ranges, self.max_tasks)]

    def commit(self, end: dict) -> None:
        pass  # Spark's checkpoint is the source of truth; nothing is committed to Kafka

    def stop(self) -> None:
        if self._pending:
            wait_futures(self._pending, timeout=self.timeout_s + 1.0)
            self._pending = []
        self._admin = None
        self._retired.clear()

    # -- executor side ----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaSourcePartition):
            raise SourceError(f"read(): not a partition of this source: {partition!r}")
        return read_range(partition)


def parse_starting_offsets(value: str) -> Union[str, dict[str, int]]:
    """``earliest``, ``latest`` or JSON ``{"<partition>": offset}`` (as a dict); ValueError otherwise."""
    if value in ("earliest", "latest"):
        return value
    try:
        given = json.loads(value)
        if not isinstance(given, dict):
            raise ValueError("not a JSON object")
        return {str(int(p)): int(o) for p, o in given.items()}
    except TypeError as e:
        raise ValueError(str(e)) from None


def cap(begin: dict[int, int], end: dict[int, int], max_rows: int, earliest: dict[int, int]) -> dict[int, int]:
    """Limit the total records in [begin, end) to ``max_rows``, shared in proportion to each
    partition's backlog; every partition with a backlog advances by at least one record so that
    a small cap over many partitions still makes progress everywhere."""
    backlog = {p: e - begin.get(p, earliest.get(p, 0)) for p, e in end.items()}
    total = sum(b for b in backlog.values() if b > 0)
    if total <= max_rows:
        return end
    out = {}
    for p, e in end.items():
        s = begin.get(p, earliest.get(p, 0))
        b = backlog[p]
        take = max(1, (b * max_rows) // total) if b > 0 else 0
        out[p] = min(e, s + take)
    return out


def messages_in_range(part: KafkaSourcePartition, idle_timeout_s: float = READ_IDLE_TIMEOUT_S) -> Iterator[Any]:
    """The consumer messages with offsets in [start, end) of each of the task's partitions, each
    once, in offset order per partition (the one loop every reader of a range shares)."""
    import time

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        **part.kafka,
        "group.id": f"kafka-monitor-source-{uuid.uuid4().hex[:8]}",  # never joins nor commits
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error" if part.fail_on_data_loss else "earliest",
        "fetch.wait.max.ms": 100,
    })
    nxt = {p: s for p, s, _ in part.ranges}
    end = {p: e for p, _, e in part.ranges}
    try:
        consumer.assign([TopicPartition(part.topic, p, s) for p, s, _ in part.ranges])
        open_parts = {p for p in nxt if nxt[p] < end[p]}
        last_progress = last_warned = time.monotonic()
        since: dict[int, float] = {}  # partition -> when a broker first said its offset was out of range
        short = False  # a consume came back with fewer messages than asked
        while open_parts:
            # consume() waits for its full timeout unless it gets num_messages: ask for exactly
            # the records left, so it returns with the last one.  Not for an end-of-partition
            # event too: the broker holds the fetch after the last record for fetch.wait.max.ms
            # (100 ms a read, measured on Tansu).  Once a consume came back short (records
            # missing below the end: control records, compaction; or a slow broker), those
            # events close the partitions, and each is asked for
            want = sum(end[p] - nxt[p] for p in open_parts) + (len(open_parts) if short else 0)
            msgs = consumer.consume(num_messages=min(5000, want), timeout=1.0)
            short = short or len(msgs) < min(5000, want)
            if not msgs and time.monotonic() - last_progress > idle_timeout_s:
                raise SourceError(f"{part.topic}: no records for {idle_timeout_s:.0f}s while reading "
                                  + ", ".join(f"partition {p} [{nxt[p]}, {end[p]})" for p in sorted(open_parts)))
            for m in msgs:
                err = m.error()
                p, off = m.partition(), m.offset()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        # Records missing below the end (control records, compaction) are not an
                        # error: the broker says the log ends at m.offset().
                        if p is not None and off is not None and p in open_parts and off >= end[p]:
                            nxt[p] = end[p]
                            open_parts.discard(p)
                        continue
                    if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        where = f"{part.topic}/{p}" if p is not None and p >= 0 else part.topic
                        if p in open_parts and not_there_yet(consumer, part, p, nxt[p], since, idle_timeout_s):
                            continue
                        raise SourceError(
                            f"{where}: offsets from {nxt.get(p, '?') if p is not None else '?'} were deleted (retention) before they were "
                            f"read; restart with option failOnDataLoss=false to skip them ({err.str()})")
                    fatal = permanent_error(err)
                    if fatal:
                        raise SourceError(f"{part.topic}/{p}: {fatal}")
                    if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise SourceError(f"{part.topic}/{p}: {err.str()} (the events topic was deleted?)")
                    # a broker down, paused or fenced, a leader moving: librdkafka retries, the
                    # idle timeout bounds the wait
                    if time.monotonic() - last_warned > 10:
                        log.warning("%s: %s while reading; waiting for the partition's leader", part.topic, err.str())
                        last_warned = time.monotonic()
                    continue
                if p is None or off is None or p not in open_parts:
                    continue
                if off >= end[p]:
                    nxt[p] = end[p]
                    open_parts.discard(p)
                    continue
                if off < nxt[p]:
                    continue
                nxt[p] = off + 1
                since.pop(p, None)
                if nxt[p] >= end[p]:
                    open_parts.discard(p)
                last_progress = time.monotonic()
                yield m
    finally:
        consumer.close()


def not_there_yet(consumer: Any, part: KafkaSourcePartition, p: int, offset: int, since: dict[int, float],
                  timeout_s: float) -> bool:
    """A Fetch at ``offset`` answered OFFSET_OUT_OF_RANGE: True when the records are still there
    and the read should go on (the partition is assigned again at ``offset`` after a short wait);
    False when they were deleted (the log starts after ``offset``: data loss).

    A broker whose log does not reach ``offset`` also answers so: a leader back from a pause
    that has not yet learnt it was replaced (seen with SIGSTOP on the real cluster), fetched
    through metadata that still names it.  The range's end came from the partition's true
    leader, so that answer passes once the client's metadata does; a log that still ends before
    ``offset`` after ``timeout_s`` went back for good (truncated by an unclean election, or the
    topic recreated): that fails the read, naming it."""
    import time

    from confluent_kafka import TopicPartition

    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(part.topic, p), timeout=5, cached=False)
    except Exception:  # noqa: BLE001 - no answer now: undecided, asked again at the next error
        low, high = -1, -1
    if low > offset:
        return False
    if p not in since:
        since[p] = time.monotonic()
        log.warning("%s/%d: a broker says offset %d is out of range while the log starts at %d: waiting for the "
                    "partition's current leader", part.topic, p, offset, low)
    if time.monotonic() - since[p] > timeout_s:
        raise SourceError(f"{part.topic}/{p}: the partition's log ends at {high}, before offset {offset} that the batch "
                          f"reads, for {timeout_s:.0f}s: it went back (an unclean leader election, or the topic "
                          "deleted and created again)")
    time.sleep(0.5)
    # the error stopped the partition's fetcher (a seek fails in that state): assign it again
    consumer.incremental_unassign([TopicPartition(part.topic, p)])
    consumer.incremental_assign([TopicPartition(part.topic, p, offset)])
    return True


def read_range(part: KafkaSourcePartition, idle_timeout_s: float = READ_IDLE_TIMEOUT_S) -> Iterator[pa.RecordBatch]:
    """Yield the records of [start, end) of each of the task's partitions as Arrow record
    batches, built column-wise.  Measured (bench/source_bench.py, 200k events, local[2]): 1.3-1.5x
    less Python CPU per record than yielding tuples (which PySpark then converts field by field),
    the same wall time on Tansu, where the broker sets the pace (~7 us per record).  A batch
    has at most ``ARROW_BATCH_ROWS`` records and about ``ARROW_BATCH_BYTES`` bytes.  Keys and
    values are kept as bytes and turned into text by Arrow (one UTF-8 check per batch); a batch
    with a value that is not UTF-8 is decoded in Python, the bad bytes replaced, as before."""
    cols: dict[str, list] = {n: [] for n in ARROW_SCHEMA.names}
    size = 0
    for m in messages_in_range(part, idle_timeout_s):
        key, value = m.key(), m.value()
        cols["key"].append(key)
        cols["value"].append(value)
        cols["partition"].append(m.partition())
        cols["offset"].append(m.offset())
        cols["timestamp"].append(m.timestamp()[1])
        size += len(value or b"") + len(key or b"")
        if len(cols["offset"]) >= ARROW_BATCH_ROWS or size >= ARROW_BATCH_BYTES:
            yield _record_batch(cols, part.topic)
            cols = {n: [] for n in ARROW_SCHEMA.names}
            size = 0
    if cols["offset"]:
        yield _record_batch(cols, part.topic)


def _text(raw: list) -> pa.Array:
    """Keys or values (bytes or None) as Arrow strings; bytes that are not UTF-8 get U+FFFD."""
    try:
        return pa.array(raw, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([v.decode("utf-8", "replace") if v is not None else None for v in raw], pa.string())


def _record_batch(cols: dict[str, list], topic: str) -> pa.RecordBatch:
    n = len(cols["offset"])
    return pa.RecordBatch.from_arrays(
        [_text(cols["key"]), _text(cols["value"]), pa.array([topic] * n, pa.string()),
         pa.array(cols["partition"], pa.int32()), pa.array(cols["offset"], pa.int64()),
         pa.array(cols["timestamp"], pa.int64())], schema=ARROW_SCHEMA)
