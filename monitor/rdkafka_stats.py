"""librdkafka's statistics JSON, read: pure functions from a client's statistics document to
the contract's payloads (its fetch state, its metadata requests, the partition counts and
brokers it knows).  No I/O, no clock; ``monitor.instrumentation`` calls them from the client's
``stats_cb``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Union

from monitor.contract import Broker, ClientFetch, ClientProduce, MetadataRefresh, PartitionCountChange, kafka_offset

#: statistics older than this (or from the future) get the callback time as observed_at instead
MAX_STATS_DELAY_US = 10 * 60 * 1_000_000
#: topic metadata update times closer than this are one refresh (see MetadataRequestTracker)
METADATA_TIME_TOLERANCE_MS = 50
_CGMD_MAGIC = b"CGMDv2:"  # the header of a serialised ConsumerGroupMetadata


def _int(value: Any) -> Optional[int]:
    """An int from librdkafka's JSON, or None for anything else (bool included)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _offset(p: Mapping[str, Any], name: str) -> Optional[int]:
    return kafka_offset(_int(p.get(name)))


def _broker_id(value: Any) -> Optional[int]:
    v = _int(value)
    return v if v is not None and v >= 0 else None


def parse_stats(raw: Union[str, bytes]) -> dict[str, Any]:
    """Decode one statistics JSON; anything but a JSON object is a ValueError."""
    stats = json.loads(raw)
    if not isinstance(stats, dict):
        raise ValueError(f"statistics JSON is a {type(stats).__name__}, not an object")
    return stats


def _named_topics(stats: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """(name, fields) of every topic in a client's statistics."""
    for tname, topic in (stats.get("topics") or {}).items():
        if isinstance(topic, Mapping):
            named = topic.get("topic")
            yield (named if isinstance(named, str) else str(tname)), topic


def assigned_partitions(stats: Mapping[str, Any]) -> Iterable[tuple[str, int, Mapping[str, Any]]]:
    """(topic, partition, fields) of every partition a consumer's statistics show as assigned.

    librdkafka lists every partition it knows of a topic; ``desired`` marks the assigned ones.
    Partition -1 is its internal UA (unassigned) partition and never an assignment."""
    for name, topic in _named_topics(stats):
        for p in _partitions(topic):
            if p.get("desired") is True:
                yield name, p["partition"], p


def client_fetch_of(group: str, topic: str, partition: int, p: Mapping[str, Any]) -> ClientFetch:
    """One partition's statistics as a ``client_fetch`` payload (sentinels become None)."""
    state = p.get("fetch_state")
    return ClientFetch(
        group=group, topic=topic, partition=partition,
        fetch_state=state if isinstance(state, str) else None,
        position=_offset(p, "app_offset"),
        committed=_offset(p, "committed_offset"),
        high_watermark=_offset(p, "hi_offset"),
        last_stable_offset=_offset(p, "ls_offset"),
        log_start_offset=_offset(p, "lo_offset"),
        consumer_lag=_offset(p, "consumer_lag"),
        leader=_broker_id(p.get("leader")),
        leader_epoch=_offset(p, "leader_epoch"),
    )


def client_fetches(stats: Mapping[str, Any], group: Optional[str]) -> list[ClientFetch]:
    """``client_fetch`` payloads for a consumer's statistics; none for producers or group-less consumers."""
    if stats.get("type") != "consumer" or not group:
        return []
    return [client_fetch_of(group, t, part, p) for t, part, p in assigned_partitions(stats)]


def _window_ms(b: Optional[Mapping[str, Any]], name: str, stat: str) -> Optional[float]:
    """A broker's windowed latency statistic (librdkafka: microseconds over the last interval) in
    ms; None when the window saw nothing."""
    w: Any = b.get(name) if b is not None else None
    if not isinstance(w, Mapping) or not _int(w.get("cnt")):
        return None
    v = w.get(stat)
    return round(v / 1000.0, 3) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def client_produces(stats: Mapping[str, Any]) -> list[ClientProduce]:
    """``client_produce`` payloads for a producer's statistics: one per partition it has sent to
    or holds messages for (librdkafka lists every partition it knows; the others are left out);
    none for consumers."""
    if stats.get("type") != "producer":
        return []
    by_id: dict[int, Mapping[str, Any]] = {}
    for broker in _brokers(stats).values():
        node = _broker_id(broker.get("nodeid"))
        if node is not None:
            by_id[node] = broker
    out = []
    for name, topic in _named_topics(stats):
        for p in _partitions(topic):
            queued = (_int(p.get("msgq_cnt")) or 0) + (_int(p.get("xmit_msgq_cnt")) or 0)
            inflight, sent = _int(p.get("msgs_inflight")), _int(p.get("txmsgs"))
            if not (sent or queued or inflight):
                continue
            leader = _broker_id(p.get("leader"))
            b = by_id.get(leader) if leader is not None else None
            out.append(ClientProduce(
                topic=name, partition=p["partition"], leader=leader, queued_messages=queued,
                in_flight_messages=inflight, sent_messages=sent, sent_bytes=_int(p.get("txbytes")),
                leader_rtt_avg_ms=_window_ms(b, "rtt", "avg"), leader_rtt_p99_ms=_window_ms(b, "rtt", "p99"),
                leader_queue_latency_p99_ms=_window_ms(b, "int_latency", "p99"),
                leader_request_errors=None if b is None else _int(b.get("txerrs")),
                leader_request_retries=None if b is None else _int(b.get("txretries")),
                leader_request_timeouts=None if b is None else _int(b.get("req_timeouts"))))
    return out


def stats_observed_at(stats: Mapping[str, Any], now_ms: int, monotonic_us: int) -> int:
    """When librdkafka built these statistics, in epoch ms.

    ``ts`` is librdkafka's CLOCK_MONOTONIC in µs (the clock Python's ``time.monotonic`` reads on
    Linux); statistics wait in the queue until the application polls, so ``now - (mono - ts)`` is
    the better event time.  Implausible delays fall back to ``now_ms``."""
    ts = _int(stats.get("ts"))
    if ts is None:
        return now_ms
    delay_us = monotonic_us - ts
    if not 0 <= delay_us <= MAX_STATS_DELAY_US:
        return now_ms
    return now_ms - delay_us // 1000


def _host_port(nodename: Any) -> Optional[tuple[str, int]]:
    if not isinstance(nodename, str) or ":" not in nodename:
        return None
    host, _, port = nodename.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def _brokers(stats: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    brokers = stats.get("brokers")
    return {n: b for n, b in brokers.items() if isinstance(b, Mapping)} if isinstance(brokers, Mapping) else {}


def _counter(b: Mapping[str, Any], *path: str) -> int:
    v: Any = b
    for key in path:
        v = v.get(key) if isinstance(v, Mapping) else None
    return _int(v) or 0


@dataclass
class MetadataRequestTracker:
    """Recognises metadata refreshes in successive statistics and turns them into events.

    Two signals, because neither is complete on its own:

    - the per-broker ``req.Metadata`` counters.  Tracked per broker name: brokers come and go in
      statistics, so a plain sum could shrink and then "grow" without any new request; a broker
      seen again with a lower count is a new broker object and all its requests are new.  But
      librdkafka (2.16) drops the bootstrap brokers from statistics once it has learned the real
      ones, and the requests they sent vanish with them: a producer's first refreshes are never
      counted (on Tansu its learned broker shows Metadata=0 until the first periodic refresh);
    - each topic's metadata update time, ``ts/1000 - metadata_age`` in librdkafka's own monotonic
      ms: it moves forward whenever a Metadata response covering the topic arrives, whichever
      broker sent it.  A topic that shows up with an update time already reported is not a refresh.

    The refresh count of one interval is the larger of the two (counter growth, distinct new
    update times).  Per topic the partition count is kept to report partition-count changes."""

    previous: dict[str, int] = field(default_factory=dict)
    previous_errors: dict[str, int] = field(default_factory=dict)
    topics: Optional[dict[str, tuple[int, Optional[int]]]] = None
    last_update_ms: int = 0
    total: int = 0

    def observe(self, stats: Mapping[str, Any]) -> Optional[MetadataRefresh]:
        brokers = _brokers(stats)
        grown = self._grown(brokers)
        errors = self._error_growth(brokers)
        topics = _topic_views(stats)
        before, self.topics = self.topics, topics
        refreshes, updated = self._new_updates(topics)
        # new to the statistics and updated now (or with no update time to tell)
        new_topics = sorted(t for t in set(topics) - set(before or {}) if t in updated or topics[t][1] is None)
        requests = max(sum(grown.values()), refreshes)
        if requests == 0:
            return None
        first = self.total == 0
        self.total += requests
        reason = "bootstrap" if first else "new_topic" if new_topics else "periodic"
        return MetadataRefresh(
            version=self.total, reason=reason, ok=True, duration_ms=None,
            cause=self._cause(sum(grown.values()), updated, new_topics, errors),
            node_id=self._node_id(brokers, grown),
            brokers=_learned_brokers(brokers),
            topic_count=_int(stats.get("metadata_cache_cnt")) or len(topics),
            partition_count=sum(n for n, _ in topics.values()),
            partition_count_changes=_count_changes(before or {}, topics),
            leaderless_partitions=_leaderless(stats),
        )

    def _new_updates(self, topics: Mapping[str, tuple[int, Optional[int]]]) -> tuple[int, list[str]]:
        """(distinct refreshes, topics they updated) among update times later than any seen before.

        Times within :data:`METADATA_TIME_TOLERANCE_MS` count as one: librdkafka takes ``ts`` when it
        starts building the statistics and each ``metadata_age`` a little later, so the same update
        can appear a few ms later in the next statistics of a large client."""
        fresh = {t: at for t, (_, at) in topics.items()
                 if at is not None and at > self.last_update_ms + METADATA_TIME_TOLERANCE_MS}
        refreshes, previous = 0, None
        for at in sorted(set(fresh.values())):
            if previous is None or at > previous + METADATA_TIME_TOLERANCE_MS:
                refreshes += 1
                previous = at
        if fresh:
            self.last_update_ms = max(fresh.values())
        return refreshes, sorted(fresh)

    def _grown(self, brokers: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
        grown = {}
        for name, b in brokers.items():
            now, before = _counter(b, "req", "Metadata"), self.previous.get(name, 0)
            delta = now - before if now >= before else now
            if delta > 0:
                grown[name] = delta
            self.previous[name] = now
        return grown

    def _error_growth(self, brokers: Mapping[str, Mapping[str, Any]]) -> int:
        growth = 0
        for name, b in brokers.items():
            now = sum(_counter(b, k) for k in ("disconnects", "req_timeouts", "txerrs", "rxerrs"))
            before = self.previous_errors.get(name, 0)
            growth += now - before if now >= before else now
            self.previous_errors[name] = now
        return growth

    @staticmethod
    def _cause(counted: int, updated: list[str], new_topics: list[str], errors: int) -> str:
        parts = [f"{counted} Metadata request(s) counted since the previous statistics"]
        if updated:
            parts.append("metadata updated for: " + ",".join(updated))
        if new_topics:
            parts.append("new topics: " + ",".join(new_topics))
        if errors:
            parts.append(f"{errors} disconnect(s)/timeout(s)/transport error(s) in the same interval")
        return "; ".join(parts)

    @staticmethod
    def _node_id(brokers: Mapping[str, Mapping[str, Any]], grown: Mapping[str, int]) -> Optional[int]:
        """The one broker that answered, when exactly one did (logical brokers such as
        ``GroupCoordinator`` report node -1 and are mapped to their real broker by host:port)."""
        by_addr = {b.get("nodename"): _broker_id(b.get("nodeid")) for b in brokers.values()
                   if _broker_id(b.get("nodeid")) is not None}
        ids = set()
        for name in grown:
            b = brokers[name]
            ids.add(_broker_id(b.get("nodeid")) if _broker_id(b.get("nodeid")) is not None
                    else by_addr.get(b.get("nodename")))
        return ids.pop() if len(ids) == 1 else None


def _partitions(topic: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A topic's real partitions in statistics (not librdkafka's internal UA partition -1)."""
    parts = topic.get("partitions")
    out = []
    for p in parts.values() if isinstance(parts, Mapping) else ():
        number = _int(p.get("partition")) if isinstance(p, Mapping) else None
        if number is not None and number >= 0:
            out.append(p)
    return out


def _topic_views(stats: Mapping[str, Any]) -> dict[str, tuple[int, Optional[int]]]:
    """topic -> (partition count, when its metadata was last updated in librdkafka's monotonic ms,
    None when it never was: an age as large as the clock itself)."""
    ts = _int(stats.get("ts"))
    views = {}
    for name, topic in (stats.get("topics") or {}).items():
        if isinstance(topic, Mapping):
            age = _int(topic.get("metadata_age"))
            at = ts // 1000 - age if ts is not None and age is not None and 0 <= age < ts // 1000 else None
            views[name] = (len(_partitions(topic)), at)
    return views


def _count_changes(before: Mapping[str, tuple[int, Optional[int]]],
                   now: Mapping[str, tuple[int, Optional[int]]]) -> list[PartitionCountChange]:
    """Topics whose partition count changed; ``unseen_for_at_most_ms`` is the gap between the
    topic's previous and current metadata updates (the change happened within that gap)."""
    changes = []
    for topic, (count, updated) in sorted(now.items()):
        if topic not in before or before[topic][0] == count or before[topic][0] == 0:
            continue
        old_count, old_updated = before[topic]
        gap = updated - old_updated if updated is not None and old_updated is not None else None
        changes.append(PartitionCountChange(topic=topic, old_count=old_count, new_count=count,
                                            unseen_for_at_most_ms=gap if gap is not None and gap >= 0 else None))
    return changes


def _leaderless(stats: Mapping[str, Any]) -> int:
    """Partitions this client knows without a leader (leader -1, and not unknown to the cluster)."""
    return sum(1 for topic in (stats.get("topics") or {}).values() if isinstance(topic, Mapping)
               for p in _partitions(topic) if _int(p.get("leader")) == -1 and p.get("unknown") is not True)


def _learned_brokers(brokers: Mapping[str, Mapping[str, Any]]) -> list[Broker]:
    out = []
    for b in brokers.values():
        node, hp = _broker_id(b.get("nodeid")), _host_port(b.get("nodename"))
        if node is not None and hp is not None and b.get("source") == "learned":
            out.append(Broker(node_id=node, host=hp[0], port=hp[1]))
    return sorted(out, key=lambda b: b.node_id)


def generation_of(group_metadata: Any, group_id: Optional[str] = None) -> Optional[int]:
    """The generation id inside ``Consumer.consumer_group_metadata()``, or None.

    The value is documented as opaque; it is librdkafka's ``rd_kafka_consumer_group_metadata_write``
    form: ``b"CGMDv2:"``, int32 generation id (native byte order), group id NUL, member id NUL, ...
    Read only when the magic and (if given) the group id match; a negative generation is None."""
    if not isinstance(group_metadata, (bytes, bytearray)) or not group_metadata.startswith(_CGMD_MAGIC):
        return None
    start = len(_CGMD_MAGIC)
    if len(group_metadata) < start + 5:
        return None
    (generation,) = struct.unpack_from("=i", group_metadata, start)
    group, sep, _ = bytes(group_metadata[start + 4:]).partition(b"\0")
    if not sep or (group_id is not None and group.decode("utf-8", "replace") != group_id):
        return None
    return generation if generation >= 0 else None


def partition_names(partitions: Iterable[Any]) -> list[str]:
    """TopicPartitions as 'topic/partition'."""
    return [f"{tp.topic}/{tp.partition}" for tp in partitions]


def _interval_ms(value: Any) -> Optional[int]:
    if value is None:
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None
