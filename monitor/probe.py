"""The probe: watches one cluster and reports what it sees as contract events.

``Probe`` runs the loop (``run``): a metadata refresh as soon as the metadata cache says one is
due, an observation every ``interval_s``, the events through one emitter.  Its parts:

- ``monitor.probe_config``: its settings, and its share when several probes split a cluster;
- ``monitor.topology`` (``ProbeTopologyMixin``): the metadata refreshes, ``partition_metadata``
  (leader epochs from the observations' ListOffsets answers) and ``broker_state``, with
  ``monitor.topic_configs`` (each topic's min.insync.replicas);
- ``monitor.offsets`` (``ProbeOffsetsMixin``): the group listing, committed offsets, group
  states and watermarks of an observation, and the deadline it waits for them;
- ``monitor.gone``: saying when a watched topic, group or group's committed offset is gone.

Every ``interval_s``, one observation:
1. the committed offsets of every matching consumer group (and a ``group_state`` per group);
2. the watermarks of every watched partition (``partition_offsets``), read *after* the commits
   so that, for one observation, HW >= committed (a lag computed from them is never negative
   because of the order of reads);
3. one ``group_offsets`` per group and partition with the committed offset and that HW;
4. a ``heartbeat``.

What a cycle costs (``bench/probe_bench.py``, ``bench/README.md``): at 100,000 partitions about
4 s of work and 0.045 CPU-s per 1,000 partitions per interval, where it took minutes before.
What it takes: ListOffsets in requests of ``offsets.LIST_OFFSETS_BATCH`` partitions with one
future each (librdkafka merges a request's answers in quadratic time); leader epochs taken from
those answers rather than from the client's statistics (which needed a topic handle per watched
topic and a document of every partition every few seconds: about half of a cycle's CPU at
300,000 partitions, bench/README.md); a cluster view that takes over what did not change
from the previous one, so that "changed since sent" is an identity test; events serialized in
bulk (``EventEmitter.emit_rows``); no cyclic garbage collection during a cycle.

The probe says when it falls behind: each heartbeat carries ``cycle_duration_ms`` (the
refreshes since the previous observation, and this observation) and ``observation_lag_ms``
(how late the observation started after its schedule), and a cycle longer than ``interval_s``
is logged at WARNING (then at most every 5 minutes while it lasts).
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from monitor.access import FatalClientError, fatal_reason
from monitor.canary import Canary, CanaryConfig, WritesHeld
from monitor.contract import GroupOffsets, HaMember, Heartbeat, PartitionOffsets
from monitor.coordinator import CoordinatorClient
from monitor.emitter import EventEmitter
from monitor.gcpause import gc_paused
from monitor.gone import GoneTracker
from monitor.metadata import Cause, MetadataCache, cause_for_error
from monitor.named_metadata import named_metadata
from monitor.offsets import ProbeOffsetsMixin
from monitor.probe_config import ConfigError, ProbeConfig, ProbeScope
from monitor.elr import ElrWatcher
from monitor.logdirs import LogDirWatcher
from monitor.quorum import QuorumConfigError, QuorumWatcher
from monitor.shards import ShardMembership, ensure_shard_topic, shard_of
from monitor.topic_configs import TopicConfigs
from monitor.topology import ProbeTopologyMixin
from monitor.transactions import TransactionWatcher, with_offsets

log = logging.getLogger(__name__)

#: cycles between two full garbage collections, and the watched partitions from which the probe
#: freezes what survives a cycle (see Probe._gc_settle)
GC_FULL_EVERY = 60
GC_FREEZE_FROM = 10_000


def _quiet(err: Any) -> None:
    """error_cb of the short-lived retry client: what it meets is the probe's other clients' news."""



def next_due(due: float, started: float, interval_s: float) -> float:
    """When the observation after one due at ``due`` and started at ``started`` is due: one
    interval after ``due``, so a refresh that delays an observation (a large cluster's listing,
    an ELR look) does not push every later one back; once a whole interval behind, one interval
    after ``started``."""
    nxt = due + interval_s
    return nxt if nxt > started else started + interval_s

class Probe(ProbeTopologyMixin, ProbeOffsetsMixin):
    #: set by an error retrying cannot fix (credentials refused, fatal producer): run() stops with it
    fatal_error: Optional[str] = None

    def __init__(self, cfg: ProbeConfig, *, emitter: Optional[EventEmitter] = None, admin: Optional[Any] = None,
                 clock: Callable[[], float] = time.time):
        """``emitter`` and ``admin`` (the slice of AdminClient the probe calls) can be injected;
        by default they are built from the configuration."""
        self.cfg = cfg.validate()
        self._clock = clock
        admin_conf: dict[str, Any] = {
            **cfg.client_conf(), "socket.timeout.ms": int(cfg.request_timeout_s * 1000),
            "error_cb": self._on_client_error}
        self._admin = admin if admin is not None else AdminClient(admin_conf)
        # Everything but the metadata refresh (offsets, groups, configurations) goes through this
        # second client.  It was made to keep the topic handles the metadata client once held (for
        # leader epochs from its statistics) out of the offsets requests' way; it stays, as tested
        # under paused brokers, because librdkafka sends a client's broker-less requests to the
        # broker that client used last.
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
        #: when run()'s next observation is due, monotonic s (None outside run())
        self._emitter = emitter or EventEmitter({**cfg.client_conf(), **cfg.events_kafka},
                                                cfg.events_topic, cluster=cfg.cluster or "unknown",
                                                source=cfg.source, clock=clock)
        self.metadata = MetadataCache(
            metadata_max_age_ms=int((cfg.metadata_max_age_s or cfg.interval_s) * 1000),
            refresh_backoff_ms=int(cfg.refresh_backoff_s * 1000), clock=self._now_ms)
        self._init_topology()
        self._started_at = self._now_ms()
        #: what it watches: its patterns and its share of the cluster
        #: with an HA group: the shards this probe holds (monitor.shards), and what it watches follows them
        self.membership: Optional[ShardMembership] = None
        #: the shards held when this round of the loop began, with their epochs: the round's events
        #: carry them (a shard lost during the round is observed under its old epoch, which the job
        #: fences once the new owner's is seen; one gained waits for the next round)
        self._round_epochs: dict[int, int] = {}
        #: set by the group's thread when shards moved: the probe's thread then forgets what it lost
        self._moved = threading.Event()
        if cfg.ha_group:
            self.membership = ShardMembership({**cfg.client_conf(), **cfg.events_kafka}, cfg.ha_group, cfg.shards,
                                              cfg.source, on_change=self._shards_moved)
            stamp = getattr(self._emitter, "set_shards", None)
            if stamp is not None:  # each event of a shard carries it and this probe's epoch (fencing)
                stamp(cfg.shards, lambda: self._round_epochs)
            if admin is None:  # its refreshes name its shards' topics (monitor.named_metadata)
                self._named = named_metadata(cfg.client_conf(), cfg.request_timeout_s)
        self._scope = ProbeScope(cfg, self.membership)
        #: the groups of the last observation, and (partitions, groups, shard -> topics and groups) of
        #: the last ha_member event, recounted when either changes
        self._observed_groups: list[str] = []
        self._holding_counts: tuple = (None, None, {})
        self._init_offsets()
        #: what was seen, for saying when it is gone
        self._gone = GoneTracker(self._emit_rows, self._now_ms, self._scope.owns, self.metadata.request_update)
        self.cycles = 0
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
        #: the KRaft controller quorum (DescribeQuorum through kafka-python, monitor.quorum), asked on
        #: its own thread by the unshared probe or share 1 of n; its -X settings checked here, at start
        self.quorum: Optional[QuorumWatcher] = None
        if cfg.quorum_interval_s > 0 and admin is None and (self._scope.cluster_wide() or cfg.ha_group):
            try:
                self.quorum = QuorumWatcher(cfg.client_conf(), cfg.quorum_interval_s, cfg.request_timeout_s,
                                            clock=clock)
            except QuorumConfigError as e:
                raise ConfigError(f"probe.kafka: {e}") from None
        #: eligible leader replicas (DescribeTopicPartitions through kafka-python, monitor.elr)
        self.elr: Optional[ElrWatcher] = None
        if cfg.elr_interval_s > 0 and admin is None:
            try:
                self.elr = ElrWatcher(cfg.client_conf(), cfg.elr_interval_s, cfg.request_timeout_s,
                                      cluster_name=cfg.cluster or cfg.bootstrap_servers, watched=self._scope.watched)
            except QuorumConfigError as e:
                raise ConfigError(f"probe.kafka: {e}") from None
        #: every broker's log dirs (DescribeLogDirs through kafka-python, monitor.logdirs): the unshared
        #: probe or share 1 of n
        self.log_dirs: Optional[LogDirWatcher] = None
        if cfg.log_dirs_interval_s > 0 and admin is None and (self._scope.cluster_wide() or cfg.ha_group):
            try:
                self.log_dirs = LogDirWatcher(cfg.client_conf(), cfg.log_dirs_interval_s, cfg.request_timeout_s,
                                              cluster_name=cfg.cluster or cfg.bootstrap_servers)
            except QuorumConfigError as e:
                raise ConfigError(f"probe.kafka: {e}") from None
        #: the open transactions and the partitions they hold (ListTransactions, DescribeTransactions,
        #: DescribeProducers through kafka-python, monitor.transactions): the unshared probe or share 1 of n
        self.transactions: Optional[TransactionWatcher] = None
        #: the last observation's offsets, (topic, partition) -> (log start, HW, LSO): the held partitions' LSO and HW
        self._last_offsets: dict[tuple[str, int], tuple] = {}
        if cfg.transactions_interval_s > 0 and admin is None and (self._scope.cluster_wide() or cfg.ha_group):
            try:
                self.transactions = TransactionWatcher(cfg.client_conf(), cfg.transactions_interval_s,
                                                       cfg.request_timeout_s,
                                                       cluster_name=cfg.cluster or cfg.bootstrap_servers,
                                                       held_back=self._held_back)
            except QuorumConfigError as e:
                raise ConfigError(f"probe.kafka: {e}") from None
        if cfg.canary:
            self.canary = Canary(
                CanaryConfig(topic=cfg.canary_topic, interval_s=cfg.canary_interval_s, report_interval_s=cfg.interval_s,
                             replication_factor=cfg.canary_replication_factor),
                cfg.client_conf(), emit=self._canary_emit)

    @property
    def emitter(self) -> EventEmitter:
        return self._emitter

    def _held_back(self) -> list[tuple[str, int]]:
        """The partitions whose LSO was below their HW at the last observation (read on the
        transactions thread: the dict is replaced each cycle, never changed)."""
        return [tp for tp, (_, hw, lso) in self._last_offsets.items() if lso is not None and lso < hw]

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
        if self.membership is not None:
            self._run_cluster_watchers()  # the cluster shard may have come or gone
        with gc_paused():
            self._observe()
        # the cluster-wide answers: sent by the cluster shard's holder (one still running after its
        # loss is not sent)
        cluster = self._scope.cluster_wide()
        if self.quorum is not None:
            answer = self.quorum.take()
            if answer is not None and cluster:
                self._emitter.emit(answer[1], observed_at=answer[0])
        if self.log_dirs is not None:
            dirs = self.log_dirs.take()
            if dirs is not None and cluster:
                for broker in dirs[1]:
                    self._emitter.emit(broker, observed_at=dirs[0])
        if self.transactions is not None:
            txns = self.transactions.take()
            if txns is not None and cluster:
                self._emitter.emit(with_offsets(txns[1], self._last_offsets), observed_at=txns[0])
        # the cycle's work: the refreshes since the previous observation, and this observation
        duration, self._refresh_busy_s = time.monotonic() - started + self._refresh_busy_s, 0.0
        self._emitter.emit(Heartbeat(interval_ms=int(self.cfg.interval_s * 1000),
                                     events_sent=self._emitter.sent, events_dropped=self._emitter.dropped,
                                     watching=[f"topics~{self.cfg.topics_include}", f"groups~{self.cfg.groups_include}"],
                                     share=self._scope.share_text(), started_at=self._started_at,
                                     cycle_duration_ms=int(duration * 1000),
                                     observation_lag_ms=int(lag * 1000) if lag is not None else None,
                                     unanswered_brokers=sorted(self._unanswered),
                                     ha_group=self.cfg.ha_group or None))
        if self.membership is not None:
            self._emit_holdings()
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
        self._discovering = self._discovery_round()
        # the listing gets a third of the wait: the groups listed before stand in for a late one
        groups = self._listed_groups(time.monotonic() + self.observe_wait_s() / 3)
        self._observed_groups = groups
        # committed offsets asked before the watermarks (so HW >= committed, mostly), all waited
        # for at once
        owns = self._scope.owns
        self._coordinator.send({"committed": self._groups_to_ask(groups, self._discovering),
                                "described": [g for g in groups if owns(g)]},
                               max(0.5, deadline - time.monotonic()))
        sent = self._send_list_offsets(partitions) if self.cfg.offsets_via == "list_offsets" else None
        answers = self._coordinator.collect()
        committed = self._committed_offsets(answers["committed"])
        self._group_states(answers["described"])
        offsets, offsets_at = self._watermarks(partitions, sent, deadline)
        via, metadata_at = self.cfg.offsets_via, self._watched_at
        self._emit_rows(PartitionOffsets, [(topic, part, hi, via, lo, lso, metadata_at)
                                           for (topic, part), (lo, hi, lso) in offsets.items()], offsets_at)
        self._last_offsets = offsets
        rows: list[tuple] = []
        get = offsets.get
        holder = self.transactions.holder if self.transactions is not None else None
        for group, tps in committed.items():
            for (topic, part), off in tps.items():
                hw = get((topic, part))
                if hw is None:
                    rows.append((group, topic, part, off, None, None, None, None, None, None, None, None))
                    continue
                held = None
                # at the LSO with records past it: a read_committed consumer waiting on a transaction
                if holder is not None and off is not None and off == hw[2] and hw[1] is not None and off < hw[1]:
                    held = holder(topic, part, off)
                rows.append((group, topic, part, off, hw[1], offsets_at, None, None, None, hw[2],
                             None if held is None or held[0] is None else held[0][:1024],
                             None if held is None else held[1]))
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

    def _warn_once(self, kind: str, msg: str, *args: Any) -> None:
        """Log a recurring problem once at WARNING, then at DEBUG (it is counted, not repeated)."""
        n = self.warnings.get(kind, 0)
        self.warnings[kind] = n + 1
        log.log(logging.WARNING if n == 0 else logging.DEBUG, msg, *args)

    # -- loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Refresh metadata when the cache says so (periodic, bootstrap, invalidated, new topic)
        and observe offsets every ``interval_s``, until ``stop`` is set."""
        log.info("probe %s watching %s every %.1fs (offsets via %s%s), events -> %s",
                 self.cfg.source, self.cfg.bootstrap_servers, self.cfg.interval_s, self.cfg.offsets_via,
                 f"; share {self._scope.share_text()} of its topics and groups" if self._scope.share else "",
                 self.cfg.events_topic)
        if self.membership is not None and self.membership._thread is None:
            ensure_shard_topic({**self.cfg.client_conf(), **self.cfg.events_kafka}, self.cfg.ha_group,
                               self.cfg.shards, self.cfg.request_timeout_s)
            self.membership.start()
        if self.elr is not None and self.elr._thread is None:
            self.elr.start()
        self._run_cluster_watchers()
        if self.canary is not None and self._canary_thread is None:
            self._canary_thread = threading.Thread(target=self.canary.run, args=(self._canary_stop,),
                                                   name="canary", daemon=True)
            self._canary_thread.start()
        next_observation = 0.0
        while not stop.is_set() and self.fatal_error is None:
            try:
                started = time.monotonic()
                if self.membership is not None:  # this round's events carry the epochs it starts with
                    self._round_epochs = self.membership.owned()
                    if self._moved.is_set():
                        self._moved.clear()
                        self._gone.forget_unowned()
                if self._refresh_start_in() <= 0:
                    self.refresh_metadata()
                now = time.monotonic()
                if now >= next_observation:
                    # when it was due (the first one: when the probe started), for its lag
                    due = next_observation if next_observation else started
                    self._scheduled_at = due
                    next_observation = next_due(due, now, self.cfg.interval_s)
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

    def _emit_holdings(self) -> None:
        """An HA group's probe, after each cycle: the shards it holds, its epochs on them and how
        many topics and groups it watched in each (the job's coverage of the group, docs/ha.md)."""
        m = self.membership
        assert m is not None
        owned = self._round_epochs
        if self._holding_counts[0] is not self._watched_partitions or self._holding_counts[1] != self._observed_groups:
            counts: dict[int, int] = {}
            for t in {t for t, _ in self._watched_partitions}:
                s = shard_of(t, m.shards)
                counts[s] = counts.get(s, 0) + 1
            for g in self._observed_groups:
                s = shard_of(g, m.shards)
                counts[s] = counts.get(s, 0) + 1
            self._holding_counts = (self._watched_partitions, self._observed_groups, counts)
        counts = self._holding_counts[2]
        held = sorted(owned)
        self._emitter.emit(HaMember(ha_group=self.cfg.ha_group, shards=m.shards, interval_ms=int(self.cfg.interval_s * 1000),
                                    held=held, epochs=[owned[s] for s in held],
                                    watched=[counts.get(s, 0) for s in held], handovers=m.changes))

    def _cluster_watchers(self) -> list[Any]:
        return [w for w in (self.quorum, self.log_dirs, self.transactions) if w is not None]

    def _run_cluster_watchers(self) -> None:
        """The cluster-wide watchers (quorum, log dirs, transactions) run in the unshared probe,
        share 1 of n, or, in an HA group, while this probe holds the cluster shard: they are
        started and stopped with it, so one member of the group asks them."""
        if self.membership is None:
            for w in self._cluster_watchers():
                if w._thread is None:
                    w.start()
            return
        on = self._scope.cluster_wide()
        for w in self._cluster_watchers():
            w.run_while(on)

    def _shards_moved(self, owned: dict[int, int]) -> None:
        """On the HA group's thread: shards came or went.  What is watched is decided again, and
        the metadata is asked for at once so that a gained shard is probed within an interval."""
        self._scope.ownership_changed()
        self._moved.set()  # the probe's thread forgets what it no longer owns (GoneTracker)
        self._listed_whole_at = float("-inf")  # a gained shard's topics created since the last listing
        self.metadata.request_update(Cause.NEW_TOPIC)

    def close(self, flush_timeout: float = 10.0) -> None:
        """Final flush of buffered events, then release every client."""
        if self.membership is not None:
            self.membership.stop()  # leaves the group: its shards move at once
        self.stop_canary()
        if self.quorum is not None:
            self.quorum.stop()
        if self.elr is not None:
            self.elr.stop()
        if self.log_dirs is not None:
            self.log_dirs.stop()
        if self.transactions is not None:
            self.transactions.stop()
        if self._named is not None:
            self._named.close()
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
