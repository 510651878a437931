"""The probe's metadata refreshes: ``ProbeTopologyMixin``, the part of ``monitor.probe.Probe``
that lists the cluster's metadata, turns it into a cluster view and sends what changed.

Metadata follows the Java client's rules (``monitor.metadata.MetadataCache``): a refresh runs at
start (bootstrap), every ``metadata_max_age_s`` (periodic, default: every interval), and as soon
as the refresh backoff allows after something invalidated the metadata — a failed connection,
a timed-out request, a partition without a leader, an error such as NOT_LEADER_OR_FOLLOWER in
any response the probe gets, a topic it has not seen (new_topic).  Each attempt is one
``metadata_refresh`` event with its reason and cause.  After a successful one, a watched
partition gets a ``partition_metadata`` when its leader, leader epoch, replicas, ISR, offline
replicas, min.insync.replicas, error or eligible leader replicas (``monitor.elr``) differ from what the probe last sent for it, and at least
every ``metadata_snapshot_s`` even when nothing changed (a job started on an empty checkpoint,
or one that missed an event, has the whole view within that time).  The first snapshots are
spread over that period, so a large cluster's partitions do not all come due in one refresh, and
a partition sent for a change keeps its place in it.
Sending changes only is what keeps the job's work following change: at 100,000 partitions a
full view every 10 s is 100,000 events that say nothing new.  Each ``partition_offsets``
carries ``metadata_at``, the time of the refresh that last confirmed the partition's view, so
the job knows the view it holds is current without receiving it again.

A refresh also counts each broker's leaderships and replicas (``broker_state``), reads each
watched topic's min.insync.replicas (``monitor.topic_configs``), and notes the topics that are
gone (``monitor.gone``).  Leader epochs come from the observations: each leader's answer to
ListOffsets LATEST carries its current epoch (``_listing_epochs``).
"""

from __future__ import annotations

import collections
import threading
import time
import zlib
from typing import TYPE_CHECKING, Any, Optional, Sequence

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from monitor.access import again_if_timed_out
from monitor.cluster_view import ClusterView
from monitor.contract import Broker, BrokerState, MetadataRefresh, PartitionCountChange, PartitionMetadata
from monitor.gcpause import gc_paused
from monitor.named_metadata import NamedMetadataError
from monitor.shards import HA_DISCOVERY_S

if TYPE_CHECKING:
    from monitor.elr import ElrWatcher
    from monitor.emitter import EventEmitter
    from monitor.gone import GoneTracker
    from monitor.metadata import MetadataCache
    from monitor.named_metadata import NamedMetadata
    from monitor.probe_config import ProbeConfig, ProbeScope
    from monitor.topic_configs import TopicConfigs

#: a refresh that shows an ISR the last ELR answer did not see waits at most this long for the
#: look at it (_elr_wait_s), once per such ISR
ELR_WAIT_S = 3.0


class ProbeTopologyMixin:
    """``Probe``'s metadata refreshes (mixed into it; not used on its own)."""

    if TYPE_CHECKING:  # provided by Probe
        cfg: ProbeConfig
        metadata: MetadataCache
        _admin: Any
        _ops: Any
        _retry_conf: Optional[dict[str, Any]]
        _emitter: EventEmitter
        _scope: ProbeScope
        _gone: GoneTracker
        topic_configs: TopicConfigs
        _broker_lock: threading.Lock
        _writes_held: Optional[tuple[int, int, int]]
        _answered_epochs: dict[tuple[str, int], int]
        _answered_view: Optional[ClusterView]
        _refresh_busy_s: float
        elr: Optional[ElrWatcher]

        def _now_ms(self) -> int: ...

        def _warn_once(self, kind: str, msg: str, *args: Any) -> None: ...

        def invalidate(self, error: Any, where: str) -> Optional[str]: ...

        def _emit_rows(self, cls: type, rows: Sequence[tuple], observed_at: int) -> list[int]: ...

    def _init_topology(self) -> None:
        #: a refresh's request time (a moving average)
        self._list_s: Optional[float] = None
        self._ops_brokers: frozenset = frozenset()  # the brokers the last good refresh listed
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
        #: the partitions (topic, partition, leader, ISR) a refresh last waited for the ELR look at
        self._elr_waited: frozenset = frozenset()
        self.refresh_retries = 0  # metadata requests sent again through a new client
        #: an HA probe's named Metadata requests (monitor.named_metadata; None: every refresh lists
        #: the whole metadata), when it last listed the whole metadata (monotonic s), and until when
        #: a failed named request makes it list the whole metadata again
        self._named: Optional[NamedMetadata] = None
        self._listed_whole_at = float("-inf")
        self._named_off_until = float("-inf")
        self.named_refreshes = 0
        self.named_failures = 0
        self.refresh_failures = 0  # metadata requests that failed, retried or not

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
        """The cluster's metadata.  The first attempt waits ``refresh_wait_s()``, and a
        timed-out one is sent again, for the rest of the request timeout, through a new client
        (``again_if_timed_out``: the usable broker librdkafka last sent to is often a paused
        one), which is dropped once it answered."""
        first = self.refresh_wait_s() if self._retry_conf is not None else self.cfg.request_timeout_s
        conf = self._retry_conf
        return again_if_timed_out(lambda: self._admin.list_topics(timeout=first),
                                  None if conf is None else lambda: self._list_topics_again(conf, first))

    def _list_topics_again(self, conf: dict, first: float) -> Any:
        self.refresh_retries += 1
        client = AdminClient(conf)
        try:
            return client.list_topics(timeout=max(first, self.cfg.request_timeout_s - first))
        finally:
            del client  # nothing of it is in flight once list_topics returned

    def _named_topics(self) -> Optional[list[str]]:
        """The topics an HA probe names in this refresh's Metadata request, or None for the whole
        listing: that one is sent by the cluster shard's holder every time (its broker counts need
        every partition), by the others at the first refresh, every ``HA_DISCOVERY_S`` (it is what
        finds new topics), after their shards moved and after a named request failed."""
        named, view = self._named, self.metadata.cluster
        if named is None or view is None or self._scope.cluster_wide() or not named.available():
            return None
        now = time.monotonic()
        if now - self._listed_whole_at >= HA_DISCOVERY_S or now < self._named_off_until:
            return None
        return [n for n in view.topics if self._scope.watched(n)]

    def _fetch_named(self, topics: list[str]) -> Optional[tuple[ClusterView, Optional[int]]]:
        """The view with ``topics`` answered by name (the rest as last listed), and the broker that
        answered; None when the request failed (said once at WARNING, then counted)."""
        assert self._named is not None
        try:
            resp, node = self._named.fetch(topics, self.refresh_wait_s())
        except NamedMetadataError as e:
            self.named_failures += 1
            self._named_off_until = time.monotonic() + HA_DISCOVERY_S
            self._warn_once("named_metadata", "a Metadata request naming this probe's %d topics failed (%s): the "
                            "whole metadata is listed instead, for %.0f s", len(topics), e, HA_DISCOVERY_S)
            return None
        self.named_refreshes += 1
        return ClusterView.from_metadata_response(resp, topics, self.metadata.cluster), node

    def _refresh_metadata(self) -> bool:
        reason, cause = self.metadata.next_reason()
        t0, sent_at = time.monotonic(), self._now_ms()
        named = self._named_topics()
        got = self._fetch_named(named) if named is not None else None
        if got is None:  # (a failed named request's time is not the listing's)
            return self._refresh_from_listing(reason, cause, time.monotonic(), sent_at)
        return self._refreshed(got[0], got[1], reason, cause, (time.monotonic() - t0) * 1000, sent_at, whole=False)

    def _refresh_from_listing(self, reason: str, cause: Optional[str], t0: float, sent_at: int) -> bool:
        """A refresh through the whole listing (librdkafka's), leader epochs from the offsets answers."""
        try:
            md = self._list_topics()
        except KafkaException as e:  # transport failure, timeout
            err = e.args[0] if e.args else e
            self.refresh_failures += 1
            self.metadata.failed_update(error=str(err))
            self.invalidate(err, "metadata request")
            self._emitter.emit(MetadataRefresh(version=self.metadata.version, reason=reason, cause=cause, ok=False,
                                               duration_ms=(time.monotonic() - t0) * 1000, error=str(err),
                                               metadata_max_age_ms=self.metadata.metadata_max_age_ms,
                                               ha_group=self.cfg.ha_group or None))
            self._warn_once("metadata", "metadata refresh failed: %s", err)
            return False
        duration_ms = (time.monotonic() - t0) * 1000
        self._list_s = duration_ms / 1000 if self._list_s is None else 0.7 * self._list_s + 0.3 * duration_ms / 1000
        if self._named is not None:
            self._listed_whole_at = t0
        view = ClusterView.from_confluent(md, leader_epochs=self._listing_epochs(), previous=self.metadata.cluster)
        return self._refreshed(view, md.orig_broker_id if md.orig_broker_id >= 0 else None, reason, cause,
                               duration_ms, sent_at)

    def _listing_epochs(self) -> dict[tuple[str, int], int]:
        """The leader epochs a listing's view takes (``ClusterView.from_confluent``): what each
        leader of the current view answered to the last observation's ListOffsets.  Those were
        sent under the current view, unless a refresh came between (one the metadata's
        invalidation started): then only the partitions whose leader it did not change."""
        epochs, sent_under, current = self._answered_epochs, self._answered_view, self.metadata.cluster
        if sent_under is current or current is None:
            return epochs
        if sent_under is None:
            return {}
        def leaders(view: ClusterView) -> dict[tuple[str, int], int]:
            return {(p.topic, p.partition): p.leader for p in view.partitions()}
        before, now = leaders(sent_under), leaders(current)
        return {k: e for k, e in epochs.items() if k in now and before.get(k) == now[k]}

    def _refreshed(self, fetched: ClusterView, node_id: Optional[int], reason: str, cause: Optional[str],
                   duration_ms: float, sent_at: Optional[int] = None, whole: bool = True) -> bool:
        """A metadata answer's view into the cache, and its events.  ``whole``: the answer of a
        whole listing (a named one's refresh leaves the brokers' min.insync.replicas default as
        last read: an HA probe without shard 0 reads it with its whole listings, once a minute)."""
        previous_ok = self.metadata.last_successful_refresh_ms
        change = self.metadata.update(fetched, sent_at=sent_at)
        now = change.at_ms
        view = self.metadata.cluster
        if not change.ok or view is None:
            self._emitter.emit(MetadataRefresh(version=change.version, reason=reason, cause=cause, ok=False,
                                               duration_ms=duration_ms, error=change.error,
                                               ha_group=self.cfg.ha_group or None), observed_at=now)
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
            node_id=node_id,
            controller_id=self._controller_id(now),
            brokers=[Broker(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack) for b in view.brokers],
            topic_count=len(view.topics), partition_count=n_parts,
            partition_count_changes=[
                PartitionCountChange(topic=t, old_count=old, new_count=new,
                                     unseen_for_at_most_ms=now - previous_ok if previous_ok else None)
                for t, (old, new) in sorted(change.partition_count_changes.items()) if self._scope.owns(t)],
            leaderless_partitions=len(change.no_leader),
            metadata_max_age_ms=self.metadata.metadata_max_age_ms, ha_group=self.cfg.ha_group or None), observed_at=now)
        if self._scope.cluster_wide():
            with self._broker_lock:
                self._emit_broker_states(view, change.version, now)
        topics = [n for n, t in view.topics.items() if self._scope.watched(n) and t.error is None]  # sorted by name
        if not topics and not any(map(self._scope.matches, view.topics)):  # (not: none in this probe's share)
            self._warn_once("no_topics", "no topic matching topics_include %r / topics_exclude %r in the metadata: "
                            "none exists, or the probe's user may not see them (Kafka leaves out the topics a user "
                            "lacks DESCRIBE on) -- permission missing?: DESCRIBE on Topic:<name>",
                            self.cfg.topics_include, self.cfg.topics_exclude)
        min_isr = self.topic_configs.min_isr(topics, sorted(brokers), read_default=whole)
        watched, leaders, rows, pending, sent, unknown = self._partition_rows(view, topics, min_isr, change.version, now)
        if unknown:
            look = {t for t, _, _, _ in unknown}
            seq = self.elr.wake(look)  # type: ignore[union-attr]  # unknown is only filled with the ELR on
            if unknown != self._elr_waited:
                # an ISR the ELR answer has not seen (a shrink, a new leader): wait for the look, once,
                # a bounded time, so that the first view of the change has its ELR and the replicas
                # the controller has offline (IsrShrink's cause, UnderMinIsr's eligible replicas)
                self._elr_waited = unknown
                if self.elr.wait_answer(seq, self._elr_wait_s()):  # type: ignore[union-attr]
                    watched, leaders, rows, pending, sent, _ = self._partition_rows(view, topics, min_isr,
                                                                                    change.version, now)
        else:
            self._elr_waited = frozenset()
        failed = set(self._emit_rows(PartitionMetadata, rows, now))
        for i, (tp, shown, due) in enumerate(pending):
            if i not in failed:  # not enqueued: tried again at the next refresh
                sent[tp] = (shown, self._next_snapshot_ms(tp, due, now))
        self._md_sent = sent  # partitions no longer watched are forgotten
        self._gone.note_topics(view, topics, now)
        if watched != self._watched_partitions:
            self._watched_partitions = watched
        if leaders != self._watched_leaders:
            self._watched_leaders = leaders
        self._watched_at = now
        return True

    def _partition_rows(self, view: ClusterView, topics: list[str], min_isr: dict, version: int, now: int
                        ) -> tuple[list, list, list, list, dict, frozenset]:
        """The watched partitions, their leaders, the partition_metadata rows to send (with what
        each shows, and whether it is new), what stays as last sent, and the partitions whose
        leader and ISR the last ELR answer did not see."""
        # A partition's view is the PartitionView itself (leader, epoch, replicas, ISR, offline
        # replicas, error) with the topic's min.insync.replicas; from_confluent hands back the
        # same object while nothing changed, so "unchanged" is mostly an identity test.
        watched: list[tuple[str, int]] = []
        leaders: list[int] = []
        md_sent, sent = self._md_sent, {}
        rows, pending = [], []
        elr_of = self.elr.elr_of if self.elr is not None and self.elr.available else None
        unknown: set[tuple] = set()  # partitions whose ISR the ELR answer has not seen yet
        for name in topics:
            mi = min_isr.get(name)
            for pv in view.topics[name].partitions:  # sorted by partition
                tp = (name, pv.partition)
                watched.append(tp)
                leaders.append(pv.leader)
                elr = None if elr_of is None else elr_of(name, pv.partition, pv.leader, pv.isr, pv.replicas)
                if elr is None and elr_of is not None:
                    unknown.add((name, pv.partition, pv.leader, tuple(sorted(pv.isr))))
                offline = pv.offline_replicas
                if elr_of is not None and len(pv.isr) < len(pv.replicas):  # a replica on an offline log dir
                    offline = tuple(sorted(set(offline) | set(self.elr.offline_of(  # type: ignore[union-attr]
                        name, pv.partition, pv.leader, pv.isr))))
                shown = (pv, mi, elr, offline)
                last = md_sent.get(tp)
                if last is not None and now < last[1] and last[0] == shown:
                    sent[tp] = last
                    continue
                rows.append((name, pv.partition, pv.leader, list(pv.replicas), list(pv.isr), version,
                             pv.leader_epoch, list(offline), mi, pv.error,
                             None if elr is None else list(elr[0]), None if elr is None else list(elr[1])))
                pending.append((tp, shown, None if last is None else last[1]))
        return watched, leaders, rows, pending, sent, frozenset(unknown)

    def _elr_wait_s(self) -> float:
        """How long a refresh waits for the ELR look at a changed ISR: a quarter of the interval,
        at least the watcher's min_gap_s + 1 s (a look right after another waits min_gap_s), at
        most ELR_WAIT_S (the refresh holds up the next observation)."""
        return min(ELR_WAIT_S, max(self.elr.min_gap_s + 1.0, 0.25 * self.cfg.interval_s))  # type: ignore[union-attr]

    def _controller_id(self, now: int) -> Optional[int]:
        """The active controller: the quorum's leader while a recent DescribeQuorum named one
        (monitor.quorum); else None, since a KRaft Metadata response names a random broker."""
        quorum = getattr(self, "quorum", None)
        return quorum.controller_id(now) if quorum is not None else None

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
        controller = self._controller_id(now)
        rows = []
        for node in sorted(set(live) | set(holds)):
            b = live.get(node)
            since, waiting = (held[1], held[2]) if held is not None and held[0] == node else (None, None)
            rows.append((node, b is not None, version, leads.get(node, 0), holds.get(node, 0), behind.get(node, 0),
                         None if b is None else b.host, None if b is None else b.port, None if b is None else b.rack,
                         None if controller is None else node == controller, since, waiting))
        self._emit_rows(BrokerState, rows, now)

    def _refresh_start_in(self) -> float:
        """Seconds until the next metadata refresh should start (0: now): when Kafka's rules say
        one is due (``MetadataCache.time_to_next_update``)."""
        return self.metadata.time_to_next_update() / 1000.0

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

    def _next_snapshot_ms(self, tp: tuple[str, int], due: Optional[int], now: int) -> int:
        """When a partition's metadata just sent (at ``now``) is sent again unchanged: at its next
        snapshot time.  The first send sets its phase, spread over (0, period] by a hash of the
        partition, so that the snapshots of a large cluster are not all due in one refresh; a
        send for a change keeps that phase (``due``: the snapshot it was due for), otherwise one
        change of every partition at once (their leader epochs, known from the second refresh
        on) would bring all their snapshots into one refresh for good."""
        period = int(self.cfg.metadata_snapshot_s * 1000)
        if period <= 0:
            return now
        if due is None:
            return now + 1 + zlib.crc32(f"{tp[0]}/{tp[1]}".encode()) % period
        return due if due > now else due + ((now - due) // period + 1) * period
