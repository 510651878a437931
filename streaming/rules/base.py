"""Alert rules: pure functions of (previous entity state, one observation, now).

No clock is read here: ``now`` is an argument, so replaying the same events gives the same
transitions.  Entity states are plain dicts (they are stored as JSON in Spark's state store);
each carries ``open``: alert name -> {"id", "since", "evidence"} for its open alerts.

A transition is an open or a resolve of one alert on one entity.  The alert id is stable for
one episode: the resolve carries the id of the open it ends.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Optional


class Severity(enum.IntEnum):
    """Ordered: a higher value pages harder."""

    INFO = 1       # worth a line on a dashboard
    WARNING = 2    # redundancy or latency at risk; look during working hours
    CRITICAL = 3   # data unavailable or about to be; page


class Alert(str, enum.Enum):
    """The alert catalogue (DESIGN §4); the names are part of the product."""

    # partition
    ISR_SHRINK = "IsrShrink"                          # a replica left the ISR, replica set unchanged
    UNDER_REPLICATED = "UnderReplicated"              # |ISR| < |replicas|
    UNDER_MIN_ISR = "UnderMinIsr"                     # |ISR| < min.insync.replicas: acks=all writes fail
    AT_MIN_ISR = "AtMinIsr"                           # |ISR| == min.insync.replicas: one more loss stops writes
    OFFLINE_PARTITION = "OfflinePartition"            # no leader
    PARTITION_NO_ELIGIBLE_LEADER = "PartitionNoEligibleLeader"  # no leader, empty ISR, empty ELR (KIP-966)
    LEADER_CHANGED = "LeaderChanged"                  # leader or leader epoch changed (info)
    PREFERRED_LEADER_IMBALANCE = "PreferredLeaderImbalance"  # leader != first replica
    HIGH_WATERMARK_STALLED = "HighWatermarkStalled"   # HW flat while writes are known to be pending
    PARTITION_UNOBSERVED = "PartitionUnobserved"      # a partition stopped being reported
    # topic
    PARTITION_COUNT_CHANGED = "PartitionCountChanged"
    # group / group partition
    CONSUMER_LAG_HIGH = "ConsumerLagHigh"             # lag in offsets or seconds above threshold
    CONSUMER_LAG_STATUS = "ConsumerLagStatus"         # Burrow-style WARN / STALL / STOP / REWIND
    REBALANCE_STORM = "RebalanceStorm"                # >= N rebalances in window W
    REBALANCE_STUCK = "RebalanceStuck"                # Preparing/CompletingRebalance longer than T
    GROUP_EMPTY_WITH_LAG = "GroupEmptyWithLag"        # no members while lag > 0 for T
    # client / source
    METADATA_STALE = "MetadataStale"                  # no successful refresh for 2 x metadata.max.age
    METADATA_REFRESH_STORM = "MetadataRefreshStorm"   # invalidation-driven refreshes above N per minute
    SOURCE_SILENT = "SourceSilent"                    # no heartbeat for 3 x its interval
    # broker
    BROKER_DOWN = "BrokerDown"                        # holds replicas, not registered (stopped or fenced)
    BROKER_UNDER_REPLICATING = "BrokerUnderReplicating"  # registered, some of its replicas out of the ISR
    BROKER_STALLING_WRITES = "BrokerStallingWrites"   # the canary's acks=all writes wait for it (holds the HW)
    # the KRaft controller quorum (a cluster's)
    QUORUM_UNAVAILABLE = "QuorumUnavailable"          # no leader, or no caught-up majority of voters
    QUORUM_VOTER_LAGGING = "QuorumVoterLagging"       # a voter not caught up for longer than a setting
    QUORUM_LEADER_FLAPPING = "QuorumLeaderFlapping"   # the leader changed N times within a window
    BROKER_METADATA_LAGGING = "BrokerMetadataLagging"  # a broker's metadata behind the quorum's
    # a broker's log dirs
    LOG_DIR_OFFLINE = "LogDirOffline"                 # a dir offline on a broker that answers
    LOG_DIR_FILLING = "LogDirFilling"                 # a dir above a usage share, or full soon at its growth
    # the cluster's open transactions
    HANGING_TRANSACTION = "HangingTransaction"        # open past a setting or its own timeout, or unknown to its coordinator
    # an HA group of probes (the monitor's own coverage)
    SHARD_UNOBSERVED = "ShardUnobserved"              # a shard without an observation past its interval and a setting


SEVERITY = {
    Alert.ISR_SHRINK: Severity.WARNING,
    Alert.UNDER_REPLICATED: Severity.WARNING,
    Alert.UNDER_MIN_ISR: Severity.CRITICAL,
    Alert.AT_MIN_ISR: Severity.WARNING,
    Alert.OFFLINE_PARTITION: Severity.CRITICAL,
    Alert.PARTITION_NO_ELIGIBLE_LEADER: Severity.CRITICAL,
    Alert.LEADER_CHANGED: Severity.INFO,
    Alert.PREFERRED_LEADER_IMBALANCE: Severity.INFO,
    Alert.HIGH_WATERMARK_STALLED: Severity.CRITICAL,
    Alert.PARTITION_UNOBSERVED: Severity.WARNING,
    Alert.PARTITION_COUNT_CHANGED: Severity.INFO,
    Alert.CONSUMER_LAG_HIGH: Severity.WARNING,
    Alert.CONSUMER_LAG_STATUS: Severity.WARNING,
    Alert.REBALANCE_STORM: Severity.WARNING,
    Alert.REBALANCE_STUCK: Severity.CRITICAL,
    Alert.GROUP_EMPTY_WITH_LAG: Severity.WARNING,
    Alert.METADATA_STALE: Severity.WARNING,
    Alert.METADATA_REFRESH_STORM: Severity.WARNING,
    Alert.SOURCE_SILENT: Severity.CRITICAL,
    Alert.BROKER_DOWN: Severity.CRITICAL,
    Alert.BROKER_UNDER_REPLICATING: Severity.WARNING,
    Alert.BROKER_STALLING_WRITES: Severity.CRITICAL,
    Alert.QUORUM_UNAVAILABLE: Severity.CRITICAL,
    Alert.QUORUM_VOTER_LAGGING: Severity.WARNING,
    Alert.QUORUM_LEADER_FLAPPING: Severity.WARNING,
    Alert.BROKER_METADATA_LAGGING: Severity.WARNING,
    Alert.LOG_DIR_OFFLINE: Severity.CRITICAL,
    Alert.LOG_DIR_FILLING: Severity.WARNING,
    Alert.HANGING_TRANSACTION: Severity.CRITICAL,
    Alert.SHARD_UNOBSERVED: Severity.WARNING,
}


@dataclass(frozen=True)
class Transition:
    alert: Alert
    action: str  # "open" | "resolve"
    alert_id: str
    at: int
    entity: str
    labels: dict[str, Any]
    evidence: dict[str, Any] = field(default_factory=dict)
    #: a rule may raise the catalogue's default (e.g. ConsumerLagStatus STOP is critical)
    severity_override: Optional[Severity] = None

    @property
    def severity(self) -> Severity:
        return self.severity_override or SEVERITY[self.alert]


def alert_id(alert: Alert, entity: str, since: int) -> str:
    return hashlib.sha1(f"{alert.value}|{entity}|{since}".encode()).hexdigest()[:20]


def _open(state: Any, alert: Alert, entity: str, labels: dict, now: int, evidence: dict) -> list[Transition]:
    if alert.value in state["open"]:
        return []
    aid = alert_id(alert, entity, now)
    state["open"][alert.value] = {"id": aid, "since": now, "evidence": evidence}
    if "broker" in labels and labels.get("topic") is not None:  # a partition alert blaming a broker
        state["open"][alert.value]["labels"] = labels  # its resolve carries the same (_resolve)
    return [Transition(alert, "open", aid, now, entity, labels, evidence)]


def _resolve(state: Any, alert: Alert, entity: str, labels: dict, now: int, evidence: dict) -> list[Transition]:
    if not state["open"]:  # the common case: nothing open on the entity
        return []
    was = state["open"].pop(alert.value, None)
    if was is None:
        return []
    # never before its open: an event delayed in an unreadable partition can end, at its own
    # time, a condition that a later batch had already opened (issue 33)
    return [Transition(alert, "resolve", was["id"], max(now, was["since"]), entity, was.get("labels", labels),
                       {**evidence, "open_since": was["since"]})]


def evict(state: Any, now: int, ttl_ms: int, entity: str, labels: dict) -> Optional[list[Transition]]:
    """None when the entity is still alive; otherwise the transitions that resolve its open
    alerts (an entity that disappeared — a deleted topic, a group that went away — must not
    leave alerts open forever)."""
    if state["last_seen"] is not None and now - state["last_seen"] <= ttl_ms:
        return None
    out = []
    for name in list(state["open"]):
        out += _resolve(state, Alert(name), entity, labels, now, {"reason": "entity no longer observed"})
    return out


def gone(state: Any, now: int, entity: str, labels: dict, reason: str) -> list[Transition]:
    """The transitions that resolve every open alert of an entity the cluster no longer has
    (``reason``: "topic deleted", "group deleted", "committed offset deleted")."""
    out: list[Transition] = []
    for name in list(state["open"]):
        out += _resolve(state, Alert(name), entity, labels, now, {"reason": reason})
    return out


def report_int(ev: dict[str, Any], name: str) -> Optional[int]:
    """An integer field of a row's ``report`` (the JSON of a canary, client_produce or broker_state event,
    streaming/ingest/parsing.py ``REPORT_FIELDS``); None when absent or not an integer."""
    try:
        v = json.loads(ev.get("report") or "{}").get(name)
    except (ValueError, AttributeError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None
