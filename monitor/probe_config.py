"""The probe's settings (``ProbeConfig``, the ``[probe]`` section) and its share of a cluster.

Sharing a cluster (``share = "i/n"``): n probes, each with its own ``source``, split one cluster
by a stable hash of names, crc32 of the UTF-8 name modulo n (``share_of``; not Python's
``hash()``, which differs between processes).  Probe i watches the topics whose share is i — their
partitions' metadata and offsets, and every group's committed offsets on them (``group_offsets``
are read with the high watermarks of the same probe, so HW >= committed still holds within one
observation) — and describes the groups whose share is i (``group_state``).  So every partition,
every group partition and every group is reported by exactly one probe; each still lists the
cluster's metadata and every matching group's committed offsets, and keeps only its share.  The
heartbeat carries ``share``; when one probe stops, the job's SourceSilent names it, and the
partitions of its share go unobserved.  ``ProbeScope`` answers, for one probe, what it watches.
"""

from __future__ import annotations

import re
import socket
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

OFFSETS_VIA = ("list_offsets", "fetch")


class ConfigError(ValueError):
    """A setting with a value that cannot work; the message names the setting."""


def share_of(name: str, count: int) -> int:
    """The share (1..count) a topic or group belongs to when ``count`` probes split a cluster:
    crc32 of its UTF-8 name modulo count, plus 1 — the same in every process and release."""
    return zlib.crc32(name.encode("utf-8")) % count + 1


def parse_share(text: Optional[str]) -> Optional[tuple[int, int]]:
    """``"i/n"`` -> (i, n) with 1 <= i <= n; None or "" -> None (the whole cluster)."""
    if text is None or not str(text).strip():
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if m is None or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(f"probe.share: must be \"i/n\" with 1 <= i <= n (this probe's share of n), got {text!r}")
    return int(m.group(1)), int(m.group(2))


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
    #: how often each topic's configuration (min.insync.replicas) is read again, at a metadata
    #: refresh, answered by the next (see monitor.topic_configs); 10 s: at every refresh at the
    #: default interval, and no faster at shorter ones (0: at every refresh)
    config_refresh_s: float = 10.0
    #: a partition's metadata is sent when it changes, and at least this often when it does not
    #: (0: after every refresh)
    metadata_snapshot_s: float = 60.0
    #: how often each partition's log start offset is asked (ListOffsets earliest, a third of the
    #: probe's ListOffsets); in between, its partition_offsets carry the last answer (0: at every
    #: observation).  It moves only when segments are deleted (retention, DeleteRecords)
    log_start_interval_s: float = 60.0
    #: "i/n": this probe's share when n probes split the cluster (topics and groups by a hash of
    #: their names, see share_of); empty: the whole cluster
    share: str = ""
    #: probes started with the same HA group split the cluster through a consumer group of their
    #: own on the events cluster (monitor.shards): each probes the shards it holds; empty: off
    ha_group: str = ""
    #: shards of the cluster when ha_group is set (the shard topic's partitions: every probe of the
    #: group must use the same count)
    shards: int = 64
    #: librdkafka properties passed to every client the probe creates (SASL/SSL, ...)
    kafka: dict[str, str] = field(default_factory=dict)
    #: librdkafka properties for the events producer only (e.g. another cluster's bootstrap)
    events_kafka: dict[str, str] = field(default_factory=dict)
    #: run the canary (monitor/canary.py): acks=all writes to canary_topic, read back, reported
    canary: bool = False
    canary_topic: str = "kafka-monitor-canary"
    #: seconds between two canary writes to one partition (one partition per broker)
    canary_interval_s: float = 1.0
    #: replicas of each canary partition (at most the number of brokers)
    canary_replication_factor: int = 3
    #: seconds between two DescribeQuorum requests (the KRaft controller quorum, monitor.quorum);
    #: 0: not asked (a ZooKeeper cluster, or no kafka-python)
    quorum_interval_s: float = 10.0
    #: seconds between two DescribeTopicPartitions sweeps of every topic (eligible leader replicas,
    #: monitor.elr; a partition whose ISR changed is looked at again at once); 0: not asked
    elr_interval_s: float = 60.0
    #: seconds between two DescribeLogDirs of every broker (monitor.logdirs); 0: not asked
    log_dirs_interval_s: float = 30.0
    #: seconds between two rounds of ListTransactions, DescribeTransactions and DescribeProducers
    #: (the open transactions and the partitions they hold, monitor.transactions); 0: not asked
    transactions_interval_s: float = 30.0

    def validate(self) -> "ProbeConfig":
        if not self.bootstrap_servers:
            raise ConfigError("probe.bootstrap_servers: required (host:port[,host:port...])")
        if not self.events_topic:
            raise ConfigError("probe.events_topic: must not be empty")
        if self.cluster is not None and "/" in self.cluster:
            # the job's entity keys are cluster/group/...: with a "/" in the cluster, cluster "a/b"
            # and group "c" would be the same entity as cluster "a" and group "b/c"
            raise ConfigError(f"probe.cluster: must not contain \"/\" (it separates the parts of the job's "
                              f"entity keys), got {self.cluster!r}")
        if not self.interval_s > 0:
            raise ConfigError(f"probe.interval_s: must be > 0, got {self.interval_s}")
        if self.metadata_max_age_s is not None and not self.metadata_max_age_s > 0:
            raise ConfigError(f"probe.metadata_max_age_s: must be > 0, got {self.metadata_max_age_s}")
        if not self.metadata_snapshot_s >= 0:
            raise ConfigError(f"probe.metadata_snapshot_s: must be >= 0 (0 = send every partition after every "
                              f"refresh), got {self.metadata_snapshot_s}")
        if not self.config_refresh_s >= 0:
            raise ConfigError(f"probe.config_refresh_s: must be >= 0 (0 = at every metadata refresh), "
                              f"got {self.config_refresh_s}")
        if not self.refresh_backoff_s >= 0:
            raise ConfigError(f"probe.refresh_backoff_s: must be >= 0, got {self.refresh_backoff_s}")
        if not self.log_start_interval_s >= 0:
            raise ConfigError(f"probe.log_start_interval_s: must be >= 0 (0 = at every observation), "
                              f"got {self.log_start_interval_s}")
        if self.offsets_via not in OFFSETS_VIA:
            raise ConfigError(f"probe.offsets_via: must be one of {', '.join(OFFSETS_VIA)}, got {self.offsets_via!r}")
        parse_share(self.share)
        if self.ha_group:
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", self.ha_group):
                raise ConfigError(f"probe.ha_group: letters, digits, '.', '_' and '-' only, at most 200 (it names a "
                                  f"topic and a consumer group), got {self.ha_group!r}")
            if parse_share(self.share) is not None:
                raise ConfigError("probe.ha_group: not with probe.share: the group hands out the shards itself "
                                  "(remove --share)")
            if not 1 <= self.shards <= 1024:
                raise ConfigError(f"probe.shards: must be within 1..1024, got {self.shards}")
            if self.canary:
                raise ConfigError("probe.canary: not yet with probe.ha_group (issue 49: the canary moves with "
                                  "the cluster shard)")
        if self.canary:
            share = parse_share(self.share)
            if share is not None and share[0] != 1:
                raise ConfigError(f"probe.canary: run the canary on one probe of the {share[1]} that share the "
                                  f"cluster, the one with share 1/{share[1]} (this one has {self.share}): the job "
                                  f"keeps one report per canary partition")
            if not self.canary_topic:
                raise ConfigError("probe.canary_topic: must not be empty")
            if not 0.05 <= self.canary_interval_s <= 60:
                raise ConfigError(f"probe.canary_interval_s: must be within 0.05..60, got {self.canary_interval_s}")
            if not 1 <= self.canary_replication_factor <= 32:
                raise ConfigError(f"probe.canary_replication_factor: must be within 1..32, got "
                                  f"{self.canary_replication_factor}")
        for name in ("topics_include", "topics_exclude", "groups_include", "groups_exclude"):
            try:
                re.compile(getattr(self, name))
            except re.error as e:
                raise ConfigError(f"probe.{name}: not a valid regular expression: {e}") from None
        if not (self.quorum_interval_s == 0 or 1 <= self.quorum_interval_s <= 3600):
            raise ConfigError(f"probe.quorum_interval_s: must be 0 (off) or within 1..3600, got {self.quorum_interval_s}")
        if not (self.log_dirs_interval_s == 0 or 1 <= self.log_dirs_interval_s <= 3600):
            raise ConfigError(f"probe.log_dirs_interval_s: must be 0 (off) or within 1..3600, got "
                              f"{self.log_dirs_interval_s}")
        if not (self.transactions_interval_s == 0 or 1 <= self.transactions_interval_s <= 3600):
            raise ConfigError(f"probe.transactions_interval_s: must be 0 (off) or within 1..3600, got "
                              f"{self.transactions_interval_s}")
        if not (self.elr_interval_s == 0 or 5 <= self.elr_interval_s <= 3600):
            raise ConfigError(f"probe.elr_interval_s: must be 0 (off) or within 5..3600, got {self.elr_interval_s}")
        return self

    def client_conf(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka}


class ProbeScope:
    """What one probe watches: the topics and groups its patterns match and, when probes share
    the cluster, that are in its share."""

    def __init__(self, cfg: ProbeConfig, membership: Any = None):
        self._topics_in = re.compile(cfg.topics_include)
        self._topics_out = re.compile(cfg.topics_exclude)
        self._groups_in = re.compile(cfg.groups_include)
        self._groups_out = re.compile(cfg.groups_exclude)
        self._watched_cache: dict[str, bool] = {}
        #: bumped at each move of shards (what was decided from the old ones is decided again)
        self.version = 0
        #: (i, n) when n probes share the cluster (None: the whole cluster)
        self.share = parse_share(cfg.share)
        #: the HA group's membership (monitor.shards.ShardMembership) when ha_group is set
        self.membership = membership

    def owns(self, name: str) -> bool:
        """Whether a topic or group is in this probe's share, or in a shard it holds (always,
        without either)."""
        if self.membership is not None:
            return self.membership.owns(name) is not None
        return self.share is None or share_of(name, self.share[1]) == self.share[0]

    def cluster_wide(self) -> bool:
        """Whether this probe does the cluster-wide work (brokers, the quorum, log dirs,
        transactions, the canary): the unshared one, share 1 of n, or the holder of the HA
        group's cluster shard."""
        if self.membership is not None:
            from monitor.shards import CLUSTER_SHARD

            return CLUSTER_SHARD in self.membership.owned()
        return self.share is None or self.share[0] == 1

    def ownership_changed(self) -> None:
        """The HA group moved shards: what is watched is decided again."""
        self._watched_cache = {}
        self.version += 1

    def share_text(self) -> Optional[str]:
        return None if self.share is None else f"{self.share[0]}/{self.share[1]}"

    def matches(self, topic: str) -> bool:
        """Whether the topic patterns match ``topic``, whoever's share or shard it is in."""
        return bool(self._topics_in.search(topic)) and not self._topics_out.search(topic)

    def watched(self, topic: str) -> bool:
        cache = self._watched_cache  # one dict: an answer decided before a shard moved goes with the old one
        hit = cache.get(topic)
        if hit is None:
            if len(cache) > 1_000_000:
                cache.clear()
            hit = cache[topic] = self.matches(topic) and self.owns(topic)
        return hit

    def watched_groups(self, names: list[str]) -> list[str]:
        """The groups of ``names`` the group patterns match (every share's: a group's committed
        offsets on this share's topics are reported by this probe)."""
        return [g for g in names if self._groups_in.search(g) and not self._groups_out.search(g)]
