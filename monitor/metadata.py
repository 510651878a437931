"""A client-side metadata cache with the Java Kafka client's refresh semantics.

This module mirrors ``org.apache.kafka.clients.Metadata`` (KAFKA-INTERNALS §1) as a state machine
with an injected clock.  It opens no connections: the probe asks :meth:`MetadataCache.should_refresh`
and :meth:`MetadataCache.next_reason`, runs its own ``AdminClient.list_topics`` and then reports the
outcome with :meth:`MetadataCache.update` or :meth:`MetadataCache.failed_update`.  Here too: why a
refresh runs (:class:`Reason`) and what invalidated the metadata (:class:`Cause`, :func:`cause_for_error`).

The cluster view (``monitor.cluster_view.ClusterView``) is immutable and every update replaces it
whole, so readers take ``cache.cluster`` without a lock, as Java readers take ``Metadata.fetch()``.

Sentinels: a partition leader of ``-1`` (:data:`monitor.contract.NO_LEADER`) means "no leader";
``controller_id`` is ``None`` when the response names none (librdkafka reports ``-1``).
"""
from __future__ import annotations

import logging
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from monitor.cluster_view import ClusterView, LeaderChange, PartitionCount, diff_views, track_partition_counts

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Reasons and causes
# ---------------------------------------------------------------------------------------------


class Reason:
    """Why a refresh runs (the ``reason`` of a ``metadata_refresh`` event)."""

    BOOTSTRAP = "bootstrap"      # no successful update yet
    PERIODIC = "periodic"        # metadata.max.age.ms elapsed
    INVALIDATED = "invalidated"  # request_update(cause): something suggested the metadata is wrong
    NEW_TOPIC = "new_topic"      # a topic not used before was added

    ALL = frozenset({BOOTSTRAP, PERIODIC, INVALIDATED, NEW_TOPIC})


class Cause:
    """What invalidated the metadata (KAFKA-INTERNALS §1, "marked stale").

    ``error_response`` carries the Kafka error name after a colon:
    ``"error_response:NOT_LEADER_OR_FOLLOWER"`` (build it with :meth:`error_response`)."""

    CONNECT_FAILED = "connect_failed"    # connecting to a node failed
    DISCONNECTED = "disconnected"        # a connection dropped during I/O
    REQUEST_TIMEOUT = "request_timeout"  # a request timed out (Java then disconnects the node)
    UNKNOWN_LEADER = "unknown_leader"    # a partition has no known leader
    ERROR_RESPONSE = "error_response"    # a response carried an invalid-metadata error
    NEW_TOPIC = "new_topic"              # a new topic is in use
    TOPIC_MISSING = "topic_missing"      # a topic seen before is absent from a response (deleted?)

    ALL = frozenset({CONNECT_FAILED, DISCONNECTED, REQUEST_TIMEOUT, UNKNOWN_LEADER, ERROR_RESPONSE, NEW_TOPIC,
                     TOPIC_MISSING})

    @staticmethod
    def error_response(error_name: str) -> str:
        return f"{Cause.ERROR_RESPONSE}:{error_name}"


def validate_cause(cause: str) -> str:
    """Return ``cause`` if it is a known cause, else raise ``ValueError`` naming it."""
    base, sep, detail = cause.partition(":")
    if base not in Cause.ALL:
        raise ValueError(f"unknown metadata invalidation cause {cause!r} (known: {', '.join(sorted(Cause.ALL))})")
    if base == Cause.ERROR_RESPONSE and not detail:
        raise ValueError(f"cause {cause!r}: error_response needs the error name (error_response:NAME)")
    if base != Cause.ERROR_RESPONSE and sep:
        raise ValueError(f"cause {cause!r}: only error_response takes a detail")
    return cause


# Errors whose Java exception extends InvalidMetadataException: canonical (Java) name -> protocol code.
_INVALID_METADATA_ERRORS = {
    "UNKNOWN_TOPIC_OR_PARTITION": 3,
    "LEADER_NOT_AVAILABLE": 5,
    "NOT_LEADER_OR_FOLLOWER": 6,
    "REPLICA_NOT_AVAILABLE": 9,
    "KAFKA_STORAGE_ERROR": 56,
    "LISTENER_NOT_FOUND": 72,
    "FENCED_LEADER_EPOCH": 74,
    "UNKNOWN_LEADER_EPOCH": 75,
    "UNKNOWN_TOPIC_ID": 100,
    "INCONSISTENT_TOPIC_ID": 103,
}
# librdkafka (and pre-2.6 Java) names for the same codes.
_ERROR_ALIASES = {
    "NOT_LEADER_FOR_PARTITION": "NOT_LEADER_OR_FOLLOWER",
    "UNKNOWN_TOPIC_OR_PART": "UNKNOWN_TOPIC_OR_PARTITION",
}
# Transport-level errors: name -> (code, cause).  Negative codes are librdkafka-local errors.
_TRANSPORT_ERRORS = {
    "_TRANSPORT": (-195, Cause.DISCONNECTED),
    "_ALL_BROKERS_DOWN": (-187, Cause.DISCONNECTED),
    "NETWORK_EXCEPTION": (13, Cause.DISCONNECTED),
    "_RESOLVE": (-193, Cause.CONNECT_FAILED),
    "_TIMED_OUT": (-185, Cause.REQUEST_TIMEOUT),
    "REQUEST_TIMED_OUT": (7, Cause.REQUEST_TIMEOUT),
}
_CAUSE_BY_NAME: dict[str, str] = {
    **{name: Cause.error_response(name) for name in _INVALID_METADATA_ERRORS},
    **{alias: Cause.error_response(name) for alias, name in _ERROR_ALIASES.items()},
    **{name: cause for name, (_, cause) in _TRANSPORT_ERRORS.items()},
}
_CAUSE_BY_CODE: dict[int, str] = {
    **{code: Cause.error_response(name) for name, code in _INVALID_METADATA_ERRORS.items()},
    **{code: cause for code, cause in _TRANSPORT_ERRORS.values()},
}


def cause_for_error(error: Union[str, int, Any, None]) -> Optional[str]:
    """The invalidation cause a Kafka error implies, or ``None`` if it says nothing about metadata.

    Mirrors the Java clients, which call ``requestUpdate()`` when an error's exception extends
    ``InvalidMetadataException`` and when a connection fails, drops or times out.  ``error`` is an
    error name (Java or librdkafka spelling), a numeric code, a ``KafkaError`` or a
    ``KafkaException`` wrapping one.  Invalid-metadata errors map to ``error_response:<JAVA_NAME>``;
    transport errors to ``disconnected`` / ``connect_failed``; timeouts to ``request_timeout``."""
    if error is None or isinstance(error, bool):
        return None
    if isinstance(error, int):
        return _CAUSE_BY_CODE.get(error)
    if isinstance(error, str):
        return _CAUSE_BY_NAME.get(error.strip().upper())
    if isinstance(error, BaseException) and error.args and callable(getattr(error.args[0], "name", None)):
        error = error.args[0]  # KafkaException(KafkaError)
    name = getattr(error, "name", None)
    if callable(name):
        return _CAUSE_BY_NAME.get(str(name()).upper())
    return None




# ---------------------------------------------------------------------------------------------
# What an update changed
# ---------------------------------------------------------------------------------------------


def _empty_mapping() -> Mapping[Any, Any]:
    return types.MappingProxyType({})


@dataclass(frozen=True)
class MetadataChange:
    """The outcome of :meth:`MetadataCache.update` compared with the previous view.

    ``ok`` is false when the update was treated as failed (a response with no brokers); then only
    ``version``, ``at_ms`` and ``error`` are meaningful.  On the first update every topic is new."""

    ok: bool
    version: int
    at_ms: int
    error: Optional[str] = None
    new_topics: tuple[str, ...] = ()
    removed_topics: tuple[str, ...] = ()
    #: topics in use that were dropped because they were not used within topic_expiry_ms
    expired_topics: tuple[str, ...] = ()
    #: topic -> (old count, new count)
    partition_count_changes: Mapping[str, tuple[int, int]] = field(default_factory=_empty_mapping)
    leader_changes: tuple[LeaderChange, ...] = ()
    #: partitions with no known leader (see ClusterView.leaderless)
    no_leader: tuple[tuple[str, int], ...] = ()
    #: the cause the cache requested an update with right after this one (unknown_leader), if any
    update_requested: Optional[str] = None

    @property
    def changed(self) -> bool:
        return bool(self.new_topics or self.removed_topics or self.partition_count_changes or self.leader_changes)


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------


class MetadataTimeout(TimeoutError):
    """Java's ``TimeoutException`` from ``Metadata.awaitUpdate``."""

    def __init__(self, timeout_ms: int):
        super().__init__(f"Failed to update metadata after {timeout_ms} ms")
        self.timeout_ms = timeout_ms


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class MetadataCache:
    """Java's ``org.apache.kafka.clients.Metadata``: when to refresh, and the latest cluster view.

    All times are epoch milliseconds from ``clock`` (or the ``now`` argument).  One lock guards the
    mutable state; ``cluster`` is an immutable view replaced whole, so readers need no lock."""

    def __init__(self, *, metadata_max_age_ms: int = 300_000, refresh_backoff_ms: int = 100,
                 topic_expiry_ms: int = 300_000, clock: Callable[[], int] = _wall_clock_ms):
        if metadata_max_age_ms < 0:
            raise ValueError(f"metadata_max_age_ms: must be >= 0, got {metadata_max_age_ms}")
        if refresh_backoff_ms < 0:
            raise ValueError(f"refresh_backoff_ms: must be >= 0, got {refresh_backoff_ms}")
        if topic_expiry_ms <= 0:
            raise ValueError(f"topic_expiry_ms: must be > 0, got {topic_expiry_ms}")
        self.metadata_max_age_ms = metadata_max_age_ms
        self.refresh_backoff_ms = refresh_backoff_ms
        self.topic_expiry_ms = topic_expiry_ms
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._version = 0
        self._need_update = True  # bootstrap
        self._last_refresh_ms = 0
        self._last_successful_refresh_ms = 0
        self._cluster: Optional[ClusterView] = None
        self._topics_used_at: dict[str, int] = {}
        self._pending_reason: Optional[str] = None
        self._pending_cause: Optional[str] = None
        self._partition_counts: Mapping[str, PartitionCount] = types.MappingProxyType({})
        self._last_error: Optional[str] = None
        #: consecutive updates with a leaderless partition, and whether that is the only reason
        #: the metadata is stale (then the backoff doubles with each: see update())
        self._leaderless_streak = 0
        self._only_leaderless = False

    # -- read-only state -------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Bumped on every successful update; 0 before the first."""
        return self._version

    @property
    def need_update(self) -> bool:
        return self._need_update

    @property
    def last_refresh_ms(self) -> int:
        return self._last_refresh_ms

    @property
    def last_successful_refresh_ms(self) -> int:
        return self._last_successful_refresh_ms

    @property
    def cluster(self) -> Optional[ClusterView]:
        """The view of the last successful update (``None`` before it); immutable, lock-free."""
        return self._cluster

    @property
    def last_error(self) -> Optional[str]:
        """Error of the last failed update, cleared by a successful one."""
        return self._last_error

    @property
    def topics(self) -> Mapping[str, int]:
        """Topics in use -> the time (ms) after which an update drops them if still unused."""
        with self._cond:
            return types.MappingProxyType({t: used + self.topic_expiry_ms for t, used in self._topics_used_at.items()})

    @property
    def partition_counts(self) -> Mapping[str, PartitionCount]:
        return self._partition_counts

    def partition_count(self, topic: str) -> Optional[int]:
        pc = self._partition_counts.get(topic)
        return pc.count if pc is not None else None

    def partition_count_changed_at(self, topic: str) -> Optional[int]:
        pc = self._partition_counts.get(topic)
        return pc.changed_at_ms if pc is not None else None

    # -- scheduling ------------------------------------------------------------------------

    def _now(self, now: Optional[int]) -> int:
        return self._clock() if now is None else now

    def time_to_next_update(self, now: Optional[int] = None) -> int:
        """Java ``Metadata.timeToNextUpdate``: ms until a refresh may run — 0 when requested, else
        when ``metadata.max.age.ms`` runs out; never earlier than ``refresh_backoff_ms`` after the
        last attempt."""
        now = self._now(now)
        with self._cond:
            if self._need_update:
                to_expire = 0
            else:
                to_expire = max(self._last_successful_refresh_ms + self.metadata_max_age_ms - now, 0)
            to_allow = max(self._last_refresh_ms + self._backoff_ms() - now, 0)
            return max(to_expire, to_allow)

    def _backoff_ms(self) -> int:
        """The refresh backoff; while a leaderless partition is all that makes the metadata stale,
        it doubles with each update that still finds one."""
        if not (self._need_update and self._only_leaderless):
            return self.refresh_backoff_ms
        return self._leaderless_backoff_ms()

    def _leaderless_backoff_ms(self) -> int:
        return self.refresh_backoff_ms * 2 ** min(max(self._leaderless_streak - 1, 0), 30)

    def should_refresh(self, now: Optional[int] = None) -> bool:
        """Java ``NetworkClient.maybeUpdate``'s test: is it time to send a MetadataRequest?"""
        return self.time_to_next_update(now) == 0

    def next_reason(self) -> tuple[str, Optional[str]]:
        """(reason, cause) of the refresh about to run: ``bootstrap`` until the first successful
        update, then ``new_topic`` or ``invalidated`` (with the first cause since the last update)
        when one was requested — ``new_topic`` wins, as it is what lifted the backoff — else
        ``periodic``.  The cause is ``None`` except for ``invalidated``."""
        with self._cond:
            if self._version == 0:
                return Reason.BOOTSTRAP, None
            if self._need_update and self._pending_reason == Reason.NEW_TOPIC:
                return Reason.NEW_TOPIC, None
            if self._need_update and self._pending_reason == Reason.INVALIDATED:
                return Reason.INVALIDATED, self._pending_cause
            return Reason.PERIODIC, None

    # -- requests --------------------------------------------------------------------------

    def _mark_stale(self, cause: str) -> None:
        self._only_leaderless = cause == Cause.UNKNOWN_LEADER and (self._only_leaderless or not self._need_update)
        self._need_update = True
        if cause == Cause.NEW_TOPIC:
            self._pending_reason = Reason.NEW_TOPIC
        else:
            if self._pending_reason is None:
                self._pending_reason = Reason.INVALIDATED
            if self._pending_cause is None:
                self._pending_cause = cause

    def request_update(self, cause: str) -> int:
        """Java ``Metadata.requestUpdate()``: mark the metadata stale; returns the current version
        (to pass to :meth:`await_update`).  ``cause`` is a :class:`Cause` (``ValueError`` if not)."""
        validate_cause(cause)
        with self._cond:
            self._mark_stale(cause)
            return self._version

    def add_topic(self, topic: str, now: Optional[int] = None) -> bool:
        """Java ``Metadata.add(topic)``: mark ``topic`` used at ``now``.  A topic not in use yet
        forces an update that the backoff does not hold back (``lastRefreshMs = 0`` and
        ``requestUpdate()``); a known one only has its expiry pushed back.  Returns whether it was new."""
        now = self._now(now)
        with self._cond:
            is_new = topic not in self._topics_used_at
            self._topics_used_at[topic] = now
            if is_new:
                self._last_refresh_ms = 0
                self._mark_stale(Cause.NEW_TOPIC)
            return is_new

    # -- outcomes --------------------------------------------------------------------------

    def update(self, cluster: ClusterView, now: Optional[int] = None, sent_at: Optional[int] = None) -> MetadataChange:
        """Java ``Metadata.update(cluster, now)``: a successful MetadataResponse.

        ``sent_at``: when the request was sent.  The next periodic refresh is then due a max age
        after it, not after the answer (Java counts from the answer): the view is at least that
        fresh, and a slow answer (the request first went to a paused broker) would otherwise push
        every later refresh back by its duration, successes drifting to a max age plus a request
        apart, past the MetadataStale limit of two max ages when the request takes a max age.

        Clears the request, sets both refresh times to ``now``, bumps the version, drops topics
        unused for longer than ``topic_expiry_ms``, replaces the whole view (never a merge) and
        wakes :meth:`await_update` waiters.  A view without brokers is an empty response, which
        Java counts as a failed update: it goes to :meth:`failed_update` and the returned change
        has ``ok=False``.  If a partition has no known leader, requests an update (``unknown_leader``)
        right after, as the Java producer does for a partition without a leader; the probe queues
        no records there, so while that is the only reason each further update that still finds
        one doubles the backoff, and once that reaches ``metadata_max_age_ms`` the periodic refresh
        takes over: an offline partition costs a few invalidated refreshes, not one per backoff
        for as long as it lasts (a MetadataRefreshStorm of the probe's own)."""
        now = self._now(now)
        with self._cond:
            if not cluster.brokers:
                error = "empty metadata response (no brokers): counted as a failed update"
                log.warning("metadata update at %d: %s", now, error)
                self._failed_update_locked(now, error)
                return MetadataChange(ok=False, version=self._version, at_ms=now, error=error)
            new_topics, removed, leaders = diff_views(self._cluster, cluster)
            no_leader = cluster.leaderless()
            self._need_update = False
            self._pending_reason = self._pending_cause = None
            self._last_refresh_ms = now
            self._last_successful_refresh_ms = now if sent_at is None else min(now, sent_at)
            self._last_error = None
            self._version += 1
            expired = tuple(sorted(t for t, used in self._topics_used_at.items()
                                   if now - used > self.topic_expiry_ms))
            for t in expired:
                del self._topics_used_at[t]
            counts, count_changes = track_partition_counts(self._partition_counts, cluster, now)
            self._partition_counts = types.MappingProxyType(counts)
            self._cluster = cluster
            requested = None
            self._only_leaderless = False
            self._leaderless_streak = self._leaderless_streak + 1 if no_leader else 0
            if no_leader and self._leaderless_backoff_ms() < self.metadata_max_age_ms:
                self._mark_stale(Cause.UNKNOWN_LEADER)
                requested = Cause.UNKNOWN_LEADER
            version = self._version
            self._cond.notify_all()
        return MetadataChange(ok=True, version=version, at_ms=now, new_topics=new_topics, removed_topics=removed,
                              expired_topics=expired, partition_count_changes=types.MappingProxyType(count_changes),
                              leader_changes=leaders, no_leader=no_leader, update_requested=requested)

    def failed_update(self, now: Optional[int] = None, error: Optional[str] = None) -> None:
        """Java ``Metadata.failedUpdate(now)``: only ``last_refresh_ms = now`` — the backoff applies,
        the data stays stale, the version and any pending request are unchanged."""
        now = self._now(now)
        with self._cond:
            self._failed_update_locked(now, error)

    def _failed_update_locked(self, now: int, error: Optional[str]) -> None:
        self._last_refresh_ms = now
        self._last_error = error

    def await_update(self, last_version: int, timeout_ms: int) -> int:
        """Java ``Metadata.awaitUpdate(lastVersion, maxWaitMs)``: block (real time) until the version
        exceeds ``last_version``; returns it, or raises :class:`MetadataTimeout`."""
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms: must be >= 0, got {timeout_ms}")
        deadline = time.monotonic() + timeout_ms / 1000
        with self._cond:
            while self._version <= last_version:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MetadataTimeout(timeout_ms)
                self._cond.wait(remaining)
            return self._version
