"""The canary: the write path as a producer meets it, end to end.

A topic of the monitor's own with one partition led (preferred) by each broker; a small steady
stream of ``acks=all`` writes to every partition, each carrying the canary's run id, a sequence
number and its send time; a consumer (assigned, no group) reading them back.  Per partition it
counts what was sent, acknowledged, read back, lost, duplicated and reordered, and the time from
send to ack (the replication commit: the leader acks only once the whole ISR has the write and
the high watermark passed it) and from send to read.  Every ``report_interval_s`` it emits one
``canary`` event per partition (cumulative counters, see ``monitor.contract.Canary``); the job
uses its pending writes for HighWatermarkStalled and serves the rest as metrics.

The topic is created by the canary (one partition per broker, replicas in ring order from the
partition's preferred leader), grown when a broker appears that leads none, and its preferred
leaders are elected back when leadership moved away and the preferred replica is in sync again.
Where the probe may not create or alter it, the canary says what to do and stops; the probe
runs on.  Design notes: docs/canary.md.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from monitor.contract import CANARY_LATENCY_BOUNDS_MS, Canary as CanaryReport, CanaryErrorCount

log = logging.getLogger(__name__)

#: a canary record's value: magic, run id, sequence number, send time (epoch ms)
_RECORD = struct.Struct(">4s8sQQ")
_MAGIC = b"KMC1"
#: errors that mean the probe's principal may not create or grow the topic
_REFUSED = {"TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED", "POLICY_VIOLATION",
            "INVALID_REPLICATION_FACTOR", "INVALID_REPLICA_ASSIGNMENT"}
#: received sequence numbers remembered per partition, for duplicates (older ones: counted
#: duplicates when they come again, since they were read once)
SEEN_WINDOW = 4096
#: acknowledged writes waiting to be read back, per partition; past it the oldest count as lost
MAX_UNREAD = 10_000


#: a canary write unacknowledged this long (ms) counts as waiting (healthy: tens of ms)
WAITING_AFTER_MS = 2_000


def writes_held_by(parts: dict[int, tuple[int, list[int]]], answering: set[int], waiting: dict[int, int],
                   now_ms: int, after_ms: int = WAITING_AFTER_MS, previous: Optional[int] = None
                   ) -> Optional[tuple[int, int, int]]:
    """Which broker the canary's acks=all writes wait for, if one explains them all.

    ``parts``: partition -> (leader, ISR); ``answering``: the brokers that answered the probe's
    last requests; ``waiting``: partition -> when its oldest unacknowledged write was sent.  A
    partition whose write has waited ``after_ms`` while its leader answers is held by a follower
    still in its ISR (the leader acks once the whole ISR has the write); the broker that is such
    a follower of every one of them is named: (broker, since when, how many partitions).  None
    when nothing waits or no single broker explains it (one partition held on RF 3 has two
    candidates; a silent leader's own partition says nothing of its followers).  ``previous``, the
    broker named last time, stays named while it is still one of the candidates: the leaders drop
    a stopped follower from their ISRs at different moments, and the partitions still held then
    may no longer single it out."""
    held = [p for p, since in waiting.items()
            if now_ms - since >= after_ms and p in parts and parts[p][0] >= 0 and parts[p][0] in answering]
    if not held:
        return None
    suspects = set.intersection(*(set(parts[p][1]) - {parts[p][0]} for p in held))
    if previous is not None and previous in suspects:
        suspects = {previous}
    if len(suspects) != 1:
        return None
    return suspects.pop(), min(waiting[p] for p in held), len(held)


def answering_brokers(rxidle: dict[int, tuple[float, int]], now: float, within_ms: int = WAITING_AFTER_MS) -> set[int]:
    """The brokers the canary's consumer heard from within ``within_ms``: ``rxidle`` is broker ->
    (monotonic s of the statistics, librdkafka's rxidle there: µs since the last receive, -1 for
    none).  Its fetches long-poll every leader of a canary partition (fetch.wait.max.ms 50), so a
    leader that answers is heard from many times a second; a paused one is not."""
    return {b for b, (at, idle) in rxidle.items()
            if idle >= 0 and idle / 1000.0 + (now - at) * 1000.0 < within_ms}


@dataclass(frozen=True)
class WritesHeld:
    """The canary's verdict at a report: (broker, since epoch ms, partitions), or None (the
    probe sends it in its broker_state events)."""
    held: Optional[tuple[int, int, int]]


class CanarySetupError(RuntimeError):
    """The canary topic cannot be created or repaired with the probe's rights: the text says what to do."""


@dataclass
class CanaryConfig:
    topic: str = "kafka-monitor-canary"
    #: seconds between two writes to one partition
    interval_s: float = 1.0
    #: seconds between two reports (one event per partition); the probe uses its own interval
    report_interval_s: float = 10.0
    #: replicas per partition; default min(3, brokers)
    replication_factor: Optional[int] = None
    #: an acknowledged write not read back within this is lost
    lost_after_s: float = 30.0
    #: a write not acknowledged within this fails (_MSG_TIMED_OUT)
    delivery_timeout_s: float = 30.0
    #: how often the topic's layout (a partition per broker, preferred leaders, the ISRs
    #: writes_held_by reads) is checked, s
    layout_check_s: float = 10.0
    #: the canary topic's retention: its records are only read once, right away
    retention_ms: int = 3_600_000


def plan_layout(brokers: list[int], replicas: dict[int, list[int]], rf: int) -> list[list[int]]:
    """New partitions' replica lists (for partitions ``len(replicas)``, ``len(replicas) + 1``,
    ...) so that every broker is the preferred leader (first replica) of at least one partition:
    one per broker that leads none, its other replicas the next brokers in id order."""
    brokers = sorted(brokers)
    led = {r[0] for r in replicas.values() if r}
    out = []
    for i, b in enumerate(brokers):
        if b not in led:
            out.append([brokers[(i + k) % len(brokers)] for k in range(min(rf, len(brokers)))])
    return out


class _Histogram:
    __slots__ = ("counts", "sum_ms")

    def __init__(self) -> None:
        self.counts = [0] * (len(CANARY_LATENCY_BOUNDS_MS) + 1)
        self.sum_ms = 0.0

    def observe(self, ms: float) -> None:
        self.counts[bisect.bisect_left(CANARY_LATENCY_BOUNDS_MS, ms)] += 1
        self.sum_ms += ms


@dataclass
class _Partition:
    next_seq: int = 0
    #: seq -> send time (monotonic s), in send order: sent, not acknowledged yet
    unacked: dict[int, float] = field(default_factory=dict)
    #: seq -> ack time (monotonic s), in ack order: acknowledged, not read back yet
    unread: dict[int, float] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)
    max_seen: int = -1
    sent: int = 0
    acked: int = 0
    received: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    produce: _Histogram = field(default_factory=_Histogram)
    e2e: _Histogram = field(default_factory=_Histogram)
    leader: Optional[int] = None


class CanaryStats:
    """The canary's bookkeeping, without any client (unit-tested with a fake clock)."""

    def __init__(self, run_id: bytes, lost_after_s: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.run_id = run_id
        self.lost_after_s = lost_after_s
        self._clock = clock
        self._wall = wall
        self.parts: dict[int, _Partition] = {}
        self._lock = threading.Lock()  # deliveries are served on a thread of their own (Canary._serve_deliveries)

    def part(self, p: int) -> _Partition:
        got = self.parts.get(p)
        if got is None:
            got = self.parts[p] = _Partition()
        return got

    def next_record(self, p: int) -> tuple[int, bytes]:
        """The next write to partition ``p``: (its seq, its value); counted as sent."""
        with self._lock:
            st = self.part(p)
            seq = st.next_seq
            st.next_seq += 1
            st.sent += 1
            st.unacked[seq] = self._clock()
            return seq, _RECORD.pack(_MAGIC, self.run_id, seq, int(self._wall() * 1000))

    def unsent(self, p: int, seq: int) -> None:
        """The write could not even be queued (the local queue is full): not sent."""
        with self._lock:
            st = self.part(p)
            if st.unacked.pop(seq, None) is not None:
                st.sent -= 1

    def on_delivery(self, p: int, seq: int, error: Optional[str], latency_s: Optional[float] = None) -> None:
        """A write's delivery report; ``latency_s``: librdkafka's time from produce() to the
        report (the report may be served later, in a poll)."""
        with self._lock:
            st = self.part(p)
            sent_at = st.unacked.pop(seq, None)
            if sent_at is None:
                return
            if error is not None:
                st.errors[error] = st.errors.get(error, 0) + 1
                return
            now = self._clock()
            st.acked += 1
            st.produce.observe((now - sent_at if latency_s is None else latency_s) * 1000.0)
            if seq not in st.seen and seq > st.max_seen - SEEN_WINDOW:  # not read back before its ack came
                st.unread[seq] = now
                if len(st.unread) > MAX_UNREAD:
                    st.unread.pop(next(iter(st.unread)))
                    st.lost += 1

    def on_record(self, p: int, value: Optional[bytes]) -> bool:
        """A record read back from partition ``p``; False when it is not one of this run's."""
        if value is None or len(value) != _RECORD.size:
            return False
        magic, run, seq, sent_ms = _RECORD.unpack(value)
        if magic != _MAGIC or run != self.run_id:
            return False
        with self._lock:
            st = self.part(p)
            if seq in st.seen or seq <= st.max_seen - SEEN_WINDOW:
                st.duplicated += 1
                return True
            st.received += 1
            st.e2e.observe(max(0.0, self._wall() * 1000.0 - sent_ms))
            st.unread.pop(seq, None)
            if seq < st.max_seen:
                st.out_of_order += 1
            st.seen.add(seq)
            if seq > st.max_seen:
                st.max_seen = seq
                if len(st.seen) > 2 * SEEN_WINDOW:
                    floor = st.max_seen - SEEN_WINDOW
                    st.seen = {s for s in st.seen if s > floor}
            return True

    def expire(self) -> None:
        """Acknowledged writes not read back within ``lost_after_s`` count as lost."""
        now = self._clock()
        with self._lock:
            for st in self.parts.values():
                while st.unread:
                    seq, at = next(iter(st.unread.items()))
                    if now - at < self.lost_after_s:
                        break
                    del st.unread[seq]
                    st.lost += 1

    def waiting_since(self) -> dict[int, int]:
        """Partition -> when its oldest unacknowledged write was sent (epoch ms), for the
        partitions with writes waiting for their ack."""
        now, wall = self._clock(), self._wall()
        with self._lock:
            return {p: int((wall - (now - t)) * 1000) for p, st in self.parts.items()
                    for t in [next(iter(st.unacked.values()), None)] if t is not None}

    def reports(self, topic: str, started_at: int) -> list[CanaryReport]:
        now = self._clock()
        out = []
        with self._lock:
            for p in sorted(self.parts):
                st = self.parts[p]
                oldest = next(iter(st.unacked.values()), None)
                out.append(CanaryReport(
                    topic=topic, partition=p, started_at=started_at, leader=st.leader, sent=st.sent,
                    acked=st.acked, received=st.received, lost=st.lost, duplicated=st.duplicated,
                    out_of_order=st.out_of_order, pending=len(st.unacked),
                    oldest_pending_ms=None if oldest is None else int((now - oldest) * 1000),
                    produce_latency_counts=list(st.produce.counts), produce_latency_sum_ms=round(st.produce.sum_ms, 3),
                    e2e_latency_counts=list(st.e2e.counts), e2e_latency_sum_ms=round(st.e2e.sum_ms, 3),
                    errors=[CanaryErrorCount(code=c, count=n) for c, n in sorted(st.errors.items())],
                    lost_after_ms=int(self.lost_after_s * 1000)))
        return out


class Canary:
    """Runs on its own thread beside the probe (``run``): writes, reads back, reports through
    ``emit`` (the probe's canary emitter), keeps the topic's layout."""

    def __init__(self, cfg: CanaryConfig, client_conf: dict[str, Any], emit: Callable[[Any], Any], *,
                 admin: Optional[Any] = None):
        self.cfg = cfg
        self._conf = client_conf
        self._emit = emit
        self._admin = admin or AdminClient({**client_conf})
        self.stats = CanaryStats(os.urandom(8), cfg.lost_after_s)
        self.started_at = int(time.time() * 1000)
        self._producer: Optional[Producer] = None
        self._consumer: Optional[Consumer] = None
        self._assigned: set[int] = set()
        self.partitions: list[int] = []
        #: set when the canary stopped for good (the topic cannot be set up): the reason
        self.failed: Optional[str] = None
        #: partition -> (leader, ISR) at the last layout check
        self.layout: dict[int, tuple[int, list[int]]] = {}
        #: broker -> (monotonic s, rxidle µs) from the consumer's statistics
        self._rxidle: dict[int, tuple[float, int]] = {}
        #: the broker the writes wait for, at the last report (writes_held_by)
        self.held: Optional[tuple[int, int, int]] = None
        #: False after the topic was created or grown: its leaders are not known yet
        self._leaders_known = False

    # -- the topic ---------------------------------------------------------------------------

    def ensure_layout(self, timeout: float = 15.0) -> list[int]:
        """Create the topic, or grow it so every broker leads a partition; elect preferred
        leaders back.  Returns the topic's partitions.  ``CanarySetupError`` when refused."""
        # once the topic exists only its own metadata (and the brokers) is asked for
        md = (self._admin.list_topics(topic=self.cfg.topic, timeout=timeout) if self.partitions
              else self._admin.list_topics(timeout=timeout))
        brokers = sorted(md.brokers)
        if not brokers:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "no broker in the metadata"))
        rf = min(self.cfg.replication_factor or 3, len(brokers))
        t = md.topics.get(self.cfg.topic)
        if t is None or (t.error is not None and t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            plan = plan_layout(brokers, {}, rf)
            nt = NewTopic(self.cfg.topic, num_partitions=len(plan), replication_factor=-1, replica_assignment=plan,
                          config={"retention.ms": str(self.cfg.retention_ms), "cleanup.policy": "delete"})
            self._wait(self._admin.create_topics([nt], request_timeout=timeout), "create", timeout)
            self._leaders_known = False
            log.info("canary: created topic %s: %d partitions, replicas %s", self.cfg.topic, len(plan), plan)
            return list(range(len(plan)))
        replicas = {p.id: list(p.replicas) for p in t.partitions.values()}
        plan = plan_layout(brokers, replicas, rf)
        if plan:
            total = len(replicas) + len(plan)
            self._wait(self._admin.create_partitions([NewPartitions(self.cfg.topic, total, plan)],
                                                     request_timeout=timeout), "grow", timeout)
            self._leaders_known = False
            log.info("canary: topic %s grown to %d partitions (brokers %s lead none): %s", self.cfg.topic,
                     total, sorted(r[0] for r in plan), plan)
            return list(range(total))
        self._elect_preferred(t, timeout)
        with self.stats._lock:  # (checked on the layout thread, reported on the canary's)
            for p in t.partitions.values():
                self.stats.part(p.id).leader = p.leader
        self.layout = {p.id: (p.leader, list(p.isrs)) for p in t.partitions.values()}
        self._leaders_known = all(p.leader >= 0 for p in t.partitions.values())
        return sorted(replicas)

    def _elect_preferred(self, t: Any, timeout: float) -> None:
        moved = [TopicPartition(self.cfg.topic, p.id) for p in t.partitions.values()
                 if p.replicas and p.leader != p.replicas[0] and p.replicas[0] in p.isrs]
        if not moved or not hasattr(self._admin, "elect_leaders"):
            return
        from confluent_kafka import ElectionType
        try:
            # no kwargs: confluent-kafka 2.16.1 raises SystemError for request/operation_timeout here
            self._admin.elect_leaders(ElectionType.PREFERRED, moved).result(timeout)
            log.info("canary: preferred leaders elected again for partitions %s", sorted(x.partition for x in moved))
        except Exception as e:  # the next check tries again; not worth stopping for
            log.warning("canary: preferred leader election for %s failed: %s", self.cfg.topic, e)

    def _wait(self, futures: dict, what: str, timeout: float) -> None:
        for f in futures.values():
            try:
                f.result(timeout)
            except KafkaException as e:
                err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                name = err.name() if err is not None else str(e)
                if err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # another probe's canary made it first
                if name in _REFUSED:
                    raise CanarySetupError(
                        f"canary: the cluster refused to {what} topic {self.cfg.topic!r} ({name}: {err.str() if err else e}). "
                        f"Create it yourself with one partition per broker, each broker the first replica of one "
                        f"(kafka-topics.sh --create --topic {self.cfg.topic} --replica-assignment ...), grant the "
                        f"probe's principal Create and Alter on it, or run the probe without --canary") from None
                raise

    # -- clients -----------------------------------------------------------------------------

    def _clients(self) -> tuple[Producer, Consumer]:
        if self._producer is None:
            self._producer = Producer({
                **self._conf, "acks": "all", "enable.idempotence": False, "linger.ms": 0, "socket.nagle.disable": True,
                "message.timeout.ms": int(self.cfg.delivery_timeout_s * 1000),
                "request.timeout.ms": int(min(self.cfg.delivery_timeout_s, 30.0) * 1000),
                "queue.buffering.max.messages": 10_000})
        if self._consumer is None:
            self._consumer = Consumer({
                **self._conf, "group.id": "kafka-monitor-canary",  # assigned, never joins nor commits
                "enable.auto.commit": False, "enable.auto.offset.store": False, "fetch.wait.max.ms": 50,
                "fetch.error.backoff.ms": 100, "statistics.interval.ms": 1000, "stats_cb": self._on_consumer_stats})
        return self._producer, self._consumer

    def _assign(self, partitions: list[int]) -> None:
        """Read every partition from its current end (this run's first write goes after it)."""
        _, consumer = self._clients()
        new = [p for p in partitions if p not in self._assigned]
        if not new:
            return
        tps = []
        for p in new:
            _, hi = consumer.get_watermark_offsets(TopicPartition(self.cfg.topic, p), timeout=10.0)
            tps.append(TopicPartition(self.cfg.topic, p, hi))
        consumer.incremental_assign(tps)
        self._assigned.update(new)
        self.partitions = sorted(self._assigned)

    def _send(self) -> None:
        producer, _ = self._clients()
        for p in self.partitions:
            seq, value = self.stats.next_record(p)

            def done(err: Optional[KafkaError], msg: Any, p: int = p, seq: int = seq) -> None:
                self.stats.on_delivery(p, seq, None if err is None else err.name(), msg.latency())
            try:
                producer.produce(self.cfg.topic, value=value, partition=p, on_delivery=done)
            except BufferError:
                self.stats.unsent(p, seq)

    def _on_consumer_stats(self, raw: str) -> None:
        try:
            brokers = json.loads(raw).get("brokers") or {}
            at = time.monotonic()
            for b in brokers.values():
                node, idle = b.get("nodeid"), b.get("rxidle")
                if isinstance(node, int) and node >= 0 and isinstance(idle, int):
                    self._rxidle[node] = (at, idle)
        except (ValueError, AttributeError) as e:
            log.debug("canary: unreadable consumer statistics: %s", e)

    def report(self) -> None:
        self.stats.expire()
        for r in self.stats.reports(self.cfg.topic, self.started_at):
            self._emit(r)
        self._judge()

    def _judge(self) -> None:
        """Which broker the writes wait for now; said when there is one, and once when it ends."""
        waiting = self.stats.waiting_since()
        prev = self.held
        now = time.monotonic()
        if self._rxidle and now - max(at for at, _ in self._rxidle.values()) > 3.0:
            # the loop was held up (a layout check waiting for a paused broker): the consumer's
            # statistics are old, so who answers is not known; the verdict stands
            if prev is not None:
                self._emit(WritesHeld(prev))
            return
        held = writes_held_by(self.layout, answering_brokers(self._rxidle, now), waiting,
                              int(time.time() * 1000), previous=None if prev is None else prev[0])
        if held is not None and prev is not None and held[0] == prev[0]:
            held = (held[0], min(held[1], prev[1]), held[2])  # the same wait goes on
        self.held = held
        if held is not None or prev is not None:
            self._emit(WritesHeld(held))

    # -- loop --------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        try:
            self._run(stop)
        except CanarySetupError as e:
            self.failed = str(e)
            log.error("%s", e)
        finally:
            self.close()

    def _run(self, stop: threading.Event) -> None:
        log.info("canary: writing to %s every %.1fs per partition (acks=all), reporting every %.0fs",
                 self.cfg.topic, self.cfg.interval_s, self.cfg.report_interval_s)
        self._clients()
        done = threading.Event()
        server = threading.Thread(target=self._serve_deliveries, args=(done,), name="canary-deliveries", daemon=True)
        server.start()
        try:
            self._loop(stop)
        finally:
            done.set()
            server.join(5)

    def _loop(self, stop: threading.Event) -> None:
        next_send = next_report = time.monotonic()
        while not stop.is_set() and not self.partitions:  # the topic first: nothing to write before
            try:
                self._assign(self.ensure_layout())
            except CanarySetupError:
                raise
            except Exception as e:  # the cluster unreachable, a timeout: try again soon
                log.warning("canary: checking topic %s failed (%s); retrying", self.cfg.topic, e)
                stop.wait(min(5.0, self.cfg.layout_check_s))
        # then on a thread of its own: a check waiting for a paused broker must not hold up the
        # writes, the reads and the reports (the loop wrote one round per 5 s timeout)
        checked: list = []
        layout = threading.Thread(target=self._layout_loop, args=(stop, checked), name="canary-layout", daemon=True)
        layout.start()
        try:
            self._write_read(stop, checked, next_send, next_report)
        finally:
            layout.join(20)

    def _layout_loop(self, stop: threading.Event, checked: list) -> None:
        # soon after a creation (the reports name no leader until a check has), after a failure
        def pause() -> float:
            if not self._leaders_known:
                return min(1.0, self.cfg.layout_check_s)
            if checked and checked[-1] is None:
                return min(5.0, self.cfg.layout_check_s)
            return self.cfg.layout_check_s
        while not stop.wait(pause()):
            try:
                checked.append(self.ensure_layout(timeout=10.0))
            except CanarySetupError as e:
                checked.append(e)
                return
            except Exception as e:
                log.warning("canary: checking topic %s failed (%s); retrying", self.cfg.topic, e)
                checked.append(None)
            del checked[:-1]

    def _write_read(self, stop: threading.Event, checked: list, next_send: float, next_report: float) -> None:
        while not stop.is_set():
            now = time.monotonic()
            got = checked[-1] if checked else None
            if isinstance(got, CanarySetupError):
                raise got
            if got is not None and got != self.partitions:
                self._assign(got)
            if self.partitions and now >= next_send:
                self._send()
                next_send = max(next_send + self.cfg.interval_s, now)
            if self.partitions and now >= next_report:
                self.report()
                next_report += self.cfg.report_interval_s
                if next_report < now:
                    next_report = now + self.cfg.report_interval_s
            _, consumer = self._clients()
            wait = max(0.0, min(next_send, next_report) - time.monotonic())
            if not self._assigned:
                stop.wait(min(wait, 0.5))
                continue
            # poll() returns at the first record (consume() would wait out its timeout to fill a
            # batch, and the end-to-end times with it); the rest of what is there comes at once
            first = consumer.poll(min(wait, 0.2))
            if first is not None:
                for m in [first] + consumer.consume(num_messages=1000, timeout=0):
                    p = m.partition()
                    if m.error() is None and p is not None:
                        self.stats.on_record(p, m.value())
        self.report()  # what the last interval saw

    def _serve_deliveries(self, stop: threading.Event) -> None:
        """Delivery reports as they come (librdkafka's latency of a write counts until its report
        is served: served from the main loop, it measured the loop's waits, ~100 ms)."""
        while not stop.is_set() and self._producer is not None:
            self._producer.poll(0.05)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(2.0)
            self._producer = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
