"""The probe: watches one cluster and reports what it sees as contract events.

Metadata follows the Java client's rules (``monitor.metadata.MetadataCache``): a refresh runs at
start (bootstrap), every ``metadata_max_age_s`` (periodic, default: every interval), and as soon
as the refresh backoff allows after something invalidated the metadata — a failed connection,
a timed-out request, a partition without a leader, an error such as NOT_LEADER_OR_FOLLOWER in
any response the probe gets, a topic it has not seen (new_topic).  Each attempt is one
``metadata_refresh`` event with its reason and cause.  After a successful one, a watched
partition gets a ``partition_metadata`` when its leader, leader epoch, replicas, ISR, offline
replicas, min.insync.replicas or error differ from what the probe last sent for it, and at least
every ``metadata_snapshot_s`` even when nothing changed (a job started on an empty checkpoint,
or one that missed an event, has the whole view within that time).  The first snapshots are
spread over that period, so a large cluster's partitions do not all come due in one refresh.
Sending changes only is what keeps the job's work following change: at 100,000 partitions a
full view every 10 s is 100,000 events that say nothing new.  Each ``partition_offsets``
carries ``metadata_at``, the time of the refresh that last confirmed the partition's view, so
the job knows the view it holds is current without receiving it again.

Every ``interval_s``, one observation:
1. the committed offsets of every matching consumer group (and a ``group_state`` per group);
3. the watermarks of every watched partition (``partition_offsets``), read *after* the commits
   so that, for one observation, HW >= committed (a lag computed from them is never negative
   because of the order of reads);
4. one ``group_offsets`` per group and partition with the committed offset and that HW;
5. a ``heartbeat``.

Watermarks come from one of two places (``offsets_via``):
- ``list_offsets`` (default): ListOffsets earliest/latest through the admin client — cheap,
  right on Apache Kafka;
- ``fetch``: a tail consumer assigned to every watched partition keeps fetching and the HW is
  taken from the fetch responses (``get_watermark_offsets(cached=True)``).  It reads every new
  record once, so it costs the topic's throughput, but it is right on brokers whose ListOffsets
  is not — Tansu answers "latest" with the base offset of the last record batch + 1, so a
  partition whose last batch holds several records looks shorter than it is.  The embedded
  default uses ``fetch`` for that reason.

What a cycle costs (``bench/probe_bench.py``, ``bench/README.md``): at 100,000 partitions about
4 s of work and 0.045 CPU-s per 1,000 partitions per interval, where it took minutes before.
What it takes: two admin clients — one for the metadata refresh, holding a handle per watched
topic for their leader epochs in its statistics, and one for everything else, whose broker
threads do not walk 100,000 partition objects each time they wake; ListOffsets in requests of
``LIST_OFFSETS_BATCH`` partitions with one future each (librdkafka merges a request's answers
in quadratic time); a cluster view that takes over what did not change from the previous one,
so that "changed since sent" is an identity test; one statistics document read per refresh,
by a text scan, every ``stats_interval()`` (5 s by default: each document costs ~2 us per
partition to write), with periodic refreshes timed to land just before one; events serialized
in bulk (``EventEmitter.emit_rows``); no cyclic garbage collection during a cycle.

Sharing a cluster (``share = "i/n"``, ``monitor.probe_config``): n probes split one cluster
by a stable hash of topic and group names, each reporting its share.

A broker that does not answer (paused, overloaded) must not blind the probe to the others: an
observation sends the committed-offset and group requests (through the coordinator child) and
the ListOffsets (one request per leader) at once and waits for them until one deadline,
``observe_wait_s()`` (half the interval, at least 2 s, at most the request timeout); the group
listing, which every broker answers, gets a third of it, and a late or incomplete one keeps the
groups listed before.  What is late is missing from that cycle, its brokers are named in the
heartbeat (``unanswered_brokers``), and a broker or group with a request still out is not sent
another until it ends, so a silent broker never holds more than one cycle's requests.  A metadata
refresh waits for its leader epochs at most ``EPOCH_WAIT_SHARE`` of the interval.

The probe says when a watched topic, group or group's committed offset is gone (``monitor.gone``).

The probe says when it falls behind: each heartbeat carries ``cycle_duration_ms`` (the
refreshes since the previous observation, and this observation) and ``observation_lag_ms``
(how late the observation started after its schedule), and a cycle longer than ``interval_s``
is logged at WARNING (then at most every 5 minutes while it lasts).
"""

from __future__ import annotations

import collections
import concurrent.futures
import gc
import logging
import math
import threading
import time
import zlib
from typing import Any, Callable, Optional, Sequence

from confluent_kafka import (OFFSET_END, Consumer, IsolationLevel, KafkaError, KafkaException,
                             TopicPartition)
from confluent_kafka.admin import (AdminClient, ListOffsetsResultInfo, OffsetSpec)

import confluent_kafka.admin as _ck_admin
from monitor.contract import (
    Broker, BrokerState, GroupOffsets, Heartbeat, MetadataRefresh,
    PartitionCountChange, PartitionMetadata, PartitionOffsets, kafka_offset,
)
from monitor.canary import Canary, CanaryConfig, WritesHeld
from monitor.emitter import EventEmitter
from monitor.gcpause import gc_paused
from monitor.gone import GoneTracker
from monitor.leader_epochs import LeaderEpochs
from monitor.topic_configs import TopicConfigs
from monitor.coordinator import CoordinatorClient, timed_out
from monitor.probe_config import ProbeConfig, ProbeScope
from monitor.access import FatalClientError, fatal_reason, missing_acl
from monitor.cluster_view import ClusterView
from monitor.metadata import MetadataCache, Reason, cause_for_error

log = logging.getLogger(__name__)

#: the C implementation under AdminClient.list_offsets: one future per request, not per
#: partition (present in every confluent-kafka with list_offsets)
_AdminClientImpl: Any = getattr(_ck_admin, "_AdminClientImpl", None)

#: partitions per ListOffsets request (see Probe._send_list_offsets)
LIST_OFFSETS_BATCH = 500
#: a group missing from incomplete group listings is still observed for this long, s
GROUPS_KEPT_S = 600.0
#: cycles between two full garbage collections, and the watched partitions from which the probe
#: freezes what survives a cycle (see Probe._gc_settle)
GC_FULL_EVERY = 60
GC_FREEZE_FROM = 10_000


def _quiet(err: Any) -> None:
    """error_cb of the short-lived retry client: what it meets is the probe's other clients' news."""


class Probe:
    #: set by an error retrying cannot fix (credentials refused, fatal producer): run() stops with it
    fatal_error: Optional[str] = None

    def __init__(self, cfg: ProbeConfig, *, emitter: Optional[EventEmitter] = None, admin: Optional[Any] = None,
                 clock: Callable[[], float] = time.time):
        """``emitter`` and ``admin`` (the slice of AdminClient the probe calls) can be injected;
        by default they are built from the configuration."""
        self.cfg = cfg.validate()
        self._clock = clock
        #: leader epochs, from the statistics of the metadata client (its stats_cb)
        self._epochs = LeaderEpochs(cfg, self._warn_once)
        admin_conf: dict[str, Any] = {
            **cfg.client_conf(), "socket.timeout.ms": int(cfg.request_timeout_s * 1000),
            "error_cb": self._on_client_error,
            # leader epochs are only in the client's statistics (not in list_topics' objects)
            "statistics.interval.ms": int(cfg.stats_interval() * 1000), "stats_cb": self._epochs.on_stats}
        self._admin = admin if admin is not None else AdminClient(admin_conf)
        # The admin client above holds a handle for every watched topic (for their leader epochs in
        # its statistics), and with them a partition object each that its broker threads walk
        # every time they wake up: at 100,000 partitions, ListOffsets through it cost three times
        # what they cost through a client without them.  So everything but the metadata refresh
        # (offsets, groups, configurations) goes through this second one.
        ops_conf: dict[str, Any] = {**cfg.client_conf(), "socket.timeout.ms": int(cfg.request_timeout_s * 1000),
                                    "error_cb": self._on_client_error}
        self._ops = admin if admin is not None else AdminClient(ops_conf)
        # DescribeConfigs go through a third: the brokers' default is asked of one broker at every
        # refresh, and librdkafka sends a client's next broker-less request (a metadata sync of the
        # offsets client) to the broker it used last, so through _ops a paused broker 1 held those
        # for their whole timeout
        self.topic_configs = TopicConfigs(admin if admin is not None else AdminClient(ops_conf), cfg, self._warn_once)
        #: a metadata request that timed out is sent again through a new client (_list_topics)
        self._retry_conf: Optional[dict[str, Any]] = None if admin is not None else {
            **cfg.client_conf(), "socket.timeout.ms": int(cfg.request_timeout_s * 1000), "error_cb": _quiet}
        # committed offsets and group descriptions from a child process: librdkafka 2.16 can
        # crash the process asking a coordinator that goes away
        self._coordinator = CoordinatorClient(ops_conf, cfg.request_timeout_s, admin=admin)
        #: a refresh's request time (a moving average)
        self._list_s: Optional[float] = None
        #: when run()'s next observation is due, monotonic s (None outside run())
        self._next_observation: Optional[float] = None
        self._ops_brokers: frozenset = frozenset()  # the brokers the last good refresh listed
        self._emitter = emitter or EventEmitter({**cfg.client_conf(), **cfg.events_kafka},
                                                cfg.events_topic, cluster=cfg.cluster or "unknown",
                                                source=cfg.source, clock=clock)
        self._tail: Optional[Consumer] = None
        self._tail_assigned: set[tuple[str, int]] = set()
        self.metadata = MetadataCache(
            metadata_max_age_ms=int((cfg.metadata_max_age_s or cfg.interval_s) * 1000),
            refresh_backoff_ms=int(cfg.refresh_backoff_s * 1000), clock=self._now_ms)
        self._watched_partitions: list[tuple[str, int]] = []
        #: the broker_state counts, and the view they were counted from (_emit_broker_states)
        self._broker_sig: Optional[tuple] = None
        self._broker_counts: tuple = ({}, {}, {})
        #: each watched partition's leader (the ListOffsets requests go to one broker each)
        self._watched_leaders: list[int] = []
        #: when the last successful refresh (the one _watched_partitions come from) ran, epoch ms
        self._watched_at: Optional[int] = None
        #: (topic, partition) -> (what was last sent, when it is due again)
        self._md_sent: dict[tuple[str, int], tuple[tuple, int]] = {}
        self._started_at = self._now_ms()
        #: what it watches: its patterns and its share of the cluster
        self._scope = ProbeScope(cfg)
        #: ListOffsets requests for _watched_partitions, built again only when those change
        self._lo_for: Optional[list[tuple[str, int]]] = None
        self._lo_requests: tuple[list, list, list] = ([], [], [])
        self._lo_owners: list[int] = []
        #: leader -> its ListOffsets requests the probe stopped waiting for (_collect_list_offsets)
        self._lo_out: dict[int, list[concurrent.futures.Future]] = {}
        #: the group listing, while it is out (_listed_groups); the watched groups it named, and when
        self._listing: Optional[concurrent.futures.Future] = None
        self._groups_seen: dict[str, float] = {}
        #: group -> its coordinator as last described; the brokers this observation found silent
        self._group_coordinators: dict[str, int] = {}
        self._unanswered: set[int] = set()
        #: what was seen, for saying when it is gone
        self._gone = GoneTracker(self._emit_rows, self._now_ms, self._scope.owns, self.metadata.request_update)
        self._lo_leaders: list[int] = []
        self.cycles = 0
        self.refresh_retries = 0  # metadata requests sent again through a new client
        self.refresh_failures = 0  # metadata requests that failed, retried or not
        self.warnings: dict[str, int] = {}
        #: time spent in metadata refreshes since the last observation, s
        self._refresh_busy_s = 0.0
        #: when the observation about to run was due (run()'s schedule), monotonic s
        self._scheduled_at: Optional[float] = None
        #: the last cycle's duration and its observation's lag behind schedule, seconds
        self.last_cycle_s: Optional[float] = None
        self.last_lag_s: Optional[float] = None
        #: cycles that took longer than interval_s, since start
        self.overruns = 0
        self._gc_cycles = 0
        self._overrunning_since: Optional[float] = None
        self._overrun_logged_at = float("-inf")
        #: the canary (cfg.canary), on its own thread while run() runs; it sends its reports
        #: through this probe's emitter itself (_canary_emit)
        self.canary: Optional[Canary] = None
        self._canary_thread: Optional[threading.Thread] = None
        self._canary_stop = threading.Event()
        #: the broker the canary's writes wait for: (broker, since epoch ms, partitions), or None
        self._writes_held: Optional[tuple[int, int, int]] = None
        #: broker_state events come from this thread (refreshes) and the canary's (its verdicts)
        self._broker_lock = threading.Lock()
        if cfg.canary:
            self.canary = Canary(
                CanaryConfig(topic=cfg.canary_topic, interval_s=cfg.canary_interval_s, report_interval_s=cfg.interval_s,
                             replication_factor=cfg.canary_replication_factor),
                cfg.client_conf(), emit=self._canary_emit)

    @property
    def emitter(self) -> EventEmitter:
        return self._emitter

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- one cycle -------------------------------------------------------------------------

    def cycle(self) -> None:
        """One full cycle: a metadata refresh, then one observation.  ``run()`` schedules the
        two separately (a refresh also runs as soon as the metadata is invalidated)."""
        self._scheduled_at = None
        self.refresh_metadata()
        self.observe()

    def observe(self) -> None:
        """Committed offsets, then watermarks (so HW >= committed within one observation), then
        the events; and a heartbeat with how long the cycle took (this observation and the
        refreshes since the previous one) and how late it started after its schedule."""
        started = time.monotonic()
        scheduled, self._scheduled_at = self._scheduled_at, None
        lag = max(0.0, started - scheduled) if scheduled is not None else None
        with gc_paused():
            self._observe()
        # the cycle's work: the refreshes since the previous observation, and this observation
        duration, self._refresh_busy_s = time.monotonic() - started + self._refresh_busy_s, 0.0
        self._emitter.emit(Heartbeat(interval_ms=int(self.cfg.interval_s * 1000),
                                     events_sent=self._emitter.sent, events_dropped=self._emitter.dropped,
                                     watching=[f"topics~{self.cfg.topics_include}", f"groups~{self.cfg.groups_include}"],
                                     share=self._scope.share_text(), started_at=self._started_at,
                                     cycle_duration_ms=int(duration * 1000),
                                     observation_lag_ms=int(lag * 1000) if lag is not None else None,
                                     unanswered_brokers=sorted(self._unanswered)))
        self._emitter.poll(0)
        self.cycles += 1
        self.last_cycle_s, self.last_lag_s = duration, lag
        self._check_overrun(duration, lag)
        self._gc_settle()

    def _gc_settle(self) -> None:
        """After a cycle, move what survived it (the cluster view, what was last sent, the
        epochs) out of the collector's way (``gc.freeze``): otherwise each full collection walks
        those million-odd objects again (~0.4 CPU-s a cycle at 100,000 partitions).  They are
        acyclic and freed by reference counting when replaced; every ``GC_FULL_EVERY`` cycles
        everything is unfrozen and collected, so that cyclic garbage from elsewhere in the
        process is still reclaimed.  Only where it pays: from ``GC_FREEZE_FROM`` watched
        partitions on."""
        if not gc.isenabled() or len(self._watched_partitions) < GC_FREEZE_FROM:
            return
        self._gc_cycles += 1
        if self._gc_cycles % GC_FULL_EVERY == 0:
            gc.unfreeze()
            gc.collect()
        gc.freeze()

    def observe_wait_s(self) -> float:
        """How long an observation waits for its answers: the group listing first, then the
        committed offsets, the group descriptions and the ListOffsets together.  Half the
        interval (at least 2 s, at most the request timeout), so that a broker that does not
        answer (paused, overloaded) costs a cycle that much and no more: what it did not answer
        is missing from this cycle (``Heartbeat.unanswered_brokers``) and asked again in the next
        one, once its earlier request has ended."""
        return min(self.cfg.request_timeout_s, max(2.0, 0.5 * self.cfg.interval_s))

    def _observe(self) -> None:
        self._unanswered = set()
        if self.metadata.cluster is None:
            return
        deadline = time.monotonic() + self.observe_wait_s()
        partitions = self._watched_partitions
        # the listing gets a third of the wait: the groups listed before stand in for a late one
        groups = self._listed_groups(time.monotonic() + self.observe_wait_s() / 3)
        # committed offsets asked before the watermarks (so HW >= committed, mostly), all waited
        # for at once
        self._coordinator.send({"committed": dict.fromkeys(groups), "described": [g for g in groups if self._scope.owns(g)]},
                               max(0.5, deadline - time.monotonic()))
        sent = self._send_list_offsets(partitions) if self.cfg.offsets_via == "list_offsets" else None
        answers = self._coordinator.collect()
        committed = self._committed_offsets(answers["committed"])
        self._group_states(answers["described"])
        offsets, offsets_at = self._watermarks(partitions, sent, deadline)
        via, metadata_at = self.cfg.offsets_via, self._watched_at
        self._emit_rows(PartitionOffsets, [(topic, part, hi, via, lo, lso, metadata_at)
                                           for (topic, part), (lo, hi, lso) in offsets.items()], offsets_at)
        rows = []
        get = offsets.get
        for group, tps in committed.items():
            for (topic, part), off in tps.items():
                hw = get((topic, part))
                rows.append((group, topic, part, off, hw[1], offsets_at, None, None, None, hw[2]) if hw is not None
                            else (group, topic, part, off, None, None, None, None, None, None))
        self._emit_rows(GroupOffsets, rows, offsets_at)

    def _check_overrun(self, duration: float, lag: Optional[float]) -> None:
        """A cycle whose work takes longer than the interval means observations fall behind their
        schedule: say so at WARNING when it starts, then at most every 5 minutes while it lasts,
        and at INFO when cycles fit again."""
        interval = self.cfg.interval_s
        now = time.monotonic()
        if duration > interval:
            self.overruns += 1
            if self._overrunning_since is None:
                self._overrunning_since = now
            if now - self._overrun_logged_at >= 300:
                self._overrun_logged_at = now
                log.warning("probe cycle took %.1fs, longer than the interval (%.1fs; observation %.1fs behind "
                            "schedule): observations fall behind (%d overrun(s) since start) — watch fewer "
                            "topics or groups, or raise interval_s", duration, interval, lag or 0.0, self.overruns)
        elif self._overrunning_since is not None:
            log.info("probe cycles fit in the interval again (%.1fs of %.1fs) after overrunning for %.0fs",
                     duration, interval, now - self._overrunning_since)
            self._overrunning_since = None
            self._overrun_logged_at = float("-inf")

    def _emit_rows(self, cls: type, rows: Sequence[tuple], observed_at: int) -> list[int]:
        """Rows of one payload type through the emitter's bulk path (an injected emitter without
        one gets them one by one); returns the indexes of the rows not enqueued."""
        if not rows:
            return []
        bulk = getattr(self._emitter, "emit_rows", None)
        if bulk is not None:
            return bulk(cls, rows, observed_at)
        return [i for i, row in enumerate(rows) if self._emitter.emit(cls(*row), observed_at=observed_at) is None]

    def invalidate(self, error: Any, where: str) -> Optional[str]:
        """Kafka's rule: any error that suggests the metadata may be wrong marks it stale
        (``requestUpdate()``); the next refresh then runs as soon as the backoff allows, with
        reason ``invalidated`` and this cause."""
        cause = cause_for_error(error)
        if cause is not None:
            self.metadata.request_update(cause)
            log.info("metadata invalidated by %s (%s): %s", where, cause, error)
        return cause

    def _on_client_error(self, err: KafkaError) -> None:
        """error_cb of the probe's clients (served from their poll)."""
        if self._fatal(err):
            return
        if self.invalidate(err, "client error") is None:
            self._warn_once(f"client:{err.name()}", "client error: %s", err)

    def _fatal(self, e: Any) -> bool:
        """An error retrying cannot fix (monitor.access.fatal_reason): logged once; run() stops."""
        reason = fatal_reason(e, self.cfg.events_topic)
        if reason is not None and self.fatal_error is None:
            self.fatal_error = reason
            log.error("%s", reason)
        return reason is not None

    def refresh_metadata(self) -> bool:
        """One metadata refresh attempt, reported as a ``metadata_refresh`` event (and a
        ``partition_metadata`` per watched partition that changed or whose snapshot is due, when
        it succeeded)."""
        started = time.monotonic()
        try:
            with gc_paused():
                return self._refresh_metadata()
        finally:
            self._refresh_busy_s += time.monotonic() - started

    def refresh_wait_s(self) -> float:
        """How long a metadata request waits before it is sent again: a quarter of the interval,
        at least 2 s and three times the usual answer's time, at most the request timeout."""
        usual = 3 * self._list_s if self._list_s is not None else 0.0
        return min(self.cfg.request_timeout_s, max(2.0, 0.25 * self.cfg.interval_s, usual))

    def _list_topics(self) -> Any:
        """The cluster's metadata.  librdkafka sends the request to the usable broker it last
        sent to, which is often a paused one, and a second try through the same client (or the
        offsets client) went there again.  So the first attempt waits ``refresh_wait_s()``, and a
        timed-out one is sent again, for the rest of the request timeout, through a new client:
        its connection to a paused broker never gets past ApiVersion, so it asks another."""
        first = self.refresh_wait_s() if self._retry_conf is not None else self.cfg.request_timeout_s
        try:
            return self._admin.list_topics(timeout=first)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if self._retry_conf is None or not isinstance(err, KafkaError) or err.code() != KafkaError._TIMED_OUT:
                raise
        self.refresh_retries += 1
        client = AdminClient(self._retry_conf)
        try:
            return client.list_topics(timeout=max(first, self.cfg.request_timeout_s - first))
        finally:
            del client  # nothing of it is in flight once list_topics returned

    def _refresh_metadata(self) -> bool:
        reason, cause = self.metadata.next_reason()
        t0, sent_at = time.monotonic(), self._now_ms()
        try:
            md = self._list_topics()
        except KafkaException as e:  # transport failure, timeout
            err = e.args[0] if e.args else e
            self.refresh_failures += 1
            self.metadata.failed_update(error=str(err))
            self.invalidate(err, "metadata request")
            self._emitter.emit(MetadataRefresh(version=self.metadata.version, reason=reason, cause=cause, ok=False,
                                               duration_ms=(time.monotonic() - t0) * 1000, error=str(err),
                                               metadata_max_age_ms=self.metadata.metadata_max_age_ms))
            self._warn_once("metadata", "metadata refresh failed: %s", err)
            return False
        duration_ms = (time.monotonic() - t0) * 1000
        self._list_s = duration_ms / 1000 if self._list_s is None else 0.7 * self._list_s + 0.3 * duration_ms / 1000
        watched_now = [n for n, t in md.topics.items() if self._scope.watched(n) and t.error is None]
        epochs = self._epochs.leader_epochs(self._admin, watched_now, {(n, p.id): p.leader for n in watched_now
                                                                        for p in md.topics[n].partitions.values()})
        previous_ok = self.metadata.last_successful_refresh_ms
        change = self.metadata.update(ClusterView.from_confluent(md, leader_epochs=epochs,
                                                                 previous=self.metadata.cluster), sent_at=sent_at)
        now = change.at_ms
        view = self.metadata.cluster
        if not change.ok or view is None:
            self._emitter.emit(MetadataRefresh(version=change.version, reason=reason, cause=cause, ok=False,
                                               duration_ms=duration_ms, error=change.error), observed_at=now)
            return False
        if self.cfg.cluster is None and view.cluster_id:
            self._emitter.cluster = view.cluster_id
        brokers = frozenset(b.node_id for b in view.brokers)
        if self._ops is not self._admin and (change.leader_changes or brokers != self._ops_brokers):
            # a broker that left the cluster: the offsets client forgets it only from its own
            # metadata; until then librdkafka 2.16 retries connecting to it without a pause
            # (~15,000 attempts a second, a core's worth of CPU, seen on the real cluster)
            self._sync_ops_metadata()
        self._ops_brokers = brokers
        n_parts = sum(t.partition_count for t in view.topics.values())
        self._emitter.emit(MetadataRefresh(
            version=change.version, reason=reason, cause=cause, ok=True, duration_ms=duration_ms,
            node_id=md.orig_broker_id if md.orig_broker_id >= 0 else None,
            controller_id=view.controller_id,
            brokers=[Broker(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack) for b in view.brokers],
            topic_count=len(view.topics), partition_count=n_parts,
            partition_count_changes=[
                PartitionCountChange(topic=t, old_count=old, new_count=new,
                                     unseen_for_at_most_ms=now - previous_ok if previous_ok else None)
                for t, (old, new) in sorted(change.partition_count_changes.items()) if self._scope.owns(t)],
            leaderless_partitions=len(change.no_leader),
            metadata_max_age_ms=self.metadata.metadata_max_age_ms), observed_at=now)
        if self._scope.share is None or self._scope.share[0] == 1:
            with self._broker_lock:
                self._emit_broker_states(view, change.version, now)
        topics = [n for n, t in view.topics.items() if self._scope.watched(n) and t.error is None]  # sorted by name
        if not topics:
            self._warn_once("no_topics", "no topic matching topics_include %r / topics_exclude %r in the metadata: "
                            "none exists, or the probe's user may not see them (Kafka leaves out the topics a user "
                            "lacks DESCRIBE on) -- permission missing?: DESCRIBE on Topic:<name>",
                            self.cfg.topics_include, self.cfg.topics_exclude)
        min_isr = self.topic_configs.min_isr(topics, min(brokers) if brokers else None)
        # A partition's view is the PartitionView itself (leader, epoch, replicas, ISR, offline
        # replicas, error) with the topic's min.insync.replicas; from_confluent hands back the
        # same object while nothing changed, so "unchanged" is mostly an identity test.
        watched: list[tuple[str, int]] = []
        leaders: list[int] = []
        md_sent, sent = self._md_sent, {}
        rows, pending = [], []
        version = change.version
        for name in topics:
            mi = min_isr.get(name)
            for pv in view.topics[name].partitions:  # sorted by partition
                tp = (name, pv.partition)
                watched.append(tp)
                leaders.append(pv.leader)
                shown = (pv, mi)
                last = md_sent.get(tp)
                if last is not None and now < last[1] and last[0] == shown:
                    sent[tp] = last
                    continue
                rows.append((name, pv.partition, pv.leader, list(pv.replicas), list(pv.isr), version,
                             pv.leader_epoch, list(pv.offline_replicas), mi, pv.error))
                pending.append((tp, shown, last is None))
        failed = set(self._emit_rows(PartitionMetadata, rows, now))
        for i, (tp, shown, first) in enumerate(pending):
            if i not in failed:  # not enqueued: tried again at the next refresh
                sent[tp] = (shown, now + self._snapshot_after_ms(tp, first=first))
        self._md_sent = sent  # partitions no longer watched are forgotten
        self._gone.note_topics(view, topics, now)
        if watched != self._watched_partitions:
            self._watched_partitions = watched
        if leaders != self._watched_leaders:
            self._watched_leaders = leaders
        self._watched_at = now
        self._epochs.refresh_done()
        return True

    def _emit_broker_states(self, view: ClusterView, version: int, now: int) -> None:
        """One ``broker_state`` per broker the response lists or a replica names: what it leads,
        holds, and holds out of the ISR, over every partition of the response.  Counted again
        only when a topic changed (unchanged topics are the same objects, ClusterView.from_confluent)."""
        sig = (tuple(map(id, view.topics.values())), view.brokers)
        if sig != self._broker_sig:
            leads: collections.Counter = collections.Counter()
            holds: collections.Counter = collections.Counter()
            behind: collections.Counter = collections.Counter()
            for t in view.topics.values():
                for pv in t.partitions:
                    leads[pv.leader] += 1
                    holds.update(pv.replicas)
                    if len(pv.isr) != len(pv.replicas):
                        behind.update(r for r in pv.replicas if r not in pv.isr)
            self._broker_counts = (leads, holds, behind)
            self._broker_sig = sig
        leads, holds, behind = self._broker_counts
        live = {b.node_id: b for b in view.brokers}
        held = self._writes_held
        rows = []
        for node in sorted(set(live) | set(holds)):
            b = live.get(node)
            since, waiting = (held[1], held[2]) if held is not None and held[0] == node else (None, None)
            rows.append((node, b is not None, version, leads.get(node, 0), holds.get(node, 0), behind.get(node, 0),
                         None if b is None else b.host, None if b is None else b.port, None if b is None else b.rack,
                         None, since, waiting))
        self._emit_rows(BrokerState, rows, now)

    def _refresh_start_in(self) -> float:
        """Seconds until the next metadata refresh should start (0: now).

        Kafka's rules say when one is due (``MetadataCache.time_to_next_update``), and a refresh
        for any reason but the periodic one (bootstrap, invalidated, new topic) starts then.  A
        periodic one starts a little early — never by more than one statistics period — at the
        moment that makes its response arrive just before one of the metadata client's
        statistics documents, and that document arrive before the next observation is due: it
        then waits a fraction of a second for the leader epochs instead of half a statistics
        interval on average (which lets that interval be long: its documents are what cost), and
        the observation stays on its schedule."""
        due = self.metadata.time_to_next_update() / 1000.0
        if due <= 0:
            return 0.0
        stats = self._epochs
        if (self._list_s is None or stats.ts <= 0 or stats.supported is False
                or self.metadata.next_reason()[0] != Reason.PERIODIC):
            return due
        period, lead = stats.period, 1.5 * self._list_s + 0.25
        if lead + stats.after_s >= period:
            return due
        now = time.monotonic()
        latest = now + due + lead  # the statistics it waits for: not after this ...
        if self._next_observation is not None and self._next_observation > now + due:
            latest = min(latest, self._next_observation - stats.after_s)  # ... nor after this
        tick = stats.ts + math.floor((latest - stats.ts) / period) * period
        backoff = (self.metadata.last_refresh_ms + self.metadata.refresh_backoff_ms - self._now_ms()) / 1000.0
        return max(0.0, tick - lead - now, backoff)

    def _sync_ops_metadata(self) -> None:
        """Leaders moved: bring the second client's metadata to what the probe just saw, so that
        its ListOffsets go to the new leaders (it would learn them only from a
        NOT_LEADER_OR_FOLLOWER answer, and the probe would see that error where the single
        client it had before did not)."""
        try:
            self._ops.list_topics(timeout=self.cfg.request_timeout_s)
        except KafkaException as e:
            self.invalidate(e.args[0] if e.args else e, "metadata request (offsets client)")
            self._warn_once("ops_metadata", "metadata refresh of the offsets client failed: %s", e)

    def _snapshot_after_ms(self, tp: tuple[str, int], first: bool) -> int:
        """How long after sending a partition's metadata it is sent again unchanged: the snapshot
        period, except after the first send, when it is spread over (0, period] by a hash of the
        partition, so that the snapshots of a large cluster are not all due in one refresh."""
        period = int(self.cfg.metadata_snapshot_s * 1000)
        if not first or period <= 0:
            return period
        return 1 + zlib.crc32(f"{tp[0]}/{tp[1]}".encode()) % period

    def _warn_once(self, kind: str, msg: str, *args: Any) -> None:
        """Log a recurring problem once at WARNING, then at DEBUG (it is counted, not repeated)."""
        n = self.warnings.get(kind, 0)
        self.warnings[kind] = n + 1
        log.log(logging.WARNING if n == 0 else logging.DEBUG, msg, *args)

    def _listed_groups(self, deadline: float) -> list[str]:
        """The consumer groups to observe: the watched ones the last group listing named.

        ListGroups goes to every broker, and each lists the groups it coordinates: one broker
        that does not answer holds the listing until its request timeout, and then leaves its
        groups out.  So the listing is waited for until ``deadline`` only, and is not sent again
        while one is out; a listing that is late or incomplete (an error from some broker) keeps
        the groups listed before (for ``GROUPS_KEPT_S``), and a complete one replaces them."""
        fut = self._listing
        if fut is None:
            try:
                fut = self._listing = self._ops.list_consumer_groups(request_timeout=self.cfg.request_timeout_s)
            except Exception as e:
                self._warn_once("list_groups", "listing consumer groups failed: %s", e)
        listing = None
        if fut is not None:
            try:
                listing = fut.result(timeout=max(0.0, deadline - time.monotonic()))
                self._listing = None
            except concurrent.futures.TimeoutError:
                self._warn_once("list_groups_late", "the consumer group listing was not answered within %.1fs (a "
                                "broker not answering): the groups listed before are observed meanwhile",
                                self.observe_wait_s())
            except Exception as e:
                self._listing = None
                log.warning("listing consumer groups failed: %s%s", e,
                            missing_acl(e, cluster=("DESCRIBE", "kafka-cluster")))
        now = time.monotonic()
        if listing is not None:
            valid = [g.group_id for g in listing.valid]
            wanted = self._scope.watched_groups(valid)
            errors = getattr(listing, "errors", None)
            if errors:
                self._warn_once("list_groups_partial", "the consumer group listing is incomplete (%s): the groups "
                                "listed before are kept for %.0fs", errors[0], GROUPS_KEPT_S)
            elif not wanted:
                self._warn_once("no_groups", "no consumer group matching groups_include %r / groups_exclude %r is "
                                "listed: none exists, or the probe's user may not see them (ListGroups leaves out "
                                "the groups a user lacks DESCRIBE on) -- permission missing?: DESCRIBE on "
                                "Group:<name>", self.cfg.groups_include, self.cfg.groups_exclude)
            if not errors:
                self._groups_seen = dict.fromkeys(wanted, now)
                for g in self._gone.note_groups(wanted):  # deleted
                    self._group_coordinators.pop(g, None)
                return sorted(wanted)
            self._groups_seen.update(dict.fromkeys(wanted, now))
        self._groups_seen = {g: t for g, t in self._groups_seen.items() if now - t <= GROUPS_KEPT_S}
        return sorted(self._groups_seen)

    def _committed_offsets(self, answers: dict[str, Any]) -> dict[str, dict[tuple[str, int], Optional[int]]]:
        """Each group's committed offsets on watched topics, from the coordinators' answers."""
        out: dict[str, dict[tuple[str, int], Optional[int]]] = {}
        for gid, res in answers.items():
            if isinstance(res, Exception):
                self._unanswered_group(gid, res)
                log.warning("committed offsets of group %s: %s%s", gid, res,
                            missing_acl(res, group=("DESCRIBE", gid), topic=("DESCRIBE", "<the group's topics>")))
                continue
            known = self.metadata.cluster.topics if self.metadata.cluster is not None else {}
            tps: dict[tuple[str, int], Optional[int]] = {}
            errored: list[tuple[str, int]] = []
            watched = self._scope.watched
            for topic, partition, off, error in res:
                if error is not None:
                    errored.append((topic, partition))
                    if self.invalidate(error, f"committed offsets of {gid}") is None:
                        self._warn_once(f"offsets:{gid}", "committed offsets of group %s on %s/%d: %s%s", gid, topic,
                                        partition, error, missing_acl(error, topic=("DESCRIBE", topic)))
                    continue
                if not watched(topic):
                    continue
                if topic not in known:
                    # a topic this client has not seen yet (created, or deleted under the group):
                    # Kafka's add(topic) forces a metadata update
                    self.metadata.add_topic(topic)
                tps[(topic, partition)] = off if off is not None and off >= 0 else None  # kafka_offset()
            self._gone.note_offsets(gid, tps, errored)
            if tps or self._scope.owns(gid):  # sharing: its offsets on this share's topics, or its state
                out[gid] = tps
        return out

    def _unanswered_group(self, gid: str, error: Exception) -> None:
        """A group request that timed out: its coordinator (as last described) did not answer."""
        if timed_out(error):
            node = self._group_coordinators.get(gid)
            if node is not None:
                self._unanswered.add(node)

    def _group_states(self, answers: dict[str, Any]) -> None:
        """One ``group_state`` per group from the coordinator's DescribeGroups answer.  The
        generation is not exposed by DescribeGroups (nor by the admin API), so it stays null."""
        at = self._now_ms()
        coordinators = self._group_coordinators
        for gid, d in answers.items():
            if isinstance(d, Exception):
                self._unanswered_group(gid, d)
                self._warn_once("describe_group", "describing group %s: %s%s", gid, d,
                                missing_acl(d, group=("DESCRIBE", gid)))
                continue
            if d.coordinator is not None:
                if len(coordinators) > 100_000:
                    coordinators.clear()
                coordinators[gid] = d.coordinator
            self._gone.seen_group(gid)  # its state sent: seen (if only partial listings named it)
            self._emitter.emit(d, observed_at=at)

    def _watermarks(self, partitions: list[tuple[str, int]], sent: Any = None, deadline: Optional[float] = None,
                    ) -> tuple[dict[tuple[str, int], tuple[Optional[int], int, Optional[int]]], int]:
        """(log start, high watermark, last stable offset) per partition that answered, and the
        observation's time.  ``sent``: the ListOffsets already sent (``_send_list_offsets``),
        waited for until ``deadline``."""
        if self.cfg.offsets_via == "fetch":
            return self._watermarks_from_fetch(partitions)
        if sent is None:
            sent = self._send_list_offsets(partitions)
        return self._watermarks_from_list_offsets(partitions, sent, deadline)

    def _watermarks_from_list_offsets(self, partitions, sent, deadline):
        out = {}
        if not partitions:
            return out, self._now_ms()
        try:
            at, latest, earliest, stable = self._collect_list_offsets(sent, deadline)
        except KafkaException as e:
            self.invalidate(e.args[0] if e.args else e, "list_offsets")
            self._warn_once("list_offsets", "list_offsets failed: %s", e)
            return out, self._now_ms()
        get_hi, get_lo, get_lso, ok = latest.get, earliest.get, stable.get, ListOffsetsResultInfo
        for tp, key in zip(self._lo_requests[0], partitions):
            hi, lo = get_hi(tp), get_lo(tp)
            if type(hi) is ok and type(lo) is ok:  # the common case, without the checks below
                h, lo, lso = hi.offset, lo.offset, get_lso(tp)
                if h is not None and h >= 0:
                    # LSO: the read_committed "latest"; an error or a broker without it leaves it unknown
                    lso = lso.offset if type(lso) is ok and lso.offset is not None and lso.offset >= 0 else None
                    out[key] = (lo if lo is not None and lo >= 0 else None, h, lso)  # kafka_offset(lo)
                continue
            if hi is None or lo is None:  # its broker did not answer in time (_collect_list_offsets)
                continue
            topic, part = key
            err = hi if not hasattr(hi, "offset") else lo if not hasattr(lo, "offset") else None
            if err is not None:
                if self.invalidate(err, f"offsets of {topic}/{part}") is None:
                    self._warn_once("list_offsets", "offsets of %s/%d: %s%s", topic, part, err,
                                    missing_acl(err, topic=("DESCRIBE", topic)))
                continue
            hi, lo = hi.offset, lo.offset
            if hi is not None and hi >= 0:
                out[(topic, part)] = (kafka_offset(lo), hi, None)
        return out, at

    def _send_list_offsets(self, partitions: list[tuple[str, int]]) -> Any:
        """ListOffsets latest, earliest and latest with read_committed isolation (the last stable
        offset: what a read_committed consumer can read up to) for ``partitions``, sent and not
        waited for (``_collect_list_offsets``).

        Two costs are avoided here.  AdminClient.list_offsets makes a future per partition and
        settles each from a Python callback (~25 us a partition); the probe hands its request
        lists to the C implementation under it, with one future per request, and builds those
        lists only when the watched partitions change.  And librdkafka merges the answers of a
        request's brokers by a linear search per partition (``rd_kafka_ListOffsets_response_merge``),
        so a request's cost grows with the square of its partitions (20,000 in one request:
        1.5 CPU-s; in requests of 500: 0.1): the probe sends requests of ``LIST_OFFSETS_BATCH``
        partitions, all at once, each to one leader (a request spanning brokers is answered when
        its slowest broker answers).  A leader whose requests of an earlier cycle are still out
        (it has not answered them, and librdkafka has not timed them out yet) is not sent more:
        its partitions go unobserved, so a silent broker never holds more than one cycle's
        requests.  An injected admin (tests) goes through its list_offsets."""
        leaders = self._watched_leaders if len(self._watched_leaders) == len(partitions) else [-1] * len(partitions)
        if self._lo_for is not partitions or self._lo_leaders is not leaders:
            latest, earliest = OffsetSpec.latest()._value, OffsetSpec.earliest()._value
            keys = [TopicPartition(t, p) for t, p in partitions]
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for tp, leader in zip(partitions, leaders):
                by_leader.setdefault(leader, []).append(tp)
            batches, owners = [], []
            for leader, tps in sorted(by_leader.items()):
                for i in range(0, len(tps), LIST_OFFSETS_BATCH):
                    batches.append(tps[i:i + LIST_OFFSETS_BATCH])
                    owners.append(leader)
            self._lo_requests = (keys, [[TopicPartition(t, p, latest) for t, p in b] for b in batches],
                                 [[TopicPartition(t, p, earliest) for t, p in b] for b in batches])
            self._lo_owners = owners
            self._lo_for, self._lo_leaders = partitions, leaders
        keys, latest_reqs, earliest_reqs = self._lo_requests
        timeout = self.cfg.request_timeout_s
        committed = IsolationLevel.READ_COMMITTED
        if _AdminClientImpl is not None and isinstance(self._ops, _AdminClientImpl):
            busy = {owner for owner, futures in self._lo_out.items() if any(not f.done() for f in futures)}
            sent = []
            kinds: tuple[tuple[Any, dict[str, Any]], ...] = ((latest_reqs, {}), (earliest_reqs, {}), (latest_reqs, {"isolation_level_value": committed.value}))
            for reqs, extra in kinds:
                futures: list[Optional[concurrent.futures.Future]] = []
                for req, owner in zip(reqs, self._lo_owners):
                    if owner in busy:
                        futures.append(None)
                        continue
                    f: concurrent.futures.Future = concurrent.futures.Future()
                    f.set_running_or_notify_cancel()
                    _AdminClientImpl.list_offsets(self._ops, req, f, request_timeout=timeout, **extra)
                    futures.append(f)
                sent.append(futures)
            return ("impl", self._now_ms(), kinds, sent, busy)
        futs = [self._ops.list_offsets({tp: spec for tp in keys}, request_timeout=timeout, **extra)
                for spec, extra in ((OffsetSpec.latest(), {}), (OffsetSpec.earliest(), {}),
                                    (OffsetSpec.latest(), {"isolation_level": committed}))]
        return ("api", self._now_ms(), futs)

    def _collect_list_offsets(self, sent: Any, deadline: Optional[float]) -> tuple[int, dict, dict, dict]:
        """The answers to ``_send_list_offsets``, waited for until ``deadline``, and when the
        requests were sent (the observation's time).  Each result: TopicPartition ->
        ListOffsetsResultInfo, or the error of that partition; a request that fails is an error
        for each of its partitions, as AdminClient.list_offsets reports it; the partitions of a
        request not answered in time are left out (their leader is in ``_unanswered``)."""
        if deadline is None:
            deadline = time.monotonic() + self.observe_wait_s()
        if sent[0] == "impl":
            _, at, kinds, requests, busy = sent
            results, late = [], set(busy)
            for (reqs, _), futures in zip(kinds, requests):
                merged: dict = {}
                for req, f, owner in zip(reqs, futures, self._lo_owners):
                    if f is None:
                        continue
                    try:
                        merged.update(f.result(timeout=max(0.0, deadline - time.monotonic())))
                    except concurrent.futures.TimeoutError:
                        late.add(owner)
                    except KafkaException as e:  # the request failed: each of its partitions did
                        err = e.args[0] if e.args else e
                        merged.update(dict.fromkeys(req, err))
                results.append(merged)
            # requests not waited for stay with their client until they end (close() waits for
            # them: librdkafka crashes the process when a client goes with requests in flight)
            out = self._lo_out
            for futures in requests:
                for f, owner in zip(futures, self._lo_owners):
                    if f is not None and not f.done():
                        out.setdefault(owner, []).append(f)
            self._lo_out = {o: kept for o, fs in out.items() if (kept := [f for f in fs if not f.done()])}
            late.discard(-1)
            if late:
                self._unanswered.update(late)
                self._warn_once(f"list_offsets_late_{sorted(late)}", "offsets from broker(s) %s not answered within "
                                "%.1fs: their partitions are not observed until they answer", sorted(late),
                                self.observe_wait_s())
            return at, results[0], results[1], results[2]
        _, at, futs = sent

        def settled(fmap: dict) -> dict:
            out = {}
            for tp, f in fmap.items():
                try:
                    out[tp] = f.result()
                except KafkaException as e:
                    out[tp] = e.args[0] if e.args else e
            return out
        return at, settled(futs[0]), settled(futs[1]), settled(futs[2])

    # -- fetch mode: a tail consumer ------------------------------------------------------------

    def _ensure_tail(self, partitions: list[tuple[str, int]]) -> Consumer:
        if self._tail is None:
            self._tail = Consumer({
                **self.cfg.client_conf(),
                "group.id": f"kafka-monitor-probe-{self.cfg.source}",  # never joins nor commits
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "fetch.wait.max.ms": 250,
                "error_cb": self._on_client_error,
            })
        new = [tp for tp in partitions if tp not in self._tail_assigned]
        if new:
            self._tail.incremental_assign([TopicPartition(t, p, OFFSET_END) for t, p in new])
            self._tail_assigned.update(new)
        gone = self._tail_assigned - set(partitions)
        if gone:
            self._tail.incremental_unassign([TopicPartition(t, p) for t, p in gone])
            self._tail_assigned -= gone
        return self._tail

    def _watermarks_from_fetch(self, partitions):
        tail = self._ensure_tail(partitions)
        self._drain_tail(0)
        at = self._now_ms()
        out = {}
        for t, p in partitions:
            lo, hi = tail.get_watermark_offsets(TopicPartition(t, p), cached=True)
            if hi is None or hi < 0:
                continue  # no fetch response yet for this partition
            # The LSO is not exposed with the cached watermarks (statistics carry it, but from an
            # older moment than the HW); null rather than a value from another observation.
            out[(t, p)] = (kafka_offset(lo), hi, None)
        return out, at

    def _drain_tail(self, timeout: float) -> None:
        """Consume (and discard) what the tail consumer fetched, for up to ``timeout`` seconds;
        its fetch queue must not fill up, or fetching — and so the HW — would stop."""
        if self._tail is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            for m in self._tail.consume(num_messages=10_000, timeout=max(0.0, min(0.5, remaining))):
                err = m.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    if self.invalidate(err, "tail consumer fetch") is None:
                        self._warn_once(f"tail:{err.name()}", "tail consumer: %s%s", err, missing_acl(
                            err, topic=("READ", m.topic() or "<watched topics>"),
                            group=("DESCRIBE", f"kafka-monitor-probe-{self.cfg.source}")))
            if remaining <= 0:
                return

    # -- loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Refresh metadata when the cache says so (periodic, bootstrap, invalidated, new topic)
        and observe offsets every ``interval_s``, until ``stop`` is set."""
        log.info("probe %s watching %s every %.1fs (offsets via %s%s), events -> %s",
                 self.cfg.source, self.cfg.bootstrap_servers, self.cfg.interval_s, self.cfg.offsets_via,
                 f"; share {self._scope.share_text()} of its topics and groups" if self._scope.share else "",
                 self.cfg.events_topic)
        if self.canary is not None and self._canary_thread is None:
            self._canary_thread = threading.Thread(target=self.canary.run, args=(self._canary_stop,),
                                                   name="canary", daemon=True)
            self._canary_thread.start()
        next_observation = 0.0
        while not stop.is_set() and self.fatal_error is None:
            try:
                started = time.monotonic()
                if self._refresh_start_in() <= 0:
                    self.refresh_metadata()
                now = time.monotonic()
                if now >= next_observation:
                    # when it was due (the first one: when the probe started), for its lag
                    self._scheduled_at = next_observation if next_observation else started
                    next_observation = self._next_observation = now + self.cfg.interval_s
                    self.observe()
            except Exception as e:
                if self._fatal(e):  # e.g. a fatal producer error, raised once from its poll()
                    break
                log.exception("probe cycle failed; retrying")
                next_observation = time.monotonic() + self.cfg.interval_s
            until_refresh = self._refresh_start_in()
            self._wait(max(0.05, min(until_refresh, next_observation - time.monotonic())), stop)
        if self.fatal_error is not None:
            raise FatalClientError(self.fatal_error)

    def _wait(self, seconds: float, stop: threading.Event) -> None:
        deadline = time.monotonic() + max(0.0, seconds)
        while not stop.is_set() and time.monotonic() < deadline and self.fatal_error is None:
            step = min(0.5, deadline - time.monotonic())
            if self._tail is not None:
                self._drain_tail(step)
            else:
                stop.wait(step)
            try:
                self._emitter.poll(0)
            except KafkaException as e:  # a fatal producer error is raised once, from poll()
                if not self._fatal(e):
                    raise
            if self._admin is not None:
                self._admin.poll(0)  # serves error_cb
            if self._ops is not None and self._ops is not self._admin:
                self._ops.poll(0)

    def _canary_emit(self, report: Any) -> None:
        """The canary's reports and verdicts, sent from its own thread as they come: this
        thread may be waiting for a paused broker for a whole request timeout or more, and
        the canary's news is then what matters (the emitter takes events from any thread)."""
        at = self._now_ms()
        try:
            if isinstance(report, WritesHeld):  # the broker the canary's writes wait for: in broker_state
                self._writes_held = report.held
                view = self.metadata.cluster
                if view is not None:
                    with self._broker_lock:
                        self._emit_broker_states(view, self.metadata.version, at)
                return
            self._emitter.emit(report, observed_at=at)
        except Exception as e:  # never into the canary's loop
            self._warn_once("canary_emit", "could not send a canary event: %s", e)

    def stop_canary(self, timeout: float = 10.0) -> None:
        """Stop the canary's thread (its last report is emitted by close())."""
        self._canary_stop.set()
        if self._canary_thread is not None:
            self._canary_thread.join(timeout)
            self._canary_thread = None

    def close(self, flush_timeout: float = 10.0) -> None:
        """Final flush of buffered events, then release every client."""
        self.stop_canary()
        left = self._emitter.close(flush_timeout)
        if left:
            log.warning("%d events were still undelivered at shutdown and are lost", left)
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        pending = [f for fs in self._lo_out.values() for f in fs] + self.topic_configs.pending()
        if self._listing is not None:
            pending.append(self._listing)
        if pending:  # each ends by its request timeout at the latest
            concurrent.futures.wait(pending, timeout=self.cfg.request_timeout_s + 1)
            self._lo_out, self._listing = {}, None
        self._coordinator.close()
        self.topic_configs.close()
        self._admin = self._ops = None
        if self._gc_cycles:  # what _gc_settle froze (the clients among it) can be collected again
            gc.unfreeze()
            self._gc_cycles = 0
