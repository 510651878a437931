"""The instrumentation of one confluent-kafka client: its wrapped callbacks and the events it emits.

The entry points that create it are in ``monitor.instrument``; its events producer is built by
``monitor.instrument_events``.

What is emitted (contract v1, ``monitor.contract``):

``client_fetch``
    one per assigned partition (``desired`` true; librdkafka's internal partition -1 is skipped)
    per statistics JSON of a consumer with a group.  ``position`` is librdkafka's ``app_offset``
    (offset of the last message handed to the application + 1, i.e. Kafka's consumer position), not
    ``next_offset`` (the prefetcher's position, which runs ahead by whatever sits in the local fetch
    queue).  ``committed`` = ``committed_offset``, ``high_watermark`` = ``hi_offset``,
    ``last_stable_offset`` = ``ls_offset``, ``log_start_offset`` = ``lo_offset``, ``consumer_lag``
    and ``leader_epoch`` as librdkafka reports them.  The -1 / -1001 sentinels become ``None``;
    ``leader`` -1 also becomes ``None`` (here it means "this client knows no leader", which is not
    the same as a MetadataResponse saying the partition is offline).
    ``observed_at`` is when librdkafka built the statistics (its ``ts``, CLOCK_MONOTONIC µs, mapped
    to wall time), not when the application got round to polling them.

``metadata_refresh``
    when the statistics show that metadata was refreshed since the previous statistics; nothing
    when they do not.  Two signals (see :class:`MetadataRequestTracker`): the per-broker
    ``req.Metadata`` counters grew, or a topic's metadata update time (``ts - metadata_age``) moved
    forward.  The counters alone miss every request sent through a bootstrap broker, because
    librdkafka drops bootstrap brokers from statistics once it knows the real ones (measured: a
    producer's counters stay at 0).  Limitation: statistics only say THAT refreshes happened, not
    why, whether they succeeded, nor how long they took.  So: one event per statistics interval
    (however many refreshes), ``version`` = cumulative count of refreshes seen (version differences
    give the count), ``reason`` = ``bootstrap`` for the first one, ``new_topic`` when a topic new to
    the statistics was updated, otherwise ``periodic`` (which here covers every cause statistics
    cannot tell apart: the periodic refresh, group joins, invalidations); ``ok`` is always true,
    ``duration_ms`` is null (unknown); ``cause`` carries the evidence (requests counted, topics
    updated, new topics, disconnects/timeouts in the same interval).  Partition-count changes
    between two statistics are reported with the gap between the two metadata updates.

``rebalance`` (consumers whose subscribe goes through this module)
    - ``join_started`` when ``subscribe()`` is called;
    - ``revoked`` / ``lost`` when librdkafka calls the revoke callback (``lost`` when the assignment
      was lost: session timeout, max.poll.interval.ms exceeded, fencing); ``duration_ms`` = time the
      application's own callback took (the part of that phase the member controls);
    - ``assigned`` when the assign callback runs; ``duration_ms`` = time since the rebalance began
      for this member (the last ``subscribe()``, or revoke/lost callback, whichever came later);
      ``None`` when no start was seen (e.g. an incremental assign with nothing revoked);
    - ``failed``: a group-membership error reached the application (``error_cb``, or a consumer
      error returned by ``InstrumentedConsumer.poll``/``consume``) with a code in
      :data:`GROUP_FAILURE_CODES` (e.g. ``_MAX_POLL_EXCEEDED``, ``UNKNOWN_MEMBER_ID``,
      ``ILLEGAL_GENERATION``, ``FENCED_INSTANCE_ID``, ``GROUP_AUTHORIZATION_FAILED``);
      ``reason`` = the error.  Transient coordinator errors that librdkafka retries by itself are
      not failures.
    ``generation`` comes from ``consumer_group_metadata()``: officially opaque, in fact librdkafka's
    serialised form (``CGMDv2:`` + native int32 generation + group id + member id ...).  It is read
    only when the magic and the group id match and is ``None`` otherwise (never guessed).

Never blocking or breaking the application: every event goes through the non-blocking
``EventEmitter`` (a full queue drops and counts); every exception inside the instrumentation is
caught, counted (``instrumentation_errors``, ``errors_by_kind``) and logged once per kind; it never
reaches librdkafka's callbacks (which run inside the application's ``poll()``).  Exceptions raised
by the APPLICATION's callbacks propagate exactly as they would without instrumentation.  An events
cluster that is unreachable costs nothing but dropped events; an invalid ``events`` dict disables
emitting (logged) instead of failing the application.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Mapping, Optional, Union

from confluent_kafka import KafkaError

from monitor.contract import CANARY_LATENCY_BOUNDS_MS, DeliveryErrorCount, Payload, Rebalance
from monitor.instrument_events import EmitterLike, _emitter_from_settings, default_source
from monitor.rdkafka_stats import (MetadataRequestTracker, _interval_ms, client_fetches, client_produces, generation_of,
                                   parse_stats, partition_names, stats_observed_at)

log = logging.getLogger("monitor.instrument")  # one logger for the instrumentation's modules

DEFAULT_STATISTICS_INTERVAL_MS = 5000
#: how long events wait for the watched cluster's id before going out with the emitter's default
CLUSTER_ID_WAIT_S = 30.0
MAX_PENDING_EVENTS = 1000

#: error codes that mean this member's group membership failed (emitted as phase ``failed``)
GROUP_FAILURE_CODES: frozenset[int] = frozenset(
    getattr(KafkaError, name) for name in (
        "_MAX_POLL_EXCEEDED", "UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "FENCED_INSTANCE_ID",
        "UNRELEASED_INSTANCE_ID", "GROUP_AUTHORIZATION_FAILED", "INVALID_SESSION_TIMEOUT",
        "INCONSISTENT_GROUP_PROTOCOL", "GROUP_MAX_SIZE_REACHED", "INVALID_GROUP_ID",
        "UNSUPPORTED_ASSIGNOR", "FENCED_MEMBER_EPOCH")
    if hasattr(KafkaError, name))

_UNSET: Any = object()
_PENDING: Any = object()


class Instrumentation:
    """State and callbacks of one instrumented client (one per Consumer or Producer).

    ``events`` is an emitter (anything with ``emit(payload, observed_at=None, cluster=...)``) or a
    dict: ``topic`` (default ``kafka-monitor.events``), optional ``max_buffered``, and librdkafka
    producer properties for the monitoring cluster (``bootstrap.servers``, security settings).
    Creating the producer does not connect, so an unreachable cluster never delays the application;
    an invalid dict disables emitting (logged, counted) rather than failing the application.

    ``cluster``: the watched cluster's id for the envelope.  Default: an app-supplied emitter's own
    cluster; for an emitter created here, the client's cluster id as librdkafka learns it (read
    without blocking; events wait for it at most :data:`CLUSTER_ID_WAIT_S`, then go out as
    "unknown"); ``resolve_cluster=True`` asks for that resolution with an app-supplied emitter too.
    ``source``: only for an emitter created here (an emitter brings its own)."""

    def __init__(self, *, events: Union[EmitterLike, Mapping[str, Any]], group: Optional[str] = None,
                 cluster: Optional[str] = None, source: Optional[str] = None, client_id: Optional[str] = None,
                 statistics_interval_ms: int = DEFAULT_STATISTICS_INTERVAL_MS, resolve_cluster: Optional[bool] = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic):
        self.group = group
        self.client_id = client_id
        self.statistics_interval_ms = statistics_interval_ms
        self.instrumentation_errors = 0
        self.errors_by_kind: dict[str, int] = {}
        self.events_emitted = 0
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.RLock()
        self._metadata = MetadataRequestTracker()
        self._client: Any = None
        self._wrapped = False
        self._closed = False
        self._rebalance_started: Optional[float] = None
        self._last_failure: Optional[str] = None
        self._pending: list[tuple[Payload, int]] = []
        #: (topic, partition) -> [delivered, {error code: count}, latency bucket counts, latency sum ms];
        #: None until a delivery report goes through the instrumentation
        self._deliveries: Optional[dict[tuple[str, int], list]] = None
        self._wait_started: Optional[float] = None
        self._gave_up_waiting = False
        self._cluster = cluster
        self.emitter, self.owns_emitter = self._make_emitter(events, cluster, source, client_id)
        self._resolve_cluster = cluster is None and (self.owns_emitter if resolve_cluster is None else resolve_cluster)

    # -- construction ------------------------------------------------------------------------

    def _make_emitter(self, events: Any, cluster: Optional[str], source: Optional[str],
                      client_id: Optional[str]) -> tuple[EmitterLike, bool]:
        if isinstance(events, Mapping):
            return _emitter_from_settings(events, cluster, source or default_source(client_id)), True
        if not callable(getattr(events, "emit", None)):
            raise TypeError("events must be an EventEmitter (or anything with emit()) or a dict of settings")
        if source is not None and getattr(events, "source", source) != source:
            raise ValueError("source belongs to the EventEmitter passed as events; set it there")
        return events, False

    def wrap(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        """A new config with ``stats_cb``/``error_cb`` wrapped and statistics enabled if unset.

        The application's ``stats_cb`` is only forwarded when the application itself enabled
        statistics: without instrumentation it would never have been called.  A non-callable
        application callback is left in place so the client raises exactly its usual error."""
        if not isinstance(conf, Mapping):
            raise TypeError("conf must be a dict of librdkafka properties")
        if isinstance(conf.get("stats_cb"), _StatsCallback) or isinstance(conf.get("error_cb"), _ErrorCallback):
            raise ValueError("this config is already instrumented")
        if self._wrapped:
            raise RuntimeError("one Instrumentation per client: create a new one for this config")
        self._wrapped = True
        new = dict(conf)
        self.group = self.group or _str_or_none(conf.get("group.id"))
        self.client_id = self.client_id or _str_or_none(conf.get("client.id")) or "rdkafka"  # librdkafka's default
        app_interval = _interval_ms(conf.get("statistics.interval.ms"))
        if "statistics.interval.ms" not in conf:
            new["statistics.interval.ms"] = self.statistics_interval_ms
        elif app_interval == 0:
            log.warning("statistics.interval.ms is 0 in the application's config: no client_fetch or "
                        "metadata_refresh events from this client")
        app_stats, app_error = conf.get("stats_cb"), conf.get("error_cb")
        if app_stats is None or callable(app_stats):
            forward = app_stats if app_interval is not None and app_interval > 0 else None
            new["stats_cb"] = _StatsCallback(self, forward)
        if app_error is None or callable(app_error):
            new["error_cb"] = _ErrorCallback(self, app_error)
        if callable(conf.get("on_delivery")):  # a producer's delivery reports (those without a callback of their own)
            new["on_delivery"] = _DeliveryCallback(self, conf["on_delivery"])
        return new

    def bind(self, client: Any) -> None:
        """Give the instrumentation its client (member id, generation, cluster id); optional."""
        self._client = client

    # -- counters ----------------------------------------------------------------------------

    @property
    def events_sent(self) -> int:
        return int(getattr(self.emitter, "sent", 0))

    @property
    def events_dropped(self) -> int:
        return int(getattr(self.emitter, "dropped", 0))

    def _failed(self, where: str, exc: BaseException) -> None:
        kind = f"{where}:{type(exc).__name__}"
        with self._lock:
            self.instrumentation_errors += 1
            first = kind not in self.errors_by_kind
            self.errors_by_kind[kind] = self.errors_by_kind.get(kind, 0) + 1
        if first:
            log.warning("kafka-monitor instrumentation error in %s (%s): %s; counted, further ones of "
                        "this kind are not logged", where, type(exc).__name__, exc, exc_info=exc)

    def _guard(self, where: str, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:  # never into librdkafka's callback / the application's poll
            self._failed(where, e)

    # -- emitting ----------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _cluster_now(self) -> Any:
        """The cluster for the envelope now: a name, None (emitter default) or _PENDING (wait).

        Waiting happens only while a client is bound (something can tell the id), for at most
        :data:`CLUSTER_ID_WAIT_S` once; after that events go out at once, still picking the id up
        whenever it becomes known."""
        if self._cluster is not None or not self._resolve_cluster:
            return self._cluster
        client = self._client
        if client is None:
            return None
        try:
            cid = client.cluster_id(0)  # cached value or an immediate error; never waits
        except Exception:
            cid = None
        if cid:
            self._cluster = str(cid)
            return self._cluster
        if self._wait_started is None:
            self._wait_started = self._monotonic()
        if not self._gave_up_waiting:
            if self._monotonic() - self._wait_started < CLUSTER_ID_WAIT_S and len(self._pending) < MAX_PENDING_EVENTS:
                return _PENDING
            self._gave_up_waiting = True
            log.warning("cluster id of the instrumented client still unknown after %.0fs; events go out with the "
                        "emitter's default cluster until it is known", CLUSTER_ID_WAIT_S)
        return None

    def _emit(self, payload: Payload, observed_at: int) -> None:
        with self._lock:
            cluster = self._cluster_now()
            if cluster is _PENDING:
                self._pending.append((payload, observed_at))
                return
            self._drain(cluster)
            self._send(payload, observed_at, cluster)

    def _drain(self, cluster: Optional[str]) -> None:
        pending, self._pending = self._pending, []
        for payload, observed_at in pending:
            self._send(payload, observed_at, cluster)

    def _send(self, payload: Payload, observed_at: int, cluster: Optional[str]) -> None:
        try:
            if cluster is None:
                self.emitter.emit(payload, observed_at=observed_at)
            else:
                self.emitter.emit(payload, observed_at=observed_at, cluster=cluster)
            self.events_emitted += 1
        except Exception as e:
            self._failed("emit", e)

    def tick(self) -> None:
        """Send events that wait for the cluster id, if it is known now (or waited long enough)."""
        if not self._pending:
            return

        def drain() -> None:
            with self._lock:
                cluster = self._cluster_now()
                if cluster is not _PENDING:
                    self._drain(cluster)

        self._guard("tick", drain)

    # -- statistics and errors ---------------------------------------------------------------

    def on_stats(self, raw: Union[str, bytes]) -> None:
        """Handle one statistics JSON (already guarded by the callback)."""
        stats = parse_stats(raw)
        observed_at = stats_observed_at(stats, self.now_ms(), int(self._monotonic() * 1_000_000))
        with self._lock:
            refresh = self._metadata.observe(stats)
        for fetch in client_fetches(stats, self.group):
            self._emit(fetch, observed_at)
        for produce in client_produces(stats):
            self._emit(self._with_deliveries(produce), observed_at)
        if refresh is not None:
            self._emit(refresh, observed_at)

    def on_delivery(self, err: Any, msg: Any) -> None:
        """One delivery report: counted for its partition (a write that never got one is left out)."""
        try:
            key = (msg.topic(), int(msg.partition()))
        except Exception:
            return
        with self._lock:
            if self._deliveries is None:
                self._deliveries = {}
            d = self._deliveries.get(key)
            if d is None:
                d = self._deliveries[key] = [0, {}, [0] * (len(CANARY_LATENCY_BOUNDS_MS) + 1), 0.0]
            if err is not None:
                code = err.name() if callable(getattr(err, "name", None)) else str(err)
                d[1][code] = d[1].get(code, 0) + 1
                return
            d[0] += 1
            latency = msg.latency()
            if latency is not None and latency >= 0:
                ms = latency * 1000.0
                d[2][bisect.bisect_left(CANARY_LATENCY_BOUNDS_MS, ms)] += 1
                d[3] += ms

    def _with_deliveries(self, produce: Any) -> Any:
        """The client_produce payload with its partition's delivery counts, when they are known."""
        with self._lock:
            if self._deliveries is None:
                return produce
            d = self._deliveries.get((produce.topic, produce.partition))
            if d is None:
                return dataclasses.replace(produce, delivered_messages=0)
            return dataclasses.replace(
                produce, delivered_messages=d[0],
                delivery_errors=[DeliveryErrorCount(code=c, count=n) for c, n in sorted(d[1].items())],
                delivery_latency_counts=list(d[2]), delivery_latency_sum_ms=round(d[3], 3))

    def on_error(self, err: Any) -> None:
        """An error from ``error_cb`` or a consumer error message: group failures become events."""
        code = err.code() if callable(getattr(err, "code", None)) else None
        if code not in GROUP_FAILURE_CODES:
            return
        name = err.name() if callable(getattr(err, "name", None)) else str(code)
        text = err.str() if callable(getattr(err, "str", None)) else str(err)
        self._last_failure = name
        started = self._rebalance_started
        duration = (self._monotonic() - started) * 1000 if started is not None else None
        self._rebalance(self._client, "failed", [], reason=f"{name}: {text}", duration_ms=duration)

    def observe_consumer_error(self, err: Any) -> None:
        """Guarded entry for consumer errors the application got from poll()/consume()."""
        self._guard("consumer_error", self.on_error, err)

    # -- rebalance ---------------------------------------------------------------------------

    def join_started(self, started: Optional[float] = None) -> None:
        """Record (and emit) that the member starts joining: ``subscribe()`` was called."""
        def record() -> None:
            self._rebalance_started = self._monotonic() if started is None else started
            self._last_failure = None
            self._rebalance(self._client, "join_started", [], reason="subscribe")

        self._guard("join_started", record)

    def rebalance_callbacks(self, on_assign: Any = _UNSET, on_revoke: Any = _UNSET,
                            on_lost: Any = _UNSET) -> dict[str, Callable[[Any, list], None]]:
        """``on_assign``/``on_revoke``/``on_lost`` for ``Consumer.subscribe`` that chain to the
        application's (same arguments, their exceptions propagate unchanged) and emit rebalance
        events.  Like confluent-kafka, lost partitions go to ``on_revoke`` when there is no
        ``on_lost``.  A non-callable application callback raises the binding's TypeError."""
        app = {}
        for name, cb in (("on_assign", on_assign), ("on_revoke", on_revoke), ("on_lost", on_lost)):
            if cb is _UNSET:
                continue
            if not callable(cb):
                raise TypeError(f"{name} expects a callable")
            app[name] = cb
        lost_app = app.get("on_lost", app.get("on_revoke"))
        return {"on_assign": self._assign_callback(app.get("on_assign")),
                "on_revoke": self._revoke_callback("revoked", app.get("on_revoke")),
                "on_lost": self._revoke_callback("lost", lost_app)}

    def _assign_callback(self, app_cb: Optional[Callable]) -> Callable[[Any, list], None]:
        def on_assign(consumer: Any, partitions: list) -> None:
            entered = self._monotonic()
            try:
                if app_cb is not None:
                    app_cb(consumer, partitions)
            finally:
                self._guard("on_assign", self._assigned, consumer, partitions, entered)

        return on_assign

    def _revoke_callback(self, phase: str, app_cb: Optional[Callable]) -> Callable[[Any, list], None]:
        def on_revoke(consumer: Any, partitions: list) -> None:
            entered = self._monotonic()
            try:
                if app_cb is not None:
                    app_cb(consumer, partitions)
            finally:
                self._guard(f"on_{phase}", self._revoked, consumer, partitions, phase, entered)

        return on_revoke

    def _assigned(self, consumer: Any, partitions: list, entered: float) -> None:
        started, self._rebalance_started = self._rebalance_started, None
        duration = (entered - started) * 1000 if started is not None else None
        self._rebalance(consumer, "assigned", partitions, duration_ms=duration)
        self._last_failure = None

    def _revoked(self, consumer: Any, partitions: list, phase: str, entered: float) -> None:
        self._rebalance_started = entered
        reason = self._last_failure if phase == "lost" else None
        self._rebalance(consumer, phase, partitions, reason=reason,
                        duration_ms=(self._monotonic() - entered) * 1000)

    def _rebalance(self, consumer: Any, phase: str, partitions: list, reason: Optional[str] = None,
                   duration_ms: Optional[float] = None) -> None:
        if consumer is not None and self._client is None:
            self._client = consumer
        member, generation = self._membership(consumer)
        self._emit(Rebalance(group=self.group or "", phase=phase, member_id=member, client_id=self.client_id,
                             generation=generation, partitions=partition_names(partitions), reason=reason,
                             duration_ms=duration_ms), self.now_ms())

    def _membership(self, consumer: Any) -> tuple[Optional[str], Optional[int]]:
        """(member id, generation) from the consumer, None for whatever it cannot tell."""
        if consumer is None:
            return None, None
        member = generation = None
        try:
            member = consumer.memberid() or None
        except Exception:
            pass
        try:
            generation = generation_of(consumer.consumer_group_metadata(), self.group)
        except Exception:
            pass
        return member, generation

    # -- shutdown ----------------------------------------------------------------------------

    def close(self, timeout: float = 1.0) -> int:
        """Send waiting events and, for an emitter created here, close it (flushing for at most
        ``timeout`` seconds).  Returns how many events were left undelivered (0 for an app-owned
        emitter, which is the application's to flush)."""
        left = 0
        try:
            with self._lock:
                cluster = self._cluster_now()
                self._drain(None if cluster is _PENDING else cluster)
            if self.owns_emitter and not self._closed:
                self._closed = True
                closer = getattr(self.emitter, "close", None) or getattr(self.emitter, "flush", None) or (lambda _t: 0)
                left = int(closer(timeout) or 0)
        except Exception as e:
            self._failed("close", e)
        return left


class _StatsCallback:
    """``stats_cb``: the application's callback first (same string), then the instrumentation."""

    def __init__(self, instrumentation: Instrumentation, app_cb: Optional[Callable[[str], None]]):
        self.instrumentation = instrumentation
        self.app_cb = app_cb

    def __call__(self, raw: str) -> None:
        try:
            if self.app_cb is not None:
                self.app_cb(raw)
        finally:
            self.instrumentation._guard("stats", self.instrumentation.on_stats, raw)


class _ErrorCallback:
    """``error_cb``: the application's callback first (same error), then the instrumentation.

    Without an application ``error_cb`` nothing else happens: librdkafka does not log these errors
    by itself either (measured with librdkafka 2.16), so the application's output is unchanged."""

    def __init__(self, instrumentation: Instrumentation, app_cb: Optional[Callable[[Any], None]]):
        self.instrumentation = instrumentation
        self.app_cb = app_cb

    def __call__(self, err: Any) -> None:
        try:
            if self.app_cb is not None:
                self.app_cb(err)
        finally:
            self.instrumentation._guard("error", self.instrumentation.on_error, err)


class _DeliveryCallback:
    """A producer's delivery report callback: counted by the instrumentation, then the
    application's (its exceptions propagate as they would without instrumentation)."""

    def __init__(self, instrumentation: Instrumentation, app_cb: Optional[Callable[[Any, Any], None]]):
        self.instrumentation = instrumentation
        self.app_cb = app_cb

    def __call__(self, err: Any, msg: Any) -> None:
        self.instrumentation._guard("delivery", self.instrumentation.on_delivery, err, msg)
        if self.app_cb is not None:
            self.app_cb(err, msg)


def _str_or_none(value: Any) -> Optional[str]:
    return str(value) if value not in (None, "") else None
