"""The alerts topic: every alert transition as a JSON record keyed by alert id, published
exactly once per transition even when Spark replays a micro-batch after a crash.

Each record carries ``batch_id`` and ``index`` (its place in the batch's transitions, which are
sorted so a replayed batch lists them in the same order), ``sequence`` = batch_id * 10^6 +
index, and ``query_id``, the streaming query's id (Spark keeps it in the checkpoint).  Within a
query id the sequence increases: a consumer that remembers the highest sequence it saw per query
id can drop anything at or below it.  A job started on a new checkpoint has a new query id, and
its batch ids start again at 0.

Exactly once without Kafka transactions: one writer per checkpoint.  Before its first publish
after a start the sink reads the tail of the alerts topic and learns which transitions of its
query's latest batch are already there; a replayed batch then publishes only what is missing,
and an older batch nothing.  Records of another query id (an earlier checkpoint) are not this
query's: they hold nothing back.  Records without a query id (written before it was added) are
taken as this query's while no record in the tail has one.  A batch is done only when every
record was acknowledged (idempotent producer, flush); otherwise the batch fails and Spark runs it
again.

The alerts topic may live on the cluster the monitor watches (issue 33): a broker down, paused
or fenced under it delays a batch, never fails it.  The idempotent producer retries each record
until librdkafka's ``message.timeout.ms`` (5 minutes by default) and the flush waits as long;
reading the tail back at start-up retries transient errors for ``recover_timeout_s``.  Only
what retrying cannot fix (authorization, authentication, a fatal producer) fails at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any, Iterable, Optional

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from monitor.access import authorization_resource, fatal_reason, missing_acl, permanent_error

log = logging.getLogger(__name__)

#: the read-back consumer's group id prefix (never joins nor commits; FindCoordinator still needs
#: DESCRIBE on it: docs/security.md)
READER_GROUP_PREFIX = "kafka-monitor-alerts-reader-"
SEQUENCE_STRIDE = 1_000_000  # transitions per batch at most (a batch with more fails loudly)
TAIL_RECORDS = 5_000         # per partition, read back at start-up
#: a batch's flush waits this long: librdkafka's default message.timeout.ms (300 s) and a margin,
#: so a record is delivered or has failed by then
FLUSH_TIMEOUT_S = 330.0
RECOVER_TIMEOUT_S = 300.0


class AlertsSinkError(RuntimeError):
    pass


class _Transient(RuntimeError):
    """A broker error that retrying may fix (read-back of the tail)."""


def transition_sort_key(r: dict) -> tuple:
    return (r["at"] or 0, r["alert_id"] or "", r["action"] or "")


#: (label on the alerts topic, the state row's column): the names /metrics and the Prometheus
#: rules use (``group``, not the row's ``consumer_group``)
_LABELS = (("cluster", "cluster"), ("topic", "topic"), ("partition", "partition"), ("group", "consumer_group"),
           ("source", "source"), ("broker", "broker"))


def record_value(r: dict, batch_id: int, index: int, query_id: Optional[str] = None) -> bytes:
    """A transition's record on the alerts topic: its fields, labels, evidence (a JSON object),
    batch id, index, sequence and query id (when known).  The evidence is the row's JSON text as
    the state wrote it (``json.dumps``, default separators), spliced in unparsed: the same bytes as
    dumping it again."""
    head = json.dumps({"alert": r["alert"], "action": r["action"], "alert_id": r["alert_id"],
                       "severity": r["severity"], "at": r["at"],
                       "labels": {name: r[k] for name, k in _LABELS if r.get(k) is not None}})
    query = "" if query_id is None else f', "query_id": {json.dumps(query_id)}'
    return (f'{head[:-1]}, "evidence": {r.get("evidence") or "{}"}, "batch_id": {batch_id}, "index": {index}, '
            f'"sequence": {batch_id * SEQUENCE_STRIDE + index}{query}}}').encode()


class AlertsTopicSink:
    """``query_id``: the streaming query's, written into every record and matched at the read-back.
    With ``wait_query_id`` (the job: the id is known once the query has started) ``publish``
    waits for it to be set; without, records carry none."""

    def __init__(self, kafka: dict[str, str], topic: str, flush_timeout_s: float = FLUSH_TIMEOUT_S,
                 recover_timeout_s: float = RECOVER_TIMEOUT_S, query_id: Optional[str] = None,
                 wait_query_id: bool = False):
        self.kafka = dict(kafka)
        self.topic = topic
        self.flush_timeout_s = flush_timeout_s
        self.recover_timeout_s = recover_timeout_s
        self._producer: Optional[Producer] = None
        #: per query id found in the topic's tail (None: records without one): its highest batch
        #: id and the indices of that batch already there
        self._tail: dict[Optional[str], tuple[int, set[int]]] = {}
        self._last_batch: Optional[int] = None       # this query's highest batch id in the topic
        self._published_in_last: set[int] = set()    # indices of that batch already there
        self._query_id = query_id
        self._query_known = threading.Event()
        if query_id is not None or not wait_query_id:
            self._query_known.set()
        self.published = 0
        self.skipped_replays = 0
        self._recovered = False

    @property
    def query_id(self) -> Optional[str]:
        return self._query_id

    @query_id.setter
    def query_id(self, value: str) -> None:
        self._query_id = value
        self._query_known.set()

    # -- start-up: what is already in the topic ------------------------------------------------

    def recover(self) -> None:
        """Learn which transitions of the latest batch are already in the topic.  A broker fault
        (a timeout, a leader moving, a partition without a leader for a while) is retried until
        ``recover_timeout_s``; authorization and authentication errors fail at once."""
        deadline = time.monotonic() + self.recover_timeout_s
        delay = 1.0
        while True:
            try:
                self._read_back(deadline)
                return
            except (KafkaException, _Transient) as e:
                if permanent_error(e):
                    raise AlertsSinkError(f"reading the alerts topic back: {fatal_reason(e) or e}" + missing_acl(
                        e, topic=("READ", self.topic))) from None
                if time.monotonic() + delay > deadline:
                    raise AlertsSinkError(f"reading the alerts topic {self.topic!r} back: {e} (still failing after "
                                          f"{self.recover_timeout_s:.0f}s)") from None
                log.warning("reading the alerts topic %s back: %s; retrying in %.0fs", self.topic, e, delay)
                time.sleep(delay)
                delay = min(2 * delay, 15.0)

    def _read_back(self, deadline: float) -> None:
        self._tail = {}
        c = Consumer({**self.kafka, "group.id": f"{READER_GROUP_PREFIX}{uuid.uuid4().hex[:8]}",
                      "enable.auto.commit": False, "enable.partition.eof": True})
        try:
            md = c.list_topics(self.topic, timeout=30)
            t = md.topics.get(self.topic)
            if t is not None and t.error is not None and authorization_resource(t.error) is None \
                    and t.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise _Transient(f"alerts topic {self.topic!r}: {t.error}")  # e.g. LEADER_NOT_AVAILABLE
            if t is None or t.error is not None:
                raise AlertsSinkError(f"alerts topic {self.topic!r} is not available: {t.error if t else 'absent'}"
                                      f"{missing_acl(t.error, topic=('READ', self.topic)) if t else ''}; "
                                      f"create it or pass another --alerts-topic")
            assign = []
            for p in t.partitions:
                lo, hi = c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30)
                if hi > lo:
                    # hi may be under-reported by some brokers (Tansu): reading on to the end of
                    # the partition (EOF) below covers what follows it
                    assign.append(TopicPartition(self.topic, p, max(lo, hi - TAIL_RECORDS)))
            if not assign:
                return
            c.assign(assign)
            eof: set[int] = set()
            while len(eof) < len(assign):
                if time.monotonic() > deadline:
                    raise _Transient(f"partitions {sorted(set(tp.partition for tp in assign) - eof)} not read to "
                                     f"their end")
                for m in c.consume(1000, timeout=0.5):  # returns at its timeout unless 1000 came: short
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            eof.add(m.partition() or 0)
                            continue
                        if permanent_error(err) or err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                            raise AlertsSinkError(f"reading the alerts topic back: {err}" + missing_acl(
                                err, topic=("READ", self.topic),
                                group=("DESCRIBE", f"{READER_GROUP_PREFIX}* (prefixed)")))
                        if time.monotonic() > deadline:
                            raise _Transient(str(err))
                        continue  # a broker down or a leader moving: librdkafka retries
                    try:
                        rec = json.loads(m.value() or b"")
                        b, i = int(rec["batch_id"]), int(rec["index"])
                        q = rec.get("query_id")
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue  # not ours
                    last = self._tail.get(q)
                    if last is None or b > last[0]:
                        self._tail[q] = (b, {i})
                    elif b == last[0]:
                        last[1].add(i)
        finally:
            c.close()
        self._recovered = True
        for q, (b, done) in sorted(self._tail.items(), key=lambda kv: kv[0] or ""):
            log.info("alerts topic %s: query %s's last published batch %d (%d transitions)", self.topic,
                     q or "(no query id)", b, len(done))

    def last_published(self) -> Optional[tuple[int, set[int]]]:
        """After ``recover``: this query's last batch in the topic's tail and the indices of it
        there, or None.  Its own records'; while no record there has a query id (all written
        before records carried one), those."""
        if any(q is not None for q in self._tail):
            last = self._tail.get(self._query_id) if self._query_id is not None else None
        else:
            last = self._tail.get(None)
        return None if last is None else (last[0], set(last[1]))

    # -- publishing --------------------------------------------------------------------------

    def publish(self, batch_id: int, transitions: Iterable[dict]) -> int:
        """Publish a batch's transitions (the state output rows with kind == 'alert');
        returns how many records were written."""
        rows = sorted(transitions, key=transition_sort_key)
        if len(rows) >= SEQUENCE_STRIDE:
            raise AlertsSinkError(f"batch {batch_id} has {len(rows)} transitions; at most {SEQUENCE_STRIDE - 1}")
        if self._producer is None:
            if not self._query_known.wait(self.recover_timeout_s):
                raise AlertsSinkError("the streaming query's id never came (AlertsTopicSink.query_id)")
            if not self._recovered:
                self.recover()
            last = self.last_published()
            self._last_batch, self._published_in_last = (None, set()) if last is None else last
            self._producer = Producer({**self.kafka, "enable.idempotence": True, "linger.ms": 5})
        if self._last_batch is not None and batch_id < self._last_batch:
            self.skipped_replays += len(rows)
            return 0
        already = self._published_in_last if batch_id == self._last_batch else set()
        failures: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(f"{err}{missing_acl(err, topic=('WRITE', self.topic))}")

        n = 0
        try:
            n = self._produce(batch_id, rows, already, on_delivery)
            left = self._flush()
        except KafkaException as e:  # a fatal producer error (e.g. no WRITE: no idempotent producer id) is raised
            raise AlertsSinkError(f"batch {batch_id}: the alerts producer failed: "
                                  f"{fatal_reason(e, self.topic) or e}") from None
        if left or failures:
            raise AlertsSinkError(f"batch {batch_id}: {left} alert records undelivered, {len(failures)} failed "
                                  f"({failures[:1]}); the batch will be retried")
        self._last_batch, self._published_in_last = batch_id, set(range(len(rows)))
        self.published += n
        return n

    def _live_producer(self) -> Producer:
        if self._producer is None:
            raise AlertsSinkError("the alerts producer is closed")
        return self._producer

    def _flush(self) -> int:
        """flush() by polling: confluent-kafka 2.16 raises a fatal producer error from poll() as a
        KafkaException, but from flush() as a SystemError without the error."""
        producer = self._live_producer()
        deadline = time.monotonic() + self.flush_timeout_s
        while len(producer) and time.monotonic() < deadline:
            producer.poll(min(0.1, max(0.0, deadline - time.monotonic())))
        return len(producer)

    def _produce(self, batch_id: int, rows: list, already: set, on_delivery: Any) -> int:
        producer = self._live_producer()
        n = 0
        for i, r in enumerate(rows):
            if i in already:
                self.skipped_replays += 1
                continue
            producer.produce(self.topic, key=r["alert_id"].encode(), value=record_value(r, batch_id, i, self._query_id),
                             on_delivery=on_delivery)
            producer.poll(0)
            n += 1
        return n

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None


def read_published(kafka: dict[str, str], topic: str, since_ms: Optional[int] = None,
                   timeout_s: float = 120.0) -> list[dict]:
    """The records on the alerts topic, decoded: from the first published at or after ``since_ms``
    (the records' timestamps, their publish time; None: from the start) to the end of each
    partition as it is now.  A record that is not a transition is skipped.  Raises
    ``AlertsSinkError`` when the topic is missing or a partition is not read to its end within
    ``timeout_s``, retriable errors (a leader moving) asked again until then (replay's
    comparison; the tests' reader)."""
    c = Consumer({**kafka, "group.id": f"{READER_GROUP_PREFIX}{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    out: list[dict] = []
    deadline = time.monotonic() + timeout_s

    def asking(what: str, call):
        # a leader moving (NOT_LEADER, a broker down) answers at once: ask again until the deadline
        while True:
            try:
                return call()
            except KafkaException as e:
                if permanent_error(e) or time.monotonic() > deadline:
                    raise AlertsSinkError(f"reading the alerts topic {topic!r}: {what}: {e}" + missing_acl(
                        e, topic=("READ", topic))) from e
                time.sleep(0.5)
    try:
        t = c.list_topics(topic, timeout=30).topics.get(topic)
        if t is None or (t.error is not None and not t.partitions):  # a leader moving: its partitions are listed
            raise AlertsSinkError(f"alerts topic {topic!r} is not available: {t.error if t else 'absent'}"
                                  f"{missing_acl(t.error, topic=('READ', topic)) if t else ''}")
        parts = [TopicPartition(topic, p, since_ms if since_ms is not None else 0) for p in t.partitions]
        if since_ms is not None:
            parts = asking("offsets for times", lambda: c.offsets_for_times(parts, timeout=30))
        start = []
        for tp in parts:
            lo, hi = asking(f"watermarks of partition {tp.partition}",
                            lambda p=tp.partition: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30))
            # no record at or after since_ms: offsets_for_times answers the end (-1)
            offset = hi if tp.offset < 0 else max(tp.offset, lo) if since_ms is not None else lo
            if offset < hi:
                start.append(TopicPartition(topic, tp.partition, offset))
        if not start:
            return out
        c.assign(start)
        eof: set[int] = set()
        while len(eof) < len(start):
            if time.monotonic() > deadline:
                raise AlertsSinkError(f"reading the alerts topic {topic!r}: partitions "
                                      f"{sorted({tp.partition for tp in start} - eof)} not read to their end within "
                                      f"{timeout_s:.0f}s")
            for m in c.consume(1000, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition() or 0)
                    elif permanent_error(err):
                        raise AlertsSinkError(f"reading the alerts topic {topic!r}: {err}" + missing_acl(
                            err, topic=("READ", topic), group=("DESCRIBE", f"{READER_GROUP_PREFIX}* (prefixed)")))
                    continue
                try:
                    rec = json.loads(m.value() or b"")
                except ValueError:
                    continue
                if isinstance(rec, dict) and "alert_id" in rec and "at" in rec:
                    out.append(rec)
    finally:
        c.close()
    return out
