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
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from monitor.contract import (
    Broker, GroupMember, GroupOffsets, GroupState, Heartbeat, MetadataRefresh, PartitionCountChange,
    PartitionMetadata, PartitionOffsets, kafka_offset,
)
from monitor.emitter import EventEmitter
from monitor.metadata import ClusterView, MetadataCache, cause_for_error

log = logging.getLogger(__name__)

OFFSETS_VIA = ("list_offsets", "fetch")


#: ConsumerGroupState names as the brokers' protocol spells them
_GROUP_STATES = {"EMPTY": "Empty", "PREPARING_REBALANCING": "PreparingRebalance", "PREPARING_REBALANCE": "PreparingRebalance",
                 "COMPLETING_REBALANCING": "CompletingRebalance", "COMPLETING_REBALANCE": "CompletingRebalance",
                 "STABLE": "Stable", "DEAD": "Dead", "UNKNOWN": "Unknown"}


def group_state_name(state: Any) -> str:
    """confluent-kafka's ConsumerGroupState enum -> the name Kafka uses (Stable, Empty, ...)."""
    name = getattr(state, "name", str(state)).upper()
    return _GROUP_STATES.get(name, name.title())


def group_protocol(d: Any) -> str:
    """classic, consumer (KIP-848) or simple, from a ConsumerGroupDescription."""
    if d.is_simple_consumer_group:
        return "simple"
    return "consumer" if getattr(getattr(d, "type", None), "name", "") == "CONSUMER" else "classic"


def describe_group_state(d: Any) -> str:
    """The group's state as Kafka names it.  librdkafka has no names for the consumer protocol's
    Assigning and Reconciling and reports both as UNKNOWN; a consumer-protocol group reported so
    is Reconciling when a member's assignment differs from its target, else Assigning (the new
    target assignment is being computed)."""
    name = group_state_name(d.state)
    if name != "Unknown" or group_protocol(d) != "consumer":
        return name

    def parts(a: Any) -> set:
        return {(tp.topic, tp.partition) for tp in (a.topic_partitions if a else [])}

    reconciling = any(parts(m.assignment) != parts(getattr(m, "target_assignment", None))
                      for m in d.members if getattr(m, "target_assignment", None) is not None)
    return "Reconciling" if reconciling else "Assigning"


class ConfigError(ValueError):
    """A setting with a value that cannot work; the message names the setting."""


@dataclass
class ProbeConfig:
    bootstrap_servers: str
    events_topic: str = "kafka-monitor.events"
    #: cluster label; default: the cluster id the brokers report
    cluster: Optional[str] = None
    source: str = field(default_factory=lambda: f"probe-{socket.gethostname()}")
    interval_s: float = 10.0
    offsets_via: str = "list_offsets"
    topics_include: str = ".*"
    topics_exclude: str = "^__"
    groups_include: str = ".*"
    groups_exclude: str = "^kafka-monitor-"
    request_timeout_s: float = 10.0
    #: periodic metadata refresh (Kafka's metadata.max.age.ms); default: every interval_s
    metadata_max_age_s: Optional[float] = None
    #: minimum gap between metadata refresh attempts (Kafka's retry/refresh backoff)
    refresh_backoff_s: float = 1.0
    #: statistics interval of the probe's admin client, where leader epochs come from
    stats_interval_s: float = 1.0
    #: how often each topic's configuration (min.insync.replicas) is read again
    config_refresh_s: float = 300.0
    #: a partition's metadata is sent when it changes, and at least this often when it does not
    #: (0: after every refresh)
    metadata_snapshot_s: float = 60.0
    #: librdkafka properties passed to every client the probe creates (SASL/SSL, ...)
    kafka: dict[str, str] = field(default_factory=dict)
    #: librdkafka properties for the events producer only (e.g. another cluster's bootstrap)
    events_kafka: dict[str, str] = field(default_factory=dict)

    def validate(self) -> "ProbeConfig":
        if not self.bootstrap_servers:
            raise ConfigError("probe.bootstrap_servers: required (host:port[,host:port...])")
        if not self.events_topic:
            raise ConfigError("probe.events_topic: must not be empty")
        if not self.interval_s > 0:
            raise ConfigError(f"probe.interval_s: must be > 0, got {self.interval_s}")
        if self.metadata_max_age_s is not None and not self.metadata_max_age_s > 0:
            raise ConfigError(f"probe.metadata_max_age_s: must be > 0, got {self.metadata_max_age_s}")
        if not 0.05 <= self.stats_interval_s <= 60:
            raise ConfigError(f"probe.stats_interval_s: must be within 0.05..60, got {self.stats_interval_s}")
        if not self.metadata_snapshot_s >= 0:
            raise ConfigError(f"probe.metadata_snapshot_s: must be >= 0 (0 = send every partition after every "
                              f"refresh), got {self.metadata_snapshot_s}")
        if not self.refresh_backoff_s >= 0:
            raise ConfigError(f"probe.refresh_backoff_s: must be >= 0, got {self.refresh_backoff_s}")
        if self.offsets_via not in OFFSETS_VIA:
            raise ConfigError(f"probe.offsets_via: must be one of {', '.join(OFFSETS_VIA)}, got {self.offsets_via!r}")
        for name in ("topics_include", "topics_exclude", "groups_include", "groups_exclude"):
            try:
                re.compile(getattr(self, name))
            except re.error as e:
                raise ConfigError(f"probe.{name}: not a valid regular expression: {e}") from None
        return self

    def client_conf(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka}


class Probe:
    def __init__(self, cfg: ProbeConfig, *, emitter: Optional[EventEmitter] = None, admin: Optional[Any] = None,
                 clock: Callable[[], float] = time.time):
        """``emitter`` and ``admin`` (the slice of AdminClient the probe calls) can be injected;
        by default they are built from the configuration."""
        self.cfg = cfg.validate()
        self._clock = clock
        self._admin = admin if admin is not None else AdminClient({
            **cfg.client_conf(), "socket.timeout.ms": int(cfg.request_timeout_s * 1000),
            "error_cb": self._on_client_error,
            # leader epochs are only in the client's statistics (not in list_topics' objects)
            "statistics.interval.ms": int(cfg.stats_interval_s * 1000), "stats_cb": self._on_stats})
        self._epochs: dict[tuple[str, int], int] = {}
        self._stats_ts = 0.0              # librdkafka's monotonic clock of the last statistics, s
        self._epoch_support: Optional[bool] = None
        self._registered: set[str] = set()
        self._emitter = emitter or EventEmitter({**cfg.client_conf(), **cfg.events_kafka},
                                                cfg.events_topic, cluster=cfg.cluster or "unknown",
                                                source=cfg.source, clock=clock)
        self._tail: Optional[Consumer] = None
        self._tail_assigned: set[tuple[str, int]] = set()
        self.metadata = MetadataCache(
            metadata_max_age_ms=int((cfg.metadata_max_age_s or cfg.interval_s) * 1000),
            refresh_backoff_ms=int(cfg.refresh_backoff_s * 1000), clock=self._now_ms)
        self._watched_partitions: list[tuple[str, int]] = []
        #: when the last successful refresh (the one _watched_partitions come from) ran, epoch ms
        self._watched_at: Optional[int] = None
        #: (topic, partition) -> (what was last sent, when it is due again)
        self._md_sent: dict[tuple[str, int], tuple[tuple, int]] = {}
        self._min_isr: dict[str, Optional[int]] = {}
        self._min_isr_at: dict[str, float] = {}
        self._started_at = self._now_ms()
        self._topics_in = re.compile(cfg.topics_include)
        self._topics_out = re.compile(cfg.topics_exclude)
        self._groups_in = re.compile(cfg.groups_include)
        self._groups_out = re.compile(cfg.groups_exclude)
        self.cycles = 0
        self.warnings: dict[str, int] = {}

    @property
    def emitter(self) -> EventEmitter:
        return self._emitter

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- one cycle -------------------------------------------------------------------------

    def cycle(self) -> None:
        """One full cycle: a metadata refresh, then one observation.  ``run()`` schedules the
        two separately (a refresh also runs as soon as the metadata is invalidated)."""
        self.refresh_metadata()
        self.observe()

    def observe(self) -> None:
        """Committed offsets, then watermarks (so HW >= committed within one observation), then
        the events; and a heartbeat."""
        if self.metadata.cluster is not None:
            partitions = self._watched_partitions
            committed = self._committed_offsets()
            self._group_states(sorted(committed))
            offsets, offsets_at = self._watermarks(partitions)
            for (topic, part), (lo, hi, lso) in offsets.items():
                self._emitter.emit(PartitionOffsets(topic=topic, partition=part, high_watermark=hi,
                                                    log_start_offset=lo, last_stable_offset=lso,
                                                    via=self.cfg.offsets_via, metadata_at=self._watched_at),
                                   observed_at=offsets_at)
            for group, tps in committed.items():
                for (topic, part), off in tps.items():
                    hw = offsets.get((topic, part))
                    self._emitter.emit(GroupOffsets(group=group, topic=topic, partition=part,
                                                    committed_offset=off,
                                                    high_watermark=hw[1] if hw else None,
                                                    hw_observed_at=offsets_at if hw else None),
                                       observed_at=offsets_at)
        self._emitter.emit(Heartbeat(interval_ms=int(self.cfg.interval_s * 1000),
                                     events_sent=self._emitter.sent, events_dropped=self._emitter.dropped,
                                     watching=[f"topics~{self.cfg.topics_include}", f"groups~{self.cfg.groups_include}"],
                                     started_at=self._started_at))
        self._emitter.poll(0)
        self.cycles += 1

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
        if self.invalidate(err, "client error") is None:
            self._warn_once(f"client:{err.name()}", "client error: %s", err)

    def _watched(self, topic: str) -> bool:
        return bool(self._topics_in.search(topic)) and not self._topics_out.search(topic)

    def refresh_metadata(self) -> bool:
        """One metadata refresh attempt, reported as a ``metadata_refresh`` event (and one
        ``partition_metadata`` per watched partition when it succeeded)."""
        reason, cause = self.metadata.next_reason()
        t0 = time.monotonic()
        try:
            md = self._admin.list_topics(timeout=self.cfg.request_timeout_s)
        except KafkaException as e:  # transport failure, timeout
            err = e.args[0] if e.args else e
            self.metadata.failed_update(error=str(err))
            self.invalidate(err, "metadata request")
            self._emitter.emit(MetadataRefresh(version=self.metadata.version, reason=reason, cause=cause, ok=False,
                                               duration_ms=(time.monotonic() - t0) * 1000, error=str(err),
                                               metadata_max_age_ms=self.metadata.metadata_max_age_ms))
            self._warn_once("metadata", "metadata refresh failed: %s", err)
            return False
        duration_ms = (time.monotonic() - t0) * 1000
        watched_now = [n for n, t in md.topics.items() if self._watched(n) and t.error is None]
        epochs = self._leader_epochs(watched_now, {(n, int(p.id)): int(p.leader) for n in watched_now
                                                   for p in md.topics[n].partitions.values() if p.leader >= 0})
        previous_ok = self.metadata.last_successful_refresh_ms
        change = self.metadata.update(ClusterView.from_confluent(md, leader_epochs=epochs))
        now = change.at_ms
        view = self.metadata.cluster
        if not change.ok:
            self._emitter.emit(MetadataRefresh(version=change.version, reason=reason, cause=cause, ok=False,
                                               duration_ms=duration_ms, error=change.error), observed_at=now)
            return False
        if self.cfg.cluster is None and view.cluster_id:
            self._emitter.cluster = view.cluster_id
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
                for t, (old, new) in sorted(change.partition_count_changes.items())],
            leaderless_partitions=len(change.no_leader),
            metadata_max_age_ms=self.metadata.metadata_max_age_ms), observed_at=now)
        topics = [n for n, t in view.topics.items() if self._watched(n) and t.error is None]
        min_isr = self._topic_min_isr(topics)
        watched = []
        sent: dict[tuple[str, int], tuple[tuple, int]] = {}
        for name in sorted(topics):
            for pv in sorted(view.topics[name].partitions, key=lambda p: p.partition):
                tp = (name, pv.partition)
                watched.append(tp)
                shown = (pv.leader, pv.leader_epoch, tuple(pv.replicas), tuple(pv.isr), tuple(pv.offline_replicas),
                         min_isr.get(name), pv.error)
                last = self._md_sent.get(tp)
                if last is not None and last[0] == shown and now < last[1]:
                    sent[tp] = last
                    continue
                ev = self._emitter.emit(PartitionMetadata(
                    topic=name, partition=pv.partition, leader=pv.leader, leader_epoch=pv.leader_epoch,
                    replicas=list(pv.replicas), isr=list(pv.isr), offline_replicas=list(pv.offline_replicas),
                    metadata_version=change.version, min_insync_replicas=min_isr.get(name), error=pv.error),
                    observed_at=now)
                if ev is not None:  # not enqueued: tried again at the next refresh
                    sent[tp] = (shown, now + self._snapshot_after_ms(tp, first=last is None))
        self._md_sent = sent  # partitions no longer watched are forgotten
        self._watched_partitions = watched
        self._watched_at = now
        return True

    def _snapshot_after_ms(self, tp: tuple[str, int], first: bool) -> int:
        """How long after sending a partition's metadata it is sent again unchanged: the snapshot
        period, except after the first send, when it is spread over (0, period] by a hash of the
        partition, so that the snapshots of a large cluster are not all due in one refresh."""
        period = int(self.cfg.metadata_snapshot_s * 1000)
        if not first or period <= 0:
            return period
        return 1 + zlib.crc32(f"{tp[0]}/{tp[1]}".encode()) % period

    def _on_stats(self, raw: str) -> None:
        """stats_cb of the admin client: keep each partition's leader epoch."""
        try:
            stats = json.loads(raw)
            for tname, t in stats.get("topics", {}).items():
                for pid, p in t.get("partitions", {}).items():
                    epoch = p.get("leader_epoch")
                    if int(pid) >= 0 and isinstance(epoch, int) and epoch >= 0:
                        self._epochs[(tname, int(pid))] = (p.get("leader"), epoch)
            self._stats_ts = stats.get("ts", 0) / 1e6
        except (ValueError, AttributeError, TypeError) as e:
            self._warn_once("stats", "unreadable client statistics: %s", e)

    def _leader_epochs(self, topics: list[str],
                       leaders: Optional[dict[tuple[str, int], int]] = None) -> dict[tuple[str, int], int]:
        """Leader epochs as of the metadata response just received.

        librdkafka reports a partition's leader epoch only in its statistics, only for topics
        the client holds a handle for (``list_topics(topic)`` creates one), and only in
        statistics produced after the metadata response.  So: register new topics once, then
        wait (at most 2.5 statistics intervals) for statistics stamped after now — librdkafka's
        ``ts`` and ``time.monotonic()`` both read CLOCK_MONOTONIC.  A broker whose statistics
        carry no epochs at all (seen once) is not waited for again; epochs then stay null.

        On a real cluster the statistics can still describe the partition as it was before the
        response (seen: a leader moved 2 -> 3, the first statistics after the response still said
        leader 2, epoch 0).  An epoch counts only where the statistics name the response's leader
        (``leaders``); the probe waits a little longer for those, then reports the rest as
        unknown (None) rather than the previous leader's epoch."""
        if self._epoch_support is False:
            return {}
        for t in topics:
            if t not in self._registered:
                try:
                    self._admin.list_topics(topic=t, timeout=self.cfg.request_timeout_s)
                    self._registered.add(t)
                except KafkaException as e:
                    self._warn_once("register", "topic %s: %s", t, e)
        self._registered &= set(topics) | set(self._registered)
        mark = time.monotonic()
        deadline = mark + 2.5 * self.cfg.stats_interval_s
        while self._stats_ts < mark and time.monotonic() < deadline:
            self._admin.poll(0.05)
        if self._stats_ts == 0.0:
            self._epoch_support = False  # this client produces no statistics at all
            log.info("no client statistics: partition_metadata.leader_epoch stays null")
            return {}
        if self._stats_ts < mark:
            self._warn_once("stats_late", "client statistics late: leader epochs may be one refresh old")
        wanted = set(topics)

        def agreeing() -> dict[tuple[str, int], int]:
            return {k: epoch for k, (leader, epoch) in self._epochs.items()
                    if k[0] in wanted and (leaders is None or leaders.get(k) in (None, leader))}

        epochs = agreeing()
        if leaders is not None and self._stats_ts >= mark:
            missing = [k for k in leaders if k[0] in wanted and k in self._epochs and k not in epochs]
            deadline = time.monotonic() + 5 * self.cfg.stats_interval_s
            while missing and time.monotonic() < deadline:
                self._admin.poll(0.05)
                epochs = agreeing()
                missing = [k for k in missing if k not in epochs]
            if missing:
                self._warn_once("stats_leader", "client statistics disagree with the metadata on %d partition(s)' "
                                "leader (e.g. %s): their leader epochs are reported as unknown", len(missing),
                                missing[0])
        if self._epoch_support is None and topics and self._stats_ts >= mark:
            self._epoch_support = bool(epochs)
            if not epochs:
                log.info("the brokers report no leader epochs; partition_metadata.leader_epoch stays null")
        return epochs

    def _topic_min_isr(self, topics: list[str]) -> dict[str, Optional[int]]:
        """Each topic's min.insync.replicas (DescribeConfigs), read for new topics and again every
        ``config_refresh_s``; None where the broker does not report it (Tansu reports none)."""
        now = time.monotonic()
        stale = [t for t in topics if now - self._min_isr_at.get(t, -1e18) > self.cfg.config_refresh_s]
        for t in set(self._min_isr) - set(topics):
            self._min_isr.pop(t, None)
            self._min_isr_at.pop(t, None)
        if stale:
            for t in stale:  # read or not, not asked again before config_refresh_s
                self._min_isr_at[t] = now
                self._min_isr.setdefault(t, None)
            try:
                futs = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in stale],
                                                    request_timeout=self.cfg.request_timeout_s)
                for res, fut in futs.items():
                    try:
                        entry = fut.result().get("min.insync.replicas")
                        self._min_isr[res.name] = int(entry.value) if entry is not None and entry.value else None
                    except Exception as e:
                        self._warn_once("describe_configs", "topic configurations (min.insync.replicas) "
                                        "unavailable, reported as unknown: %s", e)
            except Exception as e:
                self._warn_once("describe_configs", "describe_configs failed: %s", e)
        return {t: self._min_isr.get(t) for t in topics}

    def _warn_once(self, kind: str, msg: str, *args: Any) -> None:
        """Log a recurring problem once at WARNING, then at DEBUG (it is counted, not repeated)."""
        n = self.warnings.get(kind, 0)
        self.warnings[kind] = n + 1
        log.log(logging.WARNING if n == 0 else logging.DEBUG, msg, *args)

    def _committed_offsets(self) -> dict[str, dict[tuple[str, int], Optional[int]]]:
        try:
            listing = self._admin.list_consumer_groups(request_timeout=self.cfg.request_timeout_s).result()
        except Exception as e:
            log.warning("listing consumer groups failed: %s", e)
            return {}
        out: dict[str, dict[tuple[str, int], Optional[int]]] = {}
        for g in sorted(listing.valid, key=lambda g: g.group_id):
            gid = g.group_id
            if not self._groups_in.search(gid) or self._groups_out.search(gid):
                continue
            try:
                futs = self._admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(gid)],
                                                               request_timeout=self.cfg.request_timeout_s)
                res = futs[gid].result()
            except Exception as e:
                log.warning("committed offsets of group %s: %s", gid, e)
                continue
            known = self.metadata.cluster.topics if self.metadata.cluster is not None else {}
            tps: dict[tuple[str, int], Optional[int]] = {}
            for tp in res.topic_partitions:
                if tp.error is not None:
                    self.invalidate(tp.error, f"committed offsets of {gid}")
                    continue
                if not self._watched(tp.topic):
                    continue
                if tp.topic not in known:
                    # a topic this client has not seen yet (created, or deleted under the group):
                    # Kafka's add(topic) forces a metadata update
                    self.metadata.add_topic(tp.topic)
                tps[(tp.topic, tp.partition)] = kafka_offset(tp.offset)
            out[gid] = tps
        return out

    def _group_states(self, groups: list[str]) -> None:
        """One ``group_state`` per group from the coordinator's DescribeGroups answer.  The
        generation is not exposed by DescribeGroups (nor by the admin API), so it stays null."""
        if not groups:
            return
        try:
            futs = self._admin.describe_consumer_groups(groups, request_timeout=self.cfg.request_timeout_s)
        except Exception as e:
            log.warning("describing consumer groups failed: %s", e)
            return
        at = self._now_ms()
        for gid, fut in futs.items():
            try:
                d = fut.result()
            except Exception as e:
                self._warn_once("describe_group", "describing group %s: %s", gid, e)
                continue
            members = [GroupMember(member_id=m.member_id, client_id=m.client_id, host=m.host,
                                   assignment=[f"{tp.topic}/{tp.partition}" for tp in
                                               (m.assignment.topic_partitions if m.assignment else [])])
                       for m in d.members]
            self._emitter.emit(GroupState(group=gid, state=describe_group_state(d), protocol=group_protocol(d),
                                          assignor=d.partition_assignor or None,
                                          coordinator=d.coordinator.id if d.coordinator is not None else None,
                                          members=members), observed_at=at)

    def _watermarks(self, partitions: list[tuple[str, int]]) -> tuple[dict[tuple[str, int], tuple[Optional[int], int, Optional[int]]], int]:
        if self.cfg.offsets_via == "fetch":
            return self._watermarks_from_fetch(partitions)
        return self._watermarks_from_list_offsets(partitions)

    def _watermarks_from_list_offsets(self, partitions):
        out = {}
        if not partitions:
            return out, self._now_ms()
        tps = [TopicPartition(t, p) for t, p in partitions]
        try:
            latest = self._admin.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                              request_timeout=self.cfg.request_timeout_s)
            earliest = self._admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps},
                                                request_timeout=self.cfg.request_timeout_s)
            at = self._now_ms()
            for tp in tps:
                try:
                    hi = latest[tp].result().offset
                    lo = earliest[tp].result().offset
                except KafkaException as e:
                    err = e.args[0] if e.args else e
                    if self.invalidate(err, f"offsets of {tp.topic}/{tp.partition}") is None:
                        self._warn_once("list_offsets", "offsets of %s/%d: %s", tp.topic, tp.partition, err)
                    continue
                if hi is not None and hi >= 0:
                    out[(tp.topic, tp.partition)] = (kafka_offset(lo), hi, None)
        except KafkaException as e:
            self.invalidate(e.args[0] if e.args else e, "list_offsets")
            self._warn_once("list_offsets", "list_offsets failed: %s", e)
            at = self._now_ms()
        return out, at

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
                        self._warn_once(f"tail:{err.name()}", "tail consumer: %s", err)
            if remaining <= 0:
                return

    # -- loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Refresh metadata when the cache says so (periodic, bootstrap, invalidated, new topic)
        and observe offsets every ``interval_s``, until ``stop`` is set."""
        log.info("probe %s watching %s every %.1fs (offsets via %s), events -> %s",
                 self.cfg.source, self.cfg.bootstrap_servers, self.cfg.interval_s,
                 self.cfg.offsets_via, self.cfg.events_topic)
        next_observation = 0.0
        while not stop.is_set():
            try:
                if self.metadata.should_refresh():
                    self.refresh_metadata()
                if time.monotonic() >= next_observation:
                    next_observation = time.monotonic() + self.cfg.interval_s
                    self.observe()
            except Exception:
                log.exception("probe cycle failed; retrying")
                next_observation = time.monotonic() + self.cfg.interval_s
            until_refresh = self.metadata.time_to_next_update() / 1000.0
            self._wait(max(0.05, min(until_refresh, next_observation - time.monotonic())), stop)

    def _wait(self, seconds: float, stop: threading.Event) -> None:
        deadline = time.monotonic() + max(0.0, seconds)
        while not stop.is_set() and time.monotonic() < deadline:
            step = min(0.5, deadline - time.monotonic())
            if self._tail is not None:
                self._drain_tail(step)
            else:
                stop.wait(step)
            self._emitter.poll(0)
            if self._admin is not None:
                self._admin.poll(0)  # serves error_cb

    def close(self, flush_timeout: float = 10.0) -> None:
        """Final flush of buffered events, then release every client."""
        left = self._emitter.close(flush_timeout)
        if left:
            log.warning("%d events were still undelivered at shutdown and are lost", left)
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        self._admin = None
